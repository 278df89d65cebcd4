#!/bin/bash
# dcp diff --content between formats: the same weights as DCP sharded by
# rows on 2 ranks, as safetensors, torch.save, a Hugging Face folder of
# shards and (for the Megatron fixture) Megatron's torch_dist folder compare
# equal every way round; one flipped element in any of them is reported as
# exactly that key's values; --dtype bfloat16 compares a bfloat16 export
# with its float32 source (and finds a changed element in it); the diff of
# 64 MiB a side stays in bounded memory.
. "$top_srcdir/tests/lib.sh"
need python3
scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
S=$SCRATCH
"$DCP" synth "$S/rows2" --keys 6 --shape 64,48 --dtype float32 --ranks 2 --shard rows --seed 9 >/dev/null
"$DCP" convert --quiet "$S/rows2" "$S/all.safetensors"
"$DCP" convert --quiet "$S/rows2" "$S/all.pt"
"$DCP" convert --quiet --max-shard-size 30000 "$S/rows2" "$S/hf"
[ "$(ls "$S/hf"/*.safetensors | wc -l)" -gt 1 ] || fail "the HF folder has one shard: $(ls "$S/hf")"

same() {   # same A B: exit 0, "no differences"
    local rc=0
    "$DCP" diff --content "$@" >"$S/out" 2>&1 || rc=$?
    [ $rc = 0 ] && [ "$(cat "$S/out")" = "no differences" ] || fail "diff --content $*: exit $rc: $(cat "$S/out")"
}
differs() {   # differs KEY A B: exit 1, exactly "values: KEY differ"
    local key=$1 rc=0; shift
    "$DCP" diff --content "$@" >"$S/out" 2>&1 || rc=$?
    [ $rc = 1 ] && [ "$(cat "$S/out")" = "values: $key differ" ] || fail "diff --content $*: exit $rc: $(cat "$S/out") (want values: $key differ)"
}
srcs="rows2 all.safetensors all.pt hf"
for x in $srcs; do
    for y in $srcs; do
        [ "$x" = "$y" ] || same "$S/$x" "$S/$y"
    done
done

# flip one element of the third key (by name order) in the safetensors file
cp "$S/all.safetensors" "$S/flip.safetensors"
key=$(python3 - "$S/flip.safetensors" <<'PY'
import json, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = int.from_bytes(b[:8], "little")
hdr = json.loads(b[8:8 + n])
key = sorted(k for k in hdr if k != "__metadata__")[2]
b[8 + n + hdr[key]["data_offsets"][0] + 4 * 1500] ^= 0x01   # element 1500: rank 1's rows
open(p, "wb").write(b)
print(key)
PY
)
for x in rows2 all.pt hf all.safetensors; do
    differs "$key" "$S/$x" "$S/flip.safetensors"
    differs "$key" "$S/flip.safetensors" "$S/$x"
done
# the same flip carried into DCP (2 ranks again: via torch.save of the flipped file)
"$DCP" convert --quiet "$S/flip.safetensors" "$S/flip.pt"
differs "$key" "$S/rows2" "$S/flip.pt"
differs "$key" "$S/flip.pt" "$S/hf"

# Megatron's torch_dist folder against its conversions: torch.save keeps its bytes items (read in
# place from the .pt's data.pkl), safetensors has no place for them
M="$FIXTURES/09_megatron_torch_dist/ckpt"
"$DCP" convert --quiet "$M" "$S/meg.safetensors"
"$DCP" convert --quiet "$M" "$S/meg.pt"
rc=0; "$DCP" diff --content "$M" "$S/meg.safetensors" >"$S/out" || rc=$?
[ $rc = 1 ] && grep -q '^only in A: rng_state/' "$S/out" && [ "$(grep -v '^only in A: rng_state/' "$S/out")" = "" ] ||
    fail "Megatron vs safetensors: $(cat "$S/out")"
same "$M" "$S/meg.pt"
same "$S/meg.pt" "$M"
rc=0; "$DCP" diff --content "$S/meg.safetensors" "$S/meg.pt" >"$S/out" || rc=$?
[ $rc = 1 ] && [ "$(grep -v '^only in B: rng_state/' "$S/out")" = "" ] || fail "safetensors vs .pt: $(cat "$S/out")"

# --dtype: a bfloat16 export against its float32 source
if python3 -c 'import torch, safetensors' 2>/dev/null; then
    python3 - "$S/all.safetensors" "$S/bf16.safetensors" "$S/bf16flip.safetensors" "$key" <<'PY'
import sys, torch
from safetensors.torch import load_file, save_file
t = {k: v.to(torch.bfloat16) for k, v in load_file(sys.argv[1]).items()}
save_file(t, sys.argv[2])
t[sys.argv[4]].view(-1).view(torch.int16)[7] ^= 1   # one bit of element 7
save_file(t, sys.argv[3])
PY
    rc=0; "$DCP" diff --content "$S/rows2" "$S/bf16.safetensors" >"$S/out" || rc=$?
    [ $rc = 1 ] && grep -q '^dtype: .*: float32 -> bfloat16$' "$S/out" || fail "without --dtype: $(cat "$S/out")"
    same --dtype bfloat16 "$S/rows2" "$S/bf16.safetensors"
    same --dtype bfloat16 "$S/bf16.safetensors" "$S/hf"
    differs "$key" --dtype bfloat16 "$S/rows2" "$S/bf16flip.safetensors"
else
    echo "no torch/safetensors in python3: --dtype against a torch export is not checked"
fi
expect_fail "--dtype int8" "$DCP" diff --content --dtype int8 "$S/rows2" "$S/hf"

# bounded memory: 64 MiB a side, one byte changed in the last piece (the RSS
# bound is not checked in a sanitizer build: its shadow memory and quarantine)
rss_max=60
if ldd "$top_builddir/dcp" "$top_builddir/.libs/libdcp.so" 2>/dev/null | grep -q libasan; then
    rss_max=100000
fi
"$DCP" synth "$S/big" --keys 4 --shape 2048,2048 --dtype float32 --ranks 2 --shard rows --seed 3 >/dev/null
"$DCP" convert --quiet "$S/big" "$S/big.safetensors"
python3 - "$S/big.safetensors" <<'PY'
import json, sys
p = sys.argv[1]
with open(p, "r+b") as f:
    n = int.from_bytes(f.read(8), "little")
    hdr = json.loads(f.read(n))
    key = sorted(k for k in hdr if k != "__metadata__")[1]
    off = 8 + n + hdr[key]["data_offsets"][1] - 3
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0x40]))
PY
bigkey=$("$DCP" ls --json "$S/big" | python3 -c 'import json,sys; print(sorted(json.loads(l)["key"] for l in sys.stdin)[1])')
python3 - "$DCP" "$S/big" "$S/big.safetensors" "$bigkey" "$rss_max" <<'PY' || fail "diff of 64 MiB a side"
import resource, subprocess, sys
dcp, a, b, key, rss_max = sys.argv[1:]
r = subprocess.run([dcp, "--no-catalog", "diff", "--content", a, b], capture_output=True, text=True)
assert r.returncode == 1 and r.stdout == "values: %s differ\n" % key, (r.returncode, r.stdout, r.stderr)
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
assert rss < int(rss_max), "peak RSS %d MiB for 64 MiB a side" % rss
print("diff of 2 x 64 MiB: peak RSS %d MiB" % rss)
PY
echo "dcp diff --content: DCP, safetensors, torch.save, HF folders and Megatron agree; one flipped element is named"
