# dcp verify: structure (coverage, records, files) and recorded content digests;
# the catalog lives outside the checkpoint, which is never written to.
. "$top_srcdir/tests/lib.sh"
need python3
scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
fresh() { rm -rf "$SCRATCH/ck"; cp -r "$FIXTURES/$1/ckpt" "$SCRATCH/ck"; chmod -R u+w "$SCRATCH/ck"; }

# A good checkpoint: OK, and recording digests writes only to the catalog.
fresh 05_mixed_2ranks
before=$(cd "$SCRATCH/ck" && ls -lA --time-style=full-iso | sha256sum)
"$DCP" verify --record --export "$SCRATCH/digests.txt" "$SCRATCH/ck" > "$SCRATCH/out"
grep -q "recorded 13 digests" "$SCRATCH/out" || fail "record: $(cat "$SCRATCH/out")"
[ -f "$XDG_CACHE_HOME/dcpfs/catalog.sqlite" ] || fail "no catalog under XDG_CACHE_HOME"
[ "$(grep -c '^[0-9a-f]\{16\} ' "$SCRATCH/digests.txt")" = 13 ] || fail "sidecar has not 13 digests"
after=$(cd "$SCRATCH/ck" && ls -lA --time-style=full-iso | sha256sum)
[ "$before" = "$after" ] || fail "verify wrote into the checkpoint folder"
"$DCP" verify "$SCRATCH/ck" > "$SCRATCH/out" || fail "verify of an intact checkpoint failed: $(cat "$SCRATCH/out")"
grep -q "13 blobs re-hashed, 0 changed" "$SCRATCH/out" || fail "$(cat "$SCRATCH/out")"

# A flipped byte inside enc.weight's data record (file offset 0 + data at 320 + 100).
python3 - "$SCRATCH/ck/__0_0.distcp" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[420] ^= 0xff; open(p, 'wb').write(b)
PY
rc=0; "$DCP" verify "$SCRATCH/ck" > "$SCRATCH/out" || rc=$?
[ $rc = 1 ] || fail "a flipped byte was not reported (rc $rc)"
grep -q "__0_0.distcp: enc.weight: bytes at offset 0 .* changed" "$SCRATCH/out" || fail "$(cat "$SCRATCH/out")"

# The sidecar carries the digests to a machine with an empty catalog.
rm -rf "$XDG_CACHE_HOME"
rc=0; "$DCP" verify --no-catalog --import "$SCRATCH/digests.txt" "$SCRATCH/ck" > "$SCRATCH/out" || rc=$?
[ $rc = 1 ] && grep -q "enc.weight: bytes at offset 0 .* changed" "$SCRATCH/out" || fail "sidecar check: $(cat "$SCRATCH/out")"
[ ! -e "$XDG_CACHE_HOME" ] || fail "--no-catalog created a catalog"

# A truncated shard and a missing one.
fresh 05_mixed_2ranks
truncate -s 1000 "$SCRATCH/ck/__0_0.distcp"
rc=0; "$DCP" verify "$SCRATCH/ck" > "$SCRATCH/out" || rc=$?
[ $rc = 1 ] && grep -q "__0_0.distcp: enc.weight: chunk \[0:20,0:24\] (start:count) at offset 0 length 2667 ends past the file (1000 bytes)" "$SCRATCH/out" \
    || fail "truncated shard: $(cat "$SCRATCH/out")"
rm "$SCRATCH/ck/__0_1.distcp"
rc=0; "$DCP" verify "$SCRATCH/ck" > "$SCRATCH/out" || rc=$?
[ $rc = 1 ] && grep -q "__0_1.distcp: shard file missing" "$SCRATCH/out" || fail "missing shard: $(cat "$SCRATCH/out")"

# Overlapping chunks: move the row-250 chunks of 02 down by one row (both the
# chunk and its storage index), so rows 250..500 overlap the next chunk.
fresh 02_rowwise_4ranks
python3 - "$SCRATCH/ck/.metadata" <<'PY'
import sys
p = sys.argv[1]; b = open(p, 'rb').read()
assert b.count(b'K\xfaK\x00\x86') == 4
open(p, 'wb').write(b.replace(b'K\xfaK\x00\x86', b'K\xfbK\x00\x86'))
PY
rc=0; "$DCP" verify "$SCRATCH/ck" > "$SCRATCH/out" || rc=$?
[ $rc = 1 ] && grep -q "model.embed_tokens.weight: chunks \[251:250,0:257\] and \[500:250,0:257\] (start:count) overlap" "$SCRATCH/out" \
    || fail "overlap: $(cat "$SCRATCH/out")"

# A missing chunk (a gap): drop one chunk from a PyTorch-written checkpoint.
if python3 -c 'import torch' 2>/dev/null; then
    python3 - "$SCRATCH/gap" <<'PY'
import pickle, sys, torch, torch.distributed.checkpoint as dcp
out = sys.argv[1]
dcp.save({"w": torch.arange(12.).reshape(3, 4)}, checkpoint_id=out, no_dist=True)
md = pickle.load(open(out + "/.metadata", "rb"))
c = md.state_dict_metadata["w"].chunks[0]
# split the one chunk's claim: keep rows 0..1 only
md.state_dict_metadata["w"].chunks[0] = type(c)(offsets=c.offsets, sizes=torch.Size([2, 4]))
pickle.dump(md, open(out + "/.metadata", "wb"))
PY
    rc=0; "$DCP" verify "$SCRATCH/gap" > "$SCRATCH/out" 2>&1 || rc=$?
    [ $rc = 1 ] && grep -q "w: chunks cover 8 of 12 elements (a gap)" "$SCRATCH/out" || fail "gap: $(cat "$SCRATCH/out")"
else
    echo "gap case skipped: PyTorch not installed"
fi

# A corrupt catalog is moved aside and rebuilt, never trusted.
fresh 05_mixed_2ranks
mkdir -p "$XDG_CACHE_HOME/dcpfs"
echo "not a database" > "$XDG_CACHE_HOME/dcpfs/catalog.sqlite"
"$DCP" verify --record "$SCRATCH/ck" > "$SCRATCH/out" || fail "record over a corrupt catalog: $(cat "$SCRATCH/out")"
[ -f "$XDG_CACHE_HOME/dcpfs/catalog.sqlite.corrupt" ] || fail "the corrupt catalog was not moved aside"
"$DCP" verify "$SCRATCH/ck" | grep -q "13 blobs re-hashed, 0 changed" || fail "rebuilt catalog unusable"

# Two processes recording into one catalog at once.
fresh 05_mixed_2ranks
cp -r "$SCRATCH/ck" "$SCRATCH/ck2"
"$DCP" verify --record "$SCRATCH/ck" >/dev/null & p1=$!
"$DCP" verify --record "$SCRATCH/ck2" >/dev/null & p2=$!
wait $p1 || fail "concurrent record 1"
wait $p2 || fail "concurrent record 2"
"$DCP" verify "$SCRATCH/ck2" | grep -q "13 blobs re-hashed, 0 changed" || fail "concurrent catalog lost records"

# A changed .metadata changes the identity: old records are not applied.
touch -d '2001-01-01' "$SCRATCH/ck/.metadata"
"$DCP" verify "$SCRATCH/ck" | grep -q "13 blobs have no recorded digest" || fail "stale records were trusted"
echo "integrity-verify: ok"
