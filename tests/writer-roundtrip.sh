# Every bundled fixture -> torch.save -> DCP -> safetensors -> DCP, each stage checked key by key
# against the fixture's manifest (sha256 of `dcp cat`): bytes items survive DCP <-> torch.save (and
# the .pt lists and reads them) and are reported and skipped for safetensors. Also: --keys subsets, --nested, sharded safetensors.
. "$top_srcdir/tests/lib.sh"
need python3
scratch
CHECK="python3 $top_srcdir/tests/writer_check.py $DCP"
for case in "$FIXTURES"/*/; do
    case=${case%/}
    name=$(basename "$case")
    m="$case/expected/manifest.json"
    o="$SCRATCH/$name"
    mkdir "$o"
    $DCP convert "$case/ckpt" "$o/a.pt" || fail "$name: DCP -> torch.save"
    $CHECK "$o/a.pt" "$m" >/dev/null || fail "$name: a.pt (bytes items read in place from its data.pkl)"
    $DCP convert "$o/a.pt" "$o/b" || fail "$name: torch.save -> DCP"
    $CHECK "$o/b" "$m" >/dev/null || fail "$name: b (bytes items carried over)"
    $DCP convert "$o/b" "$o/c.safetensors" 2>"$o/skipped" || fail "$name: DCP -> safetensors"
    $CHECK "$o/c.safetensors" "$m" --no-bytes >/dev/null || fail "$name: c.safetensors"
    nbytes=$(python3 -c "import json,sys; print(sum(e['kind']=='bytes' for e in json.load(open(sys.argv[1]))['entries']))" "$m")
    [ "$(grep -c 'skipped' "$o/skipped")" = "$nbytes" ] || fail "$name: $nbytes bytes items should be reported as skipped"
    $DCP convert "$o/c.safetensors" "$o/d" || fail "$name: safetensors -> DCP"
    $CHECK "$o/d" "$m" --no-bytes >/dev/null || fail "$name: d"
    # Nothing is left under a temporary name.
    ls -A "$o" | grep -q 'tmp' && fail "$name: temporary files left: $(ls -A "$o")"
    echo "ok $name"
done

# complex128: safetensors names no such dtype (C64 only; a "C128" header fails safetensors'
# own load of the whole file): reported and left out, the rest loadable.
$DCP synth "$SCRATCH/c128" --keys 2 --shape 3,5 --dtype complex128 >/dev/null || fail "synth complex128"
$DCP convert "$SCRATCH/c128" "$SCRATCH/c128.pt" || fail "complex128 to torch.save"
python3 - "$SCRATCH/c128.pt" <<'PY' || fail "the complex128 tensors, the float32 one, in one torch.save file"
import sys, torch, warnings
warnings.filterwarnings("ignore")
sd = torch.load(sys.argv[1], weights_only=True)
sd["x"] = torch.ones(4)
torch.save(sd, sys.argv[1].replace(".pt", "-mixed.pt"))
PY
$DCP convert "$SCRATCH/c128-mixed.pt" "$SCRATCH/c128.safetensors" 2>"$SCRATCH/c128.err" ||
    fail "complex128 beside float32 to safetensors: $(cat "$SCRATCH/c128.err")"
[ "$(grep -c 'skipped .*: safetensors has no such dtype' "$SCRATCH/c128.err")" = 2 ] ||
    fail "the complex128 keys are not reported as skipped: $(cat "$SCRATCH/c128.err")"
if python3 -c 'import safetensors' 2>/dev/null; then
    python3 -c 'import sys; from safetensors.numpy import load_file; assert list(load_file(sys.argv[1])) == ["x"]' \
        "$SCRATCH/c128.safetensors" || fail "safetensors cannot load the output"
fi

# A subset by pattern and by dotted prefix.
m="$FIXTURES/05_mixed_2ranks/expected/manifest.json"
$DCP convert --keys enc "$FIXTURES/05_mixed_2ranks/ckpt" "$SCRATCH/enc.pt"
$CHECK "$SCRATCH/enc.pt" "$m" --no-bytes --keys enc >/dev/null || fail "--keys enc"
$DCP convert --keys 'enc.*' "$FIXTURES/05_mixed_2ranks/ckpt" "$SCRATCH/enc2"
$CHECK "$SCRATCH/enc2" "$m" --keys enc >/dev/null || fail "--keys 'enc.*'"

# Nested dicts in torch.save flatten back to the same tensors; bytes items holding plain data
# are those values in the .pt (torch.load of the stored blob), as dcp_to_torch_save gives them
# (a dict value then flattens to its keys, config.act, as dcp.save would store it).
$DCP convert --nested "$FIXTURES/05_mixed_2ranks/ckpt" "$SCRATCH/nested.pt"
$DCP convert "$SCRATCH/nested.pt" "$SCRATCH/nested"
$CHECK "$SCRATCH/nested" "$m" --tensors >/dev/null || fail "--nested round trip"
for k in epoch config written_by; do
    $DCP cat "$FIXTURES/05_mixed_2ranks/ckpt" $k >"$SCRATCH/blob-$k"
    python3 -c "
import io, sys, torch
v = torch.load(sys.argv[1], weights_only=True)[sys.argv[3]]
want = torch.load(sys.argv[2], weights_only=False)
assert type(v) is type(want) and v == want, (v, want)" "$SCRATCH/nested.pt" "$SCRATCH/blob-$k" $k ||
        fail "--nested: value of $k"
done
$DCP cat "$SCRATCH/nested" config.act >"$SCRATCH/act" && python3 -c "
import sys, torch; assert torch.load(sys.argv[1], weights_only=True) == 'gelu'" "$SCRATCH/act" ||
    fail "--nested round trip: config.act"

# Sharded safetensors: a folder of shards and an index, read back as a checkpoint.
$DCP convert --max-shard-size 2K "$FIXTURES/05_mixed_2ranks/ckpt" "$SCRATCH/shards" 2>/dev/null
[ -f "$SCRATCH/shards/model.safetensors.index.json" ] || fail "no index in the sharded output"
n=$(ls "$SCRATCH/shards"/model-*-of-*.safetensors | wc -l)
[ "$n" -gt 1 ] || fail "expected several shards, got $n"
$CHECK "$SCRATCH/shards" "$m" --no-bytes >/dev/null || fail "sharded safetensors"
$DCP convert "$SCRATCH/shards" "$SCRATCH/from-shards"
$CHECK "$SCRATCH/from-shards" "$m" --no-bytes >/dev/null || fail "sharded safetensors -> DCP"
# The index is what says no shard is missing: a lost shard, a key no shard
# holds, a name that is not a plain shard name or a damaged index is an error
# naming the index and the key, never a smaller model.
bad="$SCRATCH/shards-bad"
cp -r "$SCRATCH/shards" "$bad"
first=$(ls "$bad"/model-*-of-*.safetensors | head -1)
rm "$first"
# (with model-I-of-N names, the count in the names says it first)
expect_fail "a partial checkpoint: 3 of 4 shard files" $DCP ls "$bad"
# other names: the index says it
python3 - "$bad" <<'PY'
import json, os, sys
d = sys.argv[1]; p = os.path.join(d, "model.safetensors.index.json"); idx = json.load(open(p))
for f in sorted(set(idx["weight_map"].values())):
    if os.path.exists(os.path.join(d, f)):
        os.rename(os.path.join(d, f), os.path.join(d, "part-" + f[6:11] + ".safetensors"))
idx["weight_map"] = {k: "part-" + f[6:11] + ".safetensors" for k, f in idx["weight_map"].items()}
json.dump(idx, open(p, "w"))
PY
expect_fail "its shard part-00001.safetensors is missing from the folder" $DCP ls "$bad"
rm -r "$bad"; cp -r "$SCRATCH/shards" "$bad"
python3 - "$bad/model.safetensors.index.json" <<'PY'
import json, sys
p = sys.argv[1]; d = json.load(open(p))
d["weight_map"]["no.such.key"] = sorted(d["weight_map"].values())[0]
json.dump(d, open(p, "w"))
PY
expect_fail "model.safetensors.index.json: no.such.key: listed (in model-00001-of-" $DCP ls "$bad"
python3 - "$bad/model.safetensors.index.json" <<'PY'
import json, sys
p = sys.argv[1]; d = json.load(open(p))
del d["weight_map"]["no.such.key"]
d["weight_map"]["enc.weight"] = "../elsewhere.safetensors"
json.dump(d, open(p, "w"))
PY
expect_fail "enc.weight: the file it names is not the plain name of a .safetensors file" $DCP ls "$bad"
printf '{"weight_map": {' >"$bad/model.safetensors.index.json"
expect_fail "model.safetensors.index.json: not valid JSON" $DCP ls "$bad"
echo "ok subsets, nested, shards, index checks"
