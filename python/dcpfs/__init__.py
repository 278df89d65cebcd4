"""dcpfs: read PyTorch Distributed Checkpoints with libdcp, without torch.load.

A checkpoint (a DCP folder with ``.metadata``, rank-local ``__R.metadata``
files, a Hugging Face safetensors layout, a Megatron-Core ``torch_dist``
folder, or a single torch.save / safetensors file) opens as a read-only
mapping from state-dict keys to tensors. Any box of any tensor is read
straight from the shard files into the destination -- a new numpy array, or
a numpy array or torch tensor you pass as ``out`` -- whatever the sharding it
was saved with: only the bytes of the box are read, never whole records.

    import io, dcpfs, torch

    with dcpfs.open("step_1000") as ck:           # a folder, or a .pt / .safetensors file
        ck.keys()[:2]          # ['model.embed.weight', 'model.layers.0.attn.qkv.weight']
        ck.info("model.embed.weight")
        # EntryInfo(key='model.embed.weight', kind='tensor', dtype='float32',
        #           shape=(37, 16), chunks=(Chunk(offsets=(0, 0), sizes=(10, 16)), ...),
        #           nbytes=2368)
        w = ck.read("model.embed.weight")                           # numpy (37, 16)
        rows = ck.read("model.embed.weight", [(8, 4), (0, 16)])     # (start, length) pairs
        rows = ck.read("model.embed.weight", [slice(8, 12), slice(None)])   # or slices
        t = torch.empty(37, 16, device="cuda")
        ck.read("model.embed.weight", out=t)            # straight into a tensor
        blob = ck.read_bytes("extra.epoch")             # a non-tensor value: torch.save bytes
        epoch = torch.load(io.BytesIO(blob), weights_only=False)

Reading into torch: ``out`` may be a contiguous CPU tensor (filled in
place through its data pointer) or a CUDA tensor (read through pinned host
memory in pieces of at most 64 MiB and copied up). ``out``'s dtype must be
the stored one and its number of elements the box's. A DTensor (an FSDP2
parameter) holds no elements itself: read its local shard's box into
``out.to_local()``. The write counts as an in-place op for autograd.

dtypes numpy lacks (bfloat16, the float8 types, complex32, quantized and bit
types) come back from ``read()`` as their raw bits in unsigned integers of
the same size: ``uint16`` for bfloat16, ``uint8`` for float8, ``uint32`` for
complex32 -- as dcpfs's ``-o view=npy`` presents them. Reinterpret them with
``torch.from_numpy(a).view(torch.bfloat16)``, or pass ``out=`` a torch tensor
of the real dtype, which receives them natively.

Errors are :class:`DcpError` (an OSError carrying libdcp's errno and its
message, which names the file, the key and the reason); an unknown key is
:class:`DcpKeyError`, also a KeyError. A Checkpoint may be read from many
threads at once (the GIL is released while libdcp reads).

The first open of a checkpoint folder stores its parsed metadata in the
catalog ($XDG_CACHE_HOME/dcpfs/catalog.sqlite, or ``catalog_path``), so later
opens read one small record instead of parsing ``.metadata`` again;
``catalog=False`` parses every time and writes nothing.
"""
from __future__ import annotations

import codecs
import dataclasses
import errno as _errno
import math
import operator
import os
import sys
import threading
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any, Iterator, Literal, Optional, Sequence, Tuple, Union

import numpy as np

from ._native import ffi as _ffi, lib as _lib

__version__ = "0.2.0"

__all__ = ["open", "Checkpoint", "EntryInfo", "Chunk", "DcpError", "DcpKeyError", "__version__"]

# CUDA destinations are filled through pinned host buffers of at most this many bytes.
_CUDA_PIECE_BYTES = 64 << 20


# ---------------------------------------------------------------- errors

class DcpError(OSError):
    """An error from libdcp (or found before calling it): ``errno`` is an errno
    value (ENOENT, EIO, EINVAL, ...) and ``strerror`` the message, which names
    the file, the key and the reason."""


class DcpKeyError(DcpError, KeyError):
    """No such key in the checkpoint (``errno`` is ENOENT; ``key`` the key)."""

    def __init__(self, code: int, message: str, key: Any = None) -> None:
        super().__init__(code, message)
        self.key = key

    def __str__(self) -> str:  # OSError's form, not KeyError's repr
        return OSError.__str__(self)


def _text(p: Any) -> Optional[str]:
    return None if p == _ffi.NULL else _ffi.string(p).decode("utf-8", "surrogateescape")


# Keys are the bytes of the checkpoint's pickle. Python pickles a str's lone
# surrogates as their three-byte forms and loads them back so ("surrogatepass"):
# keys decode the same way, to the str torch's state dict holds. A byte that is
# no UTF-8 at all (a hostile or damaged checkpoint, which torch cannot load)
# decodes as "surrogateescape" does, U+DC80..DCFF -- as `dcp ls --json` shows it.
def _key_errors(e: UnicodeError) -> Tuple[Union[str, bytes], int]:
    if not isinstance(e, UnicodeDecodeError):
        raise e
    try:
        return codecs.lookup_error("surrogatepass")(e)
    except UnicodeDecodeError:
        return codecs.lookup_error("surrogateescape")(e)


codecs.register_error("dcpfs.key", _key_errors)


def _key_text(p: Any) -> str:
    """A key from libdcp as the str torch would load it (see _key_errors)."""
    return _ffi.string(p).decode("utf-8", "dcpfs.key")


def _key_bytes(key: str) -> bytes:
    """A key as libdcp takes it: the bytes Python's pickle writes for it."""
    return key.encode("utf-8", "surrogatepass")


def _key_forms(key: str) -> Iterator[bytes]:
    """The stored bytes key may stand for: pickle's form, then, for a key
    with U+DC80..DCFF in it, the bytes those escape (a key that is not UTF-8)."""
    b = _key_bytes(key)
    yield b
    try:
        e = key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return
    if e != b:
        yield e


# libdcp's names of its options that its messages give, as a Python user
# knows them (dcp says --rank; a C caller keeps libdcp's name).
def _message(err: Any) -> str:
    """A dcp_error's message (libdcp's messages name no C flag: shown as they are)."""
    return str(_ffi.string(err.msg).decode("utf-8", "replace"))


def _raise(err: Any, cls: type = DcpError) -> None:
    raise cls(err.code or _errno.EIO, _message(err) or "libdcp failed without a message")


# ---------------------------------------------------------------- results

@dataclasses.dataclass(frozen=True)
class Chunk:
    """One stored box of a tensor: where it starts and how large it is, per dimension."""
    offsets: Tuple[int, ...]
    sizes: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """A key's header.

    kind: "tensor" or "bytes" (a non-tensor value, stored as torch.save bytes).
    dtype: the torch dtype name ("float32", "bfloat16"); None for bytes items.
    shape: the global shape (() for 0-d tensors and bytes items).
    chunks: the stored boxes, in metadata order (() for bytes items).
    nbytes: bytes read() gives for the whole tensor (numel x element size), or
        read_bytes() gives for a bytes item.
    """
    key: str
    kind: Literal["tensor", "bytes"]
    dtype: Optional[str]
    shape: Tuple[int, ...]
    chunks: Tuple[Chunk, ...]
    nbytes: int

    @property
    def ndim(self) -> int:
        """Number of dimensions (0 for 0-d tensors and bytes items)."""
        return len(self.shape)

    @property
    def numel(self) -> int:
        """Number of elements (1 for a 0-d tensor; 0 for bytes items)."""
        return math.prod(self.shape) if self.kind == "tensor" else 0


# ---------------------------------------------------------------- dtypes

def _numpy_dtype(dt: int) -> np.dtype:
    """read()'s numpy dtype for a libdcp dtype: numpy's own, else unsigned ints of
    the same size holding the raw bits (as dcpfs's npy view)."""
    d = _lib.dcp_dtype_numpy(dt)
    if d != _ffi.NULL:
        return np.dtype(_ffi.string(d).decode())
    size = _lib.dcp_dtype_size(dt)
    return np.dtype({1: "|u1", 2: "<u2", 4: "<u4", 8: "<u8"}.get(size, f"|V{size}"))


def _dtype_name(dt: int) -> str:
    return _text(_lib.dcp_dtype_name(dt)) or f"dtype#{dt}"


Box = Optional[Sequence[Union[Tuple[int, int], slice]]]


def _resolve_box(where: str, shape: Tuple[int, ...], box: Box) -> Tuple[list, list]:
    """(offsets, lengths) of box over shape, checked: every value is an int in range."""
    n = len(shape)
    if box is None:
        return [0] * n, list(shape)
    if isinstance(box, (str, bytes, slice)) or not hasattr(box, "__len__"):
        raise TypeError(f"{where}: box must be a sequence with one (start, length) pair or "
                        f"slice per dimension, not {type(box).__name__}")
    items = list(box)
    if len(items) != n:
        raise ValueError(f"{where}: the box has {len(items)} dimension(s), the tensor {n} "
                         f"(shape {list(shape)})")
    offsets, lengths = [], []
    for d, (item, size) in enumerate(zip(items, shape)):
        if isinstance(item, slice):
            if item.step is not None and operator.index(item.step) != 1:
                raise ValueError(f"{where}: dimension {d}: slice step {item.step}: only step 1 can be read")
            try:
                start, stop, _ = item.indices(size)     # numpy's resolution of negative/None bounds
            except TypeError:
                raise TypeError(f"{where}: dimension {d}: slice bounds must be ints or None, not "
                                f"{item!r}") from None
            offsets.append(start)
            lengths.append(max(0, stop - start))
            continue
        try:
            start, length = item
            start, length = operator.index(start), operator.index(length)
        except (TypeError, ValueError):
            raise TypeError(f"{where}: dimension {d}: expected a (start, length) pair of ints or a "
                            f"slice, not {item!r}") from None
        if start < 0 or length < 0 or start + length > size:
            raise DcpError(_errno.EINVAL, f"{where}: box start {start} length {length} lies outside "
                                          f"dimension {d} of size {size}")
        offsets.append(start)
        lengths.append(length)
    return offsets, lengths


# ---------------------------------------------------------------- checkpoint

class Checkpoint(Mapping):
    """An open checkpoint: a read-only mapping from keys to tensors and bytes items
    (a :class:`collections.abc.Mapping`: ``ck[key]``, ``in``, ``len``, iteration,
    ``get``, ``items()`` and ``values()``, which read each value whole when asked).

    Made by :func:`dcpfs.open`; a context manager (``with dcpfs.open(p) as ck``).
    Safe to share between threads; close() waits for reads in progress. Two
    Checkpoint objects are equal only when they are the same object (comparing
    contents would read every tensor).
    """

    # Mapping's __eq__ would compare every value (numpy arrays, whose == is
    # elementwise): identity, and hashable as before.
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def __init__(self, _ptr: Any, _path: str) -> None:
        if not isinstance(_ptr, _ffi.CData):
            raise TypeError("Checkpoint objects are made by dcpfs.open()")
        self._ck = _ptr
        self._path = _path
        self._cond = threading.Condition()
        self._active = 0
        self._closing = False
        self._keys: Optional[list] = None

    # -- lifetime

    @contextmanager
    def _use(self) -> Iterator[Any]:
        with self._cond:
            if self._ck is None or self._closing:
                raise ValueError(f"{self._path}: the checkpoint is closed")
            self._active += 1
        try:
            yield self._ck
        finally:
            with self._cond:
                self._active -= 1
                if not self._active:
                    self._cond.notify_all()

    def close(self) -> None:
        """Close the checkpoint (after reads in progress in other threads end). Idempotent."""
        with self._cond:
            if self._ck is None or self._closing:
                return
            self._closing = True
            while self._active:
                self._cond.wait()
            ck, self._ck = self._ck, None
        _lib.dcp_close(ck)

    @property
    def _ptr(self) -> Any:
        """The dcp_checkpoint * (for dcpfs's own modules, which call libdcp directly).
        Valid until close(); raises ValueError once closed."""
        ck = self._ck
        if ck is None or self._closing:
            raise ValueError(f"{self._path}: the checkpoint is closed")
        return ck

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._ck is None or self._closing

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        ck = getattr(self, "_ck", None)
        if ck is not None:
            self._ck = None
            _lib.dcp_close(ck)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self)} keys"
        return f"<dcpfs.Checkpoint {self._path!r} ({state})>"

    # -- the model

    @property
    def path(self) -> str:
        """The checkpoint's path, as libdcp opened it."""
        return self._path

    @property
    def meta(self) -> dict:
        """What libdcp recognised (dcp_info): generation, serialization, layout,
        version, checkpoint_id, save_id (str or None), has_planner_data, megatron
        (bool), metadata_bytes (int), megatron_reformulated (int: tensors stored as
        Megatron-Core's distributed optimizer stores them), megatron_folded (int: of
        those, shown in their original shapes: ``megatron_fold=True``), from_catalog
        (bool: the model was served by the catalog) and files (the data files,
        relative paths)."""
        with self._use() as ck:
            info = _lib.dcp_get_info(ck)
            out: dict = {}
            if info != _ffi.NULL:
                for f in ("generation", "serialization", "layout", "version", "checkpoint_id", "save_id"):
                    out[f] = _text(getattr(info, f))
                out["has_planner_data"] = bool(info.has_planner_data)
                out["megatron"] = bool(info.megatron)
                out["metadata_bytes"] = int(info.metadata_bytes)
                out["megatron_reformulated"] = int(info.megatron_reformulated)
                out["megatron_folded"] = int(info.megatron_folded)
            out["from_catalog"] = bool(_lib.dcp_from_catalog(ck))
            out["files"] = [_text(_lib.dcp_file_name(ck, i)) for i in range(_lib.dcp_num_files(ck))]
            return out

    # a list, as since 0.1 (``ck.keys()[:3]``), where a Mapping gives a KeysView
    def keys(self) -> list:  # type: ignore[override]
        """Every key, in metadata order (a new list), as the str torch loads it (a
        lone surrogate, which pickle stores as three bytes, is itself; a byte that
        is no UTF-8 at all, in a damaged checkpoint, is U+DC80..DCFF as with
        "surrogateescape", and the key is found again by that str). Raises
        ValueError once closed, as the other methods do."""
        with self._use() as ck:
            if self._keys is None:
                self._keys = [_key_text(e.key) for e in self._entries(ck)]
            return list(self._keys)

    def _entries(self, ck: Any) -> Iterator[Any]:
        """Each dcp_entry of the open checkpoint ck, in metadata order."""
        err = _ffi.new("dcp_error *")
        out = _ffi.new("const dcp_entry **")
        for i in range(_lib.dcp_num_entries(ck)):
            if _lib.dcp_get_entry(ck, i, out, err) < 0:
                _raise(err)
            yield out[0]

    def __len__(self) -> int:
        with self._use() as ck:
            return int(_lib.dcp_num_entries(ck))

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __getitem__(self, key: str) -> Any:
        """``ck[key]``: a tensor's whole value as ``read(key)`` gives it (a numpy
        array), a bytes item's stored bytes as ``read_bytes(key)``; an unknown key
        raises DcpKeyError (a KeyError), as a mapping's lookup does."""
        if self.info(key).kind == "bytes":
            return self.read_bytes(key)
        return self.read(key)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str) or "\0" in key:
            return False
        with self._use() as ck:
            err = _ffi.new("dcp_error *")
            out = _ffi.new("const dcp_entry **")
            for b in _key_forms(key):
                if _lib.dcp_find_entry(ck, b, out, err) == 0:
                    return True
                if err.code != _lib.DCP_ENOTFOUND:
                    _raise(err)  # not "absent": the checkpoint cannot answer
            return False

    def _find(self, ck: Any, key: str) -> Any:
        if not isinstance(key, str):
            raise TypeError(f"{self._path}: keys are str, not {type(key).__name__}")
        if "\0" not in key:
            err = _ffi.new("dcp_error *")
            out = _ffi.new("const dcp_entry **")
            for b in _key_forms(key):
                if _lib.dcp_find_entry(ck, b, out, err) == 0:
                    return out[0]
                if err.code != _lib.DCP_ENOTFOUND:
                    _raise(err)
        raise DcpKeyError(_errno.ENOENT, f"{self._path}: {key}: no such key in the checkpoint"
                          f"{self._keys_under(ck, key)}", key)

    def _keys_under(self, ck: Any, key: str) -> str:
        """For the error of an unknown key that is a dotted prefix of keys (a
        module's name, ``model.layers.0``): how many lie under it and the
        first three (sorted), as dcp cat says; else ''."""
        if "\0" in key:
            return ""
        prefix = _key_bytes(key) + b"."
        err = _ffi.new("dcp_error *")
        out = _ffi.new("const dcp_entry **")
        names: list = []
        count, start = 0, prefix
        while count < 1000:
            if _lib.dcp_seek(ck, start, out, err) < 0 or out[0] == _ffi.NULL:
                break
            k = _ffi.string(out[0].key)
            if not k.startswith(prefix):
                break
            if count < 3:
                names.append(_key_text(out[0].key))
            count += 1
            start = k + b"\x01"   # the key right after k
        if not count:
            return ""
        shown = ", ".join(names) + (", ..." if count > 3 else "")
        return (f"; {'at least ' if count >= 1000 else ''}{count} {'key lies' if count == 1 else 'keys lie'} "
                f"under it ({shown}): read one of them")

    def _replicated_keys(self) -> list:
        """The keys :meth:`replicated` is True for, in metadata order (one pass
        over the entries: empty for any checkpoint but a merged rank-local one)."""
        with self._use() as ck:
            return [_key_text(e.key) for e in self._entries(ck) if _lib.dcp_entry_replicated(ck, e)]

    def replicated(self, key: str) -> bool:
        """True when several ranks saved key: a rank-local checkpoint
        (``__R.metadata`` files) opened whole lists key's bytes item, or one
        of its boxes, in more than one rank's file. This view reads it from
        the lowest rank's; torch's ``dcp.load`` gives each rank its own,
        which may hold other values (``dcpfs.open(path, rank=R)`` is rank
        R's view). False for every key of other checkpoints and of a rank's
        view (libdcp's dcp_entry_replicated). Unknown keys raise DcpKeyError."""
        with self._use() as ck:
            return bool(_lib.dcp_entry_replicated(ck, self._find(ck, key)))

    def info(self, key: str) -> EntryInfo:
        """The header of key: kind, dtype, shape, chunks and nbytes (see EntryInfo)."""
        with self._use() as ck:
            e = self._find(ck, key)
            err = _ffi.new("dcp_error *")
            nb = _ffi.new("uint64_t *")
            if _lib.dcp_entry_nbytes(ck, e, nb, err) < 0:
                _raise(err)
            if e.kind != _lib.DCP_KIND_TENSOR:
                return EntryInfo(key, "bytes", None, (), (), int(nb[0]))
            ndim = e.ndim
            shape = tuple(int(e.shape[i]) for i in range(ndim))
            chunks = _ffi.new("const dcp_chunk **")
            if _lib.dcp_entry_chunks(ck, e, chunks, err) < 0:
                _raise(err)
            try:
                cl = []
                for j in range(e.nchunks):
                    c = chunks[0][j]
                    cl.append(Chunk(tuple(int(c.offsets[i]) for i in range(ndim)),
                                    tuple(int(c.sizes[i]) for i in range(ndim))))
            finally:
                _lib.dcp_release_chunks(ck, e)
            return EntryInfo(key, "tensor", _dtype_name(e.dtype), shape, tuple(cl), int(nb[0]))

    # -- reading

    def read(self, key: str, box: Box = None, out: Any = None) -> Any:
        """Read tensor `key`, or one box of it.

        box: None for the whole tensor, or one item per dimension, each a
            ``(start, length)`` pair or a ``slice`` with step 1 (None/negative
            bounds resolved as numpy does). A pair outside the shape raises
            DcpError (EINVAL).
        out: None, or where to put the elements (C order): a writable
            C-contiguous numpy array whose dtype is the one read() would return,
            or a contiguous torch.Tensor on the CPU or a CUDA device with the
            stored dtype; its number of elements must be the box's (its shape
            may differ). A wrong dtype raises TypeError, a wrong size or a
            non-contiguous, read-only or conj/neg view ValueError. A tensor
            without storage of its own (a DTensor: pass its local shard,
            ``out.to_local()``, and that shard's box; a FakeTensor or another
            wrapper subclass) raises TypeError. As for torch's in-place ops, a
            tensor that requires grad while grad mode is on, or an inference
            tensor outside inference mode, raises ValueError; after the read
            ``out``'s version counter is bumped, so autograd notices the write.

        Returns a new C-contiguous numpy array of the box's shape (0-d for a
        0-d tensor) -- bfloat16, float8 and complex32 as unsigned ints of the
        same size holding the raw bits -- or ``out``. Bytes items raise
        TypeError (use read_bytes). A shape numpy cannot make raises DcpError
        (EOVERFLOW) naming the key: numpy refuses an empty array whose other
        sizes times the itemsize pass 2^63 (``torch.empty(2**62, 0)``), which
        ``out=torch.empty(...)`` of that shape reads.
        """
        with self._use() as ck:
            e = self._find(ck, key)
            where = f"{self._path}: {key}"
            if e.kind != _lib.DCP_KIND_TENSOR:
                raise TypeError(f"{where}: a bytes item, not a tensor: read it with read_bytes()")
            dt = e.dtype
            esz = int(_lib.dcp_dtype_size(dt))
            shape = tuple(int(e.shape[i]) for i in range(e.ndim))
            offsets, lengths = _resolve_box(where, shape, box)
            numel = math.prod(lengths)
            nbytes = numel * esz
            if out is None:
                try:
                    arr = np.empty(lengths, dtype=_numpy_dtype(dt))
                except ValueError:
                    # numpy bounds the product of the nonzero sizes times the itemsize even
                    # when a size is 0: torch.empty(2**62, 0) has no numpy twin (torch's reads)
                    why = ", though it has no element" if numel == 0 else ""
                    raise DcpError(_errno.EOVERFLOW, f"{where}: numpy cannot make a {_numpy_dtype(dt)} array of "
                                                     f"shape {tuple(lengths)}: its nonzero sizes times the item "
                                                     f"size pass numpy's limit{why}; read it with out= a torch "
                                                     f"tensor of that shape, or read a box of it") from None
                if nbytes:
                    self._read_into(ck, e, offsets, lengths, _ffi.from_buffer(arr, require_writable=True), nbytes)
                return arr
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(out, torch.Tensor):
                self._read_torch(ck, e, where, offsets, lengths, numel, esz, out, torch)
                return out
            if not isinstance(out, np.ndarray):
                raise TypeError(f"{where}: out must be a numpy.ndarray or a torch.Tensor, "
                                f"not {type(out).__name__}")
            want = _numpy_dtype(dt)
            if out.dtype != want:
                raise TypeError(f"{where}: out has dtype {out.dtype}, the tensor is {_dtype_name(dt)} "
                                f"(read() gives numpy {want})")
            if out.size != numel:
                raise ValueError(f"{where}: out has {out.size} elements, the box {list(lengths)} has {numel}")
            if not out.flags.c_contiguous:
                raise ValueError(f"{where}: out is not C-contiguous")
            if not out.flags.writeable:
                raise ValueError(f"{where}: out is read-only")
            if nbytes:
                self._read_into(ck, e, offsets, lengths, _ffi.from_buffer(out, require_writable=True), nbytes)
            return out

    def _read_into(self, ck: Any, e: Any, offsets: list, lengths: list, dest: Any, nbytes: int) -> None:
        """Plan the box and read it into dest (nbytes bytes), in C order."""
        err = _ffi.new("dcp_error *")
        plan = _ffi.new("dcp_plan *")
        if lengths:
            offs = _ffi.new("int64_t[]", offsets)
            lens = _ffi.new("int64_t[]", lengths)
        else:
            offs = lens = _ffi.NULL
        _lib.dcp_plan_init(plan)
        try:
            if _lib.dcp_plan_region(ck, e, offs, lens, plan, err) < 0:
                _raise(err)
            if plan.nbytes != nbytes:
                raise DcpError(_errno.EIO, f"{self._path}: {_key_text(e.key)}: the plan covers {plan.nbytes} "
                                           f"bytes, the box {nbytes}")
            if _lib.dcp_plan_execute(ck, plan, dest, err) < 0:
                _raise(err)
        finally:
            _lib.dcp_plan_free(plan)

    def _read_torch(self, ck: Any, e: Any, where: str, offsets: list, lengths: list, numel: int,
                    esz: int, out: Any, torch: Any) -> None:
        name = _dtype_name(e.dtype)
        want = getattr(torch, name, None)
        if want is None or out.dtype != want:
            raise TypeError(f"{where}: out has dtype {out.dtype}, the tensor is {name}")
        if out.layout != torch.strided:
            raise ValueError(f"{where}: out has layout {out.layout}: only dense (strided) tensors can be filled")
        if out.numel() != numel:
            raise ValueError(f"{where}: out has {out.numel()} elements, the box {list(lengths)} has {numel}")
        dev = out.device.type
        if dev not in ("cpu", "cuda"):
            raise ValueError(f"{where}: out is on device {out.device}: only cpu and cuda tensors can be filled")
        # libdcp writes through out's data pointer: a wrapper subclass's is 0 (address 0: a crash)
        if _is_dtensor(out):
            raise TypeError(f"{where}: out is a DTensor, which holds no elements itself: read its local "
                            "shard's box into out.to_local()")
        if numel and _no_storage(out):
            raise TypeError(f"{where}: out is a {type(out).__name__} without storage of its own "
                            "(data_ptr() is 0): pass a tensor that holds its elements")
        if not out.is_contiguous():
            raise ValueError(f"{where}: out is not contiguous: pass a contiguous tensor "
                             "(for example out.contiguous(), then copy back)")
        if out.is_conj() or out.is_neg():
            raise ValueError(f"{where}: out is a conj or neg view: its memory does not hold its values")
        problem = _inplace_problem(torch, out)
        if problem:
            raise ValueError(f"{where}: out {problem}")
        nbytes = numel * esz
        if dev == "cpu":
            if nbytes:
                self._read_into(ck, e, offsets, lengths, _ffi.cast("void *", out.data_ptr()), nbytes)
                _bump_version(torch, out)
        elif nbytes:
            self._read_cuda(ck, e, offsets, lengths, esz, out, torch)

    def _read_cuda(self, ck: Any, e: Any, offsets: list, lengths: list, esz: int, out: Any, torch: Any) -> None:
        """Fill a CUDA tensor through two pinned host buffers: read one piece while the
        previous one is copied up."""
        pieces = list(_pieces(offsets, lengths, esz, _CUDA_PIECE_BYTES))
        cap = max(p[3] for p in pieces)
        flat = out.view(-1)
        with torch.cuda.device(out.device):
            stream = torch.cuda.current_stream()
            bufs = [torch.empty(cap, dtype=out.dtype, pin_memory=True) for _ in range(min(2, len(pieces)))]
            done: list = [None] * len(bufs)
            try:
                for i, (po, pl, start, count) in enumerate(pieces):
                    b = i % len(bufs)
                    if done[b] is not None:
                        done[b].synchronize()     # its last copy has left the buffer
                    host = bufs[b]
                    self._read_into(ck, e, po, pl, _ffi.cast("void *", host.data_ptr()), count * esz)
                    flat[start:start + count].copy_(host[:count], non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(stream)
                    done[b] = ev
            finally:
                stream.synchronize()

    def read_bytes(self, key: str) -> bytes:
        """The stored bytes of a bytes item (a non-tensor value: torch.save bytes,
        ``torch.load(io.BytesIO(b), weights_only=False)`` gives the value back).
        Tensors raise TypeError (use read)."""
        with self._use() as ck:
            e = self._find(ck, key)
            if e.kind != _lib.DCP_KIND_BYTES:
                raise TypeError(f"{self._path}: {key}: a tensor, not a bytes item: read it with read()")
            err = _ffi.new("dcp_error *")
            buf = _ffi.new("void **")
            n = _ffi.new("uint64_t *")
            if _lib.dcp_read_entry(ck, e, buf, n, err) < 0:
                _raise(err)
            try:
                return _ffi.unpack(_ffi.cast("char *", buf[0]), n[0]) if n[0] else b""
            finally:
                _lib.free(buf[0])


def _is_dtensor(t: Any) -> bool:
    """t is a torch.distributed DTensor (an nn.Parameter of one too), found
    without importing torch.distributed."""
    return any(c.__name__ == "DTensor" and c.__module__.startswith("torch.distributed")
               for c in type(t).__mro__)


def _no_storage(t: Any) -> bool:
    """t has no memory of its own to write into: a wrapper subclass (DTensor,
    ``_make_wrapper_subclass`` tensors) has a storage whose data pointer is 0
    or refuses to give one, a FakeTensor a meta storage (asked through its
    storage: FakeTensor.data_ptr() warns). Only meaningful for a tensor with
    elements."""
    try:
        st = t.untyped_storage()
        return st.device.type == "meta" or int(st.data_ptr()) == 0
    except (RuntimeError, NotImplementedError):
        return True


def _inplace_problem(torch: Any, t: Any) -> Optional[str]:
    """Why torch would refuse an in-place write into t, which dcpfs makes
    behind autograd's back (None: it may be written). Such a write is never
    recorded in the graph, so unlike torch (which refuses leaves only) any
    tensor requiring grad is refused while grad mode is on."""
    if t.requires_grad and torch.is_grad_enabled():
        return ("requires grad, and grad mode is on: autograd cannot record a write into it "
                "(torch refuses in-place writes to a leaf that requires grad): read under "
                "torch.no_grad(), or into out.detach()")
    if t.is_inference() and not torch.is_inference_mode_enabled():
        return ("is an inference tensor: torch allows in-place writes to it only in inference mode "
                "(torch.inference_mode())")
    return None


def _bump_version(torch: Any, t: Any) -> None:
    """Tell autograd that t was written in place (through its data pointer, so
    torch did not count it): a use of an older value saved for backward then
    raises, as after torch's own in-place ops."""
    graph = getattr(torch.autograd, "graph", None)
    inc = getattr(graph, "increment_version", None)
    if inc is not None:
        inc(t)
    else:   # (torch before 2.1)
        torch._C._increment_version(t)


def _pieces(offsets: list, lengths: list, esz: int, limit: int) -> Iterator[Tuple[list, list, int, int]]:
    """Split a box into sub-boxes of at most `limit` bytes (at least one element)
    that are each contiguous in the box's C-order buffer: (offsets, lengths,
    first element, element count)."""
    n = len(lengths)
    numel = math.prod(lengths)
    if numel * esz <= limit or n == 0:
        yield list(offsets), list(lengths), 0, numel
        return
    # k: the first dimension from which the inner block fits; j = k - 1 is split in runs of rows.
    k, inner = n, 1
    while k > 0 and inner * lengths[k - 1] * esz <= limit:
        k -= 1
        inner *= lengths[k]
    j = k - 1
    rows = max(1, limit // (inner * esz))
    outer_shape = lengths[:j]
    for flat_outer, idx in enumerate(np.ndindex(*outer_shape) if j else [()]):
        base = flat_outer * lengths[j] * inner
        for s in range(0, lengths[j], rows):
            cnt = min(rows, lengths[j] - s)
            po = [offsets[d] + idx[d] for d in range(j)] + [offsets[j] + s] + list(offsets[k:])
            pl = [1] * j + [cnt] + list(lengths[k:])
            yield po, pl, base + s * inner, cnt * inner


# ---------------------------------------------------------------- open

def open(path: Union[str, "os.PathLike[str]"], *, catalog: bool = True,
         catalog_path: Optional[str] = None, megatron_fold: bool = False,
         rank: Optional[int] = None) -> Checkpoint:
    """Open a checkpoint: a folder (global ``.metadata``, rank-local ``__R.metadata``
    files, a Hugging Face safetensors layout, a Megatron-Core folder) or a single
    torch.save (.pt/.pth) or safetensors file.

    catalog: serve the folder's model from the catalog (libdcp's DCP_OPEN_CATALOG;
        parsed once, stored, reused while ``.metadata`` is unchanged). False
        parses ``.metadata`` and writes nothing. Single files never use it.
    catalog_path: the catalog file (default $XDG_CACHE_HOME/dcpfs/catalog.sqlite,
        else ~/.cache/dcpfs/catalog.sqlite).
    megatron_fold: show Megatron-Core's reformulated tensors (its distributed
        optimizer's states, stored as ``[X/x, Y/y, x*y]`` for a tensor ``[X, Y]``
        split into ``[x, y]`` blocks) in their original shapes, as Megatron-Core's
        own load does (libdcp's DCP_OPEN_MEGATRON_FOLD); by default they have the
        stored shape, as PyTorch's ``dcp.load`` sees them. The ``.metadata`` is
        then parsed (the catalog is not used).
    rank: rank R's view of a rank-local checkpoint (a ``use_collectives=False``
        save: one ``__R.metadata`` per rank, no ``.metadata``): only
        ``__R.metadata`` and the shard files it names, as torch's ``dcp.load``
        reads it on rank R (libdcp's DCP_OPEN_RANK; the catalog is not used).
        None (the default) opens every rank's file merged, a key several
        ranks saved read from the lowest rank's (:meth:`Checkpoint.replicated`).
        A folder without ``__R.metadata`` raises DcpError (ENOENT) naming it;
        a single file raises ValueError.

    Raises DcpError naming the file and the reason when it cannot be opened.
    """
    if rank is not None:
        rank = operator.index(rank)
        if not 0 <= rank <= 100000000:
            raise ValueError(f"{os.fspath(path)}: rank {rank}: a rank is from 0 to 100000000")
    p = os.fspath(path)
    pb = os.fsencode(p)
    if b"\0" in pb:
        raise ValueError("embedded null byte in the checkpoint path")
    err = _ffi.new("dcp_error *")
    out = _ffi.new("dcp_checkpoint **")
    if os.path.isfile(pb):
        if rank is not None:
            raise ValueError(f"{p}: rank={rank} reads a rank-local checkpoint folder's __{rank}.metadata; "
                             "this is a single file")
        # A single torch.save or safetensors file, as `dcp` opens one.
        rc = _lib.dcp_open_file(pb, _lib.DCP_FORMAT_AUTO, out, _ffi.NULL, err)
    else:
        opts = _ffi.new("dcp_open_options *")
        opts.size = _ffi.sizeof("dcp_open_options")   # DCP_OPEN_OPTIONS_INIT
        opts.flags = ((_lib.DCP_OPEN_CATALOG if catalog else _lib.DCP_OPEN_DEFAULT) |
                      (_lib.DCP_OPEN_MEGATRON_FOLD if megatron_fold else 0) |
                      (_lib.DCP_OPEN_RANK if rank is not None else 0))
        opts.rank = rank or 0
        cat = _ffi.NULL
        if catalog_path is not None:
            cb = os.fsencode(os.fspath(catalog_path))
            if b"\0" in cb:
                raise ValueError("embedded null byte in the catalog path")
            cat = _ffi.new("char[]", cb)
        opts.catalog = cat
        rc = _lib.dcp_open_ex(pb, opts, out, err)
    if rc < 0:
        _raise(err)
    ck = out[0]
    return Checkpoint(ck, _text(_lib.dcp_path(ck)) or p)
