#!/bin/bash
# dcpfs over a folder of runs with step folders whose save did not finish:
# they are not listed as checkpoints (nor looked up by name) but under the
# run's hidden .partial folder, each a directory that answers EIO with a log
# line and a user.dcp.partial attribute naming the reason (shard files
# without .metadata, .metadata.tmp, a Megatron folder without metadata.json,
# a tmp-checkpoint-N staging folder); a run holding only a partial step is
# shown, with its .partial; one completing while mounted (its .metadata
# renamed in, the staging folder renamed) appears as a checkpoint and leaves
# .partial, which goes once empty; a partial SOURCE is refused at mount.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_fuse
fuse_scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
S=$SCRATCH src="$S/runs" mnt="$S/mnt"
"$DCP" synth "$S/full" --keys 3 --shape 16,8 --ranks 4 --shard rows --seed 2 >/dev/null
key=$("$DCP" ls --json "$S/full" | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["key"])')
kpath=$(echo "$key" | tr . /)
mkdir -p "$src/run_a" "$src/run_b/step_1"
cp -r "$S/full" "$src/run_a/step_100"
mkdir "$src/run_a/step_200"; cp "$S/full"/*.distcp "$src/run_a/step_200/"                     # crashed before .metadata
mkdir "$src/run_a/step_300"; cp "$S/full"/*.distcp "$src/run_a/step_300/"
cp "$S/full/.metadata" "$src/run_a/step_300/.metadata.tmp"                                   # writing its metadata
cp -r "$FIXTURES/09_megatron_torch_dist/ckpt" "$src/run_a/iter_0000400"
rm "$src/run_a/iter_0000400/metadata.json"                                                   # Megatron: not finished
cp -r "$S/full" "$src/run_a/tmp-checkpoint-500"                                              # staged, not renamed
cp "$S/full/__0_0.distcp" "$src/run_b/step_1/"                                               # run_b: only a partial step

mount_dcpfs "$src" "$mnt"
[ "$(ls "$mnt")" = "$(printf 'run_a\nrun_b')" ] || fail "root lists: $(ls "$mnt" | tr '\n' ' ')"
[ "$(ls "$mnt/run_a")" = "step_100" ] || fail "run_a lists: $(ls "$mnt/run_a" | tr '\n' ' ')"
[ "$(ls -A "$mnt/run_a")" = "$(printf '.partial\nstep_100')" ] || fail "run_a lists (-A): $(ls -A "$mnt/run_a" | tr '\n' ' ')"
[ "$(ls "$mnt/run_a/.partial")" = "$(printf 'iter_0000400\nstep_200\nstep_300\ntmp-checkpoint-500')" ] ||
    fail ".partial lists: $(ls "$mnt/run_a/.partial" | tr '\n' ' ')"
for d in step_200 step_300 iter_0000400 tmp-checkpoint-500; do
    [ -e "$mnt/run_a/$d" ] && fail "the partial $d is shown as a checkpoint"
    [ -d "$mnt/run_a/.partial/$d" ] || fail ".partial/$d is not a directory"
done
[ "$(ls "$mnt/run_b")" = "" ] && [ "$(ls "$mnt/run_b/.partial")" = "step_1" ] || fail "run_b: $(ls -AR "$mnt/run_b")"
cmp <(cat "$mnt/run_a/step_100/$kpath") <("$DCP" cat "$S/full" "$key") || fail "step_100's $key"

# reading into a partial folder: EIO, a log line, the reason as an attribute
rc=0; ls "$mnt/run_a/.partial/step_200" >/dev/null 2>"$S/err" || rc=$?
[ $rc != 0 ] && grep -q "Input/output error" "$S/err" || fail "listing .partial/step_200: exit $rc: $(cat "$S/err")"
rc=0; cat "$mnt/run_a/.partial/step_200/$kpath" >/dev/null 2>"$S/err" || rc=$?
[ $rc != 0 ] && grep -q "Input/output error" "$S/err" || fail "reading into .partial/step_200: exit $rc: $(cat "$S/err")"
grep -qF "$src/run_a/step_200: a partial checkpoint: 4 shard files, no .metadata (the save did not finish)" "$mnt.log" ||
    fail "no log line for step_200: $(cat "$mnt.log")"
python3 - "$mnt/run_a/.partial" <<'PY' || fail "user.dcp.partial"
import os, sys
p = sys.argv[1]
want = {"step_200": "4 shard files, no .metadata (the save did not finish)",
        "step_300": "4 shard files, .metadata.tmp, no .metadata",
        "iter_0000400": "1 shard file, no metadata.json (Megatron writes it last",
        "tmp-checkpoint-500": '4 shard files in a temporary folder "tmp-checkpoint-500"'}
for d, w in want.items():
    v = os.getxattr(os.path.join(p, d), "user.dcp.partial").decode()
    assert ": a partial checkpoint: " + w in v, (d, v)
PY

# completing while mounted: the rename of .metadata, the staging folder renamed
mv "$src/run_a/step_300/.metadata.tmp" "$src/run_a/step_300/.metadata"
cp "$S/full/.metadata" "$src/run_a/step_200/"
mv "$src/run_a/tmp-checkpoint-500" "$src/run_a/checkpoint-500"
sleep 1.2
[ "$(ls "$mnt/run_a")" = "$(printf 'checkpoint-500\nstep_100\nstep_200\nstep_300')" ] ||
    fail "run_a after the saves completed: $(ls "$mnt/run_a" | tr '\n' ' ')"
[ "$(ls "$mnt/run_a/.partial")" = "iter_0000400" ] || fail ".partial after: $(ls "$mnt/run_a/.partial" | tr '\n' ' ')"
for d in step_200 step_300 checkpoint-500; do
    cmp <(cat "$mnt/run_a/$d/$kpath") <("$DCP" cat "$S/full" "$key") || fail "$d's $key once complete"
done
cp "$FIXTURES/09_megatron_torch_dist/ckpt/metadata.json" "$src/run_a/iter_0000400/"
sleep 1.2
ls "$mnt/run_a" | grep -qx iter_0000400 || fail "the Megatron folder does not appear once complete: $(ls "$mnt/run_a")"
[ "$(ls -A "$mnt/run_a" | grep -c '^\.partial$')" = 0 ] || fail ".partial stays once empty: $(ls -A "$mnt/run_a" | tr '\n' ' ')"
[ -f "$mnt/run_a/iter_0000400/metadata.json" ] || fail "iter_0000400/metadata.json"
unmount_dcpfs "$mnt"

# a partial SOURCE is refused with its reason
mkdir "$S/lone"; cp "$S/full"/*.distcp "$S/lone/"; mkdir "$S/m2"
rc=0; "$DCPFS" -f "$S/lone" "$S/m2" 2>"$S/err" || rc=$?
[ $rc != 0 ] && grep -qF "lone: a partial checkpoint: 4 shard files, no .metadata" "$S/err" || fail "mounting a partial SOURCE: exit $rc: $(cat "$S/err")"
mountpoint -q "$S/m2" && fail "a partial SOURCE got mounted"
echo "ok"
