# Megatron-LM's fsdp_dtensor checkpoint format (--use-megatron-fsdp --ckpt-format fsdp_dtensor),
# written by megatron-core 0.19.2's own save_checkpoint from 2 gloo ranks of Megatron-FSDP on the
# CPU (tests/interop/save_fsdp_dtensor.py: the CUDA calls met there): torch's
# dcp.save of the model's own state dict as uneven DTensors (model.module.*, SwiGLU's fc1 as
# weight_w/weight_v, experts numbered over the expert-parallel ranks), the optimizer's state by
# parameter name (optimizer.state.module.module.module.*.exp_avg, 0-d step tensors,
# param_to_group_meta), args/iteration/rng_state values, in iter_0000010 with no common.pt nor
# metadata.json. For a Llama-shaped GPT (dense SwiGLU, bf16 in a Float16Module; again from 4 ranks,
# tensor parallel 2 x data parallel 2: 2-D DTensors) and a MoE one (4 SequentialMLP experts,
# expert parallel 2), against torch's own dcp.load of the folder:
# dcp info, ls and digest (parsed and served by the catalog), cat of every key, verify; a dcpfs
# mount's files; dcp convert to safetensors and --nested to .pt (torch's dcp_to_torch_save);
# dcpload on 1 and 3 ranks; dcpfs.torch.load and dcpfs.torch.Reader. Then dcp convert --to hf
# (llama-megatron, mixtral-megatron; the Float16Module's bf16 weights are kept as float32 main
# weights: --dtype bfloat16) gives, tensor by tensor, the bytes of the export of the same model
# saved by dist_checkpointing (torch_dist), with --config and without (config.json from the
# checkpoint's args item), and the MoE one renamed as TEGroupedMLP names its experts too.
. "$top_srcdir/tests/megatron_lib.sh"
need_megatron 0.19.2
python3 -c 'import transformers' 2>/dev/null || skip "transformers is not installed (pip install transformers==5.24.0)"
need_python_module xxhash
need_python_module safetensors
export PYTHONWARNINGS=ignore   # Megatron-Core warns of every missing GPU library
D="$DCP --no-catalog"
PY="$top_srcdir/tests/interop/save_fsdp_dtensor.py"
fuse_scratch
mpy() { PYTHONPATH="$MEGATRON_PATH${PYTHONPATH:+:$PYTHONPATH}" timeout 600 python3 "$PY" "$@"; }
for kind in llama llama-tp2 mixtral; do
    mpy make "$SCRATCH" $kind >"$SCRATCH/$kind.log" 2>&1 || { tail -30 "$SCRATCH/$kind.log"; fail "$kind: saving failed"; }
    mpy truth "$SCRATCH" $kind >>"$SCRATCH/$kind.log" 2>&1 || { tail -30 "$SCRATCH/$kind.log"; fail "$kind: torch's dcp.load"; }
    tail -1 "$SCRATCH/$kind.log"
done
for kind in llama llama-tp2 mixtral; do
    ck=$SCRATCH/$kind-fsdp/iter_0000010
    truth=$SCRATCH/$kind.truth
    [ "$(cat "$SCRATCH/$kind-fsdp/latest_checkpointed_iteration.txt")" = 10 ] || fail "$kind: no tracker file"
    # named iter_N, no common.pt, no metadata.json: a complete save (it was called partial)
    $D info "$ck" >"$SCRATCH/info" 2>&1 || fail "$kind: dcp info: $(cat "$SCRATCH/info")"
    grep -q '^layout: .*(Megatron-LM fsdp_dtensor: args and checkpoint_version items, model.module. keys)$' "$SCRATCH/info" ||
        fail "$kind: dcp info does not name the format: $(cat "$SCRATCH/info")"
    out=$($D info "$SCRATCH/$kind-fsdp" 2>&1) && fail "$kind: the run folder opened"
    case "$out" in *"latest_checkpointed_iteration.txt names $ck"*) ;; *) fail "$kind: the run folder's hint: $out" ;; esac
    for how in --no-catalog "--catalog $SCRATCH/catalog.sqlite" "--catalog $SCRATCH/catalog.sqlite"; do
        # shellcheck disable=SC2086
        "$DCP" $how digest --json "$ck" >"$ck.digest" || fail "$kind: dcp $how digest failed"
        python3 "$top_srcdir/tests/truth_check.py" lines <"$ck.digest" | LC_ALL=C sort >"$ck.got"
        LC_ALL=C sort "$truth" >"$ck.want"
        diff "$ck.want" "$ck.got" >"$ck.diff" || { head "$ck.diff"; fail "$kind: dcp $how digest differs from dcp.load (< torch, > dcp)"; }
    done
    "$DCP" --catalog "$SCRATCH/catalog.sqlite" info "$ck" | grep -q 'rebuilt from the catalog' || fail "$kind: not served from the catalog"
    # dcp ls's kinds, dtypes and shapes, dcp cat's bytes of every key (a bytes item: a torch.save archive)
    PYTHONPATH="$MEGATRON_PATH" python3 "$top_srcdir/tests/interop/check_truth.py" "$DCP" "$ck" "$truth.json" ||
        fail "$kind: dcp ls / cat differ from dcp.load"
    $D verify "$ck" >"$SCRATCH/verify" 2>&1 || { cat "$SCRATCH/verify"; fail "$kind: dcp verify"; }
    mount_dcpfs "$ck" "$ck.mnt" -o no_catalog
    python3 "$top_srcdir/tests/truth_check.py" mount "$ck.mnt" "$truth" || fail "$kind: the mount's files differ from dcp.load"
    unmount_dcpfs "$ck.mnt"
    $D convert -q "$ck" "$SCRATCH/$kind.safetensors" 2>/dev/null || fail "$kind: dcp convert to safetensors"
    $D convert -q --nested "$ck" "$SCRATCH/$kind.pt" || fail "$kind: dcp convert --nested"
    mpy files "$SCRATCH" $kind "$SCRATCH/$kind.safetensors" "$SCRATCH/$kind.pt" >"$SCRATCH/files.log" 2>&1 ||
        { tail -5 "$SCRATCH/files.log"; fail "$kind: dcp convert's files differ from torch's"; }
    grep "^$kind: " "$SCRATCH/files.log"
    unique=$(tensor_bytes "$ck" --no-catalog)
    dcpload_runs "$kind" "$ck" "$ck.runs" "rows-1 rows-3 blocks-3"
    python3 "$top_srcdir/tests/load_check.py" "$DCP" "$ck" "$truth.json" "$ck.runs" "$unique" >"$ck.load" 2>&1 ||
        { cat "$ck.load"; fail "$kind: dcpload's regions"; }
    echo "$kind: $(wc -l <"$truth") keys: dcp's view, the mount, convert's files and dcpload's regions are dcp.load's"
done
mpy grouped "$SCRATCH" >"$SCRATCH/grouped.log" 2>&1 || { tail -20 "$SCRATCH/grouped.log"; fail "the TEGroupedMLP names"; }
# The export: byte for byte the torch_dist save's (its Float16Module's bf16 weights), with the
# transformers config and without (from the args item).
digests() { $D digest "$1/model.safetensors" >"$1.digest" || fail "dcp digest $1"; }
for x in llama:llama-megatron llama-tp2:llama-megatron mixtral:mixtral-megatron; do
    kind=${x%%:*} r=${x#*:}
    ck=$SCRATCH/$kind-fsdp/iter_0000010
    $D convert -q --to hf --recipe $r --config "$SCRATCH/$kind-config.json" "$SCRATCH/$kind-torch-dist" "$SCRATCH/o-$kind-td" ||
        fail "export of $kind's torch_dist save"
    digests "$SCRATCH/o-$kind-td"
    out=$($D convert --to hf --recipe $r --dtype bfloat16 --config "$SCRATCH/$kind-config.json" "$ck" "$SCRATCH/o-$kind" 2>&1) ||
        fail "export of $kind's fsdp_dtensor save: $out"
    case "$out" in *"skipped optimizer.state.module.module.module.decoder.final_layernorm.weight.exp_avg: left out by the recipe"*) ;;
        *) fail "$kind: the optimizer state not reported left out: $out" ;; esac
    digests "$SCRATCH/o-$kind"
    cmp -s "$SCRATCH/o-$kind-td.digest" "$SCRATCH/o-$kind.digest" ||
        { diff "$SCRATCH/o-$kind-td.digest" "$SCRATCH/o-$kind.digest"; fail "$kind: the fsdp_dtensor export differs from the torch_dist one's"; }
    $D convert -q --to hf --recipe $r --dtype bfloat16 "$ck" "$SCRATCH/o-$kind-args" 2>"$SCRATCH/err" ||
        fail "export of $kind without --config: $(cat "$SCRATCH/err")"
    digests "$SCRATCH/o-$kind-args"
    cmp -s "$SCRATCH/o-$kind-td.digest" "$SCRATCH/o-$kind-args.digest" || fail "$kind: the export without --config differs"
    tr -d ' \n' <"$SCRATCH/o-$kind-args/config.json" >"$SCRATCH/config"
    for kv in '"num_attention_heads":4' '"num_key_value_heads":2' '"head_dim":16' '"rms_norm_eps":1e-5' \
              '"rope_theta":10000' '"max_position_embeddings":256' '"num_hidden_layers":2'; do
        grep -qF "$kv" "$SCRATCH/config" || fail "$kind: config.json from the args item lacks $kv: $(cat "$SCRATCH/config")"
    done
    echo "$kind: the fsdp_dtensor export is the torch_dist one's, tensor by tensor ($(wc -l <"$SCRATCH/o-$kind.digest") tensors)"
done
# tensor parallel 2 x data parallel 2 (linear_qkv, and each rank's gate and up halves, split by
# tensor parallelism, then sharded by Megatron-FSDP): the same model, the same export
cmp -s "$SCRATCH/o-llama.digest" "$SCRATCH/o-llama-tp2.digest" || fail "the tensor-parallel 2 export differs from the other's"
$D convert -q --to hf --recipe mixtral-megatron --dtype bfloat16 --config "$SCRATCH/mixtral-config.json" \
    "$SCRATCH/mixtral-grouped" "$SCRATCH/o-grouped" || fail "export of the TEGroupedMLP names"
digests "$SCRATCH/o-grouped"
cmp -s "$SCRATCH/o-mixtral-td.digest" "$SCRATCH/o-grouped.digest" || fail "the TEGroupedMLP names' export differs"
# After the saves and dcpload: in a sanitizer build the package's runtimes are preloaded from here on.
use_python_package torch
mpy pyload "$SCRATCH" llama llama-tp2 mixtral >"$SCRATCH/pyload.log" 2>&1 ||
    { tail -5 "$SCRATCH/pyload.log"; fail "dcpfs.torch.load or dcpfs.torch.Reader differs from dcp.load"; }
for kind in llama llama-tp2 mixtral; do
    [ "$(grep -c "^$kind: .*, dcp.load's bytes$" "$SCRATCH/pyload.log")" = 2 ] ||
        fail "$kind: dcpfs.torch.load and dcpfs.torch.Reader were not both checked: $(tail -5 "$SCRATCH/pyload.log")"
done
grep "dcp.load's bytes$" "$SCRATCH/pyload.log"
echo ok
