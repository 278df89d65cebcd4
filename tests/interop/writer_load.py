#!/usr/bin/env python3
"""PyTorch reads what dcpfs writes, byte-exact.

usage:
  writer_load.py synth CKPT SEED NKEYS WORLD   torch.distributed.checkpoint.load of a `dcp synth`
                                               checkpoint on WORLD (1 or 2) gloo ranks, every key
                                               checked against the dcp-synth(1) formula
  writer_load.py dcp CKPT MANIFEST WORLD       the same for a converted checkpoint, against a
                                               fixture manifest (tensors; bytes items too)
  writer_load.py pt FILE MANIFEST              torch.load(weights_only=True) of a converted .pt
  writer_load.py ptsynth FILE SEED NKEYS       the same for a .pt converted from a `dcp synth`
                                               checkpoint, against the formula
"""
import hashlib, json, os, socket, sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from writer_synth_expect import synth_bytes  # noqa: E402


def tensor_bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def template(ckpt):
    """Empty tensors of the stored dtypes and shapes, from the checkpoint's own metadata."""
    md = dcp.FileSystemReader(ckpt).read_metadata()
    sd = {}
    for k, v in md.state_dict_metadata.items():
        if isinstance(v, dcp.metadata.TensorStorageMetadata):
            sd[k] = torch.zeros(v.size, dtype=v.properties.dtype)
    return sd


def check_synth(ckpt, seed, nkeys):
    sd = template(ckpt)
    assert len(sd) == nkeys, (len(sd), nkeys)
    dcp.load(sd, checkpoint_id=ckpt)
    for k, t in sd.items():
        i = int(k.split(".")[2])
        want = synth_bytes(seed, i, t.numel() * t.element_size(), t.dtype == torch.bool)
        assert tensor_bytes(t) == want, f"{ckpt}: {k}: bytes differ from the formula"


def check_manifest_dcp(ckpt, manifest):
    want = {e["key"]: e for e in json.load(open(manifest))["entries"]}
    sd = template(ckpt)
    for k, e in want.items():
        if e["kind"] == "bytes":
            sd[k] = None     # any placeholder: loaded as the stored object
    dcp.load(sd, checkpoint_id=ckpt)
    for k, e in want.items():
        if e["kind"] == "tensor":
            got = hashlib.sha256(tensor_bytes(sd[k])).hexdigest()
            assert got == e["sha256"], f"{ckpt}: {k}: sha256 differs"
        else:
            assert k in sd, f"{ckpt}: {k}: bytes item missing"


def run(rank, world, port, fn, args):
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        fn(*args)
    finally:
        if world > 1:
            dist.barrier()
            dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def check_pt(path, manifest):
    sd = torch.load(path, weights_only=True)
    want = {e["key"]: e for e in json.load(open(manifest))["entries"]}
    assert set(sd) == set(want), (path, sorted(sd), sorted(want))
    for k, e in want.items():
        v = sd[k]
        data = v if isinstance(v, bytes) else tensor_bytes(v)
        assert hashlib.sha256(data).hexdigest() == e["sha256"], f"{path}: {k}: sha256 differs"


def check_ptsynth(path, seed, nkeys):
    sd = torch.load(path, weights_only=True)
    assert len(sd) == nkeys, (path, len(sd), nkeys)
    for k, t in sd.items():
        i = int(k.split(".")[2])
        want = synth_bytes(seed, i, t.numel() * t.element_size(), t.dtype == torch.bool)
        assert tensor_bytes(t) == want, f"{path}: {k}: bytes differ from the formula"


def job(argv):
    """(function, arguments, ranks, label) of one check given as command-line words."""
    mode = argv[0]
    if mode == "pt":
        return check_pt, (argv[1], argv[2]), 1, argv[1]
    if mode == "ptsynth":
        return check_ptsynth, (argv[1], int(argv[2]), int(argv[3])), 1, argv[1]
    world = int(argv[-1])
    label = f"{argv[1]} on {world} rank(s)"
    if mode == "synth":
        return check_synth, (argv[1], int(argv[2]), int(argv[3])), world, label
    return check_manifest_dcp, (argv[1], argv[2]), world, label


def run_jobs(rank, world, port, jobs):
    """Every job on this rank of one process group, in turn."""
    run(rank, world, port, lambda: [fn(*args) for fn, args, _, _ in jobs], ())
    if rank == 0:
        for *_, label in jobs:
            print("ok", label)


def main():
    """One check (MODE ARGS...), or `batch FILE`: a check a line, all of a rank count
    in one process group (torch imported once, not once a check)."""
    if sys.argv[1] == "batch":
        jobs = [job(line.split()) for line in open(sys.argv[2]) if line.strip()]
    else:
        jobs = [job(sys.argv[1:])]
    for world in sorted({j[2] for j in jobs}):
        mine = [j for j in jobs if j[2] == world]
        if world == 1:
            run_jobs(0, 1, 0, mine)
        else:
            import torch.multiprocessing as mp
            mp.spawn(run_jobs, args=(world, free_port(), mine), nprocs=world, join=True)


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore")
    main()
