#!/bin/bash
# Partial checkpoints (a save that did not finish) are named as such by
# dcp info / ls / cat / digest (exit 3, "a partial checkpoint: REASON"),
# distinct from "not a checkpoint" (exit 1): shard files without .metadata,
# torch's in-flight .metadata.tmp (and __R.metadata.tmp), a Megatron folder
# without metadata.json, checkpoint files in a tmp-/tmp_/.tmp folder; the
# library's dcp_open says "a partial checkpoint" too, and a complete
# checkpoint, an HF folder and a Megatron one open as before.
. "$top_srcdir/tests/lib.sh"
scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
S=$SCRATCH
"$DCP" synth "$S/full" --keys 3 --shape 16,8 --ranks 4 --shard rows --seed 2 >/dev/null
ls "$S/full"/*.distcp >/dev/null

# partial PATH "REASON": dcp info, ls, cat and digest exit 3 naming it
partial() {
    local p=$1 why=$2 cmd rc
    for cmd in info ls digest; do
        rc=0; "$DCP" $cmd "$p" >"$S/out" 2>"$S/err" || rc=$?
        [ $rc = 3 ] || fail "dcp $cmd $p: exit $rc, not 3: $(cat "$S/err")"
        grep -qF "dcp: $p: a partial checkpoint: $why" "$S/err" || fail "dcp $cmd $p: $(cat "$S/err") (want: $why)"
        [ -s "$S/out" ] && fail "dcp $cmd $p printed: $(cat "$S/out")"
    done
    rc=0; "$DCP" cat "$p" k >/dev/null 2>"$S/err" || rc=$?
    [ $rc = 3 ] && grep -qF "a partial checkpoint" "$S/err" || fail "dcp cat $p: exit $rc: $(cat "$S/err")"
    # convert too (nothing written), and diff, whose 1 means "they differ", says 2
    rc=0; "$DCP" convert "$p" "$S/conv.safetensors" >/dev/null 2>"$S/err" || rc=$?
    [ $rc = 3 ] && grep -qF "dcp: $p: a partial checkpoint: $why" "$S/err" && [ ! -e "$S/conv.safetensors" ] ||
        fail "dcp convert $p: exit $rc: $(cat "$S/err")"
    rc=0; "$DCP" diff "$p" "$S/full" >/dev/null 2>"$S/err" || rc=$?
    [ $rc = 2 ] && grep -qF "a partial checkpoint" "$S/err" || fail "dcp diff $p: exit $rc: $(cat "$S/err")"
}

# 1. the shards of a save that crashed before .metadata
mkdir "$S/step_100"; cp "$S/full"/*.distcp "$S/step_100/"
partial "$S/step_100" "4 shard files, no .metadata (the save did not finish)"
# dcp_open's own message, with the catalog off too
expect_fail "step_100: a partial checkpoint: 4 shard files, no .metadata (the save did not finish)" \
    "$DCP" --no-catalog layout "$S/step_100"

# 2. DCP's in-flight name: .metadata.tmp written, not yet renamed
mkdir "$S/step_200"; cp "$S/full"/*.distcp "$S/step_200/"; cp "$S/full/.metadata" "$S/step_200/.metadata.tmp"
partial "$S/step_200" "4 shard files, .metadata.tmp, no .metadata (the save was writing its metadata and did not finish)"
# ... beside an old .metadata: a save into the folder is in flight
cp -r "$S/full" "$S/step_210"; cp "$S/full/.metadata" "$S/step_210/.metadata.tmp"
partial "$S/step_210" "4 shard files, .metadata.tmp beside .metadata"
# rank-local: __0.metadata.tmp
mkdir "$S/step_220"; cp "$S/full/__0_0.distcp" "$S/step_220/"; cp "$S/full/.metadata" "$S/step_220/__0.metadata.tmp"
partial "$S/step_220" "1 shard file, __R.metadata.tmp files"

# 3. Megatron: common.pt and a complete DCP part, but no metadata.json (written last)
M="$FIXTURES/09_megatron_torch_dist/ckpt"
cp -r "$M" "$S/iter_0000300"; rm "$S/iter_0000300/metadata.json"
partial "$S/iter_0000300" "1 shard file, no metadata.json (Megatron writes it last: the save did not finish)"
mkdir "$S/iter_0000400"; cp "$M/common.pt" "$S/iter_0000400/"
partial "$S/iter_0000400" "common.pt but no shard files"
# iter_N named, shard files but no .metadata yet
mkdir "$S/iter_0000500"; cp "$S/full"/*.distcp "$S/iter_0000500/"
partial "$S/iter_0000500" "4 shard files, no .metadata (the save did not finish)"
# iter_N named, a finished torch save and no common.pt: what Megatron-LM's fsdp_dtensor and
# torch_dcp formats write (tests/export-megatron-fsdp.sh saves one): complete
cp -r "$S/full" "$S/iter_0000600"
"$DCP" info "$S/iter_0000600" >/dev/null || fail "a complete DCP save in iter_0000600 does not open"
# the complete Megatron folder opens
"$DCP" info "$M" >/dev/null || fail "the complete Megatron checkpoint does not open"

# 4. Hugging Face shards without their index (save_pretrained writes it last)
"$DCP" convert --quiet --max-shard-size 300 "$S/full" "$S/hf_partial"
n=$(ls "$S/hf_partial"/model-*-of-*.safetensors | wc -l)
[ "$n" -gt 1 ] || fail "one HF shard: $(ls "$S/hf_partial")"
rm "$S/hf_partial/model.safetensors.index.json"
partial "$S/hf_partial" "$n of $n shard files, no model.safetensors.index.json (it is written last: the save did not finish)"

# 5. a staged save not renamed yet (tmp-checkpoint-N, tmp_*, *.tmp)
for d in tmp-checkpoint-600 tmp_step_600 step_600.tmp; do
    cp -r "$S/full" "$S/$d"
    partial "$S/$d" "4 shard files in a temporary folder \"$d\" (the save did not finish, or was not renamed yet)"
done

# not a checkpoint: exit 1, another message
mkdir "$S/empty"; echo hi >"$S/empty/notes.txt"
rc=0; "$DCP" info "$S/empty" 2>"$S/err" || rc=$?
[ $rc = 1 ] && grep -q "not a checkpoint" "$S/err" && ! grep -q partial "$S/err" || fail "empty: exit $rc: $(cat "$S/err")"
grep -q "holds" "$S/err" && fail "empty: names checkpoints below it: $(cat "$S/err")"
# ... but a run folder's "not a checkpoint" names the checkpoint folders one level below it
# (libdcp's message), how many did not finish, and Megatron-LM's latest_checkpointed_iteration.txt
mkdir "$S/run"
for d in iter_0000010 iter_0000009 iter_0000100; do cp -r "$M" "$S/run/$d"; done
cp -r "$S/step_200" "$S/run/iter_0000200"   # .metadata.tmp: partial
echo 100 >"$S/run/latest_checkpointed_iteration.txt"
# Names alone do not make files: a folder, a dangling link and a FIFO whose names end like a
# checkpoint's files leave the run folder a run folder (they made it "cannot open: Invalid argument").
mkdir "$S/run/old_export.safetensors" "$S/run/stale.distcp"
ln -s "$S/nowhere" "$S/run/broken.safetensors"
mkfifo "$S/run/__0.metadata"
rc=0; "$DCP" info "$S/run" 2>"$S/err" || rc=$?
[ $rc = 1 ] || fail "a run folder: exit $rc: $(cat "$S/err")"
printf '%s\n' "dcp: $S/run: not a checkpoint: no .metadata, __R.metadata or .safetensors files; it holds the checkpoint folders iter_0000009/, iter_0000010/ and iter_0000100/: open one of them" \
    "dcp: $S/run's latest_checkpointed_iteration.txt names $S/run/iter_0000100" \
    "dcp: $S/run holds 1 partial checkpoint (a save that did not finish)" | diff - "$S/err" || fail "a run folder"
# many: the first two and the last two, in natural order, and how many; a tracker naming none is not repeated
mkdir "$S/run2"
for i in 5 40 300 2000 10000 100000 7; do cp -r "$S/full" "$S/run2/step-$i"; done
echo 99 >"$S/run2/latest_checkpointed_iteration.txt"
rc=0; "$DCP" ls "$S/run2/" 2>"$S/err" || rc=$?
[ $rc = 1 ] && echo "dcp: $S/run2/: not a checkpoint: no .metadata, __R.metadata or .safetensors files; it holds the checkpoint folders step-5/, step-7/, ..., step-10000/ and step-100000/ (7 in all): open one of them" |
    diff - "$S/err" || fail "a run folder of 7: exit $rc"
# only partial ones below
mkdir "$S/run3"; cp -r "$S/step_200" "$S/run3/a"; cp -r "$S/step_200" "$S/run3/b"
rc=0; "$DCP" ls "$S/run3" 2>"$S/err" || rc=$?
[ $rc = 1 ] && printf '%s\n' "dcp: $S/run3: not a checkpoint: no .metadata, __R.metadata or .safetensors files" \
    "dcp: $S/run3 holds 2 partial checkpoints (saves that did not finish) and no complete one" |
    diff - "$S/err" || fail "a run folder of partial saves: exit $rc"
rc=0; "$DCP" ls "$S/no-such" 2>"$S/err" || rc=$?
[ $rc = 1 ] || fail "a missing folder: exit $rc: $(cat "$S/err")"

# complete ones are untouched: DCP, HF folder, single files; a mktemp-like "tmp.XXXX" name is no staging name
"$DCP" ls "$S/full" >/dev/null || fail "the complete checkpoint"
"$DCP" convert --quiet --max-shard-size 300 "$S/full" "$S/hf"
"$DCP" ls "$S/hf" >/dev/null || fail "the HF folder"
cp -r "$S/full" "$S/tmp.Ab12Cd"
"$DCP" info "$S/tmp.Ab12Cd" >/dev/null || fail "a folder named like mktemp's is taken for a staged save"

# a partial checkpoint completing: its .metadata arrives, and it opens
cp "$S/full/.metadata" "$S/step_100/"
"$DCP" ls "$S/step_100" >/dev/null || fail "step_100 once complete"
diff <("$DCP" digest "$S/full") <("$DCP" digest "$S/step_100") || fail "step_100's values differ from full's"
echo "partial checkpoints: named by every kind of unfinished save, exit 3"
