"""dcpfs.open and the Checkpoint API: every fixture against its manifest, boxes against
numpy slicing, out= arrays and tensors, every checkpoint the PyTorch interop tier writes,
single torch.save/safetensors files, threads, and errors that name file, key and reason.

Run by tests/python-open.sh (make check) with PYTHONPATH at the package built against the
build tree. Tests whose names contain "torch" need PyTorch (deselected without it).
"""
import collections
import errno
import hashlib
import io
import json
import os
import pydoc
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import dcpfs

SRC = Path(os.environ.get("top_srcdir") or Path(__file__).resolve().parents[2])
FIXTURES = SRC / "tests" / "fixtures"
INTEROP = SRC / "tests" / "interop"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected" / "manifest.json").is_file())

# numpy has no bfloat16/float8/complex32: read() gives the raw bits in unsigned ints.
RAW_BITS = {"bfloat16": "<u2", "complex32": "<u4", "float8_e4m3fn": "|u1", "float8_e5m2": "|u1",
            "float8_e4m3fnuz": "|u1", "float8_e5m2fnuz": "|u1", "float8_e8m0fnu": "|u1"}


def np_dtype(name):
    return np.dtype(RAW_BITS.get(name, name))


def sha(b):
    return hashlib.sha256(bytes(b)).hexdigest()


def manifest(case):
    return json.loads((FIXTURES / case / "expected" / "manifest.json").read_text())


def random_boxes(shape, rng, n=4):
    """n boxes over shape, each as ((start, length) pairs, the same box as slices written
    with negative or None bounds at random, the numpy index that cuts it)."""
    for _ in range(n):
        pairs, slices = [], []
        for d in shape:
            start = rng.randrange(0, d + 1)
            stop = rng.randrange(start, d + 1)
            pairs.append((start, stop - start))
            lo = rng.choice([start, start - d, None if start == 0 else start]) if start < d else start
            hi = rng.choice([stop, stop - d if stop < d else None, stop + 1000 if stop == d else stop])
            slices.append(slice(lo, hi))
        yield pairs, slices, tuple(slice(s, s + l) for s, l in pairs)


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    return str(tmp_path_factory.mktemp("catalog") / "catalog.sqlite")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("use_catalog", [False, True], ids=["parsed", "catalog"])
def test_fixture_matches_manifest(case, use_catalog, catalog):
    m = manifest(case)
    want = {e["key"]: e for e in m["entries"]}
    for attempt in range(2 if use_catalog else 1):   # the second open is served by the catalog
        with dcpfs.open(FIXTURES / case / "ckpt", catalog=use_catalog, catalog_path=catalog) as ck:
            if use_catalog and attempt:
                assert ck.meta["from_catalog"]
            assert sorted(ck.keys()) == sorted(want)
            assert len(ck) == len(want) and list(ck) == ck.keys()
            for key, e in want.items():
                assert key in ck
                info = ck.info(key)
                assert info.key == key and info.kind == e["kind"] and info.nbytes == e["nbytes"]
                if e["kind"] == "bytes":
                    b = ck.read_bytes(key)
                    assert isinstance(b, bytes) and len(b) == e["nbytes"] and sha(b) == e["sha256"], key
                    assert ck[key] == b, key   # the mapping's lookup
                    with pytest.raises(TypeError, match="read_bytes"):
                        ck.read(key)
                    continue
                assert info.dtype == e["dtype"] and list(info.shape) == e["shape"], key
                assert [(list(c.offsets), list(c.sizes)) for c in info.chunks] == \
                       [(c["offsets"], c["sizes"]) for c in e["chunks"]], key
                a = ck.read(key)
                assert isinstance(a, np.ndarray) and a.flags.c_contiguous
                assert a.shape == tuple(e["shape"]) and a.dtype == np_dtype(e["dtype"]), key
                assert sha(a.tobytes()) == e["sha256"], key
                assert sha(ck[key].tobytes()) == e["sha256"], key   # the mapping's lookup
                with pytest.raises(TypeError, match="read\\(\\)"):
                    ck.read_bytes(key)


@pytest.mark.parametrize("case", CASES)
def test_boxes_equal_numpy_slicing(case):
    rng = random.Random(case)
    with dcpfs.open(FIXTURES / case / "ckpt", catalog=False) as ck:
        for key in ck.keys():
            info = ck.info(key)
            if info.kind != "tensor":
                continue
            full = ck.read(key)
            if info.shape == ():
                assert full.shape == () and ck.read(key, []).tobytes() == full.tobytes()
                continue
            for pairs, slices, index in random_boxes(info.shape, rng):
                want = full[index]
                got = ck.read(key, pairs)
                assert got.shape == want.shape and got.dtype == full.dtype and got.flags.c_contiguous
                assert got.tobytes() == want.tobytes(), (key, pairs)
                assert ck.read(key, slices).tobytes() == want.tobytes(), (key, slices)
                assert ck.read(key, tuple(slices)).shape == want.shape
                out = np.empty(want.size, dtype=full.dtype)     # any shape with the box's numel
                out.view(np.uint8)[:] = 0xAB
                assert ck.read(key, pairs, out=out) is out
                assert out.tobytes() == want.tobytes(), (key, pairs)
            # slices resolve like numpy: negative, None and too-large bounds
            s = [slice(-1, None)] + [slice(None, 10**30)] * (len(info.shape) - 1)
            assert ck.read(key, s).tobytes() == full[tuple(s)].tobytes()


@pytest.mark.parametrize("case", CASES)
def test_out_numpy_whole_tensor(case):
    with dcpfs.open(FIXTURES / case / "ckpt", catalog=False) as ck:
        for e in manifest(case)["entries"]:
            if e["kind"] != "tensor":
                continue
            out = np.empty(e["shape"], dtype=np_dtype(e["dtype"]))
            assert ck.read(e["key"], out=out) is out
            assert sha(out.tobytes()) == e["sha256"], e["key"]


@pytest.mark.parametrize("case", CASES)
def test_out_torch_cpu(case):
    import torch
    rng = random.Random(case)
    with dcpfs.open(FIXTURES / case / "ckpt", catalog=False) as ck:
        for e in manifest(case)["entries"]:
            if e["kind"] != "tensor":
                continue
            key = e["key"]
            t = torch.full(e["shape"], 7, dtype=getattr(torch, e["dtype"])) if e["dtype"] != "bool" \
                else torch.zeros(e["shape"], dtype=torch.bool)
            assert ck.read(key, out=t) is t
            assert sha(t.reshape(-1).view(torch.uint8).numpy().tobytes()) == e["sha256"], key
            if e["shape"] and e["numel"]:
                full = ck.read(key)
                for pairs, _, index in random_boxes(e["shape"], rng, 2):
                    want = full[index]
                    part = torch.empty(want.shape, dtype=t.dtype)
                    ck.read(key, pairs, out=part)
                    assert part.reshape(-1).view(torch.uint8).numpy().tobytes() == want.tobytes()


def test_fixture_dtypes_torch_native():
    """bfloat16 comes back natively into torch tensors and as raw uint16 bits into numpy."""
    import torch
    case = "04_block_4ranks"
    e = next(e for e in manifest(case)["entries"] if e["dtype"] == "bfloat16")
    with dcpfs.open(FIXTURES / case / "ckpt", catalog=False) as ck:
        bits = ck.read(e["key"])
        assert bits.dtype == np.uint16
        t = torch.empty(e["shape"], dtype=torch.bfloat16)
        ck.read(e["key"], out=t)
        assert torch.equal(t, torch.from_numpy(bits).view(torch.bfloat16))
        with pytest.raises(TypeError, match="bfloat16"):
            ck.read(e["key"], out=torch.empty(e["shape"], dtype=torch.float16))
        with pytest.raises(TypeError, match="bfloat16"):
            ck.read(e["key"], out=np.empty(e["shape"], dtype=np.float16))


def test_meta_and_megatron():
    with dcpfs.open(FIXTURES / "05_mixed_2ranks" / "ckpt", catalog=False) as ck:
        m = ck.meta
        assert m["serialization"] == "torch_save" and "metadata" in m["layout"]
        assert m["generation"] and m["metadata_bytes"] > 0 and not m["megatron"]
        assert "__0_0.distcp" in m["files"] and m["from_catalog"] is False
        assert repr(ck).startswith("<dcpfs.Checkpoint")
    with dcpfs.open(FIXTURES / "09_megatron_torch_dist" / "ckpt", catalog=False) as ck:
        assert ck.meta["megatron"] is True


def test_scalar_and_empty():
    with dcpfs.open(FIXTURES / "05_mixed_2ranks" / "ckpt", catalog=False) as ck:
        step = ck.read("step")
        assert step.shape == () and step.dtype == np.int64 and int(step) == 1234
        out = np.zeros((), dtype=np.int64)
        assert ck.read("step", [], out=out) is out and int(out) == 1234
        z = ck.read("enc.weight", [(3, 0), slice(None)])
        assert z.shape == (0, 24)
        z = ck.read("enc.weight", [slice(5, 2), (0, 24)])        # an empty slice, as numpy
        assert z.shape == (0, 24)


def test_threads_share_a_checkpoint():
    case = "02_rowwise_4ranks"
    want = {e["key"]: e["sha256"] for e in manifest(case)["entries"] if e["kind"] == "tensor"}
    ck = dcpfs.open(FIXTURES / case / "ckpt", catalog=False)
    bad = []

    def reader(i):
        for _ in range(50):
            for k, h in want.items():
                if sha(ck.read(k).tobytes()) != h:
                    bad.append((i, k))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    ck.close()
    ck.close()                                  # idempotent
    assert ck.closed
    with pytest.raises(ValueError, match="closed"):
        ck.read(next(iter(want)))
    with pytest.raises(ValueError, match="closed"):
        ck.keys()


def test_close_while_reading():
    """close() in one thread while others read: reads finish or see a closed checkpoint."""
    ck = dcpfs.open(FIXTURES / "02_rowwise_4ranks" / "ckpt", catalog=False)
    key = ck.keys()[0]
    want = ck.read(key).tobytes()
    outcomes = []

    def reader():
        try:
            for _ in range(10000):
                assert ck.read(key).tobytes() == want
        except ValueError as e:
            outcomes.append(str(e))
        else:
            outcomes.append("done")

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    ck.close()
    for t in threads:
        t.join()
    assert len(outcomes) == 4 and all(o == "done" or "closed" in o for o in outcomes)


def test_help_renders():
    text = pydoc.render_doc(dcpfs, renderer=pydoc.plaintext)
    for word in ("dcpfs.open", "read_bytes", "bfloat16", "uint16", "DcpError", "Checkpoint", "EntryInfo"):
        assert word in text
    assert dcpfs.__version__ == "0.2.0"
    assert dcpfs.Checkpoint.read.__doc__ and dcpfs.open.__doc__


# ---------------------------------------------------------------- errors

CK05 = FIXTURES / "05_mixed_2ranks" / "ckpt"


def test_unknown_key():
    with dcpfs.open(CK05, catalog=False) as ck:
        for bad in ("nope", "enc.weight.x", "enc", "", "enc.weight\0"):
            assert bad not in ck
            with pytest.raises(dcpfs.DcpKeyError) as ei:
                ck.read(bad)
            e = ei.value
            assert isinstance(e, KeyError) and isinstance(e, dcpfs.DcpError) and isinstance(e, OSError)
            assert e.errno == errno.ENOENT and e.key == bad
            assert str(CK05) in str(e) and f": {bad}: no such key" in str(e)
            # a module's name (a dotted prefix of keys) names the keys under it, as dcp cat does
            under = "; 2 keys lie under it (enc.bias, enc.weight): read one of them"
            assert (under in str(e)) == (bad == "enc"), str(e)
            with pytest.raises(KeyError):
                ck.info(bad)
            with pytest.raises(KeyError):
                ck.read_bytes(bad)
        assert 3 not in ck
        with pytest.raises(KeyError):
            ck["no.such.key"]
        with pytest.raises(TypeError):
            ck.read(3)
    with dcpfs.open(CK05) as ck:   # served from the catalog: the same
        with pytest.raises(dcpfs.DcpKeyError, match=r": optim: no such key in the checkpoint; 1 key lies under it "
                                                    r"\(optim\.state\)"):
            ck.read("optim")


def test_bad_boxes():
    with dcpfs.open(CK05, catalog=False) as ck:
        for box in ([(0, 41), (0, 24)], [(40, 1), (0, 1)], [(-1, 2), (0, 1)], [(0, 1), (0, -1)],
                    [(2**62, 2**62), (0, 1)], [(0, 1), (2**70, 1)]):
            with pytest.raises(dcpfs.DcpError) as ei:
                ck.read("enc.weight", box)
            assert ei.value.errno == errno.EINVAL
            assert "enc.weight" in str(ei.value) and "outside dimension" in str(ei.value) and str(CK05) in str(ei.value)
        with pytest.raises(ValueError, match="box has 1 dimension.*the tensor 2"):
            ck.read("enc.weight", [(0, 1)])
        with pytest.raises(ValueError, match="box has 1 dimension.*the tensor 0"):
            ck.read("step", [(0, 1)])
        with pytest.raises(ValueError, match="step"):
            ck.read("enc.weight", [slice(0, 10, 2), slice(None)])
        with pytest.raises(TypeError):
            ck.read("enc.weight", [(0.5, 1), (0, 1)])
        with pytest.raises(TypeError):
            ck.read("enc.weight", [(0, 1, 2), (0, 1)])
        with pytest.raises(TypeError):
            ck.read("enc.weight", "0:1,0:1")
        with pytest.raises(TypeError):
            ck.read("enc.weight", slice(None))


def test_bad_out_numpy():
    with dcpfs.open(CK05, catalog=False) as ck:
        with pytest.raises(TypeError, match="enc.weight.*float64.*float32"):
            ck.read("enc.weight", out=np.empty((40, 24), dtype=np.float64))
        with pytest.raises(ValueError, match="959 elements"):
            ck.read("enc.weight", out=np.empty(959, dtype=np.float32))
        with pytest.raises(ValueError, match="C-contiguous"):
            ck.read("enc.weight", out=np.empty((24, 40), dtype=np.float32).T)
        ro = np.empty((40, 24), dtype=np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            ck.read("enc.weight", out=ro)
        with pytest.raises(TypeError, match="numpy.ndarray or a torch.Tensor"):
            ck.read("enc.weight", out=bytearray(3840))


def test_bad_out_torch():
    import torch
    with dcpfs.open(CK05, catalog=False) as ck:
        with pytest.raises(TypeError, match="float32"):
            ck.read("enc.weight", out=torch.empty(40, 24, dtype=torch.float64))
        with pytest.raises(ValueError, match="not contiguous"):
            ck.read("enc.weight", out=torch.empty(24, 40).t())
        with pytest.raises(ValueError, match="elements"):
            ck.read("enc.weight", out=torch.empty(40, 23))
        with pytest.raises(ValueError, match="device meta"):
            ck.read("enc.weight", out=torch.empty(40, 24, device="meta"))
        t = torch.zeros(40, 24)
        with pytest.raises(dcpfs.DcpError):
            ck.read("enc.weight", [(0, 41), (0, 24)], out=t)
        assert not t.any()


def test_torch_out_without_storage():
    """A tensor subclass without storage of its own (a FakeTensor, a bare
    ``_make_wrapper_subclass`` tensor) is refused, naming the key: libdcp
    would write to address 0 (a crash, or EFAULT blamed on the shard file)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Wrapper(torch.Tensor):      # metadata only: every op refused
        @staticmethod
        def __new__(cls, like):
            return torch.Tensor._make_wrapper_subclass(cls, like.shape, dtype=like.dtype, device=like.device)

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError(f"Wrapper: {func}")

    with FakeTensorMode():
        fake = torch.empty(40, 24)
    with dcpfs.open(CK05, catalog=False) as ck:
        for out in (fake, Wrapper(torch.zeros(40, 24))):
            with pytest.raises(TypeError, match=rf"05_mixed_2ranks/ckpt: enc.weight: out is a {type(out).__name__} "
                                                r"without storage of its own"):
                ck.read("enc.weight", out=out)


def _dtensor_out(rank: int, world: int, path: str) -> str:
    """ck.read(out=) an FSDP2-style parameter (an nn.Parameter of a DTensor): the error, and that
    its local shard reads."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    p = torch.nn.Parameter(distribute_tensor(torch.zeros(40, 24), mesh, [Shard(0)]))
    with dcpfs.open(path, catalog=False) as ck:
        try:
            ck.read("enc.weight", out=p)
        except TypeError as e:
            msg = str(e)
        else:
            raise AssertionError("no error")
        with torch.no_grad():
            ck.read("enc.weight", out=p.to_local())
        assert np.array_equal(p.to_local().detach().numpy(), ck.read("enc.weight"))
    return msg


def test_torch_out_dtensor():
    sys.path.insert(0, os.path.dirname(__file__))
    import dist as distrun      # python/tests/dist.py
    msg = distrun.run(1, _dtensor_out, str(CK05), timeout=60)[0]
    assert f"{CK05}: enc.weight: out is a DTensor" in msg and "out.to_local()" in msg, msg


def test_torch_out_autograd():
    """dcpfs writes behind autograd: a tensor requiring grad is refused while
    grad mode is on (torch refuses in-place writes to such a leaf), an
    inference tensor outside inference mode too, and a write bumps the
    version counter, so a value saved for backward is caught as after
    torch's own in-place ops."""
    import torch
    with dcpfs.open(CK05, catalog=False) as ck:
        full = torch.from_numpy(ck.read("enc.weight"))
        w = torch.zeros(40, 24, requires_grad=True)
        with pytest.raises(ValueError, match=r"enc.weight: out requires grad, and grad mode is on"):
            ck.read("enc.weight", out=w)
        assert w._version == 0 and not w.detach().any()
        with torch.no_grad():
            ck.read("enc.weight", out=w)
        assert w._version > 0 and torch.equal(w.detach(), full)
        with torch.inference_mode():
            inf = torch.zeros(40, 24)
        with pytest.raises(ValueError, match=r"enc.weight: out is an inference tensor"):
            ck.read("enc.weight", out=inf)
        with torch.inference_mode():
            ck.read("enc.weight", out=inf)
        assert torch.equal(inf, full)
        a = torch.ones(40, 24, requires_grad=True)
        h = a * 1.0
        y = (h * h).sum()           # saves h for backward
        with torch.no_grad():
            ck.read("enc.weight", out=h)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


def test_closed_keys_and_float_slices():
    """keys() after close() raises as every other method does, even once cached;
    a float slice bound names the file, key and dimension."""
    ck = dcpfs.open(CK05, catalog=False)
    with pytest.raises(TypeError, match=r"05_mixed_2ranks/ckpt: enc.weight: dimension 0: slice bounds must be "
                                        r"ints or None"):
        ck.read("enc.weight", [slice(0.5, 2), slice(None)])
    assert "enc.weight" in ck.keys()
    ck.close()
    with pytest.raises(ValueError, match="closed"):
        ck.keys()
    with pytest.raises(ValueError, match="closed"):
        list(ck)


def test_checkpoint_is_a_mapping():
    """A Checkpoint is a collections.abc.Mapping: get, items, values, dict(ck); equal
    only to itself (comparing contents would read every tensor), and hashable."""
    import collections.abc
    m = manifest("05_mixed_2ranks")
    with dcpfs.open(CK05, catalog=False) as ck, dcpfs.open(CK05, catalog=False) as again:
        assert isinstance(ck, collections.abc.Mapping)
        assert ck.get("no.such.key") is None and ck.get("no.such.key", 7) == 7
        assert np.array_equal(ck.get("enc.weight"), ck.read("enc.weight"))
        items = dict(ck.items())
        assert sorted(items) == sorted(ck.keys()) == sorted(e["key"] for e in m["entries"])
        for e in m["entries"]:
            v = items[e["key"]]
            assert sha(v if isinstance(v, bytes) else v.tobytes()) == e["sha256"], e["key"]
        assert len(list(ck.values())) == len(ck)
        assert ck == ck and ck != again and len({ck, again}) == 2


def copy_ckpt(tmp_path, case="05_mixed_2ranks"):
    dst = tmp_path / case
    shutil.copytree(FIXTURES / case / "ckpt", dst)
    for p in dst.rglob("*"):
        p.chmod(0o644 if p.is_file() else 0o755)
    return dst


@pytest.mark.parametrize("use_catalog", [False, True], ids=["parsed", "catalog"])
def test_damaged_metadata(tmp_path, use_catalog):
    ck = copy_ckpt(tmp_path)
    meta = ck / ".metadata"
    data = meta.read_bytes()
    cat = str(tmp_path / "catalog.sqlite")
    meta.write_bytes(data[: len(data) // 2])
    with pytest.raises(dcpfs.DcpError) as ei:
        dcpfs.open(ck, catalog=use_catalog, catalog_path=cat)
    assert f"{ck}/.metadata" in str(ei.value) and "truncated" in str(ei.value)
    flipped = bytearray(data)
    for i in range(200, len(flipped), 50):
        flipped[i] ^= 0xFF
    meta.write_bytes(bytes(flipped))
    with pytest.raises(dcpfs.DcpError) as ei:
        dcpfs.open(ck, catalog=use_catalog, catalog_path=cat)
    assert f"{ck}/.metadata" in str(ei.value)
    meta.write_bytes(b"")
    with pytest.raises(dcpfs.DcpError):
        dcpfs.open(ck, catalog=use_catalog, catalog_path=cat)
    meta.unlink()
    with pytest.raises(dcpfs.DcpError):
        dcpfs.open(ck, catalog=use_catalog, catalog_path=cat)


@pytest.mark.parametrize("use_catalog", [False, True], ids=["parsed", "catalog"])
def test_shard_replaced_after_open(tmp_path, use_catalog):
    """A shard replaced by rename after the checkpoint was opened (another
    file, even with the same bytes) reads as an error naming it, never as
    the new file's bytes beside the old ones'."""
    ck = copy_ckpt(tmp_path)
    cat = str(tmp_path / "catalog.sqlite")
    with dcpfs.open(ck, catalog=use_catalog, catalog_path=cat) as c:
        want = {k: c.read_bytes(k) if c.info(k).kind == "bytes" else c.read(k).tobytes() for k in c.keys()}
    with dcpfs.open(ck, catalog=use_catalog, catalog_path=cat) as c:
        shard = sorted(ck.glob("*.distcp"))[0]
        tmp = shard.with_name(shard.name + ".new")
        shutil.copyfile(shard, tmp)
        os.rename(tmp, shard)                           # same bytes, another inode
        errors = 0
        for k in c.keys():
            try:
                got = c.read_bytes(k) if c.info(k).kind == "bytes" else c.read(k).tobytes()
            except dcpfs.DcpError as e:
                assert e.errno == errno.EIO and shard.name in str(e) and "replaced" in str(e), str(e)
                errors += 1
                continue
            assert got == want[k], k                     # keys of other shards read as before
        assert errors > 0, "no read met the replaced shard"
    with dcpfs.open(ck, catalog=use_catalog, catalog_path=cat) as c:   # a new open sees the new file
        for k in c.keys():
            got = c.read_bytes(k) if c.info(k).kind == "bytes" else c.read(k).tobytes()
            assert got == want[k], k


def test_missing_and_short_shard(tmp_path):
    ck = copy_ckpt(tmp_path)
    (ck / "__0_2.distcp").unlink()                      # dec.weight's first chunk (dcp layout)
    with dcpfs.open(ck, catalog=False) as c:
        with pytest.raises(dcpfs.DcpError) as ei:
            c.read("dec.weight")
        e = ei.value
        assert e.errno == errno.ENOENT
        assert "__0_2.distcp" in str(e) and "dec.weight" in str(e) and "missing" in str(e)
        # a box inside the other chunk never touches the missing file
        assert c.read("dec.weight", [slice(None), slice(21, None)]).shape == (24, 20)
        assert c.read("enc.weight").shape == (40, 24)
    # a shard cut short: EIO naming the file and the key
    shard = ck / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:600])
    with dcpfs.open(ck, catalog=False) as c:
        with pytest.raises(dcpfs.DcpError) as ei:
            for k in c.keys():
                if c.info(k).kind == "tensor":
                    c.read(k)
                else:
                    c.read_bytes(k)
        assert "__0_0.distcp" in str(ei.value) and ei.value.errno in (errno.EIO, errno.EINVAL)


def test_open_errors(tmp_path):
    with pytest.raises(dcpfs.DcpError) as ei:
        dcpfs.open(tmp_path / "absent")
    assert str(tmp_path / "absent") in str(ei.value)
    with pytest.raises(dcpfs.DcpError):
        dcpfs.open(tmp_path)                           # an empty folder
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a zip" * 10)
    with pytest.raises(dcpfs.DcpError) as ei:
        dcpfs.open(junk)
    assert "junk.pt" in str(ei.value)
    # a checkpoint's .metadata instead of its folder: the message names the folder to open
    ck = FIXTURES / "05_mixed_2ranks" / "ckpt"
    with pytest.raises(dcpfs.DcpError) as ei:
        dcpfs.open(ck / ".metadata")
    assert f"a file of a checkpoint folder, not a checkpoint of its own: open the folder {ck}" in str(ei.value)
    notes = tmp_path / "notes.txt"
    notes.write_text("notes")
    with pytest.raises(dcpfs.DcpError) as ei:
        dcpfs.open(notes)
    assert f"{notes}: not a checkpoint: neither a folder" in str(ei.value)
    with pytest.raises(ValueError):
        dcpfs.open("a\0b")
    with pytest.raises(TypeError):
        dcpfs.Checkpoint(None, "x")


def test_open_names_checkpoints_inside(tmp_path):
    """A folder that is no checkpoint but holds checkpoint folders names them
    (libdcp's message): one, and what to open; several in natural order
    (step-10 after step-4), the first two and the last two and how many,
    names escaped; none, the plain message."""
    nc = "not a checkpoint: no .metadata, __R.metadata or .safetensors files"
    one = tmp_path / "one"
    shutil.copytree(CK05, one / "ckpt")
    with pytest.raises(dcpfs.DcpError) as ei:
        dcpfs.open(one)
    assert ei.value.errno == errno.ENOENT
    assert ei.value.strerror == f"{one}: {nc}; it holds the checkpoint folder ckpt/: open {one}/ckpt"
    several = tmp_path / "several"
    for d in ["step-3", "step-10", "step-1", "step-2", "step-4", "x\nb\udcff"]:
        shutil.copytree(CK05, several / d)   # "\udcff": the byte 0xff (surrogateescape)
    (several / "notes").mkdir()
    shutil.copytree(CK05, several / "tmp-checkpoint-9")   # staged, not renamed yet: partial, not named
    with pytest.raises(dcpfs.DcpError) as ei:
        dcpfs.open(several, catalog=False)
    assert ei.value.strerror == (f"{several}: {nc}; it holds the checkpoint folders step-1/, step-2/, ..., step-10/ "
                                 "and x\\nb\\xff/ (6 in all): open one of them")
    for d in ["step-2", "step-3", "step-4"]:
        shutil.rmtree(several / d)
    with pytest.raises(dcpfs.DcpError) as ei:
        dcpfs.open(several)
    assert ei.value.strerror == (f"{several}: {nc}; it holds the checkpoint folders step-1/, step-10/ and x\\nb\\xff/: "
                                 "open one of them")
    (tmp_path / "empty").mkdir()
    for none in [tmp_path / "empty", tmp_path]:   # nothing inside; checkpoints two levels down
        with pytest.raises(dcpfs.DcpError) as ei:
            dcpfs.open(none)
        assert ei.value.strerror == f"{none}: {nc}"


def test_open_rank_errors_in_python_terms(tmp_path):
    """rank=R on a rank-local folder without __R.metadata, and with a shard its
    __R.metadata names missing: the messages name the file and no C flag of
    libdcp's (DCP_OPEN_RANK); a path holding such a name is shown as it is."""
    rl = SRC / "tests" / "data" / "metadata" / "pt_ranklocal"
    with pytest.raises(dcpfs.DcpError) as ei:
        dcpfs.open(rl, rank=5)
    assert ei.value.errno == errno.ENOENT
    assert ei.value.strerror == (f"{rl}/__5.metadata: no such file: rank 5 saved no rank-local metadata here "
                                 "(only a use_collectives=False save writes an __R.metadata per rank)")
    odd = tmp_path / "DCP_OPEN_RANK"
    odd.mkdir()
    with pytest.raises(dcpfs.DcpError) as ei:
        dcpfs.open(odd, rank=0)
    assert ei.value.strerror == (f"{odd}/__0.metadata: no such file: rank 0 saved no rank-local metadata here "
                                 "(only a use_collectives=False save writes an __R.metadata per rank)")
    ck = tmp_path / "rl"
    shutil.copytree(rl, ck)
    (ck / "__1_0.distcp").unlink()
    with dcpfs.open(ck, rank=1) as c:
        with pytest.raises(dcpfs.DcpError) as ei:
            c.read("sharded")
    assert ei.value.errno == errno.ENOENT
    assert ei.value.strerror == f"{ck}/__1_0.distcp: sharded: the data file is missing"


# ---------------------------------------------------------------- PyTorch-written checkpoints

def torch_bytes(t):
    import torch
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def run_generator(args, log):
    r = subprocess.run([sys.executable, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=900)
    log.write_bytes(r.stdout)
    assert r.returncode == 0, f"{args}: {r.stdout.decode(errors='replace')[-3000:]}"


def save_odd_keys(tmp_path):
    """A checkpoint torch saved with a lone surrogate in a key (pickled as its
    three bytes, "surrogatepass"), and a copy whose key "badQQQ" has bytes that
    are no UTF-8 at all (a damaged .metadata, which torch cannot load)."""
    import torch
    import torch.distributed.checkpoint as dcp
    sd = {"plain": torch.arange(6, dtype=torch.float32).reshape(2, 3),
          "sur\udc80rogate": torch.arange(4, dtype=torch.int64) * 7,
          "caf\u00e9.w": torch.arange(3, dtype=torch.int32),
          "badQQQkey": torch.arange(5, dtype=torch.int16)}
    good, bad = tmp_path / "good", tmp_path / "bad"
    try:
        dcp.save(dict(sd), checkpoint_id=good, no_dist=True)
    except TypeError:
        dcp.save(dict(sd), checkpoint_id=good)
    shutil.copytree(good, bad)
    meta = (bad / ".metadata").read_bytes()
    assert b"QQQ" in meta and b"sur\xed\xb2\x80rogate" in meta
    (bad / ".metadata").write_bytes(meta.replace(b"QQQ", b"\xff\xe2\x82"))
    return sd, good, bad


def test_empty_tensors_with_a_huge_dimension(tmp_path):
    """torch saves and loads torch.empty(2**62, 0): such a key refused the whole
    checkpoint ("z: shape too large"). Every key reads; numpy has no array of
    z's or z2's shape (it bounds the nonzero sizes times the itemsize even with
    no element), so read() says so for that key alone, and a torch tensor or a
    box of it reads."""
    import torch
    import torch.distributed.checkpoint as dcp
    import dcpfs.torch
    sd = {"z": torch.empty(2**62, 0), "z2": torch.empty(0, 2**62, dtype=torch.float64),
          "w": torch.tensor([1.0, 2.0, 3.0])}
    try:
        dcp.save(dict(sd), checkpoint_id=tmp_path / "dcp", no_dist=True)
    except TypeError:
        dcp.save(dict(sd), checkpoint_id=tmp_path / "dcp")
    torch.save(sd, tmp_path / "t.pt")
    for path in (tmp_path / "dcp", tmp_path / "t.pt"):
        for use_catalog in (False, True, True):   # parsed, into the catalog, from it
            with dcpfs.open(path, catalog=use_catalog) as ck:
                assert sorted(ck.keys()) == ["w", "z", "z2"]
                assert (ck.info("z").shape, ck.info("z").nbytes) == ((2**62, 0), 0)
                assert (ck.info("z2").shape, ck.info("z2").dtype, ck.info("z2").nbytes) == ((0, 2**62), "float64", 0)
                w = ck.read("w")
                assert w.dtype == np.float32 and w.tolist() == [1.0, 2.0, 3.0]
                for key, shape, dt in (("z", (2**62, 0), "float32"), ("z2", (0, 2**62), "float64")):
                    with pytest.raises(dcpfs.DcpError) as ei:
                        ck.read(key)
                    assert ei.value.errno == errno.EOVERFLOW
                    assert ei.value.strerror == (
                        f"{ck.path}: {key}: numpy cannot make a {dt} array of shape {shape}: its nonzero sizes "
                        f"times the item size pass numpy's limit, though it has no element; read it with out= a "
                        f"torch tensor of that shape, or read a box of it")
                    out = torch.empty(shape, dtype=getattr(torch, dt))
                    assert ck.read(key, out=out) is out and tuple(out.shape) == shape
                assert ck.read("z", [(5, 3), slice(None)]).shape == (3, 0)
                assert ck.read("z2", [slice(None), (2**62 - 9, 9)]).shape == (0, 9)
    # PyTorch's dcp.load through dcpfs.torch.Reader: shapes kept, w read.
    got = {"z": torch.empty(2**62, 0), "z2": torch.empty(0, 2**62, dtype=torch.float64), "w": torch.zeros(3)}
    try:
        dcp.load(got, storage_reader=dcpfs.torch.Reader(tmp_path / "dcp"), no_dist=True)
    except TypeError:
        dcp.load(got, storage_reader=dcpfs.torch.Reader(tmp_path / "dcp"))
    assert got["w"].tolist() == [1.0, 2.0, 3.0] and tuple(got["z"].shape) == (2**62, 0)
    # dcpfs.torch.load (the collective loader, one process): the same, nothing read for z, z2.
    for path in (tmp_path / "dcp", tmp_path / "t.pt"):
        got = {"z": torch.empty(2**62, 0), "z2": torch.empty(0, 2**62, dtype=torch.float64), "w": torch.zeros(3)}
        stats = dcpfs.torch.load(got, path)
        assert got["w"].tolist() == [1.0, 2.0, 3.0] and stats.bytes_loaded == 12
        assert [tuple(got[k].shape) for k in ("z", "z2")] == [(2**62, 0), (0, 2**62)]


def test_keys_not_utf8(tmp_path):
    """Keys are the str torch loads: a lone surrogate as itself (not its three
    bytes escaped); bytes that are no UTF-8 as U+DC80..DCFF, and found again by it."""
    import torch.distributed.checkpoint as dcp
    sd, good, bad = save_odd_keys(tmp_path)
    torch_keys = list(dcp.FileSystemReader(str(good)).read_metadata().state_dict_metadata)
    with dcpfs.open(good, catalog=False) as ck:
        assert sorted(ck.keys()) == sorted(torch_keys) == sorted(sd)
        for k, v in sd.items():
            assert k in ck and ck.info(k).key == k
            assert np.array_equal(ck[k], v.numpy()), k
    shown = "bad\udcff\udce2\udc82key"
    for use_catalog in (False, True):
        with dcpfs.open(bad, catalog=use_catalog) as ck:
            assert sorted(ck.keys()) == sorted(["plain", "sur\udc80rogate", "caf\u00e9.w", shown])
            assert shown in ck and np.array_equal(ck[shown], sd["badQQQkey"].numpy())
            assert "sur\udc80rogate" in ck and "bad\udcffkey" not in ck
            with pytest.raises(dcpfs.DcpKeyError):
                ck.read("badQQQkey")


FORMATS = ["torch_save", "torch_save_files", "safetensors", "zstd", "hf", "hf_distributed", "hf_consolidated"]
DTENSOR = ["torch_save", "safetensors", "zstd", "ranklocal", "hf"]


def have_zstd():
    try:
        import zstandard  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def saved_formats(tmp_path_factory):
    """tests/interop/save_formats.py's checkpoints (one process writes them all)."""
    out = tmp_path_factory.mktemp("formats")
    variants = [v for v in FORMATS if v != "zstd" or have_zstd()]
    run_generator([INTEROP / "save_formats.py", out, *variants], out / "save.log")
    return out, variants


@pytest.mark.parametrize("variant", FORMATS)
def test_torch_formats(saved_formats, variant):
    import torch
    out, variants = saved_formats
    if variant not in variants:
        pytest.skip("no zstandard module")
    ckpt = out / variant / "ckpt"
    truth = [line.rstrip("\n").split("\t") for line in (out / variant / "truth.tsv").open()]
    with dcpfs.open(ckpt, catalog=False) as ck:
        assert sorted(ck.keys()) == sorted(t[0] for t in truth)
        for key, kind, dtype, shape, want in truth:
            info = ck.info(key)
            assert info.kind == kind, key
            if kind == "bytes":
                assert repr(torch.load(io.BytesIO(ck.read_bytes(key)), weights_only=False)) == want, key
                continue
            assert info.dtype == dtype and list(info.shape) == json.loads(shape), key
            assert sha(ck.read(key).tobytes()) == want, key
            t = torch.empty(info.shape, dtype=getattr(torch, dtype))
            ck.read(key, out=t)
            assert sha(torch_bytes(t)) == want, key
    if variant not in ("torch_save", "torch_save_files", "zstd"):
        return      # torch's default reader loads torch.save records only
    # What torch's own dcp.load puts into tensors of the same shapes (one process, no group).
    import torch.distributed.checkpoint as tdcp
    with dcpfs.open(ckpt, catalog=False) as ck:
        sd = {k: torch.zeros(ck.info(k).shape, dtype=getattr(torch, ck.info(k).dtype))
              for k in ck.keys() if ck.info(k).kind == "tensor"}
        nested = {}
        for k, v in sd.items():
            if k.startswith("extra."):
                nested.setdefault("extra", {})[k.split(".", 1)[1]] = v
            else:
                nested[k] = v
        tdcp.load(nested, checkpoint_id=str(ckpt))
        for k, v in sd.items():
            mine = torch.empty_like(v)
            ck.read(k, out=mine)
            loaded = nested["extra"][k.split(".", 1)[1]] if k.startswith("extra.") else nested[k]
            assert torch_bytes(mine) == torch_bytes(loaded), k


# save_dtensor.py's worker for every variant in one set of 4 forked ranks: torch is imported
# once instead of once per rank and variant (20 imports: minutes on a small machine).
DTENSOR_DRIVER = """
import os, socket, sys
sys.path.insert(0, sys.argv[1])
import save_dtensor
import torch.multiprocessing as mp
out, variants = sys.argv[2], sys.argv[3:]
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
ports = [free_port() for _ in variants]
for v in variants:
    os.makedirs(os.path.join(out, v), exist_ok=True)
def ranks(rank):
    for v, port in zip(variants, ports):
        save_dtensor.worker(rank, port, os.path.join(out, v), v)
mp.start_processes(ranks, nprocs=save_dtensor.WORLD, start_method="fork", join=True)
"""


@pytest.fixture(scope="module")
def saved_dtensors(tmp_path_factory):
    """tests/interop/save_dtensor.py's 4-rank checkpoints."""
    out = tmp_path_factory.mktemp("dtensor")
    variants = [v for v in DTENSOR if v != "zstd" or have_zstd()]
    run_generator(["-c", DTENSOR_DRIVER, INTEROP, out, *variants], out / "save.log")
    return out, variants


@pytest.mark.parametrize("variant", DTENSOR)
def test_torch_dtensor(saved_dtensors, variant):
    import torch
    out, variants = saved_dtensors
    if variant not in variants:
        pytest.skip("no zstandard module")
    truth = json.loads((out / variant / "truth.json").read_text())
    rng = random.Random(variant)
    with dcpfs.open(out / variant / "ckpt", catalog=False) as ck:
        assert set(truth) <= set(ck.keys())
        for key, t in truth.items():
            info = ck.info(key)
            assert info.kind == t["kind"], key
            if t["kind"] == "bytes":
                torch.load(io.BytesIO(ck.read_bytes(key)), weights_only=False)
                continue
            assert info.dtype == t["dtype"] and list(info.shape) == t["shape"], key
            full = ck.read(key)
            assert sha(full.tobytes()) == t["sha256"], key
            tt = torch.empty(info.shape, dtype=getattr(torch, t["dtype"]))
            ck.read(key, out=tt)
            assert sha(torch_bytes(tt)) == t["sha256"], key
            if info.shape and full.size:
                for pairs, slices, index in random_boxes(info.shape, rng, 3):
                    assert ck.read(key, pairs).tobytes() == full[index].tobytes(), (key, pairs)
                    assert ck.read(key, slices).tobytes() == full[index].tobytes(), (key, slices)


def test_torch_single_files(tmp_path):
    """A torch.save file and a safetensors file open as checkpoints too."""
    import torch
    g = torch.Generator().manual_seed(5)
    sd = {"a.w": torch.randn(6, 7, generator=g), "a.b": torch.randn(5, generator=g).bfloat16(),
          "n": torch.tensor(3), "t": torch.randn(4, 9, generator=g).t()}
    torch.save(sd, tmp_path / "model.pt")
    files = [tmp_path / "model.pt"]
    try:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
        files.append(tmp_path / "model.safetensors")
    except ImportError:
        pass
    for f in files:
        with dcpfs.open(f) as ck:
            assert sorted(ck.keys()) == sorted(sd), f
            for k, v in sd.items():
                assert ck.info(k).dtype == str(v.dtype).replace("torch.", "")
                t = torch.empty(v.shape, dtype=v.dtype)
                ck.read(k, out=t)
                assert torch.equal(t, v), (f, k)
                if v.dim() == 2:
                    assert torch.equal(torch.from_numpy(ck.read(k, [(1, 2), slice(-3, None)])).view(v.dtype),
                                       v[1:3, -3:]), (f, k)


def test_torch_save_bytes_items(tmp_path):
    """A bytes value holding a torch.save blob in a torch.save file (what a DCP bytes
    item holds, and what `dcp convert` writes for one) is a bytes item, read in place:
    pickled raw (protocol 3+) or as latin-1 text (protocol 2, torch.save's default),
    shared by two keys (pickle's memo). Other plain values are bytes items too, each
    torch.save of the value as DCP stores one; objects torch.load would rebuild are
    left out."""
    import torch

    def blob(obj):
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    state = blob({"epoch": 7, "lr": 0.5, "name": "caf\u00e9 \xff"})
    other = blob([1, 2, 3])
    assert any(b >= 0x80 for b in state)        # latin-1 text holds two-byte characters
    sd = {"w": torch.arange(6.0), "state": state, "again": state, "other": other,
          "plain": b"not a torch.save blob", "n": 3, "seen": collections.Counter("ab")}
    for proto in (2, 4):
        f = tmp_path / f"p{proto}.pt"
        torch.save(sd, f, pickle_protocol=proto)
        with dcpfs.open(f) as ck:
            assert sorted(ck.keys()) == ["again", "n", "other", "plain", "state", "w"], proto
            for k in ("n", "plain"):
                assert ck.info(k).kind == "bytes", (proto, k)
                assert torch.load(io.BytesIO(ck.read_bytes(k))) == sd[k], (proto, k)
            for k in ("state", "again", "other"):
                assert ck.info(k).kind == "bytes" and ck.info(k).nbytes == len(sd[k]), (proto, k)
                assert ck.read_bytes(k) == sd[k], (proto, k)
            assert torch.load(io.BytesIO(ck["state"]), weights_only=False)["name"] == "caf\u00e9 \xff"
            assert np.array_equal(ck["w"], np.arange(6.0, dtype=np.float32))
    # the text a latin-1 item is decoded from, damaged in the file: an error naming the key, no wrong bytes
    raw = (tmp_path / "p2.pt").read_bytes()
    at = raw.index(state[:64].decode("latin-1").encode("utf-8"))
    bad = bytearray(raw)
    i = next(j for j in range(at, len(raw)) if raw[j] in (0xc2, 0xc3))
    bad[i] = 0xc5                                # a two-byte character latin-1 text never holds
    (tmp_path / "bad.pt").write_bytes(bytes(bad))
    with dcpfs.open(tmp_path / "bad.pt") as ck:
        assert ck.read_bytes("other") == other   # its own text is intact
        with pytest.raises(dcpfs.DcpError) as ei:
            ck.read_bytes("state")
        assert "bad.pt: state: " in str(ei.value) and "not latin-1 text" in str(ei.value)


def test_torch_cuda_out():
    """CUDA destinations go through pinned pieces of at most 64 MiB (small pieces here)."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with dcpfs.open(CK05, catalog=False) as ck:
        full = ck.read("enc.weight")
        t = torch.empty(40, 24, device="cuda")
        ck.read("enc.weight", out=t)
        assert torch.equal(t.cpu(), torch.from_numpy(full))
        old = dcpfs._CUDA_PIECE_BYTES
        try:
            for limit in (4, 100, 96, 97, 3840):
                dcpfs._CUDA_PIECE_BYTES = limit
                t.zero_()
                ck.read("enc.weight", out=t)
                assert torch.equal(t.cpu(), torch.from_numpy(full)), limit
                part = torch.empty(5, 7, device="cuda")
                ck.read("enc.weight", [(3, 5), (2, 7)], out=part)
                assert torch.equal(part.cpu(), torch.from_numpy(full[3:8, 2:9])), limit
        finally:
            dcpfs._CUDA_PIECE_BYTES = old


def test_pieces_cover_the_box():
    """The CUDA path's split: contiguous pieces, in order, covering the box exactly."""
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randrange(0, 4)
        shape = [rng.randrange(1, 7) for _ in range(n)]
        offs = [rng.randrange(0, 3) for _ in range(n)]
        esz = rng.choice([1, 2, 4, 8])
        limit = rng.randrange(1, 200)
        box = np.arange(int(np.prod(shape)) if n else 1).reshape(shape)
        got = np.full(box.size, -1)
        nxt = 0
        for po, pl, start, count in dcpfs._pieces(offs, shape, esz, limit):
            assert start == nxt and count == int(np.prod(pl))
            assert count * esz <= max(limit, esz) or count == 1
            idx = tuple(slice(o - b, o - b + l) for o, b, l in zip(po, offs, pl))
            got[start:start + count] = box[idx].reshape(-1)
            nxt += count
        assert nxt == box.size and (got == box.reshape(-1)).all()


@pytest.mark.parametrize("use_catalog", [False, True], ids=["parsed", "catalog"])
def test_rank_files(tmp_path, use_catalog):
    """A torch-checkpointing folder (tests/data/rankfiles/tc2: model_R.pt and step_R.pt of a
    2-process gloo save by tests/interop/save_rankfiles.py) opens like any checkpoint: keys
    item.key, known values (model.w1 is arange(35), model.strided a transposed local tensor
    per rank), boxes across the two ranks' files equal numpy slices of the whole, the item
    without tensors is rank 0's file; a truncated rank file is an error naming it."""
    src = SRC / "tests" / "data" / "rankfiles" / "tc2"
    cat = str(tmp_path / "catalog.sqlite")
    with dcpfs.open(src, catalog=use_catalog, catalog_path=cat) as ck:
        keys = ck.keys()
        assert "model.w0" in keys and "step" in keys and "model.fsdp.0.weight" in keys
        w1 = ck.read("model.w1")
        assert w1.dtype == np.float32 and w1.shape == (7, 5)
        assert np.array_equal(w1, np.arange(35, dtype=np.float32).reshape(7, 5))
        strided = ck.read("model.strided")
        want = np.concatenate([(np.arange(24, dtype=np.float32).reshape(3, 8) + 100 * r).T for r in (0, 1)])
        assert np.array_equal(strided, want)
        w0 = ck.read("model.w0")
        assert w0.shape == (10, 6)
        assert np.array_equal(ck.read("model.w0", box=[(3, 4), (1, 5)]), w0[3:7, 1:6])
        assert ck.read_bytes("step") == (src / "step_0.pt").read_bytes()
    bad = tmp_path / "tc2"
    shutil.copytree(src, bad)
    with open(bad / "model_1.pt", "r+b") as f:
        f.truncate(1500)
    with pytest.raises(dcpfs.DcpError) as ei:
        dcpfs.open(bad, catalog=use_catalog, catalog_path=cat)
    assert f"{bad}/model_1.pt" in str(ei.value)
