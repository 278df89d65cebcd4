#!/bin/bash
# A committed torch-checkpointing folder (tests/data/rankfiles/tc2: model_R.pt and step_R.pt of
# a 2-process gloo save by tests/interop/save_rankfiles.py) opens without PyTorch: its keys,
# shapes and chunks, `dcp digest` equal to the digests of the same weights saved as DCP
# (tc2.digest, from that save's OUT_DIR/dcp), the step item the stored torch.save archive, and
# copies with a rank file cut short, missing or duplicated under another rank fail naming it.
. "$top_srcdir/tests/lib.sh"
scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
T="$top_srcdir/tests/data/rankfiles/tc2"
"$DCP" info "$T" | grep -q 'format: *torch-checkpointing' || fail "dcp info: $("$DCP" info "$T")"
"$DCP" ls "$T" >"$SCRATCH/ls" || fail "dcp ls"
grep -qE '^model\.w0 +float32 +\[10,6\]' "$SCRATCH/ls" || fail "model.w0: $(cat "$SCRATCH/ls")"
grep -qE '^model\.cols +bfloat16 +\[4,9\]' "$SCRATCH/ls" || fail "model.cols: $(cat "$SCRATCH/ls")"
grep -qE '^step +bytes' "$SCRATCH/ls" || fail "step: $(cat "$SCRATCH/ls")"
"$DCP" digest --keys 'model.*' "$T" | sort | diff "$top_srcdir/tests/data/rankfiles/tc2.digest" - ||
    fail "digests differ from the DCP save of the same weights"
# rows 0-4 from rank 0, 5-9 from rank 1, in one read across the two files
"$DCP" cat --box 3:4,0:6 "$T" model.w0 >"$SCRATCH/box" || fail "dcp cat --box"
[ "$(stat -c %s "$SCRATCH/box")" = 96 ] || fail "box of 4x6 float32 is not 96 bytes"
"$DCP" cat "$T" model.w0 | tail -c +73 | head -c 96 | cmp - "$SCRATCH/box" || fail "the box differs from the whole's rows 3-6"
"$DCP" cat "$T" step | cmp - "$T/step_0.pt" || fail "step is not step_0.pt"
# metadata.pkl (torch-checkpointing writes it when an item has a resharder) is not read
cp -r "$T" "$SCRATCH/withmeta"; printf 'not read' >"$SCRATCH/withmeta/metadata.pkl"
"$DCP" digest --keys 'model.*' "$SCRATCH/withmeta" | sort | diff "$top_srcdir/tests/data/rankfiles/tc2.digest" - ||
    fail "a metadata.pkl beside the rank files changed the digests"
cp -r "$T" "$SCRATCH/cut"; truncate -s 2000 "$SCRATCH/cut/model_0.pt"
expect_fail "cut/model_0.pt: rank file: corrupt torch.save archive" "$DCP" ls "$SCRATCH/cut"
cp -r "$T" "$SCRATCH/gone"; rm "$SCRATCH/gone/step_1.pt"
expect_fail "item model has 2 rank files, item step 1" "$DCP" ls "$SCRATCH/gone"
cp -r "$T" "$SCRATCH/dup"; cp "$T/model_0.pt" "$SCRATCH/dup/model_1.pt"
expect_fail "model_1.pt: model.w0: the DeviceMesh says rank 0, the file's name rank 1" "$DCP" ls "$SCRATCH/dup"
echo "ok"
