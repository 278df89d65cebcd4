#!/bin/bash
# dcp digest: the same values give the same digests in every layout and
# format (DCP sharded by rows on 2 ranks, by columns on 4, in blocks on 3,
# converted to torch.save and safetensors), a single flipped element
# changes exactly one digest, the JSON lines name dtype and shape, the
# digest is XXH3-128 of `dcp cat`'s bytes (python xxhash), and the mount
# gives it as the user.dcp.xxh3_128 attribute.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
fuse_scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
S=$SCRATCH
"$DCP" synth "$S/rows2" --keys 5 --shape 64,48 --dtype float32 --ranks 2 --shard rows --seed 9 >/dev/null
"$DCP" synth "$S/cols4" --keys 5 --shape 64,48 --dtype float32 --ranks 4 --shard cols --seed 9 >/dev/null
"$DCP" synth "$S/blocks3" --keys 5 --shape 64,48 --dtype float32 --ranks 3 --shard blocks --seed 9 >/dev/null
"$DCP" convert --quiet "$S/rows2" "$S/all.pt"
"$DCP" convert --quiet "$S/cols4" "$S/all.safetensors"
"$DCP" digest "$S/rows2" >"$S/want" || fail "dcp digest rows2"
[ "$(wc -l <"$S/want")" = 5 ] || fail "expected 5 digests: $(cat "$S/want")"
grep -qE '^[0-9a-f]{32}  [^ ]+$' "$S/want" || fail "not 'HEX  KEY' lines: $(head -2 "$S/want")"
for src in cols4 blocks3 all.pt all.safetensors; do
    "$DCP" digest "$S/$src" >"$S/got" || fail "dcp digest $src"
    diff "$S/want" "$S/got" || fail "$src: digests differ from rows2's"
done
# the digests differ between keys (the values do)
[ "$(cut -c1-32 "$S/want" | sort -u | wc -l)" = 5 ] || fail "two keys share a digest: $(cat "$S/want")"

# one element flipped in one tensor of the safetensors file: exactly one digest changes
cp "$S/all.safetensors" "$S/flip.safetensors"
key=$(python3 - "$S/flip.safetensors" <<'PY'
import json, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = int.from_bytes(b[:8], "little")
hdr = json.loads(b[8:8 + n])
key = sorted(k for k in hdr if k != "__metadata__")[2]
start = 8 + n + hdr[key]["data_offsets"][0]
b[start + 4 * 77] ^= 0x01          # one bit of element 77
open(p, "wb").write(b)
print(key)
PY
)
"$DCP" digest "$S/flip.safetensors" >"$S/got"
changed=$(diff <(sort -k2 "$S/want") <(sort -k2 "$S/got") | grep -c '^>' || true)
[ "$changed" = 1 ] || fail "flipping one element changed $changed digests"
diff <(sort -k2 "$S/want") <(sort -k2 "$S/got") | grep -q "  $key\$" || fail "the changed digest is not $key's"

# --keys and --json
"$DCP" digest --json --keys "$key" "$S/blocks3" >"$S/json"
python3 - "$S/json" "$S/want" "$key" <<'PY' || fail "dcp digest --json"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
want = dict(reversed(l.split()) for l in open(sys.argv[2]))
assert len(rows) == 1 and rows[0]["key"] == sys.argv[3], rows
r = rows[0]
assert r["dtype"] == "float32" and r["shape"] == [64, 48] and r["xxh3_128"] == want[r["key"]], (r, want)
PY

# errors: a missing source, a damaged shard named in the message
expect_fail "no-such" "$DCP" digest "$S/no-such"
cp -r "$S/rows2" "$S/short"
truncate -s 100 "$S/short/__1_0.distcp"
expect_fail "__1_0.distcp" "$DCP" --no-catalog digest "$S/short"

# the mount: user.dcp.xxh3_128 of each tensor file, listed among the attributes
if [ -c /dev/fuse ] && command -v fusermount3 >/dev/null 2>&1; then
    mount_dcpfs "$S/cols4" "$S/m"
    python3 - "$S/m" "$S/want" <<'PY' || fail "user.dcp.xxh3_128 through the mount"
import os, sys
m = sys.argv[1]
want = dict(reversed(l.split()) for l in open(sys.argv[2]))
for key, hexd in want.items():
    f = os.path.join(m, *key.split("."))
    assert "user.dcp.xxh3_128" in os.listxattr(f), os.listxattr(f)
    got = os.getxattr(f, "user.dcp.xxh3_128").decode()
    assert got == hexd, (key, got, hexd)
PY
    unmount_dcpfs "$S/m"
else
    echo "no FUSE here: the mount's attribute is not checked"
fi

# the published format: XXH3-128 of the C-order bytes, canonical (big-endian) hex
python3 -c 'import xxhash' 2>/dev/null || skip "python3 module xxhash is missing (pip install xxhash): the rest passed"
python3 - "$DCP" "$S/rows2" "$S/want" <<'PY' || fail "digest is not XXH3-128 of dcp cat's bytes"
import subprocess, sys, xxhash
dcp, ck, want = sys.argv[1:]
for line in open(want):
    hexd, key = line.split()
    data = subprocess.run([dcp, "cat", ck, key], check=True, capture_output=True).stdout
    assert xxhash.xxh3_128_hexdigest(data) == hexd, key
PY
echo "dcp digest: 5 formats and layouts agree, one flipped element changes one digest"
