#!/usr/bin/env python3
"""Save small DCP checkpoints with PyTorch 2.x for the dcpfs mount tests, with their truth.

usage: fuse_torch_save.py OUT_DIR names|dtensor
  names:   one process; keys that need the name encoding (empty components, '%', '/'),
           keys that are also prefixes of other keys ("a.b" beside "a.b.c"), and keys named
           like dcpfs's all.safetensors ("all", "all.safetensors", "__metadata__").
  dtensor: two gloo processes; DTensors sharded by rows and by columns, a replicated one,
           plain tensors (bfloat16, a transposed view, 0-d) and a non-tensor value.
OUT_DIR/ckpt is the checkpoint; OUT_DIR/truth.json maps each key to kind, dtype, shape and
the sha256 of the global tensor's C-order bytes.
"""
import hashlib, json, os, socket, sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter


def tbytes(t):
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def truth_of(flat):
    out = {}
    for k, v in flat.items():
        if isinstance(v, torch.Tensor):
            out[k] = {"kind": "tensor", "dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape),
                      "nbytes": v.numel() * v.element_size(), "sha256": hashlib.sha256(tbytes(v)).hexdigest()}
        else:
            out[k] = {"kind": "bytes"}
    return out


def names(out):
    g = torch.Generator().manual_seed(3)
    sd = {
        "a.b": torch.randn(3, 4, generator=g),           # a file and a directory
        "a.b.c": torch.randn(5, generator=g),
        "a.b.c.d": torch.arange(6, dtype=torch.int32),  # makes a.b.c a directory too
        "a.x": torch.randn(2, generator=g).to(torch.bfloat16),
        "x..y": torch.ones(2, 2),                       # an empty component
        ".lead": torch.zeros(3),
        "trail.": torch.full((2,), 7.0),
        "p%q.r": torch.arange(4, dtype=torch.int64),
        "s/t.u": torch.arange(3, dtype=torch.int16),
        "v.w": {"not": "a tensor"},
        "all": torch.arange(3, dtype=torch.uint8),      # all.data: all/ is a directory too
        "all.safetensors": torch.ones(2, 3),            # all/safetensors, not dcpfs's all.safetensors
        "__metadata__": torch.zeros(2),                 # safetensors reserves the name: not in the view
    }
    flat = dict(sd)
    flat["v.w.not"] = flat.pop("v.w")["not"]   # DCP flattens nested dicts
    dcp.save(sd, storage_writer=FileSystemWriter(os.path.join(out, "ckpt")))
    t = truth_of(flat)
    return t


def dtensor_worker(rank, port, out):
    from torch.distributed.tensor import DeviceMesh, Replicate, Shard, distribute_tensor
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = DeviceMesh("cpu", [0, 1])
    g = torch.Generator().manual_seed(11)
    rows = torch.randn(33, 20, generator=g)
    cols = torch.randn(12, 50, generator=g).half()
    rep = torch.randn(7, generator=g, dtype=torch.float64)
    plain = {
        "buffers.bf16": torch.randn(6, 5, generator=g).to(torch.bfloat16),
        "buffers.transposed": torch.randn(4, 9, generator=g).t(),
        "buffers.step": torch.tensor(42),
    }
    sd = {
        "model.rows.weight": distribute_tensor(rows, mesh, [Shard(0)], src_data_rank=None),
        "model.cols.weight": distribute_tensor(cols, mesh, [Shard(1)], src_data_rank=None),
        "model.rep.bias": distribute_tensor(rep, mesh, [Replicate()], src_data_rank=None),
        **plain,
        "extra.epoch": 5,
    }
    dcp.save(sd, storage_writer=FileSystemWriter(os.path.join(out, "ckpt")))
    if rank == 0:
        flat = {"model.rows.weight": rows, "model.cols.weight": cols, "model.rep.bias": rep, **plain,
                "extra.epoch": 5}
        with open(os.path.join(out, "truth.json"), "w") as f:
            json.dump(truth_of(flat), f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main():
    out, mode = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if mode == "names":
        with open(os.path.join(out, "truth.json"), "w") as f:
            json.dump(names(out), f, indent=1)
        return
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(dtensor_worker, args=(port, out), nprocs=2, join=True)


if __name__ == "__main__":
    main()
