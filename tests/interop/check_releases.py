"""Check every checkpoint of tests/data/torch-releases against the truth its release wrote.

usage: check_releases.py DCP ROOT [MOUNT]

ROOT/<release>/<case>/ckpt is a checkpoint that PyTorch <release> wrote and truth.json its own
view of it (tests/interop/save_torch_release.py). For each one:
  - `dcp --no-catalog ls --json`: the same keys, kinds, dtypes and shapes;
  - `dcpfs.open(...).read`: each tensor's C-order bytes hash to the truth's sha256; `dcp digest
    --json`'s XXH3-128, parsed and through a catalog (written, then served), is the hash of
    those bytes; a bytes item (`dcp cat`) loads with torch.load to the value PyTorch loaded;
  - `dcp --no-catalog verify` passes and `dcp info` names the release's generation;
  - torch.distributed.checkpoint.load into full tensors with dcpfs.torch.Reader (PyTorch 2.13)
    gives the same bytes and values;
  - with MOUNT (ROOT mounted with dcpfs), every key's file (found by its user.dcp.key
    attribute) holds the same bytes.
The installed PyTorch's own FileSystemReader is tried too: where it fails, that is printed, not failed.
"""
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
import torch   # noqa: E402
import torch.distributed.checkpoint as dcp   # noqa: E402
import safetensors.torch   # noqa: E402
import xxhash   # noqa: E402

import dcpfs   # noqa: E402
import dcpfs.torch   # noqa: E402

DCP, ROOT = sys.argv[1], sys.argv[2]
MOUNT = sys.argv[3] if len(sys.argv) > 3 else None
failures = []


def fail(where, why):
    failures.append(f"{where}: {why}")


def run(*args):
    p = subprocess.run([DCP, *args], capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"dcp {' '.join(args)}: exit {p.returncode}: {p.stderr.decode(errors='replace').strip()}")
    return p.stdout


def c_bytes(t):
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def generation(release):
    """What `dcp info` must call a release's .metadata: the fields each release added."""
    minor = int(release.split(".")[1])
    if minor >= 9:
        return "torch 2.9+ (version "      # Metadata.version
    if minor >= 4:
        return "torch 2.4+ (StorageMeta)"  # Metadata.storage_meta
    if minor == 3:
        return "torch 2.3+"                # TensorProperties moved to checkpoint.metadata
    return "torch 2.0-2.2"


def destination(truth):
    return {k: (torch.zeros(t["shape"], dtype=getattr(torch, t["dtype"])) if t["kind"] == "tensor" else None)
            for k, t in truth.items()}


def compare_load(where, truth, sd):
    for key, t in truth.items():
        if t["kind"] == "tensor":
            if hashlib.sha256(c_bytes(sd[key])).hexdigest() != t["sha256"]:
                fail(where, f"{key}: other bytes than PyTorch's")
        elif repr(sd[key]) != t["repr"]:
            fail(where, f"{key}: {sd[key]!r}, PyTorch loaded {t['repr']}")


def check(release, case, catalog):
    where = f"{release}/{case}"
    notes = []
    ck = os.path.join(ROOT, release, case, "ckpt")
    truth = json.load(open(os.path.join(ROOT, release, case, "truth.json")))
    listed = {}
    for line in run("--no-catalog", "ls", "--json", ck).decode().splitlines():
        r = json.loads(line)
        listed[r["key"]] = r
    if set(listed) != set(truth):
        fail(where, f"dcp ls keys differ: missing {sorted(set(truth) - set(listed))}, "
                    f"extra {sorted(set(listed) - set(truth))}")
        return
    hashes = {}
    c = dcpfs.open(ck, catalog=False)
    for key, t in truth.items():
        r = listed[key]
        if r["kind"] != t["kind"]:
            fail(where, f"{key}: dcp ls says {r['kind']}, PyTorch stored {t['kind']}")
            continue
        if t["kind"] == "bytes":
            blob = run("--no-catalog", "cat", ck, key)
            if blob != c.read_bytes(key):
                fail(where, f"{key}: dcp cat and read_bytes differ")
            v = torch.load(io.BytesIO(blob), weights_only=False)
            if repr(v) != t["repr"]:
                fail(where, f"{key}: dcp cat loads to {v!r}, PyTorch loaded {t['repr']}")
            hashes[key] = xxhash.xxh3_128_hexdigest(blob)
            continue
        if r["dtype"] != t["dtype"] or r["shape"] != t["shape"]:
            fail(where, f"{key}: dcp ls {r['dtype']}{r['shape']}, PyTorch {t['dtype']}{t['shape']}")
        info = c.info(key)
        if info.dtype != t["dtype"] or list(info.shape) != t["shape"]:
            fail(where, f"{key}: dcpfs.open info {info.dtype}{info.shape}, PyTorch {t['dtype']}{t['shape']}")
        raw = c.read(key).tobytes()
        if hashlib.sha256(raw).hexdigest() != t["sha256"]:
            fail(where, f"{key}: dcpfs.open read: other bytes than PyTorch's")
        hashes[key] = xxhash.xxh3_128_hexdigest(raw)
    c.close()
    for how in ("parsed", "catalog written", "catalog served"):
        flags = ["--no-catalog"] if how == "parsed" else ["--catalog", catalog]
        for line in run(*flags, "digest", "--json", ck).decode().splitlines():
            r = json.loads(line)
            if hashes.get(r["key"]) != r["xxh3_128"]:
                fail(where, f"{r['key']}: dcp digest ({how}) {r['xxh3_128']}, the bytes hash to {hashes.get(r['key'])}")
    if b"rebuilt from the catalog" not in run("--catalog", catalog, "info", ck):
        fail(where, "dcp info not served from the catalog")
    fmt = run("--no-catalog", "info", ck).decode().split("format:", 1)[1].split("\n", 1)[0].strip()
    if not fmt.startswith(generation(release)):
        fail(where, f"dcp info says format {fmt!r}, not {generation(release)!r}")
    run("--no-catalog", "verify", ck)
    sd = destination(truth)
    dcp.load(sd, storage_reader=dcpfs.torch.Reader(ck, catalog=False))
    compare_load(f"{where} (dcp.load with dcpfs.torch.Reader)", truth, sd)
    if MOUNT:
        seen, in_st = set(), set()
        top = os.path.join(MOUNT, release, case, "ckpt")
        for d, _, files in os.walk(top):
            for name in files:
                p = os.path.join(d, name)
                try:
                    key = os.getxattr(p, "user.dcp.key").decode()
                except OSError:   # all.safetensors: every tensor in one safetensors file
                    for k, v in safetensors.torch.load(open(p, "rb").read()).items():
                        if xxhash.xxh3_128_hexdigest(c_bytes(v)) != hashes.get(k):
                            fail(where, f"{k}: {os.path.relpath(p, MOUNT)} holds other bytes")
                        in_st.add(k)
                    continue
                seen.add(key)
                data = open(p, "rb").read()
                if xxhash.xxh3_128_hexdigest(data) != hashes.get(key):
                    fail(where, f"{key}: the mounted file {os.path.relpath(p, MOUNT)} holds other bytes")
        if seen != set(truth):
            fail(where, f"mounted keys differ: missing {sorted(set(truth) - seen)}")
        no_st = sorted(k for k, t in truth.items() if t["kind"] == "tensor" and k not in in_st)
        if no_st:
            notes.append(f"not in all.safetensors: {', '.join(no_st)}")
    # PyTorch's own reader, for the record only (its tracebacks, logged to fd 2, silenced)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        sd = destination(truth)
        dcp.load(sd, storage_reader=dcp.FileSystemReader(ck))
    except BaseException as e:   # CheckpointException is a BaseException
        notes.append(f"PyTorch {torch.__version__}'s FileSystemReader fails ({type(e).__name__})")
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
    return len(truth), notes


def main():
    releases = sorted((d for d in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, d))),
                      key=lambda v: [int(x) for x in v.split(".")])
    if not releases:
        sys.exit(f"{ROOT}: no releases")
    with tempfile.TemporaryDirectory() as tmp:
        catalog = os.path.join(tmp, "catalog.sqlite")
        for release in releases:
            by = json.load(open(os.path.join(ROOT, release, "written_by.json")))
            cases = sorted(by["written"])
            if not cases:
                fail(release, "no checkpoint written")
            before = len(failures)
            notes = []
            for case in cases:
                try:
                    n, case_notes = check(release, case, catalog)
                    if n != by["written"][case]:
                        fail(f"{release}/{case}", f"{n} keys in the truth, {by['written'][case]} written")
                    notes += [(case, x) for x in case_notes]
                except Exception as e:
                    fail(f"{release}/{case}", f"{type(e).__name__}: {e}")
            ok = "ok" if len(failures) == before else "FAILED"
            said = []
            for x in dict.fromkeys(x for _, x in notes):   # a note every case has is said once
                where = [c for c, y in notes if y == x]
                said.append(x if len(where) == len(cases) else f"{', '.join(where)}: {x}")
            counts = ", ".join("%s %d" % (c, by["written"][c]) for c in cases)
            print(f"torch {by['torch']}: {counts} keys: {ok}"
                  + (f" ({'; '.join(said)})" if said else ""))
    if failures:
        print("\n".join(failures[:40]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
