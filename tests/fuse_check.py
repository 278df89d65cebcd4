#!/usr/bin/env python3
"""Check a dcpfs mount against a fixture manifest (or a truth.json from a PyTorch save).

usage:
  fuse_check.py tree   MNT MANIFEST [--npy] [--ckpt=DIR]
                                             every file: path, size, sha256, xattrs; ls -R set;
                                             with --ckpt, DIR's plain files appear as they are
  fuse_check.py ranges MNT MANIFEST DCP CKPT  random-offset dd reads against `dcp cat`
  fuse_check.py npy    MNT MANIFEST           numpy.load of every tensor (view=npy)
  fuse_check.py path   KEY [KEY...]           print the mount path of each key (raw view)
  fuse_check.py safetensors MNT MANIFEST DCP CKPT
                                             MNT/all.safetensors: its header, safe_open (torch and
                                             numpy) against the manifest's sha256, random-offset
                                             reads against `dcp cat`
  fuse_check.py eio    VIEW KEY BYTES DAMAGED  an all.safetensors VIEW over a damaged checkpoint,
                                             read with O_DIRECT: KEY holds the file BYTES'
                                             bytes, a read of DAMAGED fails with EIO

MANIFEST is expected/manifest.json ({"entries": [{key, kind, dtype, shape, nbytes, sha256, chunks}]})
or a truth.json ({key: {kind, dtype, shape, sha256}}).
The key -> path mapping is the one documented in dcpfs(1) and fuse/names.h.
"""
import errno, hashlib, json, os, random, subprocess, sys

VIEW = "all.safetensors"   # the virtual file of dcpfs(1) in every checkpoint root
# torch dtype -> safetensors dtype (those the view holds; the others are left out)
ST_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
             "complex64": "C64", "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64",
             "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3",
             "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4"}


def load_entries(path):
    m = json.load(open(path))
    if "entries" in m:
        return {e["key"]: e for e in m["entries"]}
    return {k: dict(v, key=k) for k, v in m.items()}


def encode(comp):
    return comp.replace("%", "%25").replace("/", "%2F") if comp else "%"


def decode(name):
    if name == "%":
        return ""
    return name.replace("%2F", "/").replace("%25", "%")


def paths(entries, npy=False):
    """key -> mount-relative path, and the set of directories."""
    dirs = set()
    for k in entries:
        enc = [encode(c) for c in k.split(".")]
        for i in range(1, len(enc)):
            dirs.add("/".join(enc[:i]))
    out = {}
    for k, e in entries.items():
        enc = [encode(c) for c in k.split(".")]
        p = "/".join(enc)
        if npy and e["kind"] == "tensor":
            p += ".npy"
        elif p in dirs:
            p += ".data"
        out[k] = p
    return out, dirs


def key_of(path, npy=False):
    """The inverse mapping: a mount path back to its key."""
    comps = path.split("/")
    last = comps[-1]
    for suffix in ((".npy",) if npy else ()) + (".data",):
        if last.endswith(suffix):
            last = last[: -len(suffix)]
            break
    return ".".join(decode(c) for c in comps[:-1] + [last])


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def fail(msg):
    sys.exit("FAIL: " + msg)


def passthrough_files(ckpt):
    """The plain files dcpfs shows beside the key tree (Megatron's metadata.json, common.pt)."""
    out = []
    for f in sorted(os.listdir(ckpt)):
        p = os.path.join(ckpt, f)
        if f.startswith(".") or f.endswith((".distcp", ".safetensors")) or not os.path.isfile(p) or os.path.islink(p):
            continue
        if f.startswith("__") and f.endswith(".metadata"):
            continue
        out.append(f)
    return out


def check_tree(mnt, entries, npy, ckpt=None):
    want, dirs = paths(entries, npy)
    extra_ok = passthrough_files(ckpt) if ckpt else []
    for f in extra_ok:
        if open(os.path.join(mnt, f), "rb").read() != open(os.path.join(ckpt, f), "rb").read():
            fail(f"{mnt}/{f}: differs from the checkpoint's {f}")
    seen_files, seen_dirs = set(), set()
    for root, ds, fs in os.walk(mnt):
        rel = os.path.relpath(root, mnt)
        for d in ds:
            seen_dirs.add(os.path.normpath(os.path.join(rel, d)))
        for f in fs:
            seen_files.add(os.path.normpath(os.path.join(rel, f)))
    files = set(want.values())
    if VIEW not in seen_files:
        fail(f"{mnt}: no {VIEW} in the checkpoint's root")
    st = os.stat(os.path.join(mnt, VIEW))
    if st.st_mode & 0o777 != 0o444 or st.st_nlink != 1 or not os.path.isfile(os.path.join(mnt, VIEW)):
        fail(f"{mnt}/{VIEW}: mode {oct(st.st_mode)} nlink {st.st_nlink}")
    extra = seen_files - files - set(extra_ok) - {VIEW}
    if files - seen_files or extra:
        fail(f"{mnt}: files missing {sorted(files - seen_files)[:5]}, extra {sorted(extra)[:5]}")
    if dirs != seen_dirs:
        fail(f"{mnt}: directories differ: missing {sorted(dirs - seen_dirs)[:5]}, extra {sorted(seen_dirs - dirs)[:5]}")
    for k, e in entries.items():
        p = os.path.join(mnt, want[k])
        if key_of(want[k], npy) != k:
            fail(f"{k}: path {want[k]} does not decode back")
        st = os.stat(p)
        if st.st_mode & 0o777 != 0o444 or st.st_nlink != 1:
            fail(f"{p}: mode {oct(st.st_mode)} nlink {st.st_nlink}")
        x = {a: os.getxattr(p, a).decode() for a in os.listxattr(p)}
        if x.get("user.dcp.key") != k or x.get("user.dcp.kind") != e["kind"]:
            fail(f"{p}: xattrs {x}")
        if e["kind"] == "tensor":
            if x.get("user.dcp.dtype") != e["dtype"] or json.loads(x.get("user.dcp.shape", "null")) != e["shape"]:
                fail(f"{p}: xattrs {x} do not match {e['dtype']}{e['shape']}")
            if "chunks" in e and int(x.get("user.dcp.chunks", "-1")) != len(e["chunks"]):
                fail(f"{p}: user.dcp.chunks {x.get('user.dcp.chunks')} != {len(e['chunks'])}")
        if npy and e["kind"] == "tensor":
            continue   # checked by `npy`
        if "nbytes" in e and st.st_size != e["nbytes"]:
            fail(f"{p}: size {st.st_size} != {e['nbytes']}")
        if "sha256" in e and sha(p) != e["sha256"]:
            fail(f"{p}: sha256 differs from the manifest")
    print(f"{mnt}: {len(entries)} files: paths, sizes, sha256 and xattrs match")


def check_ranges(mnt, entries, dcp, ckpt):
    want, _ = paths(entries)
    rng = random.Random(42)
    keys = sorted(entries)
    keys = rng.sample(keys, min(6, len(keys)))
    for k in keys:
        whole = subprocess.run([dcp, "cat", ckpt, k], check=True, capture_output=True).stdout
        p = os.path.join(mnt, want[k])
        n = len(whole)
        for bs in (1, 3, 4096, 65536):
            for _ in range(3):
                skip = rng.randrange(0, max(1, n // bs + 1))
                count = rng.randrange(1, 5)
                got = subprocess.run(["dd", f"if={p}", f"bs={bs}", f"skip={skip}", f"count={count}", "status=none"],
                                     check=True, capture_output=True).stdout
                exp = whole[skip * bs: (skip + count) * bs]
                if got != exp:
                    fail(f"{p}: dd bs={bs} skip={skip} count={count}: {len(got)} bytes differ from dcp cat")
    print(f"{mnt}: random-offset dd reads of {len(keys)} keys match dcp cat")


def check_npy(mnt, entries):
    import numpy as np
    want, _ = paths(entries, npy=True)
    n = 0
    for k, e in entries.items():
        if e["kind"] != "tensor":
            continue
        p = os.path.join(mnt, want[k])
        with open(p, "rb") as f:
            head = f.read(16)
            major = head[6]
            hlen = int.from_bytes(head[8:10], "little") if major == 1 else int.from_bytes(head[8:12], "little")
            if (hlen + (10 if major == 1 else 12)) % 64:
                fail(f"{p}: data does not start at a multiple of 64")
        a = np.load(p)
        if list(a.shape) != e["shape"]:
            fail(f"{p}: numpy shape {a.shape} != {e['shape']}")
        if "sha256" in e and hashlib.sha256(a.tobytes()).hexdigest() != e["sha256"]:
            fail(f"{p}: numpy data differs from the manifest")
        if e["dtype"] == "bfloat16" and a.dtype != np.dtype("<u2"):
            fail(f"{p}: bfloat16 should load as uint16 bits, got {a.dtype}")
        n += 1
    print(f"{mnt}: numpy.load of {n} tensors matches")


def view_tensors(entries):
    """The entries all.safetensors holds, in no particular order."""
    return {k: e for k, e in entries.items()
            if e["kind"] == "tensor" and e["dtype"] in ST_DTYPES and k != "__metadata__"}


def tensor_bytes(t):
    import torch
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def check_safetensors(mnt, entries, dcp, ckpt):
    import numpy as np
    from safetensors import safe_open
    p = os.path.join(mnt, VIEW)
    want = view_tensors(entries)
    size = os.stat(p).st_size
    with open(p, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little")
        if n % 8 or 8 + n > size:
            fail(f"{p}: header length {n} (file of {size} bytes)")
        hdr = json.loads(f.read(n))
    if hdr.pop("__metadata__", None) != {"format": "pt"}:
        fail(f"{p}: __metadata__ is not {{'format': 'pt'}}")
    if set(hdr) != set(want):
        fail(f"{p}: tensors missing {sorted(set(want) - set(hdr))[:5]}, extra {sorted(set(hdr) - set(want))[:5]}")
    at = 0
    order = sorted(hdr, key=lambda k: hdr[k]["data_offsets"])
    for k in order:
        h, e = hdr[k], want[k]
        if h["dtype"] != ST_DTYPES[e["dtype"]] or h["shape"] != e["shape"]:
            fail(f"{p}: {k}: {h['dtype']}{h['shape']}, expected {e['dtype']}{e['shape']}")
        b, end = h["data_offsets"]
        if b != at or ("nbytes" in e and end - b != e["nbytes"]):
            fail(f"{p}: {k}: data_offsets {h['data_offsets']} (expected to start at {at})")
        at = end
    if 8 + n + at != size:
        fail(f"{p}: size {size}, the header accounts for {8 + n + at}")
    # safe_open, torch and numpy frameworks, every tensor against the manifest.
    with safe_open(p, framework="pt") as f:
        if set(f.keys()) != set(want):
            fail(f"{p}: safe_open keys differ")
        for k in want:
            t = f.get_tensor(k)
            if list(t.shape) != want[k]["shape"] or str(t.dtype) != "torch." + want[k]["dtype"]:
                fail(f"{p}: {k}: safe_open gives {t.dtype}{list(t.shape)}")
            if "sha256" in want[k] and hashlib.sha256(tensor_bytes(t)).hexdigest() != want[k]["sha256"]:
                fail(f"{p}: {k}: safe_open bytes differ from the manifest")
    nnp = 0
    with safe_open(p, framework="np") as f:
        for k in want:
            if want[k]["dtype"] not in ("float64", "float32", "float16", "complex128", "complex64", "int64", "int32",
                                        "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool"):
                continue   # numpy has no bfloat16 or float8
            a = f.get_tensor(k)
            if list(a.shape) != want[k]["shape"]:
                fail(f"{p}: {k}: numpy shape {a.shape}")
            if "sha256" in want[k] and hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() != want[k]["sha256"]:
                fail(f"{p}: {k}: numpy bytes differ from the manifest")
            nnp += 1
    # Random reads of any offset and length (pread, and dd with several block
    # sizes) against the same bytes computed from `dcp cat` (at most 120 tensors
    # fetched), centred on the header's end, tensor boundaries and the end.
    rng = random.Random(7)
    cache = {}
    spans = [(8 + n + hdr[k]["data_offsets"][0], 8 + n + hdr[k]["data_offsets"][1], k) for k in order]
    with open(p, "rb") as f:
        whole_hdr = f.read(8 + n)   # parsed and checked above

    def keys_in(off, length):
        end = min(size, off + length)
        return {k for b, e, k in spans if b < end and e > off and e > b}

    def expect(off, length):
        end = min(size, off + length)
        out = bytearray(whole_hdr[off:end])
        for b, e, k in spans:
            if e <= off or b >= end or e == b:
                continue
            if k not in cache:
                cache[k] = subprocess.run([dcp, "cat", ckpt, k], check=True, capture_output=True).stdout
            out += cache[k][max(off, b) - b: min(end, e) - b]
        return bytes(out)

    points = [0, 8 + n, size] + [b for b, _, _ in rng.sample(spans, min(len(spans), 12))]
    reads = 0
    fd = os.open(p, os.O_RDONLY)
    try:
        while reads < 60 and len(cache) < 120:
            length = rng.choice([1, 2, 3, 5, 4096, 65536, 1 << 20, 3 << 20])
            off = max(0, min(size, rng.choice(points) - rng.randrange(0, length + 8)))
            while length > 1 and len(keys_in(off, 3 * length) - set(cache)) > 4:
                length //= 2   # many small tensors: keep `dcp cat` calls few
            if os.pread(fd, length, off) != expect(off, length):
                fail(f"{p}: pread({length}, {off}) differs from dcp cat")
            bs = rng.choice([b for b in (1, 3, 4096, 65536)
                             if b == 1 or len(keys_in(off - off % b, 3 * b) - set(cache)) <= 4])
            skip, count = off // bs, rng.randrange(1, 4)
            dd = subprocess.run(["dd", f"if={p}", f"bs={bs}", f"skip={skip}", f"count={count}", "status=none"],
                                check=True, capture_output=True).stdout
            if dd != expect(skip * bs, count * bs):
                fail(f"{p}: dd bs={bs} skip={skip} count={count} differs from dcp cat")
            reads += 1
    finally:
        os.close(fd)
    print(f"{p}: header, {len(want)} tensors through safe_open (torch), {nnp} through numpy match; "
          f"{reads} random reads match dcp cat")


def check_eio(view, key, want, damaged):
    fd = os.open(view, os.O_RDONLY | os.O_DIRECT)
    try:
        n = int.from_bytes(os.pread(fd, 8, 0), "little")
        hdr = json.loads(os.pread(fd, n, 8))
        b, e = hdr[key]["data_offsets"]
        if os.pread(fd, e - b, 8 + n + b) != open(want, "rb").read():
            fail(f"{view}: {key} differs")
        b, e = hdr[damaged]["data_offsets"]
        try:
            os.pread(fd, e - b, 8 + n + b)
        except OSError as ex:
            if ex.errno != errno.EIO:
                fail(f"{view}: reading {damaged}: {ex}, not EIO")
            return
        fail(f"{view}: reading {damaged} succeeded")
    finally:
        os.close(fd)


def main():
    cmd = sys.argv[1]
    if cmd == "path":
        out, _ = paths({k: {"kind": "tensor"} for k in sys.argv[2:]})
        for k in sys.argv[2:]:
            print(out[k])
        return
    if cmd == "eio":
        check_eio(*sys.argv[2:6])
        return
    mnt, entries = sys.argv[2], load_entries(sys.argv[3])
    if cmd == "tree":
        ckpt = [a[len("--ckpt="):] for a in sys.argv[4:] if a.startswith("--ckpt=")]
        check_tree(mnt, entries, "--npy" in sys.argv[4:], ckpt[0] if ckpt else None)
    elif cmd == "ranges":
        check_ranges(mnt, entries, sys.argv[4], sys.argv[5])
    elif cmd == "npy":
        check_npy(mnt, entries)
    elif cmd == "safetensors":
        check_safetensors(mnt, entries, sys.argv[4], sys.argv[5])
    else:
        fail("unknown command " + cmd)


if __name__ == "__main__":
    main()
