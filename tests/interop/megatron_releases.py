"""Megatron-Core releases' torch_dist checkpoints, for tests/interop-megatron-releases.sh.

save OUT   (with one megatron-core release first on PYTHONPATH) writes, with that release's
           own dist_checkpointing.save:
  OUT/tp1      a tiny GPTModel (local layer spec, 2 layers) from one gloo rank, plus a
               common item and bytes items;
  OUT/tp2dp2   the same model on 4 gloo ranks, tensor parallel 2 x data parallel 2, saved
               through FullyParallelSaveStrategyWrapper (the data-parallel ranks split the
               replicated tensors between them), plus the distributed optimizer's
               flattened_range tensors (2-D and 3-D, split at uneven points), which
               dist_checkpointing stores reformulated ([X/x, Y/y, x*y] with the
               original shape in the metadata's mcore_data);
  OUT/CASE.truth  per key: "KEY<TAB>SHAPE<TAB>XXH3_128" of PyTorch's own view of the saved
               checkpoint (torch.distributed.checkpoint.load of every key into a full
               tensor; a bytes item's stored bytes), shape "bytes" for bytes items.

The releases before 0.13 call PyTorch's private filesystem._write_item with the arguments of
their time (no transforms, no serialization format), and 0.9-0.12 call numpy.product
(gone in numpy 2): both are bridged here, which changes nothing of what is written.
"""
import inspect
import os
import pickle
import sys
import warnings

import numpy
import torch

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


def flattened(tp, dp):
    """The distributed optimizer's flattened_range tensors on rank (tp, dp)."""
    from megatron.core.dist_checkpointing import ShardedTensor
    out = {}
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6) / 7
    block = full[tp * 4:(tp + 1) * 4].reshape(-1)                  # local [4, 6]: 24 elements
    rng = slice(0, 10) if dp == 0 else slice(10, 24)
    out["optimizer.state.exp_avg.w2d"] = ShardedTensor.from_rank_offsets_flat(
        "optimizer.state.exp_avg.w2d", block[rng].clone(), (4, 6), (0, tp, 2), replica_id=0, flattened_range=rng)
    full3 = torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6) - 17
    b3 = full3[:, :, tp * 3:(tp + 1) * 3].reshape(-1)               # local [2, 4, 3]: 24 elements
    r3 = slice(0, 7) if dp == 0 else slice(7, 24)
    out["optimizer.state.exp_avg_sq.w3d"] = ShardedTensor.from_rank_offsets_flat(
        "optimizer.state.exp_avg_sq.w3d", b3[r3].clone(), (2, 4, 3), (2, tp, 2), replica_id=0, flattened_range=r3)
    return out


def worker(rank, world, port, tp, out):
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    init(rank, world, port, tp)
    m = build()
    sd = m.sharded_state_dict()
    sd["iteration"] = 1000
    sd["notes"] = {"release": "test", "list": [1, 2, 3]}
    if rank == 0:
        os.makedirs(out)
    dist.barrier()
    if world == 1:
        dist_checkpointing.save(sd, out)
    else:
        from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
        from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
        sd.update(flattened(rank % tp, rank // tp))
        group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        dist_checkpointing.save(sd, out, FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy(), group, True))
    dist.barrier()
    dist.destroy_process_group()


def truth(ckpt, path):
    """PyTorch's own view of every key, as "KEY<TAB>SHAPE<TAB>XXH3_128" lines."""
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
    lines = []
    for key, m in md.state_dict_metadata.items():
        if type(m).__name__ == "BytesStorageMetadata":
            si = md.storage_data[MetadataIndex(key)]
            with open(os.path.join(ckpt, si.relative_path), "rb") as f:
                f.seek(si.offset)
                raw = f.read(si.length)
            shape = "bytes"
        else:
            t = {key: torch.empty(tuple(m.size), dtype=m.properties.dtype)}
            dcp.load(t, storage_reader=reader, no_dist=True)
            raw = t[key].contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            shape = "[" + ",".join(str(s) for s in m.size) + "]"
        lines.append(f"{key}\t{shape}\t{xxhash.xxh3_128_hexdigest(raw)}\n")
    with open(path, "w") as f:
        f.writelines(sorted(lines))


def save(out):
    import torch.multiprocessing as mp
    import megatron.core
    import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401 (imported once, before the forks)
    import megatron.core.dist_checkpointing.strategies.fully_parallel  # noqa: F401
    os.makedirs(out, exist_ok=True)
    for case, world, tp in (("tp1", 1, 1), ("tp2dp2", 4, 2)):
        # fork: the children start with torch and megatron imported (spawn: 5-10 s an import)
        mp.start_processes(worker, args=(world, free_port(), tp, f"{out}/{case}"), nprocs=world, join=True,
                           start_method="fork")
        truth(f"{out}/{case}", f"{out}/{case}.truth")
    print(f"megatron-core {getattr(megatron.core, '__version__', '?')}: tp1, tp2dp2 saved")


if __name__ == "__main__":
    save(sys.argv[2])
