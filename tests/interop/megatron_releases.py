"""Megatron-Core releases' torch_dist checkpoints, for tests/interop-megatron-releases.sh.

save OUT   (with one megatron-core release first on PYTHONPATH) writes, with that release's
           own dist_checkpointing.save (the torch_dist backend):
  OUT/tp1      a tiny GPTModel (local layer spec, 2 layers) from one gloo rank, plus
               common items (Megatron-LM's training arguments among them: common.pt, from
               0.19 the checkpoint's common_state bytes item) and bytes items (releases
               before 0.9 cannot build a GPTModel
               without TransformerEngine: for them, the sharded state dict such a model
               gives, made by hand with the same key names, layer-stacked tensors split along
               rows and columns, replicated norms and _extra_state objects);
  OUT/tp2dp2   the same model on 4 gloo ranks, tensor parallel 2 x data parallel 2, saved
               through FullyParallelSaveStrategyWrapper (the data-parallel ranks split the
               replicated tensors between them), plus the distributed optimizer's
               flattened_range tensors (2-D and 3-D, split at uneven points), which
               dist_checkpointing stores reformulated ([X/x, Y/y, x*y] with the
               original shape in the metadata's mcore_data); before 0.8, whose torch_dist
               takes flattened ranges of 1-D tensors only, the optimizer's buckets as those
               releases' DistributedOptimizer saves them (fully_sharded_bucket_space: each
               data-parallel rank's bucket shard in two flattened ranges of one key); 0.6
               has no fully parallel save, its replica ids alone decide who writes; from
               0.16 ShardedTensor refuses flattened ranges: no reformulated tensors; from
               0.15 the dp_reshardable buckets too (dp_reshardable());
  OUT/CASE.truth  per key: "KEY<TAB>SHAPE<TAB>XXH3_128" of PyTorch's own view of the saved
               checkpoint (torch.distributed.checkpoint.load of every key into a full
               tensor; a bytes item's stored bytes), shape "bytes" for bytes items;
  OUT/CASE.truth.json  the same as tests/data/torch-releases' truth.json (per key: kind,
               dtype, shape, sha256), for tests/load_check.py;
  OUT/CASE.folded.truth, .folded.truth.json  the same for Megatron-Core's own view
               (dcp --megatron-fold): the tensors mcore_data names reformulated in their
               original shapes and values (originals(), what was saved), the rest as above.

check OUT...  (with the dcpfs package on PYTHONPATH) loads every tensor of every OUT/CASE with
           dcpfs.torch.load (one process) and with torch.distributed.checkpoint.load through
           dcpfs.torch.Reader, into full tensors, and compares their bytes with OUT/CASE.truth;
           then again with megatron_fold=True, against OUT/CASE.folded.truth.

The releases before 0.13 call PyTorch's private filesystem._write_item with the arguments of
their time (no transforms, no serialization format), and 0.9-0.12 call numpy.product
(gone in numpy 2); those before 0.9 import pkg_resources (gone from setuptools), pass
is_coordinator to the planner's set_up_planner by position (where PyTorch 2.13 has
storage_meta) and add the other ranks' bytes items to the plan themselves (which PyTorch now
does, so each would be written twice and the global plan refuses it): all bridged here, which
changes nothing of what is written. 0.5 and older have no torch_dist backend (zarr only).
"""
import inspect
import itertools
import os
import pickle
import sys
import types
import warnings

import numpy
import torch

try:
    import pkg_resources  # noqa: F401
except ImportError:   # megatron-core before 0.9 takes packaging from it
    import packaging.version
    sys.modules["pkg_resources"] = types.ModuleType("pkg_resources")
    sys.modules["pkg_resources"].packaging = packaging

from export_megatron import free_port   # this folder is the script's, first on sys.path

warnings.filterwarnings("ignore")
if not hasattr(numpy, "product"):
    numpy.product = numpy.prod


def bridge_write_item():
    from torch.distributed.checkpoint import filesystem as fs
    orig = fs._write_item

    def write_item(*a, **k):
        if not isinstance(a[0], fs._StorageWriterTransforms):
            a = (fs._StorageWriterTransforms(),) + a
        if len(a) < 6 and "serialization_format" not in k:
            k["serialization_format"] = fs.SerializationFormat.TORCH_SAVE
        return orig(*a, **k)
    try:
        import megatron.core.dist_checkpointing.strategies.filesystem_async as fa
        if fa._write_item is orig and len(inspect.signature(orig).parameters) > 4:
            fa._write_item = write_item
    except ImportError:
        pass


def init(rank, world, port, tp):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random
    parallel_state.initialize_model_parallel(tp, 1)
    # Megatron-Core asks CUDA in a few places even on the CPU (tests/interop/export_megatron.py)
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    kw = {}
    if "inference_rng_tracker" in inspect.signature(random.model_parallel_cuda_manual_seed).parameters:
        kw["inference_rng_tracker"] = True
    try:
        random.model_parallel_cuda_manual_seed(1234, **kw)
    except (AssertionError, TypeError):
        pass   # 0.9's tracker reads CUDA RNG states, 0.11's inference one fails to build: build() seeds the CPU
    bridge_write_item()
    if legacy():
        bridge_planner()


def release():
    """The megatron-core release on the path, as (major, minor)."""
    from megatron.core.package_info import __version__
    return tuple(int(x) for x in __version__.split(".")[:2])


def legacy():
    """A release before 0.9: no GPTModel without TransformerEngine, a planner for PyTorch before 2.4."""
    return release() < (0, 9)


def bridge_planner():
    import torch.distributed.checkpoint.default_planner as dp
    from megatron.core.dist_checkpointing.strategies import torch as mt
    orig = dp.DefaultSavePlanner.set_up_planner

    def set_up_planner(self, state_dict, *a, **k):
        if a and isinstance(a[0], bool):
            k["is_coordinator"] = a[0]
            a = a[1:]
        return orig(self, state_dict, *a, **k)
    dp.DefaultSavePlanner.set_up_planner = set_up_planner
    if hasattr(mt.MCoreSavePlanner, "_add_non_coordinator_iobytes_request"):
        mt.MCoreSavePlanner._add_non_coordinator_iobytes_request = lambda self, plan: None


def build():
    import dataclasses
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    want = dict(num_layers=2, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                params_dtype=torch.float32, layernorm_epsilon=1e-5, bias_dropout_fusion=False,
                apply_rope_fusion=False, hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=False,
                gradient_accumulation_fusion=False, persist_layer_norm=False, num_query_groups=2,
                ffn_hidden_size=96, normalization="RMSNorm", gated_linear_unit=True,
                activation_func=torch.nn.functional.silu, add_bias_linear=False)
    cfg = TransformerConfig(**{k: v for k, v in want.items() if k in fields})
    params = inspect.signature(get_gpt_layer_local_spec).parameters
    if "normalization" in params:
        spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    else:   # before 0.10 the local spec has torch's LayerNorm only
        cfg.normalization = "LayerNorm"
        spec = get_gpt_layer_local_spec()
    torch.manual_seed(11)
    m = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=128, max_sequence_length=256,
                 position_embedding_type="rope", share_embeddings_and_output_weights=False)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p))
    return m


def training_args(old):
    """Megatron-LM's training arguments (an argparse.Namespace in the common state) for the
    model of build(): dcp convert --to hf writes config.json from them."""
    import argparse
    return argparse.Namespace(
        num_layers=2, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4, group_query_attention=True,
        num_query_groups=2, kv_channels=16, norm_epsilon=1e-5, normalization="LayerNorm" if old else "RMSNorm",
        swiglu=True, position_embedding_type="rope", rotary_base=10000, max_position_embeddings=256,
        seq_length=256, add_bias_linear=False, untie_embeddings_and_output_weights=True, use_rope_scaling=False,
        rotary_interleaved=False, apply_query_key_layer_scaling=False, qk_layernorm=False)


def hand_made(tp, tp_size, dp):
    """What GPTModel.sharded_state_dict() gives on rank (tp, dp), for the releases that cannot
    build one: the same kinds of entries under a GPT model's key names."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
    g = torch.Generator().manual_seed(5)
    emb, out_w = torch.randn(128, 64, generator=g), torch.randn(128, 64, generator=g)
    qkv, proj = torch.randn(2, 128, 64, generator=g), torch.randn(2, 64, 64, generator=g)
    ln, final = torch.randn(2, 64, generator=g), torch.randn(64, generator=g)
    r, c = 128 // tp_size, 64 // tp_size
    sd = {
        "embedding.word_embeddings.weight": ShardedTensor.from_rank_offsets(
            "embedding.word_embeddings.weight", emb[tp * r:(tp + 1) * r].clone(), (0, tp, tp_size),
            replica_id=(0, 0, dp)),
        "output_layer.weight": ShardedTensor.from_rank_offsets(
            "output_layer.weight", out_w[tp * r:(tp + 1) * r].clone(), (0, tp, tp_size), replica_id=(0, 0, dp)),
        "decoder.final_layernorm.weight": ShardedTensor.from_rank_offsets(
            "decoder.final_layernorm.weight", final.clone(), replica_id=(0, tp, dp)),
    }
    for i in range(2):   # layer-stacked: axis 0 prepended, one layer a rank's entry
        p = f"decoder.layers.{i}."
        sd[p + "qkv"] = ShardedTensor.from_rank_offsets(
            "decoder.layers.self_attention.linear_qkv.weight", qkv[i, tp * r:(tp + 1) * r].clone(),
            (0, i, 2), (1, tp, tp_size), replica_id=(0, 0, dp), prepend_axis_num=1)
        sd[p + "proj"] = ShardedTensor.from_rank_offsets(
            "decoder.layers.self_attention.linear_proj.weight", proj[i, :, tp * c:(tp + 1) * c].clone(),
            (0, i, 2), (2, tp, tp_size), replica_id=(0, 0, dp), prepend_axis_num=1)
        sd[p + "ln"] = ShardedTensor.from_rank_offsets(
            "decoder.layers.self_attention.linear_qkv.layer_norm_weight", ln[i].clone(), (0, i, 2),
            replica_id=(0, tp, dp), prepend_axis_num=1)
        sd[p + "extra"] = ShardedObject("decoder.layers.self_attention.linear_proj._extra_state",
                                        {"layer": i, "tp": tp}, (2, tp_size), (i, tp), replica_id=dp)
    return sd


def buckets(tp, dp, dp_size):
    """Before 0.8: the DistributedOptimizer's fully_sharded_bucket_space entries on rank (tp, dp),
    a bucket shard of 24 elements a data-parallel rank, in two flattened ranges of one key."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    out = {}
    key = f"optimizer.distributed.dp_group_idx_{tp}.gbuf_idx_0.dtype_(torch.float32, torch.float32).bucket_idx_0"
    for name, sign in (("exp_avg", 1), ("exp_avg_sq", -1)):
        full = sign * torch.arange(dp_size * 24, dtype=torch.float32) / (tp + 3)
        mine = full[dp * 24:(dp + 1) * 24]
        for j, rng in enumerate((slice(0, 9), slice(9, 24))):
            out[f"{name}.{j}"] = ShardedTensor(
                f"{key}.{name}", mine[rng].clone(), torch.float32, (24,), (dp_size * 24,), (dp * 24,),
                axis_fragmentations=(dp_size,), flattened_range=rng, allow_shape_mismatch=True)
    return out


def dp_reshardable(tp, dp, dp_size):
    """From 0.15: the DistributedOptimizer's dp_reshardable entries on rank (tp, dp), as
    sharded_param_state_dp_reshardable makes them: a bucket of 24 elements a data-parallel
    rank (two parameters, padding between them) saved as a 1-D key of its unpadded length,
    each rank's part in several ShardedTensors of that key (a parameter's piece, the padding,
    the last padding dropped), and the bucket sizes as ShardedObjects of the first data-parallel
    rank."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor
    local, unpadded = 24, dp_size * 24 - 3
    # world ranges: parameter [0, 13), padding [13, 16), parameter [16, unpadded)
    cuts = [c for c in (0, 13, 16, unpadded) if dp * local <= c < (dp + 1) * local] + [(dp + 1) * local]
    cuts = sorted(set([dp * local] + cuts))
    key = f"optimizer.distributed.dp_group_idx_{tp}.gbuf_idx_0.dtype_(torch.float32, torch.float32).bucket_idx_0"
    out = {f"optimizer.distributed.dp_group_idx_{tp}.per_bucket_numel": ShardedObject(
        f"optimizer.distributed.dp_group_idx_{tp}.per_bucket_numel", {0: {"float32": [dp_size * local]}},
        (1,), (0,), replica_id=(0, 0, dp))}
    for name, sign in (("exp_avg", 1), ("exp_avg_sq", -1)):
        full = sign * torch.arange(dp_size * local, dtype=torch.float32) / (tp + 5)
        for a, b in zip(cuts, cuts[1:]):
            if a >= unpadded:
                continue   # the last padding, which resharding would change, is not saved
            out[f"{key}.{name}.{a}"] = ShardedTensor(
                f"{key}.{name}", full[a:b].clone(), torch.float32, (b - a,), (unpadded,), (a,),
                axis_fragmentations=None, replica_id=(0, 0, 0))
    return out


def originals():
    """The distributed optimizer's tensors of flattened() in their original shapes: what
    Megatron-Core's own load folds them back to (dcp --megatron-fold must give these)."""
    return {"optimizer.state.exp_avg.w2d": torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6) / 7,
            "optimizer.state.exp_avg_sq.w3d": torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6) - 17}


def flattened(tp, dp):
    """The distributed optimizer's flattened_range tensors on rank (tp, dp)."""
    from megatron.core.dist_checkpointing import ShardedTensor
    out = {}
    full = originals()["optimizer.state.exp_avg.w2d"]
    block = full[tp * 4:(tp + 1) * 4].reshape(-1)                  # local [4, 6]: 24 elements
    rng = slice(0, 10) if dp == 0 else slice(10, 24)
    out["optimizer.state.exp_avg.w2d"] = ShardedTensor.from_rank_offsets_flat(
        "optimizer.state.exp_avg.w2d", block[rng].clone(), (4, 6), (0, tp, 2), replica_id=0, flattened_range=rng)
    full3 = originals()["optimizer.state.exp_avg_sq.w3d"]
    b3 = full3[:, :, tp * 3:(tp + 1) * 3].reshape(-1)               # local [2, 4, 3]: 24 elements
    r3 = slice(0, 7) if dp == 0 else slice(7, 24)
    out["optimizer.state.exp_avg_sq.w3d"] = ShardedTensor.from_rank_offsets_flat(
        "optimizer.state.exp_avg_sq.w3d", b3[r3].clone(), (2, 4, 3), (2, tp, 2), replica_id=0, flattened_range=r3)
    return out


def worker(rank, world, port, tp, out):
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    init(rank, world, port, tp)
    old = legacy()
    sd = hand_made(rank % tp, tp, rank // tp) if old else build().sharded_state_dict()
    sd["iteration"] = 1000
    sd["args"] = training_args(old)
    sd["notes"] = {"release": "test", "list": [1, 2, 3]}
    if rank == 0:
        os.makedirs(out)
    dist.barrier()
    if old:   # before 0.7 the default backend is zarr
        from megatron.core.dist_checkpointing.strategies.base import StrategyAction, get_default_strategy
        strategy = get_default_strategy(StrategyAction.SAVE_SHARDED, "torch_dist", 1)
    else:
        from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
        strategy = get_default_save_sharded_strategy()
    if world == 1:
        dist_checkpointing.save(sd, out, strategy)
    else:
        from megatron.core.dist_checkpointing.mapping import ShardedTensor
        if release() >= (0, 15):
            sd.update(dp_reshardable(rank % tp, rank // tp, world // tp))
        if release() >= (0, 16):
            pass   # ShardedTensor refuses flattened_range: nothing is saved reformulated
        elif hasattr(ShardedTensor, "from_rank_offsets_flat"):
            sd.update(flattened(rank % tp, rank // tp))
        else:
            sd.update(buckets(rank % tp, rank // tp, world // tp))
        try:
            from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
        except ImportError:   # 0.6
            FullyParallelSaveStrategyWrapper = None
        if FullyParallelSaveStrategyWrapper:
            group = parallel_state.get_data_parallel_group(with_context_parallel=True)
            strategy = FullyParallelSaveStrategyWrapper(strategy, group, True)
        dist_checkpointing.save(sd, out, strategy)
    dist.barrier()
    dist.destroy_process_group()


def truth(ckpt, path):
    """PyTorch's own view of every key, as "KEY<TAB>SHAPE<TAB>XXH3_128" lines."""
    import hashlib
    import json
    import xxhash
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

    class Unpickler(pickle.Unpickler):   # MCoreMetadata is torch's Metadata plus mcore_data
        def find_class(self, mod, name):
            return Metadata if mod.startswith("megatron") else super().find_class(mod, name)
    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        md = Unpickler(f).load()
    reader = dcp.FileSystemReader(ckpt)
    reader.read_metadata = lambda *a, **k: md
    lines, doc = [], {}
    for key, m in md.state_dict_metadata.items():
        if type(m).__name__ == "BytesStorageMetadata":
            si = md.storage_data[MetadataIndex(key)]
            with open(os.path.join(ckpt, si.relative_path), "rb") as f:
                f.seek(si.offset)
                raw = f.read(si.length)
            shape = "bytes"
            doc[key] = {"kind": "bytes"}
        else:
            t = {key: torch.empty(tuple(m.size), dtype=m.properties.dtype)}
            dcp.load(t, storage_reader=reader, no_dist=True)
            raw = t[key].contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            shape = "[" + ",".join(str(s) for s in m.size) + "]"
            doc[key] = {"kind": "tensor", "dtype": str(m.properties.dtype).removeprefix("torch."),
                        "shape": list(m.size)}
        doc[key]["sha256"] = hashlib.sha256(raw).hexdigest()
        lines.append(f"{key}\t{shape}\t{xxhash.xxh3_128_hexdigest(raw)}\n")
    with open(path, "w") as f:
        f.writelines(sorted(lines))
    with open(path + ".json", "w") as f:
        json.dump(doc, f, indent=0, sort_keys=True)
    # The folded view (dcp --megatron-fold): the reformulated tensors (those mcore_data
    # gives an original shape) in their original shapes, every other key as above.
    reform = {k: v.get("nd_reformulated_orig_global_shape") for k, v in getattr(md, "mcore_data", {}).items()}
    fold = {k: t for k, t in originals().items() if reform.get(k) is not None}
    for key, t in fold.items():
        assert tuple(reform[key]) == tuple(t.shape), (key, reform[key], t.shape)
        raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        doc[key] = {"kind": "tensor", "dtype": "float32", "shape": list(t.shape),
                    "sha256": hashlib.sha256(raw).hexdigest()}
        lines = [ln for ln in lines if ln.split("\t")[0] != key]
        lines.append(f"{key}\t[{','.join(map(str, t.shape))}]\t{xxhash.xxh3_128_hexdigest(raw)}\n")
    with open(path.removesuffix(".truth") + ".folded.truth", "w") as f:
        f.writelines(sorted(lines))
    with open(path.removesuffix(".truth") + ".folded.truth.json", "w") as f:
        json.dump(doc, f, indent=0, sort_keys=True)
    return sorted(fold)


def save(out):
    import torch.multiprocessing as mp
    import megatron.core.package_info
    if not legacy():
        import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401 (imported once, before the forks)
        import megatron.core.dist_checkpointing.strategies.fully_parallel  # noqa: F401
    os.makedirs(out, exist_ok=True)
    for case, world, tp in (("tp1", 1, 1), ("tp2dp2", 4, 2)):
        # fork: the children start with torch and megatron imported (spawn: 5-10 s an import)
        mp.start_processes(worker, args=(world, free_port(), tp, f"{out}/{case}"), nprocs=world, join=True,
                           start_method="fork")
        folded = truth(f"{out}/{case}", f"{out}/{case}.truth")
        print(f"{case}: {len(folded)} reformulated: {' '.join(folded)}")
    print(f"megatron-core {megatron.core.package_info.__version__}: tp1, tp2dp2 saved")


def check(outs):
    """dcpfs.torch.load and dcp.load with dcpfs.torch.Reader against OUT/CASE.truth."""
    import json
    import xxhash
    import torch.distributed.checkpoint as dcp
    import dcpfs.torch
    bad = 0
    for out in outs:
        for case, fold in itertools.product(("tp1", "tp2dp2"), (False, True)):
            ck = os.path.join(out, case)
            truth = ck + (".folded.truth" if fold else ".truth")
            view = "Megatron-Core's own view (megatron_fold)" if fold else "PyTorch's own view"
            want, sd = {}, {}
            for line in open(truth):
                key, shape, digest = line.rstrip("\n").split("\t")
                if shape != "bytes":
                    want[key] = digest
            doc = json.load(open(truth + ".json"))
            for key in want:
                sd[key] = (tuple(doc[key]["shape"]), dcpfs.torch.torch_dtype(doc[key]["dtype"]))
            before = bad
            for how in ("dcpfs.torch.load", "dcp.load with dcpfs.torch.Reader"):
                got = {k: torch.full(shape, 7, dtype=dt) for k, (shape, dt) in sd.items()}
                if how == "dcpfs.torch.load":
                    dcpfs.torch.load(got, ck, catalog=False, megatron_fold=fold)
                else:
                    dcp.load(got, storage_reader=dcpfs.torch.Reader(ck, catalog=False, megatron_fold=fold),
                             no_dist=True)
                for key, digest in want.items():
                    raw = got[key].contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                    if xxhash.xxh3_128_hexdigest(raw) != digest:
                        print(f"{ck}: {key}: {how} gives other bytes than {view}")
                        bad += 1
            if bad == before:
                print(f"{ck}: {len(want)} tensors: dcpfs.torch.load and dcp.load with dcpfs.torch.Reader "
                      f"give {view}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if sys.argv[1] == "check":
        check(sys.argv[2:])
    else:
        save(sys.argv[2])
