# dcpload --direct (DCP_LOAD_DIRECT): storage reads bypass the page cache
# (O_DIRECT), straight into the destinations dcpload places to agree with
# the files modulo the block size (a tensor's shards lie at different
# offsets: some of its units go through staging). A synthetic checkpoint
# of tensors whose records start and end inside file blocks, its shard files evicted
# from the page cache before each run: on 1 to 3 ranks, layouts rows, cols
# and replicate, the default staging and an odd one (1000000 bytes: units
# cut off blocks), --shm (whose host window --direct leaves alone) and CUDA
# destinations under the fake device (node peers by IPC) give the same
# per-rank digests as the buffered load, read each stored byte once, and
# leave the checkpoint folder as it was. The reads themselves are tested in
# tests/unit/test_reader.c (test_direct, test_direct_at) and
# tests/unit/test_gplan.c (dcp_gunit_read_direct_at); where the file system refuses
# O_DIRECT, the loader reads as usual and the digests still agree.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need python3
scratch
CK="$SCRATCH/ck"
"$DCP" synth "$CK" --keys 6 --shape 1000,999 --dtype float32 --ranks 3 --shard rows >/dev/null ||
    fail "dcp synth failed"
before=$(cd "$CK" && ls -l --time-style=+%s.%N . | sha256sum)
evict() { python3 "$top_srcdir/bench/evict.py" "$CK"/*.distcp; }
# digests FILE: the sorted region digests of a --json run; check the reads
digests() {
    python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
st = [r for r in rows if "bytes_read" in r]
read = sum(r["bytes_read"] for r in st)
if read != st[0]["bytes_unique"]:
    sys.exit(f"read {read} bytes, unique {st[0]['bytes_unique']}")
for r in sorted((r for r in rows if "xxh3" in r), key=lambda r: (r["rank"], r["key"])):
    print(r["rank"], r["key"], r["offsets"], r["lengths"], r["xxh3"])
PY
}
runs=0
check() {   # check NAME N ARGS...: buffered and --direct, evicted, the same digests
    local name=$1 n=$2
    shift 2
    evict
    mpirun "$n" "$DCPLOAD" "$CK" --json "$@" >"$SCRATCH/plain.json" 2>"$SCRATCH/err" ||
        fail "$name: dcpload -n $n $* failed: $(cat "$SCRATCH/err")"
    evict
    mpirun "$n" "$DCPLOAD" "$CK" --json --direct "$@" >"$SCRATCH/direct.json" 2>"$SCRATCH/err" ||
        fail "$name: dcpload -n $n --direct $* failed: $(cat "$SCRATCH/err")"
    digests "$SCRATCH/plain.json" >"$SCRATCH/plain.txt" || fail "$name: buffered: $(cat "$SCRATCH/plain.txt")"
    digests "$SCRATCH/direct.json" >"$SCRATCH/direct.txt" || fail "$name: --direct: $(cat "$SCRATCH/direct.txt")"
    [ -s "$SCRATCH/plain.txt" ] || fail "$name: no digests"
    cmp -s "$SCRATCH/plain.txt" "$SCRATCH/direct.txt" ||
        fail "$name: --direct digests differ: $(diff "$SCRATCH/plain.txt" "$SCRATCH/direct.txt" | head -4)"
    runs=$((runs + 1))
}
for n in 1 2 3; do
    for layout in rows cols replicate; do
        check "$layout" "$n" --layout "$layout"
        check "$layout, odd staging" "$n" --layout "$layout" --staging 1000000
    done
done
check "replicate --shm" 3 --layout replicate --shm
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    DCPLOAD_FAKE_DEVICE=1 check "cuda (fake device), IPC" 2 --layout replicate --device cuda
    DCPLOAD_FAKE_DEVICE=1 check "cuda (fake device), rows" 2 --layout rows --device cuda --staging 1000000
fi
# That the shard files are opened with O_DIRECT at all (digests cannot tell),
# and only with --direct, and that some units are read straight into their
# destinations (one request: the head's block into a bounce block, then the
# destination, dcp_op_fetch_direct_at), and that under --direct the fault-ahead
# thread populates (MADV_POPULATE_WRITE) the destinations of straight units
# before a reader begins them (one I/O thread slowed by 50 ms a unit, so the
# thread is surely ahead): the system calls, where strace can follow the ranks
# (-ff: a file per thread, no call split across lines).
traced="" fstype=$(stat -f -c %T "$CK")
if [ "$fstype" = tmpfs ] || [ "$fstype" = ramfs ]; then
    echo "note: the checkpoint is on $fstype (never evicted): the O_DIRECT opens are not checked"
elif command -v strace >/dev/null && strace -f -o /dev/null true 2>/dev/null; then
    # direct runs twice more when no unit went straight: once, in CI's sanitizer tier, every unit
    # was found cached after the eviction (a unit is read straight only when the middle of it is
    # not cached); the cause is not known, see the issue's note
    for mode in buffered direct direct direct; do
        [ "$mode" = direct ] && [ "${straight:-0}" -gt 0 ] && break
        evict
        flag=; [ "$mode" = buffered ] || flag=--direct
        rm -rf "$SCRATCH/trace" && mkdir "$SCRATCH/trace"
        # (LeakSanitizer cannot run under ptrace: a sanitizer build checks leaks in the runs above)
        ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" DCPLOAD_IO_THREADS=1 DCPLOAD_TEST_READ_DELAY_MS=50 \
            timeout -k 10 120 strace -ff -qq -e trace=openat,preadv,preadv2,madvise -o "$SCRATCH/trace/t" \
                "$MPIEXEC" -launcher fork -n 1 "$DCPLOAD" "$CK" --layout rows $flag >/dev/null 2>"$SCRATCH/err" ||
            fail "$mode under strace: $(cat "$SCRATCH/err")"
        cat "$SCRATCH/trace"/t.* >"$SCRATCH/trace.all"
        opens=$(grep -cE '\.distcp", [A-Z_|]*O_DIRECT' "$SCRATCH/trace.all" || true)
        straight=$(grep -cE '^preadv2?\([0-9]+, \[\{iov_base=[^]]*iov_len=4096\}, \{' "$SCRATCH/trace.all" || true)
        populated=$(grep -cE '^madvise\(.*(MADV_POPULATE_WRITE|0x17)' "$SCRATCH/trace.all" || true)
        if [ "$mode" = direct ]; then
            [ "$opens" -gt 0 ] || fail "--direct opened no shard file with O_DIRECT: $(grep distcp "$SCRATCH/trace.all" | head -3)"
            if [ "$straight" = 0 ]; then
                tries=$((${tries:-0} + 1))
                [ "$tries" -lt 3 ] && continue
                fail "--direct read no unit straight into its destination (3 tries)"
            fi
            [ "$populated" -gt 0 ] || fail "--direct populated no destination ahead of its readers"
        else
            [ "$opens" = 0 ] || fail "a buffered load opened shard files with O_DIRECT"
            [ "$straight" = 0 ] || fail "a buffered load read like dcp_op_fetch_direct_at"
            [ "$populated" = 0 ] || fail "a buffered load populated destinations ahead of its readers"
        fi
    done
    traced=", shard files opened with O_DIRECT only under --direct, $straight units read straight into their destinations, $populated populated ahead"
else
    echo "note: strace cannot follow processes here: the O_DIRECT opens are not checked"
fi
[ "$before" = "$(cd "$CK" && ls -l --time-style=+%s.%N . | sha256sum)" ] || fail "the checkpoint folder changed"
echo "ok: $runs layouts and options, --direct digests equal the buffered ones$traced"
