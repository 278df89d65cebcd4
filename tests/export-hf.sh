# dcp convert --to hf end to end with transformers: tiny Llama, Qwen2, Qwen3-MoE, GPT-NeoX, GPT-2
# and Mixtral models saved in torchtitan and Megatron-Core layouts with torch.distributed.checkpoint (2 gloo ranks,
# sharded; layer-stacked and per-layer Megatron keys) are exported by the shipped recipes, and
# AutoModelForCausalLM.from_pretrained of each export gives the source model's logits
# (float32: relative error <= 1e-5; bfloat16 / float16: weights bit for bit torch's cast).
# See tests/interop/export_hf.py for how each layout is derived.
. "$top_srcdir/tests/lib.sh"
need python3
need_torch
python3 -c "import transformers" 2>/dev/null || skip "transformers is not installed (pip install transformers==5.24.0)"
scratch
export DCP_RECIPE_PATH="$top_srcdir/recipes"
PY="python3 $top_srcdir/tests/interop/export_hf.py"
D="$DCP --no-catalog"
$PY make "$SCRATCH" >/dev/null 2>&1 || { $PY make "$SCRATCH/again"; fail "building the models and checkpoints"; }
ex() {   # ex RECIPE CONFIG SRC DST [flags]
    local r=$1 c=$2 s=$3 d=$4; shift 4
    $D convert -q --to hf --recipe "$r" --config "$SCRATCH/$c" "$@" "$SCRATCH/$s" "$SCRATCH/$d" ||
        fail "export of $s by $r"
}
CHECKS=""
check() { CHECKS="$CHECKS $SCRATCH/$1 $SCRATCH/$2 $3"; }   # check REF DST DTYPE, run together below
ex llama-torchtitan llama-config.json tt o-tt
check ref-llama o-tt float32
ex llama-torchtitan llama-config.json tt3 o-tt3
check ref-llama o-tt3 float32
ex llama-megatron llama-config.json mc o-mc --max-shard-size 60K
[ -f "$SCRATCH/o-mc/model.safetensors.index.json" ] || fail "o-mc: no model.safetensors.index.json"
check ref-llama o-mc float32
# No --config: config.json from the shapes and Megatron-LM's arguments in common.pt.
$D convert -q --to hf --recipe llama-megatron "$SCRATCH/mc" "$SCRATCH/o-mc-args" || fail "export of mc without --config"
check ref-llama o-mc-args float32
grep -q '"num_key_value_heads": 2' "$SCRATCH/o-mc-args/config.json" || fail "config.json from common.pt: $(cat "$SCRATCH/o-mc-args/config.json")"
expect_fail 'common.pt: args.normalization is "LayerNorm", recipe qwen2-megatron expects "RMSNorm"' \
    $D convert --to hf --recipe qwen2-megatron "$SCRATCH/qwen" "$SCRATCH/o-qwen-args"
expect_fail "recipe llama-torchtitan cannot write config.json: the checkpoint does not say num_attention_heads" \
    $D convert --to hf --recipe llama-torchtitan --keys norm.weight "$SCRATCH/tt" "$SCRATCH/o-tt-noconfig"
ex qwen2-megatron qwen-config.json qwen o-qwen
check ref-qwen o-qwen float32
ex gpt-neox-megatron neox-config.json neox o-neox
check ref-neox o-neox float32
# GPT-2: Conv1D weights transposed, the fused QKV regrouped; config.json from common.pt (stacked)
# or --config (per-layer keys, cast to bfloat16 too).
$D convert -q --to hf --recipe gpt2-megatron "$SCRATCH/gpt2" "$SCRATCH/o-gpt2" || fail "export of gpt2 by gpt2-megatron"
check ref-gpt2 o-gpt2 float32
cfg=$(tr -d ' \n' <"$SCRATCH/o-gpt2/config.json")
case "$cfg" in *'"n_embd":64,"vocab_size":128,"n_positions":32,"n_inner":256,"n_layer":2,"n_head":4'*) ;;
    *) fail "gpt2: config.json from common.pt: $cfg" ;; esac
$D convert -q --to hf --recipe gpt2-megatron "$SCRATCH/gpt2-tied" "$SCRATCH/o-gpt2-tied" || fail "export of gpt2-tied"
grep -q '"tie_word_embeddings": true' "$SCRATCH/o-gpt2-tied/config.json" || fail "gpt2-tied: not tied"
$D ls "$SCRATCH/o-gpt2-tied/model.safetensors" | grep -q "^lm_head" && fail "gpt2-tied: an lm_head.weight"
check ref-gpt2-tied o-gpt2-tied float32
ex gpt2-megatron gpt2-config.json gpt2-layers o-gpt2-layers
check ref-gpt2 o-gpt2-layers float32
ex gpt2-megatron gpt2-config.json gpt2-layers o-gpt2-bf16 --dtype bfloat16
check ref-gpt2 o-gpt2-bf16 bfloat16
expect_fail 'common.pt: args.normalization is "RMSNorm", recipe gpt2-megatron expects "LayerNorm"' \
    $D convert --to hf --recipe gpt2-megatron --allow-unmapped "$SCRATCH/mc" "$SCRATCH/o-gpt2-mc"
ex qwen3-torchtitan qwen3moe-config.json qwen3moe o-qwen3moe
check ref-qwen3moe o-qwen3moe float32
ex mixtral-megatron mixtral-config.json mixtral o-mixtral
check ref-mixtral o-mixtral float32
ex llama-torchtitan llama-config.json tt o-tt-bf16 --dtype bfloat16
check ref-llama o-tt-bf16 bfloat16
ex llama-megatron llama-config.json mc o-mc-f16 --dtype float16
check ref-llama o-mc-f16 float16
# shellcheck disable=SC2086 # mktemp's paths have no spaces
$PY check $CHECKS 2>"$SCRATCH/check.err" || { cat "$SCRATCH/check.err"; fail "logits or weights differ"; }
cmp -s "$SCRATCH/llama-config.json" "$SCRATCH/o-tt/config.json" || fail "config.json is not --config's copy"
# The Megatron checkpoint's TransformerEngine _extra_state is left out by the recipe, and said so.
out=$($D convert --to hf --recipe llama-megatron --config "$SCRATCH/llama-config.json" "$SCRATCH/mc" "$SCRATCH/o2" 2>&1)
case "$out" in *"skipped decoder.layers.self_attention.linear_qkv._extra_state: left out by the recipe"*) ;;
    *) fail "_extra_state not reported: $out" ;; esac
# rope_permute from_hf is torchtitan's _reverse_permute: a Hugging Face safetensors file (a
# single-file source) mapped back gives the torchtitan checkpoint's wq and wk, digest for digest.
cat >"$SCRATCH/back.json" <<'J'
{"recipe": "back", "rules": [
  {"from": "model.layers.{L}.self_attn.q_proj.weight", "op": "rope_permute", "heads": 4, "rope": "from_hf",
   "to": "layers.{L}.attention.wq.weight"},
  {"from": "model.layers.{L}.self_attn.k_proj.weight", "op": "rope_permute", "heads": 2, "rope": "from_hf",
   "to": "layers.{L}.attention.wk.weight"}], "config": {"model_type": "back"}}
J
$D convert -q --to hf --recipe "$SCRATCH/back.json" --allow-unmapped "$SCRATCH/ref-llama/model.safetensors" \
    "$SCRATCH/back" || fail "HF -> torchtitan q/k"
for k in layers.0.attention.wq.weight layers.1.attention.wk.weight; do
    [ "$($D digest --keys $k "$SCRATCH/tt")" = "$($D digest --keys $k "$SCRATCH/back/model.safetensors")" ] ||
        fail "$k: from_hf differs from torchtitan's _reverse_permute"
done
# A key no rule maps is an error naming it; nothing is written.
expect_fail "unk: layers.0.attention.mystery.weight: no rule of recipe llama-torchtitan maps this key" \
    $D convert --to hf --recipe llama-torchtitan --config "$SCRATCH/llama-config.json" "$SCRATCH/unk" "$SCRATCH/o-unk"
[ ! -e "$SCRATCH/o-unk" ] || fail "o-unk written despite the error"
echo ok
