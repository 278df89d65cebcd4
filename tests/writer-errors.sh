# dcp convert and dcp synth refuse bad requests with clear messages and leave nothing behind.
. "$top_srcdir/tests/lib.sh"
scratch
F="$FIXTURES/01_single_plain/ckpt"
mkdir "$SCRATCH/exists"
expect_fail "already exists" $DCP convert "$F" "$SCRATCH/exists"
expect_fail "no key matches" $DCP convert --keys 'nope.*' "$F" "$SCRATCH/none.pt"
expect_fail "cannot open" $DCP convert "$SCRATCH/missing" "$SCRATCH/x.pt"
printf 'not a zip' >"$SCRATCH/bad.pt"
expect_fail "bad.pt" $DCP convert "$SCRATCH/bad.pt" "$SCRATCH/y"
printf '\377\377\377\377\377\377\377\377' >"$SCRATCH/bad.safetensors"
expect_fail "out of range" $DCP convert "$SCRATCH/bad.safetensors" "$SCRATCH/z"
expect_fail "without .safetensors" $DCP convert --max-shard-size 1M "$F" "$SCRATCH/s.safetensors"
expect_fail "unknown format" $DCP convert --to zip "$F" "$SCRATCH/q"
expect_fail "bad value" $DCP synth "$SCRATCH/s" --shard diagonal
expect_fail "unknown dtype" $DCP synth "$SCRATCH/s" --dtype float7
expect_fail "too large" $DCP synth "$SCRATCH/s" --total 1G --shape 4294967296,4294967296,16
$DCP synth "$SCRATCH/s" --keys 1 --shape 4
expect_fail "already holds a checkpoint" $DCP synth "$SCRATCH/s" --keys 1 --shape 4
# A destination with trailing slashes names the folder (the man page's example).
$DCP convert -q --max-shard-size 5GB "$F" "$SCRATCH/hf/" || fail "convert to a folder given as hf/"
[ -f "$SCRATCH/hf/model.safetensors.index.json" ] || fail "hf/: no index"
$DCP convert "$F" "$SCRATCH/dcpout//" || fail "convert to a folder given as dcpout//"
[ -f "$SCRATCH/dcpout/.metadata" ] || fail "dcpout//: no .metadata"
if command -v python3 >/dev/null; then
    python3 "$top_srcdir/tests/writer_check.py" $DCP "$SCRATCH/hf" "$FIXTURES/01_single_plain/expected/manifest.json" \
        --no-bytes >/dev/null || fail "hf/: wrong bytes"
    python3 "$top_srcdir/tests/writer_check.py" $DCP "$SCRATCH/dcpout" "$FIXTURES/01_single_plain/expected/manifest.json" \
        >/dev/null || fail "dcpout//: wrong bytes"
fi
# A folder that exists and holds anything (here a rank-local checkpoint's
# file and a safetensors shard, no .metadata) is never written into.
mkdir "$SCRATCH/busy"
printf 'rank-local data' >"$SCRATCH/busy/__0_0.distcp"
printf 'shard bytes' >"$SCRATCH/busy/model.safetensors"
before=$(cd "$SCRATCH/busy" && sha256sum * | sha256sum)
expect_fail "the folder is not empty (it holds" $DCP synth "$SCRATCH/busy" --keys 1 --shape 4
after=$(cd "$SCRATCH/busy" && sha256sum * | sha256sum)
[ "$before" = "$after" ] || fail "synth changed the files of a non-empty folder"
[ "$(ls -A "$SCRATCH/busy" | wc -l)" -eq 2 ] || fail "synth added files to a non-empty folder: $(ls -A "$SCRATCH/busy")"
# An empty folder that exists is fine.
mkdir "$SCRATCH/empty"
$DCP synth "$SCRATCH/empty" --keys 1 --shape 4
[ -f "$SCRATCH/empty/.metadata" ] || fail "synth into an empty folder wrote no .metadata"
# Interrupted (Ctrl-C, a scheduler's SIGTERM): the conversion stops at its next piece, removes
# its hidden temporary (a full-size one was left behind) and ends by the signal (130, 143).
"$DCP" synth "$SCRATCH/s/big" --total 192MiB --ranks 2 --shard cols >/dev/null || fail "synth for the interrupts"
export DCP_RECIPE_PATH="$top_srcdir/recipes"
printf '%s\n' '{"recipe": "t", "rules": [{"from": "model.layers.{L}.weight", "to": "l.{L}.weight"}],' \
    ' "config": {"model_type": "llama"}}' >"$SCRATCH/s/r.json"
mkdir "$SCRATCH/intr"
for run in INT:130:x.safetensors TERM:143:xdcp HUP:129:xs HUP:129:xpt.pt INT:130:hf; do
    sig=${run%%:*} want=${run#*:} want=${want%%:*} dst=${run##*:}
    set --
    case $dst in xs) set -- --max-shard-size 8M ;; hf) set -- --to hf --recipe "$SCRATCH/s/r.json" --dtype bfloat16 ;; esac
    "$DCP" convert -q "$@" "$SCRATCH/s/big" "$SCRATCH/intr/$dst" 2>"$SCRATCH/intr.err" &
    pid=$!
    # the signal once the temporary holds bytes: the writer is mid-way
    i=0
    until [ -n "$(find "$SCRATCH/intr" -name ".$dst.tmp-*" -size +1k 2>/dev/null | head -1)" ] ||
          ! kill -0 $pid 2>/dev/null || [ $i -ge 2000 ]; do
        sleep 0.005; i=$((i + 1))
    done
    kill -$sig $pid 2>/dev/null || fail "$dst: the conversion ended before the signal (make the source bigger)"
    rc=0; wait $pid || rc=$?
    [ $rc = $want ] || fail "$dst: SIG$sig: exit $rc, not $want: $(cat "$SCRATCH/intr.err")"
    grep -q "convert: $SCRATCH/intr/$dst: interrupted" "$SCRATCH/intr.err" || fail "$dst: $(cat "$SCRATCH/intr.err")"
    [ -z "$(ls -A "$SCRATCH/intr")" ] || fail "$dst: SIG$sig left behind: $(ls -A "$SCRATCH/intr")"
done
rm -rf "$SCRATCH/s/big" "$SCRATCH/intr" "$SCRATCH/intr.err"
# A DST name of 250 bytes (its temporary's name is cut to stay one name of at most 255).
long=$(printf 'n%.0s' $(seq 1 247)).pt
"$DCP" convert -q "$F" "$SCRATCH/$long" || fail "a DST name of ${#long} bytes"
[ -f "$SCRATCH/$long" ] || fail "no $long"
rm -f "$SCRATCH/$long"
# Failed conversions leave no output and no temporary.
left=$(ls -A "$SCRATCH" | grep -v -e '^exists$' -e '^bad\.' -e '^s$' -e '^busy$' -e '^empty$' -e '^hf$' -e '^dcpout$' || true)
[ -z "$left" ] || fail "left behind: $left"
echo ok
