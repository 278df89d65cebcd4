"""dcp convert --to hf against Megatron-Core's own code (tests/export-megatron.sh).

make OUT: builds tiny GPTModels with Megatron-Core's own classes (megatron.core.models.gpt.GPTModel,
get_gpt_layer_local_spec: the spec without TransformerEngine) on one gloo rank, tensor parallel 1,
initialised by Megatron (use_cpu_initialization; norms then perturbed so a swapped norm shows):

  llama  RMSNorm, SwiGLU (gated_linear_unit), GQA (4 heads, 2 query groups), rope, no biases
  neox   LayerNorm, GeLU, biases, multi-head attention, rope on half of each head (rotary_percent 0.5)
  gpt2   LayerNorm, GeLU, biases, multi-head attention, learned absolute position embeddings (GPT-2)
  llama-tp2  the llama one again (same weights), tensor parallel 2 on 2 gloo ranks
  llama-singleton  the llama one saved with singleton_local_shards (a content metadata flag
             of Megatron-LM's): per-layer keys, SwiGLU's fc1 as weight_w (gate) and weight_v (up)
  mixtral    the llama one with a mixture of experts in each layer (4 SequentialMLP experts, top 2,
             the local spec's MoE layer), plus one state of a second optimizer's as a
             ChainedOptimizer names it (chained_1.optimizer.state...): dist_checkpointing stores
             the experts as one key stacked over layers and experts
             (decoder.layers.mlp.experts.experts.linear_fc1.weight [layers, experts, 2 ffn, hidden])
             and the pre-MLP norm as mlp.linear_fc1.layer_norm_weight. Its forward does not run
             without TransformerEngine (the router's gemm), so the export is checked against the
             model's own parameters (OUT/mixtral-params.pt), not logits;
  mixtral-singleton  the same model saved with singleton_local_shards (per-layer, per-expert
             keys decoder.layers.N.mlp.experts.experts.E.linear_fc1.weight_w / _v)

and for each writes OUT/KIND, its sharded_state_dict() saved by
megatron.core.dist_checkpointing.save (the torch_dist backend: layer-stacked keys, TE-style
fused norm names, _extra_state/shard_I_N items), OUT/KIND-logits.pt (Megatron's forward of PROMPT)
and OUT/KIND-config.json (the transformers config of the same model).

check OUT DST KIND [...]: loads OUT/DST with AutoModelForCausalLM.from_pretrained and compares its
float32 logits with Megatron's forward (relative error <= 1e-5).

Megatron-Core 0.16.1 on a CPU-only torch: the model builds and saves, but three places ask CUDA
unconditionally, so: the causal mask is passed to forward (get_default_causal_mask makes it on
device "cuda"); the RNG tracker is Megatron's inference one (the training one reads CUDA RNG
states); torch.cuda.current_device (RotaryEmbedding.get_emb moves inv_freq there) and
torch.cuda.synchronize (FileSystemWriterAsync.preload_tensors) are pointed at the CPU. Nothing of
Megatron itself is replaced. dist_checkpointing's writer needs psutil."""
import os
import sys

import torch

H, NH, L, V, FF, S = 64, 4, 2, 128, 96, 16
PROMPT = [[1, 7, 42, 99, 3, 127, 64, 5, 18, 77, 2, 0, 33, 101, 8, 55]]
KINDS = ("llama", "neox", "gpt2")
GPT2_POSITIONS = 32


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def init_megatron(rank=0, world=1, port=None, tp=1):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port or free_port()}", rank=rank,
                            world_size=world)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    parallel_state.initialize_model_parallel(tp, 1)
    model_parallel_cuda_manual_seed(1234, inference_rng_tracker=True)
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None


def build(kind):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    common = dict(num_layers=L, hidden_size=H, num_attention_heads=NH, use_cpu_initialization=True,
                  params_dtype=torch.float32, layernorm_epsilon=1e-5, bias_dropout_fusion=False,
                  apply_rope_fusion=False, hidden_dropout=0.0, attention_dropout=0.0, masked_softmax_fusion=False,
                  gradient_accumulation_fusion=False, persist_layer_norm=False)
    if kind == "llama":
        cfg = TransformerConfig(**common, num_query_groups=2, ffn_hidden_size=FF, normalization="RMSNorm",
                                gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                                add_bias_linear=False)
        rotary_percent = 1.0
    elif kind == "gpt2":
        cfg = TransformerConfig(**common, ffn_hidden_size=4 * H, normalization="LayerNorm",
                                activation_func=torch.nn.functional.gelu, add_bias_linear=True, add_qkv_bias=True)
    else:
        cfg = TransformerConfig(**common, ffn_hidden_size=4 * H, normalization="LayerNorm",
                                activation_func=torch.nn.functional.gelu, add_bias_linear=True, add_qkv_bias=True)
        rotary_percent = 0.5
    torch.manual_seed({"llama": 11, "neox": 12, "gpt2": 13}[kind])
    spec = get_gpt_layer_local_spec(normalization=cfg.normalization)
    if kind == "gpt2":
        m = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=V, max_sequence_length=GPT2_POSITIONS,
                     position_embedding_type="learned_absolute", share_embeddings_and_output_weights=False)
    else:
        m = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=V, max_sequence_length=256,
                     position_embedding_type="rope", rotary_percent=rotary_percent, rotary_base=10000,
                     share_embeddings_and_output_weights=False)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n and n.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif n.endswith("bias"):   # Megatron initialises biases to zero
                p.copy_(0.05 * torch.randn_like(p))
    return m.eval()


def build_moe():
    """The llama model's shape with a mixture of experts in each layer (the allgather dispatcher:
    alltoall asks for a CUDA stream)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    cfg = TransformerConfig(num_layers=L, hidden_size=H, num_attention_heads=NH, use_cpu_initialization=True,
                            params_dtype=torch.float32, layernorm_epsilon=1e-5, bias_dropout_fusion=False,
                            apply_rope_fusion=False, hidden_dropout=0.0, attention_dropout=0.0,
                            masked_softmax_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
                            num_query_groups=2, ffn_hidden_size=FF, normalization="RMSNorm", gated_linear_unit=True,
                            activation_func=torch.nn.functional.silu, add_bias_linear=False, num_moe_experts=4,
                            moe_router_topk=2, moe_ffn_hidden_size=FF // 2, moe_token_dispatcher_type="allgather")
    torch.manual_seed(14)
    spec = get_gpt_layer_local_spec(num_experts=4, moe_grouped_gemm=False, normalization="RMSNorm")
    m = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=V, max_sequence_length=256,
                 position_embedding_type="rope", rotary_base=10000, share_embeddings_and_output_weights=False)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n and n.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return m


def moe_check(out, dst):
    """The Mixtral export DST against the MoE model's own parameters (by their module names)."""
    from safetensors.torch import load_file
    got = {}
    for f in sorted(os.listdir(os.path.join(out, dst))):
        if f.endswith(".safetensors"):
            got.update(load_file(os.path.join(out, dst, f)))
    want = {}
    for n, t in torch.load(f"{out}/mixtral-params.pt").items():
        n = n.replace("decoder.layers.", "model.layers.")
        if ".mlp.experts.local_experts." in n:
            n = n.replace(".mlp.experts.local_experts.", ".block_sparse_moe.experts.")
            if n.endswith("linear_fc1.weight"):   # SwiGLU: cat(gate, up)
                want[n.replace("linear_fc1", "w1")], want[n.replace("linear_fc1", "w3")] = t.chunk(2)
            else:
                want[n.replace("linear_fc2", "w2")] = t
        elif n.endswith("mlp.router.weight"):
            want[n.replace("mlp.router", "block_sparse_moe.gate")] = t
        elif n.endswith("pre_mlp_layernorm.weight"):
            want[n.replace("pre_mlp_layernorm", "post_attention_layernorm")] = t
    bad = [k for k, t in want.items() if k not in got or not torch.equal(got[k], t)]
    assert not bad, f"{dst}: these differ from (or lack) the MoE model's parameters: {bad[:4]}"
    print(f"ok {dst}: {len(want)} MoE tensors (experts, router, pre-MLP norm) equal the model's own")


def hf_config(kind):
    import transformers
    if kind == "llama":
        return transformers.LlamaConfig(hidden_size=H, num_attention_heads=NH, num_key_value_heads=2,
                                        num_hidden_layers=L, vocab_size=V, intermediate_size=FF, rms_norm_eps=1e-5,
                                        tie_word_embeddings=False,
                                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if kind == "gpt2":
        return transformers.GPT2Config(n_embd=H, n_head=NH, n_layer=L, vocab_size=V, n_positions=GPT2_POSITIONS,
                                       n_inner=4 * H, activation_function="gelu", layer_norm_epsilon=1e-5,
                                       bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
    return transformers.GPTNeoXConfig(hidden_size=H, num_attention_heads=NH, num_hidden_layers=L, vocab_size=V,
                                      intermediate_size=4 * H, use_parallel_residual=False, rotary_pct=0.5,
                                      hidden_act="gelu", tie_word_embeddings=False, layer_norm_eps=1e-5)


def megatron_logits(m):
    tok = torch.tensor(PROMPT)
    pos = torch.arange(tok.shape[1]).unsqueeze(0)
    mask = torch.triu(torch.ones(tok.shape[1], tok.shape[1]), diagonal=1).bool()[None, None]   # True: masked
    with torch.no_grad():
        return m(tok, pos, attention_mask=mask).float()


def tp2_worker(rank, port, out):
    """The Llama-shaped model again, tensor parallel 2 on 2 gloo ranks: linear_qkv split by query
    groups and linear_fc1's gate and up halves each split across the ranks, which
    dist_checkpointing saves as one global tensor each."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    init_megatron(rank, 2, port, tp=2)
    m = build("llama")
    part = megatron_logits(m).contiguous()   # the output layer is split by vocabulary
    parts = [torch.empty_like(part) for _ in range(2)]
    dist.all_gather(parts, part)
    if rank == 0:
        torch.save(torch.cat(parts, dim=-1), f"{out}/llama-tp2-logits.pt")
        os.makedirs(f"{out}/llama-tp2")
    dist.barrier()
    dist_checkpointing.save(m.sharded_state_dict(), f"{out}/llama-tp2")
    dist.barrier()
    dist.destroy_process_group()


def make(out):
    import torch.multiprocessing as mp
    from megatron.core import dist_checkpointing
    init_megatron()
    os.makedirs(out, exist_ok=True)
    for kind in KINDS:
        m = build(kind)
        torch.save(megatron_logits(m), f"{out}/{kind}-logits.pt")
        hf_config(kind).to_json_file(f"{out}/{kind}-config.json")
        os.makedirs(f"{out}/{kind}")
        dist_checkpointing.save(m.sharded_state_dict(), f"{out}/{kind}")
        print(f"{kind}: {len(m.state_dict())} state dict keys saved by dist_checkpointing")
        if kind == "llama":   # Megatron-LM's singleton_local_shards: per-layer keys, fc1 as _w and _v
            os.makedirs(f"{out}/llama-singleton")
            dist_checkpointing.save(m.sharded_state_dict(metadata={"singleton_local_shards": True}),
                                    f"{out}/llama-singleton")
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    m = build_moe()
    torch.save({n: p.detach().clone() for n, p in m.named_parameters()}, f"{out}/mixtral-params.pt")
    sd = m.sharded_state_dict()
    key = "chained_1.optimizer.state.exp_avg.decoder.final_layernorm.weight"   # a second optimizer's
    sd[key] = ShardedTensor.from_rank_offsets(key, torch.zeros(H))
    os.makedirs(f"{out}/mixtral")
    dist_checkpointing.save(sd, f"{out}/mixtral")
    os.makedirs(f"{out}/mixtral-singleton")   # per-layer, per-expert keys, fc1 as _w and _v
    dist_checkpointing.save(m.sharded_state_dict(metadata={"singleton_local_shards": True}),
                            f"{out}/mixtral-singleton")
    import transformers
    transformers.MixtralConfig(hidden_size=H, num_attention_heads=NH, num_key_value_heads=2, num_hidden_layers=L,
                               vocab_size=V, intermediate_size=FF // 2, num_local_experts=4, num_experts_per_tok=2,
                               rms_norm_eps=1e-5, tie_word_embeddings=False).to_json_file(f"{out}/mixtral-config.json")
    print(f"mixtral: {len(sd)} sharded keys saved by dist_checkpointing")
    mp.spawn(tp2_worker, args=(free_port(), out), nprocs=2, join=True)
    print("llama-tp2: saved by dist_checkpointing from 2 tensor-parallel ranks")


def check(out, dst, kind):
    import transformers
    dst = os.path.join(out, dst)
    want = torch.load(f"{out}/{kind}-logits.pt")
    m = transformers.AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
    with torch.no_grad():
        got = m(torch.tensor(PROMPT)).logits.float()
    rel = ((got - want).abs().max() / want.abs().max()).item()
    assert rel <= 1e-5, f"{dst}: logits differ from Megatron-Core's forward: relative error {rel}"
    print(f"ok {dst}: {type(m).__name__} logits vs Megatron-Core GPTModel's forward: relative error {rel:.3g}")


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore")
    if sys.argv[1] == "probe":
        try:
            import megatron.core.models.gpt  # noqa: F401
            import psutil  # noqa: F401
        except ImportError as e:
            print(f"megatron-core does not import: {e}")
            sys.exit(77)
    elif sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "moe":   # moe OUT DST
        moe_check(*sys.argv[2:4])
    else:   # check OUT DST KIND [DST KIND ...]
        out, args = sys.argv[2], sys.argv[3:]
        for i in range(0, len(args), 2):
            check(out, *args[i:i + 2])
