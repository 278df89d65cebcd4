#!/usr/bin/env python3
"""Write DIR/.metadata for a synthetic checkpoint of KEYS keys x CHUNKS chunks (no shard files),
pickled by PyTorch's own classes (2.x layout with StorageMeta, version and planner_data).

usage: gen_big_metadata.py DIR KEYS CHUNKS
"""
import pathlib, pickle, sys

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex, StorageMeta,
                                                   TensorProperties, TensorStorageMetadata)

d, nkeys, nch = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sdm, sd, pd, off = {}, {}, {}, 0
for k in range(nkeys):
    key = f"model.layers.{k}.mlp.weight"
    chunks = []
    for c in range(nch):   # row blocks of 4096 x 1024 over 64 files, as a 64-rank save would write
        o, s = torch.Size([c * 4096, 0]), torch.Size([4096, 1024])
        chunks.append(ChunkStorageMetadata(offsets=o, sizes=s))
        sd[MetadataIndex(key, torch.Size([c * 4096, 0]), c)] = _StorageInfo(f"__{c % 64}_0.distcp", off, 4096 * 1024 * 2)
        off += 4096 * 1024 * 2 + 1000
    sdm[key] = TensorStorageMetadata(TensorProperties(dtype=torch.bfloat16), torch.Size([4096 * nch, 1024]), chunks)
    pd[key] = tuple(key.split("."))
d.mkdir(parents=True, exist_ok=True)
md = Metadata(sdm, pd, sd, StorageMeta(checkpoint_id=d, save_id="bench"), version="1.0.0")
with open(d / ".metadata", "wb") as f:
    pickle.dump(md, f)
