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
every loader: THP_MEM_ALLOC_ENABLE=1), then REPS times: (evicted: rank 0
drops the shard files from the page cache), a barrier, the load, a barrier.
Printed for the best repetition: seconds (barrier to barrier, slowest rank),
the bytes the ranks read through read(2) and friends (rchar), CPU seconds
summed over ranks; the whole process's time as a user sees it (from this
script's start to the end of the first load: interpreter, torch, process
group, destinations and one load); and the largest per-rank peak RSS above
the RSS just before the first load (the destinations, torch and the
interpreter already resident).

usage: torch_load.py CKPT N rows|cols|replicate torch|reader|load REPS warm|evicted
$DCPFS_BENCH_LOAD_OPTS (a JSON object) passes keyword arguments to
dcpfs.torch.load, e.g. '{"node_sharing": "staging", "nstaging": 8}'.
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

from evict import evict  # bench/evict.py
from load_torch import cpu, gather, rchar  # bench/load_torch.py (bench-load's PyTorch loader)


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def run(rank, n, ckpt, layout, tool, reps, cold, port, q):
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
    files = [os.path.join(ckpt, f) for f in sorted(os.listdir(ckpt)) if f.endswith(".distcp")]
    dist.barrier()
    rss0 = rss_kib()
    runs = []
    first_done = None
    for _ in range(reps):
        if cold and rank == 0:
            evict(files)
        dist.barrier()
        r0, c0 = rchar(), cpu()
        t0 = time.perf_counter()
        if tool == "torch":
            dcp.load(sd, storage_reader=dcp.FileSystemReader(ckpt))
        elif tool == "reader":
            dcp.load(sd, storage_reader=dcpfs.torch.Reader(ckpt))
        else:
            dcpfs.torch.load(sd, ckpt, **json.loads(os.environ.get("DCPFS_BENCH_LOAD_OPTS", "{}")))
        dist.barrier()
        t1 = time.perf_counter()
        if first_done is None:
            first_done = time.time()
        runs.append((t1 - t0, rchar() - r0, cpu() - c0))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss    # KiB
    q.put(dict(rank=rank, runs=runs, first_done=first_done, rss_above_mib=max(0, peak - rss0) / 1024.0))
    dist.destroy_process_group()


def main():
    start = time.time()
    ckpt, n, layout, tool = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    reps, cold = int(sys.argv[5]), sys.argv[6] == "evicted"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, n, ckpt, layout, tool, reps, cold, port, q)) for r in range(n)]
    for p in procs:
        p.start()
    res = gather(q, procs)
    # the best repetition by its slowest rank's time; its reads and CPU summed over ranks
    per_rep = [(max(r["runs"][i][0] for r in res), sum(r["runs"][i][1] for r in res),
                sum(r["runs"][i][2] for r in res)) for i in range(reps)]
    best = min(per_rep)
    print(json.dumps(dict(seconds=best[0], rchar=best[1], cpu=best[2],
                          process_seconds=max(r["first_done"] for r in res) - start,
                          rss_above_mib=max(r["rss_above_mib"] for r in res))))


if __name__ == "__main__":
    main()
