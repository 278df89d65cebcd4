#!/bin/bash
# dcp digest --dtype: XXH3-128 of each floating tensor after torch's .to()
# cast, computed by PyTorch itself and hashed with python xxhash, equals
# dcp's for float64/float32/float16/bfloat16/float8 sources cast to
# bfloat16, float16, float32 and float64 — values including NaN (with
# payloads), infinities, float32 and float16 subnormals, rounding ties and
# float16 overflow; a float64 tensor of 17 MiB is cast in pieces; integer
# tensors hash unchanged; the DCP checkpoint sharded on 2 ranks gives the same
# digests as its safetensors and torch.save conversions; --json names the cast
# dtype and the source's ("cast_from").
. "$top_srcdir/tests/lib.sh"
need python3
need_python_module torch
need_python_module safetensors
need_python_module xxhash
scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
S=$SCRATCH

python3 - "$S/vals.safetensors" <<'PY'
import sys, struct, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(5)
special = [float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, -1e-45, 1e-40,
           1.1754942e-38, 3.4028235e38, 65504.0, 65519.0, 65520.0, -65536.0, 6e-8, 2.98e-8, 5.96e-8,
           6.1e-5, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 1.0000001, 1e30, -1e-30]
# random float32 bit patterns: every exponent, NaN payloads included
bits = torch.randint(-2 ** 31, 2 ** 31, (20000,), generator=g, dtype=torch.int64).to(torch.int32)
f32 = torch.cat([torch.tensor(special, dtype=torch.float32), bits.view(torch.float32),
                 torch.randn(5000, generator=g) * torch.logspace(-30, 30, 5000)])
f64 = torch.cat([torch.tensor(special, dtype=torch.float64),
                 torch.randn(2_200_000, generator=g, dtype=torch.float64) * 1e3])   # 17 MiB: two pieces
# float64 values that round twice (to float32, then to bfloat16/float16)
f64[100:110] = torch.tensor([1.0 + 2 ** -8 + 2 ** -40, 1.0 + 2 ** -11 + 2 ** -40, 65519.99999999, 1e300, -1e-300,
                             5.9604644775390625e-08 * 0.5 + 1e-20, 3.0, 1 / 3, 2 / 3, 1e-320])
h16 = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.float16)      # every float16
b16 = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)     # every bfloat16
e4 = torch.arange(0, 256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
e5 = torch.arange(0, 256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e5m2)
save_file({"a.f32": f32.reshape(-1, 2), "b.f64": f64, "c.f16": h16.reshape(256, 256), "d.bf16": b16,
           "e.e4m3": e4, "f.e5m2": e5, "g.int": torch.arange(1000, dtype=torch.int64)}, sys.argv[1])
PY

# the truth: torch's .to(), then xxhash of the bytes; sorted "HEX  KEY" lines
truth() {   # truth FILE DTYPE OUT
    python3 - "$1" "$2" >"$3" <<'PY'
import sys, torch, xxhash
from safetensors.torch import load_file
to = getattr(torch, sys.argv[2])
for key, t in sorted(load_file(sys.argv[1]).items()):
    if t.is_floating_point():
        t = t.to(to)
    print(xxhash.xxh3_128_hexdigest(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()) + "  " + key)
PY
}
for dt in bfloat16 float16 float32 float64; do
    truth "$S/vals.safetensors" $dt "$S/want.$dt"
    "$DCP" digest --dtype $dt "$S/vals.safetensors" | sort -k2 >"$S/got.$dt" || fail "dcp digest --dtype $dt"
    diff "$S/want.$dt" "$S/got.$dt" >&2 || fail "--dtype $dt: digests differ from torch's .to($dt) (lines above)"
done
# without --dtype nothing is cast: the raw digests are not the cast ones
"$DCP" digest "$S/vals.safetensors" | sort -k2 >"$S/raw"
[ "$(grep -c 'a.f32$' "$S/raw")" = 1 ] && grep -q "$(grep 'a.f32$' "$S/raw")" "$S/want.float32" ||
    fail "a float32 tensor cast to float32 is not hashed as it is"
grep "b.f64$" "$S/raw" | grep -qf - "$S/want.bfloat16" && fail "float64 hashed alike with and without a cast"
grep "g.int$" "$S/raw" | grep -qf - "$S/want.bfloat16" || fail "an integer tensor was cast"

# DCP on 2 ranks (rows), its torch.save and safetensors conversions: same cast digests as torch
"$DCP" synth "$S/rows2" --keys 3 --shape 96,40 --dtype float32 --ranks 2 --shard rows --seed 4 >/dev/null
"$DCP" convert --quiet "$S/rows2" "$S/rows2.safetensors"
"$DCP" convert --quiet "$S/rows2" "$S/rows2.pt"
truth "$S/rows2.safetensors" bfloat16 "$S/want.rows2"
for src in rows2 rows2.safetensors rows2.pt; do
    "$DCP" digest --dtype bfloat16 "$S/$src" | sort -k2 >"$S/got.rows2" || fail "dcp digest --dtype bfloat16 $src"
    diff "$S/want.rows2" "$S/got.rows2" >&2 || fail "$src: cast digests differ from torch's"
done

# a bfloat16 export of the float32 checkpoint compares equal after the cast
python3 - "$S/rows2.safetensors" "$S/export_bf16.safetensors" <<'PY'
import sys, torch
from safetensors.torch import load_file, save_file
save_file({k: v.to(torch.bfloat16) for k, v in load_file(sys.argv[1]).items()}, sys.argv[2])
PY
"$DCP" digest "$S/export_bf16.safetensors" | sort -k2 >"$S/export"
diff "$S/export" "$S/got.rows2" >&2 || fail "the bfloat16 export's digests differ from the float32 checkpoint's after the cast"

# --json: dtype is the cast dtype, cast_from the stored one; uncast lines have no cast_from
"$DCP" digest --json --dtype float16 "$S/vals.safetensors" >"$S/json"
python3 - "$S/json" "$S/want.float16" <<'PY' || fail "dcp digest --json --dtype"
import json, sys
rows = {r["key"]: r for r in map(json.loads, open(sys.argv[1]))}
want = dict(reversed(l.split()) for l in open(sys.argv[2]))
assert rows["b.f64"]["dtype"] == "float16" and rows["b.f64"]["cast_from"] == "float64", rows["b.f64"]
assert rows["d.bf16"]["dtype"] == "float16" and rows["d.bf16"]["cast_from"] == "bfloat16", rows["d.bf16"]
assert rows["c.f16"]["dtype"] == "float16" and "cast_from" not in rows["c.f16"], rows["c.f16"]
assert rows["g.int"]["dtype"] == "int64" and "cast_from" not in rows["g.int"], rows["g.int"]
assert all(r["xxh3_128"] == want[k] for k, r in rows.items()), (rows, want)
PY

# errors: a dtype that is no cast target, a floating dtype with no cast
rc=0; "$DCP" digest --dtype int8 "$S/vals.safetensors" >/dev/null 2>"$S/err" || rc=$?
[ $rc = 2 ] && grep -q 'cast to bfloat16, float16, float32 or float64' "$S/err" || fail "--dtype int8: exit $rc: $(cat "$S/err")"
python3 - "$S/fnuz.safetensors" <<'PY'
import sys, torch
from safetensors.torch import save_file
save_file({"x": torch.zeros(4, dtype=torch.float8_e4m3fnuz)}, sys.argv[1])
PY
if [ -s "$S/fnuz.safetensors" ] && "$DCP" ls "$S/fnuz.safetensors" >/dev/null 2>&1; then
    expect_fail "x: casting float8_e4m3fnuz to bfloat16 is not supported" "$DCP" digest --dtype bfloat16 "$S/fnuz.safetensors"
fi
echo "dcp digest --dtype: bfloat16, float16, float32, float64 agree with torch's .to() on every source dtype"
