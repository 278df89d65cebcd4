#!/usr/bin/env python3
"""Check `dcp ls --json` and `dcp cat` of one fixture checkpoint against its manifest.

usage: check_fixture.py DCP CASE_DIR   (CASE_DIR holds ckpt/ and expected/manifest.json)
"""
import hashlib, json, random, subprocess, sys

dcp, case = sys.argv[1], sys.argv[2]
ckpt = case + "/ckpt"
manifest = json.load(open(case + "/expected/manifest.json"))
want = {e["key"]: e for e in manifest["entries"]}

ls = subprocess.run([dcp, "ls", "--json", ckpt], check=True, capture_output=True, text=True).stdout
got = {}
for line in ls.splitlines():
    row = json.loads(line)
    got[row["key"]] = row
if set(got) != set(want):
    sys.exit(f"{case}: keys differ: missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}")

box_keys = set(random.Random(0).sample(sorted(want), min(30, len(want))))
for key, e in want.items():
    g = got[key]
    if g["kind"] != e["kind"]:
        sys.exit(f"{case}: {key}: kind {g['kind']} != {e['kind']}")
    if e["kind"] == "tensor":
        if g["dtype"] != e["dtype"] or g["shape"] != e["shape"]:
            sys.exit(f"{case}: {key}: {g['dtype']}{g['shape']} != {e['dtype']}{e['shape']}")
        if g["chunks"] != len(e["chunks"]):
            sys.exit(f"{case}: {key}: {g['chunks']} chunks, manifest has {len(e['chunks'])}")
    if g["nbytes"] != e["nbytes"]:
        sys.exit(f"{case}: {key}: nbytes {g['nbytes']} != {e['nbytes']}")
    data = subprocess.run([dcp, "cat", ckpt, key], check=True, capture_output=True).stdout
    digest = hashlib.sha256(data).hexdigest()
    if digest != e["sha256"]:
        sys.exit(f"{case}: {key}: sha256 {digest} != manifest {e['sha256']}")

    # A few random boxes must equal the same box cut from the whole tensor.
    if key in box_keys and e["kind"] == "tensor" and e["numel"] > 0 and e["shape"]:
        shape, esz = e["shape"], e["itemsize"]
        rng = random.Random(key)
        for _ in range(3):
            off = [rng.randrange(0, d) for d in shape]
            cnt = [rng.randrange(1, d - o + 1) for d, o in zip(shape, off)]
            box = ",".join(f"{o}:{c}" for o, c in zip(off, cnt))
            part = subprocess.run([dcp, "cat", "--box", box, ckpt, key], check=True,
                                  capture_output=True).stdout
            strides = [esz] * len(shape)
            for d in range(len(shape) - 2, -1, -1):
                strides[d] = strides[d + 1] * shape[d + 1]
            expect = bytearray()
            def walk(d, base):
                if d == len(shape) - 1:
                    start = base + off[d] * strides[d]
                    expect.extend(data[start:start + cnt[d] * esz])
                    return
                for i in range(off[d], off[d] + cnt[d]):
                    walk(d + 1, base + i * strides[d])
            walk(0, 0)
            if part != bytes(expect):
                sys.exit(f"{case}: {key}: --box {box} differs from the same box of the whole tensor")
print(f"{case}: {len(want)} keys match the manifest")
