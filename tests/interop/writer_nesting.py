#!/usr/bin/env python3
"""planner_data as PyTorch writes it: each flattened key's path in the nesting.

usage:
  writer_nesting.py make DIR            DIR/nested.pt (torch.save of a nested dict) and
                                        DIR/torch-dcp (torch.distributed.checkpoint.save of it)
  writer_nesting.py same REF OURS       OURS's planner_data equals REF's (a checkpoint torch
                                        wrote), and dcp_to_torch_save gives the same structure
                                        and values for both
  writer_nesting.py pt REF PT            PT (dcp convert --nested of REF) holds what
                                        dcp_to_torch_save of REF gives: same nesting, tensors
                                        and plain values (others as the bytes of their torch.save)
  writer_nesting.py hostile REF DIR      DIR/bigindex and DIR/clash: REF with its planner_data
                                        made hostile (a list index of 2^40; a path that makes
                                        "hist" a list where another key's makes it a dict)
  writer_nesting.py flat CKPT           dcp_to_torch_save of CKPT gives a flat dict whose keys
                                        are the checkpoint's keys (a `dcp synth` checkpoint)
"""
import dataclasses, io, os, pickle, shutil, sys, tempfile, warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

warnings.filterwarnings("ignore")


def state_dict():
    return {
        "model": {
            "layer": {"weight": torch.arange(6, dtype=torch.float32).reshape(2, 3), "bias": torch.ones(3)},
            "blocks": {0: torch.full((2,), 7, dtype=torch.int32), 1: torch.zeros(1, dtype=torch.float64)},
        },
        "opt": {"lr": 0.5, "betas": (0.9, 0.99)},
        # a list (torch's flatten_state_dict keys its items by index) and dict keys with dots,
        # as a module's state_dict has them
        "hist": [torch.arange(3), {"a.b": torch.ones(2)}, [torch.zeros(2, dtype=torch.int8)]],
        "net": {"0.weight": torch.eye(2), "0.bias": torch.zeros(2)},
        3: torch.tensor([1, 2, 3], dtype=torch.int64),
        "step": 11,
    }


def as_torch_save(ckpt):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "x.pt")
        dcp_to_torch_save(ckpt, out)
        return torch.load(out, weights_only=False)


def same(a, b, where="root", as_bytes=True):
    """Differences of b from a; as_bytes: b may hold a non-tensor value as the bytes of its
    torch.save (a bytes item), else only a value that is no plain data may."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        return [] if ok else [f"{where}: {a!r} != {b!r}"]
    if isinstance(b, bytes) and not isinstance(a, bytes):   # a bytes item: its value's torch.save
        if not as_bytes and isinstance(a, (type(None), bool, int, float, str, tuple, list, dict)):
            return [f"{where}: {a!r} is plain data but stayed bytes"]
        b = torch.load(io.BytesIO(b), weights_only=False)
    if isinstance(a, dict) and isinstance(b, dict):
        if list(map(repr, sorted(a, key=repr))) != list(map(repr, sorted(b, key=repr))):
            return [f"{where}: keys {sorted(a, key=repr)} != {sorted(b, key=repr)}"]
        return [m for k in a for m in same(a[k], b[k], f"{where}.{k!r}", as_bytes)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [m for i in range(len(a)) for m in same(a[i], b[i], f"{where}[{i}]", as_bytes)]
    return [] if type(a) is type(b) and a == b else [f"{where}: {a!r} != {b!r}"]


def main():
    mode = sys.argv[1]
    bad = []
    if mode == "make":
        os.makedirs(sys.argv[2], exist_ok=True)
        torch.save(state_dict(), os.path.join(sys.argv[2], "nested.pt"))
        dcp.save(state_dict(), checkpoint_id=os.path.join(sys.argv[2], "torch-dcp"))
        return 0
    if mode == "same":
        ref = dcp.FileSystemReader(sys.argv[2]).read_metadata().planner_data
        ours = dcp.FileSystemReader(sys.argv[3]).read_metadata().planner_data
        if ref != ours:
            bad.append(f"planner_data {ours} != {ref}")
        bad += same(as_torch_save(sys.argv[2]), as_torch_save(sys.argv[3]))
    elif mode == "pt":
        bad += same(as_torch_save(sys.argv[2]), torch.load(sys.argv[3], weights_only=True), as_bytes=False)
    elif mode == "hostile":
        for name in ("bigindex", "clash"):
            out = os.path.join(sys.argv[3], name)
            shutil.copytree(sys.argv[2], out)
            with open(os.path.join(out, ".metadata"), "rb") as f:
                md = pickle.load(f)
            old, new = "hist.0", "hist.1099511627776"
            if name == "bigindex":   # the key renamed everywhere, so its path still spells it
                md.state_dict_metadata[new] = md.state_dict_metadata.pop(old)
                md.storage_data = {(dataclasses.replace(i, fqn=new) if i.fqn == old else i): v
                                   for i, v in md.storage_data.items()}
                del md.planner_data[old]
                md.planner_data[new] = ("hist", 1 << 40)
            else:
                md.planner_data[old] = ("hist.0",)    # "hist.0" a top-level key ...
                md.planner_data["hist.2.0"] = ("hist", "2", "0")   # ... "hist" a dict here, a list for hist.1.a.b
            with open(os.path.join(out, ".metadata"), "wb") as f:
                pickle.dump(md, f)
        return 0
    elif mode == "flat":
        md = dcp.FileSystemReader(sys.argv[2]).read_metadata()
        got = as_torch_save(sys.argv[2])
        if sorted(got) != sorted(md.state_dict_metadata):
            bad.append(f"keys {sorted(got)} != {sorted(md.state_dict_metadata)}")
        for k, p in md.planner_data.items():
            if p != (k,):
                bad.append(f"planner_data[{k}] = {p}, want ({k!r},)")
    for b in bad:
        print("FAIL:", b)
    print("ok" if not bad else f"{len(bad)} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
