# dcpfs -o view=hf:RECIPE: a mount holds the folder `dcp convert --to hf --recipe RECIPE` writes,
# file for file and byte for byte (cmp), for a rename, a split, a fused QKV split with its q/k rows
# permuted, a permutation back, transposes (after merge_qkv and split too), with and without
# casts, in one shard and in many, of empty tensors with a dimension of 2^62, with --config's
# copy and with the recipe's template; random (offset, length) reads equal the export's bytes,
# elements cut by a read's ends included;
# folder mode shows every checkpoint as its export; recipe errors fail the mount with the
# export's message; the daemon's peak RSS stays bounded while 64 MiB are cast through it. With
# torch and transformers installed, AutoModelForCausalLM.from_pretrained of a mount gives
# exactly the logits of the exported folder (torchtitan's Llama with --config, Megatron-Core's
# with the config from common.pt and sharded with an index; GPT-2 from Megatron-Core, transposed).
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_fuse
fuse_scratch
export DCP_RECIPE_PATH="$top_srcdir/recipes"
D="$DCP --no-catalog"
S=$SCRATCH

# 4 keys of 128x16 float32 over 2 ranks by columns; 4 keys of 96x7 bfloat16 by rows (odd
# row sizes: outputs start at offsets that cut elements and pages).
$D synth "$S/s" --keys 4 --shape 128,16 --dtype float32 --ranks 2 --shard cols --seed 5 >/dev/null
$D synth "$S/odd" --keys 4 --shape 96,7 --dtype bfloat16 --ranks 2 --shard rows --seed 7 >/dev/null
cat >"$S/r.json" <<'J'
{"recipe": "test", "unstack": ["L"],
 "rules": [
  {"from": "model.layers.0.weight", "to": "a.weight"},
  {"from": "model.layers.1.weight", "op": "split_gate_up", "to": ["gate.weight", "up.weight"]},
  {"from": "model.layers.2.weight", "op": "split_qkv", "heads": "num_attention_heads", "kv_heads": 2,
   "rope": "to_hf", "to": ["q.weight", "k.weight", "v.weight"]},
  {"from": "model.layers.{L}.weight", "op": "rope_permute", "heads": 8, "rope": "from_hf", "to": "p.{L}.weight"}],
 "config": {"model_type": "test", "hidden_size": {"$shape": ["a.weight", 1]}, "n": {"$count": "*.weight"},
            "torch_dtype": {"$dtype": "a.weight"}}}
J
echo '{"num_attention_heads": 4}' >"$S/c.json"
sed 's/"num_attention_heads"/4/' "$S/r.json" >"$S/r2.json"

# same_as_export NAME SRC "CONVERT FLAGS" "DCPFS OPTIONS": export, mount, compare the listings,
# random reads of every file (first, uncached) and every file whole.
n=0
same_as_export() {
    local name=$1 src=$2 flags=$3 opts=$4
    n=$((n + 1))
    # shellcheck disable=SC2086 # flags are words
    $D convert -q --no-sync --to hf $flags "$src" "$S/e-$name" || fail "$name: dcp convert --to hf $flags"
    mount_dcpfs "$src" "$S/m-$name" -o "$opts"
    [ "$(ls -A "$S/m-$name")" = "$(ls -A "$S/e-$name")" ] ||
        fail "$name: the mount lists $(ls -A "$S/m-$name" | tr '\n' ' '), the export $(ls -A "$S/e-$name" | tr '\n' ' ')"
    python3 - "$S/e-$name" "$S/m-$name" <<'PY' || fail "$name: random reads differ"
import os, random, sys
exp, mnt = sys.argv[1:]
rng = random.Random(15)
reads = 0
for name in sorted(os.listdir(exp)):
    want = open(os.path.join(exp, name), "rb").read()
    # O_DIRECT: each read reaches the daemon with its own offset and length (no page cache)
    fd = os.open(os.path.join(mnt, name), os.O_RDONLY | os.O_DIRECT)
    for _ in range(150):
        off = rng.randrange(len(want) + 16)
        ln = rng.choice([1, 2, 3, 5, 7, 64, 1000, 4096, rng.randrange(1, 70000)])
        got = os.pread(fd, ln, off)
        assert got == want[off:off + ln], f"{name}: [{off}, +{ln}): {len(got)} bytes differ"
        reads += 1
    os.close(fd)
print(f"{mnt}: {reads} random reads equal the export")
PY
    for f in "$S/e-$name"/*; do
        cmp "$f" "$S/m-$name/${f##*/}" || fail "$name: ${f##*/} differs from dcp convert's"
        [ "$(stat -c %s "$f")" = "$(stat -c %s "$S/m-$name/${f##*/}")" ] || fail "$name: ${f##*/}: sizes differ"
    done
}
# One shard: config.json copied, a rename, splits, permutations (uncached reads through the
# catalog-served model of the default mount options).
same_as_export plain "$S/s" "--recipe $S/r.json --config $S/c.json" "view=hf:$S/r.json,hf_config=$S/c.json"
[ -f "$S/m-plain/model.safetensors" ] && [ ! -e "$S/m-plain/model.safetensors.index.json" ] ||
    fail "one shard: model.safetensors without an index"
unmount_dcpfs "$S/m-plain"
# Cast and shards: 5 shards of at most 4 KiB with the index; bfloat16 rounding.
same_as_export f16 "$S/s" "--recipe $S/r.json --config $S/c.json --dtype float16 --max-shard-size 4K" \
    "no_catalog,view=hf:$S/r.json,hf_config=$S/c.json,hf_dtype=float16,hf_max_shard_size=4K"
[ "$(ls "$S/m-f16"/model-*-of-00005.safetensors | wc -l)" = 5 ] || fail "f16: not 5 shards: $(ls "$S/m-f16")"
unmount_dcpfs "$S/m-f16"
same_as_export bf16 "$S/s" "--recipe $S/r2.json --dtype bfloat16" "no_catalog,view=hf:$S/r2.json,hf_dtype=bfloat16"
grep -q '"torch_dtype": "bfloat16"' "$S/m-bf16/config.json" || fail "bf16: the template's dtype: $(cat "$S/m-bf16/config.json")"
unmount_dcpfs "$S/m-bf16"
# bfloat16 96x7 to float32 in shards of 3000 bytes: tensors begin mid-element and mid-page.
same_as_export odd "$S/odd" "--recipe $S/r2.json --dtype float32 --max-shard-size 3000" \
    "no_catalog,view=hf:$S/r2.json,hf_dtype=float32,hf_max_shard_size=3000"
unmount_dcpfs "$S/m-odd"
same_as_export oddraw "$S/odd" "--recipe $S/r.json --config $S/c.json --max-shard-size 1000 --keys model.layers.[23].weight" \
    "no_catalog,view=hf:$S/r.json,hf_config=$S/c.json,hf_max_shard_size=1000,hf_keys=model.layers.[23].weight"
unmount_dcpfs "$S/m-oddraw"
# transpose (and merge_qkv before it) with and without casts, in shards that cut elements:
# random reads start and end mid-row and mid-element of a transposed output, and a small
# read's staging buffer holds less than one source column.
cat >"$S/rt.json" <<'J'
{"recipe": "transposes",
 "rules": [
  {"from": "model.layers.0.weight", "to": "t.weight", "transpose": true},
  {"from": "model.layers.1.weight", "op": "merge_qkv", "heads": 4, "kv_heads": 2, "to": "qkv.weight",
   "transpose": true},
  {"from": "model.layers.{L}.weight", "op": "split", "to": ["lo.{L}", "hi.{L}"], "transpose": true}],
 "config": {"model_type": "test"}}
J
same_as_export tr "$S/s" "--recipe $S/rt.json --max-shard-size 5000" \
    "no_catalog,view=hf:$S/rt.json,hf_max_shard_size=5000"
unmount_dcpfs "$S/m-tr"
same_as_export trodd "$S/odd" "--recipe $S/rt.json --dtype float32 --max-shard-size 3000" \
    "no_catalog,view=hf:$S/rt.json,hf_dtype=float32,hf_max_shard_size=3000"
unmount_dcpfs "$S/m-trodd"
# Empty tensors with a huge dimension ([2^62, 0], which torch saves and loads): every op, with
# and without a transpose, gives the empty outputs torch would, cast, in the mount as in the export.
$D synth "$S/empty" --keys 5 --shape 4611686018427387904,0 --dtype float32 --ranks 2 --shard cols --seed 3 >/dev/null
cat >"$S/re.json" <<'J'
{"recipe": "empties",
 "rules": [
  {"from": "model.layers.0.weight", "op": "rope_permute", "heads": 8, "to": "p"},
  {"from": "model.layers.1.weight", "op": "split_qkv", "heads": 4, "kv_heads": 2, "rope": "to_hf", "to": ["q", "k", "v"]},
  {"from": "model.layers.2.weight", "op": "merge_qkv", "heads": 4, "kv_heads": 2, "to": "qkv", "transpose": true},
  {"from": "model.layers.3.weight", "op": "split_gate_up", "to": ["g", "u"], "transpose": true},
  {"from": "model.layers.4.weight", "to": "t"}],
 "config": {"model_type": "test", "rows": {"$shape": ["qkv", 1]}}}
J
same_as_export empty "$S/empty" "--recipe $S/re.json --dtype bfloat16" "no_catalog,view=hf:$S/re.json,hf_dtype=bfloat16"
python3 - "$S/m-empty/model.safetensors" <<'PY' || fail "empty: the export's header"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    rest = f.read()
got = {k: (v["dtype"], v["shape"], v["data_offsets"]) for k, v in h.items() if k != "__metadata__"}
r = 2**62
want = {"p": [r, 0], "q": [r // 2, 0], "k": [r // 4, 0], "v": [r // 4, 0], "qkv": [0, r],
        "g": [0, r // 2], "u": [0, r // 2], "t": [r, 0]}
assert got == {k: ("BF16", s, [0, 0]) for k, s in want.items()} and rest == b"", got
PY
grep -q '"rows": 4611686018427387904' "$S/m-empty/config.json" || fail "empty: config.json: $(cat "$S/m-empty/config.json")"
unmount_dcpfs "$S/m-empty"

# Folder mode: each checkpoint of a run is its export.
mkdir -p "$S/run"
cp -r "$S/s" "$S/run/step_1"
cp -r "$S/odd" "$S/run/step_2"
mount_dcpfs "$S/run" "$S/m-run" -o "no_catalog,view=hf:$S/r2.json"
for st in 1 2; do
    src=$S/s; [ $st = 2 ] && src=$S/odd
    $D convert -q --no-sync --to hf --recipe "$S/r2.json" "$src" "$S/e-run$st"
    for f in "$S/e-run$st"/*; do
        cmp "$f" "$S/m-run/step_$st/${f##*/}" || fail "folder mode: step_$st/${f##*/} differs"
    done
done
unmount_dcpfs "$S/m-run"
# A recipe named from a relative $DCP_RECIPE_PATH in folder mode, where a checkpoint's view
# is laid out on first use, by a daemon that works from "/": it was not found (EIO).
mkdir -p "$S/rdir"
cp "$S/r2.json" "$S/rdir/relname.json"
cd "$S"
DCP_RECIPE_PATH=nosuch:rdir mount_dcpfs "$S/run" "$S/m-rel" -o "no_catalog,view=hf:relname"
cd - >/dev/null
for f in "$S/e-run1"/*; do
    cmp "$f" "$S/m-rel/step_1/${f##*/}" || fail "relative DCP_RECIPE_PATH: step_1/${f##*/}: $(cat "$S/m-rel.log")"
done
unmount_dcpfs "$S/m-rel"

# Errors fail the mount with the export's message, and nothing stays mounted.
mnt=$S/m-err
mkdir -p "$mnt"
MOUNTS+=("$mnt")
T="timeout 30 $DCPFS -f -o no_catalog"
expect_fail "recipe 'nosuch': no such recipe (found: " $T,view=hf:nosuch "$S/s" "$mnt"
sed 's/model.layers.{L}.weight/other.{L}.weight/' "$S/r.json" >"$S/r3.json"
expect_fail "model.layers.3.weight: no rule of recipe test maps this key (1 key in all" \
    $T,view=hf:"$S/r3.json",hf_config="$S/c.json" "$S/s" "$mnt"
# (the way to give config.json named as dcpfs takes it: the message named dcp convert's --config alone)
expect_fail "rule 'model.layers.2.weight' of recipe test needs the number of attention heads (num_attention_heads): give --config FILE (dcpfs: -o hf_config=FILE)" \
    $T,view=hf:"$S/r.json" "$S/s" "$mnt"
expect_fail "$S/nope.json: cannot open the config" $T,view=hf:"$S/r.json",hf_config="$S/nope.json" "$S/s" "$mnt"
expect_fail "-o hf_dtype=int8: expected float32" $T,view=hf:"$S/r.json",hf_dtype=int8 "$S/s" "$mnt"
expect_fail "-o hf_max_shard_size=lots: expected a size" $T,view=hf:"$S/r.json",hf_max_shard_size=lots "$S/s" "$mnt"
expect_fail "go with -o view=hf:RECIPE" $T,hf_dtype=bfloat16 "$S/s" "$mnt"
mountpoint -q "$mnt" && fail "a failed mount left $mnt mounted"
# With hf_allow_unmapped the unmapped key is left out, as --allow-unmapped does.
same_as_export unmapped "$S/s" "--recipe $S/r3.json --config $S/c.json --allow-unmapped" \
    "no_catalog,view=hf:$S/r3.json,hf_config=$S/c.json,hf_allow_unmapped"
unmount_dcpfs "$S/m-unmapped"
# In folder mode a checkpoint the recipe cannot map answers EIO (the rest of the run is served).
mkdir -p "$S/run2"
cp -r "$S/s" "$S/run2/step_1"
mount_dcpfs "$S/run2" "$S/m-run2" -o "no_catalog,view=hf:$S/r3.json,hf_config=$S/c.json"
ls "$S/m-run2/step_1" >/dev/null 2>&1 && fail "folder mode: an unmapped key did not fail the checkpoint"
grep -q "no rule of recipe test maps this key" "$S/m-run2.log" || fail "folder mode: no log line: $(cat "$S/m-run2.log")"
unmount_dcpfs "$S/m-run2"

# Memory: 64 MiB of float32 (4 keys of 2048x2048, by columns) split, permuted and cast to
# bfloat16 through the mount, read in 1 MiB pieces: the daemon's peak RSS stays far below a tensor.
$D synth "$S/big" --keys 4 --shape 2048,2048 --dtype float32 --ranks 2 --shard cols --seed 9 >/dev/null
mount_dcpfs "$S/big" "$S/m-big" -o "no_catalog,view=hf:$S/r2.json,hf_dtype=bfloat16"
start=$(date +%s.%N)
cat "$S/m-big"/model.safetensors >/dev/null
end=$(date +%s.%N)
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$DCPFS_PID/status")
size=$(stat -c %s "$S/m-big/model.safetensors")
echo "view=hf of 64 MiB cast to bfloat16: $size bytes read in $(echo "$end - $start" | bc) s; daemon VmHWM ${hwm} kB"
[ "$hwm" -lt 40960 ] || fail "the daemon's peak RSS is ${hwm} kB reading a 32 MiB view (a tensor is 16 MiB)"
$D convert -q --no-sync --to hf --recipe "$S/r2.json" --dtype bfloat16 "$S/big" "$S/e-big"
cmp "$S/e-big/model.safetensors" "$S/m-big/model.safetensors" || fail "big: differs from dcp convert's"
unmount_dcpfs "$S/m-big"
rm -rf "$S/big" "$S/e-big"

# from_pretrained on the mount.
if ! python3 -c "import torch, transformers" 2>/dev/null; then
    echo "torch or transformers is not installed: from_pretrained on the mount not checked"
    exit 0
fi
PY="python3 $top_srcdir/tests/interop/export_hf.py"
$PY make-llama "$S/py" >/dev/null 2>&1 || { $PY make-llama "$S/py-again"; fail "building the Llama checkpoints"; }
$D convert -q --no-sync --to hf --recipe llama-torchtitan --config "$S/py/llama-config.json" "$S/py/tt" "$S/py/o-tt"
mount_dcpfs "$S/py/tt" "$S/m-tt" -o "view=hf:llama-torchtitan,hf_config=$S/py/llama-config.json"
tt_pid=$DCPFS_PID
$D convert -q --no-sync --to hf --recipe llama-megatron --max-shard-size 60K "$S/py/mc" "$S/py/o-mc"
mount_dcpfs "$S/py/mc" "$S/m-mc" -o "view=hf:llama-megatron,hf_max_shard_size=60K"
mc_pid=$DCPFS_PID
[ -f "$S/m-mc/model.safetensors.index.json" ] || fail "mc: no index on the mount: $(ls "$S/m-mc")"
for m in tt mc; do
    for f in "$S/py/o-$m"/*; do cmp "$f" "$S/m-$m/${f##*/}" || fail "$m: ${f##*/} differs from dcp convert's"; done
done
# GPT-2 from Megatron-Core (its Conv1D weights transposed on read), config.json from common.pt.
$D convert -q --no-sync --to hf --recipe gpt2-megatron --max-shard-size 20K "$S/py/gpt2" "$S/py/o-gpt2"
mount_dcpfs "$S/py/gpt2" "$S/m-gpt2" -o "view=hf:gpt2-megatron,hf_max_shard_size=20K"
for f in "$S/py/o-gpt2"/*; do cmp "$f" "$S/m-gpt2/${f##*/}" || fail "gpt2: ${f##*/} differs from dcp convert's"; done
$PY same "$S/m-tt" "$S/py/o-tt" float32 && $PY same "$S/m-mc" "$S/py/o-mc" float32 &&
    $PY same "$S/m-tt" "$S/py/o-tt" bfloat16 && $PY check "$S/py/ref-llama" "$S/m-mc" float32 \
    "$S/py/ref-gpt2" "$S/m-gpt2" float32 || fail "from_pretrained on the mount"
unmount_dcpfs "$S/m-gpt2"
unmount_dcpfs "$S/m-mc" "$mc_pid"
unmount_dcpfs "$S/m-tt" "$tt_pid"
echo ok
