#!/usr/bin/env python3
"""Compare `dcp ls --json` and `dcp cat` of a checkpoint with truth.json from a PyTorch save.

usage: check_truth.py DCP CKPT TRUTH_JSON
Bytes items are read back with torch.load to prove they are the stored torch.save archives.
In a sanitizer build (DCP_SANITIZED set) every fourth key is cat (in key order):
each dcp process there costs a sanitized start and parse, and the default build's run of
the same test cats every key.
"""
import hashlib, io, json, os, subprocess, sys

dcp, ckpt, truth_path = sys.argv[1:4]
truth = json.load(open(truth_path))
rows = {}
for line in subprocess.run([dcp, "ls", "--json", ckpt], check=True, capture_output=True, text=True).stdout.splitlines():
    r = json.loads(line)
    rows[r["key"]] = r
missing = sorted(set(truth) - set(rows))
if missing:
    sys.exit(f"{ckpt}: keys missing from dcp ls: {missing} (have {sorted(rows)})")
sampled = bool(os.environ.get("DCP_SANITIZED"))
checked = 0
for i, (key, t) in enumerate(sorted(truth.items())):
    r = rows[key]
    if r["kind"] != t["kind"]:
        sys.exit(f"{key}: kind {r['kind']} != {t['kind']}")
    tensor = t["kind"] == "tensor"
    if tensor and (r["dtype"] != t["dtype"] or r["shape"] != t["shape"]):
        sys.exit(f"{key}: {r['dtype']}{r['shape']} != {t['dtype']}{t['shape']}")
    if sampled and i % 4:
        continue
    checked += 1
    data = subprocess.run([dcp, "cat", ckpt, key], check=True, capture_output=True).stdout
    if tensor:
        got = hashlib.sha256(data).hexdigest()
        if got != t["sha256"]:
            sys.exit(f"{key}: sha256 {got} != {t['sha256']}")
    else:
        import torch
        torch.load(io.BytesIO(data), weights_only=False)
print(f"{ckpt}: {len(truth)} keys as dcp ls says, {checked} of them dcp cat byte-exact")
