# PyTorch interop through the mount: a 2-process gloo save (DTensors sharded by
# rows and by columns, replicated, plain tensors, a non-tensor value) reads
# byte-exact through dcpfs.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_torch
need_fuse
fuse_scratch
timeout 300 python3 "$top_srcdir/tests/fuse_torch_save.py" "$SCRATCH/dt" dtensor >"$SCRATCH/save.log" 2>&1 ||
    { cat "$SCRATCH/save.log"; fail "PyTorch save failed"; }
mnt="$SCRATCH/mnt"
mount_dcpfs "$SCRATCH/dt/ckpt" "$mnt"
python3 "$FUSE_CHECK" tree "$mnt" "$SCRATCH/dt/truth.json"
python3 "$FUSE_CHECK" ranges "$mnt" "$SCRATCH/dt/truth.json" "$DCP" "$SCRATCH/dt/ckpt"
# The non-tensor value is the stored torch.save archive.
python3 -c 'import io, sys, torch; assert torch.load(open(sys.argv[1], "rb"), weights_only=False) == 5' \
    "$mnt/extra/epoch" || fail "extra/epoch is not the stored torch.save bytes"
unmount_dcpfs "$mnt"
echo "ok"
