# Faults mid-load: 4 ranks load a replicated checkpoint, every unit read by
# one rank and sent to the others, slowed by DCPLOAD_TEST_READ_DELAY_MS so
# that the fault strikes while bytes move: (a) kill -9 one rank: the job
# ends within 60 s, non-zero, naming the killed rank, and no rank is left;
# (b) a shard truncated: every rank exits non-zero within 60 s with the same
# message naming the file, printed once; (c) a shard deleted: the ranks either
# finish with the original bytes (the file was already open) or all fail with
# a message, printed once.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need pgrep
scratch
CK=$SCRATCH/ck
"$DCP" synth "$CK" --keys 32 --shape 256,256 --ranks 4 >/dev/null || fail "dcp synth"
mpirun 4 "$DCPLOAD" "$CK" --layout replicate --json >"$SCRATCH/ref" 2>"$SCRATCH/err" ||
    fail "the clean load failed: $(cat "$SCRATCH/err")"

# start_load NAME: a slow load in the background (its pid in LOAD); one I/O
# thread a rank, so that the delays add up (8 readers would sleep at once)
start_load() {
    rm -rf "$SCRATCH/$1"; cp -r "$CK" "$SCRATCH/$1"
    DCPLOAD_IO_THREADS=1 DCPLOAD_TEST_READ_DELAY_MS=150 mpirun 4 "$DCPLOAD" "$SCRATCH/$1" --layout replicate --json \
        >"$SCRATCH/$1.out" 2>"$SCRATCH/$1.err" &
    LOAD=$!
    T0=$SECONDS
    sleep 1.5
}

# rank_pids: the dcpload processes under the job LOAD (shell > timeout > mpiexec > proxy > ranks)
descendants() {
    local c
    for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done
}
rank_pids() {
    local p
    for p in $(descendants "$LOAD"); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dcpload ] && echo "$p"
    done
    return 0
}

# finish NAME: wait for the job; its status in RC, within 60 s of the start
finish() {
    RC=0
    wait "$LOAD" || RC=$?
    local took=$((SECONDS - T0))
    [ "$RC" -ne 124 ] && [ "$RC" -ne 137 ] || fail "$1: the job hung (killed by timeout after $took s)"
    [ "$took" -le 60 ] || fail "$1: the job took $took s"
    echo "$1: status $RC after $took s"
}

# (a) kill -9 rank 2
start_load kill
pids=$(rank_pids)
[ "$(echo "$pids" | wc -w)" -eq 4 ] || fail "kill: found ranks '$pids' (want 4 pids)"
victim=
for p in $pids; do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx PMI_RANK=2 && victim=$p
done
[ -n "$victim" ] || fail "kill: no process with PMI_RANK=2 among $pids"
kill -9 "$victim"
finish kill
[ "$RC" -ne 0 ] || fail "kill: the job succeeded with a rank killed"
for p in $pids; do kill -0 "$p" 2>/dev/null && fail "kill: rank pid $p still runs"; done
cat "$SCRATCH/kill.out" "$SCRATCH/kill.err" | grep -qiE "killed|signal 9|bad termination" ||
    fail "kill: no message about the killed rank: $(cat "$SCRATCH/kill.out" "$SCRATCH/kill.err")"

# (b) a shard truncated mid-load
start_load truncate
truncate -s 1000 "$SCRATCH/truncate/__1_0.distcp"
finish truncate
[ "$RC" -ne 0 ] || fail "truncate: the load succeeded"
n=$(grep -c '^dcpload: ' "$SCRATCH/truncate.err" || true)
[ "$n" -eq 1 ] || fail "truncate: $n lines for the error all 4 ranks agree on (once expected): $(cat "$SCRATCH/truncate.err")"
grep -q "__1_0.distcp" "$SCRATCH/truncate.err" || fail "truncate: the message does not name the file"

# (c) a shard deleted mid-load
start_load delete
rm -f "$SCRATCH/delete/__1_0.distcp"
finish delete
if [ "$RC" -eq 0 ]; then
    [ "$(grep "\"key\"" "$SCRATCH/ref" | sort)" = "$(grep "\"key\"" "$SCRATCH/delete.out" | sort)" ] ||
        fail "delete: the load succeeded with other bytes"
    echo "delete: finished with the original bytes (the shard was open)"
else
    n=$(grep -c '^dcpload: ' "$SCRATCH/delete.err" || true)
    [ "$n" -eq 1 ] || fail "delete: $n lines for the error all 4 ranks agree on (once expected): $(cat "$SCRATCH/delete.err")"
fi

# (d) --direct: a shard truncated, or replaced, under straight O_DIRECT reads
rm -rf "$SCRATCH/big"
"$DCP" synth "$SCRATCH/big" --keys 16 --shape 1000,999 --dtype float32 --ranks 1 >/dev/null || fail "dcp synth"
mpirun 1 "$DCPLOAD" "$SCRATCH/big" --json >"$SCRATCH/big.ref" 2>"$SCRATCH/err" ||
    fail "the clean load failed: $(cat "$SCRATCH/err")"
start_direct() {   # a slow --direct load of $SCRATCH/big, its shard evicted, in the background
    python3 "$top_srcdir/bench/evict.py" "$SCRATCH"/big/*.distcp
    DCPLOAD_IO_THREADS=1 DCPLOAD_TEST_READ_DELAY_MS=250 mpirun 1 "$DCPLOAD" "$SCRATCH/big" --direct --json \
        >"$SCRATCH/big.out" 2>"$SCRATCH/big.err" &
    LOAD=$!
    T0=$SECONDS
    sleep 1.5
}
# the same bytes but every one inverted, renamed over the shard
cp "$SCRATCH/big/__0_0.distcp" "$SCRATCH/big.orig"
python3 -c 'import sys; open(sys.argv[2], "wb").write(open(sys.argv[1], "rb").read().translate(bytes(range(255, -1, -1))))' \
    "$SCRATCH/big.orig" "$SCRATCH/big.inverted" || fail "inverting the shard failed"
start_direct
mv "$SCRATCH/big.inverted" "$SCRATCH/big/__0_0.distcp"
finish direct-replace
if [ "$RC" -eq 0 ]; then
    [ "$(grep '"key"' "$SCRATCH/big.ref" | sort)" = "$(grep '"key"' "$SCRATCH/big.out" | sort)" ] ||
        fail "direct-replace: the load finished with other bytes"
    echo "direct-replace: finished with the original bytes"
else
    grep -q "^dcpload: $SCRATCH/big/__0_0.distcp: " "$SCRATCH/big.err" ||
        fail "direct-replace: unclear message: $(cat "$SCRATCH/big.err")"
fi
# truncated (the original shard back first)
mv "$SCRATCH/big.orig" "$SCRATCH/big/__0_0.distcp"
start_direct
truncate -s 1000 "$SCRATCH/big/__0_0.distcp"
finish direct-truncate
[ "$RC" -ne 0 ] || fail "direct-truncate: the load succeeded"
grep -q "^dcpload: $SCRATCH/big/__0_0.distcp: model.*: short read at offset" "$SCRATCH/big.err" ||
    fail "direct-truncate: unclear message: $(cat "$SCRATCH/big.err")"
