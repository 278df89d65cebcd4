#!/bin/bash
# Per-rank DTensor saves through the mount: a 2-process gloo save with torch-checkpointing
# (model_R.pt, extra_R.pt, step_R.pt) and the same state dict as verl writes it
# (model_world_size_2_rank_R.pt) mount with dcpfs; every tensor reads byte-exact against the
# writer's full_tensor() (whole files and random ranges against `dcp cat`), and the item
# without tensors is its torch.save archive.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_torch
python3 -c 'import torch_checkpointing' 2>/dev/null ||
    fail "torch_checkpointing is not installed (pip install --no-deps torch-checkpointing==0.1.1, as .ci/run does)"
need_fuse
fuse_scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
S="$SCRATCH/w2"
timeout 300 python3 "$top_srcdir/tests/interop/save_rankfiles.py" "$S" 2 >"$SCRATCH/save.log" 2>&1 ||
    { cat "$SCRATCH/save.log"; fail "the 2-rank save failed"; }
mnt="$SCRATCH/mnt"
mount_dcpfs "$S/tc" "$mnt"
python3 "$FUSE_CHECK" tree "$mnt" "$S/truth.json"
python3 "$FUSE_CHECK" ranges "$mnt" "$S/truth.json" "$DCP" "$S/tc"
python3 -c 'import sys, torch; assert torch.load(open(sys.argv[1], "rb"), weights_only=False) == 42' \
    "$mnt/step" || fail "step is not the stored torch.save of 42"
unmount_dcpfs "$mnt"
python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))
json.dump({k: v for k, v in t.items() if k.startswith("model.")}, open(sys.argv[2], "w"))' \
    "$S/truth.json" "$S/model.json"
vmnt="$SCRATCH/vmnt"
mount_dcpfs "$S/verl" "$vmnt"
python3 "$FUSE_CHECK" ranges "$vmnt" "$S/model.json" "$DCP" "$S/verl"
python3 - "$vmnt" "$S/full.pt" <<'PY' || fail "the verl mount differs from the full tensors"
import os, sys, torch
mnt, full = sys.argv[1], torch.load(sys.argv[2])
for k, t in full.items():
    p = os.path.join(mnt, "model", *k.split("."))
    want = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
    assert open(p, "rb").read() == want, k
print(len(full), "tensors byte-exact through the verl mount")
PY
unmount_dcpfs "$vmnt"
echo "ok"
