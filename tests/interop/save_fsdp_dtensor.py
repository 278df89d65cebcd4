"""Megatron-LM's --ckpt-format fsdp_dtensor on the CPU (tests/export-megatron-fsdp.sh).

make OUT KIND: on 2 gloo ranks, builds KIND (llama: the Llama-shaped GPTModel of
export_megatron.py, dense SwiGLU; llama-tp2: the same on 4 ranks, tensor parallel 2 x data
parallel 2; mixtral: its MoE one, 4 SequentialMLP experts, expert parallel 2) with Megatron-Core's
classes, saves its sharded_state_dict() with dist_checkpointing (the
torch_dist format, OUT/KIND-torch-dist) and then trains it as Megatron-LM does with
--use-megatron-fsdp: wrapped by Megatron-Core's FullyShardedDataParallel (Megatron-FSDP,
optim_grads_params: parameters, gradients and optimizer state sharded over the data-parallel
ranks, uneven DTensors), a DistributedOptimizer (Adam) from get_megatron_optimizer, one step of its torch
optimizer on random gradients (learning rate 0, so the weights stay those of the torch_dist
save, and the moments are not zero), an OptimizerParamScheduler; then
megatron.training.checkpointing.save_checkpoint itself with args from Megatron-LM's own
parse_args/validate_args (--use-megatron-fsdp --ckpt-format fsdp_dtensor --swiglu ...) writes
OUT/KIND-fsdp/iter_0000010 and latest_checkpointed_iteration.txt: generate_state_dict,
preprocess_fsdp_dtensor_state_dict (SwiGLU split into weight_w/weight_v, expert renumbering,
uneven DTensor chunks) and torch.distributed.checkpoint.save, nothing imitated.
OUT/KIND-config.json is the transformers config of the same model.

Megatron-FSDP asks for CUDA where a CPU run needs none; these are pointed at the CPU:
torch.cuda.Stream/stream/current_stream/synchronize/current_device (no-ops),
get_device_properties (compute capability 9.0, an H100's), Tensor.cuda (the
tensor itself), the DeviceMeshes Megatron builds with device_type "cuda" (built as "cpu"),
torch.tensor(..., device="cuda") while the optimizer is built (its overflow flag),
torch.cuda.get_rng_state (the 16 bytes of a CUDA generator's state, here fixed ones), and
typing.override (megatron.training imports it; Python 3.12). Megatron-FSDP needs einops.

truth OUT KIND: torch's own dcp.load of OUT/KIND-fsdp/iter_0000010 (every key, plain tensors on
one process, bytes items as stored) as OUT/KIND.truth and OUT/KIND.truth.json. files OUT KIND ST
PT: dcp convert's safetensors and --nested .pt outputs against torch (dcp.load; its
dcp_to_torch_save). pyload OUT KIND...: dcpfs.torch.load and dcpfs.torch.Reader against dcp.load.
grouped OUT: the MoE save's model keys renamed as TEGroupedMLP's (OUT/mixtral-grouped)."""
import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_megatron as em  # noqa: E402 (the models of tests/export-megatron.sh)

ITER = 10


def cpu_for_cuda():
    class Stream:
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, *a, **k):
            pass

        def synchronize(self):
            pass

    torch.cuda.Stream = Stream
    torch.cuda.current_stream = lambda *a, **k: Stream()
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_rng_state = lambda *a, **k: torch.arange(16, dtype=torch.uint8)
    torch.Tensor.cuda = lambda self, *a, **k: self
    import types
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(major=9, minor=0)
    from torch.distributed.device_mesh import DeviceMesh
    from_group = DeviceMesh.from_group
    DeviceMesh.from_group = staticmethod(lambda *a, **k: from_group(*a, **{**k, "device_type": "cpu"}))
    import typing
    if not hasattr(typing, "override"):
        import typing_extensions
        typing.override = typing_extensions.override


def megatron_args(kind, out, world, ep, tp):
    """Megatron-LM's own argument parsing, as a pretrain_gpt.py command line would give it."""
    FF, H, L, NH, V = em.FF, em.H, em.L, em.NH, em.V
    argv = ["pretrain_gpt.py", "--num-layers", str(L), "--hidden-size", str(H), "--num-attention-heads", str(NH),
            "--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size", str(FF),
            "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope",
            "--untie-embeddings-and-output-weights", "--seq-length", "16", "--max-position-embeddings", "256",
            "--micro-batch-size", "1", "--global-batch-size", str(world),
            "--lr", "0.0", "--min-lr", "0.0", "--train-iters", "100", "--save-interval", "10",
            "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
            "--ckpt-format", "fsdp_dtensor", "--save", f"{out}/{kind}-fsdp", "--use-cpu-initialization",
            "--no-gradient-accumulation-fusion", "--no-persist-layer-norm", "--no-masked-softmax-fusion",
            "--no-bias-swiglu-fusion", "--no-rope-fusion", "--transformer-impl", "local",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", str(V - 1), "--norm-epsilon", "1e-5",
            "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--rotary-base", "10000",
            "--make-vocab-size-divisible-by", "1", "--bf16"]
    if tp > 1:
        argv += ["--tensor-model-parallel-size", str(tp)]
    if kind == "mixtral":
        argv += ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", str(FF // 2),
                 "--moe-token-dispatcher-type", "allgather", "--expert-model-parallel-size", str(ep)]
    sys.argv = argv
    from megatron.training.arguments import parse_args, validate_args
    from megatron.training.global_vars import set_args
    args = parse_args()
    validate_args(args)
    args.padded_vocab_size = V
    set_args(args)
    return args


def worker(rank, world, port, out, kind):
    import torch.distributed as dist
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cpu_for_cuda()
    import warnings
    warnings.filterwarnings("ignore")
    import logging
    logging.disable(logging.WARNING)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    ep = 2 if kind == "mixtral" else 1
    tp = 2 if kind == "llama-tp2" else 1
    args = megatron_args(kind, out, world, ep, tp)
    parallel_state.initialize_model_parallel(tp, 1, expert_model_parallel_size=ep)
    model_parallel_cuda_manual_seed(1234, inference_rng_tracker=True)
    from megatron.core.transformer.module import Float16Module
    m = em.build_moe() if kind == "mixtral" else em.build("llama")
    if kind == "mixtral":   # each expert-parallel rank's 2 experts start alike: make them differ
        with torch.no_grad():
            for n, p in m.named_parameters():
                if ".local_experts." in n:
                    p.add_(parallel_state.get_expert_model_parallel_rank())
    m.config.bf16 = True   # --bf16: Megatron-LM's get_model wraps the model in a Float16Module
    m = Float16Module(m.config, m)
    if rank == 0:
        os.makedirs(f"{out}/{kind}-torch-dist")
    dist.barrier()
    torch.cuda.current_device = lambda: "cpu"   # dist_checkpointing's tensors on it; Megatron-FSDP's "cuda:N" below
    dist_checkpointing.save(m.sharded_state_dict(), f"{out}/{kind}-torch-dist")
    torch.cuda.current_device = lambda: 0
    dist.barrier()

    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.training.checkpointing import save_checkpoint
    ddp = DistributedDataParallelConfig(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params",
                                        use_distributed_optimizer=True)
    model = FullyShardedDataParallel(config=m.config, ddp_config=ddp, module=m, device=torch.device("cpu"))
    tensor = torch.tensor   # MixedPrecisionOptimizer makes its overflow flag on device "cuda"
    torch.tensor = lambda *a, **k: tensor(*a, **{**k, "device": "cpu"} if k.get("device") == "cuda" else k)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=0.0, min_lr=0.0, weight_decay=0.01,
                                                 use_distributed_optimizer=True, bf16=False, fp16=False),
                                 [model], use_gloo_process_groups=False)
    torch.tensor = tensor
    gen = torch.Generator().manual_seed(100 + rank)
    inner = [o.optimizer for o in getattr(opt, "chained_optimizers", [opt])]
    for o in inner:
        for group in o.param_groups:
            group["lr"] = 0.0
            for p in group["params"]:
                local = p.to_local() if hasattr(p, "to_local") else p
                g = torch.randn(local.shape, generator=gen, dtype=local.dtype)
                p.grad = type(p).from_local(g, p.device_mesh, p.placements, shape=p.shape,
                                            stride=p.stride()) if hasattr(p, "to_local") else g
        o.step()
        o.zero_grad()
    sched = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=0.0, min_lr=0.0, lr_warmup_steps=0,
                                    lr_decay_steps=100, lr_decay_style="constant", start_wd=0.01, end_wd=0.01,
                                    wd_incr_steps=100, wd_incr_style="constant")
    save_checkpoint(ITER, [model], opt, sched, 1.5e12, checkpointing_context={})
    dist.barrier()
    dist.destroy_process_group()


def make(out, kind):
    import torch.multiprocessing as mp
    os.makedirs(out, exist_ok=True)
    world = 4 if kind == "llama-tp2" else 2
    mp.spawn(worker, args=(world, em.free_port(), out, kind), nprocs=world, join=True)
    import transformers
    if kind == "mixtral":
        transformers.MixtralConfig(hidden_size=em.H, num_attention_heads=em.NH, num_key_value_heads=2,
                                   num_hidden_layers=em.L, vocab_size=em.V, intermediate_size=em.FF // 2,
                                   num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5,
                                   tie_word_embeddings=False).to_json_file(f"{out}/{kind}-config.json")
    else:
        em.hf_config("llama").to_json_file(f"{out}/{kind}-config.json")
    print(f"{kind}: saved by Megatron-LM's save_checkpoint (fsdp_dtensor) from {world} Megatron-FSDP ranks")


def ckpt(out, kind):
    return f"{out}/{kind}-fsdp/iter_{ITER:07d}"


def load_all(ck):
    """torch's own dcp.load of every tensor key, on one process, into plain tensors; a bytes
    item (which dcp.load unpickles) as its stored bytes, where torch's metadata places it."""
    import io
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata
    md = dcp.FileSystemReader(ck).read_metadata()
    sd = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
          for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    dcp.load(sd, checkpoint_id=ck, no_dist=True)
    for k, v in md.state_dict_metadata.items():
        if not isinstance(v, TensorStorageMetadata):
            si = md.storage_data[MetadataIndex(k)]
            with open(os.path.join(ck, si.relative_path), "rb") as f:
                f.seek(si.offset)
                sd[k] = io.BytesIO(f.read(si.length))
    return sd


def raw(v):
    return v.getvalue() if not isinstance(v, torch.Tensor) else v.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def truth(out, kind):
    """OUT/KIND.truth ("KEY<TAB>SHAPE<TAB>XXH3_128" lines, tests/truth_check.py's form) and
    OUT/KIND.truth.json (kind, dtype, shape, sha256: tests/interop/check_truth.py's and
    tests/load_check.py's) from torch's dcp.load."""
    import hashlib
    import json
    import xxhash
    lines, doc = [], {}
    for k, v in load_all(ckpt(out, kind)).items():
        b = raw(v)
        if isinstance(v, torch.Tensor):
            doc[k] = {"kind": "tensor", "dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)}
            shape = "[" + ",".join(map(str, v.shape)) + "]"
        else:
            doc[k] = {"kind": "bytes"}
            shape = "bytes"
        doc[k]["sha256"] = hashlib.sha256(b).hexdigest()
        lines.append(f"{k}\t{shape}\t{xxhash.xxh3_128_hexdigest(b)}\n")
    with open(f"{out}/{kind}.truth", "w") as f:
        f.writelines(sorted(lines))
    with open(f"{out}/{kind}.truth.json", "w") as f:
        json.dump(doc, f, indent=0, sort_keys=True)
    print(f"{kind}: {len(doc)} keys loaded by torch's dcp.load")


def flat(d, path=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from flat(v, path + (str(k),))
    elif isinstance(d, list) and any(isinstance(x, (dict, list, torch.Tensor)) for x in d):
        for i, v in enumerate(d):
            yield from flat(v, path + (str(i),))
    else:
        yield ".".join(path), d


def files(out, kind, st, pt):
    """dcp convert's outputs against torch: ST (safetensors: every tensor, dcp.load's bytes) and
    PT (--nested: torch's own dcp_to_torch_save of the folder, the same nesting and tensors; a
    value dcpfs keeps as its stored torch.save bytes (not plain data: args, numpy's RNG state)
    is those bytes)."""
    import tempfile
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    sd = load_all(ckpt(out, kind))
    got = load_file(st)
    want = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    assert sorted(got) == sorted(want), f"{st}: keys {sorted(set(got) ^ set(want))[:4]} differ"
    bad = [k for k in want if raw(got[k]) != raw(want[k]) or got[k].dtype != want[k].dtype]
    assert not bad, f"{st}: other bytes than dcp.load's: {bad[:4]}"
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(ckpt(out, kind), f"{tmp}/torch.pt")
        ref = dict(flat(torch.load(f"{tmp}/torch.pt", weights_only=False)))
    mine = dict(flat(torch.load(pt, weights_only=False)))
    assert sorted(mine) == sorted(ref), f"{pt}: paths {sorted(set(mine) ^ set(ref))[:4]} differ from torch's"
    kept = 0
    for k, v in mine.items():
        r = ref[k]
        if isinstance(r, torch.Tensor):
            assert isinstance(v, torch.Tensor) and raw(v) == raw(r) and v.dtype == r.dtype, f"{pt}: {k} differs"
        elif isinstance(v, bytes) and not isinstance(r, bytes):
            assert v == sd[k].getvalue(), f"{pt}: {k}: not the stored torch.save bytes"
            kept += 1
        else:
            assert type(v) is type(r) and v == r, f"{pt}: {k}: {v!r} != torch's {r!r}"
    print(f"{kind}: {len(want)} tensors of the safetensors file, {len(mine)} values of the nested .pt "
          f"({kept} kept as stored bytes) equal torch's")


def pyload(out, kind):
    """dcpfs.torch.load and dcp.load with dcpfs.torch.Reader: torch's bytes, every key."""
    import io
    import torch.distributed.checkpoint as dcp
    import dcpfs.torch
    sd = load_all(ckpt(out, kind))
    for how in ("dcpfs.torch.load", "dcp.load with dcpfs.torch.Reader"):
        got = {k: torch.full(v.shape, 7, dtype=v.dtype) if isinstance(v, torch.Tensor) else io.BytesIO()
               for k, v in sd.items()}
        if how == "dcpfs.torch.load":
            got = {k: v for k, v in got.items() if isinstance(v, torch.Tensor)}
            dcpfs.torch.load(got, ckpt(out, kind), catalog=False)
        else:
            dcp.load(got, storage_reader=dcpfs.torch.Reader(ckpt(out, kind), catalog=False), no_dist=True)
        # dcp.load unpickles a bytes item: the stored bytes' value (numpy's in its repr)
        bad = [k for k in got if (raw(got[k]) != raw(sd[k]) if isinstance(got[k], torch.Tensor) else
                                  repr(got[k]) != repr(torch.load(io.BytesIO(raw(sd[k])), weights_only=False)))]
        assert not bad, f"{kind}: {how} gives other bytes than dcp.load: {bad[:4]}"
        print(f"{kind}: {how}: {len(got)} keys, dcp.load's bytes")


def grouped(out):
    """The MoE checkpoint as TEGroupedMLP names its experts in an fsdp_dtensor save
    (mlp.experts.linear_fc1.weightE_w / _v, linear_fc2.weightE: TransformerEngine's grouped
    linears, which need CUDA to build): OUT/mixtral-grouped, the model keys of the
    SequentialMLP save renamed, saved by dcp.save on one process."""
    import re
    import torch.distributed.checkpoint as dcp
    sd = {}
    for k, v in load_all(ckpt(out, "mixtral")).items():
        if k.startswith("model.") and isinstance(v, torch.Tensor):
            k = re.sub(r"experts\.local_experts\.(\d+)\.(linear_fc\d)\.weight", r"experts.\2.weight\1", k)
            sd[k] = v
    dcp.save(sd, checkpoint_id=f"{out}/mixtral-grouped", no_dist=True)
    print(f"mixtral-grouped: {sum('.weight' in k and 'experts.linear_fc' in k for k in sd)} TEGroupedMLP keys")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "truth":
        truth(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "files":
        files(*sys.argv[2:6])
    elif sys.argv[1] == "pyload":   # one process for every kind: torch's import is the cost
        for kind in sys.argv[3:]:
            pyload(sys.argv[2], kind)
    elif sys.argv[1] == "grouped":
        grouped(sys.argv[2])
