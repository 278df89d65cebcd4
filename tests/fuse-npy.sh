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
echo "ok"
