#!/bin/bash
# A checkpoint saved again under the same folder name while its run folder is
# mounted (torch's save into the same folder, rm -rf then a save, a save
# renamed into place) is served as saved last, never the old metadata over the
# new shard files; a file held open across a save in place fails (EIO); a
# checkpoint saved while mounted appears and one removed goes. With and
# without the catalog, splicing and reading through a buffer, listings cached
# by the kernel and answered by dcpfs
# (tests/fuse_resave.py does the saves and the checks).
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
python3 -c "import torch.distributed.checkpoint" 2>/dev/null || skip "PyTorch is not installed"
need_fuse
fuse_scratch
PY="python3 $top_srcdir/tests/fuse_resave.py"
for mode in no_catalog catalog; do
    src="$SCRATCH/$mode/runs" mnt="$SCRATCH/$mode/mnt"
    mkdir -p "$src"
    $PY save "$src/latest" 1
    opt="-o no_catalog"
    # and no splice, opendir answered (every listing reaches dcpfs)
    [ $mode = catalog ] && opt="-o catalog=$SCRATCH/$mode/catalog.sqlite -o read=pread -o opendir"
    mount_dcpfs "$src" "$mnt" $opt
    $PY "$src" "$mnt" || fail "($mode) see above; dcpfs's log: $(tail -20 "$mnt.log")"
    grep -q "runs/latest/__0_0.distcp: w: the data file was written to since the checkpoint was opened" "$mnt.log" ||
        fail "($mode) the log does not say why a file held open failed: $(tail -20 "$mnt.log")"
    unmount_dcpfs "$mnt"
done
echo PASS
