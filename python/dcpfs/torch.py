"""torch.distributed.checkpoint integration: a StorageReader backed by libdcp.

:class:`Reader` lets ``torch.distributed.checkpoint.load`` read a checkpoint
through libdcp instead of pickle: the ``.metadata`` is parsed by libdcp (no
pickle is executed for it), so every format libdcp reads loads, including
PyTorch 1.13 saves that newer torch cannot read itself. Tensors are read box
by box straight from the shard files into the destination tensors (only the
bytes of each box are read, never whole records); resharding (any number of
ranks, FSDP2 / DTensor placements) is done by torch's own load planner::

    import torch.distributed.checkpoint as dcp
    import dcpfs.torch

    model = build_model()                      # e.g. FSDP2 fully_shard()ed
    sd = {"model": model.state_dict()}
    dcp.load(sd, storage_reader=dcpfs.torch.Reader("/ckpt/step_1000"))
    model.load_state_dict(sd["model"])

    # or the read-once collective loader (every byte read by one rank only):
    dcpfs.torch.load(sd, "/ckpt/step_1000")

Non-tensor items are still restored with ``torch.load`` by torch's planner
(``LoadPlanner.load_bytes``), as with torch's own reader.
"""
from __future__ import annotations

import dataclasses
import errno
import functools
import inspect
import io
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping as MappingABC
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch.distributed.checkpoint import StorageReader
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

import dcpfs

__all__ = ["Reader", "PlannerData", "load", "torch_dtype"]

PathLike = Union[str, "os.PathLike[str]"]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a libdcp dtype name ("bfloat16" -> torch.bfloat16)."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise dcpfs.DcpError(22, f"dtype {name!r} has no torch equivalent in torch {torch.__version__}")
    return dt


class Reader(StorageReader):
    """A ``torch.distributed.checkpoint.StorageReader`` reading through libdcp.

    Use it wherever torch's ``FileSystemReader`` is used::

        dcp.load(state_dict, storage_reader=dcpfs.torch.Reader(path))

    Args:
        path: the checkpoint folder (global ``.metadata``, rank-local
            ``__R.metadata`` files, or anything else :func:`dcpfs.open` opens).
        catalog: use libdcp's catalog (a later open of the same unchanged
            checkpoint is served from it instead of parsing ``.metadata``).
        megatron_fold: give Megatron-Core's reformulated tensors their
            original shapes (see :func:`dcpfs.open`); the metadata handed
            to ``dcp.load`` then describes them so, and the state dict's
            tensors must have those shapes.
        threads: read the tensor items of a plan on this many threads
            (libdcp releases the GIL while it reads; the planner is only
            called on the calling thread); 1 reads them in order on the
            calling thread. Default: the CPUs this process may run on, at
            most 4 (on a 2-CPU machine 2 threads read a warm 256 MiB
            checkpoint about 1.3-1.5x faster than 1).

    The checkpoint is opened once, lazily, by the first call that needs it
    (``read_metadata``), and closed at the end of ``read_data``, by
    ``reset`` or :meth:`close`.

    Rank-local checkpoints (``dcp.save(..., use_collectives=False)``: one
    ``__R.metadata`` per rank, no ``.metadata``) load as with torch's
    ``FileSystemReader``: where several ranks saved a key (a box of it, or
    its bytes item), ``read_metadata()`` raises (torch >= 2.9, whose
    ``dcp.load`` then asks ``read_metadata(rank=R)`` -- logging "Global
    metadata is not found. Falling back to rank local metadata." as it does
    for its own reader), and each rank reads its own ``__R.metadata`` and
    the shards it names, so ranks that saved different values under one
    key each get their own, bit for bit as torch's reader gives them; a rank
    with no ``__R.metadata`` fails as torch's does. A rank-local checkpoint
    whose ranks saved disjoint boxes (each key or box by one rank) is one
    global view: read whole, so it also loads on another number of ranks or
    another sharding. With torch before 2.9 (no per-rank fallback), the
    merged view is read whole, a key several ranks saved from the lowest
    rank's file.
    """

    def __init__(self, path: PathLike, *, catalog: bool = True, threads: Optional[int] = None,
                 megatron_fold: bool = False) -> None:
        super().__init__()
        self.path: str = os.fspath(path)
        self.catalog = catalog
        self.megatron_fold = megatron_fold
        self.threads = max(1, int(threads)) if threads is not None else _default_threads()
        self.load_id = uuid.uuid4().hex
        self.rank: Optional[int] = None
        self.view_rank: Optional[int] = None     # read_metadata(rank=R): rank R's view of a rank-local save
        self._ck: Optional[Any] = None
        self._lock = threading.Lock()

    # -- the checkpoint ---------------------------------------------------

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint folder (torch logs it and passes it to its hooks)."""
        return self.path

    def _open(self) -> "dcpfs.Checkpoint":
        with self._lock:
            if self._ck is None:
                self._ck = dcpfs.open(self.path, catalog=self.catalog, megatron_fold=self.megatron_fold,
                                      rank=self.view_rank)
            return self._ck

    def close(self) -> None:
        """Close the checkpoint (it is opened again when needed)."""
        with self._lock:
            ck, self._ck = self._ck, None
        if ck is not None:
            ck.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    # -- StorageReader ----------------------------------------------------

    def reset(self, checkpoint_id: Optional[PathLike] = None) -> None:
        """Start a new load (of ``checkpoint_id`` when given)."""
        self.close()
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self.load_id = uuid.uuid4().hex
        self.view_rank = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """torch's ``Metadata``, built from libdcp's model of the checkpoint.

        Tensors become ``TensorStorageMetadata`` (dtype, global shape, one
        ``ChunkStorageMetadata`` per stored chunk), other items
        ``BytesStorageMetadata``. ``storage_data`` is a small dict describing
        the checkpoint (``read_data`` needs nothing from it: libdcp locates
        every chunk itself). ``planner_data`` is the checkpoint's own: each
        key's path in the nested state dict it was flattened from, read from
        ``.metadata`` by libdcp when first used (a :class:`PlannerData`), so
        ``_EmptyStateDictLoadPlanner`` (``dcp_to_torch_save``) rebuilds
        ``{"model": {"w": ...}}`` as with torch's reader, not flat keys.

        ``rank=R`` (torch's keyword: ``_load_state_dict`` asks a reader whose
        ``read_metadata`` has a ``**kwargs`` parameter once more, for
        ``rank=distW.rank``, when ``read_metadata()`` failed): rank R's view
        of a rank-local checkpoint, only ``__R.metadata`` and the shards it
        names (``dcpfs.open(path, rank=R)``), which ``read_data`` then reads
        from; no ``__R.metadata`` raises DcpError (ENOENT) naming it. Without
        it, a rank-local checkpoint some of whose keys several ranks saved
        raises DcpError (ENOENT: no global view) where torch asks again per
        rank (torch >= 2.9), so that each rank gets its own values; other
        checkpoints, and every one with older torch, are read whole. Other
        arguments are ignored.
        """
        rank = kwargs.get("rank")
        view = None if rank is None else int(rank)
        if view != self.view_rank:
            self.close()
            self.view_rank = view
        ck = self._open()
        if view is None and _torch_asks_rank():
            several = ck._replicated_keys()
            if several:
                raise dcpfs.DcpError(errno.ENOENT, (
                    f"{self.path}: no .metadata: a rank-local checkpoint (__R.metadata files) where several ranks "
                    f"saved {several[0]!r}" + (f" and {len(several) - 1} other keys" if len(several) > 1 else "") +
                    ", possibly with different values: each rank reads its own __R.metadata "
                    "(read_metadata(rank=R), as torch's FileSystemReader)"))
        sdm: Dict[str, Union[TensorStorageMetadata, BytesStorageMetadata]] = {}
        for key in ck.keys():
            info = ck.info(key)
            if info.kind == "bytes" or info.dtype is None:     # (a tensor always has a dtype)
                sdm[key] = BytesStorageMetadata()
                continue
            chunks = [ChunkStorageMetadata(offsets=torch.Size(c.offsets), sizes=torch.Size(c.sizes))
                      for c in info.chunks]
            sdm[key] = TensorStorageMetadata(
                properties=TensorProperties(dtype=torch_dtype(info.dtype)),
                size=torch.Size(info.shape),
                chunks=chunks,
            )
        meta = dict(getattr(ck, "meta", None) or {})
        storage_data = {"reader": "dcpfs", "path": self.path}
        storage_data.update({k: meta[k] for k in ("generation", "serialization", "layout") if k in meta})
        fields: Dict[str, Any] = {"state_dict_metadata": sdm, "planner_data": PlannerData(ck.path, list(sdm)),
                                  "storage_data": storage_data}
        # Metadata grew storage_meta in torch 2.4 and version in 2.9: set what this torch has.
        known = {f.name for f in dataclasses.fields(Metadata)}
        if "storage_meta" in known:
            from torch.distributed.checkpoint.metadata import StorageMeta
            fields["storage_meta"] = StorageMeta(checkpoint_id=self.path, load_id=self.load_id)
        if "version" in known:
            fields["version"] = None
        return Metadata(**fields)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        """Nothing to set up beyond noting the rank."""
        self.rank = kwargs.get("rank")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """This rank's plan, unchanged: libdcp locates every chunk itself, so
        the items need no storage data."""
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        """Every rank's plan, unchanged (run on the coordinator): each rank
        reads its own items, so there is nothing to coordinate."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        """Read every item of ``plan``: bytes items through
        ``planner.load_bytes``, tensor boxes straight into
        ``planner.resolve_tensor(item)`` (through a temporary of the stored
        dtype when the target is not contiguous, of another dtype or a
        conj/neg view, then copied and cast into it), each committed with
        ``planner.commit_tensor``. Returns a completed future; errors raise
        (``dcpfs.DcpError`` naming file, key and reason)."""
        ck = self._open()
        try:
            tensor_items = []
            for item in plan.items:
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, io.BytesIO(ck.read_bytes(item.storage_index.fqn)))
                else:
                    tensor_items.append(item)
            if self.threads > 1 and len(tensor_items) > 1:
                self._read_tensors_threaded(ck, tensor_items, planner)
            else:
                for item in tensor_items:
                    target = planner.resolve_tensor(item).detach()
                    _read_box(ck, item, target)
                    planner.commit_tensor(item, target)
        finally:
            self.close()
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _read_tensors_threaded(self, ck, items: List[ReadItem], planner: LoadPlanner) -> None:
        # The planner is called on this thread only; the reads (and casts)
        # run on the pool, where libdcp and torch release the GIL.
        targets = [planner.resolve_tensor(item).detach() for item in items]
        with ThreadPoolExecutor(min(self.threads, len(items))) as pool:
            for f in [pool.submit(_read_box, ck, it, t) for it, t in zip(items, targets)]:
                f.result()
        for item, target in zip(items, targets):
            planner.commit_tensor(item, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: PathLike) -> bool:
        """True when libdcp can open ``checkpoint_id`` as a checkpoint.

        The checkpoint is opened without the catalog (it is parsed, and
        nothing is written to the catalog): this classmethod has no
        ``catalog`` argument to honour, and a check must not record the
        checkpoint for a user who reads it with ``catalog=False``.
        """
        try:
            path = os.fspath(checkpoint_id)
        except TypeError:
            return False
        if not os.path.exists(path):
            return False
        try:
            with dcpfs.open(path, catalog=False):
                return True
        except (OSError, ValueError):
            return False


class PlannerData(MappingABC):
    """``Metadata.planner_data`` of a checkpoint: key -> its path in the
    nested state dict (a tuple of str dict keys and int list indices), as
    torch's save planner records it and its ``_EmptyStateDictLoadPlanner``
    and ``unflatten_state_dict`` use it. Read from the folder's
    ``.metadata`` by libdcp (``dcp_key_paths_read``: no pickle is run) on
    first use, so a load that never asks costs nothing. Keys without a
    recorded path (rank-local ``__R.metadata`` folders, single files) are
    absent: torch's planner then keeps them flat."""

    def __init__(self, path: str, keys: List[str]) -> None:
        self.path = path
        self._keys = keys
        self._paths: Optional[Dict[str, Tuple[Union[str, int], ...]]] = None

    def _table(self) -> Dict[str, Tuple[Union[str, int], ...]]:
        if self._paths is None:
            self._paths = _key_paths(self.path, self._keys)
        return self._paths

    def __getitem__(self, key: str) -> Tuple[Union[str, int], ...]:
        return self._table()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return f"PlannerData({self.path!r}, {self._table()!r})"


def _key_paths(path: str, keys: List[str]) -> Dict[str, Tuple[Union[str, int], ...]]:
    """Each key's recorded path (keys without one left out)."""
    from ._native import ffi, lib
    err = ffi.new("dcp_error *")
    out = ffi.new("dcp_key_paths **")
    if lib.dcp_key_paths_read(os.fsencode(path), out, err) < 0:
        dcpfs._raise(err)
    n = ffi.new("size_t *")
    table: Dict[str, Tuple[Union[str, int], ...]] = {}
    try:
        for key in keys:
            if "\0" in key:
                continue
            for form in dcpfs._key_forms(key):
                parts = lib.dcp_key_paths_get(out[0], form, n)
                if parts != ffi.NULL:
                    table[key] = tuple(
                        ffi.unpack(parts[i].str, parts[i].len).decode("utf-8", "dcpfs.key")
                        if parts[i].str != ffi.NULL else int(parts[i].index) for i in range(n[0]))
                    break
    finally:
        lib.dcp_key_paths_free(out[0])
    return table


@functools.lru_cache(maxsize=None)
def _torch_asks_rank() -> bool:
    """Whether this torch's dcp.load asks ``read_metadata(rank=R)`` when
    ``read_metadata()`` fails (torch >= 2.9, which writes rank-local
    checkpoints): its own FileSystemReader takes the keyword since then."""
    try:
        from torch.distributed.checkpoint import FileSystemReader
        return "kwargs" in inspect.signature(FileSystemReader.read_metadata).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return False


def _default_threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(4, n))


def _box(item: ReadItem) -> Tuple[Tuple[int, int], ...]:
    """The item's box in the global tensor: its chunk's offsets plus the
    offsets inside the chunk, and the lengths."""
    chunk = item.storage_index.offset
    starts: Sequence[int] = chunk if chunk is not None else (0,) * len(item.lengths)
    return tuple((int(c) + int(o), int(n)) for c, o, n in zip(starts, item.storage_offsets, item.lengths))


def _read_box(ck, item: ReadItem, target: torch.Tensor) -> None:
    """Fill ``target`` with the item's box of its stored tensor."""
    key = item.storage_index.fqn
    box = _box(item)
    if tuple(target.shape) != tuple(int(n) for n in item.lengths):
        raise dcpfs.DcpError(22, f"{ck_path(ck)}: {key}: the destination has shape {tuple(target.shape)}, "
                                 f"the read of box {box} has {tuple(item.lengths)}")
    if target.numel() == 0:
        return
    stored = torch_dtype(ck.info(key).dtype)
    if target.dtype == stored and target.is_contiguous() and not target.is_conj() and not target.is_neg():
        ck.read(key, box=box, out=target)
    else:
        tmp = torch.empty(tuple(target.shape), dtype=stored, device=target.device
                          if target.device.type == "cuda" else "cpu")
        ck.read(key, box=box, out=tmp)
        target.copy_(tmp)


def ck_path(ck: Any) -> str:
    """A checkpoint's path for messages ("checkpoint" when it has none)."""
    return getattr(ck, "path", "checkpoint")


from ._collective import load  # noqa: E402  (the read-once collective loader)
