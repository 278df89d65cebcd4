# SOURCE as a folder of checkpoints: nested checkpoints appear at their relative
# paths, a folder without .metadata is not shown, a checkpoint copied in while
# mounted appears without a remount, and SIGTERM unmounts cleanly.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_fuse
fuse_scratch
src="$SCRATCH/runs"
mkdir -p "$src/run_a" "$src/run_b/nested" "$src/empty" "$src/run_a/step_300"
cp -r "$FIXTURES/02_rowwise_4ranks/ckpt" "$src/run_a/step_100"
cp -r "$FIXTURES/05_mixed_2ranks/ckpt" "$src/run_a/step_200"
cp -r "$FIXTURES/08_single_file_per_rank/ckpt" "$src/run_b/nested/final"
cp "$FIXTURES/05_mixed_2ranks/ckpt/__0_0.distcp" "$src/run_a/step_300/"   # still being written
mnt="$SCRATCH/mnt"
mount_dcpfs "$src" "$mnt"
[ "$(ls "$mnt")" = "$(printf 'run_a\nrun_b')" ] || fail "root lists: $(ls "$mnt" | tr '\n' ' ')"
[ "$(ls "$mnt/run_a")" = "$(printf 'step_100\nstep_200')" ] || fail "run_a lists: $(ls "$mnt/run_a" | tr '\n' ' ')"
[ -e "$mnt/run_a/step_300" ] && fail "a checkpoint without .metadata is shown"
python3 "$FUSE_CHECK" tree "$mnt/run_a/step_100" "$FIXTURES/02_rowwise_4ranks/expected/manifest.json"
python3 "$FUSE_CHECK" tree "$mnt/run_a/step_200" "$FIXTURES/05_mixed_2ranks/expected/manifest.json"
python3 "$FUSE_CHECK" tree "$mnt/run_b/nested/final" "$FIXTURES/08_single_file_per_rank/expected/manifest.json"

# A new checkpoint copied in while mounted, and the pending one completing
# (which leaves run_a's mtime as it is, while the kernel holds run_a's listing:
# it is listed again once run_a's attributes, kept one second, say it moved).
ls "$mnt/run_a" >/dev/null
cp -r "$FIXTURES/04_block_4ranks/ckpt" "$src/run_b/added"
cp -r "$FIXTURES/05_mixed_2ranks/ckpt/." "$src/run_a/step_300/"
sleep 1.2
[ -d "$mnt/run_b/added" ] || fail "a checkpoint copied in while mounted does not appear"
ls "$mnt/run_b" | grep -qx added || fail "readdir does not list the added checkpoint"
python3 "$FUSE_CHECK" tree "$mnt/run_b/added" "$FIXTURES/04_block_4ranks/expected/manifest.json"
ls "$mnt/run_a" | grep -qx step_300 || fail "a checkpoint whose .metadata arrived later does not appear"
python3 "$FUSE_CHECK" tree "$mnt/run_a/step_300" "$FIXTURES/05_mixed_2ranks/expected/manifest.json"

# A whole new run folder, nested two levels.
mkdir -p "$src/run_c/x"
cp -r "$FIXTURES/08_single_file_per_rank/ckpt" "$src/run_c/x/y"
ls "$mnt/run_c/x/y/a" >/dev/null || fail "a new nested run does not appear"

# SIGTERM in the foreground unmounts and exits cleanly.
kill -TERM "$DCPFS_PID"
rc=0; wait "$DCPFS_PID" || rc=$?
[ "$rc" -eq 0 ] || fail "dcpfs exited with $rc on SIGTERM"
mountpoint -q "$mnt" && fail "still mounted after SIGTERM"
echo "ok"
