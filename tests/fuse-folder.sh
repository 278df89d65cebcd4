# SOURCE as a folder of checkpoints: nested checkpoints appear at their relative
# paths (every layout dcp reads), a folder without checkpoint files is not shown, a checkpoint copied in while
# mounted appears without a remount, a run folder's plain files (Megatron-LM's
# latest_checkpointed_iteration.txt) appear as they are and follow rewrites in
# place, a checkpoint saved straight into a folder of them makes it that checkpoint,
# and SIGTERM unmounts cleanly.
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
printf 200 >"$src/run_a/latest_checkpointed_iteration.txt"   # what Megatron-LM writes beside its saves
touch "$src/run_a/.lock"                                      # dot-files stay hidden
cp -r "$FIXTURES/01_single_plain/ckpt" "$src/run_b/noted"
echo 'beside the data' >"$src/run_b/noted/notes.txt"          # a checkpoint's plain file
mkfifo "$src/run_b/fifo"                                      # not a plain file: not shown
mkdir "$src/old_export.safetensors"                           # a folder: SOURCE stays a folder of runs
mnt="$SCRATCH/mnt"
mount_dcpfs "$src" "$mnt"
[ "$(ls "$mnt")" = "$(printf 'run_a\nrun_b')" ] || fail "root lists: $(ls "$mnt" | tr '\n' ' ')"
grep -q "no checkpoint below it yet" "$mnt.log" && fail "a folder of checkpoints was said to hold none: $(cat "$mnt.log")"
[ "$(ls -A "$mnt/run_a")" = "$(printf '.partial\nlatest_checkpointed_iteration.txt\nstep_100\nstep_200')" ] ||
    fail "run_a lists: $(ls -A "$mnt/run_a" | tr '\n' ' ')"
[ "$(ls "$mnt/run_b")" = "$(printf 'nested\nnoted')" ] || fail "run_b lists: $(ls "$mnt/run_b" | tr '\n' ' ')"
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

# The tracker file, rewritten in place by the next save (a longer number: the
# size changes, the folder's mtime does not), then replaced by rename; a file
# added and one removed (seen within the one-second timeouts)
tracker="$mnt/run_a/latest_checkpointed_iteration.txt"
[ "$(cat "$tracker")" = 200 ] || fail "the tracker file reads '$(cat "$tracker")', not 200"
exec 3<"$tracker"   # a reader holding it open across the rewrite
printf 300 >"$src/run_a/latest_checkpointed_iteration.txt"
printf 1000000 >"$src/run_a/latest_checkpointed_iteration.txt"
sleep 1.2
[ "$(cat "$tracker")" = 1000000 ] || fail "after a rewrite in place the tracker file reads '$(cat "$tracker")'"
[ "$(stat -c %s "$tracker")" = 7 ] || fail "after a rewrite in place the tracker file has size $(stat -c %s "$tracker")"
exec 3<&-
printf 400 >"$src/run_a/tracker.tmp" && mv "$src/run_a/tracker.tmp" "$src/run_a/latest_checkpointed_iteration.txt"
echo "lr: 3e-4" >"$src/run_a/config.yaml"
sleep 1.2
[ "$(cat "$tracker")" = 400 ] || fail "after a rename over it the tracker file reads '$(cat "$tracker")'"
[ "$(cat "$mnt/run_a/config.yaml")" = "lr: 3e-4" ] || fail "a file added while mounted: '$(cat "$mnt/run_a/config.yaml")'"
rm "$src/run_a/config.yaml"
sleep 1.2
[ -e "$mnt/run_a/config.yaml" ] && fail "a removed file is still shown"
ls "$mnt/run_a" | grep -qx config.yaml && fail "a removed file is still listed"
echo 'a plain file' >"$src/top.txt"
sleep 1.2
[ "$(cat "$mnt/top.txt")" = 'a plain file' ] || fail "a plain file of SOURCE reads '$(cat "$mnt/top.txt")'"
# A FIFO put in a listed file's place (the run's, a checkpoint's) fails the open, never hangs it
[ "$(cat "$mnt/run_b/noted/notes.txt")" = 'beside the data' ] || fail "a checkpoint's plain file reads otherwise"
for f in run_a/latest_checkpointed_iteration.txt run_b/noted/notes.txt; do
    mkfifo "$src/$f.fifo" && mv "$src/$f.fifo" "$src/$f"
    rc=0; timeout -k 2 10 cat "$mnt/$f" >/dev/null 2>&1 || rc=$?
    exec 4<>"$src/$f"; exec 4<&-   # a writer that lets a daemon stuck in open(2) go
    [ $rc != 0 ] && [ $rc != 124 ] && [ $rc != 137 ] || fail "$f replaced by a FIFO: cat exited $rc (124, 137: it hung)"
    rm "$src/$f"
done
printf 400 >"$src/run_a/latest_checkpointed_iteration.txt"
touch "$mnt/run_a/x" 2>/dev/null && fail "a file could be created in a scan folder"
echo x 2>/dev/null >>"$tracker" && fail "a scan folder's file could be written"

# A checkpoint saved straight into a folder of checkpoints (shards first, .metadata last) makes
# the folder that checkpoint, as a new mount shows it: its own checkpoint below is not shown;
[ -d "$mnt/run_b/nested/final" ] || fail "run_b/nested/final is not shown"
cp "$FIXTURES/01_single_plain/ckpt/"*.distcp "$src/run_b/nested/"
ls "$mnt/run_b/nested" >/dev/null
cp "$FIXTURES/01_single_plain/ckpt/.metadata" "$src/run_b/nested/"
sleep 1.2
[ -e "$mnt/run_b/nested/final" ] && fail "a folder a checkpoint was saved into still shows its subfolder: $(ls "$mnt/run_b/nested")"
python3 "$FUSE_CHECK" tree "$mnt/run_b/nested" "$FIXTURES/01_single_plain/expected/manifest.json"
grep -q "run_b/nested: a checkpoint was saved into the folder: it is read as one" "$mnt.log" ||
    fail "the log does not say run_b/nested is read as a checkpoint: $(tail -5 "$mnt.log")"
# and removed again (.metadata first), the folder of checkpoints it was
rm "$src/run_b/nested/.metadata" "$src/run_b/nested/"*.distcp
sleep 1.2
python3 "$FUSE_CHECK" tree "$mnt/run_b/nested/final" "$FIXTURES/08_single_file_per_rank/expected/manifest.json"

# A whole new run folder, nested two levels.
mkdir -p "$src/run_c/x"
cp -r "$FIXTURES/08_single_file_per_rank/ckpt" "$src/run_c/x/y"
ls "$mnt/run_c/x/y/a" >/dev/null || fail "a new nested run does not appear"

# SIGTERM in the foreground unmounts and exits cleanly.
kill -TERM "$DCPFS_PID"
rc=0; wait "$DCPFS_PID" || rc=$?
[ "$rc" -eq 0 ] || fail "dcpfs exited with $rc on SIGTERM"
mountpoint -q "$mnt" && fail "still mounted after SIGTERM"

# A catalog named inside one checkpoint of SOURCE is not used at all: opening the others would
# have created and filled it there (each open checks only its own folder).
before=$(ls -lAR --time-style=full-iso "$src/run_a/step_200" | sha256sum)
mount_dcpfs "$src" "$SCRATCH/mnt2" -o "catalog=$src/run_a/step_200/cat.sqlite"
ls -R "$SCRATCH/mnt2/run_a/step_100" "$SCRATCH/mnt2/run_b/nested/final" >/dev/null || fail "the second mount lists nothing"
cmp -s "$SCRATCH/mnt2/run_a/step_200/enc/weight" <("$DCP" --no-catalog cat "$src/run_a/step_200" enc.weight) ||
    fail "the second mount's step_200/enc/weight"
unmount_dcpfs "$SCRATCH/mnt2"
[ "$before" = "$(ls -lAR --time-style=full-iso "$src/run_a/step_200" | sha256sum)" ] ||
    fail "a checkpoint of SOURCE was written to: $(ls -A "$src/run_a/step_200")"
grep -q "the catalog may not live inside $src.*not used" "$SCRATCH/mnt2.log" ||
    fail "the refused catalog is not logged: $(cat "$SCRATCH/mnt2.log")"
# The other layouts dcp reads appear in a folder too: a rank-local save (__R.metadata), a Hugging
# Face folder of safetensors shards, per-rank torch.save files (torch-checkpointing), each file
# equal to dcp cat's bytes; -o rank=R gives the rank-local one's rank R view and leaves the others
# as they are. A folder with its own model.safetensors beside step folders stays a folder (its
# steps are shown), and a rank-local save replaced while mounted is read anew.
lay="$SCRATCH/layouts"
mkdir -p "$lay/run/step_1"
cp -r "$top_srcdir/tests/data/metadata/pt_ranklocal" "$lay/local"
cp -r "$top_srcdir/tests/data/hf_sharded" "$lay/hf"
cp -r "$top_srcdir/tests/data/rankfiles/tc2" "$lay/tc"
cp -r "$FIXTURES/05_mixed_2ranks/ckpt" "$lay/run/step_1/ckpt"
cp "$lay/hf/model-00001-of-00004.safetensors" "$lay/run/model.safetensors"
mount_dcpfs "$lay" "$SCRATCH/mlay" -o no_catalog
[ "$(ls "$SCRATCH/mlay" | tr '\n' ' ')" = "hf local run tc " ] || fail "the layouts folder lists: $(ls "$SCRATCH/mlay")"
[ "$(ls "$SCRATCH/mlay/run" | tr '\n' ' ')" = "model.safetensors step_1 " ] ||
    fail "a folder with a model.safetensors beside its steps lists: $(ls "$SCRATCH/mlay/run")"
cmp -s "$lay/run/model.safetensors" "$SCRATCH/mlay/run/model.safetensors" || fail "run/model.safetensors is not its plain file"
# Its step folders removed (listed since), it is the checkpoint its own files are, as a new mount
# shows it; a step saved into it again makes it a folder again.
mv "$lay/run/step_1" "$lay/step_1.aside"
sleep 1.1   # past the kernel's cached listing
ls "$SCRATCH/mlay/run" >/dev/null
sleep 1.1   # and its cached entry of run
k=$("$DCP" --no-catalog ls --json "$lay/run" | python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["key"])')
cmp -s <("$DCP" --no-catalog cat "$lay/run" "$k") "$SCRATCH/mlay/run/${k//.//}" ||
    fail "a folder with a model.safetensors and its step folders removed is not that checkpoint: $(ls "$SCRATCH/mlay/run")"
grep -q "$lay/run: no checkpoint below the folder any more, and its own files are one: it is read as one" "$SCRATCH/mlay.log" ||
    fail "the folder that became a checkpoint is not logged: $(cat "$SCRATCH/mlay.log")"
mv "$lay/step_1.aside" "$lay/run/step_1"
sleep 1.1
[ "$(ls "$SCRATCH/mlay/run" | tr '\n' ' ')" = "model.safetensors step_1 " ] ||
    fail "a step saved again into a folder with a model.safetensors: it lists $(ls "$SCRATCH/mlay/run")"
for c in local hf tc; do
    "$DCP" --no-catalog ls --json "$lay/$c" | python3 -c 'import json, sys
for l in sys.stdin: print(json.loads(l)["key"])' >"$SCRATCH/keys.$c"
    [ -s "$SCRATCH/keys.$c" ] || fail "no keys in $c"
    while read -r k; do
        cmp -s <("$DCP" --no-catalog cat "$lay/$c" "$k") "$SCRATCH/mlay/$c/${k//.//}" ||
            fail "$c/$k through a folder mount is not dcp cat's bytes"
    done <"$SCRATCH/keys.$c"
done
[ -e "$SCRATCH/mlay/local/rank0/only" ] && [ -e "$SCRATCH/mlay/local/rank1/only" ] || fail "the rank-local save is not merged"
rm -rf "$lay/local" && cp -r "$lay/hf" "$lay/local"   # saved over with another checkpoint
sleep 1.1   # past the kernel's entry cache
[ -e "$SCRATCH/mlay/local/model.safetensors.index.json" ] && [ ! -e "$SCRATCH/mlay/local/rank0" ] ||
    fail "a replaced rank-local save is not read anew: $(ls "$SCRATCH/mlay/local")"
unmount_dcpfs "$SCRATCH/mlay"
rm -rf "$lay/local" && cp -r "$top_srcdir/tests/data/metadata/pt_ranklocal" "$lay/local"
mount_dcpfs "$lay" "$SCRATCH/mlay" -o no_catalog,rank=1
[ -e "$SCRATCH/mlay/local/rank1/only" ] && [ ! -e "$SCRATCH/mlay/local/rank0" ] || fail "-o rank=1: $(ls "$SCRATCH/mlay/local")"
cmp -s <("$DCP" --rank 1 cat "$lay/local" rank1.meta.rank) "$SCRATCH/mlay/local/rank1/meta/rank" || fail "-o rank=1: rank1.meta.rank"
cmp -s <("$DCP" cat "$lay/run/step_1/ckpt" enc.weight) "$SCRATCH/mlay/run/step_1/ckpt/enc/weight" ||
    fail "-o rank=1: a checkpoint with a global .metadata is not read as it is"
[ -e "$SCRATCH/mlay/hf/model.safetensors.index.json" ] || fail "-o rank=1: the safetensors folder"
unmount_dcpfs "$SCRATCH/mlay"
# A SOURCE with no checkpoint below it (a mistyped path, a run not saved yet): mounted, and said once.
mkdir -p "$SCRATCH/nothing/sub" && echo notes >"$SCRATCH/nothing/notes.txt"
mount_dcpfs "$SCRATCH/nothing" "$SCRATCH/mnt3"
grep -q "$SCRATCH/nothing: no checkpoint below it yet (no .metadata, __R.metadata or .safetensors files within 8 folder levels)" \
    "$SCRATCH/mnt3.log" || fail "an empty SOURCE mounted silently: $(cat "$SCRATCH/mnt3.log")"
[ "$(ls "$SCRATCH/mnt3")" = notes.txt ] || fail "the empty SOURCE lists: $(ls "$SCRATCH/mnt3")"
unmount_dcpfs "$SCRATCH/mnt3"
echo "ok"
