"""dcpfs.torch.load: the read-once collective load over torch.distributed.

The same cases as test_reader.py (FSDP2 + Adam with resharding, 2-D mesh
DTensors with uneven shards, the 1.13 fixtures, hostile inputs), loaded with
dcpfs.torch.load and compared with PyTorch's own dcp.load; and what only the
collective load promises: every stored byte read once across the job
(bytes_read summed over ranks equals bytes_unique, also when every rank
needs every byte), and errors agreed on every rank with the same message.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

sys.path.insert(0, os.path.dirname(__file__))
import dist as distrun  # noqa: E402  (python/tests/dist.py)
import test_reader as tr  # noqa: E402  (the models, states and comparisons the Reader tests use)

import dcpfs  # noqa: E402
import dcpfs.torch  # noqa: E402


def _save_one_process(sd, path) -> None:
    """torch's own save without a process group (no_dist: a keyword from torch 2.5 on)."""
    try:
        dcp.save(sd, checkpoint_id=path, no_dist=True)
    except TypeError:
        dcp.save(sd, checkpoint_id=path)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def _stats_sum(stats: list) -> dict:
    return {k: sum(getattr(s, k) for s in stats) for k in ("bytes_read", "bytes_sent", "bytes_received")}


# -- FSDP2 + Adam, resharding ------------------------------------------------

def _fsdp_collective(rank: int, world: int, save_to: str, load_from: list, wants: dict):
    saved = tr._fsdp_save(rank, world, save_to) if save_to else None
    stats = []
    for path in load_from:
        want = saved if path == save_to else wants[path]
        model, opt = tr._fsdp_model(world, seed=300)
        ours = tr._fsdp_state(model, opt)
        stats.append(dcpfs.torch.load(ours, path))
        model, opt = tr._fsdp_model(world, seed=301)
        theirs = tr._fsdp_state(model, opt)
        dcp.load(theirs, storage_reader=FileSystemReader(path))
        tr._same_sd(ours, theirs, local=True, what=f"rank {rank}/{world}: dcpfs.torch.load vs dcp.load")
        for k, v in tr._flat(ours).items():
            tr._same(tr._full(v), want[k], f"rank {rank}/{world}: {k} vs the saved value")
    return saved if rank == 0 else None, stats


@tr.needs_cpu_fsdp2
def test_fsdp2_resharding(tmp_path):
    p2, p4 = str(tmp_path / "fsdp2"), str(tmp_path / "fsdp4")
    want2, stats = distrun.run(2, _fsdp_collective, p2, [p2], {})[0]
    res = distrun.run(4, _fsdp_collective, p4, [p4, p2], {p2: want2})
    want4 = res[0][0]
    for i in range(2):      # each load: every stored byte it needed read once across the 4 ranks
        per = [r[1][i] for r in res]
        assert sum(s.bytes_read for s in per) == per[0].bytes_unique > 0
    distrun.run(2, _fsdp_collective, None, [p4], {p4: want4})
    assert stats[0].bytes_unique > 0


# -- 2-D mesh DTensors, uneven shards -----------------------------------------

def _dtensor_collective(rank: int, world: int, path: str, save: bool, layout: str):
    if save:
        dcp.save(tr._dtensors(world, "save", fill_zero=False), checkpoint_id=path)
        dist.barrier()
    sd = tr._dtensors(world, layout, fill_zero=True)
    st = dcpfs.torch.load(sd, path)
    full = tr._full_values()
    for k, v in sd.items():
        tr._same(v.full_tensor(), full[k], f"rank {rank}/{world} ({layout}): {k}")
    return st


def test_dtensor_2d_uneven(tmp_path):
    path = str(tmp_path / "mesh")
    st = distrun.run(4, _dtensor_collective, path, True, "other")
    assert sum(s.bytes_read for s in st) == st[0].bytes_unique
    st = distrun.run(2, _dtensor_collective, path, False, "1d")
    assert sum(s.bytes_read for s in st) == st[0].bytes_unique


def _dtensor_collective_old_torch(rank: int, world: int, path: str):
    """As torch before 2.5 shows itself: no DTensor in torch.distributed.tensor."""
    import importlib
    real = importlib.import_module

    def import_module(name, *a, **k):   # hidden from dcpfs only: torch's own shims still find it
        if name.startswith("torch.distributed.tensor") and sys._getframe(1).f_globals.get("__name__") == "dcpfs._collective":
            raise ImportError(f"{name} (hidden: torch < 2.5 keeps DTensor in torch.distributed._tensor)")
        return real(name, *a, **k)
    importlib.import_module = import_module
    try:
        return _dtensor_collective(rank, world, path, False, "1d")
    finally:
        importlib.import_module = real


def test_dtensor_before_torch_2_5(tmp_path):
    """DTensors are found where torch 2.4 and older keep them: without, a DTensor's global box
    was read into its local shard (EFAULT, or worse)."""
    path = str(tmp_path / "mesh")
    distrun.run(4, _dtensor_collective, path, True, "other")
    st = distrun.run(2, _dtensor_collective_old_torch, path)
    assert sum(s.bytes_read for s in st) == st[0].bytes_unique


# -- read once, delivered: replicate on 4 ranks ---------------------------------

def _replicate(rank: int, world: int, path: str, node_sharing: str = "page_cache", direct: bool = False):
    want = {k: v for k, v in tr._full_values().items()}
    sd = {k: torch.zeros_like(v) for k, v in want.items()}
    sd["meta"] = {"step": -1}
    # a destination of another dtype (cast, as dcp.load does) and a non-contiguous one
    sd["a"] = torch.zeros(want["a"].shape, dtype=torch.float64)
    big = torch.zeros(want["b"].shape[::-1], dtype=torch.int32)
    sd["b"] = big.permute(2, 1, 0)
    # tiny units and batches: many rounds, deliveries, and a plan per key
    st = dcpfs.torch.load(sd, path, staging_bytes=256, plan_ops=1, node_sharing=node_sharing, direct=direct)
    tr._same(sd["a"], want["a"].double(), "a (cast to float64)")
    tr._same(sd["b"].contiguous(), want["b"], "b (non-contiguous destination)")
    tr._same(sd["c"], want["c"], "c")
    assert sd["meta"] == {"step": 42}, sd["meta"]
    return st


def _evict(path: str | Path) -> None:
    """Drop the files of folder path from the page cache. Each is fsync'ed
    first: a checkpoint written just now has dirty pages, which stay."""
    for f in os.listdir(path):
        fd = os.open(os.path.join(path, f), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@pytest.mark.parametrize("node_sharing,direct", [("page_cache", False), ("staging", False),
                                                 ("page_cache", True), ("staging", True)])
def test_replicate_read_once(tmp_path, node_sharing, direct):
    """direct with staging: readers read into shared staging slots with
    room for O_DIRECT's blocks, and node peers find each unit's first byte
    inside its slot."""
    path = str(tmp_path / "plain")
    sd = dict(tr._full_values())
    sd["meta"] = {"step": 42}
    _save_one_process(sd, path)
    _evict(path)
    st = distrun.run(4, _replicate, path, node_sharing, direct)
    total = _stats_sum(st)
    assert total["bytes_read"] == st[0].bytes_unique, (total, st[0])
    assert all(s.bytes_loaded >= st[0].bytes_unique for s in st)    # every rank holds every byte
    assert sum(s.bytes_shared for s in st) > 0                     # node peers took the readers' bytes
    assert st[0].units > 4 and st[0].rounds > 1


def _io_read_bytes() -> int:
    """Bytes this process had fetched from storage (block I/O it submitted), /proc/self/io."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def _replicate_plain(rank: int, world: int, path: str, want: dict):
    sd = {k: torch.zeros_like(v) for k, v in want.items()}     # contiguous, same dtype: read along
    before = _io_read_bytes()
    st = dcpfs.torch.load(sd, path, staging_bytes=256 << 10)
    for k, v in want.items():
        tr._same(sd[k], v, f"{k} on rank {rank}")
    return st, _io_read_bytes() - before


def test_replicate_reads_storage_once(tmp_path):
    """Node peers that take a unit whole read it beside its reader, in the
    same round: storage must still be read once. The block I/O the four
    ranks submitted, summed, is about the shard files' size (each rank
    reading from storage would be four times it)."""
    path = str(tmp_path / "plain")
    gen = torch.Generator().manual_seed(7)
    want = {f"w{i}": torch.randn(256, 1024, generator=gen) for i in range(4)}    # 4 MiB
    _save_one_process(dict(want), path)
    files = [os.path.join(path, f) for f in os.listdir(path)]
    shard_bytes = sum(os.path.getsize(f) for f in files if f.endswith(".distcp"))
    _evict(path)
    res = distrun.run(4, _replicate_plain, path, want)
    st = [r[0] for r in res]
    fetched = sum(r[1] for r in res)
    assert _stats_sum(st)["bytes_read"] == st[0].bytes_unique == 4 << 20     # each unit read by one reader
    assert sum(s.bytes_shared for s in st) == 3 * st[0].bytes_unique        # every peer took every unit
    assert st[0].units == 16 and st[0].rounds == 1      # every rank read every unit along: no round's barrier
    if fetched < shard_bytes // 2:
        pytest.skip(f"no block I/O accounted for the evicted shards here ({fetched} bytes: tmpfs?)")
    assert fetched <= shard_bytes + shard_bytes // 4 + (1 << 20), (fetched, shard_bytes)


# -- several nodes on one host: point-to-point deliveries, and CUDA placement --------

def _nodes(rank: int, world: int, path: str, fake_cuda: bool, node_sharing: str, direct: bool = False):
    os.environ["DCPFS_NODE"] = str(rank // 2)          # ranks 0,1 | 2,3: two "nodes"
    if fake_cuda:
        os.environ["DCPFS_TEST_FAKE_CUDA"] = "1"         # torch copies, as for CUDA tensors
    st = _replicate(rank, world, path, node_sharing, direct)
    return st


@pytest.mark.parametrize("node_sharing,direct", [("page_cache", False), ("staging", False), ("staging", True)],
                         ids=["page_cache", "staging", "staging-direct"])
@pytest.mark.parametrize("fake_cuda", [False, True], ids=["host", "cuda-placement"])
def test_two_nodes(tmp_path, fake_cuda, node_sharing, direct):
    """direct: messages to the other node are packed from where each unit
    landed in its reader's slot."""
    path = str(tmp_path / "plain")
    sd = dict(tr._full_values())
    sd["meta"] = {"step": 42}
    _save_one_process(sd, path)
    st = distrun.run(4, _nodes, path, fake_cuda, node_sharing, direct)
    total = _stats_sum(st)
    assert total["bytes_read"] == st[0].bytes_unique
    assert total["bytes_sent"] == total["bytes_received"] > 0       # messages crossed "nodes"
    assert sum(s.bytes_shared for s in st) > 0                       # and node peers within one


def _no_message_buffer(rank: int, world: int, path: str, bad: int, node_sharing: str):
    """Rank bad cannot allocate a buffer for messages between nodes: every
    rank raises its error, none waits for its messages, and the ranks are
    still in step for the next load."""
    import dcpfs._collective as col
    os.environ["DCPFS_NODE"] = str(rank // 2)
    real = col._p2p_buffer
    if rank == bad:
        def refuse(torch_, nbytes, device):
            raise MemoryError(f"no {nbytes} bytes for a message")
        col._p2p_buffer = refuse
    sd = {k: torch.zeros_like(v) for k, v in tr._full_values().items()}
    try:
        dcpfs.torch.load(sd, path, staging_bytes=256, node_sharing=node_sharing)
        msg = None
    except dcpfs.DcpError as e:
        msg = str(e)
    col._p2p_buffer = real
    _replicate(rank, world, path, node_sharing, False)
    return msg


@pytest.mark.parametrize("node_sharing", ["page_cache", "staging"])
@pytest.mark.parametrize("bad", [0, 3])
def test_two_nodes_no_message_buffer(tmp_path, bad, node_sharing):
    path = str(tmp_path / "plain")
    sd = dict(tr._full_values())
    sd["meta"] = {"step": 42}
    _save_one_process(sd, path)
    msgs = distrun.run(4, _no_message_buffer, path, bad, node_sharing, timeout=120)
    _same_message(msgs, f"rank {bad}", "MemoryError", "bytes for a message", ".distcp")


# -- the 1.13 fixtures -----------------------------------------------------------

def _fixture_collective(rank: int, world: int, ckpt: str):
    import hashlib
    import json
    manifest = json.loads((Path(ckpt).parent / "expected" / "manifest.json").read_text())
    sd = {}
    with dcpfs.open(ckpt) as ck:
        for key in ck.keys():
            info = ck.info(key)
            if info.kind == "tensor":
                try:
                    sd[key] = torch.zeros(info.shape, dtype=getattr(torch, info.dtype))
                except (AttributeError, RuntimeError, TypeError):
                    continue    # a dtype torch cannot allocate plainly (quantized, bits)
    st = dcpfs.torch.load(sd, ckpt)
    want = {e["key"]: e for e in manifest["entries"]}
    checked = 0
    for key, t in sd.items():
        m = want.get(key)
        if m and "sha256" in m:
            data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            assert hashlib.sha256(data).hexdigest() == m["sha256"], f"rank {rank}: {ckpt}: {key}"
            checked += 1
    return checked, st


@pytest.mark.parametrize("case", sorted(p.name for p in FIXTURES.iterdir() if (p / "ckpt" / ".metadata").exists()))
def test_fixtures_113(case):
    ckpt = str(FIXTURES / case / "ckpt")
    res = distrun.run(2, _fixture_collective, ckpt)
    assert res[0][0] > 0, f"{case}: no key was compared with the manifest"
    st = [r[1] for r in res]
    assert sum(s.bytes_read for s in st) == st[0].bytes_unique


# -- errors: agreed on every rank, never a hang ---------------------------------

def _expect_error(rank: int, world: int, path: str, sd_kind: str):
    sd = {k: torch.zeros_like(v) for k, v in tr._full_values().items()}
    if sd_kind == "unknown-key" and rank == 1:
        sd["no.such.key"] = torch.zeros(3)
    if sd_kind == "outside" and rank == 0:
        sd["a"] = torch.zeros(14, 7)
    try:
        dcpfs.torch.load(sd, path)
    except dcpfs.DcpError as e:
        return str(e)
    raise AssertionError(f"rank {rank}: no error")


def _same_message(msgs: list, *parts: str) -> str:
    assert len(set(msgs)) == 1, f"ranks disagree: {msgs}"
    for p in parts:
        assert p in msgs[0], f"{p!r} not in {msgs[0]!r}"
    return msgs[0]


def test_errors_agreed(tmp_path):
    path = tmp_path / "ck"
    _save_one_process(dict(tr._full_values()), str(path))
    _same_message(distrun.run(2, _expect_error, str(path), "unknown-key", timeout=60),
                  "rank 1", "no.such.key", "no such key")
    _same_message(distrun.run(2, _expect_error, str(path), "outside", timeout=60),
                  "rank 0", ": a: the state dict's tensor has shape [14, 7], the checkpoint stores [13, 7]")
    bad = tmp_path / "damaged"
    shutil.copytree(path, bad)
    md = (bad / ".metadata").read_bytes()
    (bad / ".metadata").write_bytes(md[: len(md) // 2])
    _same_message(distrun.run(2, _expect_error, str(bad), "plain", timeout=60), ".metadata")
    gone = tmp_path / "missing"
    shutil.copytree(path, gone)
    shard = sorted(gone.glob("*.distcp"))[0]
    shard.unlink()
    _same_message(distrun.run(2, _expect_error, str(gone), "plain", timeout=60), shard.name)
    short = tmp_path / "short"
    shutil.copytree(path, short)
    for f in short.glob("*.distcp"):
        os.truncate(f, 64)
    _same_message(distrun.run(2, _expect_error, str(short), "plain", timeout=60), ".distcp")


def _unfillable(rank: int, world: int, path: str) -> list:
    """Destinations and options only rank 1 gets wrong (Partial DTensors: both
    ranks), each refused with the same DcpError on both ranks before any
    byte is read -- never one rank failing alone or a peer left waiting --
    then a good load, the ranks still in step."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial
    mesh = init_device_mesh("cpu", (world,))
    want = tr._full_values()
    cases = {
        "not-a-dict": ([torch.zeros_like(want["a"])], {}),
        "io_threads": (None, {"io_threads": "x"}),
        "nstaging": (None, {"nstaging": 1.5}),
        "sparse": ({"a": torch.zeros_like(want["a"]).to_sparse()}, {}),
        "expanded": ({"a": torch.zeros(1, *want["a"].shape[1:]).expand(want["a"].shape)}, {}),
    }
    msgs = []
    for name, (bad, opts) in cases.items():
        sd = {k: torch.zeros_like(v) for k, v in want.items()}
        if rank != 1:
            opts = {}
        elif bad is not None:
            sd = bad
        try:
            dcpfs.torch.load(sd, path, **opts)
        except dcpfs.DcpError as e:
            msgs.append(str(e))
        else:
            raise AssertionError(f"rank {rank}: {name}: no error")
    try:
        dcpfs.torch.load({"a": DTensor.from_local(torch.zeros_like(want["a"]), mesh, [Partial()])}, path)
    except dcpfs.DcpError as e:
        msgs.append(str(e))
    else:
        raise AssertionError(f"rank {rank}: Partial: no error")
    sd = {k: torch.zeros_like(v) for k, v in want.items()}
    dcpfs.torch.load(sd, path)
    for k in want:
        tr._same(sd[k], want[k], k)
    return msgs


def test_unfillable_agreed(tmp_path):
    path = tmp_path / "ck"
    _save_one_process(dict(tr._full_values()), str(path))
    res = distrun.run(2, _unfillable, str(path), timeout=60)
    per_case = list(zip(*res))
    parts = [("rank 1", "state_dict must be a dict, not list"),
             ("rank 1", "io_threads must be an int, not str"),
             ("rank 1", "nstaging must be an int, not float"),
             ("rank 1", ": a: the tensor has layout torch.sparse_coo"),
             ("rank 1", ": a: the tensor is expanded"),
             ("rank 0", ": a: the DTensor has a Partial placement")]
    assert len(per_case) == len(parts)
    for msgs, want in zip(per_case, parts):
        _same_message(list(msgs), *want)


def test_unfillable_refused(tmp_path):
    """Destinations dcp.load refuses, refused (a DcpError naming the key and
    the reason) before anything is read, not filled wrongly or not at all: a
    tensor without storage of its own, a meta tensor, a missing key or a
    wrong shape also for an empty tensor, a smaller tensor than stored (not
    a box of it), a key with a NUL (C would read another key). A larger
    tensor, a 0-dim one and a non-tensor value where a tensor is stored are
    told so (they were told by the box that failed: 'region [0:0,0:5]
    (start:count) lies outside the tensor', 'the region has 0 dimensions')."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    path = tmp_path / "ck"
    want = dict(tr._full_values(), e=torch.zeros(0, 4))
    _save_one_process(dict(want), str(path))
    with FakeTensorMode():
        fake = torch.empty(want["a"].shape)
    shape_a = list(want["a"].shape)
    cases = [
        ({"a": fake}, ": a: the tensor is a FakeTensor without storage of its own"),
        ({"a": torch.empty(want["a"].shape, device="meta")}, ": a: the tensor is on the meta device"),
        ({"nope": torch.zeros(0)}, ": nope: no such key in the checkpoint"),
        ({"a": torch.zeros(0, shape_a[1])}, f": a: the state dict's tensor has shape [0, {shape_a[1]}], "
                                            f"the checkpoint stores {shape_a}"),
        ({"a": torch.zeros(1, shape_a[1])}, f": a: the state dict's tensor has shape [1, {shape_a[1]}]"),
        ({"e": torch.zeros(0, 5)}, ": e: the state dict's tensor has shape [0, 5], the checkpoint stores [0, 4]"),
        ({"a": torch.zeros(shape_a[::-1])}, f": a: the state dict's tensor has shape {shape_a[::-1]}, "
                                            f"the checkpoint stores {shape_a}"),
        ({"c": torch.zeros(())}, ": c: the state dict's tensor has shape [], the checkpoint stores [9]"),
        ({"a": 0, "b": None}, ": a: the checkpoint stores a tensor, the state dict holds a non-tensor value"),
        ({"a\0junk": torch.zeros_like(want["a"])}, ": a\\0junk: no such key in the checkpoint"),
    ]
    for sd, msg in cases:
        before = {k: v.clone() for k, v in sd.items()
                  if isinstance(v, torch.Tensor) and v.device.type == "cpu" and not isinstance(v, type(fake))}
        with pytest.raises(dcpfs.DcpError) as ei:
            dcpfs.torch.load(sd, str(path))
        assert f"{path}{msg}" in str(ei.value), (msg, str(ei.value))
        for k, v in before.items():
            assert torch.equal(sd[k], v), k
    got = {"e": torch.zeros(0, 4), "a": torch.zeros_like(want["a"])}      # an empty tensor of the right shape
    dcpfs.torch.load(got, str(path))
    tr._same(got["a"], want["a"], "a")


def test_conj_neg_and_versions(tmp_path):
    """Conj and neg views get the stored values (through a temporary), as
    dcp.load gives them; a tensor filled in place, a Parameter too, has its
    autograd version counter bumped."""
    path = tmp_path / "ck"
    c = torch.tensor([1 + 2j, 3 - 4j, -5j], dtype=torch.complex64)
    want = dict(tr._full_values(), c=c)
    _save_one_process(dict(want), str(path))
    p = torch.nn.Parameter(torch.zeros_like(want["a"]))
    sd = {"c": torch.zeros(3, dtype=torch.complex64).conj(), "a": p}
    sd_neg = {"a": torch.zeros_like(want["a"])._neg_view()}
    dcpfs.torch.load(sd, str(path))
    dcpfs.torch.load(sd_neg, str(path))
    assert sd["c"].is_conj() and sd["c"].tolist() == c.tolist(), sd["c"]
    assert sd_neg["a"].is_neg()
    tr._same(sd_neg["a"].resolve_neg(), want["a"], "a (neg view)")
    tr._same(p.detach(), want["a"], "a")
    assert p._version > 0


def test_single_process_without_dist(tmp_path):
    """Without torch.distributed initialised, load runs as one rank."""
    path = tmp_path / "ck"
    want = tr._full_values()
    _save_one_process(dict(want), str(path))
    sd = {k: torch.zeros_like(v) for k, v in want.items()}
    st = dcpfs.torch.load(sd, str(path))
    for k in want:
        tr._same(sd[k], want[k], k)
    assert st.bytes_read == st.bytes_unique == sum(v.numel() * v.element_size() for v in want.values())


class _App:
    """The Stateful of torch's DCP recipe (and torchtitan's): a model and its
    optimizer through get_state_dict/set_state_dict (collective under FSDP2)."""

    def __init__(self, model, opt) -> None:
        self.model, self.opt = model, opt

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict
        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    def load_state_dict(self, sd) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict
        set_state_dict(self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def test_stateful_values_as_dcp_load(tmp_path):
    """Top-level Stateful values (a module, an optimizer, an object with
    state_dict/load_state_dict) load as dcp.load loads them: into their
    state_dict(), handed back by load_state_dict (they were taken for
    non-tensor values: 'app: no such key'); a tensor where the checkpoint
    stores a non-tensor value is replaced by it, as dcp.load replaces it
    (it was refused)."""
    def build(seed):
        torch.manual_seed(seed)
        m = torch.nn.Linear(3, 2)
        o = torch.optim.AdamW(m.parameters(), lr=0.1 * seed)
        m(torch.randn(4, 3)).sum().backward()
        o.step()
        return m, o
    model, opt = build(1)
    path = str(tmp_path / "ck")
    _save_one_process({"app": _App(model, opt), "net": model, "opt": opt, "epoch": 3, "step": 5}, path)
    got = {}
    for name in ("dcpfs", "torch"):
        m, o = build(2)
        n = torch.nn.Linear(3, 2)
        sd = {"app": _App(m, o), "net": n, "opt": o, "epoch": 0, "step": torch.tensor(0)}
        if name == "dcpfs":
            dcpfs.torch.load(sd, path)
        else:
            dcp.load(sd, storage_reader=FileSystemReader(path))
        assert sd["app"].model is m and sd["net"] is n and sd["opt"] is o   # loaded into, not replaced
        assert sd["epoch"] == 3 and sd["step"] == 5, (name, sd["epoch"], sd["step"])
        got[name] = {"app": _App(m, o).state_dict(), "net": n.state_dict()}
        tr._same_sd(got[name]["app"], _App(model, opt).state_dict(), local=False, what=f"{name}: app")
        tr._same_sd(got[name]["net"], model.state_dict(), local=False, what=f"{name}: net")
        assert o.param_groups[0]["lr"] == opt.param_groups[0]["lr"], name
    tr._same_sd(got["dcpfs"], got["torch"], local=False, what="dcpfs.torch.load vs dcp.load")


def _fsdp_stateful(rank: int, world: int, path: str) -> None:
    model, opt = tr._fsdp_model(world, seed=1)
    torch.manual_seed(2)
    model(torch.randint(0, 13, (6,))).sum().backward()
    opt.step()
    dcp.save({"app": _App(model, opt), "epoch": 7}, checkpoint_id=path)
    m2, o2 = tr._fsdp_model(world, seed=400)
    sd = {"app": _App(m2, o2), "epoch": 0}
    dcpfs.torch.load(sd, path)
    assert sd["epoch"] == 7
    tr._same_sd(_App(m2, o2).state_dict(), _App(model, opt).state_dict(), local=True,
                what=f"rank {rank}/{world}: FSDP2 app loaded through its load_state_dict")


@tr.needs_cpu_fsdp2
def test_stateful_fsdp2(tmp_path):
    """The recipe's Stateful app under FSDP2 on 2 ranks (its state_dict and
    load_state_dict are collectives, called in the same order on every rank)."""
    distrun.run(2, _fsdp_stateful, str(tmp_path / "app"))


class _Logged:
    """A Stateful that records each call in ``log``; ``fail`` names the call that raises."""

    def __init__(self, name: str, log: list, fail: str = "") -> None:
        self.name, self.log, self.fail = name, log, fail
        self.t = torch.zeros(3)

    def state_dict(self):
        self.log.append(f"{self.name}.state_dict")
        if self.fail == "state_dict":
            raise RuntimeError("no state here")
        return {"t": self.t}

    def load_state_dict(self, sd) -> None:
        self.log.append(f"{self.name}.load_state_dict")
        if self.fail == "load_state_dict":
            raise RuntimeError("refused")
        self.t = sd["t"].clone()


def _stateful_failing(rank: int, world: int, path: str, fail: str):
    """Each loader's calls and outcome on this rank; rank 1's "b" fails at ``fail``."""
    out = {}
    for name in ("torch", "dcpfs"):
        log: list = []
        sd = {"b": _Logged("b", log, fail if rank == 1 and name == "dcpfs" else ""), "a": _Logged("a", log),
              "n": 0}
        err = None
        try:
            if name == "torch":      # (its load fails on rank 1 alone, so rank 1 does not fail here)
                dcp.load(sd, storage_reader=FileSystemReader(path))
            else:
                dcpfs.torch.load(sd, path)
        except dcpfs.DcpError as e:
            err = (e.errno, str(e), repr(e.__cause__))
        out[name] = (log, err, sd["a"].t.tolist(), sd["b"].t.tolist(), sd["n"])
    return out


def test_stateful_failure_agreed(tmp_path):
    """Stateful values on 2 ranks: state_dict() then load_state_dict() on each,
    in sorted key order, as dcp.load calls them; a load_state_dict() raising on
    rank 1 makes both ranks raise the same DcpError naming the rank, checkpoint,
    key and reason (rank 1 raised its RuntimeError alone, rank 0 went on), rank 1
    stopping at it, as dcp.load stops, and chaining its own exception."""
    path = str(tmp_path / "st")
    _save_one_process({"a": {"t": torch.arange(3.0)}, "b": {"t": torch.arange(3.0) + 10}, "n": 7}, path)
    calls = ["a.state_dict", "b.state_dict", "a.load_state_dict", "b.load_state_dict"]
    r0, r1 = distrun.run(2, _stateful_failing, path, "load_state_dict", timeout=90)
    assert r0["torch"] == r1["torch"] == (calls, None, [0.0, 1.0, 2.0], [10.0, 11.0, 12.0], 7), (r0, r1)
    msg = f"[Errno 22] rank 1: {path}: b: load_state_dict(): RuntimeError: refused"
    # rank 0 applied everything before the agreement; rank 1 stopped at b (its tensor filled in place
    # by the load, n not replaced), as dcp.load's loop stops
    assert r0["dcpfs"] == (calls, (22, msg, "None"), [0.0, 1.0, 2.0], [10.0, 11.0, 12.0], 7), r0
    assert r1["dcpfs"] == (calls, (22, msg, "RuntimeError('refused')"), [0.0, 1.0, 2.0], [10.0, 11.0, 12.0], 0), r1
    # a state_dict() raising on rank 1: agreed before anything is read, naming the key (it named only the
    # exception: 'rank 1: CKPT: RuntimeError: no state here'); dcp.load's rank 1 raises alone, its peer waits
    r0, r1 = distrun.run(2, _stateful_failing, path, "state_dict", timeout=90)
    msg = f"[Errno 22] rank 1: {path}: b: state_dict(): RuntimeError: no state here"
    assert r0["dcpfs"] == (calls[:2], (22, msg, "None"), [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], 0), r0
    assert r1["dcpfs"] == (calls[:2], (22, msg, "None"), [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], 0), r1


def test_key_with_a_lone_surrogate(tmp_path):
    """A key Python pickles with "surrogatepass" is found by the str torch's
    state dict holds, and loads as dcp.load loads it."""
    path = tmp_path / "ck"
    want = {"sur\udc80rogate": torch.arange(6, dtype=torch.float32), "plain": torch.arange(3)}
    _save_one_process(dict(want), str(path))
    ours = {k: torch.zeros_like(v) for k, v in want.items()}
    dcpfs.torch.load(ours, str(path))
    theirs = {k: torch.zeros_like(v) for k, v in want.items()}
    dcp.load(theirs, storage_reader=FileSystemReader(str(path)))
    for k in want:
        tr._same(ours[k], want[k], k)
        tr._same(theirs[k], want[k], k)


def test_torch_save_training_state(tmp_path):
    """A torch.save training state (model, AdamW, epoch, lr, a name, lists of tensors)
    loads from the .pt as torch.load gives it: tensors in place, plain values
    (param_groups' and all) replaced by theirs, lists walked as flatten_state_dict
    walks them; an object torch.load would rebuild is no key."""
    import collections
    import copy
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    path = tmp_path / "train.pt"
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 7, "lr": 2.5e-4,
                "name": "run\u00e9", "sched": {"milestones": [10, 20], "gamma": None},
                "ema": [torch.arange(3.0), torch.ones(2, 2)]}, path)
    want = torch.load(path, weights_only=True)
    ours = copy.deepcopy(want)
    ours.update(epoch=0, lr=0.0, name="", sched={"milestones": [], "gamma": 1.0},
                ema=[torch.zeros(3), torch.zeros(2, 2)])
    ours["optim"]["param_groups"][0].update(lr=1.0, betas=(0.0, 0.0), params=[])
    for t in list(ours["model"].values()) + [v for st in ours["optim"]["state"].values() for v in st.values()]:
        t.zero_()
    dcpfs.torch.load(ours, str(path))
    assert ours["epoch"] == 7 and ours["lr"] == 2.5e-4 and ours["name"] == "run\u00e9"
    assert ours["sched"] == {"milestones": [10, 20], "gamma": None}
    assert ours["optim"]["param_groups"] == want["optim"]["param_groups"]
    for a, b in zip(ours["ema"], want["ema"]):
        tr._same(a, b, "ema")
    for k, v in want["model"].items():
        tr._same(ours["model"][k], v, k)
    for i, st in want["optim"]["state"].items():
        for k, v in st.items():
            tr._same(ours["optim"]["state"][i][k], v, f"optim.state.{i}.{k}")
    torch.save({"w": torch.ones(2), "seen": collections.Counter("ab")}, tmp_path / "obj.pt")
    with pytest.raises(dcpfs.DcpError, match="obj.pt: seen: no such key"):
        dcpfs.torch.load({"w": torch.zeros(2), "seen": None}, str(tmp_path / "obj.pt"))


def test_cuda_units_through_the_pinned_ring(tmp_path, monkeypatch):
    """CUDA destinations (placement run on CPU tensors): the units go through the
    ring of a few reused buffers, reads started only while one is free, with
    many more units than buffers; every byte lands where it belongs."""
    from dcpfs import _collective
    path = tmp_path / "ck"
    want = dict(tr._full_values(), big=torch.arange(50_000, dtype=torch.float32),
                mat=torch.randn(300, 70, dtype=torch.float64))
    _save_one_process(dict(want), str(path))
    monkeypatch.setenv("DCPFS_TEST_FAKE_CUDA", "1")
    taken, made = [], []
    take = _collective._PinnedRing.take

    def counting(self):
        buf = take(self)
        taken.append(buf.data_ptr())
        made.append(self.made)
        return buf
    monkeypatch.setattr(_collective._PinnedRing, "take", counting)
    sd = {k: torch.zeros_like(v) for k, v in want.items()}
    st = dcpfs.torch.load(sd, str(path), staging_bytes=4096, io_threads=2)
    for k in want:
        tr._same(sd[k], want[k], k)
    assert st.bytes_read == st.bytes_unique
    assert st.units > 16 and len(taken) == st.units          # every unit through the ring
    assert max(made) == 4 and len(set(taken)) == 4           # 2 * io_threads buffers, reused


class _DirectSpy:
    """libdcp as _collective sees it, recording each direct read: the buffer's
    alignment, where the unit's first byte landed, the room given, its length."""

    def __init__(self, lib):
        self._lib, self.calls = lib, []

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def dcp_gunit_read_direct(self, ck, gp, u, buf, cap, lead, err):
        from dcpfs._native import ffi
        rc = self._lib.dcp_gunit_read_direct(ck, gp, u, buf, cap, lead, err)
        self.calls.append((int(ffi.cast("uintptr_t", buf)) % 4096, lead[0], cap, u.len))
        return rc


@pytest.mark.parametrize("fake_cuda", [False, True], ids=["host-buffers", "pinned-ring"])
def test_direct_reads(tmp_path, monkeypatch, fake_cuda):
    """direct=True: the units a rank reads into its own buffers (host buffers
    here with a strided destination, the pinned ring for CUDA ones) go through
    dcp_gunit_read_direct into aligned room, and the bytes are placed from
    where each unit's first byte landed (evicted files: O_DIRECT where the
    file system has it)."""
    from dcpfs import _collective
    path = tmp_path / "ck"
    want = dict(tr._full_values(), big=torch.arange(50_000, dtype=torch.float32),
                mat=torch.randn(300, 70, dtype=torch.float64))
    _save_one_process(dict(want), str(path))
    _evict(path)
    if fake_cuda:
        monkeypatch.setenv("DCPFS_TEST_FAKE_CUDA", "1")
    spy = _DirectSpy(_collective.lib)
    monkeypatch.setattr(_collective, "lib", spy)
    sd = {k: torch.zeros_like(v) for k, v in want.items()}
    sd["mat"] = torch.zeros(70, 300, dtype=torch.float64).t()      # a strided destination
    st = dcpfs.torch.load(sd, str(path), staging_bytes=8192, io_threads=2, direct=True)
    for k in want:
        tr._same(sd[k], want[k], k)
    assert st.bytes_read == st.bytes_unique
    assert len(spy.calls) == st.units > 8, (len(spy.calls), st.units)
    assert all(align == 0 and lead < 4096 and cap >= lead + n + 4096 for align, lead, cap, n in spy.calls), spy.calls
    assert any(lead for _, lead, _, _ in spy.calls)     # units that start inside a block


# -- rank-local saves whose ranks disagree --------------------------------------

def _rl_collective(rank: int, world: int, path: str):
    theirs, ours = tr._rl_state(rank, world, False), tr._rl_state(rank, world, False)
    dcp.load(theirs, storage_reader=FileSystemReader(path))
    stats = dcpfs.torch.load(ours, path)
    tr._same_sd(ours, theirs, local=True, what=f"rank {rank}: dcpfs.torch.load vs dcp.load")
    tr._same_sd(ours, tr._rl_state(rank, world, True), local=True, what=f"rank {rank}: vs what it saved")
    return stats


def _rl_more_ranks(rank: int, world: int, path: str):
    sd = tr._rl_state(rank % 2, 2, False)
    sd.pop("rows")
    try:
        dcpfs.torch.load(sd, path)
    except dcpfs.DcpError as e:
        return str(e)
    return None


@tr.needs_rank_local
def test_rank_local_per_rank_values(tmp_path):
    """Each rank gets its own rank's values under the keys several ranks saved
    (read alone from its own __R.metadata, as torch's dcp.load does), the rest
    read once across the job; with more ranks than saved, a rank without
    __R.metadata fails on every rank (agreed), naming the file."""
    path = str(tmp_path / "rl")
    distrun.run(2, tr._rl_save, path, timeout=90)
    stats = distrun.run(2, _rl_collective, path, timeout=90)
    assert all(s.bytes_own > 0 for s in stats), stats
    # the DTensor rows (one box per rank, disjoint) and each rank's own key went through the read-once plan
    assert sum(s.bytes_read for s in stats) == stats[0].bytes_unique == 24 * 4 + 2 * 2 * 4, stats
    # one process, no group: rank 0's values, as dcp.load gives them
    theirs, ours = tr._rl_state(0, 1, False), tr._rl_state(0, 1, False)
    dcp.load(theirs, storage_reader=FileSystemReader(path), no_dist=True)
    dcpfs.torch.load(ours, path)
    tr._same_sd(ours, theirs, local=False, what="one process: dcpfs.torch.load vs dcp.load")
    errs = distrun.run(3, _rl_more_ranks, path, timeout=90)
    for e in errs:
        assert e and "rank 2: " in e and "__2.metadata: no such file" in e, errs


# -- dcp.load's strictness and its reading of older saves --------------------------

def _both_loads(path: str, make, planner=None, **opts) -> tuple:
    """The state dict make() builds, loaded by dcp.load (with planner) and by dcpfs.torch.load (with opts)."""
    theirs, ours = make(), make()
    dcp.load(theirs, storage_reader=FileSystemReader(path), planner=planner, no_dist=True)
    dcpfs.torch.load(ours, path, **opts)
    return ours, theirs


def test_allow_partial_load(tmp_path):
    """allow_partial_load=True leaves the state dict's keys the checkpoint does
    not store as they are, as dcp.load's DefaultLoadPlanner(allow_partial_load=True)
    does (there was no way to load a model grown by a layer since the save);
    a stored key of another shape still fails, and without it a missing key too."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    path = str(tmp_path / "ck")
    want = tr._full_values()
    _save_one_process(dict(want, extra={"epoch": 3}), path)

    def make():
        return {"a": torch.zeros_like(want["a"]), "new": {"w": torch.full((2, 3), 7.0), "n": 5},
                "extra": {"epoch": 0, "lr": 0.5}, "c": torch.zeros_like(want["c"])}
    ours, theirs = _both_loads(path, make, DefaultLoadPlanner(allow_partial_load=True), allow_partial_load=True)
    tr._same_sd(ours, theirs, local=False, what="allow_partial_load: dcpfs.torch.load vs dcp.load")
    tr._same(ours["a"], want["a"], "a")
    tr._same(ours["new"]["w"], torch.full((2, 3), 7.0), "new.w (not stored: left as it was)")
    assert ours["extra"] == {"epoch": 3, "lr": 0.5} and ours["new"]["n"] == 5, ours
    with pytest.raises(dcpfs.DcpError, match=r": (new\.w|new\.n|extra\.lr): no such key in the checkpoint"):
        dcpfs.torch.load(make(), path)
    with pytest.raises(dcpfs.DcpError, match=r": a: the state dict's tensor has shape \[1, 7\]"):
        dcpfs.torch.load({"a": torch.zeros(1, 7), "new": torch.zeros(1)}, path, allow_partial_load=True)


def test_saved_by_torch_2_3(tmp_path):
    """torch 2.3 and older stored a dict holding no tensor (an optimizer's
    param_groups, a dict of settings) and a list of such values as one item;
    dcp.load flattens the state dict as 2.3 did when that finds the stored
    keys, and so does dcpfs.torch.load now (it failed 'extra.epoch: no such
    key in the checkpoint'). Saved here as 2.3 saved (torch's own switch)."""
    from torch.distributed.checkpoint import _version
    if not hasattr(_version, "_derived_version"):
        pytest.skip(f"torch {torch.__version__} flattens as 2.3 did: nothing to tell apart")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam([{"params": [model.weight], "lr": 0.1}, {"params": [model.bias]}], lr=0.01)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    saved = {"model": model.state_dict(), "optim": opt.state_dict(), "extra": {"epoch": 3, "name": "run-7"},
             "tags": [1, "a"]}
    path = str(tmp_path / "ck")
    _version._derived_version = "2_3"
    try:
        _save_one_process(saved, path)
    finally:
        _version._derived_version = None
    with dcpfs.open(path) as ck:
        assert {"extra", "optim.param_groups", "tags"} <= set(ck.keys()), ck.keys()

    def make():
        m = torch.nn.Linear(3, 2)
        o = torch.optim.Adam([{"params": [m.weight], "lr": 1.0}, {"params": [m.bias]}], lr=1.0)
        m(torch.randn(4, 3)).sum().backward()
        o.step()
        return {"model": {k: torch.zeros_like(v) for k, v in m.state_dict().items()}, "optim": o.state_dict(),
                "extra": {"epoch": 0, "name": ""}, "tags": []}
    ours, theirs = _both_loads(path, make)
    tr._same_sd(ours, theirs, local=False, what="torch 2.3 save: dcpfs.torch.load vs dcp.load")
    assert ours["extra"] == {"epoch": 3, "name": "run-7"} and ours["tags"] == [1, "a"], ours
    assert ours["optim"]["param_groups"] == opt.state_dict()["param_groups"]
    tr._same_sd(ours["optim"]["state"], opt.state_dict()["state"], local=False, what="optim.state")


def _error_of(sd: dict, path: str) -> "str | None":
    """The DcpError dcpfs.torch.load raises for sd (None: it loaded)."""
    try:
        dcpfs.torch.load(sd, path)
    except dcpfs.DcpError as e:
        return str(e)
    return None


def _submesh(rank: int, world: int, path: str) -> "str | None":
    """A DTensor on a mesh of rank 0 alone (one pipeline stage's): rank 1
    holds no shard of it and dcp.load skips it there; it was refused on
    every rank ('w: the region has 0 dimensions')."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    api = tr._dtensor_api()
    full = torch.arange(30.0).reshape(6, 5)
    dcp.save({"w": api.distribute_tensor(full, init_device_mesh("cpu", (world,)), [api.Shard(0)]),
              "s": torch.tensor(2.5)}, checkpoint_id=path)
    stage = DeviceMesh("cpu", torch.tensor([0]))
    got = {}
    for name in ("dcpfs", "torch"):
        sd = {"w": api.distribute_tensor(torch.zeros(6, 5), stage, [api.Shard(0)]),
              "s": api.distribute_tensor(torch.tensor(0.0), stage, [api.Replicate()]),
              "plain": torch.zeros(6, 5)}
        if name == "dcpfs":
            dcpfs.torch.load({k: v for k, v in sd.items() if k != "plain"}, path)
            dcpfs.torch.load({"w": sd["plain"]}, path)
        else:
            dcp.load({k: v for k, v in sd.items() if k != "plain"}, storage_reader=FileSystemReader(path))
            dcp.load({"w": sd["plain"]}, storage_reader=FileSystemReader(path))
        got[name] = {k: tr._local(v).clone() for k, v in sd.items()}
    tr._same_sd(got["dcpfs"], got["torch"], local=False, what=f"rank {rank}: dcpfs.torch.load vs dcp.load")
    tr._same(got["dcpfs"]["plain"], full, "plain")
    if rank == 0:
        tr._same(got["dcpfs"]["w"], full, "w on its stage's rank")
        tr._same(got["dcpfs"]["s"], torch.tensor(2.5), "s on its stage's rank")
    return _error_of({"w": api.distribute_tensor(torch.zeros(6, 4), stage, [api.Shard(0)])}, path)


def test_dtensor_on_a_submesh(tmp_path):
    """Off its mesh a DTensor is still checked: a wrong global shape fails, on every rank alike."""
    msgs = distrun.run(2, _submesh, str(tmp_path / "ck"), timeout=90)
    _same_message(msgs, ": w: the state dict's tensor has shape [6, 4], the checkpoint stores [6, 5]")


def _sharded(spec_dim: int, ranks: list, full, fill: bool, dtype=None):
    """A ShardedTensor of full's shape chunked along spec_dim over ranks (a rank may
    appear more than once: several local shards), its shards full's values or zeros."""
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    spec = ChunkShardingSpec(dim=spec_dim, placements=[f"rank:{r}/cpu" for r in ranks])
    t = sharded_tensor.zeros(spec, *full.shape, dtype=dtype or full.dtype)
    for sh in t.local_shards():
        if fill:
            box = tuple(slice(o, o + n) for o, n in zip(sh.metadata.shard_offsets, sh.metadata.shard_sizes))
            sh.tensor.copy_(full[box])
    return t


def _sharded_tensors(rank: int, world: int, path: str) -> "str | None":
    """ShardedTensors (FSDP1, the old tensor parallelism) are filled shard by
    shard as dcp.load fills them, in another sharding than saved: rank 1
    holding two shards of rows, rank 1 none of a column-sharded one (of
    another dtype: cast); they were refused ('... not supported for
    ShardedTensor!', from a check made for plain tensors)."""
    rows, cols = torch.arange(21.0).reshape(7, 3), torch.arange(20, dtype=torch.int32).reshape(4, 5)
    dcp.save({"rows": _sharded(0, [0, 1], rows, True), "cols": _sharded(1, [0, 1], cols, True)},
             checkpoint_id=path)
    got = {}
    for name in ("dcpfs", "torch"):
        sd = {"rows": _sharded(0, [1, 0, 1], rows, False), "cols": _sharded(1, [0], cols, False, torch.float64)}
        if name == "dcpfs":
            dcpfs.torch.load(sd, path)
        else:
            dcp.load(sd, storage_reader=FileSystemReader(path))
        got[name] = {k: [(list(s.metadata.shard_offsets), s.tensor.clone()) for s in v.local_shards()]
                     for k, v in sd.items()}
    assert [len(got["dcpfs"]["rows"]), len(got["dcpfs"]["cols"])] == ([2, 0] if rank else [1, 1])
    for k, shards in got["torch"].items():
        for (off, want), (off2, t) in zip(shards, got["dcpfs"][k]):
            assert off == off2
            tr._same(t, want, f"rank {rank}: {k} shard at {off}: dcpfs.torch.load vs dcp.load")
            box = tuple(slice(o, o + n) for o, n in zip(off, t.shape))
            tr._same(t, (rows if k == "rows" else cols.double())[box], f"rank {rank}: {k} shard at {off}")
    return _error_of({"cols": _sharded(1, [0], torch.zeros(4, 6), False)}, path)


def test_sharded_tensors(tmp_path):
    """A rank without a shard still has the key's global shape checked: a wrong one fails on every rank alike."""
    msgs = distrun.run(2, _sharded_tensors, str(tmp_path / "ck"), timeout=90)
    _same_message(msgs, ": cols: the state dict's tensor has shape [4, 6], the checkpoint stores [4, 5]")


# -- wrapper subclasses (torchao's float8 training weights) --------------------

class _CastOnUse(torch.Tensor):
    """A wrapper subclass of the kind torchao's float8 training weights are
    (WeightWithDynamicFloat8CastTensor): no storage of its own, its ops run on
    the plain tensor it holds (``_tensor``); ``refuse_copy`` makes its copy_
    raise, as a subclass that cannot take a value would."""

    @staticmethod
    def __new__(cls, t: torch.Tensor, refuse_copy: bool = False):
        return torch.Tensor._make_wrapper_subclass(cls, t.shape, strides=t.stride(), dtype=t.dtype,
                                                   device=t.device)

    def __init__(self, t: torch.Tensor, refuse_copy: bool = False):
        self._tensor = t
        self._refuse_copy = refuse_copy

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map_only
        refuse = any(getattr(a, "_refuse_copy", False) for a in args)
        if func is torch.ops.aten.copy_.default and refuse:
            raise RuntimeError("_CastOnUse: this one takes no value")
        out = func(*tree_map_only(cls, lambda w: w._tensor, args),
                   **tree_map_only(cls, lambda w: w._tensor, kwargs or {}))
        if func in (torch.ops.aten.detach.default, torch.ops.aten.view.default, torch.ops.aten.alias.default):
            return cls(out, refuse)
        return out if func is not torch.ops.aten.copy_.default else args[0]

    def __tensor_flatten__(self):
        return ["_tensor"], self._refuse_copy

    @staticmethod
    def __tensor_unflatten__(inner, refuse_copy, outer_size, outer_stride):
        return _CastOnUse(inner["_tensor"], refuse_copy)


def _wrapped_dtensors(rank: int, world: int, path: str, refuse_on: int) -> "str | None":
    """DTensors whose local shards are wrappers (FSDP2 with float8 all-gather)
    and a plain wrapper, of another dtype than stored: filled through their
    own copy_ with the values dcp.load gives them; a copy_ raising on one
    rank raises the agreed error on every rank, naming the key."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    w, b = torch.arange(40.0).reshape(10, 4), torch.arange(6.0).to(torch.bfloat16)
    dcp.save({"w": distribute_tensor(w, mesh, [Shard(0)]), "b": b}, checkpoint_id=path)

    def state(refuse: bool = False):
        local = torch.zeros(w.chunk(world)[rank].shape)
        return {"w": DTensor.from_local(_CastOnUse(local, refuse), mesh, [Shard(0)], shape=w.shape,
                                        stride=w.stride()),
                "b": _CastOnUse(torch.zeros(6))}
    ours, theirs = state(), state()
    dcpfs.torch.load(ours, path)
    dcp.load(theirs, storage_reader=FileSystemReader(path))
    for sd in (ours, theirs):
        assert type(sd["w"].to_local()) is _CastOnUse and type(sd["b"]) is _CastOnUse
        tr._same(sd["w"].to_local()._tensor, w.chunk(world)[rank], f"rank {rank}: w's local shard")
        tr._same(sd["b"]._tensor, b.float(), f"rank {rank}: b")
    return _error_of(state(rank == refuse_on), path)


def test_wrapper_subclass_destinations(tmp_path):
    """Wrapper subclasses without storage of their own (torchao's float8
    training weights, FSDP2's shards of them) are filled as dcp.load fills
    them (they were refused: 'without storage of its own')."""
    msgs = distrun.run(2, _wrapped_dtensors, str(tmp_path / "ck"), 1, timeout=90)
    _same_message(msgs, "rank 1: ", ": w: RuntimeError: _CastOnUse: this one takes no value")


def test_float8_training_checkpoint():
    """A checkpoint torchao's float8 training weights were saved into
    (tests/data/subclasses: each record pickles the wrapper with the tensor
    it holds) loads into plain tensors and into wrappers, with the values
    saved, without torchao: by dcpfs.open, dcpfs.torch.load and dcp.load
    with dcpfs.torch.Reader."""
    import hashlib
    import json
    data = ROOT / "tests" / "data" / "subclasses"
    truth = json.loads((data / "dcp.truth.json").read_text())
    ck = str(data / "dcp")
    with dcpfs.open(ck, catalog=False) as c:
        want = {k: c.read(k) for k in truth}
    for k, t in truth.items():      # (bfloat16 read as uint16: numpy has none)
        assert list(want[k].shape) == t["shape"], k
        assert hashlib.sha256(want[k].tobytes()).hexdigest() == t["sha256"], k
    sd = {k: _CastOnUse(torch.zeros(v["shape"], dtype=getattr(torch, v["dtype"]))) for k, v in truth.items()}
    plain = {k: torch.zeros(v["shape"], dtype=getattr(torch, v["dtype"])) for k, v in truth.items()}
    by_reader = {k: torch.zeros_like(v) for k, v in plain.items()}
    dcpfs.torch.load(sd, ck)
    dcpfs.torch.load(plain, ck)
    dcp.load(by_reader, storage_reader=dcpfs.torch.Reader(ck), no_dist=True)
    for k in truth:
        assert torch.equal(sd[k]._tensor, plain[k]) and torch.equal(by_reader[k], plain[k]), k
        assert plain[k].view(-1).view(torch.uint8).numpy().tobytes() == want[k].tobytes(), k
