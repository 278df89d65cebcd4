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

# one rank cannot allocate: every rank fails with its message, printed once (not a line a rank)
for bad in 0 2; do
    rc=0
    DCPLOAD_TEST_NO_MEMORY_RANK=$bad mpirun 3 "$DCPLOAD" "$CK" >"$SCRATCH/out" 2>"$SCRATCH/err" || rc=$?
    [ "$rc" -eq 1 ] || fail "no memory on rank $bad: status $rc"
    grep '^dcpload: ' "$SCRATCH/err" >"$SCRATCH/msgs" || true
    [ "$(wc -l <"$SCRATCH/msgs")" -eq 1 ] || fail "not one line for the error of 3 ranks: $(cat "$SCRATCH/err")"
    grep -Eq "^dcpload: rank $bad: model\.[a-z_.]+: cannot allocate [0-9]+ bytes$" "$SCRATCH/msgs" ||
        fail "no memory on rank $bad: $(cat "$SCRATCH/msgs")"
done

# Destinations of 2 MiB and more stay untouched unless --touch (the load
# faults them in on its reader threads): the same bytes either way, on one
# reader thread or many, and on one rank each tensor's digest is that of its
# global bytes (dcp cat); --no-digests drops the tensor lines, not the
# statistics.
BIG=$SCRATCH/big
"$DCP" synth "$BIG" --keys 3 --shape 1024,1536 --ranks 3 >/dev/null || fail "dcp synth"
for n in 1 2; do
    for layout in rows replicate; do
        mpirun "$n" "$DCPLOAD" "$BIG" --layout "$layout" --json --touch >"$SCRATCH/touched" 2>"$SCRATCH/err" ||
            fail "--touch -n $n $layout: $(cat "$SCRATCH/err")"
        mpirun "$n" "$DCPLOAD" "$BIG" --layout "$layout" --json >"$SCRATCH/fresh" 2>"$SCRATCH/err" ||
            fail "-n $n $layout: $(cat "$SCRATCH/err")"
        DCPLOAD_IO_THREADS=1 DCP_READ_THREADS=1 mpirun "$n" "$DCPLOAD" "$BIG" --layout "$layout" --json \
            >"$SCRATCH/one" 2>"$SCRATCH/err" || fail "one reader thread -n $n $layout: $(cat "$SCRATCH/err")"
        [ "$(hashes "$SCRATCH/touched" | wc -l)" -eq $((3 * n)) ] || fail "-n $n $layout: $(cat "$SCRATCH/touched")"
        [ "$(hashes "$SCRATCH/fresh")" = "$(hashes "$SCRATCH/touched")" ] || fail "-n $n $layout: fresh destinations differ from touched ones"
        [ "$(hashes "$SCRATCH/one")" = "$(hashes "$SCRATCH/touched")" ] || fail "-n $n $layout: one reader thread differs"
    done
done
if python3 -c 'import xxhash' 2>/dev/null; then
    mpirun 1 "$DCPLOAD" "$BIG" --json >"$SCRATCH/fresh" 2>"$SCRATCH/err" || fail "-n 1: $(cat "$SCRATCH/err")"
    for key in $("$DCP" ls --json "$BIG" | python3 -c 'import json,sys; [print(json.loads(l)["key"]) for l in sys.stdin]'); do
        want=$("$DCP" cat "$BIG" "$key" | python3 -c 'import sys, xxhash; print(xxhash.xxh3_64_hexdigest(sys.stdin.buffer.read()))')
        grep -q "\"key\":\"$key\".*\"xxh3\":\"$want\"" "$SCRATCH/fresh" || fail "$key: not the bytes of dcp cat ($want): $(cat "$SCRATCH/fresh")"
    done
else
    echo "python3's xxhash is missing: the digests are compared with each other only"
fi
mpirun 2 "$DCPLOAD" "$BIG" --json --no-digests >"$SCRATCH/stats" 2>"$SCRATCH/err" || fail "--no-digests: $(cat "$SCRATCH/err")"
[ "$(grep -c '"xxh3"' "$SCRATCH/stats")" -eq 0 ] || fail "--no-digests printed digests: $(cat "$SCRATCH/stats")"
[ "$(grep -c '"bytes_read"' "$SCRATCH/stats")" -eq 2 ] || fail "--no-digests: not one statistics line a rank: $(cat "$SCRATCH/stats")"

# Where each rank's launch went (seconds_exec ... seconds_free): every phase is
# there, none negative, and together with the load they fit in the launch as
# timed from outside; digests take time only when computed.
launch_t0=$(date +%s.%N)
mpirun 2 "$DCPLOAD" "$BIG" --json --touch >"$SCRATCH/phases" 2>"$SCRATCH/err" || fail "phases: $(cat "$SCRATCH/err")"
launch=$(awk -v a="$launch_t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
python3 - "$SCRATCH/phases" "$SCRATCH/stats" "$launch" <<'PY' || fail "phases: $(cat "$SCRATCH/phases")"
import json, sys
names = ["exec", "mpi_init", "open", "device", "alloc", "warmup", "digests", "free"]
def stats(path):
    return [r for r in map(json.loads, open(path)) if "bytes_read" in r]
for r in stats(sys.argv[1]):
    ph = {n: r["seconds_" + n] for n in names}
    assert all(v >= 0 for v in ph.values()), ph
    assert ph["exec"] > 0 and ph["mpi_init"] > 0 and ph["alloc"] > 0, ph
    assert ph["device"] == 0, ph   # host destinations
    assert ph["digests"] > 0, ph
    total = sum(ph.values()) + r["seconds"]
    assert total <= float(sys.argv[3]), (total, sys.argv[3], ph)
for r in stats(sys.argv[2]):
    assert r["seconds_digests"] == 0, r   # --no-digests
PY

# A rank that cannot compute its digests: every rank ends with its message, printed once
# (rank 0 gathers the output and waited for ever).
for bad in 0 1; do
    rc=0
    DCPLOAD_TEST_NO_DIGEST_MEMORY_RANK=$bad mpirun 2 "$DCPLOAD" "$CK" --json >"$SCRATCH/out" 2>"$SCRATCH/err" || rc=$?
    [ "$rc" -eq 1 ] || fail "no digest memory on rank $bad: status $rc: $(cat "$SCRATCH/err")"
    [ "$(grep -c "^dcpload: rank $bad: out of memory for the digests of [0-9]* regions$" "$SCRATCH/err")" -eq 1 ] &&
        [ "$(grep -c '^dcpload: ' "$SCRATCH/err")" -eq 1 ] ||
        fail "no digest memory on rank $bad: $(cat "$SCRATCH/err")"
    [ ! -s "$SCRATCH/out" ] || fail "no digest memory on rank $bad: printed $(cat "$SCRATCH/out")"
done

# --help: the usage once (rank 0), status 0, on any number of ranks
for n in 1 3; do
    mpirun "$n" "$DCPLOAD" --help >"$SCRATCH/help" 2>"$SCRATCH/err" || fail "--help on $n ranks: $(cat "$SCRATCH/err")"
    [ "$(grep -c '^usage: ' "$SCRATCH/help")" -eq 1 ] || fail "--help on $n ranks: $(cat "$SCRATCH/help")"
done

# An empty tensor with a huge dimension (torch.empty(2**62, 0)): each rank's share is 0 bytes,
# whatever its other counts ("its share on this rank exceeds the address space" when the 2^62
# rows were multiplied by the element size before the 0), by both strategies and every layout.
"$DCP" synth "$SCRATCH/huge" --keys 1 --shape 4611686018427387904,0 --dtype float64 >/dev/null || fail "dcp synth"
for run in 1:rows 1:cols 2:rows 2:blocks 3:replicate; do
    n=${run%%:*} layout=${run#*:}
    for strategy in collective independent; do
        mpirun "$n" "$DCPLOAD" "$SCRATCH/huge" --json --layout "$layout" --strategy "$strategy" >"$SCRATCH/out" \
            2>"$SCRATCH/err" || fail "an empty tensor, $n ranks, --layout $layout --strategy $strategy: $(cat "$SCRATCH/err")"
        [ "$(grep -c '"key":"model.layers.0.weight".*,0\],"xxh3"' "$SCRATCH/out")" -eq "$n" ] ||
            fail "an empty tensor, $n ranks, --layout $layout: $(cat "$SCRATCH/out")"
    done
done
grep -q '"rank":0,"key":"model.layers.0.weight","offsets":\[0,0\],"lengths":\[4611686018427387904,0\]' "$SCRATCH/out" ||
    fail "an empty tensor replicated: $(cat "$SCRATCH/out")"
