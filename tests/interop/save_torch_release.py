"""Checkpoints written by one PyTorch release, for tests/data/torch-releases (run once a release).

usage: save_torch_release.py OUT     (with one PyTorch release first on PYTHONPATH)

Writes, with that release's own torch.distributed.checkpoint, whichever of these cases the
release can write (a case the release lacks the API for is listed as skipped, with the reason):
  OUT/single/      one process, no process group: plain tensors of each dtype the release has,
                   0-d, empty, a transposed view stored with its strides, nested dicts and lists
                   (DCP flattens them), non-tensor values;
  OUT/files/       the same through FileSystemWriter(single_file_per_rank=False): a file an item;
  OUT/dtensor/     4 gloo ranks: DTensors by rows (uneven), by columns, in 2x2 blocks on a 2-D
                   mesh, replicated; a plain tensor and a value every rank holds;
  OUT/sharded/     4 gloo ranks: ShardedTensors (ChunkShardingSpec, what FSDP1's sharded state
                   dict held before DTensor), one with an idle rank;
  OUT/fsdp2/       2 gloo ranks: a model under fully_shard after one Adam step, model and
                   optimizer state from get_state_dict;
  OUT/zstd/        one process, FileSystemWriter(_extensions=[ZStandard()]) where the release has it;
  OUT/CASE/truth.json  per key, PyTorch's own view of the saved checkpoint: the release's load of
                   every key into a full tensor ({"kind": "tensor", "dtype", "shape", "sha256" of
                   the C-order bytes}) or of a value ({"kind": "bytes", "repr"});
  OUT/written_by.json  the release, Python, numpy, the cases written (keys) and skipped (why), and
                   notes where a case was bent to the release.

The values the script built are compared with what the release loads back, so a truth line is
never just the loader's word.
"""
import hashlib
import inspect
import io
import json
import os
import platform
import socket
import sys
import warnings

warnings.filterwarnings("ignore")
import numpy   # noqa: E402
import torch   # noqa: E402
import torch.distributed as dist   # noqa: E402
import torch.distributed.checkpoint as dcp   # noqa: E402
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter   # noqa: E402

WORLD = 4


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def c_bytes(t):
    t = t.detach().contiguous().cpu()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def no_dist_call(new, old, sd, **kw):
    """dcp.save/load (2.2+) or save_state_dict/load_state_dict (2.0-2.1), without a process
    group where there is none: 2.2's new names take no_dist but still gather the keys over a
    process group, so there the old names (which take it too) do the work."""
    if not dist.is_initialized():
        if new is not None and "no_dist" in inspect.signature(new).parameters:
            try:
                return new(sd, no_dist=True, **kw)
            except ValueError as e:
                if old is None or "process group" not in str(e):
                    raise
        if old is not None:
            return old(sd, no_dist=True, **kw)
    return (new or old)(sd, **kw)


def save(sd, path, **writer_kw):
    return no_dist_call(getattr(dcp, "save", None), getattr(dcp, "save_state_dict", None), sd,
                        storage_writer=FileSystemWriter(path, **writer_kw))


def load(sd, path):
    return no_dist_call(getattr(dcp, "load", None), getattr(dcp, "load_state_dict", None), sd,
                        storage_reader=FileSystemReader(path))


def flat(prefix, v, out):
    """DCP's flattening of nested containers: dict keys and list indices joined with '.'."""
    if isinstance(v, dict):
        for k, x in v.items():
            flat(f"{prefix}.{k}" if prefix else str(k), x, out)
    elif isinstance(v, list) and v and all(isinstance(x, (torch.Tensor, dict, list)) for x in v):
        for i, x in enumerate(v):
            flat(f"{prefix}.{i}", x, out)
    else:
        out[prefix] = v
    return out


def truth(path, built):
    """The release's own load of every stored key, checked against the values it was given."""
    md = FileSystemReader(path).read_metadata()
    dest = {}
    for key, m in md.state_dict_metadata.items():
        if type(m).__name__ == "BytesStorageMetadata":
            dest[key] = None
        else:
            dest[key] = torch.zeros(tuple(m.size), dtype=m.properties.dtype)
    load(dest, path)
    out = {}
    for key, m in md.state_dict_metadata.items():
        v = dest[key]
        if type(m).__name__ == "BytesStorageMetadata":
            out[key] = {"kind": "bytes", "repr": repr(v)}
        else:
            out[key] = {"kind": "tensor", "dtype": str(v.dtype).replace("torch.", ""),
                        "shape": list(v.shape), "sha256": hashlib.sha256(c_bytes(v)).hexdigest()}
        if key in built:
            want = built[key]
            same = (c_bytes(want) == c_bytes(v)) if isinstance(want, torch.Tensor) else (repr(want) == repr(v))
            if not same:
                raise SystemExit(f"{path}: {key}: the release loads back other values than it saved")
    # Releases flatten lists of values differently (2.0 stores param_groups whole), tensors alike.
    missing = sorted(k for k, v in built.items() if isinstance(v, torch.Tensor) and k not in out)
    if missing:
        raise SystemExit(f"{path}: tensors saved but not in the metadata: {missing}")
    with open(os.path.join(os.path.dirname(path), "truth.json"), "w") as f:
        json.dump(out, f, indent=0, sort_keys=True)
    return len(out)


def plain_values():
    g = torch.Generator().manual_seed(20)
    r = lambda *s: torch.randn(*s, generator=g)   # noqa: E731
    t = {
        "w.f32": r(7, 9), "w.f64": r(5, 3).double(), "w.f16": r(4, 6).half(),
        "w.bf16": r(9, 5).bfloat16(),
        "w.i8": torch.randint(-128, 127, (9,), generator=g).to(torch.int8),
        "w.i16": torch.randint(-30000, 30000, (2, 7), generator=g).to(torch.int16),
        "w.i32": torch.randint(-2**31, 2**31 - 1, (5, 2), generator=g).to(torch.int32),
        "w.i64": torch.randint(-2**62, 2**62, (3, 3), generator=g),
        "w.u8": torch.randint(0, 255, (17,), generator=g).to(torch.uint8),
        "w.bool": torch.rand(6, 5, generator=g) > 0.5,
        "w.c64": torch.randn(4, 3, dtype=torch.complex64, generator=g),
        "s.scalar": torch.tensor(2.5),
        "s.empty": torch.zeros(0, 4),
        "v.transposed": r(10, 12).t(),                         # stored with stride (1, 10)
    }
    # Newer dtypes where the release has them and its torch.save takes them (float8: named in
    # 2.1, saved from 2.2; uint16/32: named in 2.3, saved later).
    for name, dt, make in (("w.f8e4m3", "float8_e4m3fn", lambda d: r(6, 4).to(d)),
                           ("w.f8e5m2", "float8_e5m2", lambda d: r(3, 5).to(d)),
                           ("w.u16", "uint16", lambda d: torch.randint(0, 2**15, (5, 3), generator=g).to(d)),
                           ("w.u32", "uint32", lambda d: torch.randint(0, 2**15, (4, 2), generator=g).to(d))):
        if hasattr(torch, dt):
            try:
                v = make(getattr(torch, dt))
                torch.save(v, io.BytesIO())
                t[name] = v
            except Exception:
                pass
    sd = {"model": t,
          "optim": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": r(4, 3)}},
                    "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "params": [0]}]},
          "epoch": 7, "name": "release test \u2713", "sizes": [1, 2.5, "three", None]}
    return sd


def case_single(out, **writer_kw):
    sd = plain_values()
    built = flat("", sd, {})
    save(sd, f"{out}/ckpt", **writer_kw)
    return truth(f"{out}/ckpt", built)


def case_zstd(out):
    from torch.distributed.checkpoint._extension import ZStandard
    return case_single(out, _extensions=[ZStandard()])


def dtensor_api():
    try:
        from torch.distributed.tensor import DeviceMesh, DTensor, Replicate, Shard, distribute_tensor
    except ImportError:
        from torch.distributed._tensor import DeviceMesh, DTensor, Replicate, Shard, distribute_tensor
    return DeviceMesh, DTensor, Replicate, Shard, distribute_tensor


def global_values():
    g = torch.Generator().manual_seed(21)
    return {
        "model.embed.weight": torch.randn(37, 16, generator=g),             # rows, uneven
        "model.qkv.weight": torch.randn(24, 32, generator=g).bfloat16(),    # columns
        "model.fc.weight": torch.randn(20, 18, generator=g).half(),         # 2x2 blocks
        "model.fc.bias": torch.randn(20, generator=g, dtype=torch.float64), # replicated
        "model.ids": torch.randint(0, 60000, (10, 4), generator=g),         # rows, int64
    }


def worker_dtensor(rank, out):
    DeviceMesh, DTensor, Replicate, Shard, distribute_tensor = dtensor_api()
    vals = global_values()
    mesh1 = DeviceMesh("cpu", list(range(WORLD)))
    mesh2 = DeviceMesh("cpu", [[0, 1], [2, 3]])
    qkv, fc = vals["model.qkv.weight"], vals["model.fc.weight"]
    i, j = divmod(rank, 2)
    sd = {
        # uneven rows, scattered from rank 0 (float32 and int64: gloo before 2.1 sends no bfloat16)
        "model.embed.weight": distribute_tensor(vals["model.embed.weight"], mesh1, [Shard(0)]),
        "model.ids": distribute_tensor(vals["model.ids"], mesh1, [Shard(0)]),
        # even splits built from each rank's own part, no communication
        "model.qkv.weight": DTensor.from_local(qkv.chunk(WORLD, 1)[rank].contiguous(), mesh1, [Shard(1)],
                                               run_check=False),
        "model.fc.weight": DTensor.from_local(fc.chunk(2, 0)[i].chunk(2, 1)[j].contiguous(), mesh2,
                                              [Shard(0), Shard(1)], run_check=False),
        "model.fc.bias": DTensor.from_local(vals["model.fc.bias"].clone(), mesh1, [Replicate()], run_check=False),
        "step": torch.tensor(1234), "note": {"saved_by": "rank 0", "layers": 2},
    }
    try:
        save(sd, f"{out}/ckpt")
    except BaseException as e:
        if "1D DeviceMesh" not in reason(e):   # 2.1 saves DTensors of 1-D meshes only
            raise
        dist.barrier()
        if rank == 0:
            import shutil
            shutil.rmtree(f"{out}/ckpt", ignore_errors=True)
            with open(f"{out}/note", "w") as f:
                f.write("model.fc.weight by rows: the release saves DTensors of 1-D meshes only")
        dist.barrier()
        sd["model.fc.weight"] = DTensor.from_local(fc.chunk(WORLD, 0)[rank].contiguous(), mesh1, [Shard(0)],
                                                   run_check=False)
        save(sd, f"{out}/ckpt")


def worker_sharded(rank, out):
    from torch.distributed._shard.sharded_tensor import Shard as LocalShard, init_from_local_shards
    vals = global_values()

    def chunked(t, dim, owners):
        """Rank `owners[i]` holds chunk i of ceil(n / len(owners)) along dim (ChunkShardingSpec's split)."""
        n = t.shape[dim]
        step = -(-n // len(owners))
        shards = []
        for i, r in enumerate(owners):
            lo, hi = min(i * step, n), min((i + 1) * step, n)
            if r == rank and hi > lo:
                offs = [0] * t.dim()
                offs[dim] = lo
                shards.append(LocalShard.from_tensor_and_offsets(t.narrow(dim, lo, hi - lo).contiguous(), offs, r))
        return init_from_local_shards(shards, *t.shape)
    ranks = list(range(WORLD))
    sd = {
        "model.embed.weight": chunked(vals["model.embed.weight"], 0, ranks),
        "model.qkv.weight": chunked(vals["model.qkv.weight"], 1, ranks[::-1]),
        # 5 rows on 4 ranks: chunks of 2, 2, 1 and an idle rank
        "model.tiny": chunked(vals["model.ids"][:5].float(), 0, ranks),
        "model.fc.bias": vals["model.fc.bias"], "step": torch.tensor(1234),
    }
    save(sd, f"{out}/ckpt")


def worker_fsdp2(rank, out):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(9, 13), torch.nn.ReLU(), torch.nn.Linear(13, 6, bias=False))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, 9)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    save({"model": msd, "optim": osd}, f"{out}/ckpt")
    # The full values, for truth(): every rank takes part in the gathers.
    full = {}
    for k, v in flat("", {"model": msd, "optim": osd}, {}).items():
        full[k] = v.full_tensor() if hasattr(v, "full_tensor") else v
    if rank == 0:
        torch.save(full, f"{out}/built.pt")


def reason(e):
    """One line: the exception, or the first rank's inside a CheckpointException."""
    first = next(iter(getattr(e, "failures", {}).values()), e)
    first = first[0] if isinstance(first, tuple) else first   # (exception, traceback) in 2.0-2.1
    return (f"{type(first).__name__}: {first}".splitlines() or [type(first).__name__])[0]


def run_ranks(target, world, out):
    import torch.multiprocessing as mp
    port = free_port()
    mp.start_processes(ranks_main, args=(target, world, port, out), nprocs=world, join=True, start_method="fork")


def ranks_main(rank, target, world, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        globals()[target](rank, out)
        dist.barrier()
    except BaseException as e:   # kept for main() (CheckpointException is a BaseException)
        with open(f"{out}/error.{rank}", "w") as f:
            f.write(reason(e))
        raise
    finally:
        dist.destroy_process_group()


def built_global(case, out):
    if case == "fsdp2":
        full = torch.load(f"{out}/built.pt")
        os.unlink(f"{out}/built.pt")
        return {k: v for k, v in full.items() if isinstance(v, torch.Tensor)}
    vals = global_values()
    if case == "sharded":
        vals = {"model.embed.weight": vals["model.embed.weight"], "model.qkv.weight": vals["model.qkv.weight"],
                "model.tiny": vals["model.ids"][:5].float(), "model.fc.bias": vals["model.fc.bias"]}
    vals["step"] = torch.tensor(1234)
    return vals


def main(out):
    os.makedirs(out)
    cases = {"single": lambda o: case_single(o), "files": lambda o: case_single(o, single_file_per_rank=False),
             "zstd": case_zstd}
    for case, world in (("dtensor", WORLD), ("sharded", WORLD), ("fsdp2", 2)):
        def run(o, case=case, world=world):
            run_ranks("worker_" + case, world, o)
            return truth(f"{o}/ckpt", built_global(case, o))
        cases[case] = run
    written, skipped, notes = {}, {}, {}
    for case, fn in cases.items():
        o = f"{out}/{case}"
        os.makedirs(o)
        try:
            written[case] = fn(o)
            if os.path.exists(f"{o}/note"):
                with open(f"{o}/note") as f:
                    notes[case] = f.read()
                os.unlink(f"{o}/note")
        except BaseException as e:   # the release lacks the API (or cannot run it on the CPU)
            import shutil
            why = reason(e)
            errs = sorted(f for f in os.listdir(o) if f.startswith("error."))
            if errs:   # the first rank's own error, not how the launcher saw it end
                with open(f"{o}/{errs[0]}") as f:
                    why = f.read()
            skipped[case] = why[:300]
            shutil.rmtree(o)
    info = {"torch": torch.__version__, "python": platform.python_version(), "numpy": numpy.__version__,
            "written": written, "skipped": skipped, "notes": notes}
    with open(f"{out}/written_by.json", "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
    print(json.dumps(info))


if __name__ == "__main__":
    main(sys.argv[1])
