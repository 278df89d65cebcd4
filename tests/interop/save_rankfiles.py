#!/usr/bin/env python3
"""Write real per-rank DTensor saves (gloo on loopback) and their ground truth.

usage: save_rankfiles.py OUT_DIR WORLD

WORLD (2 or 4) processes hold one state dict of DTensors: rows sharded unevenly (Shard(0),
the last rank's piece smaller), columns (Shard(1), the last piece empty), replicated, a
non-contiguous local tensor, an FSDP2 model's parameters (fully_shard: Shard(0)), rows under
_StridedShard (several runs of rows a rank), and with 4 ranks 2x2 blocks, (Replicate, Shard(0))
and FSDP2 over tensor parallel (_StridedShard(0), Shard(0)) on a 2-D mesh; plus a plain tensor, a number and a
dict of plain values. They save it

  OUT_DIR/tc     with torch-checkpointing's CheckpointManager (model_R.pt, extra_R.pt, step_R.pt)
  OUT_DIR/verl   as verl's FSDP checkpoint manager does (torch.save per rank:
                 model_world_size_W_rank_R.pt, extra_state_world_size_W_rank_R.pt)
  OUT_DIR/verl_fsdp1  the same with FSDP1's ShardedTensors (w0, w1, ids by rows, cols by
                 columns; a rank with an empty piece holds no shard)
  OUT_DIR/dcp    the model's DTensors as a DCP checkpoint (torch.distributed.checkpoint), but
                 strided1d, which DCP's planner refuses
  OUT_DIR/alt    torch-checkpointing again, model.w0 with 12 rows instead of 10 (a rank file of
                 another save, for the inconsistent-shape test)
  OUT_DIR/partial  torch-checkpointing of a DTensor with a Partial placement

OUT_DIR/truth.json maps each tensor key ("model.w0") to dtype, shape and the sha256 of the
C-order bytes of its full_tensor(), and each non-tensor item to "bytes"; OUT_DIR/full.pt holds
the full tensors (torch.save from rank 0).
"""
import hashlib, json, os, socket, sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def model_state(world, mesh1, mesh2, rows=10):
    g = torch.Generator().manual_seed(11)
    sd = {
        "w0": distribute_tensor(torch.randn(rows, 6, generator=g), mesh1, [Shard(0)]),
        "w1": distribute_tensor(torch.arange(35, dtype=torch.float32).reshape(7, 5), mesh1, [Shard(0)]),
        "cols": distribute_tensor(torch.randn(4, 9, generator=g).to(torch.bfloat16), mesh1, [Shard(1)]),
        "rep": distribute_tensor(torch.randn(3, 4, generator=g, dtype=torch.float64), mesh1, [Replicate()]),
        "ids": distribute_tensor(torch.randint(0, 60000, (5, 3), generator=g).to(torch.int32), mesh1,
                                 [Shard(0)]),
    }
    # A local tensor stored with strides (1, rows): a transposed view, as from_local keeps it.
    r = dist.get_rank()
    local = (torch.arange(8 * 3, dtype=torch.float32).reshape(3, 8) + 100 * r).t()
    sd["strided"] = DTensor.from_local(local, mesh1, [Shard(0)], run_check=False)
    # _StridedShard: rows in split_factor torch.chunk pieces, each cut over the ranks (a rank
    # holds several runs of rows), and FSDP2 over tensor parallel on the 2-D mesh.
    sd["strided1d"] = distribute_tensor(torch.arange(11 * 3, dtype=torch.float32).reshape(11, 3), mesh1,
                                        [_StridedShard(0, split_factor=2)], src_data_rank=None)
    if mesh2 is not None:
        sd["fsdp_tp"] = distribute_tensor(torch.randn(11, 4, generator=g), mesh2,
                                          [_StridedShard(0, split_factor=2), Shard(0)], src_data_rank=None)
        sd["blocks"] = distribute_tensor(torch.randn(9, 7, generator=g).half(), mesh2, [Shard(0), Shard(1)])
        sd["rowsrep"] = distribute_tensor(torch.randn(5, 8, generator=g), mesh2, [Replicate(), Shard(0)])
    # FSDP2: fully_shard makes each parameter a DTensor sharded by rows.
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(5)
    net = torch.nn.Sequential(torch.nn.Linear(6, 13), torch.nn.Linear(13, 3))
    fully_shard(net, mesh=mesh1)
    for k, v in net.state_dict().items():
        sd["fsdp." + k] = v
    return sd


def worker(rank, port, out, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh1 = init_device_mesh("cpu", (world,))
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")) if world == 4 else None
    sd = model_state(world, mesh1, mesh2)
    extra = {"lr": 0.5, "t": torch.arange(3) * 7}
    full = {k: v.full_tensor() for k, v in sd.items()}

    from torch_checkpointing import CheckpointManager
    from torch_checkpointing.config import SyncCheckpointSaverConfig
    from torch_checkpointing.storage.filesystem import LocalFileSystemStorageConfig
    mgr = CheckpointManager(CheckpointManager.Config(
        save=SyncCheckpointSaverConfig(), storage_config=LocalFileSystemStorageConfig(use_direct_io=False)))
    mgr.save(os.path.join(out, "tc"), {"model": sd, "step": 42, "extra": extra})
    alt = model_state(world, mesh1, mesh2, rows=12)
    mgr.save(os.path.join(out, "alt"), {"model": alt})
    p = DTensor.from_local(torch.full((2, 3), float(rank + 1)), mesh1, [Partial()], run_check=False)
    mgr.save(os.path.join(out, "partial"), {"model": {"p": p}})

    # verl's FSDPCheckpointManager: torch.save of each state dict per rank.
    verl = os.path.join(out, "verl")
    os.makedirs(verl, exist_ok=True)
    torch.save(sd, os.path.join(verl, f"model_world_size_{world}_rank_{rank}.pt"))
    torch.save({"lr_scheduler": {"last_epoch": 3}, "rng": 1}, os.path.join(verl, f"extra_state_world_size_{world}_rank_{rank}.pt"))
    # verl with FSDP1 (SHARDED_STATE_DICT): ShardedTensors, each rank's shard with its offsets
    from torch.distributed._shard.sharded_tensor import Shard as STShard, ShardMetadata, init_from_local_shards
    verl1 = os.path.join(out, "verl_fsdp1")
    os.makedirs(verl1, exist_ok=True)
    st = {}
    for k in ("w0", "w1", "cols", "ids"):
        t, d = full[k], (1 if k == "cols" else 0)
        n = t.shape[d]
        step = -(-n // world)
        lo, hi = min(rank * step, n), min(rank * step + step, n)
        offs = [0] * t.dim()
        offs[d] = lo
        piece = t.narrow(d, lo, hi - lo).clone()
        shards = [STShard(piece, ShardMetadata(offs, list(piece.shape), f"rank:{rank}/cpu"))] if hi > lo else []
        st[k] = init_from_local_shards(shards, list(t.shape))
    torch.save(st, os.path.join(verl1, f"model_world_size_{world}_rank_{rank}.pt"))

    import torch.distributed.checkpoint as dcp
    # DCP's planner refuses strided1d ("overlapping chunks": it takes each rank's piece for one
    # box); the rest is the same state dict.
    dcp.save({"model": {k: v for k, v in sd.items() if k != "strided1d"}}, checkpoint_id=os.path.join(out, "dcp"))

    if rank == 0:
        truth = {}
        for k, v in list(full.items()) + [("t", extra["t"])]:
            key = ("extra." if k == "t" else "model.") + k
            truth[key] = {"kind": "tensor", "dtype": str(v.dtype).replace("torch.", ""),
                          "shape": list(v.shape), "sha256": hashlib.sha256(tensor_bytes(v)).hexdigest()}
        truth["step"] = {"kind": "bytes"}
        with open(os.path.join(out, "truth.json"), "w") as f:
            json.dump(truth, f, indent=1)
        torch.save(full, os.path.join(out, "full.pt"))
    dist.barrier()
    dist.destroy_process_group()


def main():
    out, world = sys.argv[1], int(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, out, world), nprocs=world, join=True)


if __name__ == "__main__":
    main()
