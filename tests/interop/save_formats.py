#!/usr/bin/env python3
"""Write single-process DCP checkpoints in each on-disk format PyTorch has, and their truth.

usage: save_formats.py OUT_DIR VARIANT...   (writes OUT_DIR/VARIANT/ckpt and truth.tsv)
       save_formats.py --describe CKPT       (what the format put on disk, for humans)
       save_formats.py --check-bytes OUT_DIR/VARIANT/bytes/KEY...   (torch.load dcp cat output)

VARIANT:
  torch_save        FileSystemWriter default (one torch.save zip per tensor chunk)
  torch_save_files  FileSystemWriter(single_file_per_rank=False): one .distcp per item
  safetensors       FileSystemWriter(serialization_format=SerializationFormat.SAFETENSORS)
  zstd              FileSystemWriter(_extensions=[ZStandard()])
  hf                HuggingFaceStorageWriter, two files and model.safetensors.index.json
  hf_distributed    HuggingFaceStorageWriter(save_distributed=True): shard-...safetensors
  hf_consolidated   ... enable_consolidation=True: sharded/ plus consolidated model files

OUT_DIR/VARIANT/ckpt is the checkpoint; OUT_DIR/VARIANT/truth.tsv has one line per key:
  KEY <TAB> tensor <TAB> DTYPE <TAB> SHAPE <TAB> SHA256 of the C-order bytes
  KEY <TAB> bytes  <TAB> - <TAB> - <TAB> repr of the value
"""
import hashlib, io, json, os, pickle, struct, sys, warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemWriter  # noqa: E402


def c_bytes(t):
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def tensors(variant):
    g = torch.Generator().manual_seed(13)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    t = {
        "w.f32": r(7, 9),
        "w.f64": r(5, 3).double(),
        "w.f16": r(4, 6).half(),
        "w.bf16": r(33, 17).bfloat16(),                       # v2 rebuild, BFloat16Storage
        "w.f8e4m3": r(6, 10).to(torch.float8_e4m3fn),          # v3 rebuild, UntypedStorage
        "w.f8e5m2": r(3, 5).to(torch.float8_e5m2),
        "w.u16": torch.randint(0, 65535, (11, 3), generator=g).to(torch.uint16),   # v3
        "w.u32": torch.randint(0, 2**31, (4, 4), generator=g).to(torch.uint32),    # v3
        "w.u64": torch.randint(0, 2**62, (3,), generator=g).to(torch.uint64),      # v3
        "w.i8": torch.randint(-128, 127, (9,), generator=g).to(torch.int8),
        "w.i16": torch.randint(-30000, 30000, (2, 7), generator=g).to(torch.int16),
        "w.i32": torch.randint(-2**31, 2**31 - 1, (5, 2), generator=g).to(torch.int32),
        "w.i64": torch.randint(-2**62, 2**62, (3, 3), generator=g),
        "w.u8": torch.randint(0, 255, (17,), generator=g).to(torch.uint8),
        "w.bool": torch.rand(6, 5, generator=g) > 0.5,
        "w.c64": torch.randn(4, 3, dtype=torch.complex64, generator=g),
        "w.c128": torch.randn(2, 2, dtype=torch.complex128, generator=g),
        "s.scalar": torch.tensor(2.5),                           # 0-d
        "s.empty": torch.zeros(0, 4),                            # zero-length record
        "s.big": r(512, 640),                                    # 1.25 MiB: several zstd blocks
        "s.zeros": torch.zeros(256, 1024),                       # compresses ~1000x
    }
    if variant in ("torch_save", "torch_save_files", "zstd"):
        # torch.save keeps a dense tensor's own strides and the conj/neg bits;
        # safetensors refuses non-contiguous tensors.
        t["v.transposed"] = r(10, 12).t()                       # stride (1, 12)
        t["v.channels_last"] = r(2, 3, 4, 5).to(memory_format=torch.channels_last)
        t["v.conj"] = torch.randn(5, dtype=torch.complex64, generator=g).conj()
        t["v.neg"] = torch._neg_view(r(4, 4))
        t["v.param"] = torch.nn.Parameter(r(3, 4))
    else:
        del t["w.c128"]   # safetensors has no complex128
    if variant == "hf_consolidated":
        # PyTorch 2.13's consolidation calls torch.finfo on every dtype (floats only)
        # and writes zeros for 0-d tensors.
        t = {k: v for k, v in t.items() if v.is_floating_point() and v.dim() > 0}
    return t


def save(out, variant):
    sd = tensors(variant)
    values = {}
    if not variant.startswith("hf"):   # safetensors files hold tensors only
        values = {"extra.step": 1234, "extra.name": "formats"}
    state = dict(sd)
    state["extra"] = {k.split(".", 1)[1]: v for k, v in values.items()}
    rng = torch.arange(5.0) if variant == "hf_consolidated" else torch.arange(5)
    state["extra"]["rng"] = sd["extra.rng"] = rng   # nested: DCP flattens it to extra.rng
    path = os.path.join(out, "ckpt")
    if variant == "torch_save":
        w = FileSystemWriter(path)
    elif variant == "torch_save_files":
        w = FileSystemWriter(path, single_file_per_rank=False)
    elif variant == "safetensors":
        from torch.distributed.checkpoint.filesystem import SerializationFormat
        w = FileSystemWriter(path, serialization_format=SerializationFormat.SAFETENSORS)
    elif variant == "zstd":
        from torch.distributed.checkpoint._extension import ZStandard
        w = FileSystemWriter(path, _extensions=[ZStandard()])
    else:
        from torch.distributed.checkpoint import HuggingFaceStorageWriter
        if variant == "hf":
            keys = sorted(sd)
            mapping = {k: 1 + (i % 2) for i, k in enumerate(keys)}
            w = HuggingFaceStorageWriter(path, fqn_to_index_mapping=mapping)
        elif variant == "hf_distributed":
            w = HuggingFaceStorageWriter(path, save_distributed=True)
        elif variant == "hf_consolidated":
            w = HuggingFaceStorageWriter(path, save_distributed=True, enable_consolidation=True)
        else:
            sys.exit(f"unknown variant {variant}")
    dcp.save(state, storage_writer=w)
    with open(os.path.join(out, "truth.tsv"), "w") as f:
        for k, v in sd.items():
            shape = ",".join(str(s) for s in v.shape)
            dt = str(v.dtype).replace("torch.", "")
            sha = hashlib.sha256(c_bytes(v)).hexdigest()
            f.write("\t".join([k, "tensor", dt, f"[{shape}]", sha]) + "\n")
        for k, v in values.items():
            f.write(f"{k}\tbytes\t-\t-\t{v!r}\n")


def check_bytes(files):
    """Each file VARIANT/bytes/KEY (dcp cat of a bytes item) must torch.load to the value
    VARIANT/truth.tsv records for KEY."""
    bad = 0
    for path in files:
        vdir = os.path.dirname(os.path.dirname(path))
        key = os.path.basename(path)
        want = None
        for line in open(os.path.join(vdir, "truth.tsv")):
            f = line.rstrip("\n").split("\t")
            if f[0] == key:
                want = f[4]
        with open(path, "rb") as fh:
            got = repr(torch.load(io.BytesIO(fh.read()), weights_only=False))
        if got != want:
            print(f"{path}: torch.load of dcp cat gives {got}, PyTorch saved {want}")
            bad += 1
    sys.exit(1 if bad else 0)


def describe(ckpt):
    """Print what is on disk: the storage infos and, per blob, its container."""
    meta = os.path.join(ckpt, ".metadata")
    if not os.path.exists(meta):
        for root, _, files in sorted(os.walk(ckpt)):
            for name in sorted(files):
                p = os.path.join(root, name)
                rel = os.path.relpath(p, ckpt)
                if not name.endswith(".safetensors"):
                    print(f"{rel}: {os.path.getsize(p)} bytes: {open(p).read()[:200]!r}")
                    continue
                with open(p, "rb") as f:
                    n = struct.unpack("<Q", f.read(8))[0]
                    h = json.loads(f.read(n))
                md = h.pop("__metadata__", {})
                print(f"{rel}: header {n} bytes, {len(h)} tensors, __metadata__ keys {sorted(md)}")
                for k, v in list(h.items())[:3]:
                    print(f"   {k}: {v}")
                if "DCP_SHARDING_INFO" in md:
                    print(f"   DCP_SHARDING_INFO: {md['DCP_SHARDING_INFO'][:160]}")
        return
    m = pickle.load(open(meta, "rb"))
    print(f"Metadata.version={m.version!r} storage_meta={m.storage_meta!r}")
    for idx, si in m.storage_data.items():
        path = os.path.join(ckpt, si.relative_path)
        with open(path, "rb") as f:
            f.seek(si.offset)
            head = f.read(min(si.length, 16))
        kind = "zip" if head[:4] == b"PK\x03\x04" else "zstd" if head[:4] == b"\x28\xb5\x2f\xfd" else "other"
        extra = ""
        if kind == "other" and len(head) >= 8:
            n = struct.unpack("<Q", head[:8])[0]
            extra = f" (as a safetensors header length: {n})"
        off = tuple(idx.offset) if idx.offset is not None else None
        print(f"{idx.fqn} {off}: {si.relative_path} offset={si.offset} length={si.length} "
              f"transforms={getattr(si, 'transform_descriptors', None)} first bytes={kind}{extra}")


if __name__ == "__main__":
    if sys.argv[1] == "--describe":
        describe(sys.argv[2])
    elif sys.argv[1] == "--check-bytes":
        check_bytes(sys.argv[2:])
    else:
        for v in sys.argv[2:]:   # one process: importing torch is the slow part
            os.makedirs(os.path.join(sys.argv[1], v), exist_ok=True)
            save(os.path.join(sys.argv[1], v), v)
