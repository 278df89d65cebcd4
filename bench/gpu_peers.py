#!/usr/bin/env python3
"""The one-process peers and ceilings of bench-gpu.sh (issues 12 and 16).

usage: gpu_peers.py copy BYTES [REPS]
       gpu_peers.py TOOL PATH warm|evicted REPS
TOOL (each loads every tensor of PATH into preallocated CUDA tensors of one
process, as a single-GPU job would; PATH is a DCP folder, or a .safetensors
file for `safetensors`):
  safetensors     safetensors.torch.load_file(PATH, device="cuda")
  torch           torch.distributed.checkpoint.load with FileSystemReader
  reader          torch.distributed.checkpoint.load with dcpfs.torch.Reader
  load            dcpfs.torch.load (a process group of one rank, NCCL)
  load-direct     the same with direct=True (O_DIRECT for what is not cached)
`copy` is the ceiling of staged loads: a pinned host buffer of BYTES copied
to the GPU (CUDA events), best of REPS. Each prints one JSON line: seconds
of the best load (to torch.cuda.synchronize()), GB/s of the stored bytes,
and process_seconds, from this script's start to the end of the first
load (interpreter, torch, CUDA context, destinations and one load), as a
user sees it. `evicted`: the files are dropped from the page cache (fsync +
POSIX_FADV_DONTNEED: bench/evict.py) before each load. Exits 77 without a usable GPU or
module. GPU_PEERS_DEVICE=cpu runs the loaders into host memory instead (to
try this script on a machine without a GPU).
"""
import importlib
import json
import os
import sys
import time

from evict import evict  # bench/evict.py

START = time.time()
DEVICE = os.environ.get("GPU_PEERS_DEVICE", "cuda")


def need(module):
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure means "not here"
        print(f"gpu_peers: {module} is not importable: {e}", file=sys.stderr)
        sys.exit(77)


def copy_rate(nbytes, reps):
    torch = need("torch")
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = None
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        s = a.elapsed_time(b) / 1000.0
        best = s if best is None else min(best, s)
    print(json.dumps(dict(seconds=best, gbps=nbytes / best / 1e9)))


def destinations(torch, path):
    import dcpfs
    sd, total = {}, 0
    with dcpfs.open(path) as ck:
        for key in ck.keys():
            info = ck.info(key)
            if info.kind != "tensor":
                continue
            t = torch.empty(tuple(info.shape), dtype=getattr(torch, info.dtype), device=DEVICE)
            sd[key] = t
            total += t.numel() * t.element_size()
    return sd, total


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    tool = sys.argv[1]
    torch = need("torch")
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("gpu_peers: torch sees no GPU", file=sys.stderr)
        sys.exit(77)
    if tool == "copy":
        copy_rate(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 3)
        return
    path, cold, reps = sys.argv[2], sys.argv[3] == "evicted", int(sys.argv[4])
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    sd, total, load = None, 0, None
    if tool == "safetensors":
        st = need("safetensors.torch")
        load = lambda: st.load_file(path, device=DEVICE)  # noqa: E731
        total = os.path.getsize(path)
    else:
        need("dcpfs.torch")
        import dcpfs.torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        sd, total = destinations(torch, path)
        if tool == "torch":
            load = lambda: dcp.load(sd, storage_reader=dcp.FileSystemReader(path))  # noqa: E731
        elif tool == "reader":
            load = lambda: dcp.load(sd, storage_reader=dcpfs.torch.Reader(path))  # noqa: E731
        elif tool in ("load", "load-direct"):
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
            if DEVICE == "cuda":
                dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1,
                                        device_id=torch.device("cuda", 0))
            else:
                dist.init_process_group("gloo", rank=0, world_size=1)
            load = lambda: dcpfs.torch.load(sd, path, direct=tool == "load-direct")  # noqa: E731
        else:
            sys.exit(f"gpu_peers: unknown tool {tool}")
    best, first = None, None
    for _ in range(reps):
        if cold:
            evict([path])
        sync()
        t0 = time.perf_counter()
        out = load()
        sync()
        s = time.perf_counter() - t0
        del out
        if first is None:
            first = time.time() - START
        best = s if best is None else min(best, s)
    if tool in ("load", "load-direct"):
        torch.distributed.destroy_process_group()
    print(json.dumps(dict(seconds=best, gbps=total / best / 1e9, bytes=total, process_seconds=first)))


if __name__ == "__main__":
    main()
