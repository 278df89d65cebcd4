"""dcp convert --to hf, end to end with transformers (tests/export-hf.sh).

make OUT: builds tiny Llama and Qwen2 models in transformers (fixed seed, every
weight random, norms included), saves each as a Hugging Face folder (the
reference) and writes the training layouts the recipes read, with
torch.distributed.checkpoint:

  OUT/tt     torchtitan key names up to 0.2 (tok_embeddings, layers.N.attention.wq, output),
             on 2 gloo ranks, 2-d tensors DTensor-sharded by rows
  OUT/tt3    torchtitan 0.3 key names (attention.qkv_linear.wq, lm_head), one process
  OUT/mc     Megatron-Core GPT, layer-stacked keys (decoder.layers.X, [layers, ...]), on 2
             gloo ranks sharded along the rows of each layer, with a TE _extra_state bytes item,
             and Megatron-LM's common.pt (its arguments: config.json is written from them)
  OUT/qwen   Megatron-Core GPT, per-layer keys (decoder.layers.N.X), Qwen2 with q/k/v biases; its
             common.pt says LayerNorm (so only --config can say what it is)
  OUT/neox   Megatron-Core GPT with LayerNorm, GeLU, biases, partial rotary (GPT-NeoX / Pythia),
             layer-stacked, on 2 gloo ranks
  OUT/gpt2   Megatron-Core GPT with learned absolute positions, LayerNorm, GeLU, biases (GPT-2),
             layer-stacked on 2 gloo ranks with common.pt; OUT/gpt2-layers: per-layer keys, one process;
             OUT/gpt2-tied: tied embeddings (no output_layer; reference ref-gpt2-tied)
  OUT/qwen3moe torchtitan 0.3 Qwen3 MoE: grouped experts [experts, ffn, dim], 2 gloo ranks
  OUT/mixtral Megatron-Core MoE (SequentialMLP: local_experts.E), per-layer keys, Mixtral
  OUT/unk    a torchtitan checkpoint with one key no rule maps

The torchtitan layouts come from the Hugging Face weights by torchtitan's own
mapping: Llama3StateDictAdapter.from_hf (torchtitan 0.3.0,
torchtitan/models/llama3/state_dict_adapter.py) renames the keys and applies
_reverse_permute to q_proj and k_proj: w.view(n_heads, 2, hd // 2, dim)
.transpose(1, 2).reshape(n_heads * hd, dim). (torchtitan itself is not used here;
tests/export-torchtitan.sh and tests/export-megatron.sh use the frameworks' own code.) The
Megatron layout is Megatron-Core's: linear_qkv rows are [groups, heads/groups
q heads + 1 k head + 1 v head, head_dim], linear_fc1 = cat(gate, up),
input_layernorm fused into linear_qkv.layer_norm_weight and pre_mlp_layernorm
into mlp.linear_fc1.layer_norm_weight.

check REF DST DTYPE [...]: loads both with AutoModelForCausalLM.from_pretrained and
compares the logits of a fixed prompt (float32: relative error <= 1e-5; bfloat16:
the exported weights are bit for bit the reference's cast with torch's .to(),
and the logits equal)."""
import io
import os
import socket
import sys

import torch

H, NH, NKV, L, V, FF = 64, 4, 2, 2, 128, 96
HD = H // NH
GPT2_POSITIONS = 32


def build(kind):
    import transformers
    torch.manual_seed({"llama": 1234, "qwen2": 4321, "mixtral": 777, "neox": 99, "qwen3moe": 5, "gpt2": 2}[kind])
    common = dict(hidden_size=H, num_attention_heads=NH, num_key_value_heads=NKV, num_hidden_layers=L,
                  vocab_size=V, intermediate_size=FF, tie_word_embeddings=False, rms_norm_eps=1e-5)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common)
        m = transformers.LlamaForCausalLM(cfg)
    elif kind == "neox":   # Megatron GPT's shape: sequential residual, LayerNorm, GeLU, biases, partial rotary
        cfg = transformers.GPTNeoXConfig(hidden_size=H, num_attention_heads=NH, num_hidden_layers=L, vocab_size=V,
                                         intermediate_size=4 * H, use_parallel_residual=False, rotary_pct=0.5,
                                         tie_word_embeddings=False, layer_norm_eps=1e-5)
        m = transformers.GPTNeoXForCausalLM(cfg)
    elif kind == "gpt2":   # Megatron GPT with learned absolute positions, LayerNorm, GeLU (erf), biases
        cfg = transformers.GPT2Config(n_embd=H, n_head=NH, n_layer=L, vocab_size=V, n_positions=GPT2_POSITIONS,
                                      activation_function="gelu", layer_norm_epsilon=1e-5, tie_word_embeddings=False)
        m = transformers.GPT2LMHeadModel(cfg)
    elif kind == "qwen3moe":
        cfg = transformers.Qwen3MoeConfig(**common, head_dim=HD, moe_intermediate_size=32, num_experts=4,
                                          num_experts_per_tok=2)
        m = transformers.Qwen3MoeForCausalLM(cfg)
    elif kind == "mixtral":
        cfg = transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
        m = transformers.MixtralForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**common)
        m = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for n, p in m.named_parameters():
            norm = "norm" in n or ".ln_" in n
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if norm else 0.05 * torch.randn_like(p))
    return m.eval()


def reverse_permute(w, heads):   # torchtitan's _reverse_permute (HF -> interleaved)
    rows, dim = w.shape
    return w.view(heads, 2, rows // heads // 2, dim).transpose(1, 2).reshape(rows, dim).contiguous()


def torchtitan_sd(hf, new_names=False):
    att = "attention.qkv_linear." if new_names else "attention."
    out = {"tok_embeddings.weight": hf["model.embed_tokens.weight"], "norm.weight": hf["model.norm.weight"],
           ("lm_head.weight" if new_names else "output.weight"): hf["lm_head.weight"]}
    for i in range(L):
        p = f"model.layers.{i}."
        out[f"layers.{i}.{att}wq.weight"] = reverse_permute(hf[p + "self_attn.q_proj.weight"], NH)
        out[f"layers.{i}.{att}wk.weight"] = reverse_permute(hf[p + "self_attn.k_proj.weight"], NKV)
        out[f"layers.{i}.{att}wv.weight"] = hf[p + "self_attn.v_proj.weight"]
        out[f"layers.{i}.attention.wo.weight"] = hf[p + "self_attn.o_proj.weight"]
        out[f"layers.{i}.feed_forward.w1.weight"] = hf[p + "mlp.gate_proj.weight"]
        out[f"layers.{i}.feed_forward.w2.weight"] = hf[p + "mlp.down_proj.weight"]
        out[f"layers.{i}.feed_forward.w3.weight"] = hf[p + "mlp.up_proj.weight"]
        out[f"layers.{i}.attention_norm.weight"] = hf[p + "input_layernorm.weight"]
        out[f"layers.{i}.ffn_norm.weight"] = hf[p + "post_attention_layernorm.weight"]
    return out


def fuse_qkv(q, k, v):   # Megatron-Core's grouped layout, weights [rows, H] or biases [rows]
    g = NKV
    tail = q.shape[1:]
    return torch.cat([q.reshape(g, NH // g * HD, *tail), k.reshape(g, HD, *tail), v.reshape(g, HD, *tail)],
                     dim=1).reshape(-1, *tail).contiguous()


def megatron_layer(hf, i, bias):
    p = f"model.layers.{i}."
    a = p + "self_attn."
    d = {"self_attention.linear_qkv.weight": fuse_qkv(hf[a + "q_proj.weight"], hf[a + "k_proj.weight"],
                                                      hf[a + "v_proj.weight"]),
         "self_attention.linear_qkv.layer_norm_weight": hf[p + "input_layernorm.weight"],
         "self_attention.linear_proj.weight": hf[a + "o_proj.weight"],
         "mlp.linear_fc1.weight": torch.cat([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]]),
         "mlp.linear_fc1.layer_norm_weight": hf[p + "post_attention_layernorm.weight"],
         "mlp.linear_fc2.weight": hf[p + "mlp.down_proj.weight"]}
    if bias:
        d["self_attention.linear_qkv.bias"] = fuse_qkv(hf[a + "q_proj.bias"], hf[a + "k_proj.bias"],
                                                       hf[a + "v_proj.bias"])
    return d


def mixtral_megatron_sd(hf):
    """Megatron-Core MoE (SequentialMLP, one key per expert), per-layer keys, from transformers 5's
    Mixtral: mlp.experts.gate_up_proj[e] is [gate; up] (forward: chunk(2) of its output), which is
    linear_fc1 of expert e as is; down_proj[e] is linear_fc2; mlp.gate is the router."""
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": hf["model.norm.weight"], "output_layer.weight": hf["lm_head.weight"]}
    for i in range(L):
        p, d = f"model.layers.{i}.", f"decoder.layers.{i}."
        a = p + "self_attn."
        out[d + "self_attention.linear_qkv.weight"] = fuse_qkv(hf[a + "q_proj.weight"], hf[a + "k_proj.weight"],
                                                               hf[a + "v_proj.weight"])
        out[d + "self_attention.linear_qkv.layer_norm_weight"] = hf[p + "input_layernorm.weight"]
        out[d + "self_attention.linear_proj.weight"] = hf[a + "o_proj.weight"]
        out[d + "pre_mlp_layernorm.weight"] = hf[p + "post_attention_layernorm.weight"]
        out[d + "mlp.router.weight"] = hf[p + "mlp.gate.weight"]
        gu, dn = hf[p + "mlp.experts.gate_up_proj"], hf[p + "mlp.experts.down_proj"]
        for e in range(gu.shape[0]):
            out[d + f"mlp.experts.local_experts.{e}.linear_fc1.weight"] = gu[e].contiguous()
            out[d + f"mlp.experts.local_experts.{e}.linear_fc2.weight"] = dn[e].contiguous()
    return out


def qwen3moe_torchtitan_sd(hf):
    """torchtitan 0.3's Qwen3 MoE (Qwen3StateDictAdapter's names): grouped experts w1_EFD / w3_EFD =
    transformers 5's gate_up_proj split in halves (forward: gate, up = chunk(2)), w2_EDF = down_proj."""
    out = {"tok_embeddings.weight": hf["model.embed_tokens.weight"], "norm.weight": hf["model.norm.weight"],
           "lm_head.weight": hf["lm_head.weight"]}
    for i in range(L):
        p, t = f"model.layers.{i}.", f"layers.{i}."
        for a, b in (("q_proj", "qkv_linear.wq"), ("k_proj", "qkv_linear.wk"), ("v_proj", "qkv_linear.wv"),
                     ("o_proj", "wo"), ("q_norm", "q_norm"), ("k_norm", "k_norm")):
            out[f"{t}attention.{b}.weight"] = hf[f"{p}self_attn.{a}.weight"]
        gu = hf[p + "mlp.experts.gate_up_proj"]
        f = gu.shape[1] // 2
        out[t + "moe.routed_experts.inner_experts.w1_EFD"] = gu[:, :f].contiguous()
        out[t + "moe.routed_experts.inner_experts.w3_EFD"] = gu[:, f:].contiguous()
        out[t + "moe.routed_experts.inner_experts.w2_EDF"] = hf[p + "mlp.experts.down_proj"]
        out[t + "moe.router.gate.weight"] = hf[p + "mlp.gate.weight"]
        out[t + "attention_norm.weight"] = hf[p + "input_layernorm.weight"]
        out[t + "ffn_norm.weight"] = hf[p + "post_attention_layernorm.weight"]
    return out


def neox_megatron_sd(hf):
    """Megatron-Core GPT with LayerNorm and biases, layer-stacked, from GPTNeoX: its query_key_value
    rows are [heads, (q, k, v), head_dim], Megatron's linear_qkv with one group per head."""
    g = "gpt_neox."
    out = {"embedding.word_embeddings.weight": hf[g + "embed_in.weight"], "output_layer.weight": hf["lm_head.weight"]}
    names = {"self_attention.linear_qkv.{}": "attention.query_key_value.{}",
             "self_attention.linear_qkv.layer_norm_{}": "input_layernorm.{}",
             "self_attention.linear_proj.{}": "attention.dense.{}",
             "mlp.linear_fc1.layer_norm_{}": "post_attention_layernorm.{}",
             "mlp.linear_fc1.{}": "mlp.dense_h_to_4h.{}", "mlp.linear_fc2.{}": "mlp.dense_4h_to_h.{}"}
    for w in ("weight", "bias"):
        out["decoder.final_layernorm." + w] = hf[g + "final_layer_norm." + w]
        for m, n in names.items():
            out["decoder.layers." + m.format(w)] = torch.stack([hf[f"{g}layers.{i}.{n.format(w)}"] for i in range(L)])
    return out


def gpt2_megatron_sd(hf, stacked):
    """Megatron-Core GPT with learned absolute positions from GPT2LMHeadModel: GPT-2's Conv1D weights
    are [in, out], Megatron's linears [out, in]; c_attn's columns are q | k | v, linear_qkv's rows
    [heads, (q, k, v), head_dim]. Layer-stacked keys fuse the layer norms into the linears
    (linear_qkv.layer_norm_weight), per-layer keys keep them apart (input_layernorm)."""
    t = "transformer."
    out = {"embedding.word_embeddings.weight": hf[t + "wte.weight"],
           "embedding.position_embeddings.weight": hf[t + "wpe.weight"],
           "decoder.final_layernorm.weight": hf[t + "ln_f.weight"], "decoder.final_layernorm.bias": hf[t + "ln_f.bias"],
           "output_layer.weight": hf["lm_head.weight"]}
    ln1 = "self_attention.linear_qkv.layer_norm_" if stacked else "input_layernorm."
    ln2 = "mlp.linear_fc1.layer_norm_" if stacked else "pre_mlp_layernorm."
    layers = []
    for i in range(L):
        p = f"{t}h.{i}."
        qkv_w = hf[p + "attn.c_attn.weight"].t().reshape(3, NH, HD, H).transpose(0, 1).reshape(3 * H, H)
        qkv_b = hf[p + "attn.c_attn.bias"].reshape(3, NH, HD).transpose(0, 1).reshape(3 * H)
        ly = {"self_attention.linear_qkv.weight": qkv_w.contiguous(), "self_attention.linear_qkv.bias": qkv_b.contiguous(),
              "self_attention.linear_proj.weight": hf[p + "attn.c_proj.weight"].t().contiguous(),
              "self_attention.linear_proj.bias": hf[p + "attn.c_proj.bias"],
              "mlp.linear_fc1.weight": hf[p + "mlp.c_fc.weight"].t().contiguous(),
              "mlp.linear_fc1.bias": hf[p + "mlp.c_fc.bias"],
              "mlp.linear_fc2.weight": hf[p + "mlp.c_proj.weight"].t().contiguous(),
              "mlp.linear_fc2.bias": hf[p + "mlp.c_proj.bias"]}
        for w in ("weight", "bias"):
            ly[ln1 + w] = hf[p + "ln_1." + w]
            ly[ln2 + w] = hf[p + "ln_2." + w]
        layers.append(ly)
    for k in layers[0]:
        if stacked:
            out["decoder.layers." + k] = torch.stack([ly[k] for ly in layers])
        else:
            for i in range(L):
                out[f"decoder.layers.{i}.{k}"] = layers[i][k]
    return out


def megatron_sd(hf, stacked, bias=False):
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": hf["model.norm.weight"], "output_layer.weight": hf["lm_head.weight"]}
    layers = [megatron_layer(hf, i, bias) for i in range(L)]
    for k in layers[0]:
        if stacked:
            out["decoder.layers." + k] = torch.stack([ly[k] for ly in layers])
        else:
            for i in range(L):
                out[f"decoder.layers.{i}.{k}"] = layers[i][k]
    return out


def shard_dim(mode, v):
    """rows: 2-d tensors by rows; stacked: [layers, rows, ...] by rows of each layer."""
    if mode == "rows":
        return 0 if v.dim() == 2 else None
    return 1 if v.dim() >= 2 else None


def write_common(path, **args):
    """Megatron-LM's common.pt (its training arguments, an argparse.Namespace) and metadata.json."""
    import argparse
    import json
    torch.save({"args": argparse.Namespace(**args), "checkpoint_version": 3.0, "iteration": 10}, f"{path}/common.pt")
    with open(f"{path}/metadata.json", "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
                   "common_backend_version": 1}, f)


MEGATRON_ARGS = dict(num_layers=L, hidden_size=H, ffn_hidden_size=FF, num_attention_heads=NH,
                     group_query_attention=True, num_query_groups=NKV, kv_channels=HD, norm_epsilon=1e-5,
                     rotary_base=10000, max_position_embeddings=2048, seq_length=64, normalization="RMSNorm",
                     swiglu=True, position_embedding_type="rope", use_rope_scaling=False, rotary_interleaved=False,
                     untie_embeddings_and_output_weights=True, padded_vocab_size=V)


GPT2_ARGS = dict(MEGATRON_ARGS, ffn_hidden_size=4 * H, group_query_attention=False, num_query_groups=NH,
                 normalization="LayerNorm", swiglu=False, position_embedding_type="learned_absolute",
                 add_bias_linear=True, max_position_embeddings=GPT2_POSITIONS, seq_length=GPT2_POSITIONS)


def save_worker(rank, world, port, sd, path, mode):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DeviceMesh, Shard, Replicate, distribute_tensor
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = DeviceMesh("cpu", list(range(world)))
    out = {}
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            d = shard_dim(mode, v)
            out[k] = distribute_tensor(v, mesh, [Shard(d)] if d is not None else [Replicate()], src_data_rank=None)
        else:
            out[k] = v
    dcp.save(out, checkpoint_id=path)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def save(sd, path, world, mode=None):
    import torch.distributed.checkpoint as dcp
    if world == 1:
        dcp.save(sd, checkpoint_id=path, no_dist=True)
        return
    import torch.multiprocessing as mp
    mp.spawn(save_worker, args=(world, free_port(), sd, path, mode), nprocs=world, join=True)


def make_gpt2(out, world):
    """The GPT-2 model (ref-gpt2, gpt2-config.json) as a layer-stacked Megatron-Core checkpoint with
    common.pt (gpt2) on world gloo ranks; its state dict is returned."""
    gpt2 = build("gpt2")
    gpt2.save_pretrained(f"{out}/ref-gpt2")
    gpt2.config.to_json_file(f"{out}/gpt2-config.json")
    hg = {k: v.detach().clone() for k, v in gpt2.state_dict().items()}
    save(gpt2_megatron_sd(hg, stacked=True), f"{out}/gpt2", world, "stacked")
    write_common(f"{out}/gpt2", **GPT2_ARGS)
    return hg


def make_llama(out):
    """The Llama model only (ref-llama, llama-config.json), as torchtitan (tt) and stacked Megatron-Core
    (mc, with common.pt) checkpoints, and the GPT-2 model as a stacked Megatron-Core one in one process
    (gpt2, with common.pt): for tests that need few models (tests/fuse-hfview.sh)."""
    os.makedirs(out, exist_ok=True)
    llama = build("llama")
    llama.save_pretrained(f"{out}/ref-llama")
    llama.config.to_json_file(f"{out}/llama-config.json")
    hf = {k: v.detach().clone() for k, v in llama.state_dict().items()}
    save(torchtitan_sd(hf), f"{out}/tt", 2, "rows")
    save(megatron_sd(hf, stacked=True), f"{out}/mc", 2, "stacked")
    write_common(f"{out}/mc", **MEGATRON_ARGS)
    make_gpt2(out, 1)


def make(out):
    os.makedirs(out, exist_ok=True)
    llama = build("llama")
    llama.save_pretrained(f"{out}/ref-llama")
    llama.config.to_json_file(f"{out}/llama-config.json")
    hf = {k: v.detach().clone() for k, v in llama.state_dict().items()}
    save(torchtitan_sd(hf), f"{out}/tt", 2, "rows")
    save(torchtitan_sd(hf, new_names=True), f"{out}/tt3", 1)
    mc = megatron_sd(hf, stacked=True)
    mc["decoder.layers.self_attention.linear_qkv._extra_state"] = io.BytesIO(b"transformer engine state")
    save(mc, f"{out}/mc", 2, "stacked")
    write_common(f"{out}/mc", **MEGATRON_ARGS)
    unk = torchtitan_sd(hf)
    unk["layers.0.attention.mystery.weight"] = torch.zeros(2, 2)
    save(unk, f"{out}/unk", 1)
    qwen = build("qwen2")
    qwen.save_pretrained(f"{out}/ref-qwen")
    qwen.config.to_json_file(f"{out}/qwen-config.json")
    hq = {k: v.detach().clone() for k, v in qwen.state_dict().items()}
    save(megatron_sd(hq, stacked=False, bias=True), f"{out}/qwen", 1)
    write_common(f"{out}/qwen", **dict(MEGATRON_ARGS, normalization="LayerNorm", add_qkv_bias=True))
    neox = build("neox")
    neox.save_pretrained(f"{out}/ref-neox")
    neox.config.to_json_file(f"{out}/neox-config.json")
    hn = {k: v.detach().clone() for k, v in neox.state_dict().items()}
    save(neox_megatron_sd(hn), f"{out}/neox", 2, "stacked")
    hg = make_gpt2(out, 2)
    save(gpt2_megatron_sd(hg, stacked=False), f"{out}/gpt2-layers", 1)
    # Tied embeddings (Megatron's default): no output_layer, lm_head is wte.
    import transformers
    tied = transformers.GPT2LMHeadModel(transformers.GPT2Config(**dict(build("gpt2").config.to_dict(),
                                                                       tie_word_embeddings=True)))
    tied.load_state_dict({k: v for k, v in hg.items() if k != "lm_head.weight"}, strict=False)
    tied.tie_weights()
    assert torch.equal(tied.lm_head.weight, hg["transformer.wte.weight"])
    tied.eval().save_pretrained(f"{out}/ref-gpt2-tied")
    sd = gpt2_megatron_sd(hg, stacked=True)
    del sd["output_layer.weight"]
    save(sd, f"{out}/gpt2-tied", 1)
    write_common(f"{out}/gpt2-tied", **dict(GPT2_ARGS, untie_embeddings_and_output_weights=False))
    q3 = build("qwen3moe")
    q3.save_pretrained(f"{out}/ref-qwen3moe")
    q3.config.to_json_file(f"{out}/qwen3moe-config.json")
    h3 = {k: v.detach().clone() for k, v in q3.state_dict().items()}
    save(qwen3moe_torchtitan_sd(h3), f"{out}/qwen3moe", 2, "rows")
    mix = build("mixtral")
    mix.save_pretrained(f"{out}/ref-mixtral")
    mix.config.to_json_file(f"{out}/mixtral-config.json")
    hm = {k: v.detach().clone() for k, v in mix.state_dict().items()}
    save(mixtral_megatron_sd(hm), f"{out}/mixtral", 1)


PROMPT = [[1, 7, 42, 99, 3, 127, 64, 5, 18, 77, 2, 0, 33, 101, 8, 55]]


def logits(path, dtype):
    import transformers
    m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    with torch.no_grad():
        return m, m(torch.tensor(PROMPT)).logits.float()


def check(ref, dst, dtype_name):
    dtype = getattr(torch, dtype_name)
    rm, want = logits(ref, torch.float32)
    gm, got = logits(dst, dtype)
    if dtype == torch.float32:
        rel = ((got - want).abs().max() / want.abs().max()).item()
        assert rel <= 1e-5, f"{dst}: logits differ from the reference's: relative error {rel}"
        print(f"ok {dst}: float32 logits, relative error {rel:.3g}")
        return
    rsd, gsd = rm.state_dict(), gm.state_dict()
    assert set(rsd) == set(gsd), sorted(set(rsd) ^ set(gsd))
    for k in rsd:
        a, b = rsd[k].to(dtype), gsd[k]
        assert b.dtype == dtype, f"{k}: {b.dtype}"
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{k}: not the reference cast to {dtype}"
    _, want16 = logits(ref, dtype)   # the reference loaded as dtype: from_pretrained casts with .to()
    assert torch.equal(got, want16), f"{dst}: {dtype_name} logits differ from the reference cast"
    rel = ((got - want).abs().max() / want.abs().max()).item()
    assert rel < 0.1, f"{dst}: {dtype_name} logits far from float32's: {rel}"
    print(f"ok {dst}: {dtype_name} weights bit-exact, logits equal the reference's cast "
          f"(vs float32: relative error {rel:.3g})")


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore")
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "make-llama":
        make_llama(sys.argv[2])
    elif sys.argv[1] == "same":   # same A B DTYPE: from_pretrained of A and of B, the same logits exactly
        dt = getattr(torch, sys.argv[4])
        _, a = logits(sys.argv[2], dt)
        _, b = logits(sys.argv[3], dt)
        assert torch.equal(a, b), f"{sys.argv[2]} and {sys.argv[3]}: logits differ: {(a - b).abs().max().item()}"
        print(f"ok {sys.argv[2]} = {sys.argv[3]}: {sys.argv[4]} logits equal, {tuple(a.shape)}")
    else:   # check REF DST DTYPE [REF DST DTYPE ...]: one process, one import of transformers
        args = sys.argv[2:]
        for i in range(0, len(args), 3):
            check(*args[i:i + 3])
