#!/usr/bin/env python3
"""N threads read random ranges of mounted files and compare them with reference copies.

usage: fuse_readers.py N MOUNTED=REFERENCE [MOUNTED=REFERENCE...]
Each thread opens its own descriptor (thread i uses pair i mod len(pairs)) and does 200 preads
of random offsets and sizes (1 byte to 1 MiB), unaligned on purpose. Odd threads open with
O_DIRECT, which FUSE passes to the daemon, so the page cache cannot hide a racy daemon.
"""
import os, random, sys, threading

n = int(sys.argv[1])
pairs = [a.split("=", 1) for a in sys.argv[2:]]
refs = [open(ref, "rb").read() for _, ref in pairs]
errors = []


def reader(i):
    path, ref = pairs[i % len(pairs)][0], refs[i % len(pairs)]
    rng = random.Random(i)
    flags = os.O_RDONLY
    if i % 2 and hasattr(os, "O_DIRECT"):
        flags |= os.O_DIRECT
    try:
        fd = os.open(path, flags)
    except OSError:
        fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(200):
            off = rng.randrange(0, len(ref) + 1)
            size = rng.choice([1, 3, 4096, 4099, 65536, 131072 + 7, 1 << 20])
            got = os.pread(fd, size, off)
            if got != ref[off:off + size]:
                errors.append(f"{path}: pread({size}, {off}) differs")
                return
    finally:
        os.close(fd)


threads = [threading.Thread(target=reader, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if errors:
    sys.exit("FAIL: " + "; ".join(errors[:5]))
print(f"{n} concurrent readers of {len(pairs)} file(s): all bytes match")
