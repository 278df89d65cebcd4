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


def main():
    mode = sys.argv[1]
    if mode == "pt":
        path, manifest = sys.argv[2], sys.argv[3]
        sd = torch.load(path, weights_only=True)
        want = {e["key"]: e for e in json.load(open(manifest))["entries"]}
        assert set(sd) == set(want), (sorted(sd), sorted(want))
        for k, e in want.items():
            v = sd[k]
            data = v if isinstance(v, bytes) else tensor_bytes(v)
            assert hashlib.sha256(data).hexdigest() == e["sha256"], f"{path}: {k}: sha256 differs"
        print("ok", path)
        return
    if mode == "ptsynth":
        path, seed, nkeys = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        sd = torch.load(path, weights_only=True)
        assert len(sd) == nkeys, (len(sd), nkeys)
        for k, t in sd.items():
            i = int(k.split(".")[2])
            want = synth_bytes(seed, i, t.numel() * t.element_size(), t.dtype == torch.bool)
            assert tensor_bytes(t) == want, f"{path}: {k}: bytes differ from the formula"
        print("ok", path)
        return
    ckpt, world = sys.argv[2], int(sys.argv[-1])
    if mode == "synth":
        fn, args = check_synth, (ckpt, int(sys.argv[3]), int(sys.argv[4]))
    else:
        fn, args = check_manifest_dcp, (ckpt, sys.argv[3])
    if world == 1:
        fn(*args)
    else:
        import torch.multiprocessing as mp
        mp.spawn(run, args=(world, free_port(), fn, args), nprocs=world, join=True)
    print("ok", ckpt, "on", world, "rank(s)")


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore")
    main()
