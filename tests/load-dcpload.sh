# dcpload itself: --staging takes sizes with suffixes (the same bytes as
# plain byte counts), rank 0 prints every rank's output received in pieces
# (the same text whatever the piece size), and a rank that cannot allocate
# its buffers makes every rank print its message.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/load_lib.sh"
scratch
CK="$FIXTURES/02_rowwise_4ranks/ckpt"

# hashes only (the statistics lines differ by options and timing)
hashes() { grep '"xxh3"' "$1" | sort; }

mpirun 3 "$DCPLOAD" "$CK" --json >"$SCRATCH/ref" 2>"$SCRATCH/err" || fail "dcpload: $(cat "$SCRATCH/err")"
[ "$(grep -c '"xxh3"' "$SCRATCH/ref")" -gt 0 ] || fail "no hashes: $(cat "$SCRATCH/ref")"
for size in 4096 4K 8KiB 1M 16MiB 1G; do
    mpirun 3 "$DCPLOAD" "$CK" --json --staging "$size" >"$SCRATCH/out" 2>"$SCRATCH/err" ||
        fail "--staging $size: $(cat "$SCRATCH/err")"
    [ "$(hashes "$SCRATCH/out")" = "$(hashes "$SCRATCH/ref")" ] || fail "--staging $size: other bytes"
done
for bad in 0 abc 12Q -5; do
    rc=0
    mpirun 2 "$DCPLOAD" "$CK" --staging "$bad" >/dev/null 2>"$SCRATCH/err" || rc=$?
    [ "$rc" -eq 2 ] || fail "--staging $bad: status $rc"
    grep -q "bad --staging '$bad'" "$SCRATCH/err" || fail "--staging $bad: $(cat "$SCRATCH/err")"
done

# the output in 7-byte pieces: the same lines, in rank order
for n in 1 4; do
    mpirun "$n" "$DCPLOAD" "$CK" --json >"$SCRATCH/whole" 2>"$SCRATCH/err" || fail "dcpload -n $n: $(cat "$SCRATCH/err")"
    DCPLOAD_TEST_PRINT_PIECE=7 mpirun "$n" "$DCPLOAD" "$CK" --json >"$SCRATCH/pieces" 2>"$SCRATCH/err" ||
        fail "dcpload -n $n in pieces: $(cat "$SCRATCH/err")"
    strip() { grep '"xxh3"' "$1"; grep -o '^{"rank":[0-9]*,"bytes_read"' "$1"; }
    [ "$(strip "$SCRATCH/pieces")" = "$(strip "$SCRATCH/whole")" ] || fail "-n $n: output in pieces differs"
    [ "$(grep -c . "$SCRATCH/pieces")" -eq "$(grep -c . "$SCRATCH/whole")" ] || fail "-n $n: lines lost in pieces"
done

# one rank cannot allocate: every rank prints its message
for bad in 0 2; do
    rc=0
    DCPLOAD_TEST_NO_MEMORY_RANK=$bad mpirun 3 "$DCPLOAD" "$CK" >"$SCRATCH/out" 2>"$SCRATCH/err" || rc=$?
    [ "$rc" -eq 1 ] || fail "no memory on rank $bad: status $rc"
    grep '^dcpload: ' "$SCRATCH/err" | sort -u >"$SCRATCH/msgs"
    [ "$(grep -c '^dcpload: ' "$SCRATCH/err")" -eq 3 ] || fail "not every rank reported: $(cat "$SCRATCH/err")"
    [ "$(wc -l <"$SCRATCH/msgs")" -eq 1 ] || fail "ranks report different errors: $(cat "$SCRATCH/msgs")"
    grep -Eq "^dcpload: rank $bad: model\.[a-z_.]+: cannot allocate [0-9]+ bytes$" "$SCRATCH/msgs" ||
        fail "no memory on rank $bad: $(cat "$SCRATCH/msgs")"
done
