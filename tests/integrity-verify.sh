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
grep -q "13 blobs checked against their recorded digests, 0 problems" "$SCRATCH/out" || fail "$(cat "$SCRATCH/out")"

# A flipped byte inside enc.weight's data record (file offset 0 + data at 320 + 100).
python3 - "$SCRATCH/ck/__0_0.distcp" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[420] ^= 0xff; open(p, 'wb').write(b)
PY
rc=0; "$DCP" verify "$SCRATCH/ck" > "$SCRATCH/out" || rc=$?
[ $rc = 1 ] || fail "a flipped byte was not reported (rc $rc)"
grep -q "__0_0.distcp: enc.weight: bytes at offset 0 .* changed" "$SCRATCH/out" || fail "$(cat "$SCRATCH/out")"
# ... found without recorded digests too, by the CRC-32 torch.save keeps of each record (--crc);
# a byte of a zip header that nothing reads (the record's time) is not.
rc=0; "$DCP" --no-catalog verify --crc "$SCRATCH/ck" > "$SCRATCH/out" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/ck/__0_0.distcp: enc.weight: record archive/data/0 of the torch.save archive at offset 0: CRC-32 [0-9a-f]\{8\}, the archive records [0-9a-f]\{8\}$" "$SCRATCH/out" &&
    [ "$(grep -c '^PROBLEM:' "$SCRATCH/out")" = 1 ] && grep -q "^crc: 37 records checked (CRC-32), 1 problems$" "$SCRATCH/out" &&
    grep -q "^crc: read and checked [0-9.]* [KMGT]*i*B of torch.save records in [0-9.]* s at [0-9]* MB/s$" "$SCRATCH/out" ||
    fail "--crc, a flipped byte (status $rc): $(cat "$SCRATCH/out")"
fresh 05_mixed_2ranks
"$DCP" --no-catalog verify --crc "$SCRATCH/ck" > "$SCRATCH/out" && grep -q "^crc: 37 records checked (CRC-32), 0 problems$" "$SCRATCH/out" ||
    fail "--crc, intact: $(cat "$SCRATCH/out")"
printf '\001' | dd of="$SCRATCH/ck/__0_0.distcp" bs=1 seek=10 conv=notrunc status=none
"$DCP" --no-catalog verify --crc "$SCRATCH/ck" > "$SCRATCH/out" || fail "--crc, a header's time changed: $(cat "$SCRATCH/out")"
# Records written without CRC-32s (dcp synth without --crc, as torch's compute_crc32=False)
# are counted and not checked; with them, a changed byte is found.
"$DCP" synth "$SCRATCH/nocrc" --keys 3 --shape 8,8 --ranks 2 >/dev/null
"$DCP" --no-catalog verify --crc "$SCRATCH/nocrc" > "$SCRATCH/out" &&
    grep -q "^crc: 0 records checked (CRC-32), 0 problems$" "$SCRATCH/out" &&
    grep -q "^crc: 42 records carry no CRC-32 (written as 0, as torch does with save.compute_crc32=False): not checked$" "$SCRATCH/out" ||
    fail "--crc, no CRCs: $(cat "$SCRATCH/out")"
"$DCP" synth "$SCRATCH/crc" --keys 3 --shape 8,8 --ranks 2 --crc >/dev/null
python3 "$top_srcdir/tests/flip_record.py" "$SCRATCH/crc/__1_0.distcp"   # the first byte of the first .../data/0
rc=0; "$DCP" --no-catalog verify --crc "$SCRATCH/crc" > "$SCRATCH/out" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/crc/__1_0.distcp: [^ ]*: record [^ ]*/data/0 of the torch.save archive at offset [0-9]*: CRC-32" "$SCRATCH/out" &&
    grep -q "^crc: 42 records checked (CRC-32), 1 problems$" "$SCRATCH/out" || fail "--crc, dcp synth --crc, a flipped byte (status $rc): $(cat "$SCRATCH/out")"

# The sidecar carries the digests to a machine with an empty catalog.
rm -rf "$XDG_CACHE_HOME"
rc=0; "$DCP" verify --no-catalog --import "$SCRATCH/digests.txt" "$SCRATCH/ck" > "$SCRATCH/out" || rc=$?
[ $rc = 1 ] && grep -q "enc.weight: bytes at offset 0 .* changed" "$SCRATCH/out" || fail "sidecar check: $(cat "$SCRATCH/out")"
[ ! -e "$XDG_CACHE_HOME" ] || fail "--no-catalog created a catalog"
# Exporting where nothing is recorded leaves an existing sidecar as it is (an empty list
# replaced it, with "exported digests" and exit 0).
cp "$SCRATCH/digests.txt" "$SCRATCH/keep.txt"
expect_fail "no digests recorded for $SCRATCH/ck" "$DCP" verify --no-catalog --export "$SCRATCH/keep.txt" "$SCRATCH/ck"
cmp -s "$SCRATCH/digests.txt" "$SCRATCH/keep.txt" || fail "an export of nothing replaced the sidecar"
# A sidecar is read exactly as written: another header version, a 17-digit digest (read as
# 16 digits and a stray one), something after the file name.
for bad in "dcpfs-digests 12|" "|0123456789abcdef0 0 16 __0_0.distcp" "|0123456789abcdef 0 16 __0_0.distcp junk" \
           "|0123456789abcdef -1 16 __0_0.distcp" "|0123456789ABCDEF 0 16 __0_0.distcp"; do
    { if [ "${bad%%|*}" ]; then echo "${bad%%|*}"; else echo "dcpfs-digests 1"; fi
      [ -z "${bad#*|}" ] || echo "${bad#*|}"; } >"$SCRATCH/bad.txt"
    rc=0; "$DCP" verify --no-catalog --import "$SCRATCH/bad.txt" "$SCRATCH/ck" >"$SCRATCH/out" 2>&1 || rc=$?
    [ $rc != 0 ] && grep -q "bad.txt" "$SCRATCH/out" || fail "the sidecar '$bad' was accepted: $(cat "$SCRATCH/out")"
done

# A truncated shard, a missing one, a folder in a shard's place, digests recorded before:
# each named once (file, key, reason), the content check still runs over the other files
# and never advises recording over the damage, the folder is never written to.
fresh 05_mixed_2ranks
"$DCP" verify --record "$SCRATCH/ck" >/dev/null
sums() { (cd "$SCRATCH/ck" && ls -lA --time-style=full-iso && sha256sum .metadata *.distcp) | sha256sum; }
truncate -s 1000 "$SCRATCH/ck/__0_0.distcp"
before=$(sums)
rc=0; "$DCP" verify "$SCRATCH/ck" > "$SCRATCH/out" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/ck/__0_0.distcp: enc.weight: chunk \[0:20,0:24\] (start:count) at offset 0 length 2667 ends past the file (1000 bytes)$" "$SCRATCH/out" \
    && [ "$(grep -c '^PROBLEM:' "$SCRATCH/out")" = 1 ] || fail "truncated shard: $(cat "$SCRATCH/out")"
grep -q "^content: 13 blobs have no recorded digest for the files as they are now (recorded digests are tied to the .metadata and every shard file's size; repair the problems above, never record over them)$" "$SCRATCH/out" &&
    ! grep -q "record first" "$SCRATCH/out" || fail "truncated shard: the content line: $(cat "$SCRATCH/out")"
expect_fail "$SCRATCH/ck/__0_0.distcp: enc.weight: cannot hash the blob at offset 0 length 2667: it ends past the end of the file" \
    "$DCP" verify --record "$SCRATCH/ck"
# A shard holding 50 chunks cut after the first: one problem, the first chunk past the cut
# named, the others counted (not 49 lines).
"$DCP" synth "$SCRATCH/cut" --keys 50 --shape 8,8 --ranks 2 >/dev/null
truncate -s 2000 "$SCRATCH/cut/__0_0.distcp"
rc=0; "$DCP" --no-catalog verify "$SCRATCH/cut" > "$SCRATCH/out" 2>&1 || rc=$?
[ $rc = 1 ] && [ "$(grep '^PROBLEM:' "$SCRATCH/out")" = "PROBLEM: $SCRATCH/cut/__0_0.distcp: model.layers.1.weight: chunk [0:4,0:8] (start:count) at offset 1705 length 1705 ends past the file (2000 bytes) (and 48 more chunks or bytes items of the file)" ] &&
    grep -q "^structure: 1 problems$" "$SCRATCH/out" || fail "a shard of 50 chunks cut short (status $rc): $(cat "$SCRATCH/out")"
rm "$SCRATCH/ck/__0_1.distcp"
before=$(sums)
rc=0; "$DCP" verify "$SCRATCH/ck" > "$SCRATCH/out" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/ck/__0_1.distcp: the data file is missing$" "$SCRATCH/out" &&
    [ "$(grep -c '__0_1\.distcp' "$SCRATCH/out")" = 1 ] && [ "$(grep -c '^PROBLEM:' "$SCRATCH/out")" = 2 ] &&
    ! grep -q "not checked\|^dcp:" "$SCRATCH/out" || fail "missing shard: $(cat "$SCRATCH/out")"
# ... and its summary
tail -2 "$SCRATCH/out" | grep -q "^structure: 2 problems$" && tail -1 "$SCRATCH/out" | grep -q ": FAILED$" ||
    fail "missing shard: no summary: $(cat "$SCRATCH/out")"
mkdir "$SCRATCH/ck/__0_1.distcp"
rc=0; "$DCP" verify "$SCRATCH/ck" > "$SCRATCH/out" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/ck/__0_1.distcp: the data file is not a regular file$" "$SCRATCH/out" &&
    [ "$(grep -c '__0_1\.distcp' "$SCRATCH/out")" = 1 ] || fail "a folder for a shard: $(cat "$SCRATCH/out")"
rmdir "$SCRATCH/ck/__0_1.distcp"
[ "$before" = "$(sums)" ] || fail "verify wrote into the damaged checkpoint folder"

# A single file that is not a torch.save archive: named with the reason (no empty key), status 1.
head -c 100 /dev/zero >"$SCRATCH/junk.pt"
rc=0; "$DCP" --no-catalog verify "$SCRATCH/junk.pt" > "$SCRATCH/out" 2>&1 || rc=$?
[ $rc = 1 ] && [ "$(cat "$SCRATCH/out")" = "dcp: $SCRATCH/junk.pt: corrupt torch.save archive at offset 0: no end-of-central-directory record" ] ||
    fail "a junk single file (status $rc): $(cat "$SCRATCH/out")"

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
    # Chunks that overlap by as many elements as a hole has: rows 2-3 of w stored twice (the
    # same bytes), rows 6-7 by no chunk. The hole reads as zeros in every reader, never as what
    # a buffer held before (here the bytes of "secret", read first): the planner cannot prove a
    # box whole by counting covered elements when chunks overlap.
    python3 - "$SCRATCH/ovl" <<'PY'
import pickle, sys, torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata as C, MetadataIndex as I
out = sys.argv[1]
g = torch.arange(32, dtype=torch.float32).reshape(8, 4) + 1
dcp.save({"a.secret": torch.full((512, 64), 0x41414141, dtype=torch.int32), "w": g[0:4].clone(),
          "x": g[2:6].clone()}, checkpoint_id=out, no_dist=True)
md = pickle.load(open(out + "/.metadata", "rb"))
w = md.state_dict_metadata["w"]
w.size = torch.Size([8, 4])
w.chunks = [C(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 4])), C(offsets=torch.Size([2, 0]), sizes=torch.Size([4, 4]))]
md.state_dict_metadata.pop("x")
sd = {}
for k, v in md.storage_data.items():
    if k.fqn == "x":
        k = I("w", torch.Size([2, 0]), 1)
    elif k.fqn == "w":
        k = I("w", torch.Size([0, 0]), 0)
    sd[k] = v
md.storage_data = sd
if md.planner_data:
    md.planner_data.pop("x", None)
pickle.dump(md, open(out + "/.metadata", "wb"))
g[6:] = 0
open(out + ".want", "wb").write(g.numpy().tobytes())
PY
    want=$(python3 -c 'import sys, xxhash; print(xxhash.xxh3_128_hexdigest(open(sys.argv[1], "rb").read()))' "$SCRATCH/ovl.want") ||
        fail "overlap and hole: xxhash"
    rc=0; "$DCP" verify "$SCRATCH/ovl" > "$SCRATCH/out" 2>&1 || rc=$?
    [ $rc = 1 ] && grep -q "w: chunks \[0:4,0:4\] and \[2:4,0:4\] (start:count) overlap" "$SCRATCH/out" ||
        fail "overlap and hole: verify: $(cat "$SCRATCH/out")"
    "$DCP" --no-catalog cat "$SCRATCH/ovl" w | cmp - "$SCRATCH/ovl.want" || fail "overlap and hole: dcp cat"
    for how in --no-catalog "--catalog $SCRATCH/ovl.sqlite" "--catalog $SCRATCH/ovl.sqlite"; do
        got=$("$DCP" $how digest --keys w "$SCRATCH/ovl" | cut -d' ' -f1)
        [ "$got" = "$want" ] || fail "overlap and hole: dcp $how digest gives $got, not $want"
    done
    "$DCP" --no-catalog convert -q "$SCRATCH/ovl" "$SCRATCH/ovl.safetensors" || fail "overlap and hole: convert"
    [ "$("$DCP" --no-catalog digest --keys w "$SCRATCH/ovl.safetensors" | cut -d' ' -f1)" = "$want" ] ||
        fail "overlap and hole: the converted w is not the stored bytes with a zero hole"
    # A hostile .metadata: blobs far past the end of their shard (a length of 2^63 - 1, an
    # offset and length of 2^62 each, a bytes item ending just below 2^63: one problem of the
    # file, the first named and the others counted), one at the middle of a record, one cut
    # short: each named with its key and why, nothing read out of bounds; an offset of 2^63 or
    # more is refused at the open, naming the key.
    python3 - "$SCRATCH/hostile" <<'PY' 2>/dev/null
import pickle, sys, torch, torch.distributed.checkpoint as dcp
out = sys.argv[1]
dcp.save({"w": torch.arange(12.).reshape(3, 4), "v": torch.ones(5), "b": {"x": 1}, "m": torch.ones(2),
          "s": torch.ones(3)}, checkpoint_id=out, no_dist=True)
md = pickle.load(open(out + "/.metadata", "rb"))
for k, v in md.storage_data.items():
    if k.fqn == "w": v.length = 2**63 - 1
    if k.fqn == "v": v.offset = v.length = 2**62
    if k.fqn == "b.x": v.offset, v.length = 2**63 - 10, 9
    if k.fqn == "m": v.offset += 100
    if k.fqn == "s": v.length = 200
pickle.dump(md, open(out + "/.metadata", "wb"))
for k, v in md.storage_data.items():
    if k.fqn == "v": v.offset = 2**63 + 5
pickle.dump(md, open(out + "/.metadata.huge", "wb"))
PY
    mkdir "$SCRATCH/huge" && cp "$SCRATCH/hostile/__0_0.distcp" "$SCRATCH/huge/" && mv "$SCRATCH/hostile/.metadata.huge" "$SCRATCH/huge/.metadata"
    sz=$(stat -c %s "$SCRATCH/hostile/__0_0.distcp")
    before=$(cd "$SCRATCH/hostile" && ls -lA --time-style=full-iso && sha256sum .metadata __0_0.distcp)
    rc=0; "$DCP" --no-catalog verify "$SCRATCH/hostile" > "$SCRATCH/out" 2>&1 || rc=$?
    H="^PROBLEM: $SCRATCH/hostile/__0_0.distcp"
    [ $rc = 1 ] && grep -q "$H: w: chunk \[0:3,0:4\] (start:count) at offset [0-9]* length 9223372036854775807 ends past the file ($sz bytes) (and 2 more chunks or bytes items of the file)$" "$SCRATCH/out" &&
        grep -q "$H: m: chunk 0 at offset [0-9]*: neither a torch.save archive nor a safetensors buffer" "$SCRATCH/out" &&
        grep -q "$H: s: corrupt torch.save archive at offset [0-9]*: no end-of-central-directory record$" "$SCRATCH/out" &&
        [ "$(grep -c '^PROBLEM:' "$SCRATCH/out")" = 3 ] && grep -q "^structure: 3 problems$" "$SCRATCH/out" ||
        fail "hostile offsets and lengths (status $rc): $(cat "$SCRATCH/out")"
    [ "$before" = "$(cd "$SCRATCH/hostile" && ls -lA --time-style=full-iso && sha256sum .metadata __0_0.distcp)" ] ||
        fail "hostile offsets: verify wrote into the folder"
    rc=0; "$DCP" --no-catalog verify "$SCRATCH/huge" > "$SCRATCH/out" 2>&1 || rc=$?
    [ $rc = 1 ] && grep -q "^dcp: $SCRATCH/huge/.metadata: v: _StorageInfo's offset is negative or past 2^63$" "$SCRATCH/out" ||
        fail "an offset past 2^63 (status $rc): $(cat "$SCRATCH/out")"
    # --crc over a single torch.save file: its records (every tensor's, data.pkl) checked; a
    # flipped byte of a tensor named with the record.
    python3 -c 'import sys, torch; torch.save({"a": torch.ones(3, 3), "b": torch.arange(5)}, sys.argv[1])' "$SCRATCH/m.pt"
    "$DCP" --no-catalog verify --crc "$SCRATCH/m.pt" > "$SCRATCH/out" && grep -q "^crc: 8 records checked (CRC-32), 0 problems$" "$SCRATCH/out" ||
        fail "--crc, a torch.save file: $(cat "$SCRATCH/out")"
    python3 "$top_srcdir/tests/flip_record.py" "$SCRATCH/m.pt" 3 0x40
    rc=0; "$DCP" --no-catalog verify --crc "$SCRATCH/m.pt" > "$SCRATCH/out" 2>&1 || rc=$?
    [ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/m.pt: record m/data/0 of the torch.save archive at offset 0: CRC-32 [0-9a-f]\{8\}, the archive records [0-9a-f]\{8\}$" "$SCRATCH/out" &&
        grep -q "^crc: 8 records checked (CRC-32), 1 problems$" "$SCRATCH/out" || fail "--crc, a torch.save file, a flipped byte (status $rc): $(cat "$SCRATCH/out")"
    # ... and one whose central directory lists a 4 KiB record three times (records that
    # overlap would be read again and again): refused once it claims more than the archive.
    python3 -c 'import sys, torch; torch.save({"a": torch.ones(1024)}, sys.argv[1])' "$SCRATCH/dup.pt"
    python3 - "$SCRATCH/dup.pt" <<'PY'
import struct, sys
p = sys.argv[1]; b = bytes(open(p, 'rb').read())
e = b.rindex(b'PK\x05\x06')
n, cds, cdo = struct.unpack_from('<HII', b, e + 10)
z = b.rindex(b'PK\x06\x06', 0, e)
n, cds, cdo = struct.unpack_from('<QQQ', b, z + 32)
cd, pos, extra = b[cdo:cdo + cds], 0, b''
while pos < len(cd):
    nl, xl, cl = struct.unpack_from('<HHH', cd, pos + 28)
    ent = cd[pos:pos + 46 + nl + xl + cl]
    if cd[pos + 46:pos + 46 + nl].endswith(b'/data/0'):
        extra = ent * 2
    pos += len(ent)
newcd = cd + extra
z64 = bytearray(b[z:z + 56]); struct.pack_into('<QQQQ', z64, 24, n + 2, n + 2, len(newcd), cdo)
loc = bytearray(b[z + 56:z + 76]); struct.pack_into('<Q', loc, 8, cdo + len(newcd))
eocd = bytearray(b[e:e + 22]); struct.pack_into('<HHII', eocd, 8, min(n + 2, 0xffff), min(n + 2, 0xffff),
                                                  min(len(newcd), 0xffffffff), min(cdo, 0xffffffff))
open(p, 'wb').write(b[:cdo] + newcd + bytes(z64) + bytes(loc) + bytes(eocd))
PY
    len=$(stat -c %s "$SCRATCH/dup.pt")
    rc=0; "$DCP" --no-catalog verify --crc "$SCRATCH/dup.pt" > "$SCRATCH/out" 2>&1 || rc=$?
    [ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/dup.pt: torch.save archive at offset 0: its records hold more bytes than the archive ($len): they overlap, not checked further$" "$SCRATCH/out" &&
        [ "$(grep -c '^PROBLEM:' "$SCRATCH/out")" = 1 ] || fail "--crc, records listed thrice (status $rc): $(cat "$SCRATCH/out")"
else
    echo "gap case skipped: PyTorch not installed"
fi

# A corrupt catalog is moved aside and rebuilt, never trusted.
fresh 05_mixed_2ranks
mkdir -p "$XDG_CACHE_HOME/dcpfs"
echo "not a database" > "$XDG_CACHE_HOME/dcpfs/catalog.sqlite"
"$DCP" verify --record "$SCRATCH/ck" > "$SCRATCH/out" || fail "record over a corrupt catalog: $(cat "$SCRATCH/out")"
[ -f "$XDG_CACHE_HOME/dcpfs/catalog.sqlite.corrupt" ] || fail "the corrupt catalog was not moved aside"
"$DCP" verify "$SCRATCH/ck" | grep -q "13 blobs checked against their recorded digests, 0 problems" || fail "rebuilt catalog unusable"

# Two processes recording into one catalog at once.
fresh 05_mixed_2ranks
cp -r "$SCRATCH/ck" "$SCRATCH/ck2"
"$DCP" verify --record "$SCRATCH/ck" >/dev/null & p1=$!
"$DCP" verify --record "$SCRATCH/ck2" >/dev/null & p2=$!
wait $p1 || fail "concurrent record 1"
wait $p2 || fail "concurrent record 2"
"$DCP" verify "$SCRATCH/ck2" | grep -q "13 blobs checked against their recorded digests, 0 problems" || fail "concurrent catalog lost records"

# A changed .metadata changes the identity: old records are not applied.
touch -d '2001-01-01' "$SCRATCH/ck/.metadata"
"$DCP" verify "$SCRATCH/ck" | grep -q "13 blobs have no recorded digest" || fail "stale records were trusted"
echo "integrity-verify: ok"
