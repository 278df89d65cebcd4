#!/bin/bash
# A checkpoint saved again under the same folder name while its run folder is
# mounted (torch's save into the same folder, rm -rf then a save, a save
# renamed into place) is served as saved last, never the old metadata over the
# new shard files; a file held open across a save in place fails (EIO); a
# checkpoint saved while mounted appears and one removed goes; saved again 12
# times, the daemon keeps the last save's model only, and a file held open
# across 3 saves reads its own until it is closed, its model freed then (dcpfs
# tells the kernel to drop the old entries: no drop_caches, no memory pressure),
# and so is one a process worked in (a folder of its key tree) once it leaves;
# SOURCE one checkpoint saved again is seen too (with -s as well); the session ended (SIGTERM,
# unmount, lazy unmount) while such a notification waits for a lookup. With and
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
# every checkpoint below saved with version 1 first, in one process (torch's import is the cost)
ends="term lazy umount term-s"
mkdir -p "$SCRATCH/no_catalog/runs" "$SCRATCH/catalog/runs" "$SCRATCH/single"
for how in $ends; do mkdir -p "$SCRATCH/end-$how"; done
# shellcheck disable=SC2046
$PY save "$SCRATCH/no_catalog/runs/latest" "$SCRATCH/catalog/runs/latest" "$SCRATCH/single/ckpt" \
    $(for how in $ends; do echo "$SCRATCH/end-$how/ckpt"; done) 1 || fail "saving the checkpoints failed"
for mode in no_catalog catalog; do
    src="$SCRATCH/$mode/runs" mnt="$SCRATCH/$mode/mnt"
    opt="-o no_catalog"
    # and no splice, opendir answered (every listing reaches dcpfs)
    [ $mode = catalog ] && opt="-o catalog=$SCRATCH/$mode/catalog.sqlite -o read=pread -o opendir"
    # -d: the log says which models are opened (a debug line) and freed: fuse_resave.py counts them
    mount_dcpfs "$src" "$mnt" -d $opt
    # the steps; saved again N times, a file held open across 3 saves: old models freed; a
    # process working in a folder of a save made again in place: its model freed once it leaves
    n=12; [ $mode = catalog ] && n=8   # a model kept a save: 11 open, not 1
    $PY all "$src" "$mnt" "$mnt.log" $n || fail "($mode, $n saves) see above; dcpfs's log: $(tail -20 "$mnt.log")"
    grep -q "runs/latest/__0_0.distcp: w: the data file was written to since the checkpoint was opened" "$mnt.log" ||
        fail "($mode) the log does not say why a file held open failed: $(tail -20 "$mnt.log")"
    unmount_dcpfs "$mnt"
done
# SOURCE one checkpoint, saved again in place, then removed and saved again; -s: one thread
# answers every request, the old saves' names are dropped all the same
ck="$SCRATCH/single/ckpt" mnt="$SCRATCH/single/mnt"
mount_dcpfs "$ck" "$mnt" -d -s -o no_catalog
$PY single "$ck" "$mnt" "$mnt.log" || fail "(one checkpoint) see above; dcpfs's log: $(tail -20 "$mnt.log")"
unmount_dcpfs "$mnt"
# The session ended while dcpfs tells the kernel to drop an old save's names: SIGTERM and a
# lazy unmount while the invalidation waits for a lookup that waits for the catalog, with
# more lookups behind it (term-s: SIGTERM with -s, the one thread waiting in that lookup); an
# unmount with the names just queued. The daemon exits (status 0) and the mount is gone.
for how in $ends; do
    dir="$SCRATCH/end-$how" ck="$SCRATCH/end-$how/ckpt" mnt="$SCRATCH/end-$how/mnt"
    s=; [ $how = term-s ] && s=-s
    mount_dcpfs "$ck" "$mnt" $s -o catalog="$dir/catalog.sqlite"
    $PY shutdown "$ck" "$mnt" "$mnt.log" "$dir/catalog.sqlite" "$DCPFS_PID" "${how%-s}" ||
        fail "(session ended: $how) see above; dcpfs's log: $(tail -20 "$mnt.log")"
    rc=0
    wait "$DCPFS_PID" || rc=$?
    [ $rc -eq 0 ] || fail "(session ended: $how) dcpfs exited with status $rc: $(tail -20 "$mnt.log")"
    ! mountpoint -q "$mnt" || fail "(session ended: $how) $mnt is still mounted"
done
echo PASS
