"""The read-once collective load under torch.distributed (``dcpfs.torch.load``).

Every rank passes its state dict; each rank's tensors (plain tensors whole,
DTensors by their local shard's box of the global tensor, ShardedTensors by
each local shard's) and non-tensor items become requests. The ranks
exchange them, and each builds the same global plan with libdcp's
``dcp_gplan_build`` -- the planner libdcpload runs over MPI: every needed
byte range of storage is one *unit*, read by one rank and delivered to
every rank that needs part of it. Here the plan runs over torch.distributed:

* a rank places its own fragments of the units it reads (a unit that only
  it needs, landing contiguously in one host destination, is read straight
  into it);
* ranks on the reader's node take their fragments from the node's page
  cache once the reader has read the unit (``node_sharing="page_cache"``,
  the default: each byte copied once, straight into its destination, and
  storage still read once), or copy them out of the reader's staging buffer
  in shared memory (``"staging"``, ``/dev/shm``: for file systems whose
  reads bypass the page cache). A unit no other node needs, which a peer
  takes whole into one host destination (a replicated tensor), the peer
  reads beside its reader in the same round instead: both reads wait on
  the same pages of the page cache, so storage is still read once;
* ranks on other nodes receive the packed bytes they need as one
  point-to-point message (gloo for CPU process groups, NCCL for CUDA ones).

Units go in rounds of at most ``nstaging`` units per reader (units every
rank needing them reads along do not count); a barrier per round keeps node
peers behind the reader (they take a unit only after it was
read) and, with staging, keeps a reader from refilling a buffer (double-
buffered) its peers still copy from. Errors (an unknown key, a box outside its
tensor, a damaged checkpoint, a failed read) are agreed: every rank raises
the same :class:`dcpfs.DcpError`, naming the rank where it happened.
"""
from __future__ import annotations

import io
import mmap
import operator
import os
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from . import DcpError, _bump_version, _key_bytes, _message, _no_storage, open as _open
from ._native import ffi, lib

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["load", "LoadStats"]

_STAGING = 16 << 20     # bytes per unit (the plan's largest read), as libdcpload's default
_SCRATCH = 1 << 20      # a reader's scratch for units its node's ranks take from the page cache
_ALIGN = int(lib.DCP_DIRECT_ALIGN)   # O_DIRECT's block: buffers, offsets and lengths in whole ones


@dataclass
class LoadStats:
    """What one rank did in :func:`load` (sums over ranks: ``bytes_read`` equals
    ``bytes_unique``, ``bytes_sent`` equals ``bytes_received``)."""

    bytes_read: int = 0          #: storage bytes this rank read
    bytes_unique: int = 0        #: unique storage bytes the job needed (same on every rank)
    bytes_loaded: int = 0        #: bytes of this rank's destinations
    bytes_shared: int = 0        #: bytes this rank took from node peers' reads (page cache or shared staging)
    bytes_sent: int = 0          #: bytes sent to ranks on other nodes
    bytes_received: int = 0      #: bytes received from ranks on other nodes
    units: int = 0               #: units (reads) of the global plan
    rounds: int = 0
    seconds_plan: float = 0.0    #: exchanging requests and building the plan
    seconds_transfer: float = 0.0
    seconds_total: float = 0.0
    transport: str = "torch.distributed"
    bytes_own: int = 0           #: bytes this rank read alone from its own __R.metadata's shards (keys several
                                 #: ranks of a rank-local save saved: each rank gets its own, not read once)


class _Dest:
    """One request of this rank: where its bytes go."""

    __slots__ = ("key", "target", "shape", "buf", "ptr", "nbytes", "kind", "cuda", "finish")
    key: str
    target: Any             # the caller's tensor (a DTensor's local shard), None for bytes items
    shape: tuple            # the tensor's global shape (a DTensor's, not its shard's); () for bytes items
    buf: Any                # where the bytes land: the target itself, a temporary, or a numpy buffer
    ptr: int
    nbytes: int
    kind: str               # "tensor" or "bytes"
    cuda: bool
    finish: Optional[Any]   # copies a temporary into its target after the load

    def __init__(self) -> None:
        self.finish = None


def _flatten(state_dict: Dict[str, Any]):
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    return flatten_state_dict(state_dict)


def _flatten_as_saved(state_dict: Dict[str, Any], flat: Dict[str, Any], mappings: Dict[str, Any], ck):
    """The state dict flattened as the checkpoint's torch flattened it, as
    ``DefaultLoadPlanner.create_local_plan`` decides: torch up to 2.3 kept a
    dict holding no tensor (and a list of such dicts) whole, one stored item,
    where torch 2.4 on stores each of its values. When a stored key is not
    among ``flat``'s keys and is among the 2.3 flattening's, that one is
    used; else ``flat`` and ``mappings`` as they are (also with a torch
    without the 2.3 traversal, whose flattening is 2.3's already)."""
    try:
        from torch.distributed.checkpoint import _version
        from torch.distributed.checkpoint._traverse import traverse_state_dict_v_2_3  # noqa: F401  (2.4+)
    except ImportError:
        return flat, mappings
    missing = set(ck.keys()) - set(flat)
    if not missing:
        return flat, mappings
    before = _version._derived_version
    _version._derived_version = "2_3"
    try:
        old_flat, old_mappings = _flatten(state_dict)
    finally:
        _version._derived_version = before
    if missing & set(old_flat):
        return old_flat, old_mappings
    return flat, mappings


def _torch_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _node_key() -> str:
    """Ranks that share memory: same host, same boot, same /dev/shm (or the
    same $DCPFS_NODE, which tests set to make one host several nodes)."""
    if os.environ.get("DCPFS_NODE"):
        return "env:" + os.environ["DCPFS_NODE"]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        st = os.stat("/dev/shm")
        shm = f"{st.st_dev}:{st.st_ino}"
    except OSError:
        shm = "none"
    return f"{socket.gethostname()}|{boot}|{shm}"


def _err(ck_err) -> DcpError:
    return DcpError(ck_err.code, _message(ck_err))


def _regions(flat: Dict[str, Any], ck) -> Tuple[List[_Dest], List[Tuple[str, tuple, tuple]]]:
    """This rank's requests: (key, offsets, lengths) and where each goes."""
    import importlib

    import torch
    DTensor: Any = None
    local_shape_and_offset: Any = None
    # torch.distributed.tensor from 2.5 on; before, DTensor was private (and that name was another package)
    for mod in ("torch.distributed.tensor", "torch.distributed._tensor"):
        try:
            DTensor = importlib.import_module(mod).DTensor
            local_shape_and_offset = importlib.import_module(mod + "._utils").compute_local_shape_and_global_offset
            break
        except (ImportError, AttributeError):
            DTensor = None
    # ShardedTensor (torch.distributed._shard: FSDP1, old tensor parallelism): a state dict holding one has
    # imported its module; not imported here (deprecated: importing it warns)
    ShardedTensor: Any = getattr(sys.modules.get("torch.distributed._shard.sharded_tensor"), "ShardedTensor", None)
    dests: List[_Dest] = []
    reqs: List[Tuple[str, tuple, tuple]] = []
    for key, value in flat.items():
        d = _Dest()
        d.key = key
        if not isinstance(key, str):
            raise DcpError(22, f"{ck.path}: state dict keys are str, not {type(key).__name__} ({key!r})")
        where = f"{ck.path}: {_shown(key)}"
        if isinstance(value, torch.Tensor) and _stores_bytes(ck, key):
            # dcp.load's planner reads a stored bytes item whatever the state dict holds: its value replaces it
            value = None
        if ShardedTensor is not None and isinstance(value, ShardedTensor):
            _sharded_tensor_regions(torch, d, value, where, ShardedTensor, DTensor, dests, reqs)
            continue
        if DTensor is not None and isinstance(value, DTensor):
            partial = [p for p in value.placements if p.is_partial()]
            if partial:
                # its value is the sum of the ranks' shards: no shard can be filled from the stored value
                raise DcpError(22, f"{where}: the DTensor has a Partial placement ({partial[0]}): its value is "
                                   "a sum over ranks still to be reduced, which a load cannot fill (dcp.load "
                                   "refuses it too): redistribute it to Replicate() or Shard() first")
            if value.device_mesh.get_coordinate() is None:
                # a DTensor on a mesh without this rank (another stage's): dcp.load skips it here
                _check_only(torch, d, tuple(int(s) for s in value.shape), dests, reqs)
                continue
            local = value.to_local()
            shape, offset = local_shape_and_offset(
                value.shape, value.device_mesh, value.placements)
            d.kind = "tensor"
            d.target = local
            d.shape = tuple(int(s) for s in value.shape)
            offsets, lengths = tuple(int(o) for o in offset), tuple(int(s) for s in shape)
            if tuple(local.shape) != lengths:
                raise DcpError(22, f"{where}: the DTensor's local shard has shape {tuple(local.shape)}, "
                                   f"its placement says {lengths}")
            _check_target(torch, where + " (the DTensor's local shard)", local)
        elif isinstance(value, torch.Tensor):
            d.kind = "tensor"
            d.target = value
            d.shape = tuple(int(s) for s in value.shape)
            offsets, lengths = (0,) * value.dim(), d.shape
            _check_target(torch, where, value)
        else:
            d.kind = "bytes"
            d.target = None
            d.shape = ()
            offsets, lengths = (), ()
        dests.append(d)         # empty ones too: their key and shape are checked, then they are dropped
        reqs.append((key, offsets, lengths))
    return dests, reqs


def _check_only(torch, d: _Dest, shape: tuple, dests: List[_Dest], reqs: list) -> None:
    """A tensor this rank holds no element of (a DTensor on another mesh, a
    ShardedTensor without a local shard here): its key and global shape are
    checked all the same, as ``dcp.load`` checks them, with an empty box
    that needs no byte (dropped by _drop_empty)."""
    d.kind = "tensor"
    d.target = torch.empty(0)
    d.shape = shape
    dests.append(d)
    reqs.append((d.key, (0,) * len(shape), (0,) * len(shape)))


def _sharded_tensor_regions(torch, d: _Dest, value: Any, where: str, ShardedTensor: Any, DTensor: Any,
                            dests: List[_Dest], reqs: list) -> None:
    """A ShardedTensor's requests: one per local shard (its offsets and sizes
    in the global tensor, filled in place), as dcp.load reads into each."""
    shape = tuple(int(s) for s in value.size())
    shards = value.local_shards()
    if not shards:
        _check_only(torch, d, shape, dests, reqs)
        return
    for sh in shards:
        t = sh.tensor
        offsets = tuple(int(o) for o in sh.metadata.shard_offsets)
        lengths = tuple(int(n) for n in sh.metadata.shard_sizes)
        what = f"{where} (the ShardedTensor's local shard at {list(offsets)})"
        if isinstance(t, ShardedTensor) or (DTensor is not None and isinstance(t, DTensor)):
            raise DcpError(22, f"{what}: the shard is itself a {type(t).__name__} (FSDP1 with tensor "
                               "parallelism): not supported, load through dcpfs.torch.Reader and dcp.load")
        if tuple(t.shape) != lengths:
            raise DcpError(22, f"{what}: the shard's tensor has shape {list(t.shape)}, its metadata says "
                               f"{list(lengths)}")
        _check_target(torch, what, t)
        s = _Dest()
        s.key, s.kind, s.target, s.shape = d.key, "tensor", t, shape
        dests.append(s)
        reqs.append((d.key, offsets, lengths))


def _stores_bytes(ck, key: str) -> bool:
    """The checkpoint stores key as a bytes item (a non-tensor value)."""
    if "\0" in key:
        return False
    try:
        return ck.info(key).kind == "bytes"
    except KeyError:        # (an unknown key: refused by _check_local)
        return False


def _shown(key: str) -> str:
    """A key as messages show it (a NUL visible)."""
    return key.replace("\0", "\\0")


def _check_target(torch, where: str, t) -> None:
    """Refuse (EINVAL), before the ranks agree to go on, a destination this rank could
    not fill -- so that every rank raises the same error instead of one
    failing alone after the load: a sparse or other non-strided tensor, a
    meta tensor (no memory), a FakeTensor or other subclass without storage
    of its own that is no wrapper of real tensors, an expanded tensor (elements
    sharing memory: torch's copy_ refuses it), an inference tensor outside
    inference mode. Conj/neg views, other dtypes, strided views and wrapper
    subclasses (_filled_by_copy) are filled through a temporary, as torch's
    reader does."""
    if t.layout != torch.strided:
        raise DcpError(22, f"{where}: the tensor has layout {t.layout}: only dense (strided) tensors can be filled")
    if t.device.type == "meta":
        raise DcpError(22, f"{where}: the tensor is on the meta device, with no memory to fill: allocate it "
                           "first (for example module.to_empty(device=...))")
    if t.numel() and t.device.type in ("cpu", "cuda") and _no_storage(t) and not _is_wrapper(t):
        raise DcpError(22, f"{where}: the tensor is a {type(t).__name__} without storage of its own "
                           "(data_ptr() is 0): pass tensors that hold their elements")
    if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
        raise DcpError(22, f"{where}: the tensor is expanded (stride 0 in a dimension of size > 1): several of "
                           "its elements share memory; pass a tensor of its own (for example .clone())")
    if t.is_inference() and not torch.is_inference_mode_enabled():
        raise DcpError(22, f"{where}: the tensor is an inference tensor: torch allows in-place writes to it only "
                           "in inference mode")


def _is_wrapper(t) -> bool:
    """t is a traceable wrapper subclass: a tensor whose ops its class runs on
    the real tensors it wraps (``__tensor_flatten__``: torchao's float8
    training weights and NF4 tensors, FSDP2's and torch.compile's kind).
    It has no storage of its own; ``copy_`` into it is its class's, which
    ``dcp.load`` calls (and which may quantize)."""
    try:
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass
    except ImportError:     # (torch < 2.1: none are filled)
        return False
    return bool(is_traceable_wrapper_subclass(t))


def _filled_by_copy(t, stored: str) -> bool:
    """t is filled through a temporary of the stored dtype and its own
    ``copy_``, not in place: not contiguous, of another dtype, a conj/neg
    view (its memory holds other values than it shows) or a wrapper without
    storage of its own."""
    return not (t.is_contiguous() and _torch_name(t.dtype) == stored and not t.is_conj() and not t.is_neg()
                and not (t.numel() and _no_storage(t)))


def _drop_empty(dests: List[_Dest], reqs: list, stored: List[str], sizes: List[int]):
    """The requests that need bytes: an empty tensor (an empty DTensor shard)
    needs none once its key and shape were checked."""
    keep = [i for i, d in enumerate(dests) if d.kind != "tensor" or d.target.numel()]
    return ([dests[i] for i in keep], [reqs[i] for i in keep], [stored[i] for i in keep],
            [sizes[i] for i in keep])


def _check_local(ck, dests, reqs) -> Tuple[List[str], List[int]]:
    """Check each request against the checkpoint (the planner's own check, so
    messages match libdcpload's); the stored dtype and byte size of each (a
    destination of another dtype is read through a temporary and cast)."""
    err = ffi.new("dcp_error *")
    entry = ffi.new("const dcp_entry **")
    nbytes = ffi.new("uint64_t *")
    stored = []
    sizes = []
    for d, (key, off, ln) in zip(dests, reqs):
        if "\0" in key:     # C would read the key up to the NUL: another key
            raise DcpError(2, f"{ck.path}: {_shown(key)}: no such key in the checkpoint (keys hold no NUL)")
        o = ffi.new("int64_t[]", list(off) or [0])
        l = ffi.new("int64_t[]", list(ln) or [0])
        if lib.dcp_greq_check(ck._ptr, _c_key(key), lib.DCP_DTYPE_INVALID, len(off), o, l, entry, nbytes,
                              err) < 0:
            failed = _err(err)
            # a stored key of another kind or shape: said so, as for a smaller tensor, not as the box's failure
            # ('the region has 0 dimensions', 'region [0:6,0:5] lies outside the tensor')
            if lib.dcp_find_entry(ck._ptr, _c_key(key), entry, ffi.new("dcp_error *")) == 0:
                _check_entry(ck, d, key, entry[0])
            raise failed
        e = entry[0]
        _check_entry(ck, d, key, e)
        is_tensor = e.kind == lib.DCP_KIND_TENSOR
        stored.append(ffi.string(lib.dcp_dtype_name(e.dtype)).decode() if is_tensor else "bytes")
        sizes.append(int(nbytes[0]))
    return stored, sizes


def _check_entry(ck, d: _Dest, key: str, e) -> None:
    """The stored entry e of key is of d's kind and, a tensor, of d's (global) shape (dcp.load's size check)."""
    is_tensor = e.kind == lib.DCP_KIND_TENSOR
    if is_tensor != (d.kind == "tensor"):
        what = "a tensor" if is_tensor else "a bytes item (a non-tensor value)"
        raise DcpError(22, f"{ck.path}: {_shown(key)}: the checkpoint stores {what}, the state dict holds "
                           f"{type(d.target).__name__ if d.kind == 'tensor' else 'a non-tensor value'}")
    if is_tensor:
        have = tuple(int(e.shape[i]) for i in range(e.ndim))
        if d.shape != have:
            raise DcpError(22, f"{ck.path}: {_shown(key)}: the state dict's tensor has shape {list(d.shape)}, "
                               f"the checkpoint stores {list(have)}")


def _encode(reqs) -> bytes:
    err = ffi.new("dcp_error *")
    n = len(reqs)
    regions = ffi.new("dcp_gregion[]", max(n, 1))
    keep = []
    for i, (key, off, ln) in enumerate(reqs):
        k = ffi.new("char[]", _c_key(key))
        o = ffi.new("int64_t[]", list(off) or [0])
        l = ffi.new("int64_t[]", list(ln) or [0])
        keep += [k, o, l]
        regions[i].key = k
        regions[i].dtype = lib.DCP_DTYPE_INVALID
        regions[i].ndim = len(off)
        regions[i].offsets = o
        regions[i].lengths = l
    buf = ffi.new("unsigned char **")
    blen = ffi.new("size_t *")
    if lib.dcp_greqs_encode(regions, n, buf, blen, err) < 0:
        raise _err(err)
    try:
        return bytes(ffi.buffer(buf[0], blen[0]))
    finally:
        lib.free(buf[0])


def _c_key(key: str) -> bytes:
    """A key as libdcp takes it (a C string: no NUL inside): the bytes pickle writes for it."""
    if "\0" in key:
        raise ValueError(f"{_shown(key)}: a key cannot hold a NUL character")
    return _key_bytes(key)


def _int_option(name: str, value: Any, low: int, high: Optional[int] = None) -> int:
    """An int option of load, checked (a float or a str is a TypeError, not a
    failure deep inside the load)."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"dcpfs.torch.load: {name} must be an int, not {type(value).__name__} ({value!r})") from None
    if v < low or (high is not None and v > high):
        raise ValueError(f"dcpfs.torch.load: {name} must be " +
                         (f"in [{low}, {high}]" if high is not None else f">= {low}") + f", not {v}")
    return v


def _agree(dist, group, me: int, world: int, item: Any) -> List[Any]:
    out: List[Any] = [None] * world
    dist.all_gather_object(out, item, group=group)
    return out


def _raise_first(gathered: List[dict], world: int) -> None:
    for r, g in enumerate(gathered):
        if g.get("error"):
            code, msg = g["error"]
            raise DcpError(code, msg if world == 1 or g.get("agreed") else f"rank {r}: {msg}")


class _Shm:
    """A rank's shared staging: a file in /dev/shm mapped by the node's ranks."""

    def __init__(self, path: str, size: int, create: bool) -> None:
        self.path = path
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            # populated up front: faulting 4 KiB pages one by one mid-transfer costs more
            self.map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        finally:
            os.close(fd)
        self.arr = np.frombuffer(self.map, dtype=np.uint8)
        self.addr = self.arr.ctypes.data

    def close(self) -> None:
        self.arr = None  # type: ignore[assignment]   # (the mapping can close only once no view holds it)
        try:
            self.map.close()
        except BufferError:   # a view still alive: the mapping goes with it
            pass


def load(state_dict: Dict[str, Any], path: Union[str, "os.PathLike[str]"],
         process_group: Optional["ProcessGroup"] = None, *,
         staging_bytes: int = _STAGING, nstaging: int = 2, shm_bytes: int = 32 << 20,
         plan_ops: int = 1 << 17, io_threads: int = 4, node_sharing: str = "page_cache",
         catalog: bool = True, direct: bool = False, megatron_fold: bool = False,
         allow_partial_load: bool = False) -> LoadStats:
    """Fill ``state_dict`` in place from the checkpoint at ``path``, collectively.

    Call it on every rank of ``process_group`` (default: the whole job, as set
    up by ``torch.distributed.init_process_group`` under torchrun or Slurm).
    Tensors are filled in place (plain tensors whole, DTensors by their local
    shard, ShardedTensors by each of their local shards, in any sharding --
    not necessarily the one the checkpoint was saved with); non-tensor items are replaced by their stored values, as
    ``torch.distributed.checkpoint.load`` does (a tensor too, where the
    checkpoint stores a non-tensor value under its key). Every stored byte is read from
    storage once across the job and delivered to the ranks that need it:
    within a node through the page cache (or shared memory), across nodes by point-to-point
    messages of the process group's backend (gloo on CPU, NCCL for CUDA).
    The ``.metadata`` is parsed by libdcp: no pickle is executed for it.

    Rank-local checkpoints (``dcp.save(..., use_collectives=False)``: one
    ``__R.metadata`` per rank, no ``.metadata``) load as torch's ``dcp.load``
    loads them: a key several ranks saved (a box of it, or its bytes item, in
    more than one ``__R.metadata``; their values may differ: a per-rank seed,
    a rank-dependent tensor) is read by each rank from its own
    ``__R.metadata``'s shards, alone and not read-once (``LoadStats.bytes_own``),
    R being the rank in ``process_group``, 0 without a group; every other key
    (disjoint DTensor shards, a key one rank saved) goes through the read-once
    plan over the merged view, in any sharding. With more ranks than saved
    files, a rank without ``__R.metadata`` that asks for such a key fails,
    and every rank raises the agreed error naming that rank and its missing
    ``__R.metadata``, as torch's ``dcp.load`` fails on every rank (its
    ranks plan in one collective step: each raises a ``CheckpointException``
    naming that rank); with fewer, ranks read their own files and the others are unused,
    as with torch.

    Errors are agreed: if any rank fails (an unknown key, a box outside its
    tensor, a damaged checkpoint, a failed read, memory or a thread it
    cannot get while reading, a stored value that does not unpickle there,
    a bad option, a destination that cannot be filled, a ``Stateful``
    value's ``state_dict()`` or ``load_state_dict()`` raising), every rank raises the same :class:`dcpfs.DcpError` naming the
    rank, file, key and reason; a rank passing another checkpoint (a copy
    with a shard of another size) is told which file differs.
    Destinations are checked before anything is read, as ``dcp.load``
    checks them: each key must be stored (unless ``allow_partial_load``),
    each tensor (a DTensor's global shape) of the stored shape; sparse, meta, expanded (stride 0) tensors,
    FakeTensors and DTensors with a ``Partial`` placement are refused. Conj
    and neg views, other dtypes, non-contiguous tensors and wrapper
    subclasses without storage of their own (torchao's float8 training
    weights and NF4 tensors, also as a DTensor's local shard) are filled
    through a temporary of the stored dtype and their own ``copy_``, as
    ``dcp.load`` fills them (an NF4 tensor quantizes what it is given). Tensors
    filled in place have their autograd version counter bumped. A DTensor
    whose mesh does not hold this rank (a submesh: another pipeline stage's)
    is only checked, not filled, as ``dcp.load`` skips it. A checkpoint
    saved by torch 2.3 or older, whose dicts holding no tensor (an
    optimizer's ``param_groups``, ``{"epoch": 3, "name": ...}``) are one
    stored item each where newer torch stores each of their values, loads
    as ``dcp.load`` loads it: when a stored key is no key of the state dict
    flattened as torch >= 2.4 flattens it and is one of the state dict
    flattened as torch 2.3 did, that flattening is used.

    Args:
        state_dict: the (nested) state dict to fill, as for ``dcp.load``; as
            there, a top-level value that is ``Stateful`` (a module, an
            optimizer, any object with ``state_dict()`` and
            ``load_state_dict()``) is loaded into its ``state_dict()``, then
            handed back with ``load_state_dict``, both in sorted key order
            (``dcp.load``'s); a rank stops at its first ``load_state_dict``
            that raises, and every rank raises the agreed error.
        path: the checkpoint folder (or a single torch.save/safetensors file).
        process_group: the group to load over (None: the default group).
        staging_bytes: the largest single read (a unit of the plan).
        nstaging: units per reader in one round.
        shm_bytes: with ``node_sharing="staging"``, the most shared staging one rank maps: each reader holds
            ``2 * nstaging`` units in shared memory when node peers copy
            from it, and every rank of a node maps every reader's; when
            that would exceed shm_bytes, units are made smaller (down to
            1 MiB).
        plan_ops: keys are planned and loaded in batches of about this many
            read operations (every rank holds the whole plan of a batch,
            about 130 bytes an operation; a column shard of a row-major
            tensor is an operation a row).
        io_threads: threads reading a rank's units of a round at once.
        node_sharing: how ranks of one node share what a reader read:
            ``"page_cache"`` (they read it again from the page cache after
            the reader did, straight into their destinations: no staging
            memory, one copy; a unit a peer takes whole it reads beside
            the reader, waiting on the same pages) or ``"staging"`` (they copy it out of the
            reader's buffer in ``/dev/shm``: for file systems whose reads
            bypass the page cache, such as FUSE with direct I/O).
        catalog: use libdcp's catalog (a second open of a checkpoint is served
            from it instead of parsing ``.metadata`` again).
        direct: the units this rank reads for itself and for other nodes
            are read with ``O_DIRECT`` when they are not in the page cache,
            into a few reused aligned buffers and placed from there (never
            straight into a destination: ``O_DIRECT`` reads whole blocks), as
            ``dcpload --direct`` does: faster on some storage for evicted
            files (a file system without ``O_DIRECT`` is read through the
            page cache). Units the node's peers take from the page cache go
            through it anyway; with ``node_sharing="staging"`` a reader
            reads them into the shared staging the same way (its slots
            have room for whole blocks).

        allow_partial_load: keys of the state dict that the checkpoint does
            not store are left as they are instead of failing the load, as
            with ``dcp.load(..., planner=DefaultLoadPlanner(allow_partial_load=True))``
            (a stored key of another shape or kind still fails).
        megatron_fold: Megatron-Core's reformulated tensors (its distributed
            optimizer's states) in their original shapes, as its own load
            gives them (see :func:`dcpfs.open`): the state dict's tensors
            have those shapes.

    Returns:
        this rank's :class:`LoadStats`.
    """
    import torch
    import torch.distributed as dist

    t0 = time.perf_counter()
    if dist.is_available() and dist.is_initialized():
        group = process_group
        me = dist.get_rank(group)
        world = dist.get_world_size(group)
        if me < 0:      # (torch's collectives return at once on a rank outside their group: alone, at once)
            raise ValueError(f"dcpfs.torch.load: this rank (global rank {dist.get_rank()}) is not in "
                             "process_group: call it on the group's ranks only")
    else:
        if process_group is not None:
            raise ValueError("dcpfs.torch.load: a process group was given but torch.distributed is not initialised")
        group, me, world = None, 0, 1
    stats = LoadStats()

    # 1. Check the options, open, find this rank's requests, check them: any
    # failure (of any type: a peer must not wait for this rank) is agreed.
    ck = None
    own = None
    own_dests: List[Tuple[_Dest, str, tuple, tuple]] = []
    item: Dict[str, Any] = {"node": _node_key(), "token": uuid.uuid4().hex}
    dests: List[_Dest] = []
    shown_path = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
    stateful: set = set()
    try:
        staging_bytes = _int_option("staging_bytes", staging_bytes, 1, 1 << 30)
        nstaging = _int_option("nstaging", nstaging, 1)
        shm_bytes = _int_option("shm_bytes", shm_bytes, 0)
        plan_ops = _int_option("plan_ops", plan_ops, 1)
        io_threads = _int_option("io_threads", io_threads, 1)
        if node_sharing not in ("page_cache", "staging"):
            raise ValueError(f"dcpfs.torch.load: node_sharing must be 'page_cache' or 'staging', "
                             f"not {node_sharing!r}")
        item["opts"] = (staging_bytes, nstaging, shm_bytes, plan_ops, node_sharing, bool(direct), bool(megatron_fold),
                        bool(allow_partial_load))
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"dcpfs.torch.load: state_dict must be a dict, not {type(state_dict).__name__}")
        loading, stateful = _stateful_state_dicts(state_dict, shown_path)
        item["stateful"] = bool(stateful)
        flat, mappings = _flatten(loading)
        ck = _open(os.fspath(path), catalog=catalog, megatron_fold=megatron_fold)
        flat, mappings = _flatten_as_saved(loading, flat, mappings, ck)
        if allow_partial_load:      # as dcp.load's DefaultLoadPlanner(allow_partial_load=True): left as they are
            flat = {k: v for k, v in flat.items() if k in ck}
        dests, reqs = _regions(flat, ck)
        stored, sizes = _check_local(ck, dests, reqs)
        dests, reqs, stored, sizes = _drop_empty(dests, reqs, stored, sizes)
        own, own_dests, dests, reqs, stored, sizes = _per_rank(ck, me, megatron_fold, dests, reqs, stored, sizes)
        item["identity"] = _identity(ck)
        item["path"] = shown_path = ck.path
        item["reqs"] = _encode(reqs)
    except DcpError as e:
        item["error"] = (e.errno or 5, e.strerror or str(e))
    except (ValueError, TypeError, KeyError, OSError) as e:
        item["error"] = (getattr(e, "errno", None) or 22, f"{path}: {e}")
    except Exception as e:     # (an unexpected failure: agreed all the same, its type named)
        item["error"] = (22, f"{path}: {type(e).__name__}: {e}")
    try:
        gathered = _agree(dist, group, me, world, item) if world > 1 else [item]
        _raise_first(gathered, world)
        for r, g in enumerate(gathered):
            if g["identity"] != gathered[0]["identity"]:
                raise DcpError(22, f"dcpfs.torch.load: rank {r} passes another checkpoint than rank 0: "
                                   + _identity_diff(r, g, gathered[0]))
            if g["opts"] != gathered[0]["opts"]:
                raise DcpError(22, f"dcpfs.torch.load: rank {r} passes other options than rank 0 "
                                   f"({g['opts']}; rank 0: {gathered[0]['opts']})")
        _run(torch, dist, group, me, world, ck, dests, stored, sizes, gathered, mappings,
             loading, staging_bytes, nstaging, shm_bytes, plan_ops, io_threads, bool(direct), node_sharing,
             stats, t0, own, own_dests)
    finally:
        if ck is not None:
            ck.close()
            ck = None
        if own is not None:
            own.close()
    # as dcp.load: Stateful values take their loaded state dicts, other top-level values are replaced,
    # in sorted key order, a rank stopping at its first failure; failures agreed when any rank has a Stateful
    # value (the same decision on every rank), so that no rank goes on while a peer raises alone
    failure: Optional[Exception] = None
    local_err = None
    for key, value in loading.items():
        if key in stateful:
            try:
                state_dict[key].load_state_dict(value)
            except Exception as e:     # (any type: agreed)
                failure = e
                local_err = (12 if isinstance(e, MemoryError) else getattr(e, "errno", None) or 22,
                             f"{shown_path}: {_shown(str(key))}: load_state_dict(): {type(e).__name__}: {e}")
                break
        else:
            state_dict[key] = value
    if any(g.get("stateful") for g in gathered):
        try:
            _agree_error(dist, group, me, world, local_err)
        except DcpError as agreed:
            raise agreed from failure
    return stats


def _stateful_state_dicts(state_dict: Mapping, path: str) -> Tuple[Dict[str, Any], set]:
    """What is loaded, as dcp.load makes it: a top-level value that is
    ``Stateful`` (a module, an optimizer, an object with ``state_dict`` and
    ``load_state_dict``) is loaded into its ``state_dict()`` (asked in sorted key
    order, the same on every rank), handed back with ``load_state_dict`` after
    the load; and the keys that were. A ``state_dict()`` that raises is a
    DcpError naming ``path`` (the checkpoint), the key and the exception."""
    from torch.distributed.checkpoint.stateful import Stateful
    loading: Dict[str, Any] = {}
    stateful = set()
    try:
        keys = sorted(state_dict.keys())
    except TypeError:       # (keys that are not all str: refused later, naming the key)
        keys = list(state_dict.keys())
    for key in keys:
        value = state_dict[key]
        if isinstance(value, Stateful):
            try:
                loading[key] = value.state_dict()
            except Exception as e:      # (agreed by the caller, as every failure before the load)
                raise DcpError(12 if isinstance(e, MemoryError) else getattr(e, "errno", None) or 22,
                               f"{path}: {_shown(str(key))}: state_dict(): {type(e).__name__}: {e}") from e
            stateful.add(key)
        else:
            loading[key] = value
    return loading, stateful


def _per_rank(ck, me: int, megatron_fold: bool, dests, reqs, stored, sizes):
    """Keys several ranks of a rank-local save saved (``Checkpoint.replicated``:
    the merged view lists a box or bytes item of theirs in more than one
    ``__R.metadata``), whose values may differ from rank to rank: as torch's
    ``dcp.load`` (each rank reads only its own ``__R.metadata``), this rank
    reads them from its own view, alone, instead of through the read-once
    plan. Returns that view (None when this rank asks for no such key), the
    requests it serves (each with its stored dtype) and the other requests.
    A rank without ``__R.metadata``, or whose file lacks the key or the box,
    fails (torch's load fails too, on every rank: the caller agrees it)."""
    several = set(ck._replicated_keys())     # (empty unless a rank-local save was merged: one pass)
    mine = [i for i, (key, _, _) in enumerate(reqs) if key in several]
    if not mine:
        return None, [], dests, reqs, stored, sizes
    own = _open(ck.path, catalog=False, megatron_fold=megatron_fold, rank=me)
    try:
        _check_local(own, [dests[i] for i in mine], [reqs[i] for i in mine])
    except DcpError as e:
        own.close()
        raise DcpError(e.errno or 22, f"{e.strerror or e} (several ranks saved this key in their __R.metadata, "
                                      f"possibly with different values: as torch's dcp.load, rank {me} reads "
                                      f"its own __{me}.metadata)") from None
    except BaseException:
        own.close()
        raise
    rest = [i for i in range(len(reqs)) if reqs[i][0] not in several]
    return (own, [(dests[i], stored[i], reqs[i][1], reqs[i][2]) for i in mine], [dests[i] for i in rest],
            [reqs[i] for i in rest],
            [stored[i] for i in rest], [sizes[i] for i in rest])


def _read_own(torch, own, own_dests, stats: LoadStats) -> List[Tuple[str, Any]]:
    """Read the requests _per_rank gave this rank's own view into their
    tensors (through a temporary of the stored dtype where the target is not
    a contiguous tensor of it, as dcpfs.torch.Reader reads a box); the
    bytes items' values, to be set into the state dict."""
    values = []
    for d, st, offsets, lengths in own_dests:
        if d.kind == "bytes":
            raw = own.read_bytes(d.key)
            stats.bytes_own += len(raw)
            values.append((d.key, torch.load(io.BytesIO(raw), weights_only=False)))
            continue
        t = d.target
        box = tuple(zip(offsets, lengths))
        if not _filled_by_copy(t, st):
            own.read(d.key, box=box, out=t.detach())
            _bump_version(torch, t)
        else:
            tmp = torch.empty(tuple(t.shape), dtype=getattr(torch, st),
                              device=t.device if t.device.type == "cuda" else "cpu")
            own.read(d.key, box=box, out=tmp)
            t.detach().copy_(tmp)
        stats.bytes_own += t.numel() * torch.empty((), dtype=getattr(torch, st)).element_size()
    return values


def _identity(ck) -> tuple:
    """A cheap identity of the checkpoint: its data files' names and sizes and
    the number of keys (ranks must load the same checkpoint)."""
    names = []
    for i in range(lib.dcp_num_files(ck._ptr)):
        rel = ffi.string(lib.dcp_file_name(ck._ptr, i)).decode("utf-8", "surrogateescape")
        try:
            size = os.stat(os.path.join(ck.path, rel)).st_size
        except OSError:
            size = -1
        names.append((rel, size))
    return (len(ck), tuple(names))


def _identity_diff(r: int, mine: Dict[str, Any], first: Dict[str, Any]) -> str:
    """How rank r's checkpoint differs from rank 0's (their _identity and
    path): the first data file whose size differs or that only one has, else
    the key count. A node-local copy cut short or missing a shard is named so,
    not only as 'another checkpoint'."""
    n_r, files_r = mine["identity"]
    n_0, files_0 = first["identity"]
    head = f"{mine['path']} (rank 0: {first['path']})"
    size_0 = dict(files_0)
    for name, size in files_r:
        if name not in size_0:
            return f"{head}: {name} is not a data file of rank 0's"
        if size != size_0[name]:
            # (-1: gone since it was opened), in dcp_load's words
            return f"{head}: {name}: {size} bytes on rank {r}, {size_0[name]} on rank 0"
    named = {name for name, _ in files_r}
    for name, _ in files_0:
        if name not in named:
            return f"{head}: {name} is a data file of rank 0's only"
    return f"{head}: {n_r} keys on rank {r}, {n_0} on rank 0"


def _prepare_dests(torch, dests, stored, sizes) -> None:
    """Where each request's bytes land: straight into the tensor (host: placed
    in C; CUDA: copied up fragment by fragment), else, where _filled_by_copy,
    into a host temporary of the stored dtype that the tensor's copy_ takes
    (and casts) at the end, as torch's reader does."""
    for d, st, nb in zip(dests, stored, sizes):
        d.nbytes = nb
        if d.kind == "bytes":
            d.buf = np.empty(nb, dtype=np.uint8)
            d.cuda = False
            d.ptr = d.buf.ctypes.data if nb else 0
            continue
        t = d.target
        if not _filled_by_copy(t, st) and t.device.type in ("cpu", "cuda"):
            d.buf = t.detach()      # (the same memory; torch copies into CUDA ones must not be recorded)
        else:
            d.buf = torch.empty(tuple(t.shape), dtype=getattr(torch, st))
            d.finish = _copy_into(t, d.buf)
        # $DCPFS_TEST_FAKE_CUDA: CPU tensors placed as CUDA ones are (torch
        # copies), so tests without a GPU run that code too
        d.cuda = d.buf.device.type == "cuda" or os.environ.get("DCPFS_TEST_FAKE_CUDA") == "1"
        d.ptr = d.buf.data_ptr() if nb else 0


def _copy_into(target, tmp):
    def finish():
        target.detach().copy_(tmp)     # (as torch's reader: a Parameter's too, not recorded by autograd)
    return finish


def _direct_pad(direct: bool) -> int:
    """Room a buffer for O_DIRECT reads needs beyond its unit: the unit's first
    byte at its offset in a block, the last block, and aligning the buffer."""
    return 3 * _ALIGN if direct else 0


def _slot_bytes(unit: int, direct: bool) -> int:
    """A unit's room in shared staging: the unit, and for direct reads the
    pad, in whole blocks (every slot starts aligned, the segments being
    mapped at page boundaries)."""
    return unit if not direct else -(-(unit + _direct_pad(direct)) // _ALIGN) * _ALIGN


def _direct_lead(u) -> int:
    """Where unit u's first byte lands in an aligned buffer with room for it
    (dcp_gunit_read_direct's lead, the same whether the unit came through
    the page cache or not): node peers find it in shared staging so."""
    return u.off % _ALIGN


def _shm_unit(shm_bytes: int, nlocal: int, nstaging: int, staging_bytes: int) -> int:
    """The unit size that keeps the shared staging one rank maps (its own and
    its node peers' segments, each double-buffered) within shm_bytes: whole
    MiB, at least 1 MiB, at most staging_bytes."""
    unit = shm_bytes // (nlocal * 2 * nstaging) >> 20 << 20
    return min(staging_bytes, max(1 << 20, unit))


def _run(torch, dist, group, me, world, ck, dests, stored, sizes, gathered, mappings, state_dict,
         staging_bytes, nstaging, shm_bytes, plan_ops, io_threads, direct, node_sharing, stats: LoadStats,
         t0: float, own=None, own_dests=()) -> LoadStats:
    err = ffi.new("dcp_error *")
    # 2. Every rank decodes every rank's requests: the same table everywhere.
    blocks = [g["reqs"] for g in gathered]
    allb = b"".join(blocks)
    counts = ffi.new("size_t[]", [len(b) for b in blocks])
    displs = ffi.new("size_t[]", list(np.cumsum([0] + [len(b) for b in blocks[:-1]]).tolist()))
    reqs = ffi.new("dcp_greqs *")
    node_ids: Dict[str, int] = {}
    node = ffi.new("int[]", world)
    for r, g in enumerate(gathered):
        node[r] = node_ids.setdefault(g["node"], r)
    local_err = None
    shms: Dict[int, _Shm] = {}
    own_values: List[Tuple[str, Any]] = []
    try:
        _prepare_dests(torch, dests, stored, sizes)
        if lib.dcp_greqs_decode(ck._ptr, allb, counts, displs, world, reqs, err) < 0:
            raise _err(err)
        first = reqs.first[me]
        if reqs.first[me + 1] - first != len(dests):
            raise DcpError(71, "dcpfs.torch.load: this rank's requests were decoded as "
                               f"{reqs.first[me + 1] - first}, expected {len(dests)}")
        for i, d in enumerate(dests):
            q = reqs.v[first + i]
            q.dest = ffi.cast("void *", d.ptr)
            q.mem = 1 if d.cuda else 0
        # keys several ranks saved, from this rank's own __R.metadata (failures agreed below)
        if own_dests:
            own_values = _read_own(torch, own, own_dests, stats)
    except DcpError as e:
        local_err = (e.errno or 5, e.strerror or str(e))
    except Exception as e:      # any type: agreed, so that no peer waits for this rank
        local_err = (12 if isinstance(e, MemoryError) else 22, str(e))
    try:
        _agree_error(dist, group, me, world, local_err)
        stats.bytes_loaded = sum(d.nbytes for d in dests)
        # 3. The plan, built and run batch by batch: every rank builds the whole
        # global plan, whose size grows with the ops of every rank (a column
        # shard of a row-major tensor is an op a row), so batches of keys keep
        # it bounded.
        mine = {first + i: d for i, d in enumerate(dests)}
        nlocal = max(Counter(node[r] for r in range(world)).values())
        unit = _shm_unit(shm_bytes, nlocal, nstaging, staging_bytes)
        token = gathered[0]["token"]

        def staging() -> Dict[int, _Shm]:
            # opened by the first plan with shm deliveries (the same on every rank)
            if not shms:
                shms.update(_open_staging(dist, group, me, world, node, token,
                                          2 * nstaging * _slot_bytes(unit, direct)))
            return shms
        units = [staging_bytes]   # the unit to plan with: small once a plan had shm deliveries
        for idx in _batches(reqs, plan_ops):
            _load_batch(torch, dist, group, me, world, ck, reqs, idx, mine, node, units, unit,
                        nstaging, io_threads, direct, node_sharing == "staging" and staging, stats, t0)
    finally:
        for sh in shms.values():
            sh.close()
        lib.dcp_greqs_free(reqs)
    # 4. Temporaries into their tensors, bytes items unpickled, then agreed
    # (as dcp.load agrees on its read_data): a value that does not unpickle on
    # one rank (its class missing there: "Can't get attribute") or a copy that
    # fails must not leave that rank raising alone while its peers go on to
    # their next collective. The state dict takes the values once all agree.
    from torch.distributed.checkpoint._traverse import set_element
    values = list(own_values)
    local_err = None
    for d in dests:
        try:
            if d.kind == "bytes":
                values.append((d.key, torch.load(io.BytesIO(d.buf.tobytes()), weights_only=False)))
            elif d.finish is not None:
                d.finish()
            else:
                _bump_version(torch, d.target)     # written through its data pointer, behind autograd
        except Exception as e:      # (any type: agreed)
            local_err = (12 if isinstance(e, MemoryError) else 22,
                         f"{ck.path}: {_shown(d.key)}: {type(e).__name__}: {e}")
            break
    _agree_error(dist, group, me, world, local_err)
    for key, value in values:
        set_element(state_dict, mappings[key], value)
    stats.seconds_total = time.perf_counter() - t0
    return stats


def _agree_error(dist, group, me: int, world: int, local_err) -> None:
    """Raise on every rank when any rank failed (the lowest failing rank's message)."""
    if world > 1:
        _raise_first(_agree(dist, group, me, world, {"error": local_err}), world)
    elif local_err:
        raise DcpError(*local_err)


def _open_staging(dist, group, me: int, world: int, node, token: str, size: int) -> Dict[int, "_Shm"]:
    """Shared staging for a node's ranks: each rank of a node with several
    creates its segment in /dev/shm and maps every node peer's (the units any
    of them reads for the others go there). Collective; failures agreed."""
    shms: Dict[int, _Shm] = {}
    base = f"/dev/shm/dcpfs-{token}-"
    peers = [r for r in range(world) if node[r] == node[me]]
    local_err = None
    try:
        shms[me] = _Shm(base + str(me), size, create=True)
    except OSError as e:
        local_err = (e.errno or 5, f"/dev/shm: cannot create shared staging of {size} bytes: {e.strerror}")
    dist.barrier(group)
    try:
        for r in peers:
            if r not in shms:
                shms[r] = _Shm(base + str(r), size, create=False)
    except OSError as e:
        local_err = local_err or (e.errno or 5, f"/dev/shm: cannot map a node peer's staging: {e.strerror}")
    verdict = _agree(dist, group, me, world, {"error": local_err})
    if me in shms:
        os.unlink(base + str(me))     # every peer has it mapped now: the name can go
    try:
        _raise_first(verdict, world)
    except DcpError:
        for sh in shms.values():
            sh.close()
        raise
    return shms


def _batches(reqs, plan_ops: int) -> List[List[int]]:
    """Requests (indices into the decoded table, all ranks') grouped by key,
    keys in order of first request, cut into batches whose plans hold about
    plan_ops read operations at most (a key needing more is a batch of its
    own). A box narrower than its tensor's last dimension is an operation a
    row; a box spanning it, about one per chunk (counted as one)."""
    by_key: Dict[int, List[int]] = {}
    ops: Dict[int, int] = {}
    for i in range(reqs.n):
        q = reqs.v[i]
        k = int(ffi.cast("uintptr_t", q.e))       # one entry per key
        n = 1
        if q.ndim and q.len[q.ndim - 1] < q.e.shape[q.ndim - 1]:
            for d in range(q.ndim - 1):
                n *= q.len[d]
        by_key.setdefault(k, []).append(i)
        ops[k] = ops.get(k, 0) + n
    batches: List[List[int]] = []
    cur: List[int] = []
    total = 0
    for k, idx in by_key.items():
        if cur and total + ops[k] > plan_ops:
            batches.append(sorted(cur))
            cur, total = [], 0
        cur += idx
        total += ops[k]
    if cur or not batches:
        batches.append(sorted(cur))
    return batches


def _subset(reqs, idx: List[int], world: int):
    """A request table of the requests idx (in rank order, as decoded): its
    arrays are kept alive by the returned tuple; never dcp_greqs_free it."""
    sub = ffi.new("dcp_greqs *")
    v = ffi.new("dcp_greq[]", max(1, len(idx)))
    firsts = ffi.new("size_t[]", world + 1)
    for j, i in enumerate(idx):
        v[j] = reqs.v[i]
    r = 0
    for j, i in enumerate(idx):
        while r <= v[j].rank:
            firsts[r] = j
            r += 1
    while r <= world:
        firsts[r] = len(idx)
        r += 1
    sub.v, sub.n, sub.dims, sub.first = v, len(idx), reqs.dims, firsts
    return sub, (v, firsts)


def _load_batch(torch, dist, group, me, world, ck, reqs, idx, mine, node, units, unit,
                nstaging, io_threads, direct, staging, stats: LoadStats, t0: float) -> None:
    """Build the global plan of the requests idx and run it. units[0] is the
    unit size to plan with; with staging (a callable opening it; False when
    the node shares the page cache) set to the small shm unit once a plan
    turns out to have shm deliveries (later batches likely do too: one
    build, not two)."""
    staging_bytes = units[0]
    err = ffi.new("dcp_error *")
    sub, keep = _subset(reqs, idx, world)
    dest_of = {j: mine[i] for j, i in enumerate(idx) if i in mine}
    gp = ffi.new("dcp_gplan *")
    opts = ffi.new("dcp_gplan_opts *")
    opts.size = ffi.sizeof("dcp_gplan_opts")   # DCP_GPLAN_OPTS_INIT
    opts.unit_max = staging_bytes
    opts.no_bcast = 1
    opts.node = node
    opts.shm = 1
    opts.bcast_local = 0
    built = False
    local_err = None
    try:
        if lib.dcp_gplan_build(ck._ptr, sub, world, me, opts, gp, err) < 0:
            raise _err(err)
        built = True
        # Shared staging is mapped by every rank of a node, so its pages count in
        # every rank's RSS: keep what one rank maps within shm_bytes by cutting the
        # plan into smaller units (every rank computes the same, from the same data).
        if staging and gp.has_shm and unit < staging_bytes:
            lib.dcp_gplan_free(gp)
            built = False
            opts.unit_max = staging_bytes = units[0] = unit
            if lib.dcp_gplan_build(ck._ptr, sub, world, me, opts, gp, err) < 0:
                raise _err(err)
            built = True
        for j, d in dest_of.items():     # parts no chunk covers read as zeros, as the planner says
            if d.nbytes and gp.zero[j]:
                d.buf.fill(0) if isinstance(d.buf, np.ndarray) else d.buf.zero_()
    except DcpError as e:
        local_err = (e.errno or 5, e.strerror or str(e))
    except MemoryError as e:
        local_err = (12, f"dcpfs.torch.load: out of memory for the plan ({e})")
    try:
        _agree_error(dist, group, me, world, local_err)
        stats.units += gp.nunits
        stats.bytes_unique += gp.unique_bytes
        stats.seconds_plan = time.perf_counter() - t0 - stats.seconds_transfer   # all but transfers
        t1 = time.perf_counter()
        shms = staging() if staging and gp.has_shm else {}
        _execute(torch, dist, group, me, world, ck, sub, gp, dest_of, shms, not staging, staging_bytes,
                 nstaging, io_threads, direct, stats)
        stats.seconds_transfer += time.perf_counter() - t1
    finally:
        if built:
            lib.dcp_gplan_free(gp)
        del keep


def _is_direct(gp, reqs, u, me, page_cache: bool = False) -> Optional[int]:
    """exec.c's direct target: this rank's fragments fill the unit in order
    and land contiguously, untransformed, in one host destination, and no
    delivery needs the unit's buffer (with page_cache, node peers take it
    from the page cache): the address the unit's first byte goes to, else
    None."""
    for j in range(u.ndlv):
        if not page_cache or gp.dlvs[u.dlv0 + j].kind != lib.DCP_GDLV_SHM:
            return None
    n = ffi.new("size_t *")
    f = lib.dcp_gunit_frags(gp, ffi.addressof(u), me, n)
    if n[0] == 0 or (n[0] != u.nfrag and not page_cache):
        return None     # (fragments of others: theirs; covering the unit is checked below)
    req = gp.gops[f[0].gop].req
    q = reqs.v[req]
    if q.mem != 0 or f[0].img != 0 or q.dest == ffi.NULL:
        return None
    img = 0
    start = pos = lib.dcp_gfrag_dest(gp, f)
    transform = lib.DCP_OP_BSWAP | lib.DCP_OP_CONJ | lib.DCP_OP_NEG
    for i in range(n[0]):
        gop = gp.gops[f[i].gop]
        op = gop.op
        if gop.req != req or op.flags & transform or \
                (op.dest_stride != op.elem_size and f[i].len != op.elem_size) or f[i].img != img or \
                lib.dcp_gfrag_dest(gp, f + i) != pos:
            return None
        img += f[i].len
        pos += f[i].len
    if img != u.len:
        return None
    return int(ffi.cast("uintptr_t", q.dest)) + start


class _Placer:
    """Places fragments from a host buffer into this rank's destinations:
    host ones in C (dcp_gfrag_place), CUDA ones with torch copies."""

    def __init__(self, torch, gp, reqs, dest_of: Dict[int, "_Dest"]):
        self.torch = torch
        self.gp = gp
        self.reqs = reqs
        self.dest_of = dest_of
        self.any_cuda = any(d.cuda for d in dest_of.values())
        self.devices: set = set()     # the CUDA devices copied to since the caller last looked

    def place(self, f, n: int, buf_addr: int, pinned=None) -> None:
        """Place n fragments from the host buffer at buf_addr. pinned: that
        buffer as a pinned uint8 tensor, whose plain copies to CUDA
        destinations are then only queued (the caller waits for them before
        the buffer is used again: _PinnedRing)."""
        if n == 0:
            return
        if not self.any_cuda:
            lib.dcp_gfrag_place(self.gp, self.reqs, f, n, ffi.cast("void *", buf_addr))
            return
        for i in range(n):
            q = self.reqs.v[self.gp.gops[f[i].gop].req]
            if q.mem == 0:
                lib.dcp_gfrag_place(self.gp, self.reqs, f + i, 1, ffi.cast("void *", buf_addr))
            else:
                self._place_cuda(f + i, buf_addr, pinned)

    def place_device(self, f, n: int, image) -> None:
        """Place fragments from a received image (a tensor: in GPU memory for
        an NCCL message): into CUDA destinations with torch copies (device to
        device for an NCCL message); anything else through the image on the
        host (one copy of it when it is on the GPU)."""
        host = None
        for i in range(n):
            d = self.dest_of[self.gp.gops[f[i].gop].req]
            if d.cuda and self._simple(f + i):
                at = lib.dcp_gfrag_dest(self.gp, f + i)
                d.buf.view(-1).view(self.torch.uint8)[at:at + f[i].len].copy_(image[f[i].img:f[i].img + f[i].len])
                continue
            if host is None:
                host = image.cpu()
            self.place(f + i, 1, host.data_ptr())

    def _simple(self, f) -> bool:
        """A plain copy: contiguous in the destination, no byte swap, conj or neg."""
        op = self.gp.gops[f.gop].op
        return op.dest_stride == op.elem_size and not (
            op.flags & (lib.DCP_OP_BSWAP | lib.DCP_OP_CONJ | lib.DCP_OP_NEG))

    def _place_cuda(self, f, buf_addr: int, pinned=None) -> None:
        torch = self.torch
        gop = self.gp.gops[f.gop]
        op = gop.op
        d = self.dest_of[gop.req]
        dst = d.buf.view(-1).view(torch.uint8)
        at = lib.dcp_gfrag_dest(self.gp, f)
        simple = self._simple(f)
        if simple and pinned is not None:
            dst[at:at + f.len].copy_(pinned[f.img:f.img + f.len], non_blocking=True)
            if dst.device.type == "cuda":    # (DCPFS_TEST_FAKE_CUDA's are host tensors)
                self.devices.add(dst.device)
            return
        src = np.frombuffer(ffi.buffer(ffi.cast("unsigned char *", buf_addr) + f.img, f.len), dtype=np.uint8)
        if simple:
            dst[at:at + f.len].copy_(torch.from_numpy(src))
            return
        # a strided or transformed op: place on the host, then copy the span up
        span = (f.len // op.elem_size - 1) * op.dest_stride + op.elem_size
        tmp = torch.empty(span, dtype=torch.uint8)
        tmp.copy_(dst[at:at + span])
        sub = lib.dcp_gfrag_op(self.gp, f)
        sub.dest_offset = 0
        lib.dcp_op_place(ffi.addressof(sub), ffi.cast("void *", buf_addr + f.img),
                         ffi.cast("void *", tmp.data_ptr()), gop.dtype)
        dst[at:at + span].copy_(tmp)


class _PinnedRing:
    """A few pinned host buffers for the units this rank reads for CUDA
    destinations: a unit is read into one, its fragments are copied up
    without waiting (so the next reads overlap the copies), and the buffer is
    taken again only once events recorded behind those copies have passed.
    Without CUDA (DCPFS_TEST_FAKE_CUDA), or unpinned (pin=False: host
    destinations of direct reads, placed at once), the buffers are plain host
    memory and copies complete at once, so the tests run the same
    bookkeeping."""

    def __init__(self, torch, count: int, nbytes: int, pin: bool = True):
        self.torch, self.count, self.nbytes = torch, count, nbytes
        self.cuda = pin and torch.cuda.is_available()
        self.free: List[Any] = []
        self.busy: deque = deque()    # (buffer, [events]) in the order given back
        self.made = 0

    def take(self):
        """A buffer no copy reads any more (callers hold at most count at once)."""
        if self.free:
            return self.free.pop()
        if self.made < self.count:
            self.made += 1
            return self.torch.empty(self.nbytes, dtype=self.torch.uint8, pin_memory=self.cuda)
        buf, events = self.busy.popleft()
        for ev in events:
            ev.synchronize()
        return buf

    def give(self, buf, devices) -> None:
        """buf is free once the copies queued from it on these devices are done."""
        events = []
        if self.cuda:
            for dev in devices:
                ev = self.torch.cuda.Event()
                ev.record(self.torch.cuda.current_stream(dev))
                events.append(ev)
        self.busy.append((buf, events))


class _NotStarted(Exception):
    """A read job that was never started (its failure is already noted)."""


class _Reads:
    """One round's reads on the I/O threads, taken in order. Jobs that read
    into a pinned buffer ("pinned") are started only while the ring has a
    buffer for them, so at most ring.count of them are in flight; the rest
    start as the earlier ones are placed (next()). A job that cannot start
    (no thread, no pinned buffer: "failed" jobs have no buffer at all) is
    handed to note(unit, exception) and yields not ok, as a failed read does:
    the rank keeps to the round's protocol, and the failure is agreed at its
    end."""

    def __init__(self, pool, read, jobs: list, ring: Optional[_PinnedRing], placer: "_Placer",
                 note: Callable[[int, BaseException], None]):
        self.pool, self.read, self.jobs, self.ring, self.placer = pool, read, jobs, ring, placer
        self.note = note
        self.futures: List[Any] = []
        self.out = 0
        self._submit()

    def _submit(self) -> None:
        while len(self.futures) < len(self.jobs):
            i = len(self.futures)
            k, addr, holder, how, nxt = self.jobs[i]
            fut: Future = Future()
            try:
                if how == "failed":
                    raise _NotStarted()
                if how == "pinned":
                    assert self.ring is not None     # "pinned" jobs exist only with a ring
                    if self.out >= self.ring.count:
                        return
                    holder = self.ring.take()
                    self.out += 1
                    self.jobs[i] = (k, holder.data_ptr(), holder, how, nxt)
                fut = self.pool.submit(self.read, self.jobs[i])
            except _NotStarted:
                fut.set_result(False)
            except Exception as e:      # (a thread that cannot start: RuntimeError; pinned memory)
                self.note(k, e)
                fut.set_result(False)
            self.futures.append(fut)

    def __iter__(self):
        """(job, ok) in order; a pinned job's buffer goes back to the ring when
        the caller asks for the next job (its copies queued by then)."""
        for i in range(len(self.jobs)):
            if i >= len(self.futures):
                self._submit()
            ok = self.futures[i].result()
            yield self.jobs[i], ok
            if self.jobs[i][3] == "pinned" and self.jobs[i][2] is not None:     # (it got a buffer)
                self.ring.give(self.jobs[i][2], self.placer.devices)
                self.placer.devices = set()
                self.jobs[i] = self.jobs[i][:2] + (None,) + self.jobs[i][3:]
                self.out -= 1
                self._submit()


def _execute(torch, dist, group, me, world, ck, reqs, gp, dest_of, shms, page_cache, staging_bytes,
             nstaging, io_threads, direct, stats: LoadStats) -> None:
    """Run the global plan: rounds of units in global order. Node peers take
    shm deliveries from the page cache (page_cache) or from shms, the
    readers' shared staging. direct: units read into this rank's own buffers
    bypass the page cache when they are not in it (dcp_gunit_read_direct)."""
    placer = _Placer(torch, gp, reqs, dest_of)
    units = gp.units
    nunits = gp.nunits
    SHM, P2P = lib.DCP_GDLV_SHM, lib.DCP_GDLV_P2P
    if any(gp.dlvs[i].kind not in (SHM, P2P) for i in range(gp.ndlvs)):
        raise DcpError(71, "dcpfs.torch.load: the plan has broadcast deliveries, which this transport does not run")
    backend = dist.get_backend(group) if world > 1 else "gloo"
    comm_device = torch.device("cuda", torch.cuda.current_device()) if str(backend) == "nccl" else torch.device("cpu")

    # Units read "along": no other node needs them, and this rank (reader or
    # node peer) takes them whole, contiguous in one host destination. Every
    # such rank reads them straight into its destination in the unit's round,
    # not the peers a round behind the reader: the reads of one unit wait on
    # the same pages, so storage is still read once (2 GiB replicated on 4
    # ranks, evicted, best of 5: 1.44-1.61 s against 1.78-1.84, a fifth less
    # CPU). No next-unit advice for them: with every rank of a node advising
    # the same units, those loads were slower.
    along: Dict[int, int] = {}
    shared = [False] * nunits   # units for this node's ranks alone (SHM, no P2P)
    short = [0] * nunits        # those this rank needs but does not read along
    if page_cache:
        for k in range(nunits):
            u = units[k]
            shared[k] = _has_kind(gp, u, SHM) and not _has_kind(gp, u, P2P)
            if shared[k] and (u.reader == me or _delivery(gp, u, SHM, me) is not None):
                addr = _is_direct(gp, reqs, u, me, page_cache)
                if addr is None:
                    short[k] = 1
                else:
                    along[k] = addr
    # A unit every rank that needs it reads along needs no place in a round
    # (rounds keep node peers behind readers and bound shared staging): a
    # replicated load is then one round, one barrier, not one per 2 units.
    # has_shm is the same on every rank, so all or none take part.
    free = [False] * nunits
    if page_cache and world > 1 and gp.has_shm:
        summed = torch.tensor(short, dtype=torch.int32, device=comm_device)
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group)    # ranks needing k, not reading it along
        free = [shared[k] and v == 0 for k, v in enumerate(summed.tolist())]

    # rounds: at most nstaging shared-staging units per reader
    rounds: List[Tuple[int, int]] = []
    used: Dict[int, int] = {}
    start = 0
    slot_of = [0] * nunits
    for k in range(nunits):
        u = units[k]
        if _has_kind(gp, u, SHM) and not free[k]:
            if used.get(u.reader, 0) == nstaging:
                rounds.append((start, k))
                start = k
                used = {}
            slot_of[k] = used.get(u.reader, 0)
            used[u.reader] = slot_of[k] + 1
    rounds.append((start, nunits))
    stats.rounds += len(rounds)

    n = ffi.new("size_t *")
    pool = ThreadPoolExecutor(max(1, io_threads))
    # CUDA destinations: the units this rank reads into a private buffer go
    # through a few pinned ones instead, copied up while the next ones are
    # read; direct reads go through a few reused ones too (host destinations)
    mine = [units[k].len for k in range(nunits) if units[k].reader == me]
    pad = _direct_pad(direct)
    slot = _slot_bytes(staging_bytes, direct)
    ring = _PinnedRing(torch, max(4, 2 * io_threads), max(mine) + pad, pin=placer.any_cuda) \
        if (placer.any_cuda or direct) and mine else None
    at: Dict[int, int] = {}    # unit -> where its first byte is in its buffer (direct reads)
    # node peers' units taken from the page cache: nothing is reused after
    # them, so they run on their own threads behind the rounds, joined at the end
    takes = ThreadPoolExecutor(max(1, io_threads // 2)) if page_cache else None
    taking: List[Any] = []
    failure: List[Any] = []     # this rank's first error; it keeps to the protocol until the round ends

    def note(k: int, exc: BaseException) -> None:
        """An exception on this rank while it handles unit k (out of memory, a
        thread that cannot start, a failed copy): recorded as a failed read is,
        named as libdcp names one (shard file, a key reading it), so that the
        rank keeps posting its sends and receives and every rank raises it at
        the round's end; raised at once, peers would wait for this rank's
        messages until the process group's timeout (30 minutes by default)."""
        if not failure:
            code = 12 if isinstance(exc, MemoryError) else getattr(exc, "errno", None) or 5
            failure.append((code, f"{_unit_name(ck, gp, reqs, units[k])}: {type(exc).__name__}: {exc}"))

    scratch = threading.local()

    def read(job) -> bool:
        try:
            return read_unit(job)
        except Exception as e:      # (MemoryError for its scratch, a torch or numpy error)
            note(job[0], e)
            return False

    def read_unit(job) -> bool:
        k, addr, holder, how, nxt = job
        e = ffi.new("dcp_error *")
        nx = ffi.addressof(nxt) if nxt is not None else ffi.NULL
        u = ffi.addressof(units[k])
        if how == "cache":
            # through a small scratch into the page cache (where the node's
            # peers take it), then this rank's own fragments from there
            if getattr(scratch, "buf", None) is None:
                scratch.buf = ffi.new("unsigned char[]", _SCRATCH)
            nf = ffi.new("size_t *")
            f = lib.dcp_gunit_frags(gp, u, me, nf)
            ok = lib.dcp_gunit_cache(ck._ptr, gp, u, nx, scratch.buf, _SCRATCH, e) == 0 and \
                (nf[0] == 0 or lib.dcp_gfrag_read(ck._ptr, gp, reqs, f, nf[0], e) == 0)
        elif direct and how in ("buffer", "pinned"):
            # a private buffer, a buffer of the ring, or a slot of shared staging
            size = slot if holder is None else holder.nbytes if how == "buffer" else holder.numel()
            start = -addr % _ALIGN
            lead = ffi.new("size_t *")
            ok = lib.dcp_gunit_read_direct(ck._ptr, gp, u, ffi.cast("void *", addr + start), size - start,
                                           lead, e) == 0
            at[k] = start + lead[0]
        else:
            ok = lib.dcp_gunit_read(ck._ptr, gp, u, nx, ffi.cast("void *", addr), e) == 0
        if not ok and not failure:
            failure.append((e.code or 5, _message(e)))
        return ok

    def host_only(u, rank: int) -> bool:
        """rank's fragments of unit u all land in host memory (dcp_gfrag_read can place them)."""
        f = lib.dcp_gunit_frags(gp, ffi.addressof(u), rank, n)
        return all(reqs.v[gp.gops[f[i].gop].req].mem == 0 for i in range(n[0]))

    # each unit's successor among this rank's reads (advised to the kernel when a read waits)
    next_mine = [-1] * nunits
    last = -1
    for k in range(nunits - 1, -1, -1):
        if units[k].reader == me:
            next_mine[k] = last
            last = k

    def start_reads(ri: int):
        """This rank's reads of round ri, started on the I/O threads: straight
        into the destination, into its shared staging slot, or into a private
        buffer."""
        a, b = rounds[ri]
        half = (ri % 2) * nstaging * slot
        jobs: List[Tuple[int, int, Any, str, Any]] = []    # (unit, address, buffer, how, next unit)
        for k in range(a, b):
            u = units[k]
            if k in along:
                jobs.append((k, along[k], None, "direct", None))
                continue
            if u.reader != me:
                continue
            nxt = units[next_mine[k]] if next_mine[k] >= 0 else None
            # (direct: O_DIRECT reads whole blocks, so into a buffer, never past a destination's edges)
            target = None if direct else _is_direct(gp, reqs, u, me, page_cache)
            holder = None
            how = "buffer"
            if target is not None:
                addr, how = target, "direct"
            elif me in shms and _has_kind(gp, u, SHM):
                addr = shms[me].addr + half + slot_of[k] * slot
            elif page_cache and _has_kind(gp, u, SHM) and not _has_kind(gp, u, P2P) and host_only(u, me):
                addr, how = 0, "cache"
            elif ring is not None:
                addr, how = 0, "pinned"      # a buffer of the ring, when _Reads starts it
            else:
                try:
                    holder = np.empty(u.len + pad, dtype=np.uint8)
                    addr = holder.ctypes.data
                except MemoryError as e:
                    note(k, e)
                    addr, how = 0, "failed"
            jobs.append((k, addr, holder, how, nxt))
        return _Reads(pool, read, jobs, ring, placer, note)

    def any_failed() -> bool:
        """The round's end: every rank's reads of it are done (shared staging
        is ready), and whether any failed."""
        if world == 1:
            return bool(failure)
        flag = torch.tensor([1 if failure else 0], dtype=torch.int32, device=comm_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item())

    # rounds with messages between nodes (the plan is every rank's: all agree)
    p2p_round = [any(_has_kind(gp, units[k], P2P) for k in range(a, b)) for a, b in rounds]

    def p2p_buffers(a: int, b: int) -> Tuple[Dict[int, Any], Dict[Tuple[int, int], Tuple[Any, Any]]]:
        """The round's message buffers, allocated before any is posted: a rank
        that cannot allocate one must not leave a peer's send or receive
        waiting (the process group's timeout, 30 minutes by default)."""
        recv_bufs: Dict[int, Any] = {}
        send_bufs: Dict[Tuple[int, int], Tuple[Any, Any]] = {}
        for k in range(a, b):
            u = units[k]
            try:
                dl = _delivery(gp, u, P2P, me)
                if dl is not None:
                    recv_bufs[k] = _p2p_buffer(torch, dl.bytes, comm_device)
                for j in range(u.ndlv if u.reader == me else 0):
                    dl = gp.dlvs[u.dlv0 + j]
                    if dl.kind == P2P:      # packed on the host; sent from comm_device (NCCL: the GPU)
                        packed = _p2p_buffer(torch, dl.bytes, torch.device("cpu"))
                        send_bufs[(k, j)] = (packed, packed if comm_device.type == "cpu"
                                             else _p2p_buffer(torch, dl.bytes, comm_device))
            except Exception as e:      # (MemoryError, torch's out of memory)
                note(k, e)
                break
        return recv_bufs, send_bufs

    try:
        pending = start_reads(0)
        for ri, (a, b) in enumerate(rounds):
            half = (ri % 2) * nstaging * slot
            recv_bufs, send_bufs = p2p_buffers(a, b) if p2p_round[ri] else ({}, {})
            if p2p_round[ri] and any_failed():
                break
            recvs = []          # from other nodes
            for k, t in recv_bufs.items():
                recvs.append((k, t, dist.irecv(t, group_peer_to_global(dist, group, units[k].reader))))
            sends = []
            for (k, addr, holder, how, _), ok in pending:
                u = units[k]
                if u.reader != me:          # a node peer's unit read along: in place, nothing to send
                    continue
                stats.bytes_read += u.len if ok else 0
                if k in at:                 # a direct read: the unit starts inside its buffer
                    off = at.pop(k)
                    addr += off
                    holder = holder[off:] if how == "pinned" else holder
                if ok and how not in ("direct", "cache"):
                    f = lib.dcp_gunit_frags(gp, ffi.addressof(u), me, n)
                    try:
                        placer.place(f, n[0], addr, holder if how == "pinned" else None)
                    except Exception as e:      # (a failed CUDA copy): agreed, the sends still go
                        note(k, e)
                for j in range(u.ndlv):     # sent even after a failed read: the peer must not hang
                    dl = gp.dlvs[u.dlv0 + j]
                    if dl.kind != P2P:
                        continue
                    packed, out = send_bufs.pop((k, j))
                    if ok:
                        lib.dcp_gdlv_pack(gp, ffi.addressof(dl), ffi.cast("void *", addr),
                                          ffi.cast("void *", packed.data_ptr()))
                    if out is not packed:
                        out.copy_(packed)
                    sends.append((out, dist.isend(out, group_peer_to_global(dist, group, dl.peer))))
                    stats.bytes_sent += dl.bytes
            for k, t, w in recvs:
                w.wait()
                stats.bytes_received += t.numel()
                if failure:
                    continue
                f = lib.dcp_gunit_frags(gp, ffi.addressof(units[k]), me, n)
                try:
                    if placer.any_cuda:           # CUDA destinations: from the image where it is
                        placer.place_device(f, n[0], t)
                    else:
                        placer.place(f, n[0], t.data_ptr())
                except Exception as e:
                    note(k, e)
            for _, w in sends:
                w.wait()
            if any_failed():
                break
            # The next round's reads overlap this round's copies: they fill the
            # other half of the shared staging, which every peer finished copying
            # from before it reached this round's end.
            if ri + 1 < len(rounds):
                pending = start_reads(ri + 1)
            for k in range(a, b):      # node peers' units: from the page cache or shared staging
                u = units[k]
                dl = _delivery(gp, u, SHM, me) if u.reader != me else None
                if dl is None or failure:
                    continue
                stats.bytes_shared += dl.bytes
                if k in along:              # read in its round already
                    continue
                f = lib.dcp_gunit_frags(gp, ffi.addressof(u), me, n)
                try:
                    if not page_cache:
                        at_unit = shms[u.reader].addr + half + slot_of[k] * slot
                        placer.place(f, n[0], at_unit + (_direct_lead(u) if direct else 0))
                    else:
                        assert takes is not None
                        taking.append(takes.submit(_page_cache_take, ck, gp, reqs, units, k, f, n[0], me, placer,
                                                   failure, note))
                except Exception as e:      # (no thread to take it on, a failed copy)
                    note(k, e)
        for t in taking:
            t.result()
    finally:
        pool.shutdown()
        if takes is not None:
            takes.shutdown()
    if world > 1:
        verdict = _agree(dist, group, me, world, {"error": failure[0] if failure else None})
        _raise_first(verdict, world)
    elif failure:
        raise DcpError(*failure[0])
    if placer.any_cuda and torch.cuda.is_available():
        # every device a destination is on (the copies were queued on each one's stream)
        for dev in {d.buf.device for d in dest_of.values() if d.cuda and d.buf.device.type == "cuda"}:
            torch.cuda.synchronize(dev)


def _p2p_buffer(torch, nbytes: int, device) -> Any:
    """A message buffer between nodes (its own function: tests make it fail)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _page_cache_take(ck, gp, reqs, units, k, f, nf, me, placer, failure, note) -> bool:
    """Take this rank's fragments of a node peer's unit k from the page cache
    (the reader read it in an earlier round's end): straight into host
    destinations, else (CUDA) the unit read into a host buffer and placed.
    A failure is recorded for the next agreement (an exception by note); False then."""
    e = ffi.new("dcp_error *")
    try:
        if all(reqs.v[gp.gops[f[i].gop].req].mem == 0 for i in range(nf)):
            ok = lib.dcp_gfrag_read(ck._ptr, gp, reqs, f, nf, e) == 0
        else:
            buf = np.empty(units[k].len, dtype=np.uint8)
            ok = lib.dcp_gunit_read(ck._ptr, gp, ffi.addressof(units[k]), ffi.NULL,
                                    ffi.cast("void *", buf.ctypes.data), e) == 0
            if ok:
                placer.place(f, nf, buf.ctypes.data)
    except Exception as exc:
        note(k, exc)
        return False
    if not ok and not failure:
        failure.append((e.code or 5, _message(e)))
    return ok


def _unit_name(ck, gp, reqs, u) -> str:
    """Unit u in messages, as libdcp names a failed read: its shard file and
    the key of its first fragment."""
    if not u.nfrag:
        return ck.path
    gop = gp.gops[gp.frags[u.frag0].gop]
    name = lib.dcp_file_name(ck._ptr, gop.op.file)
    where = ck.path
    if name != ffi.NULL and os.path.isdir(ck.path):
        where = os.path.join(ck.path, ffi.string(name).decode("utf-8", "surrogateescape"))
    return f"{where}: {_shown(ffi.string(reqs.v[gop.req].e.key).decode('utf-8', 'replace'))}"


def _delivery(gp, u, kind: int, peer: Optional[int] = None):
    """Unit u's first delivery of this kind (to peer, when given), or None."""
    for j in range(u.ndlv):
        dl = gp.dlvs[u.dlv0 + j]
        if dl.kind == kind and (peer is None or dl.peer == peer):
            return dl
    return None


def _has_kind(gp, u, kind: int, peer: Optional[int] = None) -> bool:
    return _delivery(gp, u, kind, peer) is not None


def group_peer_to_global(dist, group, r: int) -> int:
    """torch.distributed's send/recv take global ranks."""
    if group is None:
        return r
    return dist.get_global_rank(group, r)
