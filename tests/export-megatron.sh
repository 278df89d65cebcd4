# dcp convert --to hf against Megatron-Core's own code (issue 15): tiny GPTModels built by
# megatron-core's classes (a Llama-shaped one: RMSNorm, SwiGLU, GQA; a GPT-NeoX-shaped one:
# LayerNorm, GeLU, biases, partial rotary; a GPT-2-shaped one: learned absolute positions),
# their sharded_state_dict() saved by megatron.core.dist_checkpointing.save on the CPU (one
# rank; the Llama-shaped one also from 2 tensor-parallel gloo ranks), exported by the shipped
# recipes (llama-megatron, gpt-neox-megatron, gpt2-megatron, the last also without --config
# from common.pt's arguments); AutoModelForCausalLM.from_pretrained of each export gives
# Megatron's forward's float32 logits (relative error <= 1e-5); a mixture-of-experts one exported by
# mixtral-megatron gives the model's own expert, router and norm parameters; both saved with
# singleton_local_shards too (per-layer keys, SwiGLU's halves as weight_w and weight_v). See tests/interop/export_megatron.py
# for the three CUDA calls Megatron-Core makes on a CPU-only torch and how the test meets them.
. "$top_srcdir/tests/lib.sh"
framework_setup megatron.core megatron-core "pip install --no-deps megatron-core==0.16.1 psutil==7.2.2" export_megatron.py
for x in llama:llama-megatron neox:gpt-neox-megatron gpt2:gpt2-megatron; do
    k=${x%%:*} r=${x#*:}
    out=$($D convert --to hf --recipe "$r" --config "$SCRATCH/$k-config.json" "$SCRATCH/$k" "$SCRATCH/o-$k" 2>&1) ||
        fail "export of $k by $r: $out"
    # dist_checkpointing stores TransformerEngine's _extra_state per layer as KEY/shard_I_N bytes items.
    case "$out" in *"skipped decoder.layers.mlp.linear_fc2._extra_state/shard_1_2: left out by the recipe"*) ;;
        *) fail "$k: _extra_state/shard_1_2 not reported: $out" ;; esac
done
# The same Llama-shaped model saved from 2 tensor-parallel ranks (linear_qkv split by query groups,
# linear_fc1's gate and up halves split): the same export, byte for byte.
$D convert -q --to hf --recipe llama-megatron --config "$SCRATCH/llama-config.json" "$SCRATCH/llama-tp2" \
    "$SCRATCH/o-llama-tp2" || fail "export of llama-tp2"
[ "$($D digest "$SCRATCH/o-llama/model.safetensors")" = "$($D digest "$SCRATCH/o-llama-tp2/model.safetensors")" ] ||
    fail "the tensor-parallel 2 checkpoint's export differs from the tensor-parallel 1 one's"
# GPT-2 without --config: config.json from the shapes and common.pt's arguments, which
# dist_checkpointing does not write: Megatron-LM's would say these.
cat >"$SCRATCH/gpt2-args.py" <<'PY'
import argparse, sys, torch
torch.save({"args": argparse.Namespace(num_attention_heads=4, norm_epsilon=1e-5, normalization="LayerNorm",
                                       swiglu=False, position_embedding_type="learned_absolute",
                                       add_bias_linear=True, group_query_attention=False)},
           sys.argv[1] + "/common.pt")
PY
cp -r "$SCRATCH/gpt2" "$SCRATCH/gpt2-args"
python3 "$SCRATCH/gpt2-args.py" "$SCRATCH/gpt2-args" || fail "writing gpt2-args/common.pt"
$D convert -q --to hf --recipe gpt2-megatron "$SCRATCH/gpt2-args" "$SCRATCH/o-gpt2-args" ||
    fail "export of gpt2 without --config"
# A mixture of experts as dist_checkpointing stores it (the experts one key stacked over layers
# and experts, the local spec's pre-MLP norm as mlp.linear_fc1.layer_norm_weight) beside a second
# optimizer's state (a ChainedOptimizer's chained_1.optimizer.* key): mixtral-megatron exports
# the experts and leaves the optimizer state out (it knew only the module names
# mlp.experts.local_experts.E and refused both).
out=$($D convert --to hf --recipe mixtral-megatron --config "$SCRATCH/mixtral-config.json" "$SCRATCH/mixtral" \
    "$SCRATCH/o-mixtral" 2>&1) || fail "export of mixtral by mixtral-megatron: $out"
case "$out" in *"skipped chained_1.optimizer.state.exp_avg.decoder.final_layernorm.weight: left out by the recipe"*) ;;
    *) fail "mixtral: the chained optimizer's state not reported left out: $out" ;; esac
# Saved with singleton_local_shards (per-layer keys, SwiGLU's fc1 as weight_w (gate) and weight_v
# (up), one key per expert): the same exports (weight_w and weight_v were unmapped).
$D convert -q --to hf --recipe llama-megatron --config "$SCRATCH/llama-config.json" "$SCRATCH/llama-singleton" \
    "$SCRATCH/o-llama-singleton" || fail "export of llama-singleton"
[ "$($D digest "$SCRATCH/o-llama/model.safetensors")" = "$($D digest "$SCRATCH/o-llama-singleton/model.safetensors")" ] ||
    fail "the singleton_local_shards checkpoint's export differs from the stacked one's"
$D convert -q --to hf --recipe mixtral-megatron --config "$SCRATCH/mixtral-config.json" "$SCRATCH/mixtral-singleton" \
    "$SCRATCH/o-mixtral-singleton" || fail "export of mixtral-singleton"
for o in o-mixtral o-mixtral-singleton; do
    $PY moe "$SCRATCH" $o >"$SCRATCH/moe.log" 2>&1 || { cat "$SCRATCH/moe.log"; fail "the Mixtral export $o differs from the model"; }
    cat "$SCRATCH/moe.log"
done
$PY check "$SCRATCH" o-llama llama o-neox neox o-llama-tp2 llama-tp2 o-gpt2 gpt2 o-gpt2-args gpt2 \
    >"$SCRATCH/check.log" 2>&1 ||
    { cat "$SCRATCH/check.log"; fail "logits differ from Megatron-Core's forward"; }
grep '^ok' "$SCRATCH/check.log"
echo ok
