# Every on-disk format PyTorch 2.13 writes for one process, read back by `dcp cat`:
# torch.save records (one file, and one file per item), SerializationFormat.SAFETENSORS
# shards, the zstd stream extension, and the Hugging Face storage writer (index + two
# files, per-rank shard files, sharded/ + consolidated). Tensors cover every dtype
# torch.save rebuilds with v2 (typed storages) and v3 (UntypedStorage: float8, uint16-64),
# 0-d, empty, transposed, channels-last, conj and neg views; each key's bytes must hash
# to the sha256 PyTorch computed, and each bytes item must torch.load to its value.
. "$top_srcdir/tests/lib.sh"
need python3
need sha256sum
need_torch
need_python_module safetensors
scratch
GEN="$top_srcdir/tests/interop/save_formats.py"
variants="torch_save torch_save_files safetensors zstd hf hf_distributed hf_consolidated"
python3 -c 'import zstandard' 2>/dev/null || {
    echo "zstd variant skipped: no zstandard module"; variants=$(echo "$variants" | sed 's/ zstd//'); }

# One Python process writes them all (importing torch dominates the run time).
timeout 600 python3 "$GEN" "$SCRATCH" $variants >"$SCRATCH/save.log" 2>&1 || {
    cat "$SCRATCH/save.log"; fail "PyTorch save failed"; }

tab=$(printf '\t')
bytes_items=
for v in $variants; do
    out="$SCRATCH/$v"
    ck="$out/ckpt"
    # Exactly the saved keys with PyTorch's dtypes and shapes.
    "$DCP" --no-catalog ls "$ck" | awk 'NR > 1 { print $1, $2, $3 }' | sort >"$out.ls"
    awk -F"$tab" '{ print $1, ($2 == "bytes" ? "bytes" : $3), ($2 == "bytes" ? "-" : $4) }' "$out/truth.tsv" |
        sort >"$out.want"
    diff "$out.want" "$out.ls" || fail "$v: dcp ls differs from what PyTorch saved (< saved, > listed)"
    n=0
    mkdir "$out/bytes"
    while IFS="$tab" read -r key kind dtype shape sha; do
        n=$((n + 1))
        if [ "$kind" = bytes ]; then
            "$DCP" --no-catalog cat "$ck" "$key" >"$out/bytes/$key" || fail "$v: dcp cat $key failed"
            bytes_items="$bytes_items $out/bytes/$key"
            continue
        fi
        got=$("$DCP" --no-catalog cat "$ck" "$key" 2>"$out.err" | sha256sum | cut -d' ' -f1)
        [ -s "$out.err" ] && { cat "$out.err"; fail "$v: dcp cat $key failed"; }
        [ "$got" = "$sha" ] || fail "$v: $key: sha256 $got, PyTorch's bytes hash to $sha"
    done <"$out/truth.tsv"
    [ "$n" -ge 8 ] || fail "$v: only $n keys in the truth"
    case $v in
        hf*) "$DCP" --no-catalog info "$ck" | grep -q 'hf_safetensors' || fail "$v: dcp info does not say hf_safetensors" ;;
    esac
    echo "$v: $n keys byte-exact"
done
# Bytes items are whole torch.save blobs: PyTorch must load them back to the saved values.
[ -z "$bytes_items" ] || python3 "$GEN" --check-bytes $bytes_items || fail "bytes items differ"
