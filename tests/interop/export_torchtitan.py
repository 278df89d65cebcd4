"""dcp convert --to hf against torchtitan's own code (tests/export-torchtitan.sh).

make OUT: builds tiny models with torchtitan 0.3.0's own classes and configs -- Llama3
(llama3._build_llama3_layers: GQA, fused-QKV module names, ComplexRoPE with Llama 3's rope
scaling), Qwen3 dense and Qwen3 MoE (qwen3._build_qwen3_layers / _build_qwen3_moe_layers:
q/k norms, CosSinRoPE, grouped experts w1_EFD/w2_EDF/w3_EFD, a router, expert_bias_E) --
initialises them with torchtitan's init_states (norms then perturbed so that a swapped norm
shows), and for each writes:

  OUT/KIND            model.state_dict() saved with torch.distributed.checkpoint on 2 gloo
                      ranks, as DTensors sharded by rows (grouped experts by expert, as expert
                      parallelism shards them)
  OUT/KIND-logits.pt  torchtitan's own forward of PROMPT (float32)
  OUT/KIND-adapter.safetensors  torchtitan's own converter applied to the same state dict:
                      Llama3StateDictAdapter.to_hf / Qwen3StateDictAdapter.to_hf
  OUT/KIND-config.json the transformers config of the same model (heads, eps, rope)

check OUT DST KIND DTYPE [...]: loads DST (a folder in OUT) with AutoModelForCausalLM.from_pretrained and
compares its logits of PROMPT with torchtitan's (float32 export: relative error <= 1e-5; the
MoE <= 2e-3, as torchtitan computes its experts in bfloat16),
and compares every exported tensor with the adapter's output byte for byte (same key set,
dtype, shape; for a --dtype export, the adapter's tensor cast with torch's .to()).

torchtitan 0.3.0 imports triton for its expert-parallel GPU kernels
(torchtitan.distributed.minimal_async_ep.kernels) even where they are never called; without
triton (a GPU compiler, not installed for the CPU tests) that one module is stood in for by
one whose functions raise. Nothing else of torchtitan is replaced. FlexAttention runs eagerly
(TORCHDYNAMO_DISABLE=1: torch.compile of it costs a minute of C++ compilation on the CPU)."""
import os
import socket
import sys
import types

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
import torch  # noqa: E402


def _stand_in_for_triton_kernels():
    try:
        import triton  # noqa: F401
        return
    except ImportError:
        pass
    name = "torchtitan.distributed.minimal_async_ep.kernels"

    def attr(a):
        if a.startswith("__"):
            raise AttributeError(a)

        def gpu_only(*args, **kwargs):
            raise RuntimeError(f"{name}.{a}: a triton GPU kernel, not available in this CPU test")
        return gpu_only
    m = types.ModuleType(name)
    m.__getattr__ = attr
    sys.modules[name] = m


_stand_in_for_triton_kernels()

DIM, NH, NKV, HD, NL, V = 64, 4, 2, 16, 2, 128
FF, MOE_FF, EXPERTS, TOPK = 96, 32, 4, 2
KINDS = ("llama", "qwen3", "qwen3moe")
PROMPT = [[1, 7, 42, 99, 3, 127, 64, 5, 18, 77, 2, 0, 33, 101, 8, 55]]
# Llama 3's rope scaling, torchtitan's ComplexRoPE defaults (scaling="llama") and theta.
LLAMA_ROPE = dict(theta=500000.0, scaling_factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=8192)


def titan_config(kind):
    from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, Linear
    if kind == "llama":
        from torchtitan.models import llama3 as L3
        r = LLAMA_ROPE
        rope = ComplexRoPE.Config(dim=HD, max_seq_len=256, theta=r["theta"], scaling="llama",
                                  scaling_factor=r["scaling_factor"], low_freq_factor=r["low_freq_factor"],
                                  high_freq_factor=r["high_freq_factor"],
                                  original_max_position_embeddings=r["original_max_position_embeddings"])
        return L3.Llama3Model.Config(
            dim=DIM, vocab_size=V,
            tok_embeddings=Embedding.Config(num_embeddings=V, embedding_dim=DIM, param_init=L3._EMBEDDING_INIT),
            norm=L3.RMSNorm.Config(normalized_shape=DIM, param_init=L3._NORM_INIT),
            lm_head=Linear.Config(in_features=DIM, out_features=V, param_init=L3._output_linear_init(DIM)),
            layers=L3._build_llama3_layers(n_layers=NL, dim=DIM, n_heads=NH, n_kv_heads=NKV, hidden_dim=FF,
                                           rope=rope, attn_backend="flex"))
    from torchtitan.models import qwen3 as Q
    rope = CosSinRoPE.Config(dim=HD, max_seq_len=256, theta=1000000.0)
    kw = dict(n_layers=NL, dim=DIM, n_heads=NH, n_kv_heads=NKV, head_dim=HD, attn_backend="flex", rope=rope)
    if kind == "qwen3moe":
        layers = Q._build_qwen3_moe_layers(moe_hidden_dim=MOE_FF, num_experts=EXPERTS, top_k=TOPK,
                                           moe_comm_backend="standard", **kw)
    else:
        layers = Q._build_qwen3_layers(hidden_dim=FF, **kw)
    return Q.Qwen3Model.Config(
        vocab_size=V, dim=DIM, norm=Q._qwen3_norm(DIM), enable_weight_tying=False,
        tok_embeddings=Embedding.Config(num_embeddings=V, embedding_dim=DIM, param_init=Q._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=V, param_init=Q._LINEAR_INIT), layers=layers)


def adapter(kind, cfg):
    if kind == "llama":
        from torchtitan.models.llama3 import Llama3StateDictAdapter
        return Llama3StateDictAdapter(cfg, None)
    from torchtitan.models.qwen3 import Qwen3StateDictAdapter
    return Qwen3StateDictAdapter(cfg, None)


def hf_config(kind, cfg):
    """The transformers config of the torchtitan model cfg (eps and rope read from cfg)."""
    import transformers
    eps = cfg.norm.eps
    common = dict(hidden_size=DIM, num_attention_heads=NH, num_key_value_heads=NKV, num_hidden_layers=NL,
                  vocab_size=V, rms_norm_eps=eps, tie_word_embeddings=False)
    if kind == "llama":
        r = LLAMA_ROPE
        rope = {"rope_type": "llama3", "rope_theta": r["theta"], "factor": r["scaling_factor"],
                "low_freq_factor": r["low_freq_factor"], "high_freq_factor": r["high_freq_factor"],
                "original_max_position_embeddings": r["original_max_position_embeddings"]}
        return transformers.LlamaConfig(**common, intermediate_size=FF, rope_parameters=rope,
                                        max_position_embeddings=131072)
    rope = {"rope_type": "default", "rope_theta": 1000000.0}
    common["max_position_embeddings"] = 4096
    if kind == "qwen3moe":
        return transformers.Qwen3MoeConfig(**common, head_dim=HD, intermediate_size=FF, moe_intermediate_size=MOE_FF,
                                           num_experts=EXPERTS, num_experts_per_tok=TOPK, norm_topk_prob=True,
                                           decoder_sparse_step=1, mlp_only_layers=[], rope_parameters=rope)
    return transformers.Qwen3Config(**common, head_dim=HD, intermediate_size=FF, rope_parameters=rope)


def titan_logits(model):
    tok = torch.tensor(PROMPT)
    pos = torch.arange(tok.shape[1]).unsqueeze(0)
    with torch.no_grad():
        return model(tok, pos, model.get_attention_masks(pos)).float()


def save_worker(rank, world, port, sds, out):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DeviceMesh, Replicate, Shard, distribute_tensor
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = DeviceMesh("cpu", list(range(world)))
    # 2-d weights by rows (FSDP's dim 0), grouped experts [E, ...] by expert, 1-d replicated.
    for kind, sd in sds.items():
        dt = {k: distribute_tensor(v, mesh, [Shard(0)] if v.dim() >= 2 else [Replicate()], src_data_rank=None)
              for k, v in sd.items()}
        dcp.save(dt, checkpoint_id=f"{out}/{kind}")
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def make(out):
    import torch.multiprocessing as mp
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    sds = {}
    for i, kind in enumerate(KINDS):
        cfg = titan_config(kind)
        torch.manual_seed(2026 + i)
        model = cfg.build()
        model.init_states()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
        model.eval()
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save(titan_logits(model), f"{out}/{kind}-logits.pt")
        hf = adapter(kind, cfg).to_hf(dict(sd))
        save_file({k: v.contiguous() for k, v in hf.items()}, f"{out}/{kind}-adapter.safetensors")
        hf_config(kind, cfg).to_json_file(f"{out}/{kind}-config.json")
        sds[kind] = sd
        print(f"{kind}: {len(sd)} keys ({', '.join(sorted(set(k.split('.')[-1] for k in sd)))}); "
              f"the adapter writes {len(hf)}")
    mp.spawn(save_worker, args=(2, free_port(), sds, out), nprocs=2, join=True)   # one spawn: imports are slow


def exported(dst):
    from safetensors.torch import load_file
    out = {}
    for f in sorted(os.listdir(dst)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(dst, f)))
    return out


def check(out, dst, kind, dtype_name):
    import transformers
    from safetensors.torch import load_file
    dtype = getattr(torch, dtype_name)
    dst = os.path.join(out, dst)   # DST relative to OUT
    ref = load_file(f"{out}/{kind}-adapter.safetensors")
    got = exported(dst)
    assert set(ref) == set(got), f"{dst}: keys differ from torchtitan's to_hf: only in the export " \
        f"{sorted(set(got) - set(ref))}, only in to_hf's {sorted(set(ref) - set(got))}"
    for k in sorted(ref):
        a = ref[k].to(dtype).contiguous()
        b = got[k]
        assert b.dtype == a.dtype and b.shape == a.shape, f"{dst}: {k}: {b.dtype} {tuple(b.shape)}, " \
            f"torchtitan's to_hf {a.dtype} {tuple(a.shape)}"
        assert torch.equal(a.view(torch.uint8), b.contiguous().view(torch.uint8)), \
            f"{dst}: {k}: bytes differ from torchtitan's to_hf"
    want = torch.load(f"{out}/{kind}-logits.pt")
    m = transformers.AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = m(torch.tensor(PROMPT)).logits.float()
    rel = ((logits - want).abs().max() / want.abs().max()).item()
    # torchtitan 0.3.0's GroupedExperts.forward computes in bfloat16 whatever the model's dtype
    # (x.bfloat16() @ w.bfloat16()), transformers' experts in float32: the MoE's logits agree to
    # bfloat16's precision only (a different routing would be far off). A --dtype export is
    # compared with torchtitan's float32 forward.
    limit = 1e-5 if kind != "qwen3moe" else 2e-3
    if dtype != torch.float32:
        limit = 0.05
    assert rel <= limit, f"{dst}: logits differ from torchtitan's forward: relative error {rel} > {limit}"
    print(f"ok {dst}: {len(ref)} tensors byte for byte torchtitan's to_hf ({dtype_name}); "
          f"{type(m).__name__} logits vs torchtitan's forward: relative error {rel:.3g}")


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore")
    if sys.argv[1] == "probe":   # exit 77 (skip) naming what is missing
        try:
            import torchtitan.models.llama3  # noqa: F401
            import torchtitan.models.qwen3  # noqa: F401
        except ImportError as e:
            print(f"torchtitan 0.3.0 does not import: {e}")
            sys.exit(77)
    elif sys.argv[1] == "make":
        make(sys.argv[2])
    else:   # check OUT DST KIND DTYPE [DST KIND DTYPE ...]
        out, args = sys.argv[2], sys.argv[3:]
        for i in range(0, len(args), 3):
            check(out, *args[i:i + 3])
