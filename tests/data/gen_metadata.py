#!/usr/bin/env python3
"""Generate the metadata test data in tests/data/metadata (run once, output committed).

usage: gen_metadata.py OUT_DIR real|synthetic

real       real saves with the installed PyTorch (2.13 here): pt_plain, pt_zstd (ZStandard
           extension: transform_descriptors), pt_ranklocal (2 gloo ranks, use_collectives=False:
           __R.metadata files), mcore (an MCoreMetadata-like subclass written by a stub module).
           Each folder holds the checkpoint and expected.json (entries with chunks, blob
           locations and the C-order bytes in hex; info fields).
synthetic  .metadata pickles written by Python's pickler from stub classes named like
           torch's (no torch import), for variants no installed torch writes: Python 3.13
           pathlib._local paths, float versions, dict/6-tuple TensorProperties state, the
           getattr enum encoding, int keys, slots state, bad transforms, the pre-1.13 schema,
           chunks outside the tensor, paths leaving the folder, not-DCP pickles.
"""
import json, os, pickle, shutil, socket, sys, types


def dtype_name(dt):
    return str(dt).replace("torch.", "")


def tensor_hex(t):
    import torch
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes().hex() if t.numel() else ""


def expected_from(md, values, layout):
    entries = []
    index = {}
    for idx, info in md.storage_data.items():
        index[(idx.fqn, tuple(idx.offset) if idx.offset is not None else None)] = info
    for key, m in md.state_dict_metadata.items():
        if type(m).__name__ == "BytesStorageMetadata":
            info = index[(key, None)]
            entries.append({"key": key, "kind": "bytes", "file": info.relative_path,
                            "offset": info.offset, "length": info.length})
            continue
        chunks = []
        for c in m.chunks:
            info = index[(key, tuple(c.offsets))]
            chunks.append({"offsets": list(c.offsets), "sizes": list(c.sizes), "file": info.relative_path,
                           "offset": info.offset, "length": info.length,
                           "transforms": list(getattr(info, "transform_descriptors", None) or [])})
        entries.append({"key": key, "kind": "tensor", "dtype": dtype_name(m.properties.dtype),
                        "shape": list(m.size), "chunks": chunks, "hex": tensor_hex(values[key])})
    sm = md.storage_meta
    return {"layout": layout, "version": md.version,
            "checkpoint_id": str(sm.checkpoint_id) if sm else None,
            "save_id": sm.save_id if sm else None,
            "has_planner_data": isinstance(md.planner_data, dict), "entries": entries}


def plain_state():
    import torch
    return {
        "model.w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "model.b": torch.arange(5, dtype=torch.int64) - 2,
        "model.h": torch.tensor([[1.5, -2.0, 3.25], [0.0, 7.0, -0.5]], dtype=torch.bfloat16),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "step": 7,
        "opt": {"lr": 0.1, "betas": (0.9, 0.99)},
    }


def flat_values(sd):
    import torch
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def save_plain(out, name, **writer_kw):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    sd = plain_state()
    md = dcp.save(sd, storage_writer=FileSystemWriter(d, **writer_kw), no_dist=True)
    exp = expected_from(md, flat_values(sd), "global .metadata")
    json.dump(exp, open(os.path.join(d, "expected.json"), "w"), indent=1)
    return d, md


def rank_main(rank, world, port, d):
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = DeviceMesh("cpu", list(range(world)))
    full = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    sd = {"sharded": distribute_tensor(full, mesh, [Shard(0)]),
          "shared": torch.arange(3, dtype=torch.int32),               # same box on both ranks: replicas
          f"rank{rank}.only": torch.full((2,), float(rank), dtype=torch.float16),
          f"rank{rank}.meta": {"rank": rank}}
    dcp.save(sd, storage_writer=FileSystemWriter(d), use_collectives=False)
    dist.barrier()
    dist.destroy_process_group()


def save_ranklocal(out):
    import torch, torch.multiprocessing as mp
    d = os.path.join(out, "pt_ranklocal")
    shutil.rmtree(d, ignore_errors=True)
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(rank_main, args=(2, port, d), nprocs=2, join=True)
    files = sorted((f for f in os.listdir(d) if f.startswith("__") and f.endswith(".metadata")),
                   key=lambda f: int(f[2:-9]))
    assert files == ["__0.metadata", "__1.metadata"] and not os.path.exists(os.path.join(d, ".metadata")), files
    values = {"sharded": torch.arange(24, dtype=torch.float32).reshape(6, 4),
              "shared": torch.arange(3, dtype=torch.int32),
              "rank0.only": torch.full((2,), 0.0, dtype=torch.float16),
              "rank1.only": torch.full((2,), 1.0, dtype=torch.float16)}
    merged, seen = [], {}
    for f in files:   # the union; a box seen before (a replica) keeps the lowest rank's blob
        md = pickle.load(open(os.path.join(d, f), "rb"))
        for e in expected_from(md, values, "rank-local __R.metadata")["entries"]:
            if e["key"] not in seen:
                seen[e["key"]] = e
                merged.append(e)
            elif e["kind"] == "tensor":
                have = {tuple(c["offsets"]) for c in seen[e["key"]]["chunks"]}
                seen[e["key"]]["chunks"] += [c for c in e["chunks"] if tuple(c["offsets"]) not in have]
    exp = expected_from(md, values, "rank-local __R.metadata")
    exp["entries"] = merged
    exp["checkpoint_id"] = exp["save_id"] = None   # differ per rank file
    json.dump(exp, open(os.path.join(d, "expected.json"), "w"), indent=1)


def save_mcore(out, plain_dir):
    """Megatron-Core's MCoreMetadata: a Metadata dataclass subclass with extra fields."""
    import collections, dataclasses
    from torch.distributed.checkpoint.metadata import Metadata
    names = ["megatron", "megatron.core", "megatron.core.dist_checkpointing",
             "megatron.core.dist_checkpointing.strategies", "megatron.core.dist_checkpointing.strategies.torch"]
    for n in names:
        sys.modules.setdefault(n, types.ModuleType(n))
    mod = sys.modules[names[-1]]

    @dataclasses.dataclass
    class MCoreMetadata(Metadata):
        mcore_data: dict = None
        all_local_plans: list = None
    MCoreMetadata.__module__ = mod.__name__
    MCoreMetadata.__qualname__ = "MCoreMetadata"
    mod.MCoreMetadata = MCoreMetadata
    d = os.path.join(out, "mcore")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(plain_dir, d)
    md = pickle.load(open(os.path.join(d, ".metadata"), "rb"))
    fields = {f.name: getattr(md, f.name) for f in dataclasses.fields(Metadata)}
    mc = MCoreMetadata(**fields,
                       mcore_data={"model.w": collections.OrderedDict(nd_reformulated_orig_global_shape=None, a=[1, 2])},
                       all_local_plans=[collections.OrderedDict(x=1)])
    with open(os.path.join(d, ".metadata"), "wb") as f:
        pickle.dump(mc, f)
    for f in os.listdir(d):   # the structure is what is tested: keep the data once, in pt_plain
        if f.endswith(".distcp"):
            os.remove(os.path.join(d, f))
    exp = json.load(open(os.path.join(d, "expected.json")))
    exp["megatron"] = True
    exp["data"] = False
    json.dump(exp, open(os.path.join(d, "expected.json"), "w"), indent=1)


# ------------------------------------------------------------------ synthetic

def fake_module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        n = ".".join(parts[:i])
        if n not in sys.modules:
            sys.modules[n] = types.ModuleType(n)
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[n])
    return sys.modules[name]


def _getstate(self):
    """BUILD state: an explicit _state (tuple, list, dict), else __dict__ (None when empty: no BUILD)."""
    if "_state" in self.__dict__:
        return self.__dict__["_state"]
    return dict(self.__dict__) or None


def fake_class(module, name, base=object, **ns):
    ns.setdefault("__getstate__", _getstate)
    cls = type(name, (base,), dict(ns))
    cls.__module__ = module
    cls.__qualname__ = name
    setattr(fake_module(module), name, cls)
    return cls


def synthetic(out):
    import enum
    assert "torch" not in sys.modules
    torch = fake_module("torch")

    class Size(tuple):
        def __reduce__(self):
            return (Size, (tuple(self),))
    Size.__module__, Size.__qualname__ = "torch", "Size"
    torch.Size = Size

    class DType:
        def __init__(self, n): self.n = n
        def __reduce__(self): return self.n
    DType.__module__ = "torch"
    for n in ("float32", "int64", "bfloat16", "strided"):
        setattr(torch, n, DType(n))
    ser = fake_module("torch.serialization")
    def _get_layout(name): pass
    _get_layout.__module__, _get_layout.__qualname__ = "torch.serialization", "_get_layout"
    ser._get_layout = _get_layout

    class Layout:
        def __reduce__(self): return (_get_layout, ("torch.strided",))

    def obj(module, name, state, **extra):
        cls = getattr(fake_module(module), name, None) or fake_class(module, name)
        o = cls.__new__(cls)
        if isinstance(state, dict):
            o.__dict__.update(state)
        else:
            o.__getstate__ = None
        return o

    class WithState:   # objects whose BUILD state is any value (tuple, dict, list)
        pass

    def stateful(module, name, state):
        cls = getattr(fake_module(module), name, None)
        if cls is None:
            cls = fake_class(module, name, WithState)
        o = cls.__new__(cls)
        object.__setattr__(o, "_state", state)
        return o

    def enum_cls(module, name):
        e = enum.Enum(name, {"TORCH_CONTIGUOUS_FORMAT": 0, "TORCH_CHANNELS_LAST": 1, "TORCH_PRESERVE_FORMAT": 2})
        e.__module__, e.__qualname__ = module, name
        setattr(fake_module(module), name, e)
        return e

    NEW, OLD = "torch.distributed.checkpoint", "torch.distributed._shard.checkpoint"
    NEWP, OLDP = "torch.distributed.checkpoint.metadata", "torch.distributed._shard.sharded_tensor.metadata"
    enew = enum_cls(NEWP, "_MEM_FORMAT_ENCODING")
    eold = enum_cls(OLDP, "MEM_FORMAT_ENCODING")

    class GetattrEnum:   # early Python 3.11's encoding: getattr(cls, name)
        def __init__(self, cls): self.cls = cls
        def __reduce__(self): return (getattr, (self.cls, "TORCH_CONTIGUOUS_FORMAT"))

    def props(dtype, module=NEWP, form="tuple5", getattr_enum=False):
        en = enew if module == NEWP else eold
        member = GetattrEnum(en) if getattr_enum else en.TORCH_CONTIGUOUS_FORMAT
        st = (getattr(torch, dtype), Layout(), False, member, False)
        if form == "tuple6":
            st = st + ((4, 1),)
        elif form == "dict":
            st = {"dtype": getattr(torch, dtype), "layout": Layout(), "requires_grad": False,
                  "memory_format": member, "pin_memory": False}
        return stateful(module, "TensorProperties", st)

    def tensor_md(gen, dtype, shape, chunks, **pk):
        ch = [obj(gen + ".metadata", "ChunkStorageMetadata", {"offsets": Size(o), "sizes": Size(s)})
              for o, s in chunks]
        return obj(gen + ".metadata", "TensorStorageMetadata",
                   {"properties": props(dtype, **pk), "size": Size(shape), "chunks": ch})

    def index(gen, fqn, off=None, slots=False):
        st = {"fqn": fqn, "index": 0 if off is not None else None}
        if off is not None:
            st["offset"] = Size(off)
        if slots:   # a slots dataclass: BUILD (None, {slot: value})
            return stateful(gen + ".metadata", "MetadataIndex", (None, st))
        return obj(gen + ".metadata", "MetadataIndex", st)

    def sinfo(gen, rel, off, length, td=None):
        st = {"relative_path": rel, "offset": off, "length": length}
        if td is not None:
            st["transform_descriptors"] = td
        return obj(gen + ".filesystem", "_StorageInfo", st)

    def metadata(gen, sdm, sd, cls=("", "Metadata"), **extra):
        st = {"state_dict_metadata": sdm, "planner_data": extra.pop("planner_data", None), "storage_data": sd}
        st.update(extra)
        return obj(cls[0] or gen + ".metadata", cls[1], st)

    def write(name, root):
        with open(os.path.join(out, name + ".metadata"), "wb") as f:
            pickle.dump(root, f, protocol=4)

    BIG = 5_000_000_000   # LONG1 offsets
    # Python 3.13 paths (pathlib._local.PosixPath with one string), version str, zstd transforms.
    P313 = fake_class("pathlib._local", "PosixPath", __reduce__=lambda self: (type(self), ("/tmp/ck313",)))
    sm = obj(NEW + ".metadata", "StorageMeta", {"checkpoint_id": P313(), "save_id": "uuid-313",
                                                "load_id": None, "modules": []})
    write("py313_zstd", metadata(NEW, {
        "w": tensor_md(NEW, "float32", (4, 6), [((0, 0), (2, 6)), ((2, 0), (2, 6))]),
        "step": obj(NEW + ".metadata", "BytesStorageMetadata", {})},
        {index(NEW, "w", (0, 0)): sinfo(NEW, "__0_0.distcp", 0, 100, ["stream.zstd/1"]),
         index(NEW, "w", (2, 0)): sinfo(NEW, "__1_0.distcp", BIG, 120, ["stream.zstd/1"]),
         index(NEW, "step"): sinfo(NEW, "__0_0.distcp", 100, 30)},
        planner_data={"w": ("w",), "step": ("step",)}, storage_meta=sm, version="1.0.0"))
    # Python <= 3.12 paths (parts), float version, dict and 6-tuple TensorProperties, slots index.
    P312 = fake_class("pathlib", "PosixPath", __reduce__=lambda self: (type(self), ("/", "tmp", "ck312")))
    sm = obj(NEW + ".metadata", "StorageMeta", {"checkpoint_id": P312(), "save_id": "uuid-312", "load_id": None})
    write("dictprops_floatversion", metadata(NEW, {
        "a": tensor_md(NEW, "int64", (3,), [((0,), (3,))], form="dict"),
        "b": tensor_md(NEW, "bfloat16", (2, 2), [((0, 0), (2, 2))], form="tuple6", getattr_enum=True)},
        {index(NEW, "a", (0,), slots=True): sinfo(NEW, "__0_0.distcp", 0, 24),
         index(NEW, "b", (0, 0)): sinfo(NEW, "sub/__0_1.distcp", 24, 8)},
        storage_meta=sm, version=1.0))
    # 2.0-2.2: the old TensorProperties path; fsspec str checkpoint_id but no StorageMeta field yet.
    write("gen_2_0", metadata(NEW, {"w": tensor_md(NEW, "float32", (2,), [((0,), (2,))], module=OLDP)},
                              {index(NEW, "w", (0,)): sinfo(NEW, "__0_0.distcp", 0, 8)}, planner_data={}))
    # 2.3: the new path, no StorageMeta.
    write("gen_2_3", metadata(NEW, {"w": tensor_md(NEW, "float32", (2,), [((0,), (2,))])},
                              {index(NEW, "w", (0,)): sinfo(NEW, "__0_0.distcp", 0, 8)}))
    # StorageMeta with a str checkpoint_id (FsspecWriter), no version: 2.4+.
    sm = obj(NEW + ".metadata", "StorageMeta", {"checkpoint_id": "s3://bucket/ck", "save_id": "s"})
    write("gen_2_4_str_id", metadata(NEW, {"w": tensor_md(NEW, "float32", (2,), [((0,), (2,))])},
                                     {index(NEW, "w", (0,)): sinfo(NEW, "__0_0.distcp", 0, 8)}, storage_meta=sm))
    # 1.13 with an int key (stored as BININT1 in both places) and the getattr enum form.
    write("int_key_113", metadata(OLD, {
        1: obj(OLD + ".metadata", "BytesStorageMetadata", {}),
        "t": tensor_md(OLD, "float32", (2,), [((0,), (2,))], module=OLDP, getattr_enum=True)},
        {index(OLD, 1): sinfo(OLD, "__0_0.distcp", 0, 10), index(OLD, "t", (0,)): sinfo(OLD, "__0_0.distcp", 10, 20)}))
    # An unknown Metadata subclass with extra attributes: opaque, accepted.
    write("subclass", metadata(NEW, {"w": tensor_md(NEW, "float32", (2,), [((0,), (2,))])},
                               {index(NEW, "w", (0,)): sinfo(NEW, "__0_0.distcp", 0, 8)},
                               cls=("my.pkg", "MyMetadata"), extra_field={"x": [1, 2, 3]}))
    # Errors.
    write("bad_transform", metadata(NEW, {"w": tensor_md(NEW, "float32", (2,), [((0,), (2,))])},
                                    {index(NEW, "w", (0,)): sinfo(NEW, "__0_0.distcp", 0, 8, ["stream.lz4/1"])}))
    write("outside", metadata(NEW, {"w": tensor_md(NEW, "float32", (4, 4), [((0, 0), (4, 4)), ((2, 3), (2, 2))])},
                              {index(NEW, "w", (0, 0)): sinfo(NEW, "__0_0.distcp", 0, 8)}))
    write("escape", metadata(NEW, {"w": tensor_md(NEW, "float32", (2,), [((0,), (2,))])},
                             {index(NEW, "w", (0,)): sinfo(NEW, "../outside.distcp", 0, 8)}))
    write("pre_113", obj(OLD + ".metadata", "Metadata", {"state_dict_metadata": {
        "w": obj(OLD + ".metadata", "ShardedTensorStorageMetadata", {"tensor_metadata": None, "storage_metadata": []}),
        "b": obj(OLD + ".metadata", "BytesStorageMetadata", {"storage_key": "b", "length": 3})}}))
    write("not_dcp", {"state_dict": {"w": [1, 2, 3]}})
    # The streaming parse: 1100 keys (two SETITEMS batches) whose chunks all share one
    # torch.Size object, so the second batch refers back to an object of the first (the
    # parse starts again on the whole tree); and one key of 20 chunks listed out of order,
    # one of them twice, its storage_data in another order (the sorted-index lookup).
    shared = Size((4,))
    many = {f"k{i}": obj(NEW + ".metadata", "TensorStorageMetadata", {
        "properties": props("float32"), "size": Size((4,)),
        "chunks": [obj(NEW + ".metadata", "ChunkStorageMetadata", {"offsets": Size((0,)), "sizes": shared})]})
        for i in range(1100)}
    write("shared_across_batches", metadata(NEW, many,
          {index(NEW, f"k{i}", (0,)): sinfo(NEW, "__0_0.distcp", 16 * i, 16) for i in range(1100)}))
    order = [7, 3, 19, 0, 12, 5, 16, 1, 9, 14, 2, 18, 6, 11, 4, 17, 8, 13, 10, 15, 5]
    write("chunks_out_of_order", metadata(NEW, {"w": tensor_md(NEW, "float32", (20,), [((o,), (1,)) for o in order])},
          {index(NEW, "w", (o,)): sinfo(NEW, "__0_0.distcp", 4 * o, 4) for o in sorted(set(order), key=lambda o: (o * 7) % 20)}))
    write("same_offsets_other_sizes", metadata(NEW, {
        "w": tensor_md(NEW, "float32", (4,), [((0,), (2,)), ((0,), (4,))])},
        {index(NEW, "w", (0,)): sinfo(NEW, "__0_0.distcp", 0, 8)}))


def main():
    out, what = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if what == "synthetic":
        d = os.path.join(out, "synthetic")
        os.makedirs(d, exist_ok=True)
        synthetic(d)
        return
    plain, _ = save_plain(out, "pt_plain")
    save_plain(out, "pt_zstd", _extensions=[__import__("torch.distributed.checkpoint._extension",
                                                         fromlist=["ZStandard"]).ZStandard()])
    save_ranklocal(out)
    save_mcore(out, plain)


if __name__ == "__main__":
    main()
