# The first open of a large .metadata spills its chunks to scratch files
# beside the catalog while parsing (src/store_spill.c), forced here on every
# fixture with DCP_SPILL_BYTES=0: listings, layouts, info and every key's
# bytes equal the in-memory parse's, nothing is left beside the catalog, the
# checkpoint folder is not written to, a damaged .metadata gives the same
# error, and the spilled parse peaks lower than the in-memory one.
. "$top_srcdir/tests/lib.sh"
scratch
cat_dir="$SCRATCH/cat"
fresh() { rm -rf "$cat_dir"; mkdir -p "$cat_dir"; }
spilled() { DCP_SPILL_BYTES=0 "$DCP" --catalog "$cat_dir/catalog.sqlite" "$@"; }
n=0
for meta in "$FIXTURES"/*/ckpt/.metadata "$top_srcdir"/tests/data/metadata/pt_*/.metadata; do
    ck=$(dirname "$meta")
    [ -n "$(ls "$ck"/*.distcp 2>/dev/null)" ] || continue
    before=$(ls -la --time-style=full-iso "$ck" | sha256sum)
    for cmd in "ls --json" "layout --json" "info"; do
        "$DCP" --no-catalog $cmd "$ck" | grep -v catalog > "$SCRATCH/parsed" || fail "$ck: dcp $cmd failed"
        fresh
        spilled $cmd "$ck" | grep -v catalog > "$SCRATCH/spilled" || fail "$ck: spilled dcp $cmd failed"
        cmp -s "$SCRATCH/parsed" "$SCRATCH/spilled" || { diff "$SCRATCH/parsed" "$SCRATCH/spilled" | head; fail "$ck: dcp $cmd differs after a spilled parse"; }
        left=$(ls -A "$cat_dir" | grep -v '^catalog.sqlite' || true)
        [ -z "$left" ] || fail "$ck: left beside the catalog: $left"
    done
    fresh
    "$DCP" --no-catalog ls "$ck" | while read -r key; do
        a=$("$DCP" --no-catalog cat "$ck" "$key" 2>&1 | sha256sum)
        fresh
        b=$(spilled cat "$ck" "$key" 2>&1 | sha256sum)
        [ "$a" = "$b" ] || fail "$ck: $key: bytes differ after a spilled parse"
    done || exit 1
    [ "$(ls -la --time-style=full-iso "$ck" | sha256sum)" = "$before" ] || fail "$ck: the checkpoint folder changed"
    n=$((n + 1))
done
[ "$n" -ge 8 ] || fail "only $n checkpoints compared"
echo "$n checkpoints: the spilled parse equals the in-memory one"

# A damaged .metadata: the same error, spilled or not.
cp -r "$FIXTURES/02_rowwise_4ranks/ckpt" "$SCRATCH/bad"; chmod -R u+w "$SCRATCH/bad"
size=$(stat -c %s "$SCRATCH/bad/.metadata")
truncate -s $((size * 2 / 3)) "$SCRATCH/bad/.metadata"
"$DCP" --no-catalog info "$SCRATCH/bad" > /dev/null 2> "$SCRATCH/e1" && fail "a truncated .metadata opened"
fresh
spilled info "$SCRATCH/bad" > /dev/null 2> "$SCRATCH/e2" && fail "a truncated .metadata opened spilled"
cmp -s "$SCRATCH/e1" "$SCRATCH/e2" || { cat "$SCRATCH/e1" "$SCRATCH/e2"; fail "the errors differ"; }
grep -q "bad/.metadata" "$SCRATCH/e2" || fail "the error does not name the file: $(cat "$SCRATCH/e2")"
# ... parsed once: the checkpoint's own error is reported from the spilled parse (a damaged
# .metadata may be gigabytes), not after parsing it again in memory. So for a chunk outside
# its tensor, while what the spill cannot take (a pickle that refers back to an object of
# a batch already released) still parses again in memory, and opens.
fresh
DCP_DEBUG_STREAM=1 spilled info "$SCRATCH/bad" > /dev/null 2> "$SCRATCH/e3" && fail "a truncated .metadata opened spilled"
grep -q 'parsing in memory' "$SCRATCH/e3" && fail "a damaged .metadata was parsed twice: $(cat "$SCRATCH/e3")"
grep -qF "$(cat "$SCRATCH/e1")" "$SCRATCH/e3" || fail "another error with DCP_DEBUG_STREAM: $(cat "$SCRATCH/e3")"
for name in outside shared_across_batches; do
    mkdir -p "$SCRATCH/$name"
    cp "$top_srcdir/tests/data/metadata/synthetic/$name.metadata" "$SCRATCH/$name/.metadata"
    rc=0; "$DCP" --no-catalog ls "$SCRATCH/$name" > "$SCRATCH/o1" 2> "$SCRATCH/e1" || rc=$?
    fresh
    rc2=0; DCP_DEBUG_STREAM=1 spilled ls "$SCRATCH/$name" > "$SCRATCH/o2" 2> "$SCRATCH/e2" || rc2=$?
    [ "$rc" = "$rc2" ] && cmp -s "$SCRATCH/o1" "$SCRATCH/o2" ||
        fail "$name: spilled exit $rc2 and listing differ from in memory (exit $rc): $(cat "$SCRATCH/e2")"
    if [ "$name" = outside ]; then
        [ "$rc" != 0 ] || fail "outside.metadata opened"
        grep -q 'parsing in memory' "$SCRATCH/e2" && fail "$name: parsed twice: $(cat "$SCRATCH/e2")"
        grep -qF "$(cat "$SCRATCH/e1")" "$SCRATCH/e2" || fail "$name: another error spilled: $(cat "$SCRATCH/e2")"
    else
        [ "$rc" = 0 ] && [ "$(wc -l < "$SCRATCH/o2")" = 1101 ] || fail "$name: not its 1,100 keys and a header: $(cat "$SCRATCH/e2")"
        grep -q 'parsing in memory' "$SCRATCH/e2" || fail "$name: the spill took a released back-reference?"
    fi
done
echo "a damaged .metadata fails from the spilled parse; what the spill cannot take parses again in memory"

# Memory: 300,000 chunks parse in less spilled than in memory.
if [ -x /usr/bin/time ] && ! ldd "$top_builddir/.libs/libdcp.so" 2>/dev/null | grep -q libasan; then
    "$DCP" synth "$SCRATCH/many" --keys 30000 --shape 10,8 --ranks 10 --shard rows --seed 5 >/dev/null || fail "synth failed"
    fresh
    DCP_SPILL_BYTES=100000000000 /usr/bin/time -f '%M' -o "$SCRATCH/rss1" "$DCP" --catalog "$cat_dir/catalog.sqlite" info "$SCRATCH/many" >/dev/null || fail "info failed"
    fresh
    DCP_SPILL_BYTES=0 /usr/bin/time -f '%M' -o "$SCRATCH/rss2" "$DCP" --catalog "$cat_dir/catalog.sqlite" info "$SCRATCH/many" >/dev/null || fail "spilled info failed"
    a=$(tail -1 "$SCRATCH/rss1") b=$(tail -1 "$SCRATCH/rss2")
    echo "first open of 300,000 chunks: peak $a KiB in memory, $b KiB spilled"
    [ "$b" -lt "$a" ] || fail "the spilled parse peaked at $b KiB, the in-memory one at $a KiB"
    "$DCP" --catalog "$cat_dir/catalog.sqlite" layout "$SCRATCH/many" | sha256sum > "$SCRATCH/l1"
    "$DCP" --no-catalog layout "$SCRATCH/many" | sha256sum > "$SCRATCH/l2"
    cmp -s "$SCRATCH/l1" "$SCRATCH/l2" || fail "the model stored from a spilled parse differs"
fi
echo ok
