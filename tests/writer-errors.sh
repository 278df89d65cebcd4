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
$DCP synth "$SCRATCH/s" --keys 1 --shape 4
expect_fail "already holds a checkpoint" $DCP synth "$SCRATCH/s" --keys 1 --shape 4
# Failed conversions leave no output and no temporary.
left=$(ls -A "$SCRATCH" | grep -v -e '^exists$' -e '^bad\.' -e '^s$' || true)
[ -z "$left" ] || fail "left behind: $left"
echo ok
