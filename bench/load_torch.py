#!/usr/bin/env python3
"""PyTorch's own collective load for bench-load.sh: N gloo ranks (CPU) call
torch.distributed.checkpoint.load into preallocated tensors of the dcpload
layout (rows: DTensors sharded on dimension 0, from preallocated local
shards; replicate: whole plain tensors on every rank). Prints the time of the
load (barrier to barrier, the slowest rank), the bytes the ranks read
through read(2) and friends (rchar of /proc/self/io, summed) and their CPU
time (user+system of each process, all threads, summed).

usage: load_torch.py CKPT N rows|replicate
"""
import os
import queue
import resource
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata


def gather(q, procs, timeout: float = 1800):
    """One result per process from q. A process that died (its traceback
    printed above) or no results in timeout seconds end the launch: the
    others are killed and the script exits non-zero, never waits on. A
    process that put its result and then failed (in destroy_process_group,
    say) fails the launch too: its numbers are not trusted."""
    res = []
    deadline = time.time() + timeout
    while len(res) < len(procs):
        try:
            res.append(q.get(timeout=1))
        except queue.Empty:
            dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead or time.time() > deadline:
                for p in procs:
                    p.kill()
                sys.exit(f"{os.path.basename(sys.argv[0])}: " +
                         (f"rank {dead[0]} exited with {procs[dead[0]].exitcode}" if dead
                          else f"no result in {timeout:.0f} s"))
    for p in procs:
        p.join()
    dead = [i for i, p in enumerate(procs) if p.exitcode != 0]
    if dead:
        sys.exit(f"{os.path.basename(sys.argv[0])}: rank {dead[0]} exited with {procs[dead[0]].exitcode} "
                 "after its result")
    return res


def rchar():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def split(n, parts, i):
    q, r = divmod(n, parts)
    return i * q + min(i, r), q + (1 if i < r else 0)


def run(rank, n, ckpt, layout, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    md = FileSystemReader(ckpt).read_metadata()
    sd = {}
    mesh = None
    if layout == "rows":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard
        mesh = init_device_mesh("cpu", (n,))
    for key, m in md.state_dict_metadata.items():
        if not isinstance(m, TensorStorageMetadata):
            continue
        shape = list(m.size)
        if layout == "rows" and len(shape) >= 1:
            off, ln = split(shape[0], n, rank)
            # DTensor Shard(0) splits by ceil division: the bench uses divisible shapes
            local = torch.zeros([ln] + shape[1:], dtype=m.properties.dtype)
            stride = [1] * len(shape)
            for d in range(len(shape) - 2, -1, -1):
                stride[d] = stride[d + 1] * shape[d + 1]
            sd[key] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                         shape=torch.Size(shape), stride=tuple(stride))
        else:
            sd[key] = torch.zeros(shape, dtype=m.properties.dtype)
    dist.barrier()
    r0 = rchar()
    c0 = cpu()
    t0 = time.perf_counter()
    dcp.load(sd, checkpoint_id=ckpt)
    dist.barrier()
    t1 = time.perf_counter()
    q.put((rank, t1 - t0, rchar() - r0, cpu() - c0))
    dist.destroy_process_group()


def main():
    ckpt, n, layout = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, n, ckpt, layout, port, q)) for r in range(n)]
    for p in procs:
        p.start()
    res = gather(q, procs)
    print(f"{max(r[1] for r in res):.6f} {sum(r[2] for r in res)} {sum(r[3] for r in res):.6f}")


if __name__ == "__main__":
    main()
