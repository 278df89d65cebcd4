#!/usr/bin/env python3
"""Write real multi-rank DCP checkpoints with PyTorch (gloo on loopback) and the ground truth.

usage: save_dtensor.py OUT_DIR VARIANT
VARIANT: torch_save | safetensors | zstd | ranklocal (use_collectives=False: __R.metadata files) |
         hf (HuggingFaceStorageWriter, save_distributed: per-rank .safetensors, no .metadata)

Four processes save one state dict: DTensors sharded by rows, by columns, in 2x2 blocks and
replicated, plain tensors, nested dicts, several dtypes, and non-tensor values. OUT_DIR/ckpt is
the checkpoint; OUT_DIR/truth.json maps each tensor key to dtype, shape and the sha256 of the
global tensor's C-order bytes, and each non-tensor key to "bytes".
"""
import hashlib, json, os, socket, sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.tensor import DeviceMesh, Replicate, Shard, distribute_tensor

WORLD = 4


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def global_values(seed):
    g = torch.Generator().manual_seed(seed)
    vals = {
        "model.embed.weight": torch.randn(37, 16, generator=g),                      # rows, uneven
        "model.layers.0.attn.qkv.weight": torch.randn(24, 30, generator=g).to(torch.bfloat16),  # cols
        "model.layers.0.mlp.fc.weight": torch.randn(20, 18, generator=g).half(),      # 2x2 blocks
        "model.layers.0.mlp.fc.bias": torch.randn(20, generator=g, dtype=torch.float64),  # replicated
        "model.norm.scale": torch.randn(16, generator=g).to(torch.float8_e4m3fn),     # rows, float8
        "model.cplx": torch.randn(8, 6, dtype=torch.complex64, generator=g),          # rows
        "model.mask": torch.rand(13, 7, generator=g) > 0.5,                          # cols, bool
        "model.ids": torch.randint(0, 60000, (10, 4), generator=g).to(torch.uint16),   # rows, uint16
        "model.big_int": torch.randint(-2**40, 2**40, (6, 5), generator=g),          # blocks, int64
    }
    plain = {
        "optim.state.step": torch.tensor(1234),                                      # 0-d
        "optim.state.exp_avg": torch.randn(5, 3, generator=g),
        "buffers.transposed": torch.randn(6, 10, generator=g).t(),                   # stored strides (1,6)
        "buffers.empty": torch.zeros(0, 4),
    }
    return vals, plain


PLACEMENT = {
    "model.embed.weight": "rows", "model.layers.0.attn.qkv.weight": "cols",
    "model.layers.0.mlp.fc.weight": "blocks", "model.layers.0.mlp.fc.bias": "replicated",
    "model.norm.scale": "rows", "model.cplx": "rows", "model.mask": "cols", "model.ids": "rows",
    "model.big_int": "blocks",
}


def nest(flat):
    out = {}
    for k, v in flat.items():
        parts = k.split(".")
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = v
    return out


def worker(rank, port, out, variant):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh1 = DeviceMesh("cpu", list(range(WORLD)))
    mesh2 = DeviceMesh("cpu", [[0, 1], [2, 3]])
    vals, plain = global_values(7)
    if variant in ("safetensors", "hf"):  # safetensors refuses non-contiguous tensors
        plain["buffers.transposed"] = plain["buffers.transposed"].contiguous()
    sd = {}
    for k, v in vals.items():
        how = PLACEMENT[k]
        if how == "rows":
            sd[k] = distribute_tensor(v, mesh1, [Shard(0)], src_data_rank=None)
        elif how == "cols":
            sd[k] = distribute_tensor(v, mesh1, [Shard(1)], src_data_rank=None)
        elif how == "blocks":
            sd[k] = distribute_tensor(v, mesh2, [Shard(0), Shard(1)], src_data_rank=None)
        else:
            sd[k] = distribute_tensor(v, mesh1, [Replicate()], src_data_rank=None)
    sd.update(plain)
    state = nest(sd)
    if variant != "hf":   # safetensors files hold tensors only
        state["extra"] = {"epoch": 3, "name": "interop", "lr": 0.25, "tags": ["a", "b"]}
    kwargs, save_kwargs = {}, {}
    if variant == "safetensors":
        from torch.distributed.checkpoint.filesystem import SerializationFormat
        kwargs["serialization_format"] = SerializationFormat.SAFETENSORS
    elif variant == "zstd":
        from torch.distributed.checkpoint._extension import ZStandard
        kwargs["_extensions"] = [ZStandard()]
    elif variant == "ranklocal":
        save_kwargs["use_collectives"] = False
    path = os.path.join(out, "ckpt")
    if variant == "hf":
        from torch.distributed.checkpoint import HuggingFaceStorageWriter
        writer = HuggingFaceStorageWriter(path=path, save_distributed=True)
    else:
        writer = FileSystemWriter(path, **kwargs)
    dcp.save(state, storage_writer=writer, **save_kwargs)
    if rank == 0:
        truth = {}
        for k, v in list(vals.items()) + list(plain.items()):
            truth[k] = {"kind": "tensor", "dtype": str(v.dtype).replace("torch.", ""),
                        "shape": list(v.shape), "sha256": hashlib.sha256(tensor_bytes(v)).hexdigest()}
        if variant != "hf":
            for k in ("extra.epoch", "extra.name", "extra.lr", "extra.tags"):
                truth[k] = {"kind": "bytes"}
        with open(os.path.join(out, "truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main():
    """save_dtensor.py ROOT VARIANT...: each variant saved into ROOT/VARIANT/ckpt, all by
    one set of forked ranks (torch imported once, not once a rank and variant)."""
    root, variants = sys.argv[1], sys.argv[2:]
    ports = []
    for v in variants:
        os.makedirs(os.path.join(root, v), exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])

    def ranks(rank):
        for v, port in zip(variants, ports):
            worker(rank, port, os.path.join(root, v), v)

    mp.start_processes(ranks, nprocs=WORLD, start_method="fork", join=True)


if __name__ == "__main__":
    main()
