"""Checkpoints stored as Megatron-Core stores its distributed optimizer's states, for
tests/interop-megatron-fold.sh: without megatron-core, many shapes and cuts.

usage: save_reformulated.py OUT SEED

Megatron-Core (dist_checkpointing/strategies/resharding.py) stores a tensor of original
shape G split into blocks l (G_i = F_i * l_i) as a tensor [F_0, ..., F_{n-1}, prod(l)]: block
b is row b of the last dimension, in the block's C order, and each data-parallel rank's
flattened range of a block is a chunk [1, ..., 1, len]; G goes into the .metadata's
mcore_data (key -> {"nd_reformulated_orig_global_shape": G}), an attribute of the Metadata.

This writes OUT/ckpt with torch.distributed.checkpoint.save (one gloo process, a
ShardedTensor whose local shards are those chunks), then adds mcore_data to its .metadata
as Megatron-Core 0.8 does (an attribute of torch's own Metadata). Cases (SEED picks the
cuts): 1-D to 4-D tensors, blocks of one element, one block, ranges cut at random points,
ranges of one element, whole blocks, prepended layer axes (l_0 = 1), float32 and bfloat16;
and keys the fold must leave stored: an original shape of another rank, one whose
dimensions do not divide, one whose block product is not the last dimension, a non-integer
shape, None, a key that is no tensor, a key not in the checkpoint, and a stored tensor
whose chunks span several blocks.

OUT/alt: the reformulated tensors alone, the same originals stored as one block each (as
another tensor-parallel size would store them): other stored shapes, the same folded view.

OUT/folded.truth: per key "KEY<TAB>SHAPE<TAB>XXH3_128" of Megatron-Core's view (the
originals for the folded keys, the stored tensor for the others); OUT/stored.truth the
same of the stored view (what PyTorch's own load gives); each also as .json (per key:
kind, dtype, shape, sha256) for tests/load_check.py.
"""
import hashlib
import json
import os
import pickle
import random
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import xxhash
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties


def reformulate(orig, frag):
    """The stored form of orig split into frag[i] blocks along dimension i."""
    n = orig.dim()
    l = [g // f for g, f in zip(orig.shape, frag)]
    t = orig.reshape([x for pair in zip(frag, l) for x in pair])
    t = t.permute(list(range(0, 2 * n, 2)) + list(range(1, 2 * n, 2)))
    return t.reshape(list(frag) + [int(torch.tensor(l).prod())])


def cuts(rng, p, how):
    """Split [0, p) into ranges."""
    if p == 0:
        return []
    if how == "whole":
        return [(0, p)]
    if how == "ones":
        return [(i, i + 1) for i in range(p)]
    k = rng.randint(1, min(p, 6))
    points = sorted(rng.sample(range(1, p), k - 1)) if p > 1 else []
    edges = [0] + points + [p]
    return list(zip(edges, edges[1:]))


def sharded(stored, ranges_of):
    """A ShardedTensor of stored whose local shards are [1, ..., 1, len] ranges."""
    shards = []
    n = stored.dim() - 1
    for b in (torch.cartesian_prod(*[torch.arange(f) for f in stored.shape[:n]]).reshape(-1, n).tolist()
              if n else [[]]):
        for a, e in ranges_of(tuple(b)):
            piece = stored[tuple(slice(i, i + 1) for i in b) + (slice(a, e),)].clone()
            shards.append(Shard(piece, ShardMetadata(shard_offsets=list(b) + [a], shard_sizes=list(piece.shape),
                                                     placement="rank:0/cpu")))
    md = ShardedTensorMetadata(shards_metadata=[s.metadata for s in shards], size=stored.shape,
                               tensor_properties=TensorProperties(dtype=stored.dtype))
    return ShardedTensor._init_from_local_shards_and_global_metadata(shards, md)


def digest(t):
    return xxhash.xxh3_128_hexdigest(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())


def main(out, seed):
    rng = random.Random(seed)
    dist.init_process_group("gloo", init_method=f"file://{out}/.pg", rank=0, world_size=1)
    sd, mcore, folded, stored_truth = {}, {}, {}, {}
    # (name, original shape, blocks per dimension, dtype, how the ranges are cut)
    cases = [
        ("d1", (12,), (3,), torch.float32, "random"),
        ("d2", (8, 6), (2, 1), torch.float32, "random"),
        ("d2_cols", (6, 10), (1, 2), torch.float32, "random"),
        ("d2_ones", (4, 6), (2, 3), torch.float32, "ones"),
        ("d2_whole", (8, 6), (4, 2), torch.bfloat16, "whole"),
        ("d3", (4, 6, 10), (2, 3, 2), torch.float32, "random"),
        ("d3_layers", (3, 8, 4), (3, 2, 1), torch.float32, "random"),   # a prepended layer axis
        ("d4", (2, 4, 6, 4), (2, 2, 3, 1), torch.bfloat16, "random"),
        ("one_block", (5, 7), (1, 1), torch.float32, "random"),
        ("unit_blocks", (3, 4), (3, 4), torch.float32, "random"),
    ]
    for name, g, frag, dt, how in cases:
        key = f"optimizer.state.exp_avg.{name}"
        orig = (torch.randn(g, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))) * 100).to(dt)
        stored = reformulate(orig, frag)
        p = stored.shape[-1]
        per_block = {}
        sd[key] = sharded(stored, lambda b: per_block.setdefault(b, cuts(rng, p, how)))
        mcore[key] = {"nd_reformulated_orig_global_shape": tuple(g)}
        folded[key] = orig
        stored_truth[key] = stored
    # left stored: whatever mcore_data says that Megatron-Core's own save would not
    base = reformulate(torch.arange(48, dtype=torch.float32).reshape(8, 6), (2, 1))   # [2, 1, 24]
    for name, shape in (("other_rank", (8, 6, 1)), ("no_divide", (7, 6)), ("product", (8, 3)),
                        ("not_ints", ("8", 6)), ("none", None), ("negative", (-8, -6))):
        key = f"optimizer.state.exp_avg_sq.{name}"
        sd[key] = sharded(base.clone(), lambda b: [(0, 10), (10, 24)])
        mcore[key] = {"nd_reformulated_orig_global_shape": shape}
        stored_truth[key] = base
    # chunks spanning both blocks: not what Megatron-Core writes
    key = "optimizer.state.exp_avg_sq.spans"
    shards = [Shard(base[:, :, :12].clone(), ShardMetadata([0, 0, 0], [2, 1, 12], "rank:0/cpu")),
              Shard(base[:, :, 12:].clone(), ShardMetadata([0, 0, 12], [2, 1, 12], "rank:0/cpu"))]
    sd[key] = ShardedTensor._init_from_local_shards_and_global_metadata(
        shards, ShardedTensorMetadata([s.metadata for s in shards], base.shape, TensorProperties(dtype=base.dtype)))
    mcore[key] = {"nd_reformulated_orig_global_shape": (8, 6)}
    stored_truth[key] = base
    sd["plain"] = torch.arange(10, dtype=torch.int64)
    mcore["plain"] = {"nd_reformulated_orig_global_shape": (2, 5)}   # not stored reformulated
    stored_truth["plain"] = sd["plain"]
    mcore["not.in.the.checkpoint"] = {"nd_reformulated_orig_global_shape": (4, 4)}
    mcore["decoder.layers.weight"] = {}                              # what model tensors have
    ckpt = os.path.join(out, "ckpt")
    dcp.save(sd, checkpoint_id=ckpt)
    # OUT/alt: the same originals saved as one block each (another tensor-parallel size):
    # other stored shapes, the same folded tensors
    alt = {}
    for key, orig in folded.items():
        one = reformulate(orig, (1,) * orig.dim())
        alt[key] = sharded(one, lambda b: cuts(rng, one.shape[-1], "random"))
    dcp.save(alt, checkpoint_id=os.path.join(out, "alt"))
    dist.destroy_process_group()
    if os.path.exists(f"{out}/.pg"):
        os.unlink(f"{out}/.pg")
    for folder, shapes in ((ckpt, mcore), (os.path.join(out, "alt"), {k: mcore[k] for k in alt})):
        with open(os.path.join(folder, ".metadata"), "rb") as f:
            md = pickle.load(f)
        md.mcore_data = shapes
        with open(os.path.join(folder, ".metadata"), "wb") as f:
            pickle.dump(md, f)
    for fname, view in (("stored.truth", stored_truth), ("folded.truth", {**stored_truth, **folded})):
        with open(os.path.join(out, fname), "w") as f:
            for key in sorted(view):
                t = view[key]
                f.write(f"{key}\t[{','.join(map(str, t.shape))}]\t{digest(t)}\n")
        doc = {key: {"kind": "tensor", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                     "sha256": hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()}
               for key, t in view.items()}
        with open(os.path.join(out, fname + ".json"), "w") as f:
            json.dump(doc, f, indent=0, sort_keys=True)
    print(f"{len(folded)} reformulated tensors, {len(stored_truth) - len(folded)} left stored")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
