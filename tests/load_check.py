#!/usr/bin/env python3
"""Check dcpload --json runs of one fixture against the ground truth.

usage: [LOAD_CHECK_DCP_OPTS=--megatron-fold] load_check.py DCP CKPT TRUTH RUN_DIR [UNIQUE]
TRUTH is a fixture's expected/manifest.json or a truth.json written by
tests/interop/save_dtensor.py. RUN_DIR holds <layout>-<nranks>.json, each the
--json output of `mpiexec -n NRANKS dcpload CKPT --layout LAYOUT --json`.

Ground truth: each tensor whole from `dcp cat`, checked against the sha256 of
the manifest (or truth.json); each rank's region is cut from it with numpy and its
XXH3-64 (libxxhash through ctypes) compared with the rank's. The regions
themselves are recomputed from the layout rules (numpy.array_split, the P x Q
grid). Statistics: bytes sent equal bytes received, and the ranks together
read exactly the unique storage bytes the tensors need, computed from the
manifest's record layout (storage offset, strides) where it has one, or given as UNIQUE.
"""
import ctypes, ctypes.util, glob, hashlib, json, math, os, subprocess, sys

import numpy as np

dcp, ckpt, truth, rundir = sys.argv[1:5]
# LOAD_CHECK_DCP_OPTS: dcp's global options for the runs' view (--megatron-fold)
dcp = [dcp] + os.environ.get("LOAD_CHECK_DCP_OPTS", "").split()
case = os.path.dirname(os.path.abspath(ckpt))
doc = json.load(open(truth))
if "entries" in doc:   # a fixture manifest
    tensors = [e for e in doc["entries"] if e["kind"] == "tensor"]
else:                  # truth.json: itemsize from dcp ls, no record layout
    ls = {}
    out = subprocess.run(dcp + ["ls", "--json", ckpt], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        row = json.loads(line)
        ls[row["key"]] = row
    tensors = []
    for key, t in doc.items():
        if t["kind"] != "tensor":
            continue
        numel = math.prod(t["shape"])
        tensors.append({"key": key, "shape": t["shape"], "sha256": t["sha256"],
                        "itemsize": ls[key]["nbytes"] // numel if numel else 1, "chunks": [{}]})

lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
lib.XXH3_64bits.restype = ctypes.c_uint64
lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(b):
    return "%016x" % lib.XXH3_64bits(b, len(b))


def fail(msg):
    sys.exit(f"{os.path.basename(case)}: {msg}")


# the whole tensors, as byte arrays of shape + (itemsize,)
whole = {}
for e in tensors:
    data = subprocess.run(dcp + ["cat", ckpt, e["key"]], check=True, capture_output=True).stdout
    if hashlib.sha256(data).hexdigest() != e["sha256"]:
        fail(f"{e['key']}: dcp cat does not match the manifest's sha256")
    whole[e["key"]] = np.frombuffer(data, dtype=np.uint8).reshape(list(e["shape"]) + [e["itemsize"]])


def split(n, parts, i):
    q, r = divmod(n, parts)
    return i * q + min(i, r), q + (1 if i < r else 0)


def share(shape, layout, rank, n):
    off, ln = [0] * len(shape), list(shape)
    if not shape or layout == "replicate":
        return off, ln
    last = len(shape) - 1
    if layout == "rows" or (layout == "blocks" and len(shape) == 1):
        off[0], ln[0] = split(shape[0], n, rank)
    elif layout == "cols":
        off[last], ln[last] = split(shape[last], n, rank)
    else:
        p = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
        q = n // p
        off[0], ln[0] = split(shape[0], p, rank // q)
        off[last], ln[last] = split(shape[last], q, rank % q)
    return off, ln


def unique_bytes():
    """Union of the storage bytes every chunk's elements occupy, or None."""
    spans = {}
    for e in tensors:
        for c in e["chunks"]:
            st = c.get("stored_tensor")
            if st is None:
                return None
            size = st["size"]
            if any(s == 0 for s in size):
                continue
            addr = np.array(st["storage_offset"], dtype=np.int64)
            for d, (s, k) in enumerate(zip(size, st["stride"])):
                shape = [1] * len(size)
                shape[d] = s
                addr = addr + (np.arange(s, dtype=np.int64) * k).reshape(shape)
            isz = e["itemsize"]
            starts = st["data_offset_in_file"] + np.unique(addr.reshape(-1)) * isz
            spans.setdefault(c["file"], []).append(starts)
            spans.setdefault(c["file"] + "#isz", []).append(np.full(len(starts), isz))
    total = 0
    for f in [k for k in spans if not k.endswith("#isz")]:
        s = np.concatenate(spans[f])
        z = np.concatenate(spans[f + "#isz"])
        order = np.argsort(s, kind="stable")
        s, z = s[order], z[order]
        end = -1
        for a, l in zip(s.tolist(), z.tolist()):
            b = a + l
            if a >= end:
                total += l
            elif b > end:
                total += b - end
            end = max(end, b)
    return total


U = int(sys.argv[5]) if len(sys.argv) > 5 else unique_bytes()
runs = sorted(glob.glob(os.path.join(rundir, "*.json")))
if not runs:
    fail("no runs")
single_read = {}
for path in runs:
    layout, n = os.path.basename(path)[:-5].rsplit("-", 1)
    n = int(n)
    seen, stats = {}, {}
    for line in open(path):
        row = json.loads(line)
        r = row["rank"]
        if "bytes_read" in row:
            stats[r] = row
            continue
        seen[(r, row["key"])] = row
    if sorted(stats) != list(range(n)):
        fail(f"{path}: statistics lines for ranks {sorted(stats)}, expected 0..{n - 1}")
    for e in tensors:
        for r in range(n):
            row = seen.pop((r, e["key"]), None)
            if row is None:
                fail(f"{path}: rank {r} did not report {e['key']}")
            off, ln = share(e["shape"], layout, r, n)
            if row["offsets"] != off or row["lengths"] != ln:
                fail(f"{path}: rank {r} {e['key']}: region {row['offsets']}/{row['lengths']}, "
                     f"expected {off}/{ln}")
            cut = whole[e["key"]][tuple(slice(o, o + l) for o, l in zip(off, ln))]
            want = xxh3(np.ascontiguousarray(cut).tobytes())
            if row["xxh3"] != want:
                fail(f"{path}: rank {r} {e['key']} {off}/{ln}: xxh3 {row['xxh3']}, ground truth {want}")
    if seen:
        fail(f"{path}: unexpected lines {sorted(seen)[:3]}")
    sent = sum(s["bytes_sent"] for s in stats.values())
    recv = sum(s["bytes_received"] for s in stats.values())
    read = sum(s["bytes_read"] for s in stats.values())
    if sent != recv:
        fail(f"{path}: ranks sent {sent} bytes but received {recv}")
    # every layout needs every stored byte of every tensor: each is read once
    if U is not None and read != U:
        fail(f"{path}: ranks read {read} bytes in total, the tensors need {U} unique bytes")
    single_read.setdefault(layout, {})[n] = read
for layout, by_n in single_read.items():
    if len(set(by_n.values())) != 1:
        fail(f"{layout}: total bytes read differs with the number of ranks: {by_n}")
print(f"ok {os.path.basename(case)}: {len(runs)} runs, {len(tensors)} tensors, unique bytes {U}")
