#!/usr/bin/env python3
"""Read files once, sequentially, and report the time it took (for bench-fuse.sh).

usage: fuse_read.py [--pid PID] [--evict PATH]... FILE...
  --evict PATH  drop PATH's pages from the page cache first (posix_fadvise
                DONTNEED: only that file, the rest of the machine's cache stays)
  --pid PID  also report the CPU time process PID (a FUSE daemon) spent meanwhile

Reads use one reused, page-aligned 1 MiB buffer (readinto), like dd bs=1M (a
buffer 16 bytes past a page boundary copies several times slower on some CPUs).
Prints one line:
  BYTES WALL_SECONDS READER_CPU_SECONDS DAEMON_CPU_SECONDS
CPU times are user + system; the daemon's is 0 without --pid.
"""
import mmap, os, resource, sys, time

from evict import evict as drop_cached  # bench/evict.py


def daemon_cpu(pid):
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime


def main():
    args, pid, evict = sys.argv[1:], None, []
    while args and args[0].startswith("--"):
        if args[0] == "--pid":
            pid, args = int(args[1]), args[2:]
        elif args[0] == "--evict":
            evict.append(args[1])
            args = args[2:]
        else:
            sys.exit(f"unknown option {args[0]}")
    drop_cached(evict)
    buf = mmap.mmap(-1, 1 << 20)
    view = memoryview(buf)
    total = 0
    r0, d0, t0 = resource.getrusage(resource.RUSAGE_SELF), daemon_cpu(pid), time.perf_counter()
    for p in args:
        with open(p, "rb", buffering=0) as f:
            while True:
                n = f.readinto(view)
                if not n:
                    break
                total += n
    t1, d1, r1 = time.perf_counter(), daemon_cpu(pid), resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(f"{total} {t1 - t0:.6f} {cpu:.6f} {d1 - d0:.6f}")


if __name__ == "__main__":
    main()
