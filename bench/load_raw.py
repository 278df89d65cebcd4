#!/usr/bin/env python3
"""Parallel raw read for bench-load.sh: N processes read the given files, the
concatenated bytes split into N equal contiguous shares, with 16 MiB preadv
calls into a reused buffer. Prints the wall time (first start to last end) and
the bytes read.

usage: load_raw.py N FILE...
"""
import multiprocessing as mp
import os
import sys
import time

BUF = 16 << 20


def worker(files, lo, hi, barrier, out):
    buf = bytearray(BUF)
    view = memoryview(buf)
    barrier.wait()
    t0 = time.perf_counter()
    pos, done = 0, 0
    for path, size in files:
        a, b = max(lo, pos), min(hi, pos + size)
        if a < b:
            fd = os.open(path, os.O_RDONLY)
            off = a - pos
            while off < b - pos:
                n = os.preadv(fd, [view[: min(BUF, b - pos - off)]], off)
                if n <= 0:
                    raise SystemExit(f"short read of {path}")
                off += n
                done += n
            os.close(fd)
        pos += size
    out.put((t0, time.perf_counter(), done))


def main():
    n = int(sys.argv[1])
    files = [(p, os.path.getsize(p)) for p in sys.argv[2:]]
    total = sum(s for _, s in files)
    barrier, out = mp.Barrier(n), mp.Queue()
    procs = [mp.Process(target=worker, args=(files, total * i // n, total * (i + 1) // n, barrier, out))
             for i in range(n)]
    for p in procs:
        p.start()
    res = [out.get() for _ in procs]
    for p in procs:
        p.join()
    t0 = min(r[0] for r in res)
    t1 = max(r[1] for r in res)
    print(f"{t1 - t0:.6f} {sum(r[2] for r in res)}")


if __name__ == "__main__":
    main()
