# The device path of CUDA destinations (issue 16) without a GPU: dcpload
# --device cuda under libdcpload's test-only fake device layer
# (DCPLOAD_FAKE_DEVICE=1, src/load/device_fake.c: "device memory" is host
# memory, the loader's device staging is POSIX shared memory that node peers
# map through the fake's IPC handles, stream copies run only when waited for).
# On 2 and 4 ranks of one node, layouts rows, cols, blocks and replicate,
# small staging (units cut inside ops):
#   - ipc: the default. Digests equal the ground truth (load_check.py: also
#     each stored byte read once, bytes sent = received); every rank reports
#     delivery "ipc"; replicated, node peers got every byte device to device
#     (bytes_ipc = bytes_received, no message), and each unit was staged to
#     the device once (bytes_staged = bytes_read);
#   - host: --host-delivery, today's host messages, the same digests;
#   - fallback: IPC failing (the fake told to fail cudaIpcOpenMemHandle on
#     every rank, cudaIpcGetMemHandle on one rank only): delivery "fallback"
#     on every rank with the failing rank's reason, host messages, the same
#     digests;
#   - shm: --shm as well: served by IPC, or when IPC fails by the host
#     shared-memory window (DCP_LOAD_SHM's path), with the same digests.
#   - map: --map, below.
# No leak: per process as many device frees as allocations, handle closes as
# opens, streams destroyed as created, registrations undone (the fake's call
# log), and no shared memory object of the fake left in /dev/shm.
# On a machine with a GPU, LOAD_DEVICE_REAL=1 runs the ipc and host variants
# on the real CUDA runtime instead (the fake's failures and log do not
# exist there; skipped without a GPU).
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need python3
need_python_module numpy
scratch
REAL=${LOAD_DEVICE_REAL:-0}
if [ "$REAL" = 1 ]; then
    unset DCPLOAD_FAKE_DEVICE DCPLOAD_FAKE_DEVICE_LOG DCPLOAD_FAKE_DEVICE_IPC_FAIL
    mpirun 1 "$DCPLOAD" "$FIXTURES/02_rowwise_4ranks/ckpt" --device cuda >/dev/null 2>&1 ||
        skip "LOAD_DEVICE_REAL=1 but dcpload --device cuda does not run here (no GPU, or built without CUDA)"
else
    [ -d /dev/shm ] && [ -w /dev/shm ] || skip "no writable /dev/shm for the fake device's shared memory"
    export DCPLOAD_FAKE_DEVICE=1
    LOG="$SCRATCH/fake.log"
    export DCPLOAD_FAKE_DEVICE_LOG="$LOG"
fi

# stats VARIANT LAYOUT FILE: the statistics lines show the variant's path.
stats() {
    python3 - "$@" <<'PY'
import json, sys
variant, layout, path = sys.argv[1:4]
st = [r for r in map(json.loads, open(path)) if "bytes_read" in r]
d = {r["delivery"] for r in st}
ipc = sum(r["bytes_ipc"] for r in st)
recv = sum(r["bytes_received"] for r in st)
msgs = sum(r["messages"] for r in st)
staged = sum(r["bytes_staged"] for r in st)
why = {r["fallback"] for r in st}
def no(msg):
    sys.exit(f"{variant} {layout}: {msg} (delivery {d}, received {recv}, by IPC {ipc}, messages {msgs}, "
             f"staged {staged}, fallback {why})")
if variant == "ipc":
    if d != {"ipc"} or why != {""}:
        no("not the device path")
    if ipc != recv or msgs or any(r["bytes_shm"] for r in st):
        no("node peers got bytes another way than device to device")
    if layout == "replicate":
        if recv == 0:
            no("nothing delivered")
        for r in st:   # every unit a rank reads has node peers: staged once each
            if r["bytes_staged"] != r["bytes_read"]:
                no(f"rank {r['rank']} staged {r['bytes_staged']} of {r['bytes_read']} bytes read")
elif variant == "host":
    if d != {"host"} or ipc or staged:
        no("not host messages")
    if layout == "replicate" and (recv == 0 or msgs == 0):
        no("no messages")
else:
    want = sys.argv[4]
    if d != {"fallback"} or len(why) != 1 or want not in next(iter(why)):
        no(f"no fall-back saying '{want}'")
    if ipc or staged:
        no("device path used after the fall-back")
    if layout == "replicate" and (recv == 0 or msgs == 0):
        no("no host messages")
PY
}

# run N DIR LAYOUT ARGS...
run() {
    local n=$1 dir=$2 layout=$3
    shift 3
    mkdir -p "$dir"
    mpirun "$n" "$DCPLOAD" "$ckpt" --layout "$layout" --device cuda --json --staging 4096 "$@" \
        >"$dir/$layout-$n.json" 2>"$dir/err" ||
        fail "$name: dcpload -n $n --layout $layout --device cuda $* (fake device) failed: $(cat "$dir/err")"
}

for name in 02_rowwise_4ranks 03_colwise_4ranks 04_block_4ranks 05_mixed_2ranks; do
    ckpt="$FIXTURES/$name/ckpt"
    truth="$FIXTURES/$name/expected/manifest.json"
    for n in 2 4; do
        for layout in rows cols blocks replicate; do
            run "$n" "$SCRATCH/$name/ipc" "$layout"
            stats ipc "$layout" "$SCRATCH/$name/ipc/$layout-$n.json" || fail "$name -n $n $layout: ipc"
        done
        for layout in cols replicate; do
            run "$n" "$SCRATCH/$name/host" "$layout" --host-delivery
            stats host "$layout" "$SCRATCH/$name/host/$layout-$n.json" || fail "$name -n $n $layout: host"
            [ "$REAL" = 1 ] && continue
            DCPLOAD_FAKE_DEVICE_IPC_FAIL=open run "$n" "$SCRATCH/$name/fallback" "$layout"
            stats fallback "$layout" "$SCRATCH/$name/fallback/$layout-$n.json" \
                "fake device: ipc_open: failing" || fail "$name -n $n $layout: fallback"
            grep -q "device IPC delivery unavailable" "$SCRATCH/$name/fallback/err" ||
                fail "$name -n $n $layout: dcpload said nothing of the fall-back: $(cat "$SCRATCH/$name/fallback/err")"
        done
    done
    for variant in ipc host fallback; do
        [ -d "$SCRATCH/$name/$variant" ] || continue
        python3 "$top_srcdir/tests/load_check.py" "$DCP" "$ckpt" "$truth" "$SCRATCH/$name/$variant" ||
            fail "$name: $variant"
    done
done

# --device-delivery (the default said explicitly) takes the device path, and
# with --host-delivery as well the host path wins.
name=05_mixed_2ranks
for variant in ipc host; do
    dir="$SCRATCH/explicit-$variant"
    mkdir -p "$dir"
    extra=()
    [ "$variant" = host ] && extra=(--host-delivery)
    mpirun 2 "$DCPLOAD" "$FIXTURES/$name/ckpt" --layout replicate --device cuda --json --staging 4096 \
        --device-delivery "${extra[@]}" >"$dir/replicate-2.json" 2>"$dir/err" ||
        fail "--device-delivery ${extra[*]}: dcpload failed: $(cat "$dir/err")"
    stats "$variant" replicate "$dir/replicate-2.json" || fail "--device-delivery ${extra[*]}: not the $variant path"
    python3 "$top_srcdir/tests/load_check.py" "$DCP" "$FIXTURES/$name/ckpt" "$FIXTURES/$name/expected/manifest.json" "$dir" ||
        fail "--device-delivery ${extra[*]}: bytes"
done

# --map (DCP_LOAD_MAP): units whose pages are all cached come to the device
# straight from a read-only mapping of the shard, registered with the device
# layer; the same bytes on 1, 2 and 4 ranks, by IPC and by host messages.
# A synthetic checkpoint of 64 KiB chunks: evicted, not every unit is mapped
# (a unit is mapped only when all its pages are cached; those not cached are
# read as usual, while the kernel's readahead may cache the next ones);
# cached, every unit this rank reads for device copies only is (by IPC or
# alone), none that host messages need; a refused registration reads the
# unit as usual.
MAPCK="$SCRATCH/mapck"
"$DCP" synth "$MAPCK" --keys 6 --shape 256,128 --ranks 2 >/dev/null || fail "dcp synth"
"$DCP" digest --json "$MAPCK" >/dev/null || fail "dcp digest"
evicts=1   # tmpfs keeps its pages: nothing to evict
[ "$(stat -f -c %T "$SCRATCH")" = tmpfs ] && evicts=0
regs() {   # registrations so far (the fake's log)
    [ "$REAL" != 1 ] && [ -f "$LOG" ] || { echo 0; return; }
    grep -c " host_register_ro " "$LOG" || true
}
mapped_run() {   # mapped_run N LAYOUT TAG ARGS...: digests in $SCRATCH/map-TAG, registrations counted
    local n=$1 layout=$2 tag=$3 before
    shift 3
    before=$(regs)
    mkdir -p "$SCRATCH/map-$tag"
    mpirun "$n" "$DCPLOAD" "$MAPCK" --layout "$layout" --device cuda --json --map "$@" \
        >"$SCRATCH/map-$tag/out.json" 2>"$SCRATCH/map-$tag/err" ||
        fail "--map $tag: dcpload failed: $(cat "$SCRATCH/map-$tag/err")"
    grep '"xxh3"' "$SCRATCH/map-$tag/out.json" | sort >"$SCRATCH/map-$tag/digests"
    MAPPED=$(( $(regs) - before ))
}
for n in 1 2 4; do
    for layout in rows replicate; do
        mpirun "$n" "$DCPLOAD" "$MAPCK" --layout "$layout" --device cuda --json >"$SCRATCH/map-ref.json" 2>"$SCRATCH/err" ||
            fail "--map reference: $(cat "$SCRATCH/err")"
        grep '"xxh3"' "$SCRATCH/map-ref.json" | sort >"$SCRATCH/map-ref"
        units=$(python3 -c 'import json,sys; print(sum(r["reads"] for r in map(json.loads, open(sys.argv[1])) if "reads" in r))' "$SCRATCH/map-ref.json")
        python3 "$top_srcdir/bench/evict.py" "$MAPCK"
        mapped_run "$n" "$layout" "evicted-$n-$layout"
        cmp -s "$SCRATCH/map-ref" "$SCRATCH/map-evicted-$n-$layout/digests" || fail "--map -n $n $layout evicted: other bytes"
        [ "$evicts" = 0 ] || [ "$REAL" = 1 ] || [ "$MAPPED" -lt "$units" ] ||
            fail "--map -n $n $layout evicted: all $units units mapped, as if cached"
        # the shard files read whole first; a page the kernel reclaims between that and the
        # run (memory pressure; DAMON pageout on CI's VMs takes cold file pages at random)
        # leaves its unit unmapped: three tries
        for try in 1 2 3; do
            cat "$MAPCK"/*.distcp >/dev/null
            mapped_run "$n" "$layout" "cached-$n-$layout"
            cmp -s "$SCRATCH/map-ref" "$SCRATCH/map-cached-$n-$layout/digests" || fail "--map -n $n $layout cached: other bytes"
            { [ "$REAL" = 1 ] || [ "$MAPPED" -eq "$units" ]; } && break
        done
        [ "$REAL" = 1 ] || [ "$MAPPED" -eq "$units" ] || fail "--map -n $n $layout cached: $MAPPED of $units units mapped (3 tries)"
        [ "$n" = 1 ] && continue
        mapped_run "$n" "$layout" "host-$n-$layout" --host-delivery
        cmp -s "$SCRATCH/map-ref" "$SCRATCH/map-host-$n-$layout/digests" || fail "--map -n $n $layout --host-delivery: other bytes"
        if [ "$layout" = replicate ]; then   # every unit goes to node peers by host messages: the CPU reads it
            [ "$MAPPED" -eq 0 ] || fail "--map -n $n replicate --host-delivery: $MAPPED units mapped"
        fi
    done
done
if [ "$REAL" != 1 ]; then
    DCPLOAD_FAKE_DEVICE_REGISTER_FAIL=1 mapped_run 2 replicate refused
    cmp -s "$SCRATCH/map-cached-2-replicate/digests" "$SCRATCH/map-refused/digests" ||
        fail "--map, registration refused: other bytes"
    [ "$MAPPED" -eq 0 ] && grep -q " host_register_ro_refused " "$LOG" || fail "--map, registration refused: not tried, or mapped"
fi

[ "$REAL" = 1 ] && exit 0

# IPC failing on one rank only (the last: cudaIpcGetMemHandle): every rank
# falls back, with that rank's reason, and loads the same bytes.
name=02_rowwise_4ranks
ckpt="$FIXTURES/$name/ckpt"
dir="$SCRATCH/one-rank"
mkdir -p "$dir"
timeout -k 10 120 "$MPIEXEC" -launcher fork -n 3 "$DCPLOAD" "$ckpt" --layout replicate --device cuda --json \
    --device-delivery --staging 4096 : -n 1 -env DCPLOAD_FAKE_DEVICE_IPC_FAIL get "$DCPLOAD" "$ckpt" \
    --layout replicate --device cuda --device-delivery --json --staging 4096 >"$dir/replicate-4.json" 2>"$dir/err" ||
    fail "IPC failing on rank 3: dcpload failed: $(cat "$dir/err")"
stats fallback replicate "$dir/replicate-4.json" "rank 3: fake device: ipc_get: failing" ||
    fail "IPC failing on rank 3"
python3 "$top_srcdir/tests/load_check.py" "$DCP" "$ckpt" "$FIXTURES/$name/expected/manifest.json" "$dir" ||
    fail "IPC failing on rank 3: bytes"

# --shm asked too: the device path serves the node peers; when IPC fails,
# the host shared-memory window does (no new plan), with the same bytes.
name=05_mixed_2ranks
ckpt="$FIXTURES/$name/ckpt"
for variant in ipc fallback; do
    dir="$SCRATCH/shm-$variant"
    fails=0
    [ "$variant" = fallback ] && fails=open
    DCPLOAD_FAKE_DEVICE_IPC_FAIL=$fails run 4 "$dir" replicate --shm
    python3 - "$variant" "$dir/replicate-4.json" <<'PY' || fail "--shm $variant: path not used"
import json, sys
variant, path = sys.argv[1:3]
st = [r for r in map(json.loads, open(path)) if "bytes_read" in r]
recv = sum(r["bytes_received"] for r in st)
by = sum(r["bytes_ipc" if variant == "ipc" else "bytes_shm"] for r in st)
if recv == 0 or by != recv or {r["delivery"] for r in st} != {variant}:
    sys.exit(f"{variant}: received {recv}, by the expected path {by}, delivery {[r['delivery'] for r in st]}")
PY
    python3 "$top_srcdir/tests/load_check.py" "$DCP" "$ckpt" "$FIXTURES/$name/expected/manifest.json" "$dir" ||
        fail "--shm $variant: bytes"
done

# no leak: the fake's call log, per process
python3 - "$LOG" <<'PY' || fail "the fake device's calls do not balance"
import collections, sys
calls = collections.defaultdict(collections.Counter)
for line in open(sys.argv[1]):
    pid, call, _ = line.split()
    calls[pid][call] += 1
if not any(c["ipc_open"] for c in calls.values()):
    sys.exit("no IPC handle was ever opened")
for pid, c in calls.items():
    for a, b in (("dev_alloc", "dev_free"), ("stream_create", "stream_destroy"),
                 ("host_alloc", "host_free")):
        if c[a] != c[b]:
            sys.exit(f"process {pid}: {c[a]} {a}, {c[b]} {b}")
    if c["host_register"] + c["host_register_ro"] != c["host_unregister"]:   # --map's mappings too
        sys.exit(f"process {pid}: {c['host_register']} host_register and {c['host_register_ro']} "
                 f"host_register_ro, {c['host_unregister']} host_unregister")
    if c["ipc_open"] != c["ipc_close"]:   # a refused open maps nothing
        sys.exit(f"process {pid}: {c['ipc_open']} ipc_open, {c['ipc_close']} ipc_close")
PY
for pid in $(cut -d' ' -f1 "$LOG" | sort -u); do
    for f in /dev/shm/dcpload-fake-"$pid"-*; do
        [ -e "$f" ] && fail "left in /dev/shm: $f"
    done
done
exit 0
