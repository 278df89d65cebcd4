# dcpfs -o verify: a chunk whose bytes no longer match the digest recorded by
# `dcp verify --record` reads as EIO (logged with key and file); others read.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_fuse
fuse_scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
ck="$SCRATCH/ck"
cp -r "$FIXTURES/05_mixed_2ranks/ckpt" "$ck"; chmod -R u+w "$ck"
"$DCP" verify --record "$ck" >/dev/null || fail "dcp verify --record"

mount_dcpfs "$ck" "$SCRATCH/m1" -o verify
cmp "$SCRATCH/m1/enc/weight" <("$DCP" cat "$ck" enc.weight) || fail "intact tensor differs under -o verify"
unmount_dcpfs "$SCRATCH/m1"

# Flip one data byte of enc.weight's first chunk (__0_0.distcp, data at 320) but keep
# the identity (size and metadata unchanged): the recorded digest no longer matches.
python3 - "$ck/__0_0.distcp" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[400] ^= 0xff; open(p, 'wb').write(b)
PY
mount_dcpfs "$ck" "$SCRATCH/m2" -o verify,catalog="$XDG_CACHE_HOME/dcpfs/catalog.sqlite"
python3 - "$SCRATCH/m2/enc/weight" <<'PY' || fail "a changed chunk did not give EIO"
import errno, sys
try:
    open(sys.argv[1], "rb").read()
except OSError as e:
    sys.exit(0 if e.errno == errno.EIO else 1)
sys.exit(1)
PY
grep -q "__0_0.distcp: enc.weight: bytes at offset 0 do not match the recorded digest" "$SCRATCH/m2.log" \
    || fail "no log line naming file and key: $(cat "$SCRATCH/m2.log")"
cmp "$SCRATCH/m2/dec/weight" <("$DCP" cat "$ck" dec.weight) || fail "an intact tensor failed under -o verify"
# all.safetensors is checked the same way: EIO over enc.weight, dec.weight intact.
python3 "$FUSE_CHECK" eio "$SCRATCH/m2/all.safetensors" dec.weight "$SCRATCH/m2/dec/weight" enc.weight ||
    fail "all.safetensors under -o verify"
unmount_dcpfs "$SCRATCH/m2"

# Without -o verify the same bytes are served (verification is opt-in).
mount_dcpfs "$ck" "$SCRATCH/m3"
cat "$SCRATCH/m3/enc/weight" >/dev/null || fail "read without -o verify"
unmount_dcpfs "$SCRATCH/m3"
echo "fuse-verify: ok"
