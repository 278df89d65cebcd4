#!/usr/bin/env python3
"""Write checkpoints holding tensor subclasses with PyTorch and torchao, and the ground truth.

usage: save_subclasses.py OUT_DIR   (made once: torch 2.13.0, torchao 0.18.0 --no-deps)

torchtitan's float8 and MoE trainings save their weights as torchao wrapper subclasses that
cast only when used: torch.save (and so each DCP record) pickles the wrapper with the plain
tensor it holds, which is the value. An NF4 tensor (torchao's QLoRA weight) stores 4-bit
codes and scales instead: libdcp refuses it by name.
  OUT_DIR/dcp      one process: float8 training weights (float32, bfloat16), MoE float8 and
                   MXFP8 expert weights (3-D), a plain tensor, a subclass of Tensor holding
                   its own storage, an NF4 weight
  OUT_DIR/fsdp2    two gloo ranks: DTensors sharded by rows whose local shards are float8
                   training weights, as FSDP2 holds them with float8 all-gather
  OUT_DIR/fsdp2-rankfiles  the same DTensors torch.save'd by each rank (model_R.pt, as
                   torch-checkpointing and verl save)
  OUT_DIR/single.pt  torch.save of the one-process state dict without the NF4 weight
  OUT_DIR/NAME.truth.json  for dcp, fsdp2, fsdp2-rankfiles and single.pt, each tensor key libdcp reads: dtype,
                   shape, sha256 of its C-order bytes (tests/interop/check_truth.py)
"""
import hashlib, json, os, socket, sys, warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

warnings.filterwarnings("ignore")


class Tagged(torch.Tensor):
    """A subclass of Tensor holding its own storage (as_subclass, as frameworks tag
    tensors) with an attribute: pickled as _rebuild_from_type_v2(_rebuild_tensor_v2,
    Tagged, ..., state)."""


def tagged(t):
    out = t.as_subclass(Tagged)
    out.role = "frozen"
    return out


def _classes():
    from torchao.float8.float8_training_tensor import LinearMMConfig
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor
    from torchao.prototype.moe_training.config import Float8TrainingOpConfig, MXFP8TrainingOpConfig
    from torchao.prototype.moe_training.tensor import (Float8TrainingWeightWrapperTensor,
                                                       MXFP8TrainingWeightWrapperTensor)

    def f8(t):
        return WeightWithDynamicFloat8CastTensor(t, LinearMMConfig(), torch.float8_e4m3fn)

    def moe8(t):
        return Float8TrainingWeightWrapperTensor(t, Float8TrainingOpConfig())

    def mx8(t):
        return MXFP8TrainingWeightWrapperTensor(t, MXFP8TrainingOpConfig())
    return f8, moe8, mx8


def values():
    g = torch.Generator().manual_seed(7)
    return {
        "layers.0.attention.wq.weight": torch.randn(24, 16, generator=g),
        "layers.0.feed_forward.w1.weight": torch.randn(40, 16, generator=g).to(torch.bfloat16),
        "layers.1.moe.experts.w1": torch.randn(4, 8, 16, generator=g).to(torch.bfloat16),
        "layers.1.moe.experts.w2": torch.randn(4, 16, 8, generator=g).to(torch.bfloat16),
        "norm.weight": torch.randn(16, generator=g),
        "layers.3.tagged": torch.randn(5, 3, generator=g).to(torch.float64),
        "layers.2.qlora.weight": torch.randn(256, 64, generator=g).to(torch.bfloat16),
    }


def wrapped(v):
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4
    f8, moe8, mx8 = _classes()
    return {
        "layers.0.attention.wq.weight": f8(v["layers.0.attention.wq.weight"]),
        "layers.0.feed_forward.w1.weight": f8(v["layers.0.feed_forward.w1.weight"]),
        "layers.1.moe.experts.w1": moe8(v["layers.1.moe.experts.w1"]),
        "layers.1.moe.experts.w2": mx8(v["layers.1.moe.experts.w2"]),
        "norm.weight": v["norm.weight"],
        "layers.3.tagged": tagged(v["layers.3.tagged"]),
        "layers.2.qlora.weight": to_nf4(v["layers.2.qlora.weight"]),
    }


def truth(v):
    out = {}
    for k, t in v.items():
        out[k] = {"kind": "tensor", "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                  "sha256": hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()}
    return out


def fsdp2_rank(rank, world, port, out):
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    f8, _, _ = _classes()
    mesh = init_device_mesh("cpu", (world,))
    v = values()
    sd = {}
    for k in ("layers.0.attention.wq.weight", "layers.0.feed_forward.w1.weight"):
        local = v[k].chunk(world)[rank].clone()
        sd[k] = DTensor.from_local(f8(local), mesh, [Shard(0)], shape=v[k].shape, stride=v[k].stride())
        assert type(sd[k].to_local()).__name__ == "WeightWithDynamicFloat8CastTensor"
    dcp.save(sd, checkpoint_id=out)
    os.makedirs(out + "-rankfiles", exist_ok=True)    # torch-checkpointing's layout: torch.save per rank
    torch.save(sd, os.path.join(out + "-rankfiles", f"model_{rank}.pt"))
    dist.destroy_process_group()


def main():
    out = sys.argv[1]
    v = values()
    dcp.save(wrapped(v), checkpoint_id=os.path.join(out, "dcp"), no_dist=True)
    single = {k: t for k, t in wrapped(v).items() if k != "layers.2.qlora.weight"}
    torch.save(single, os.path.join(out, "single.pt"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(fsdp2_rank, args=(2, port, os.path.join(out, "fsdp2")), nprocs=2)
    t = truth(v)
    del t["layers.2.qlora.weight"]      # (refused: no truth to compare)
    fsdp2 = {k: t[k] for k in ("layers.0.attention.wq.weight", "layers.0.feed_forward.w1.weight")}
    cases = {"dcp": t, "single": t, "fsdp2": fsdp2, "fsdp2-rankfiles": {"model." + k: v for k, v in fsdp2.items()}}
    for name, keys in cases.items():
        with open(os.path.join(out, name + ".truth.json"), "w") as f:
            json.dump(keys, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
