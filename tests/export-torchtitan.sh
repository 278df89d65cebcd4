# dcp convert --to hf against torchtitan's own code (issue 15): tiny Llama3, Qwen3 and
# Qwen3-MoE models built by torchtitan 0.3.0's classes, their state dicts saved with
# torch.distributed.checkpoint on 2 gloo ranks, exported by the shipped recipes
# (llama-torchtitan, qwen3-torchtitan); every exported tensor is byte for byte what torchtitan's
# own converter (Llama3StateDictAdapter.to_hf, Qwen3StateDictAdapter.to_hf) gives for the same
# state dict, and AutoModelForCausalLM.from_pretrained of the export gives torchtitan's forward's
# logits (float32: relative error <= 1e-5; the MoE <= 2e-3, torchtitan computing its experts in
# bfloat16). See tests/interop/export_torchtitan.py.
. "$top_srcdir/tests/lib.sh"
framework_setup torchtitan torchtitan "pip install --no-deps torchtitan==0.3.0 spmd-types==0.2.3 tyro==1.0.16 docstring-parser==0.18.0 typeguard==4.6.1" export_torchtitan.py
ex() {   # ex RECIPE KIND DST [flags]
    local r=$1 k=$2 d=$3; shift 3
    $D convert -q --to hf --recipe "$r" --config "$SCRATCH/$k-config.json" "$@" "$SCRATCH/$k" "$SCRATCH/$d" ||
        fail "export of $k by $r"
}
ex llama-torchtitan llama o-llama
ex llama-torchtitan llama o-llama-bf16 --dtype bfloat16
ex qwen3-torchtitan qwen3 o-qwen3
# torchtitan's MoE keeps its load-balancing bias (moe.expert_bias_E, a buffer in the state
# dict) that Hugging Face's Qwen3-MoE has no place for: left out, as to_hf does, and said so.
out=$($D convert --to hf --recipe qwen3-torchtitan --config "$SCRATCH/qwen3moe-config.json" \
    "$SCRATCH/qwen3moe" "$SCRATCH/o-qwen3moe" 2>&1) || fail "export of qwen3moe: $out"
case "$out" in *"skipped layers.1.moe.expert_bias_E: left out by the recipe"*) ;;
    *) fail "expert_bias_E not reported: $out" ;; esac
$PY check "$SCRATCH" o-llama llama float32 o-llama-bf16 llama bfloat16 o-qwen3 qwen3 float32 \
    o-qwen3moe qwen3moe float32 >"$SCRATCH/check.log" 2>&1 || { cat "$SCRATCH/check.log"; fail "torchtitan's to_hf or forward differs"; }
grep '^ok' "$SCRATCH/check.log"
echo ok
