# dcp convert --to hf without Python: a recipe's ops checked byte for byte with dcp cat
# (rename, split_gate_up, split_qkv with grouped query heads, rope_permute both ways, casts,
# transpose alone and after merge_qkv and split, with a cast; transpose of 1-D or 3-D fails),
# the config.json template, every error the brief lists (unknown keys, a bad recipe, a
# missing or broken config, an existing DST, a hostile recipe file), DST never half-written,
# and the peak RSS of an export that splits, permutes and casts 192 MiB staying under 64 MiB.
. "$top_srcdir/tests/lib.sh"
scratch
export DCP_RECIPE_PATH="$top_srcdir/recipes"
need python3
D="$DCP --no-catalog"
# 4 keys of 128x16 float32 over 2 ranks, by columns: every row a strided read.
$D synth "$SCRATCH/s" --keys 4 --shape 128,16 --dtype float32 --ranks 2 --shard cols --seed 5 >/dev/null
# Key 0 renamed, 1 split in two (gate/up), 2 a fused QKV of 4 query and 2 key/value heads of
# 16 rows (128 = 16 * (4 + 2 * 2)), with the q and k rows permuted to Hugging Face's rotary
# layout, 3 permuted back from it (8 heads of 16 rows).
cat >"$SCRATCH/r.json" <<'J'
{"recipe": "test", "unstack": ["L"], "ignore": ["nothing.*"],
 "rules": [
  {"from": "model.layers.0.weight", "to": "a.weight"},
  {"from": "model.layers.1.weight", "op": "split_gate_up", "to": ["gate.weight", "up.weight"]},
  {"from": "model.layers.2.weight", "op": "split_qkv", "heads": "num_attention_heads", "kv_heads": 2,
   "rope": "to_hf", "to": ["q.weight", "k.weight", "v.weight"]},
  {"from": "model.layers.{L}.weight", "op": "rope_permute", "heads": 8, "rope": "from_hf", "to": "p.{L}.weight"}],
 "config": {"model_type": "test", "hidden_size": {"$shape": ["a.weight", 1]}, "n": {"$count": "*.weight"},
            "torch_dtype": {"$dtype": "a.weight"}}}
J
echo '{"num_attention_heads": 4}' >"$SCRATCH/c.json"
$D convert -q --to hf --recipe "$SCRATCH/r.json" --config "$SCRATCH/c.json" "$SCRATCH/s" "$SCRATCH/o" ||
    fail "export by a test recipe"
cmp -s "$SCRATCH/c.json" "$SCRATCH/o/config.json" || fail "--config is not copied as is"
O="$SCRATCH/o/model.safetensors"
rows() {   # rows KEY START COUNT: rows of a source key, C order
    $D cat "$SCRATCH/s" "model.layers.$1.weight" --box "$2:$3,0:16"
}
same() {   # same OUTKEY START COUNT "what" < expected bytes on stdin: rows of an output key
    $D cat "$O" "$1" --box "$2:$3,0:16" | cmp -s - /dev/stdin || fail "$4"
}
rows 0 0 128 | same a.weight 0 128 "rename: a.weight differs from model.layers.0.weight"
rows 1 0 64 | same gate.weight 0 64 "split_gate_up: gate = rows 0-63"
rows 1 64 64 | same up.weight 0 64 "split_gate_up: up = rows 64-127"
# QKV rows per group g of 2: q heads 2g, 2g+1 (32 rows), then k (16), then v (16): 64 rows a group.
rows 2 112 16 | same v.weight 16 16 "split_qkv: v head 1 = rows 112-127"
rows 2 48 16 | same v.weight 0 16 "split_qkv: v head 0 = rows 48-63"
# rope to_hf within a head of 16 rows: HF row j*8 + i is interleaved row 2i + j. q head 2 is in
# group 1 (rows 64..): its HF row 8 (i=0, j=1) is fused row 64 + 1, HF row 3 is fused row 64 + 6.
rows 2 65 1 | same q.weight 40 1 "split_qkv + rope: q head 2, HF row 8 = fused row 65"
rows 2 70 1 | same q.weight 35 1 "split_qkv + rope: q head 2, HF row 3 = fused row 70"
# k head 0 (fused rows 32-47): HF row 9 (i=1, j=1) = interleaved row 3.
rows 2 35 1 | same k.weight 9 1 "split_qkv + rope: k head 0, HF row 9 = fused row 35"
# from_hf, key 3: interleaved row 2i + j is HF row j*8 + i: row 5 (i=2, j=1) = HF row 10.
rows 3 10 1 | same p.3.weight 5 1 "rope_permute from_hf: row 5 = source row 10"
rows 3 16 1 | same p.3.weight 16 1 "rope_permute from_hf: head 1 starts at its own first row"
# The unstack placeholder L also captures per-layer keys.
$D ls "$O" | grep -q "^p.3.weight " || fail "p.3.weight is missing"
$D ls "$O" | grep -q "^p.0.weight " && fail "model.layers.0.weight matched two rules"

# transpose (GPT-2's Conv1D): key 0 transposed, key 2's fused QKV (4 query, 2 key/value heads
# of 16 rows) regrouped into q | k | v (merge_qkv) and transposed, key 3 split in two halves
# each transposed. Output row j is source column j (through the row map).
cat >"$SCRATCH/rt.json" <<'J'
{"recipe": "transposes",
 "rules": [
  {"from": "model.layers.0.weight", "to": "t.weight", "transpose": true},
  {"from": "model.layers.1.weight", "to": "r.weight"},
  {"from": "model.layers.2.weight", "op": "merge_qkv", "heads": 4, "kv_heads": 2, "to": "qkv.weight",
   "transpose": true},
  {"from": "model.layers.3.weight", "op": "split", "to": ["lo.weight", "hi.weight"], "transpose": true}],
 "config": {"model_type": "test"}}
J
$D convert -q --to hf --recipe "$SCRATCH/rt.json" "$SCRATCH/s" "$SCRATCH/tr" || fail "export by a transposing recipe"
T="$SCRATCH/tr/model.safetensors"
$D ls "$T" | grep -q "^t.weight  *float32  *\[16,128\]" || fail "transpose: t.weight is not [16, 128]: $($D ls "$T")"
$D ls "$T" | grep -q "^qkv.weight  *float32  *\[16,128\]" || fail "merge_qkv + transpose: qkv.weight's shape"
$D ls "$T" | grep -q "^hi.weight  *float32  *\[16,64\]" || fail "split + transpose: hi.weight's shape"
col() {   # col KEY ROWSTART ROWS COL: a column of a source key, C order
    $D cat "$SCRATCH/s" "model.layers.$1.weight" --box "$2:$3,$4:1"
}
for j in 0 1 7 8 15; do
    $D cat "$T" t.weight --box "$j:1,0:128" | cmp -s - <(col 0 0 128 $j) ||
        fail "transpose: t.weight row $j is not source column $j"
    $D cat "$T" hi.weight --box "$j:1,0:64" | cmp -s - <(col 3 64 64 $j) ||
        fail "split + transpose: hi.weight row $j is not rows 64-127 of source column $j"
done
# Every element of t.weight: the whole tensor equals the source's columns one after another.
for j in $(seq 0 15); do col 0 0 128 $j; done | cmp -s - <($D cat "$T" t.weight) ||
    fail "transpose: t.weight is not the source transposed"
# merge_qkv: column k of qkv.weight is fused row map(k): q (k < 64) of group k/32 at 64g + k%32,
# k (64..95) at 64g + 32 + w, v (96..127) at 64g + 48 + w.
for kv in 0:0 40:72 63:95 64:32 70:38 85:101 96:48 100:52 127:127; do
    k=${kv%%:*} s=${kv##*:}
    $D cat "$T" qkv.weight --box "0:16,$k:1" |
        cmp -s - <($D cat "$SCRATCH/s" model.layers.2.weight --box "$s:1,0:16") ||
        fail "merge_qkv + transpose: qkv.weight column $k is not fused row $s"
done
# With a cast: the transposed bfloat16 rows are the bfloat16 export's columns.
$D convert -q --to hf --recipe "$SCRATCH/rt.json" --dtype bfloat16 "$SCRATCH/s" "$SCRATCH/trb" ||
    fail "a transposing export to bfloat16"
$D convert -q --to hf --recipe "$SCRATCH/r.json" --config "$SCRATCH/c.json" --dtype bfloat16 \
    --keys model.layers.0.weight "$SCRATCH/s" "$SCRATCH/rb" || fail "a bfloat16 rename"
for j in 0 5 15; do
    $D cat "$SCRATCH/trb/model.safetensors" t.weight --box "$j:1,0:128" |
        cmp -s - <($D cat "$SCRATCH/rb/model.safetensors" a.weight --box "0:128,$j:1") ||
        fail "transpose + bfloat16: row $j is not the cast source's column $j"
done
# transpose takes 2-D tensors only (after unstacking): 1-D and 3-D sources fail with their shapes.
$D synth "$SCRATCH/s1" --keys 1 --shape 32 --dtype float32 --seed 1 >/dev/null
$D synth "$SCRATCH/s3" --keys 1 --shape 2,8,4 --dtype float32 --seed 1 >/dev/null
echo '{"recipe": "x", "rules": [{"from": "model.layers.{L}.weight", "to": "b.{L}", "transpose": true}]}' \
    >"$SCRATCH/t1.json"
t1="model.layers.0.weight: rule 'model.layers.{L}.weight' of recipe x transposes it, but it has"
expect_fail "$t1 1 dimension, not 2" \
    $D convert --to hf --recipe "$SCRATCH/t1.json" "$SCRATCH/s1" "$SCRATCH/y"
expect_fail "$t1 3 dimensions, not 2" \
    $D convert --to hf --recipe "$SCRATCH/t1.json" "$SCRATCH/s3" "$SCRATCH/y"
[ ! -e "$SCRATCH/y" ] || fail "a failed transpose left DST"

# Casts: bfloat16 is float32's upper half, rounded to nearest even; float16 back through float32.
$D convert -q --to hf --recipe "$SCRATCH/r.json" --config "$SCRATCH/c.json" --dtype bfloat16 "$SCRATCH/s" "$SCRATCH/b"
$D ls "$SCRATCH/b/model.safetensors" | grep -q "^a.weight  *bfloat16" || fail "--dtype bfloat16 not applied"
$D convert -q --to hf --recipe "$SCRATCH/r.json" --config "$SCRATCH/c.json" --dtype float16 --max-shard-size 4K \
    "$SCRATCH/s" "$SCRATCH/h"
[ -f "$SCRATCH/h/model.safetensors.index.json" ] || fail "--max-shard-size 4K: no index"
n=$(ls "$SCRATCH/h"/model-*-of-*.safetensors | wc -l)
[ "$n" -ge 3 ] || fail "--max-shard-size 4K: $n shards"
grep -q '"total_size": 16384' "$SCRATCH/h/model.safetensors.index.json" || fail "index total_size"
# The export's casts are dcp digest --dtype's (torch's .to()), NaNs included: synth's random
# float32 bit patterns hold some (the export wrote bfloat16 0x7FC0 where torch writes 0xFFFF,
# and dropped float16 payloads).
nans=$($D cat "$SCRATCH/s" model.layers.0.weight | python3 -c '
import sys, numpy
print(int(numpy.isnan(numpy.frombuffer(sys.stdin.buffer.read(), "<f4")).sum()))') || fail "counting NaNs"
[ "$nans" -gt 0 ] || fail "the source holds no NaN: the cast check would prove nothing"
# float64 too (the CLI refused it while dcpfs's hf_dtype took it)
$D convert -q --to hf --recipe "$SCRATCH/r.json" --config "$SCRATCH/c.json" --dtype float64 "$SCRATCH/s" "$SCRATCH/d64" ||
    fail "--dtype float64"
$D ls "$SCRATCH/d64/model.safetensors" | grep -q "^a.weight  *float64" || fail "--dtype float64 not applied"
for c in bfloat16:b float16:h float64:d64; do
    [ "$($D digest --dtype "${c%:*}" --keys model.layers.0.weight "$SCRATCH/s" | cut -d' ' -f1)" = \
      "$($D digest --keys a.weight "$SCRATCH/${c#*:}" | cut -d' ' -f1)" ] ||
        fail "--dtype ${c%:*}: the export's a.weight is not dcp digest --dtype ${c%:*}'s cast ($nans NaNs)"
done
# The template: shapes, counts and dtypes of the output.
$D convert -q --to hf --recipe "$SCRATCH/r.json" --keys model.layers.2.weight "$SCRATCH/s" "$SCRATCH/t" 2>/dev/null &&
    fail "no --config and a rule needing num_attention_heads: must fail"
sed 's/"num_attention_heads"/4/' "$SCRATCH/r.json" >"$SCRATCH/r2.json"
$D convert -q --to hf --recipe "$SCRATCH/r2.json" --dtype bfloat16 "$SCRATCH/s" "$SCRATCH/t"
python_free_json() { tr -d ' \n' <"$1"; }
cfg=$(python_free_json "$SCRATCH/t/config.json")
case "$cfg" in *'"hidden_size":16'*'"n":7'*'"torch_dtype":"bfloat16"'*) ;; *) fail "config template: $cfg" ;; esac

# Errors.
R="--to hf --recipe $SCRATCH/r.json --config $SCRATCH/c.json"
sed 's/model.layers.{L}.weight/other.{L}.weight/' "$SCRATCH/r.json" >"$SCRATCH/r3.json"
expect_fail "model.layers.3.weight: no rule of recipe test maps this key (1 key in all; --allow-unmapped" \
    $D convert --to hf --recipe "$SCRATCH/r3.json" --config "$SCRATCH/c.json" "$SCRATCH/s" "$SCRATCH/x"
[ ! -e "$SCRATCH/x" ] || fail "an unmapped key left a DST"
out=$($D convert --to hf --recipe "$SCRATCH/r3.json" --config "$SCRATCH/c.json" --allow-unmapped "$SCRATCH/s" \
    "$SCRATCH/x" 2>&1) || fail "--allow-unmapped"
case "$out" in *"skipped model.layers.3.weight: no rule of the recipe maps it"*) ;; *) fail "not reported: $out" ;; esac
expect_fail "recipe 'no-such': no such recipe (found: " $D convert --to hf --recipe no-such "$SCRATCH/s" "$SCRATCH/y"
expect_fail "llama-torchtitan" $D convert --to hf --recipe no-such "$SCRATCH/s" "$SCRATCH/y"
# No recipe anywhere (a build not installed yet): the error says where recipes come from; where
# some were found, it lists them instead. (The installed folder is searched last: skip the first
# where this prefix has recipes installed.)
mkdir -p "$SCRATCH/norecipes"
out=$(env DCP_RECIPE_PATH="$SCRATCH/norecipes" $D convert --to hf --recipe no-such "$SCRATCH/s" "$SCRATCH/y" 2>&1) || true
case "$out" in
    *"found: none; searched $SCRATCH/norecipes"*)
        case "$out" in *"or set DCP_RECIPE_PATH to a folder of recipes (the source tree's recipes/)"*) ;;
            *) fail "no recipe anywhere, no hint: $out" ;; esac ;;
    *"found: "*) echo "recipes installed under this prefix: the no-recipe case is not checked" ;;
    *) fail "no recipe anywhere: $out" ;;
esac
out=$($D convert --to hf --recipe no-such "$SCRATCH/s" "$SCRATCH/y" 2>&1) || true
case "$out" in *"make install"*) fail "a hint where recipes were found: $out" ;; esac
expect_fail "needs --recipe NAME" $D convert --to hf "$SCRATCH/s" "$SCRATCH/y"
expect_fail "go with --to hf" $D convert --recipe llama-megatron "$SCRATCH/s" "$SCRATCH/y"
expect_fail "needs the number of attention heads (num_attention_heads): give --config FILE" \
    $D convert --to hf --recipe "$SCRATCH/r.json" "$SCRATCH/s" "$SCRATCH/y"
expect_fail "/no/such.json: cannot open the config" $D convert $R --config /no/such.json "$SCRATCH/s" "$SCRATCH/y"
printf '{"num_attention_heads": 4,' >"$SCRATCH/bad.json"
expect_fail "bad.json: line 1: the config is not valid JSON" \
    $D convert --to hf --recipe "$SCRATCH/r.json" --config "$SCRATCH/bad.json" "$SCRATCH/s" "$SCRATCH/y"
echo '[4]' >"$SCRATCH/arr.json"
expect_fail "the config is not a JSON object" \
    $D convert --to hf --recipe "$SCRATCH/r.json" --config "$SCRATCH/arr.json" "$SCRATCH/s" "$SCRATCH/y"
expect_fail "already exists" $D convert $R "$SCRATCH/s" "$SCRATCH/o"
expect_fail "--dtype int8: float32, float16, bfloat16 or float64" $D convert $R --dtype int8 "$SCRATCH/s" "$SCRATCH/y"
echo '{"num_attention_heads": 5}' >"$SCRATCH/c5.json"
expect_fail "model.layers.2.weight: 128 rows are not a fused QKV of 5 query heads" \
    $D convert --to hf --recipe "$SCRATCH/r.json" --config "$SCRATCH/c5.json" "$SCRATCH/s" "$SCRATCH/y"
# Hostile recipes: each names the file and what is wrong.
bad_recipe() {   # bad_recipe "expected error" 'JSON'
    printf '%s' "$2" >"$SCRATCH/h.json"
    expect_fail "$1" $D convert --to hf --recipe "$SCRATCH/h.json" --config "$SCRATCH/c.json" "$SCRATCH/s" "$SCRATCH/y"
}
bad_recipe "h.json: line 1: not valid JSON" '{"recipe": '
bad_recipe "h.json: a recipe is a JSON object" '[]'
bad_recipe "h.json: \"recipe\" (its name) is missing" '{"rules": []}'
bad_recipe "h.json: unknown field 'rulez'" '{"recipe": "x", "rulez": []}'
bad_recipe "h.json: \"rules\" is not a list of 1 to 4096 rules" '{"recipe": "x", "rules": {}}'
bad_recipe "h.json: rule 0: not an object" '{"recipe": "x", "rules": [3]}'
bad_recipe "h.json: rule 0 (a): unknown op 'explode'" '{"recipe": "x", "rules": [{"from": "a", "to": "b", "op": "explode"}]}'
bad_recipe "split_qkv takes 3 output names, not 2" \
    '{"recipe": "x", "rules": [{"from": "a", "to": ["b", "c"], "op": "split_qkv", "heads": 2}]}'
bad_recipe "split_qkv needs \"heads\"" '{"recipe": "x", "rules": [{"from": "a", "to": ["b", "c", "d"], "op": "split_qkv"}]}'
bad_recipe "h.json: rule 0 (a): transpose is true or false" '{"recipe": "x", "rules": [{"from": "a", "to": "b", "transpose": 1}]}'
bad_recipe "merge_qkv takes 1 output names, not 3" \
    '{"recipe": "x", "rules": [{"from": "a", "to": ["b", "c", "d"], "op": "merge_qkv", "heads": 2}]}'
bad_recipe "merge_qkv needs \"heads\"" '{"recipe": "x", "rules": [{"from": "a", "to": "b", "op": "merge_qkv"}]}'
bad_recipe "heads: -1 is not in 1..16777216" \
    '{"recipe": "x", "rules": [{"from": "a", "to": "b", "op": "rope_permute", "heads": -1}]}'
bad_recipe "a placeholder is {NAME}" '{"recipe": "x", "rules": [{"from": "a.{}", "to": "b"}]}'
bad_recipe "two placeholders in a row" '{"recipe": "x", "rules": [{"from": "a.{L}{M}", "to": "b"}]}'
bad_recipe "uses {M}, which the pattern does not capture" '{"recipe": "x", "rules": [{"from": "a.{L}", "to": "b.{M}"}]}'
bad_recipe "maps no key of the checkpoint" '{"recipe": "x", "rules": [{"from": "a", "to": "b"}], "ignore": "model.*"}'
bad_recipe "both become b" '{"recipe": "x", "rules": [{"from": "model.layers.{L}.weight", "to": "b"}]}'
head -c 2000000 /dev/zero | tr '\0' ' ' >"$SCRATCH/huge.json"
expect_fail "a recipe is a file of at most 1048576 bytes" \
    $D convert --to hf --recipe "$SCRATCH/huge.json" --config "$SCRATCH/c.json" "$SCRATCH/s" "$SCRATCH/y"
[ ! -e "$SCRATCH/y" ] || fail "a failed export left DST"

# A read error midway (a shard truncated after the open's checks pass: the data is read
# only during the write) leaves neither DST nor its temporary folder.
$D synth "$SCRATCH/s2" --keys 4 --shape 128,16 --dtype float32 --ranks 2 --shard rows --seed 5 >/dev/null
truncate -s 3000 "$SCRATCH/s2/__1_0.distcp"
expect_fail "" $D convert $R "$SCRATCH/s2" "$SCRATCH/z"
[ ! -e "$SCRATCH/z" ] || fail "a failed export left DST"
ls -a "$SCRATCH" | grep -q '\.z\.tmp' && fail "a failed export left its temporary folder: $(ls -a "$SCRATCH")"

# Memory: 16 fused QKVs of 3072x1024 float32 (192 MiB, 4 ranks by columns) split, permuted
# (each q and k row read alone) and cast to bfloat16: the peak RSS stays under 64 MiB.
if ldd "$top_builddir/.libs/libdcp.so" 2>/dev/null | grep -q libasan || [ ! -x /usr/bin/time ]; then
    echo "RSS check skipped (sanitizer build, or no /usr/bin/time)"
else
    $D synth "$SCRATCH/big" --keys 16 --shape 3072,1024 --dtype float32 --ranks 4 --shard cols --seed 3 >/dev/null
    cat >"$SCRATCH/big.json" <<'J'
{"recipe": "big", "rules": [{"from": "model.layers.{L}.weight", "op": "split_qkv", "heads": 8, "kv_heads": 2,
  "rope": "to_hf", "to": ["l.{L}.q", "l.{L}.k", "l.{L}.v"]}], "config": {"model_type": "test"}}
J
    /usr/bin/time -f '%M' -o "$SCRATCH/rss" $D convert -q --no-sync --to hf --recipe "$SCRATCH/big.json" \
        --dtype bfloat16 --max-shard-size 40M "$SCRATCH/big" "$SCRATCH/bigout" || fail "the 192 MiB export failed"
    kb=$(tail -1 "$SCRATCH/rss")
    echo "export of 192 MiB (split_qkv + rope_permute + bfloat16): peak RSS $kb KiB"
    [ "$kb" -le 65536 ] || fail "peak RSS $kb KiB > 64 MiB"
    # Spot check: v head 1 of key 15 = rows 2816..3071 (head_dim 256, group 1 ends with its v).
    $D convert -q --to hf --recipe "$SCRATCH/big.json" --keys model.layers.15.weight "$SCRATCH/big" "$SCRATCH/b32"
    $D cat "$SCRATCH/big" model.layers.15.weight --box 2816:256,0:1024 | sha256sum >"$SCRATCH/want"
    $D cat "$SCRATCH/b32/model.safetensors" l.15.v --box 256:256,0:1024 | sha256sum | cmp -s - "$SCRATCH/want" ||
        fail "big: l.15.v head 1 differs"
    # The same 192 MiB merged into q | k | v and transposed (GPT-2's c_attn, [1024, 3072]), cast:
    # blocks of source columns through the 4 MiB staging buffer, the peak RSS under 64 MiB too.
    cat >"$SCRATCH/bigt.json" <<'J'
{"recipe": "bigt", "rules": [{"from": "model.layers.{L}.weight", "op": "merge_qkv", "heads": 8, "kv_heads": 2,
  "transpose": true, "to": "l.{L}.c_attn"}], "config": {"model_type": "test"}}
J
    /usr/bin/time -f '%M' -o "$SCRATCH/rss" $D convert -q --no-sync --to hf --recipe "$SCRATCH/bigt.json" \
        --dtype bfloat16 --max-shard-size 40M "$SCRATCH/big" "$SCRATCH/bigtout" || fail "the 192 MiB transpose failed"
    kb=$(tail -1 "$SCRATCH/rss")
    echo "export of 192 MiB (merge_qkv + transpose + bfloat16): peak RSS $kb KiB"
    [ "$kb" -le 65536 ] || fail "transpose: peak RSS $kb KiB > 64 MiB"
    # Columns of key 15's c_attn are fused rows (head_dim 256, 4 query heads a group): q head 4
    # (column 1024) is row 1536, group 0's k (2048) row 1024, its v (2560) row 1280.
    $D convert -q --to hf --recipe "$SCRATCH/bigt.json" --keys model.layers.15.weight "$SCRATCH/big" "$SCRATCH/bt32"
    for kv in 0:0 1024:1536 2048:1024 2303:1279 2560:1280 3071:3071; do
        k=${kv%%:*} s=${kv##*:}
        $D cat "$SCRATCH/bt32/model.safetensors" l.15.c_attn --box "0:1024,$k:1" |
            cmp -s - <($D cat "$SCRATCH/big" model.layers.15.weight --box "$s:1,0:1024") ||
            fail "big: column $k of l.15.c_attn is not fused row $s"
    done
fi
echo ok
