# -o view=npy: every tensor is NAME.npy and numpy.load gives the manifest's values
# (bfloat16 as uint16 bits); bytes items keep their raw bytes.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_python_module numpy
need_fuse
fuse_scratch
i=0
for case in "$FIXTURES"/01_single_plain "$FIXTURES"/04_block_4ranks "$FIXTURES"/05_mixed_2ranks; do
    i=$((i + 1))
    mnt="$SCRATCH/m$i"
    mount_dcpfs "$case/ckpt" "$mnt" -o view=npy
    python3 "$FUSE_CHECK" tree "$mnt" "$case/expected/manifest.json" --ckpt="$case/ckpt" --npy
    python3 "$FUSE_CHECK" npy "$mnt" "$case/expected/manifest.json"
    unmount_dcpfs "$mnt"
done
# An empty tensor with a huge dimension (torch.empty(2**62, 0), float64: byte strides past 64
# bits) is a file of 0 bytes, its .npy the header alone naming its shape (numpy.load itself
# refuses that shape); one such key refused the whole checkpoint.
"$top_builddir/dcp" synth "$SCRATCH/huge" --keys 2 --shape 4611686018427387904,0 --dtype float64 >/dev/null ||
    fail "synth of an empty tensor failed"
mount_dcpfs "$SCRATCH/huge" "$SCRATCH/raw"
f="$SCRATCH/raw/model/layers/1/weight"
[ "$(stat -c %s "$f")" = 0 ] && [ "$(cat "$f" | wc -c)" = 0 ] || fail "raw view: $f is not empty"
unmount_dcpfs "$SCRATCH/raw"
mount_dcpfs "$SCRATCH/huge" "$SCRATCH/npy" -o view=npy
f="$SCRATCH/npy/model/layers/1/weight.npy"
[ "$(stat -c %s "$f")" = 128 ] && [ "$(cat "$f" | wc -c)" = 128 ] || fail "npy view: $f is not its header alone"
head -c 128 "$f" | tail -c +11 | grep -q "^{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 0), } *\$" ||
    fail "npy view: $f's header: $(head -c 128 "$f" | tail -c +11)"
unmount_dcpfs "$SCRATCH/npy"
echo "ok"
