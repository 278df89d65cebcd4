"""dcpfs.torch.Reader under torch.distributed.checkpoint.load.

(a) FSDP2 model + Adam state saved by torch on 2 and 4 ranks, loaded on the
    same and the other rank count, through Reader and through torch's
    FileSystemReader: equal exactly, and equal to the saved full tensors.
(b) 2-D mesh DTensors with uneven shards, resharded to other placements and
    to a 1-D mesh on 2 ranks.
(c) every fixture (PyTorch 1.13 saves) against its manifest, on one process;
    torch's own reader fails on them.
(d) damaged .metadata, missing shard file: every rank raises, no hang.
Plus non-tensor items of a plain state dict, and a timing against
FileSystemReader (printed, not asserted).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

sys.path.insert(0, os.path.dirname(__file__))
import dist as distrun  # noqa: E402  (python/tests/dist.py)

import dcpfs  # noqa: E402
import dcpfs.torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


# -- helpers (module level: the spawned ranks import them) ----------------

def _flat(sd):
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    return flatten_state_dict(sd)[0]


def _dtensor_api():
    """torch.distributed.tensor (2.5+), or where DTensor lived before (2.4)."""
    try:
        from torch.distributed.tensor import DTensor  # noqa: F401
        import torch.distributed.tensor as api
    except ImportError:
        import torch.distributed._tensor as api
    return api


def _local(v):
    return v.to_local() if isinstance(v, _dtensor_api().DTensor) else v


def _full(v):
    return v.full_tensor() if isinstance(v, _dtensor_api().DTensor) else v


def _same(a, b, what: str) -> None:
    """Exactly equal: tensors bit for bit (dtype, shape, values), others by ==."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), what
        assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a.cpu(), b.cpu()), f"{what}: values differ"
    else:
        assert a == b, f"{what}: {a!r} != {b!r}"


def _same_sd(got: dict, want: dict, local: bool, what: str) -> None:
    g, w = _flat(got), _flat(want)
    assert set(g) == set(w), f"{what}: keys differ: {set(g) ^ set(w)}"
    for k in w:
        a, b = (_local(g[k]), _local(w[k])) if local else (g[k], w[k])
        _same(a, b, f"{what}: {k}")


# -- (a) FSDP2 -------------------------------------------------------------

class _Net(torch.nn.Module):
    """Odd sizes: on 4 ranks the shards are uneven and one is empty."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(13, 7)
        self.l1 = torch.nn.Linear(7, 11)
        self.l2 = torch.nn.Linear(11, 5)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(self.emb(x))))


def _fsdp_model(world: int, seed: int):
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:   # before 2.6 (and on the CPU FSDP2 needs 2.7: the callers skip)
        from torch.distributed._composable.fsdp import fully_shard
    torch.manual_seed(seed)
    model = _Net()
    mesh = init_device_mesh("cpu", (world,))
    fully_shard(model.l1, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, opt


def _fsdp_state(model, opt) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "extra": {"epoch": 3, "name": "run-7", "tags": [1, "a", 2.5]}}


def _fsdp_save(rank: int, world: int, path: str) -> dict:
    model, opt = _fsdp_model(world, seed=1)
    torch.manual_seed(2)
    x = torch.randint(0, 13, (6,))
    model(x).sum().backward()
    opt.step()
    sd = _fsdp_state(model, opt)
    dcp.save(sd, checkpoint_id=path)
    return {k: _full(v).clone() if isinstance(_full(v), torch.Tensor) else v for k, v in _flat(sd).items()}


def _fsdp_load_both(rank: int, world: int, path: str, want: dict) -> None:
    sds = {}
    for name, reader in (("dcpfs", dcpfs.torch.Reader(path)), ("torch", FileSystemReader(path))):
        model, opt = _fsdp_model(world, seed=100 + len(sds))   # other values than the saved ones
        sd = _fsdp_state(model, opt)
        dcp.load(sd, storage_reader=reader)
        sds[name] = sd
    _same_sd(sds["dcpfs"], sds["torch"], local=True, what=f"rank {rank}/{world}: Reader vs FileSystemReader")
    got = _flat(sds["dcpfs"])
    assert set(got) == set(want)
    for k, v in got.items():
        _same(_full(v), want[k], f"rank {rank}/{world}: {k} vs the saved value")
    # and the model takes it
    from torch.distributed.checkpoint.state_dict import set_state_dict
    model, opt = _fsdp_model(world, seed=5)
    set_state_dict(model, opt, model_state_dict=sds["dcpfs"]["model"], optim_state_dict=sds["dcpfs"]["optim"])


def _fsdp_run(rank: int, world: int, save_to: str, load_from: list, wants: dict):
    saved = _fsdp_save(rank, world, save_to) if save_to else None
    for path in load_from:
        _fsdp_load_both(rank, world, path, saved if path == save_to else wants[path])
    return saved if rank == 0 else None


# FSDP2 runs on the CPU (gloo) from torch 2.7 on; before, it needs CUDA streams.
needs_cpu_fsdp2 = pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 7),
                                     reason=f"FSDP2 on the CPU needs torch >= 2.7, this is {torch.__version__}")


@needs_cpu_fsdp2
def test_fsdp2_resharding(tmp_path):
    p2, p4 = str(tmp_path / "fsdp2"), str(tmp_path / "fsdp4")
    want2 = distrun.run(2, _fsdp_run, p2, [p2], {})[0]          # save 2, load 2
    want4 = distrun.run(4, _fsdp_run, p4, [p4, p2], {p2: want2})[0]   # save 4, load 4, 2 -> 4
    distrun.run(2, _fsdp_run, None, [p4], {p4: want4})         # 4 -> 2
    assert any(k.endswith(".step") for k in want2), sorted(want2)
    assert want2["extra.epoch"] == 3 and want2["extra.tags"] == [1, "a", 2.5]


# -- (b) 2-D mesh DTensors -------------------------------------------------

_SHAPES = {"a": (13, 7), "b": (5, 11, 3), "c": (9,)}


def _full_values() -> dict:
    g = torch.Generator().manual_seed(7)
    return {
        "a": torch.randn(_SHAPES["a"], generator=g),
        "b": torch.randint(-1000, 1000, _SHAPES["b"], generator=g, dtype=torch.int32),
        "c": torch.randn(_SHAPES["c"], generator=g).to(torch.bfloat16),
    }


def _dtensors(world: int, layout: str, fill_zero: bool) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    api = _dtensor_api()
    Replicate, Shard, distribute_tensor = api.Replicate, api.Shard, api.distribute_tensor
    full = _full_values()
    if fill_zero:
        full = {k: torch.zeros_like(v) for k, v in full.items()}
    if layout == "save":       # 2x2 mesh
        mesh = init_device_mesh("cpu", (2, 2))
        pl = {"a": [Shard(0), Shard(1)], "b": [Replicate(), Shard(0)], "c": [Shard(0), Replicate()]}
    elif layout == "other":    # 2x2 mesh, other placements
        mesh = init_device_mesh("cpu", (2, 2))
        pl = {"a": [Shard(1), Shard(0)], "b": [Shard(2), Shard(1)], "c": [Replicate(), Shard(0)]}
    else:                      # 1-D mesh
        mesh = init_device_mesh("cpu", (world,))
        pl = {"a": [Shard(1)], "b": [Shard(0)], "c": [Shard(0)]}
    return {k: distribute_tensor(v, mesh, pl[k]) for k, v in full.items()}


def _dtensor_run(rank: int, world: int, path: str, save: bool, layout: str):
    if save:
        dcp.save({"t": _dtensors(world, "save", False), "n": 11}, checkpoint_id=path)
    full = _full_values()
    sds = {}
    for name, reader in (("dcpfs", dcpfs.torch.Reader(path)), ("torch", FileSystemReader(path))):
        sd = {"t": _dtensors(world, layout, True), "n": 0}
        dcp.load(sd, storage_reader=reader)
        sds[name] = sd
    _same_sd(sds["dcpfs"], sds["torch"], local=True, what=f"rank {rank}/{world} {layout}")
    assert sds["dcpfs"]["n"] == 11
    for k, v in sds["dcpfs"]["t"].items():
        _same(v.full_tensor(), full[k], f"rank {rank}/{world} {layout}: {k}")
    return True


def test_dtensor_2d_mesh(tmp_path):
    path = str(tmp_path / "dt")
    distrun.run(4, _dtensor_run, path, True, "other")
    distrun.run(2, _dtensor_run, path, False, "1d")


# -- (c) fixtures: PyTorch 1.13 saves --------------------------------------

def _fixture_cases():
    return sorted(p.name for p in FIXTURES.iterdir() if (p / "ckpt").is_dir() and (p / "expected" / "manifest.json").is_file())


def _zeros_for(manifest: dict) -> dict:
    sd = {}
    for e in manifest["entries"]:
        if e["kind"] == "tensor":
            sd[e["key"]] = torch.zeros(e["shape"], dtype=getattr(torch, e["dtype"]))
        else:
            sd[e["key"]] = None
    return sd


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


class _RecordingPlanner(DefaultLoadPlanner):
    """Records the sha256 of every bytes item's stored bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes_sha: dict = {}

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        self.bytes_sha[read_item.dest_index.fqn] = hashlib.sha256(value.getvalue()).hexdigest()
        try:
            super().load_bytes(read_item, value)
        except ModuleNotFoundError:      # a pickled class of a package not installed (megatron)
            from torch.distributed.checkpoint._traverse import set_element
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], value.getvalue())


@pytest.mark.parametrize("case", _fixture_cases())
def test_fixture(case):
    m = json.loads((FIXTURES / case / "expected" / "manifest.json").read_text())
    sd = _zeros_for(m)
    planner = _RecordingPlanner()
    dcp.load(sd, storage_reader=dcpfs.torch.Reader(FIXTURES / case / "ckpt"), planner=planner)
    for e in m["entries"]:
        v = sd[e["key"]]
        if e["kind"] == "tensor":
            assert v.dtype == getattr(torch, e["dtype"]) and list(v.shape) == e["shape"], e["key"]
            assert _sha(v) == e["sha256"], f"{case}: {e['key']}: values differ from the manifest"
        else:
            assert planner.bytes_sha[e["key"]] == e["sha256"], f"{case}: {e['key']}: stored bytes differ"
            if "repr" in e:
                assert repr(v) == e["repr"], e["key"]


def test_torch_own_reader_fails_on_1_13():
    """Why Reader matters: torch 2.13's FileSystemReader cannot load a 1.13 save."""
    case = FIXTURES / "05_mixed_2ranks"
    m = json.loads((case / "expected" / "manifest.json").read_text())
    sd = _zeros_for(m)
    try:
        dcp.load(sd, storage_reader=FileSystemReader(case / "ckpt"))
    except BaseException as e:  # CheckpointException is a BaseException
        assert "BytesStorageMetadata" in str(e) or "KeyError" in str(e), str(e)
        return
    # it read it after all (a newer torch): then it must agree with Reader
    ours = _zeros_for(m)
    dcp.load(ours, storage_reader=dcpfs.torch.Reader(case / "ckpt"))
    for k in ours:
        _same(ours[k], sd[k], k)


# -- non-tensor items of a plain state dict --------------------------------

def test_plain_nontensor_roundtrip(tmp_path):
    sd = {
        "w": torch.arange(12, dtype=torch.float64).reshape(3, 4),
        "n": 42, "s": "hello", "l": [1, "two", 3.0], "f": 0.25, "none": None,
        "nested": {"a": {"b": 7, "c": "x"}, "t": torch.tensor([1, 2, 3], dtype=torch.int16), "lst": [1, [2, 3]]},
    }
    dcp.save(sd, checkpoint_id=tmp_path / "plain")
    got = {"w": torch.zeros(3, 4, dtype=torch.float64), "n": 0, "s": "", "l": [], "f": 0.0, "none": 1,
           "nested": {"a": {"b": 0, "c": ""}, "t": torch.zeros(3, dtype=torch.int16), "lst": []}}
    dcp.load(got, storage_reader=dcpfs.torch.Reader(tmp_path / "plain", threads=1))
    _same_sd(got, sd, local=False, what="plain")
    assert got["nested"]["lst"] == [1, [2, 3]]


def test_planner_data_rebuilds_nesting(tmp_path):
    """Metadata.planner_data is the checkpoint's own (it was None): torch's
    _EmptyStateDictLoadPlanner (dcp_to_torch_save) and
    _load_state_dict_from_keys rebuild the nested state dict through Reader
    as through FileSystemReader, not a dict of flat keys (a dotted key in a
    dict stays one key; a list index an int)."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict, _load_state_dict_from_keys
    sd = {"model": {"layers.0.w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)},
          "optim": {"state": {"0": {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
          "extra": {"tags": [1, torch.tensor([7, 8]), "a"]}, "epoch": 4}
    path = tmp_path / "nested"
    dcp.save(sd, checkpoint_id=path)
    md, want_md = dcpfs.torch.Reader(path).read_metadata(), FileSystemReader(path).read_metadata()
    assert dict(md.planner_data) == want_md.planner_data
    assert md.planner_data["model.layers.0.w"] == ("model", "layers.0.w")
    assert md.planner_data["extra.tags.1"] == ("extra", "tags", 1)
    assert dict(pickle.loads(pickle.dumps(md)).planner_data) == want_md.planner_data
    for keys in (None, ["model"], ["extra.tags"]):
        got, want = {}, {}
        _load_state_dict(got, storage_reader=dcpfs.torch.Reader(path), planner=_EmptyStateDictLoadPlanner(keys=keys),
                         no_dist=True)
        _load_state_dict(want, storage_reader=FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(keys=keys),
                         no_dist=True)
        assert set(got) == set(want) and set(want) <= {"model", "optim", "extra", "epoch"}, (keys, list(got))
        _same_sd(got, want, local=False, what=f"keys={keys}")
    got = _load_state_dict_from_keys({"model", "extra"}, storage_reader=dcpfs.torch.Reader(path))
    assert set(got) == {"model", "extra"} and set(got["model"]) == {"layers.0.w", "b"}
    _same(got["extra"]["tags"][1], torch.tensor([7, 8]), "extra.tags.1")
    # no planner_data to read (rank-local metadata, a single file): keys stay flat, as torch's planner keeps them
    torch.save({"a": {"b": torch.ones(2)}}, tmp_path / "f.pt")
    assert dict(dcpfs.torch.Reader(tmp_path / "f.pt").read_metadata().planner_data) == {}


@pytest.mark.parametrize("threads", [1, 3])
def test_cast_and_noncontiguous(tmp_path, threads):
    """Targets of another dtype or not contiguous go through a temporary."""
    full = torch.randn(6, 10)
    dcp.save({"x": full, "y": full.to(torch.bfloat16)}, checkpoint_id=tmp_path / "c")
    base = torch.zeros(10, 6)
    got = {"x": base.t(), "y": torch.zeros(6, 10, dtype=torch.float32)}   # transposed view; bf16 -> f32
    dcp.load(got, storage_reader=dcpfs.torch.Reader(tmp_path / "c", threads=threads))
    _same(got["x"].contiguous(), full, "x")
    _same(got["y"], full.to(torch.bfloat16).to(torch.float32), "y")


@pytest.mark.parametrize("threads", [1, 3])
def test_conj_neg_targets_and_versions(tmp_path, threads):
    """Conj and neg views are filled through a temporary, with the stored
    values, as FileSystemReader fills them; a tensor filled in place (a
    Parameter here) has its autograd version counter bumped, as copy_ would."""
    c = torch.tensor([1 + 2j, 3 - 4j, -5j], dtype=torch.complex64)
    w = torch.arange(6.0).reshape(2, 3)
    dcp.save({"c": c, "w": w, "p": w + 1}, checkpoint_id=tmp_path / "cn")
    for reader in (dcpfs.torch.Reader(tmp_path / "cn", threads=threads), FileSystemReader(tmp_path / "cn")):
        p = torch.nn.Parameter(torch.zeros(2, 3))
        got = {"c": torch.zeros(3, dtype=torch.complex64).conj(), "w": torch.zeros(2, 3)._neg_view(), "p": p}
        dcp.load(got, storage_reader=reader)
        assert got["c"].is_conj() and got["w"].is_neg()
        assert got["c"].tolist() == c.tolist(), (type(reader).__name__, got["c"])
        _same(got["w"].resolve_neg(), w, "w")
        _same(p.detach(), w + 1, "p")
        assert p._version > 0, type(reader).__name__


def test_validate_and_metadata(tmp_path):
    ck = FIXTURES / "05_mixed_2ranks" / "ckpt"
    assert dcpfs.torch.Reader.validate_checkpoint_id(ck)
    assert not dcpfs.torch.Reader.validate_checkpoint_id(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not dcpfs.torch.Reader.validate_checkpoint_id(empty)
    md = dcpfs.torch.Reader(ck).read_metadata()
    t = md.state_dict_metadata["enc.weight"]
    assert t.properties.dtype == torch.float32 and t.size == torch.Size([40, 24])
    assert [tuple(c.offsets) for c in t.chunks] == [(0, 0), (20, 0)]
    assert type(md.state_dict_metadata["epoch"]).__name__ == "BytesStorageMetadata"
    assert md.storage_data["reader"] == "dcpfs"
    # the same model without the catalog
    md2 = dcpfs.torch.Reader(ck, catalog=False).read_metadata()
    assert md2.state_dict_metadata == md.state_dict_metadata


def test_validate_writes_no_catalog(tmp_path, monkeypatch):
    """validate_checkpoint_id parses the checkpoint without the catalog: it
    records nothing for a user who reads with catalog=False."""
    src = FIXTURES / "05_mixed_2ranks" / "ckpt"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    catalog = tmp_path / "cache" / "dcpfs" / "catalog.sqlite"
    assert dcpfs.torch.Reader.validate_checkpoint_id(src)
    assert not catalog.exists(), "validate_checkpoint_id created the catalog"
    assert not (tmp_path / "cache").exists(), sorted(str(p) for p in (tmp_path / "cache").rglob("*"))
    # the catalog is where this test looks: an open with it on records the checkpoint there
    with dcpfs.open(src) as ck:
        assert not ck.meta["from_catalog"]
    assert catalog.is_file()
    with dcpfs.open(src) as ck:
        assert ck.meta["from_catalog"]


def test_reset_and_reuse(tmp_path):
    """dcp.load(checkpoint_id=...) resets the reader onto that folder; a
    reader serves one load after another."""
    for i in (1, 2):
        dcp.save({"v": torch.full((3,), float(i))}, checkpoint_id=tmp_path / str(i))
    reader = dcpfs.torch.Reader(tmp_path / "does-not-exist")
    for i in (1, 2):
        got = {"v": torch.zeros(3)}
        dcp.load(got, checkpoint_id=tmp_path / str(i), storage_reader=reader)
        _same(got["v"], torch.full((3,), float(i)), f"load {i}")
        assert reader.checkpoint_id == str(tmp_path / str(i))
    got = {"v": torch.zeros(3)}
    dcp.load(got, storage_reader=reader)           # again, same folder
    _same(got["v"], torch.full((3,), 2.0), "again")


# -- (d) hostile inputs on 2 ranks -----------------------------------------

def _hostile_run(rank: int, world: int, path: str):
    m = json.loads((FIXTURES / "05_mixed_2ranks" / "expected" / "manifest.json").read_text())
    sd = _zeros_for(m)
    try:
        dcp.load(sd, storage_reader=dcpfs.torch.Reader(path))
    except BaseException as e:
        return f"{type(e).__name__}: {e}"
    return None


def _hostile_copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / "05_mixed_2ranks" / "ckpt", dst)
    return dst


@pytest.mark.parametrize("damage", ["truncated", "flipped", "missing_shard"])
def test_hostile(tmp_path, damage):
    ck = _hostile_copy(tmp_path, damage)
    md = ck / ".metadata"
    data = bytearray(md.read_bytes())
    if damage == "truncated":
        md.write_bytes(bytes(data[: len(data) // 2]))
        where, reason = ".metadata", "truncated"
    elif damage == "flipped":
        data[0] ^= 0xFF                  # the pickle's PROTO opcode
        md.write_bytes(bytes(data))
        where, reason = ".metadata", "pickle"
    else:
        (ck / "__1_0.distcp").unlink()   # rank 1's chunk of enc.weight
        where, reason = "__1_0.distcp", "missing"
    errs = distrun.run(2, _hostile_run, str(ck), timeout=60)
    for rank, err in enumerate(errs):
        assert err is not None, f"rank {rank}: dcp.load succeeded on a damaged checkpoint"
        assert "CheckpointException" in err, err
        assert where in err and reason in err, f"rank {rank}: {err}"
        if damage == "missing_shard":
            assert "enc.weight" in err, err


# -- rank-local saves whose ranks disagree ------------------------------------

def _has_rank_local_save() -> bool:
    import inspect
    return "use_collectives" in inspect.signature(dcp.save).parameters


needs_rank_local = pytest.mark.skipif(not _has_rank_local_save(),
                                      reason=f"torch {torch.__version__}: dcp.save has no use_collectives (2.9+)")

RL_FULL = torch.arange(24, dtype=torch.float32).reshape(6, 4)


def _rl_state(rank: int, world: int, value: bool):
    """rank's state dict: per-rank values under shared keys (a tensor, an int, a
    nested non-tensor value), a replicated tensor, a key of its own and a row
    shard of a DTensor; zeros/None to load into when not value."""
    api = _dtensor_api()
    base = torch.linspace(0, 1, 10, dtype=torch.float64).reshape(2, 5)
    mesh = api.DeviceMesh("cpu", list(range(world))) if world > 1 else None
    rows = api.distribute_tensor(RL_FULL if value else torch.zeros_like(RL_FULL), mesh, [api.Shard(0)]) \
        if mesh is not None else None
    sd = {"model": {"w": base + rank if value else torch.zeros_like(base),
                    "b": torch.full((3,), rank, dtype=torch.bfloat16) if value else torch.zeros(3, dtype=torch.bfloat16),
                    "same": torch.arange(4, dtype=torch.int32) if value else torch.zeros(4, dtype=torch.int32),
                    f"only{rank}": torch.full((2,), 10.0 + rank) if value else torch.zeros(2)},
          "x": rank if value else -1,
          "cfg": {"name": f"rank {rank}", "seeds": [rank, rank * 7]} if value else {"name": "", "seeds": None}}
    if rows is not None:
        sd["rows"] = rows
    return sd


def _rl_save(rank: int, world: int, path: str) -> None:
    from torch.distributed.checkpoint import FileSystemWriter
    dcp.save(_rl_state(rank, world, True), storage_writer=FileSystemWriter(path), use_collectives=False)
    dist.barrier()


def _rl_load_both(rank: int, world: int, path: str):
    """dcp.load through torch's FileSystemReader and through dcpfs.torch.Reader: the same state dict."""
    theirs, ours = _rl_state(rank, world, False), _rl_state(rank, world, False)
    dcp.load(theirs, storage_reader=FileSystemReader(path))
    reader = dcpfs.torch.Reader(path)
    dcp.load(ours, storage_reader=reader)
    _same_sd(ours, theirs, local=True, what=f"rank {rank}: dcpfs.torch.Reader vs FileSystemReader")
    want = _rl_state(rank, world, True)
    _same_sd(ours, want, local=True, what=f"rank {rank}: vs what rank {rank} saved")
    return reader.view_rank


@needs_rank_local
def test_rank_local_per_rank_values(tmp_path):
    """A rank-local save (use_collectives=False) where the ranks saved different
    values under the same keys: torch's dcp.load gives each rank its own
    __R.metadata's; dcpfs.torch.Reader gives the same, bit for bit (torch asks
    read_metadata(rank=R) once read_metadata() refused the merged view)."""
    path = str(tmp_path / "rl")
    distrun.run(2, _rl_save, path, timeout=90)
    assert sorted(f for f in os.listdir(path) if f.endswith(".metadata")) == ["__0.metadata", "__1.metadata"]
    assert distrun.run(2, _rl_load_both, path, timeout=90) == [0, 1]
    # The merged view names what several ranks saved; each rank's view holds its own values.
    with dcpfs.open(path, catalog=False) as ck:
        assert sorted(ck._replicated_keys()) == ["cfg.name", "cfg.seeds", "model.b", "model.same", "model.w", "x"]
        assert not ck.replicated("rows") and not ck.replicated("model.only1")
    for r in (0, 1):
        with dcpfs.open(path, rank=r) as ck:
            assert ck._replicated_keys() == [] and f"model.only{r}" in ck and f"model.only{1 - r}" not in ck
            assert ck.meta["files"] == [f"__{r}_0.distcp"] and ck.meta["layout"] == f"rank-local __R.metadata, rank {r}'s view"
            assert torch.load(io.BytesIO(ck.read_bytes("x")), weights_only=False) == r
            assert np.array_equal(ck.read("model.w"), (torch.linspace(0, 1, 10, dtype=torch.float64).reshape(2, 5) + r).numpy())
    with pytest.raises(dcpfs.DcpError, match="__2.metadata: no such file"):
        dcpfs.open(path, rank=2)
    # One process (no process group): torch reads rank 0's file; so does the Reader.
    theirs, ours = _rl_state(0, 1, False), _rl_state(0, 1, False)
    dcp.load(theirs, storage_reader=FileSystemReader(path), no_dist=True)
    reader = dcpfs.torch.Reader(path)
    dcp.load(ours, storage_reader=reader, no_dist=True)
    assert reader.view_rank == 0
    _same_sd(ours, theirs, local=False, what="one process: dcpfs.torch.Reader vs FileSystemReader")
    _same_sd(ours, _rl_state(0, 1, True), local=False, what="one process: rank 0's values")
    # Without rank=, the Reader refuses the merged view (it is no global .metadata), naming a key.
    with pytest.raises(dcpfs.DcpError, match="rank-local checkpoint .* several ranks saved 'model.w' and 5 other keys"):
        dcpfs.torch.Reader(path).read_metadata()
    md = dcpfs.torch.Reader(path).read_metadata(rank=1)
    assert "model.only1" in md.state_dict_metadata and "model.only0" not in md.state_dict_metadata
    assert md.state_dict_metadata["rows"].chunks[0].offsets == torch.Size([3, 0])


def _rl_save_disjoint(rank: int, world: int, path: str) -> None:
    from torch.distributed.checkpoint import FileSystemWriter
    api = _dtensor_api()
    mesh = api.DeviceMesh("cpu", list(range(world)))
    dcp.save({"rows": api.distribute_tensor(RL_FULL, mesh, [api.Shard(0)]), f"only{rank}": torch.full((2,), rank)},
             storage_writer=FileSystemWriter(path), use_collectives=False)
    dist.barrier()


@needs_rank_local
def test_rank_local_disjoint_is_one_view(tmp_path):
    """A rank-local save whose ranks saved disjoint boxes is one global view: the
    Reader reads it whole (here on one process: every row, both ranks' keys)."""
    path = str(tmp_path / "rl")
    distrun.run(2, _rl_save_disjoint, path, timeout=90)
    got = {"rows": torch.zeros(6, 4), "only0": torch.zeros(2, dtype=torch.int64),
           "only1": torch.zeros(2, dtype=torch.int64)}
    reader = dcpfs.torch.Reader(path)
    dcp.load(got, storage_reader=reader, no_dist=True)
    assert reader.view_rank is None
    _same(got["rows"], RL_FULL, "rows")
    _same(got["only1"], torch.full((2,), 1), "only1")


# -- timing (printed) --------------------------------------------------------

@pytest.mark.skipif(not os.environ.get("DCPFS_BENCH_READER"), reason="set DCPFS_BENCH_READER=1 to time Reader")
def test_time_against_filesystemreader(tmp_path):
    n = 16
    sd = {f"layer{i}.w": torch.randn(2048, 2048) for i in range(n)}     # 16 x 16 MiB = 256 MiB
    dcp.save(sd, checkpoint_id=tmp_path / "big")
    readers = [("FileSystemReader", lambda: FileSystemReader(tmp_path / "big"))]
    for threads in (1, 2, 4):
        readers.append((f"dcpfs.torch.Reader(threads={threads})",
                        lambda t=threads: dcpfs.torch.Reader(tmp_path / "big", threads=t)))
    for name, make in readers:
        best = 1e9
        for _ in range(5):
            dst = {k: torch.empty_like(v) for k, v in sd.items()}
            t0 = time.perf_counter()
            dcp.load(dst, storage_reader=make())
            best = min(best, time.perf_counter() - t0)
        assert all(torch.equal(dst[k], sd[k]) for k in sd)
        print(f"\n256 MiB, 1 rank, warm cache, best of 5: {name}: {best:.3f} s ({256 / best:.0f} MiB/s)")
