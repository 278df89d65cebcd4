#!/usr/bin/env python3
"""One timed load for bench-torch.sh: N gloo ranks (CPU processes, as torchrun
would start them) fill preallocated destinations from a checkpoint with one
of three loaders, and the slowest rank's numbers are printed as one JSON line.

Loaders (the same destinations, the same process count):
  torch    torch.distributed.checkpoint.load with PyTorch's FileSystemReader
  reader   torch.distributed.checkpoint.load with dcpfs.torch.Reader
  load     dcpfs.torch.load (each stored byte read once across the ranks)
Layouts: rows / cols (DTensors sharded on dimension 0 / 1 over the ranks) and
replicate (every rank holds every tensor whole).

Each rank allocates and touches its destinations (transparent huge pages for
every loader: THP_MEM_ALLOC_ENABLE=1), waits at a barrier, loads, waits at a
barrier. Printed: seconds (barrier to barrier, slowest rank), the bytes the
ranks read through read(2) and friends (rchar), CPU seconds summed over
ranks, and per rank the peak RSS above the RSS just before the load (the
destinations, torch and the interpreter already resident).

usage: torch_load.py CKPT N rows|cols|replicate torch|reader|load
"""
import json
import os
import resource
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp


def rchar():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run(rank, n, ckpt, layout, tool, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    import dcpfs
    import dcpfs.torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    mesh = init_device_mesh("cpu", (n,)) if layout != "replicate" else None
    sd = {}
    with dcpfs.open(ckpt) as ck:
        for key in ck.keys():
            info = ck.info(key)
            if info.kind != "tensor":
                continue
            shape = list(info.shape)
            dt = getattr(torch, info.dtype)
            if layout == "replicate" or not shape:
                sd[key] = torch.ones(shape, dtype=dt)     # touched
                continue
            placement = [Shard(0 if layout == "rows" else 1)]
            lshape, _ = compute_local_shape_and_global_offset(torch.Size(shape), mesh, placement)
            stride = [1] * len(shape)
            for d in range(len(shape) - 2, -1, -1):
                stride[d] = stride[d + 1] * shape[d + 1]
            sd[key] = DTensor.from_local(torch.ones(tuple(lshape), dtype=dt), mesh, placement,
                                         run_check=False, shape=torch.Size(shape), stride=tuple(stride))
    dist.barrier()
    rss0 = rss_kib()
    r0, c0 = rchar(), cpu()
    t0 = time.perf_counter()
    if tool == "torch":
        dcp.load(sd, storage_reader=dcp.FileSystemReader(ckpt))
    elif tool == "reader":
        dcp.load(sd, storage_reader=dcpfs.torch.Reader(ckpt))
    else:
        dcpfs.torch.load(sd, ckpt)
    dist.barrier()
    t1 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss    # KiB
    q.put(dict(rank=rank, seconds=t1 - t0, rchar=rchar() - r0, cpu=cpu() - c0,
               rss_above_mib=max(0, peak - rss0) / 1024.0))
    dist.destroy_process_group()


def main():
    ckpt, n, layout, tool = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, n, ckpt, layout, tool, port, q)) for r in range(n)]
    for p in procs:
        p.start()
    res = [q.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
    print(json.dumps(dict(seconds=max(r["seconds"] for r in res), rchar=sum(r["rchar"] for r in res),
                          cpu=sum(r["cpu"] for r in res),
                          rss_above_mib=max(r["rss_above_mib"] for r in res))))


if __name__ == "__main__":
    main()
