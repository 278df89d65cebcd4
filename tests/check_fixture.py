#!/usr/bin/env python3
"""Check `dcp ls --json` and `dcp cat` of one fixture checkpoint against its manifest.

Every key's bytes are checked: with one `dcp cat` each, or, for a checkpoint of
more than CAT_ALL keys of tensors only, with one `dcp convert` to a safetensors
file read here (the same read path, one process instead of thousands) and
`dcp cat` of a sample of CAT_ALL keys.

usage: check_fixture.py DCP CASE_DIR   (CASE_DIR holds ckpt/ and expected/manifest.json)
"""
import hashlib, json, os, random, struct, subprocess, sys, tempfile

CAT_ALL = 64

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


def safetensors_digests(path):
    """sha256 of each tensor's bytes in a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for key, t in header.items():
            if key == "__metadata__":
                continue
            a, b = t["data_offsets"]
            f.seek(base + a)
            out[key] = hashlib.sha256(f.read(b - a)).hexdigest()
    return out


cat_keys = set(want)
if len(want) > CAT_ALL and all(e["kind"] == "tensor" for e in want.values()):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "all.safetensors")
        subprocess.run([dcp, "convert", "--quiet", "--no-sync", ckpt, out], check=True)
        digests = safetensors_digests(out)
    for key, e in want.items():
        if digests.get(key) != e["sha256"]:
            sys.exit(f"{case}: {key}: sha256 {digests.get(key)} (dcp convert) != manifest {e['sha256']}")
    cat_keys = set(random.Random(1).sample(sorted(want), CAT_ALL))

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
    if key not in cat_keys and key not in box_keys:
        continue
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
