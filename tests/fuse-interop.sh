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
# Tensor subclasses (tests/data/subclasses): a torchao float8 weight reads as the tensor it holds,
# dcp cat's bytes; an NF4 weight, an intact record libdcp does not read, answers ENOTSUP
# ("Operation not supported"; it was EIO, as for damage), its digest xattr too, and the log says why.
sub="$top_srcdir/tests/data/subclasses/dcp"
mount_dcpfs "$sub" "$SCRATCH/sub"
"$DCP" cat "$sub" layers.0.attention.wq.weight | cmp - "$SCRATCH/sub/layers/0/attention/wq/weight" ||
    fail "a float8 training weight through the mount is not dcp cat's bytes"
python3 - "$SCRATCH/sub/layers/2/qlora/weight" <<'PY' || fail "the NF4 weight through the mount"
import errno, os, sys
for what, call in (("read", lambda p: open(p, "rb").read()), ("digest", lambda p: os.getxattr(p, "user.dcp.xxh3_128"))):
    try:
        call(sys.argv[1])
    except OSError as e:
        assert e.errno == errno.EOPNOTSUPP, f"{what}: {e}"
    else:
        raise AssertionError(f"{what}: no error")
PY
grep -qF "layers.2.qlora.weight: chunk 0 at offset 18038: data.pkl does not rebuild a plain tensor (a torchao.quantization.quantize_.workflows.nf4.nf4_tensor.NF4Tensor" \
    "$SCRATCH/sub.log" || fail "the log does not say why the NF4 weight was refused: $(cat "$SCRATCH/sub.log")"
unmount_dcpfs "$SCRATCH/sub"
echo "ok"
