#!/usr/bin/env python3
"""Check a converted checkpoint, key by key, against a fixture's manifest with `dcp cat`.

usage: writer_check.py DCP OUT MANIFEST [--no-bytes | --tensors] [--keys PREFIX]
OUT is anything `dcp` opens (a DCP or safetensors folder, a .pt or .safetensors file).
Tensors must all be there with the manifest's dtype, shape and sha256; bytes items too
(sha256 of the stored blob) unless --no-bytes, which requires them to be absent, or
--tensors, which checks the tensors alone (bytes items may be there under other keys).
"""
import hashlib, json, subprocess, sys

dcp, out, manifest = sys.argv[1], sys.argv[2], sys.argv[3]
no_bytes = "--no-bytes" in sys.argv
tensors_only = "--tensors" in sys.argv
prefix = sys.argv[sys.argv.index("--keys") + 1] if "--keys" in sys.argv else None
want = {e["key"]: e for e in json.load(open(manifest))["entries"]}
if prefix:
    want = {k: e for k, e in want.items() if k == prefix or k.startswith(prefix + ".")}
if no_bytes or tensors_only:
    want = {k: e for k, e in want.items() if e["kind"] == "tensor"}
ls = subprocess.run([dcp, "--no-catalog", "ls", "--json", out], check=True, capture_output=True, text=True).stdout
got = {}
for line in ls.splitlines():
    row = json.loads(line)
    if not tensors_only or row["kind"] == "tensor":
        got[row["key"]] = row
if set(got) != set(want):
    sys.exit(f"{out}: keys differ: missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}")
for key, e in want.items():
    g = got[key]
    if g["kind"] != e["kind"] or (e["kind"] == "tensor" and (g["dtype"] != e["dtype"] or g["shape"] != e["shape"])):
        sys.exit(f"{out}: {key}: {g} does not match the manifest")
    data = subprocess.run([dcp, "--no-catalog", "cat", out, key], check=True, capture_output=True).stdout
    if hashlib.sha256(data).hexdigest() != e["sha256"]:
        sys.exit(f"{out}: {key}: sha256 differs from the manifest")
print(f"{out}: {len(want)} keys match")
