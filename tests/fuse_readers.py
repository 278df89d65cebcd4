#!/usr/bin/env python3
"""N threads read random ranges of mounted files and compare them with reference copies.

usage: fuse_readers.py N MOUNTED=REFERENCE [MOUNTED=REFERENCE...]
       fuse_readers.py --faults SECONDS N MOUNTED=REFERENCE[=OTHER] [...]
Each thread opens its own descriptor (thread i uses pair i mod len(pairs)) and does 200 preads
of random offsets and sizes (1 byte to 1 MiB), unaligned on purpose. Odd threads open with
O_DIRECT, which FUSE passes to the daemon, so the page cache cannot hide a racy daemon.

--faults (tests/fuse-faults.sh, which breaks the mount while they read): each thread reads its
file whole, again and again from a fresh descriptor, in random-sized preads, for SECONDS. Every
whole read must equal REFERENCE (or, all of it, OTHER: the checkpoint that replaced it); an
error (EIO, ENOENT, ENOTCONN, ...) ends that reader. Fails on bytes that match neither, bytes
mixed from both, or a reader still inside a read 10 s after SECONDS (a hang).
"""
import errno, os, random, sys, threading, time

faults = None
if sys.argv[1] == "--faults":
    faults = float(sys.argv[2])
    del sys.argv[1:3]
n = int(sys.argv[1])
pairs = [a.split("=") for a in sys.argv[2:]]
refs = [open(p[1], "rb").read() for p in pairs]
others = [open(p[2], "rb").read() if len(p) > 2 else None for p in pairs]
errors = []
ended = {}   # thread -> how it ended (faults mode)


def whole_reads(i, deadline):
    """--faults: whole reads of one file until the deadline or an error."""
    path, ref, other = pairs[i % len(pairs)][0], refs[i % len(pairs)], others[i % len(pairs)]
    rng = random.Random(i)
    flags = os.O_RDONLY | (os.O_DIRECT if i % 2 and hasattr(os, "O_DIRECT") else 0)
    reads = 0
    while time.monotonic() < deadline:
        try:
            fd = os.open(path, flags)
        except OSError as e:
            ended[i] = f"error at open ({errno.errorcode.get(e.errno, e.errno)}) after {reads} whole reads"
            return
        try:
            got = bytearray()
            while True:
                b = os.pread(fd, rng.choice([4096, 65536, 131072 + 7, 1 << 20]), len(got))
                if not b:
                    break
                got += b
        except OSError as e:
            ended[i] = f"error ({errno.errorcode.get(e.errno, e.errno)}) after {reads} whole reads"
            return
        finally:
            os.close(fd)
        if got != ref and (other is None or got != other):
            same = sum(1 for k in range(0, min(len(got), len(ref)), 4096) if got[k:k + 4096] == ref[k:k + 4096])
            errors.append(f"{path}: a whole read ({len(got)} of {len(ref)} bytes) equals neither version "
                          f"({same} of its 4 KiB pages are the original's)")
            ended[i] = "wrong bytes"
            return
        reads += 1
    ended[i] = f"original bytes ({reads} whole reads)"


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


if faults is not None:
    deadline = time.monotonic() + faults
    threads = [threading.Thread(target=whole_reads, args=(i, deadline), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline + 10 - time.monotonic()))
    hung = [i for i, t in enumerate(threads) if t.is_alive()]
    for i in range(n):
        print(f"reader {i}: {ended.get(i, 'HUNG: still inside a read 10 s after the end')}")
    if hung or errors:
        print("FAIL: " + "; ".join(errors[:5] + [f"{len(hung)} reader(s) hung"] * bool(hung)), flush=True)
        os._exit(1)   # hung threads cannot be joined
    sys.exit(0)

threads = [threading.Thread(target=reader, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if errors:
    sys.exit("FAIL: " + "; ".join(errors[:5]))
print(f"{n} concurrent readers of {len(pairs)} file(s): all bytes match")
