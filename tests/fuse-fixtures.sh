# Every fixture checkpoint through a real mount: ls -R, the path of every key,
# stat sizes, sha256 of every file against the manifest, getfattr values, and
# random-offset dd reads against `dcp cat`; unmount leaves no process behind.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_fuse
fuse_scratch
i=0
for case in $(fixture_cases); do
    i=$((i + 1))
    mnt="$SCRATCH/m$i"
    mount_dcpfs "$case/ckpt" "$mnt"
    ls -lR "$mnt" >"$SCRATCH/ls.out" || fail "ls -R $mnt failed"
    [ -s "$SCRATCH/ls.out" ] || fail "ls -R printed nothing"
    python3 "$FUSE_CHECK" tree "$mnt" "$case/expected/manifest.json" --ckpt="$case/ckpt"
    python3 "$FUSE_CHECK" ranges "$mnt" "$case/expected/manifest.json" "$DCP" "$case/ckpt"
    unmount_dcpfs "$mnt"
done

# The attr tools and stat(1) see the same values (01 has a bfloat16 and a 0-d tensor).
mnt="$SCRATCH/attr"
mount_dcpfs "$FIXTURES/01_single_plain/ckpt" "$mnt"
f="$mnt/dtypes/bfloat16"
[ "$(stat -c %s "$f")" = 70 ] || fail "stat size of $f: $(stat -c %s "$f")"
[ "$(stat -c %s "$mnt/scalar/int64")" = 8 ] || fail "0-d int64 is not 8 bytes"
[ "$(stat -c %s "$mnt/empty/float32")" = 0 ] || fail "an empty tensor is not 0 bytes"
[ "$(stat -c %h%A "$mnt/dtypes")" = "2dr-xr-xr-x" ] || fail "directory mode/links: $(stat -c %h%A "$mnt/dtypes")"
if command -v getfattr >/dev/null 2>&1; then
    [ "$(getfattr --absolute-names --only-values -n user.dcp.dtype "$f")" = bfloat16 ] || fail "getfattr user.dcp.dtype"
    [ "$(getfattr --absolute-names --only-values -n user.dcp.shape "$f")" = "[5,7]" ] || fail "getfattr user.dcp.shape"
    [ "$(getfattr --absolute-names --only-values -n user.dcp.key "$f")" = dtypes.bfloat16 ] || fail "getfattr user.dcp.key"
    [ "$(getfattr --absolute-names --only-values -n user.dcp.shape "$mnt/scalar/int64")" = "[]" ] || fail "0-d shape"
    [ "$(getfattr --absolute-names --only-values -n user.dcp.kind "$mnt/meta/str")" = bytes ] || fail "bytes kind"
    getfattr --absolute-names -d "$mnt/meta/str" | grep -q user.dcp.dtype && fail "a bytes item has a dtype"
else
    echo "getfattr not installed (attr package): xattrs checked through python only"
fi
# Megatron torch_dist: the extra files are plain files; a key with '/' is encoded.
meg="$FIXTURES/09_megatron_torch_dist"
if [ -d "$meg/ckpt" ]; then
    mount_dcpfs "$meg/ckpt" "$SCRATCH/meg"
    cmp "$SCRATCH/meg/metadata.json" "$meg/ckpt/metadata.json" || fail "metadata.json differs"
    cmp "$SCRATCH/meg/common.pt" "$meg/ckpt/common.pt" || fail "common.pt differs"
    [ -f "$SCRATCH/meg/rng_state%2Fshard_0/0_1/1/random_rng_state" ] || fail "the ShardedObject key's path: $(cd "$SCRATCH/meg" && find . | tr '\n' ' ')"
    unmount_dcpfs "$SCRATCH/meg"
fi
# Inode numbers are stable across mounts.
ino1=$(stat -c %i "$f")
unmount_dcpfs "$mnt"
mount_dcpfs "$FIXTURES/01_single_plain/ckpt" "$mnt"
[ "$(stat -c %i "$f")" = "$ino1" ] || fail "inode of $f changed across mounts"
# Writes are refused.
( : >"$mnt/dtypes/new" ) 2>/dev/null && fail "creating a file succeeded"
( echo x >>"$f" ) 2>/dev/null && fail "appending succeeded"
unmount_dcpfs "$mnt"
echo "ok"
