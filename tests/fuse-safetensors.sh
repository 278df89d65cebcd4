# all.safetensors, the virtual safetensors file of every mounted checkpoint:
# for every fixture, safetensors.safe_open (torch and numpy) through the mount
# gives every tensor byte-exact against the manifest's sha256, bytes items are
# absent, random-offset reads match `dcp cat`, and the file equals what
# `dcp convert` writes. It is laid out on first use, not at mount. The npy
# view has it too, and a checkpoint without tensors gives a valid empty file.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_python_module numpy
need_python_module safetensors
need_python_module torch
need_fuse
fuse_scratch
VIEW=all.safetensors
i=0
for case in $(fixture_cases); do
    i=$((i + 1))
    mnt="$SCRATCH/m$i"
    mount_dcpfs "$case/ckpt" "$mnt"
    # Listing does not lay the file out; its first stat does.
    ls -R "$mnt" >/dev/null
    grep -q "$VIEW: laid out" "$mnt.log" && fail "$case: $VIEW laid out before it was used: $(cat "$mnt.log")"
    [ -f "$mnt/$VIEW" ] || fail "$case: no $VIEW: $(ls "$mnt" | tr '\n' ' ')"
    grep -q "$VIEW: laid out" "$mnt.log" || fail "$case: no log line for laying out $VIEW"
    python3 "$FUSE_CHECK" safetensors "$mnt" "$case/expected/manifest.json" "$DCP" "$case/ckpt"
    "$DCP" convert --quiet --no-sync "$case/ckpt" "$SCRATCH/conv$i.safetensors" >/dev/null
    cmp "$mnt/$VIEW" "$SCRATCH/conv$i.safetensors" || fail "$case: $VIEW differs from dcp convert's file"
    rm -f "$SCRATCH/conv$i.safetensors"
    unmount_dcpfs "$mnt"
done

# The npy view offers the same file.
mount_dcpfs "$FIXTURES/05_mixed_2ranks/ckpt" "$SCRATCH/npy" -o view=npy
python3 "$FUSE_CHECK" safetensors "$SCRATCH/npy" "$FIXTURES/05_mixed_2ranks/expected/manifest.json" "$DCP" \
    "$FIXTURES/05_mixed_2ranks/ckpt"
unmount_dcpfs "$SCRATCH/npy"

# Through splice and through pread the bytes are the same.
for mode in splice pread; do
    mount_dcpfs "$FIXTURES/03_colwise_4ranks/ckpt" "$SCRATCH/$mode" -o read=$mode
    python3 "$FUSE_CHECK" safetensors "$SCRATCH/$mode" "$FIXTURES/03_colwise_4ranks/expected/manifest.json" "$DCP" \
        "$FIXTURES/03_colwise_4ranks/ckpt"
    unmount_dcpfs "$SCRATCH/$mode"
done

# A checkpoint with no tensors (two bytes items only): a header and nothing else.
"$DCP" synth "$SCRATCH/notensors" --keys 0 --bytes-items 2 >/dev/null
mount_dcpfs "$SCRATCH/notensors" "$SCRATCH/nt"
python3 - "$SCRATCH/nt/$VIEW" <<'PY' || fail "a checkpoint without tensors"
import json, os, sys
from safetensors import safe_open
p = sys.argv[1]
raw = open(p, "rb").read()
n = int.from_bytes(raw[:8], "little")
assert len(raw) == 8 + n == os.stat(p).st_size, (len(raw), n)
assert json.loads(raw[8:]) == {"__metadata__": {"format": "pt"}}, raw
with safe_open(p, framework="pt") as f:
    assert list(f.keys()) == [], list(f.keys())
print(f"{p}: {len(raw)} bytes, no tensors")
PY
[ -f "$SCRATCH/nt/extra/0" ] || fail "the bytes items are not files"
unmount_dcpfs "$SCRATCH/nt"
echo "ok"
