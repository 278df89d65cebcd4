#!/usr/bin/env python3
"""Make a small Megatron-Core torch_dist style checkpoint with PyTorch (no Megatron needed).

usage: make_megatron.py OUT_DIR

Megatron-Core's torch_dist backend writes a DCP folder whose .metadata holds its own Metadata
subclass (megatron.core.dist_checkpointing.strategies.torch.MCoreMetadata, with an extra
mcore_data attribute), plus metadata.json and common.pt. A stub module of that name stands in
for Megatron so the pickle names the same class; the tensors are saved by real DCP.
"""
import json, os, pickle, sys, types

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata

out = sys.argv[1]
mod_name = "megatron.core.dist_checkpointing.strategies.torch"
for i, part in enumerate(mod_name.split(".")):
    name = ".".join(mod_name.split(".")[: i + 1])
    sys.modules.setdefault(name, types.ModuleType(name))
mod = sys.modules[mod_name]


class MCoreMetadata(Metadata):
    pass


MCoreMetadata.__module__ = mod_name
MCoreMetadata.__qualname__ = "MCoreMetadata"
mod.MCoreMetadata = MCoreMetadata

g = torch.Generator().manual_seed(3)
state = {
    "decoder.layers.self_attention.linear_qkv.weight": torch.randn(2, 12, 8, generator=g),
    "decoder.layers.mlp.linear_fc1.weight": torch.randn(2, 16, 8, generator=g).to(torch.bfloat16),
    "embedding.word_embeddings.weight": torch.randn(32, 8, generator=g),
    "rng_state/shard_0.0_1.1": {"random_rng_state": [1, 2, 3]},
}
dcp.save(state, checkpoint_id=out, no_dist=True)

path = os.path.join(out, ".metadata")
with open(path, "rb") as f:
    md = pickle.load(f)
mc = MCoreMetadata.__new__(MCoreMetadata)
mc.__dict__.update(md.__dict__)
mc.mcore_data = {"decoder.layers.self_attention.linear_qkv.weight": {"nd_reformulated_orig_global_shape": None}}
with open(path, "wb") as f:
    pickle.dump(mc, f, protocol=4)

with open(os.path.join(out, "metadata.json"), "w") as f:
    json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
               "common_backend": "torch", "common_backend_version": 1}, f)
torch.save({"iteration": 1000, "checkpoint_version": 3.0}, os.path.join(out, "common.pt"))

# Ground truth in the fixtures' manifest format (tests/check_fixture.py reads it).
import hashlib
entries = []


def chunk_row(key, c):
    info = [v for k, v in mc.storage_data.items() if k.fqn == key and list(k.offset) == list(c.offsets)][0]
    return {"offsets": list(c.offsets), "sizes": list(c.sizes), "file": info.relative_path,
            "offset": info.offset, "length": info.length}


for key, tmd in mc.state_dict_metadata.items():
    if hasattr(tmd, "chunks"):
        t = state[key]
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        entries.append({"key": key, "kind": "tensor", "dtype": str(t.dtype)[6:], "shape": list(t.shape),
                        "numel": t.numel(), "itemsize": t.element_size(), "nbytes": len(raw),
                        "sha256": hashlib.sha256(raw).hexdigest(),
                        "chunks": [chunk_row(key, c) for c in tmd.chunks]})
    else:
        info = [v for k, v in mc.storage_data.items() if k.fqn == key][0]
        with open(os.path.join(out, info.relative_path), "rb") as f:
            f.seek(info.offset)
            blob = f.read(info.length)
        entries.append({"key": key, "kind": "bytes", "nbytes": len(blob),
                        "location": {"file": info.relative_path, "offset": info.offset, "length": info.length},
                        "sha256": hashlib.sha256(blob).hexdigest()})
if len(sys.argv) > 2:
    with open(sys.argv[2], "w") as f:
        json.dump({"case": "megatron_torch_dist", "entries": entries}, f, indent=1)
