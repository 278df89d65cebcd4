"""megatron_fold=True: Megatron-Core's reformulated optimizer states in their original shapes.

A checkpoint stored the way Megatron-Core stores its distributed optimizer's states
(tests/interop/save_reformulated.py: ``[F..., prod(l)]`` tensors of ``[1, ..., 1, len]``
chunks, the original shapes in the ``.metadata``'s ``mcore_data``), loaded into the
parameters' layout a new job would have: DTensors of the original shapes, sharded by rows
and by columns on 2 ranks, through ``dcp.load`` with ``dcpfs.torch.Reader`` and through
``dcpfs.torch.load``: every rank's shard is the originals' slice. Without the flag both
give the stored shapes, as PyTorch's own reader does.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, os.path.dirname(__file__))
import dist as distrun  # noqa: E402  (python/tests/dist.py)

import dcpfs  # noqa: E402
import dcpfs.torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAVE = ROOT / "tests" / "interop" / "save_reformulated.py"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """OUT of save_reformulated.py (OUT/ckpt, OUT/folded.truth.json, OUT/stored.truth.json)."""
    out = tmp_path_factory.mktemp("reformulated")
    subprocess.run([sys.executable, str(SAVE), str(out), "3"], check=True, capture_output=True, timeout=300)
    return out


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _dtensor_api():
    try:
        import torch.distributed.tensor as api
        api.DTensor  # noqa: B018  (2.5+)
    except (ImportError, AttributeError):
        import torch.distributed._tensor as api
    return api


def _folded_run(rank: int, world: int, out: str) -> bool:
    """Each rank loads every folded tensor as a DTensor sharded along one dimension (the
    first for even keys, the last for odd ones), both ways; their full tensors are checked."""
    from torch.distributed.device_mesh import init_device_mesh
    api = _dtensor_api()
    mesh = init_device_mesh("cpu", (world,))
    doc = json.load(open(f"{out}/folded.truth.json"))
    stored = json.load(open(f"{out}/stored.truth.json"))
    folded = sorted(k for k in doc if doc[k]["shape"] != stored[k]["shape"])
    assert len(folded) == 10, folded

    def fresh():
        sd = {}
        for i, k in enumerate(folded):
            d = doc[k]
            full = torch.zeros(d["shape"], dtype=getattr(torch, d["dtype"]))
            sd[k] = api.distribute_tensor(full, mesh, [api.Shard(0 if i % 2 == 0 else len(d["shape"]) - 1)])
        return sd

    for how in ("Reader", "dcpfs.torch.load"):
        sd = fresh()
        if how == "Reader":
            dcp.load(sd, storage_reader=dcpfs.torch.Reader(f"{out}/ckpt", catalog=False, megatron_fold=True))
        else:
            dcpfs.torch.load(sd, f"{out}/ckpt", catalog=False, megatron_fold=True)
        for k, v in sd.items():
            assert _sha(v.full_tensor()) == doc[k]["sha256"], f"rank {rank}: {how}: {k}"
    return True


def test_dtensor_destinations(saved):
    """Optimizer states loaded into a new job's parameter layout, on 2 ranks."""
    distrun.run(2, _folded_run, str(saved))


def test_stored_view_by_default(saved):
    """Without the flag, the stored shapes (PyTorch's view); with it, the originals."""
    doc = json.load(open(saved / "folded.truth.json"))
    stored = json.load(open(saved / "stored.truth.json"))
    key = "optimizer.state.exp_avg.d3"
    md = dcpfs.torch.Reader(saved / "ckpt", catalog=False).read_metadata()
    assert list(md.state_dict_metadata[key].size) == stored[key]["shape"] == [2, 3, 2, 20]
    md = dcpfs.torch.Reader(saved / "ckpt", catalog=False, megatron_fold=True).read_metadata()
    assert list(md.state_dict_metadata[key].size) == doc[key]["shape"] == [4, 6, 10]
    with dcpfs.open(saved / "ckpt", catalog=False, megatron_fold=True) as ck:
        t = torch.zeros(doc[key]["shape"])
        ck.read(key, out=t)
        assert _sha(t) == doc[key]["sha256"]
        # a box of the original: rows 1..2 of every plane
        part = ck.read(key, box=[slice(None), (1, 2), slice(None)])
        assert part.shape == (4, 2, 10) and bool((torch.from_numpy(part) == t[:, 1:3]).all())
