#!/usr/bin/env python3
"""Drop files from the page cache, so that the next read comes from the storage.

    python3 bench/evict.py PATH...      (a directory: its regular files)

Each file is fsync'ed first (dirty pages cannot be dropped: a checkpoint just
written would otherwise stay cached) and then advised POSIX_FADV_DONTNEED. A
file system that cannot sync a read-only descriptor (a FUSE mount) is only
advised. The benchmarks and tests import evict() from here.
"""
import os
import sys
from typing import Iterable


def files_of(paths: Iterable[str]) -> list[str]:
    """The paths given, with each directory replaced by its regular files."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            out += [f for f in (os.path.join(p, n) for n in sorted(os.listdir(p))) if os.path.isfile(f)]
        else:
            out.append(p)
    return out


def evict(paths: Iterable[str]) -> None:
    """Drop every page of the files (or directories' files) in paths from the page cache."""
    for f in files_of(paths):
        fd = os.open(f, os.O_RDONLY)
        try:
            try:
                os.fsync(fd)
            except OSError:
                pass   # EROFS/EINVAL: nothing of it can be dirty
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: evict.py PATH...")
    evict(sys.argv[1:])
