# Megatron-Core checkpoints as each release of tests/interop/megatron-releases.txt writes
# them (its own dist_checkpointing.save, PyTorch 2.13 underneath; tests/interop/megatron_releases.py):
# a GPTModel from one rank, and from 4 ranks (tensor parallel 2 x data parallel 2, fully
# parallel save) with the distributed optimizer's flattened tensors. For every key, dcp ls's
# shape and dcp digest's XXH3-128 must equal PyTorch's own view of the checkpoint
# (torch.distributed.checkpoint.load into a full tensor; a bytes item's stored bytes), first
# parse and served from the catalog; dcp info names the layout and dcp verify passes; mounted
# with dcpfs, every key's file holds the same bytes; dcpload on 1 and 3 ranks, by rows and in
# blocks, cuts each rank's region from those bytes and reads each stored byte once
# (tests/load_check.py); dcpfs.torch.load and dcp.load with dcpfs.torch.Reader fill full
# tensors with them (megatron_releases.py check). All of it again with the reformulated
# optimizer states folded back to their original shapes (dcp --megatron-fold, -o
# megatron_fold, dcpload --megatron-fold, megatron_fold=True): Megatron-Core's own view, the
# tensors as they were before the save (megatron_releases.py originals()).
. "$top_srcdir/tests/megatron_lib.sh"
releases=$(grep -v '^#' "$top_srcdir/tests/interop/megatron-releases.txt" | cut -d' ' -f1)
# shellcheck disable=SC2086
need_megatron $releases
need_python_module xxhash
need_python_module psutil
if [ -n "${DCP_SANITIZED:-}" ]; then   # the sanitizers watch dcp; the saves are Python's: oldest and newest
    releases="$(echo "$releases" | head -1) $(echo "$releases" | tail -1)"
    echo "sanitizer build: megatron-core $releases only"
fi
fuse_scratch
for v in $releases; do
    PYTHONPATH=$(megatron_path "$v") timeout 600 python3 "$top_srcdir/tests/interop/megatron_releases.py" save "$SCRATCH/$v" \
        >"$SCRATCH/$v.log" 2>&1 || { tail -30 "$SCRATCH/$v.log"; fail "megatron-core $v: saving failed"; }
    for case in tp1 tp2dp2; do
        ck="$SCRATCH/$v/$case"
        # folded: Megatron-Core's own view (--megatron-fold), which the catalog must not serve
        # nor keep: the catalog-served open after it still gives PyTorch's
        for how in parsed catalog-written catalog-served folded catalog-served-again; do
            truth=$ck.truth
            case $how in
            parsed) set -- --no-catalog ;;
            folded) set -- --megatron-fold --catalog "$SCRATCH/catalog.sqlite"; truth=$ck.folded.truth ;;
            *) set -- --catalog "$SCRATCH/catalog.sqlite" ;;
            esac
            "$DCP" "$@" digest --json "$ck" >"$ck.digest" || fail "megatron-core $v $case: dcp digest ($how) failed"
            python3 "$top_srcdir/tests/truth_check.py" lines <"$ck.digest" >"$ck.lines" ||
                fail "megatron-core $v $case: dcp digest --json ($how) printed something else"
            LC_ALL=C sort "$ck.lines" >"$ck.got"
            LC_ALL=C sort "$truth" >"$ck.want"
            [ -s "$ck.want" ] || fail "megatron-core $v $case: no keys in $truth"
            diff "$ck.want" "$ck.got" >"$ck.diff" ||
                { cat "$ck.diff"; fail "megatron-core $v $case: dcp digest ($how) differs from $truth (< truth, > dcp)"; }
        done
        # what the fold changes: the two N-D flattened optimizer states on 4 ranks from 0.8 to
        # 0.15 (0.6/0.7 store 1-D buckets, which need no fold; from 0.16 ShardedTensor refuses
        # flattened ranges), nothing on one rank
        folded=$(diff "$ck.truth" "$ck.folded.truth" | grep -c '^>' || true)
        case $case/$v in tp1/* | tp2dp2/0.6.* | tp2dp2/0.7.* | tp2dp2/0.1[6-9].*) want=0 ;; *) want=2 ;; esac
        [ "$folded" = "$want" ] || fail "megatron-core $v $case: the folded view changes $folded keys, not $want"
        # dcp info counts them (parsed, served by the catalog, folded)
        for how in --no-catalog "--catalog $SCRATCH/catalog.sqlite" --megatron-fold; do
            line=$("$DCP" $how info "$ck" | grep '^reformulated:') || line=
            case $want/$how in
            0/*) [ -z "$line" ] ;;
            */--megatron-fold) [ "$line" = "reformulated:   $want tensors, shown in their original shapes (--megatron-fold)" ] ;;
            *) case $line in "reformulated:   $want tensors stored as Megatron-Core's"*) ;; *) false ;; esac ;;
            esac || fail "megatron-core $v $case: dcp $how info says '$line' of $want reformulated tensors"
        done
        "$DCP" --catalog "$SCRATCH/catalog.sqlite" info "$ck" | grep -q 'rebuilt from the catalog' ||
            fail "megatron-core $v $case: not served from the catalog"
        "$DCP" --no-catalog info "$ck" | grep -q 'Megatron-Core torch_dist' ||
            fail "megatron-core $v $case: dcp info does not name the Megatron-Core layout"
        "$DCP" --no-catalog verify "$ck" >"$ck.verify" 2>&1 || { cat "$ck.verify"; fail "megatron-core $v $case: dcp verify failed"; }
        # A Hugging Face export with no --config: config.json from Megatron-LM's arguments in the
        # common state (common.pt; from 0.19 the checkpoint's common_state item), the tensors
        # PyTorch's view's bytes. 0.6-0.8 save no GPTModel; before 0.15 the local spec's norms
        # are LayerNorms with biases (not Llama-shaped) whatever the config says.
        llama=yes
        grep -q '^decoder.final_layernorm.bias	' "$ck.truth" && llama=no
        case $case/$v/$llama in tp1/0.1[5-9].*/no) fail "megatron-core $v: the tp1 model has LayerNorm biases" ;; esac
        case $case/$v/$llama in tp1/0.[6-8].*/* | */no) ;; tp1/*)
            "$DCP" --no-catalog convert -q --to hf --recipe llama-megatron "$ck" "$ck.hf" 2>"$ck.err" ||
                fail "megatron-core $v: dcp convert --to hf without --config: $(cat "$ck.err")"
            tr -d ' \n' <"$ck.hf/config.json" >"$ck.config"
            for kv in '"num_attention_heads":4' '"num_key_value_heads":2' '"head_dim":16' '"rms_norm_eps":1e-5' \
                      '"rope_theta":10000' '"max_position_embeddings":256' '"intermediate_size":96'; do
                grep -qF "$kv" "$ck.config" || fail "megatron-core $v: config.json lacks $kv: $(cat "$ck.config")"
            done
            for pair in model.embed_tokens.weight:embedding.word_embeddings.weight lm_head.weight:output_layer.weight \
                        model.norm.weight:decoder.final_layernorm.weight; do
                got=$("$DCP" digest --keys "${pair%%:*}" "$ck.hf/model.safetensors" | cut -d' ' -f1) &&
                    [ "$got" = "$(awk -F'\t' -v k="${pair#*:}" '$1 == k {print $3}' "$ck.truth")" ] ||
                    fail "megatron-core $v: the export's ${pair%%:*} is not ${pair#*:}'s bytes"
            done ;;
        esac
        for view in stored folded; do
        [ $view = stored ] || [ "$case" = tp2dp2 ] || continue   # tp1 has nothing to fold
        if [ $view = folded ]; then
            mount_dcpfs "$ck" "$ck.mnt" -o no_catalog,megatron_fold
            truth=$ck.folded.truth
        else
            mount_dcpfs "$ck" "$ck.mnt" -o no_catalog
            truth=$ck.truth
        fi
        python3 "$top_srcdir/tests/truth_check.py" mount "$ck.mnt" "$truth" ||
            fail "megatron-core $v $case: the mount's files differ from $truth"
        unmount_dcpfs "$ck.mnt"
        done
        # Megatron's tensors are saved unshared (each chunk its own storage): every byte of
        # every tensor is stored once, so the ranks must read exactly their sum (folded too)
        unique=$(tensor_bytes "$ck" --no-catalog) || fail "megatron-core $v $case: dcp ls --json failed"
        for view in stored folded; do
            set --
            truth=$ck.truth.json
            if [ $view = folded ]; then
                [ "$case" = tp2dp2 ] || continue   # tp1 has nothing to fold
                set -- --megatron-fold
                truth=$ck.folded.truth.json
            fi
            dcpload_runs "megatron-core $v $case" "$ck" "$ck.runs" "rows-1 rows-3 blocks-3" "$@"
            LOAD_CHECK_DCP_OPTS="$*" python3 "$top_srcdir/tests/load_check.py" "$DCP" "$ck" "$truth" "$ck.runs" "$unique" \
                >"$ck.load" 2>&1 || { cat "$ck.load"; fail "megatron-core $v $case: dcpload's regions ($view)"; }
        done
    done
    echo "megatron-core $v: tp1 $(wc -l <"$SCRATCH/$v/tp1.truth") keys, tp2dp2 $(wc -l <"$SCRATCH/$v/tp2dp2.truth") keys: dcp's view equals PyTorch's, dcpload's regions too; folded ($folded keys) Megatron-Core's"
done
# After the saves and dcpload: in a sanitizer build the package's runtimes are preloaded from here on.
use_python_package torch
outs=
for v in $releases; do outs="$outs $SCRATCH/$v"; done
# shellcheck disable=SC2086
python3 "$top_srcdir/tests/interop/megatron_releases.py" check $outs ||
    fail "dcpfs.torch.load or dcp.load with dcpfs.torch.Reader differs from PyTorch's own load"
echo ok
