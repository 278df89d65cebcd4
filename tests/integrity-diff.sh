# dcp diff: keys only in one, dtype/shape changes, and with --content which values differ.
. "$top_srcdir/tests/lib.sh"
need python3
scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
A="$FIXTURES/05_mixed_2ranks/ckpt"
cp -r "$A" "$SCRATCH/b"; chmod -R u+w "$SCRATCH/b"

"$DCP" diff --content "$A" "$SCRATCH/b" > "$SCRATCH/out" || fail "identical copies differ: $(cat "$SCRATCH/out")"
grep -qx "no differences" "$SCRATCH/out" || fail "$(cat "$SCRATCH/out")"

# One value of enc.weight changed (its data record starts at 320 in __0_0.distcp).
python3 - "$SCRATCH/b/__0_0.distcp" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[400] ^= 0x01; open(p, 'wb').write(b)
PY
rc=0; "$DCP" diff "$A" "$SCRATCH/b" > "$SCRATCH/out" || rc=$?
[ $rc = 0 ] || fail "without --content, values are not compared"
rc=0; "$DCP" diff --content "$A" "$SCRATCH/b" > "$SCRATCH/out" || rc=$?
[ $rc = 1 ] || fail "diff --content exit $rc"
[ "$(cat "$SCRATCH/out")" = "values: enc.weight differ" ] || fail "$(cat "$SCRATCH/out")"

# With recorded digests on both sides, equal tensors are not re-read, and the
# changed one is still found.
"$DCP" verify --record "$A" >/dev/null
"$DCP" verify --record "$SCRATCH/b" >/dev/null
rc=0; "$DCP" diff --content "$A" "$SCRATCH/b" > "$SCRATCH/out" || rc=$?
[ $rc = 1 ] && [ "$(cat "$SCRATCH/out")" = "values: enc.weight differ" ] || fail "with digests: $(cat "$SCRATCH/out")"
# A shard rewritten in place after its digests were recorded (the same size: the same identity)
# is compared by its bytes: the digests recorded before it changed no longer stand for it
# (diff said "no differences" from them).
cp -r "$A" "$SCRATCH/c"; chmod -R u+w "$SCRATCH/c"
"$DCP" verify --record "$SCRATCH/c" >/dev/null
"$DCP" diff --content "$A" "$SCRATCH/c" >"$SCRATCH/out" || fail "recorded equal copies differ: $(cat "$SCRATCH/out")"
printf '\177' | dd of="$SCRATCH/c/__1_0.distcp" bs=1 seek=1000 conv=notrunc status=none
rc=0; "$DCP" diff --content "$A" "$SCRATCH/c" > "$SCRATCH/out" || rc=$?
[ $rc = 1 ] && grep -q "^values: .* differ$" "$SCRATCH/out" ||
    fail "a shard changed in place after its digests were recorded: exit $rc, $(cat "$SCRATCH/out")"
"$DCP" verify --record "$SCRATCH/c" >/dev/null   # recorded anew: the digests stand again
rc=0; "$DCP" diff --content "$A" "$SCRATCH/c" > "$SCRATCH/out" || rc=$?
[ $rc = 1 ] && grep -q "^values: .* differ$" "$SCRATCH/out" || fail "recorded anew: exit $rc, $(cat "$SCRATCH/out")"

# A catalog inside A (named, or by XDG_CACHE_HOME): B's open must not create it there.
cp -r "$A" "$SCRATCH/catA"; chmod -R u+w "$SCRATCH/catA"
before=$(ls -lAR --time-style=full-iso "$SCRATCH/catA" | sha256sum)
"$DCP" --catalog "$SCRATCH/catA/cat.sqlite" diff --content "$SCRATCH/catA" "$SCRATCH/c" >/dev/null 2>&1 || true
"$DCP" --catalog "$SCRATCH/c/cat.sqlite" diff --content "$SCRATCH/catA" "$SCRATCH/c" >/dev/null 2>&1 || true
XDG_CACHE_HOME="$SCRATCH/catA" "$DCP" diff --content "$SCRATCH/catA" "$SCRATCH/c" >/dev/null 2>&1 || true
[ "$before" = "$(ls -lAR --time-style=full-iso "$SCRATCH/catA" | sha256sum)" ] ||
    fail "diff wrote into A: $(ls -A "$SCRATCH/catA")"
[ ! -e "$SCRATCH/c/cat.sqlite" ] || fail "diff wrote the catalog into B"
rc=0; "$DCP" --catalog "$SCRATCH/catA/cat.sqlite" diff --content "$SCRATCH/catA" "$A" >"$SCRATCH/out" || rc=$?
[ $rc = 0 ] && grep -qx "no differences" "$SCRATCH/out" || fail "diff with the catalog inside A: $(cat "$SCRATCH/out")"

# Keys, dtypes and shapes: two different fixtures.
rc=0; "$DCP" diff "$FIXTURES/02_rowwise_4ranks/ckpt" "$FIXTURES/03_colwise_4ranks/ckpt" > "$SCRATCH/out" || rc=$?
[ $rc = 1 ] || fail "different checkpoints compare equal"
grep -qx "only in A: model.tiny" "$SCRATCH/out" && grep -qx "only in B: model.proj.table" "$SCRATCH/out" || fail "$(cat "$SCRATCH/out")"
# the same key with another dtype and shape (fixture 09 vs a renamed copy is overkill: use 01's dtypes)
echo "integrity-diff: ok"
