#!/usr/bin/env python3
"""Truth lines ("KEY<TAB>[SHAPE]<TAB>XXH3_128", the form tests/interop/megatron_releases.py
and save_reformulated.py write) for the interop tests.

usage: truth_check.py lines < DIGEST_JSON   `dcp digest --json` lines as truth lines
                                            (shape "bytes" for a bytes item)
       truth_check.py mount MNT TRUTH       every key file of a dcpfs mount (its
                                            user.dcp.key attribute) against TRUTH:
                                            the same keys, the same XXH3-128 of its bytes
"""
import json
import os
import sys


def lines():
    for line in sys.stdin:
        r = json.loads(line)
        shape = "bytes" if r["dtype"] == "bytes" else "[" + ",".join(map(str, r["shape"])) + "]"
        print("%s\t%s\t%s" % (r["key"], shape, r["xxh3_128"]))


def mount(mnt, truth):
    import xxhash
    want = {line.split("\t")[0]: line.split("\t")[2].strip() for line in open(truth)}
    seen = {}
    for top, dirs, files in os.walk(mnt):
        for name in files:
            path = os.path.join(top, name)
            try:
                key = os.getxattr(path, "user.dcp.key").decode()
            except OSError:
                continue   # all.safetensors, Megatron's metadata.json and common.pt
            with open(path, "rb") as f:
                seen[key] = xxhash.xxh3_128_hexdigest(f.read())
    bad = sorted(k for k in want if seen.get(k) != want[k])
    extra = sorted(set(seen) - set(want))
    for k in bad:
        print(f"{k}: mount {seen.get(k, 'missing')}, truth {want[k]}")
    for k in extra:
        print(f"{k}: on the mount, not in the truth")
    return 1 if bad or extra else 0


if __name__ == "__main__":
    if sys.argv[1] == "lines":
        lines()
    else:
        sys.exit(mount(sys.argv[2], sys.argv[3]))
