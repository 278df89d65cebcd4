#!/bin/bash
# dcpload into GPU memory (issues 16 and 12; run by `make bench`, never by the
# tests; skipped without a GPU).
#
# A synthetic checkpoint of $DCPFS_BENCH_GPU_BYTES (default 4 GiB: float32
# tensors of 4096x4096 saved row-sharded by 8 ranks into 8 shard files), written
# with `dcp synth` into a scratch folder under $DCPFS_BENCH_DIR and deleted at
# the end. Best of $DCPFS_BENCH_REPS (3) runs.
#
# 1. One process into one GPU, the page cache warm and the shard files evicted
#    (fsync + POSIX_FADV_DONTNEED before each run): GB/s of the stored bytes,
#    and the whole process's seconds as a user sees it beside the load's:
#      dcpload      mpiexec -n 1 dcpload --layout rows --device cuda (dcp_load's
#                   seconds; "proc": the whole launch, mpiexec included)
#      cat          the ceiling of storage: one `cat` per shard file at once
#      copy         the ceiling of staged loads: pinned host memory -> GPU
#      safetensors  safetensors.torch.load_file(device="cuda") of the same
#                   tensors (`dcp convert` to one .safetensors file)
#      torch        torch.distributed.checkpoint.load, FileSystemReader
#      reader/load  dcpfs.torch.Reader / dcpfs.torch.load (issue 12), when the
#                   dcpfs package imports ($DCPFS_BENCH_GPU_PYTHON runs them:
#                   default python3)
#    Targets (issue 16): evicted, dcpload >= 0.95x cat; warm, >= 30 GB/s and
#    >= 5x safetensors. Issue 12: dcpfs.torch.load >= 0.9x dcpload.
# 2. Replicated on N ranks of this node (DCPFS_BENCH_GPU_RANKS, default 1 4 8;
#    rank i uses device i mod the device count, so on a single-GPU machine all
#    ranks share it), seconds of dcp_load on the slowest rank:
#      host       --device host: destinations in host memory (for comparison)
#      cuda-msg   --device cuda --host-delivery: node peers get host messages
#                 and each copies its bytes up to its GPU (the default path)
#      cuda-ipc   --device cuda --device-delivery: the reader stages each unit
#                 once into its device staging buffer, node peers copy device
#                 to device out of it (CUDA IPC); "delivery" must say "ipc"
#      baseline   one rank loading the bytes once into GPU memory (dcpload -n 1
#                 --device cuda) plus N device-to-device copies of all the
#                 bytes (bench/gpu_d2d.py: cudaMemcpyPeerAsync, CUDA events)
#    Target (issue 16): cuda-ipc <= baseline (ratio baseline / cuda-ipc >= 1).
#    Also printed per line: bytes read (sum over ranks; must equal the unique
#    bytes) and bytes node peers got by IPC.
# 3. Row-sharded on N ranks of this node (the same N), warm and evicted: each
#    rank its rows of every tensor into GPU memory, the unique bytes read once
#    (issue 16's table: 4 / 8 ranks warm 21 / 28 GB/s on an H100, evicted 8
#    ranks 1.56 GB/s), against the cats. After the replicate part: a run cut
#    by its time limit keeps the rows of the first two.
# DCPFS_BENCH_GPU_ARGS adds options to every dcpload run (say "--buffers 8
# --staging 64MiB"); DCPFS_BENCH_GPU_PARTS (default "one replicate") picks the
# parts (one, replicate, rows).
set -euo pipefail
: "${top_builddir:=$(cd "$(dirname "$0")/.." && pwd)}" "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
DCP="$top_builddir/dcp"
DCPLOAD="$top_builddir/dcpload"
REPS="${DCPFS_BENCH_REPS:-3}"
RANKS="${DCPFS_BENCH_GPU_RANKS:-1 4 8}"
PARTS="${DCPFS_BENCH_GPU_PARTS:-one replicate rows}"
PY="${DCPFS_BENCH_GPU_PYTHON:-python3}"
SIZE="${DCPFS_BENCH_GPU_BYTES:-4294967296}"
MPIEXEC="${MPIEXEC:-mpiexec.mpich}"
read -r -a EXTRA <<<"${DCPFS_BENCH_GPU_ARGS:-}"

say() { printf '%s\n' "$*"; }
[ -x "$DCPLOAD" ] || { say "bench-gpu: dcpload is not built: skipped"; exit 0; }
command -v "$MPIEXEC" >/dev/null 2>&1 || { say "bench-gpu: no mpiexec ($MPIEXEC): skipped"; exit 0; }
mpi() { timeout -k 10 900 "$MPIEXEC" -launcher fork -n "$@"; }
if [ "${DCPLOAD_FAKE_DEVICE:-}" != 1 ]; then
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 ||
        { say "bench-gpu: no GPU (nvidia-smi -L): skipped"; exit 0; }
fi
BASE="${DCPFS_BENCH_DIR:-${TMPDIR:-/tmp}/dcpfs-bench}"
mkdir -p "$BASE"
DIR=$(mktemp -d "$BASE/gpu.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
CK="$DIR/ckpt"
if ! "$DCP" synth "$CK" --total "$SIZE" --shape 4096,4096 --dtype float32 --ranks 8 --shard rows \
    >"$DIR/synth.log" 2>&1; then
    say "bench-gpu: 'dcp synth' could not write the checkpoint: $(tail -1 "$DIR/synth.log"): skipped"
    exit 0
fi
cat "$CK"/*.distcp >/dev/null   # warm the page cache
if ! mpi 1 "$DCPLOAD" "$CK" --layout replicate --device cuda --json >"$DIR/probe.json" 2>"$DIR/probe.err"; then
    say "bench-gpu: dcpload --device cuda fails here: $(tail -1 "$DIR/probe.err"): skipped"
    exit 0
fi
unique=$(python3 -c 'import json, sys; print([r for r in map(json.loads, open(sys.argv[1])) if "bytes_read" in r][0]["bytes_unique"])' "$DIR/probe.json")
SHARDS=("$CK"/*.distcp)
evict() { python3 "$top_srcdir/bench/evict.py" "${SHARDS[@]}" "$@"; }
now() { date +%s.%N; }

# summary FILE PROC: "SECONDS BYTES_READ BYTES_IPC DELIVERY PROC" of one --json run (slowest rank);
# where the slowest rank's launch went, into FILE.phases
summary() {
    python3 - "$1" "$2" <<'PY'
import json, sys
st = [r for r in map(json.loads, open(sys.argv[1])) if "bytes_read" in r]
print("%.6f %d %d %s %.3f" % (max(r["seconds"] for r in st), sum(r["bytes_read"] for r in st),
                              sum(r.get("bytes_ipc", 0) for r in st),
                              ",".join(sorted({r.get("delivery", "?") for r in st})), float(sys.argv[2])))
r = max(st, key=lambda r: r["seconds"])
names = ["exec", "mpi_init", "open", "device", "alloc", "warmup", "", "free"]
parts = [(n or "load", r.get("seconds_" + n if n else "seconds", 0)) for n in names]
rest = float(sys.argv[2]) - sum(s for _, s in parts if s > 0)
with open(sys.argv[1] + ".phases", "w") as f:
    f.write("process %.3f s: %s, the rest (mpiexec, MPI_Finalize, exit) %.3f\n"
            % (float(sys.argv[2]), ", ".join("%s %.3f" % p for p in parts), rest))
PY
}
# best N LAYOUT warm|evicted ARGS...: the best of REPS runs (by dcp_load's seconds):
# "SECONDS BYTES_READ BYTES_IPC DELIVERY PROC" (PROC: the whole launch's seconds, without
# digests: a user's load computes none, nor do the peers); its phases into $DIR/best.phases
best() {
    local n=$1 layout=$2 state=$3 b="" line t0
    shift 3
    rm -f "$DIR/best.phases"
    for _ in $(seq "$REPS"); do
        [ "$state" = evicted ] && evict
        t0=$(now)
        mpi "$n" "$DCPLOAD" "$CK" --layout "$layout" --json --no-digests "$@" ${EXTRA[@]+"${EXTRA[@]}"} >"$DIR/run.json" 2>"$DIR/run.err" ||
            { say "bench-gpu: dcpload -n $n --layout $layout $* failed: $(tail -1 "$DIR/run.err")" >&2; echo "nan 0 0 failed nan"; return; }
        line=$(summary "$DIR/run.json" "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')")
        if [ -z "$b" ] || awk -v a="${line%% *}" -v c="${b%% *}" 'BEGIN { exit !(a < c) }'; then
            b=$line
            cp "$DIR/run.json.phases" "$DIR/best.phases"
        fi
    done
    echo "$b"
}
# cats warm|evicted: the best of REPS parallel reads of the shard files (one cat each)
cats() {
    local b="" t0 t pids
    for _ in $(seq "$REPS"); do
        [ "$1" = evicted ] && evict
        t0=$(now)
        pids=()
        for f in "${SHARDS[@]}"; do cat "$f" >/dev/null & pids+=($!); done
        wait "${pids[@]}"
        t=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
        if [ -z "$b" ] || awk -v a="$t" -v c="$b" 'BEGIN { exit !(a < c) }'; then b=$t; fi
    done
    echo "$b"
}
# peer TOOL PATH warm|evicted: "SECONDS PROC" of bench/gpu_peers.py, "nan nan" when it cannot run
peer() {
    timeout -k 5 300 $PY "$top_srcdir/bench/gpu_peers.py" "$@" "$REPS" 2>"$DIR/peer.err" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print("%.6f %.3f" % (r["seconds"], r["process_seconds"]))' 2>/dev/null ||
        { echo "nan nan"; say "bench-gpu: $1: $(tail -1 "$DIR/peer.err")" >&2; }
}
gbps() { awk -v s="$1" -v u="$unique" 'BEGIN { if (s == "nan" || s == 0) print "n/a"; else printf "%.2f", u / s / 1e9 }'; }
ratio() {   # ratio A B TARGET: A / B (B's seconds over A's: > 1 is faster), and met or not
    awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "n/a";
        else printf "%.2fx%s", a / b, (t == "" ? "" : (a / b >= t ? ": met" : ": not met")) }'
}

if [[ " $PARTS " == *" one "* ]]; then
    SAFE="$DIR/all.safetensors"
    "$DCP" convert --quiet --no-sync "$CK" "$SAFE" >"$DIR/convert.log" 2>&1 ||
        { say "bench-gpu: dcp convert to safetensors failed: $(tail -1 "$DIR/convert.log")"; SAFE=""; }
    copy=$($PY "$top_srcdir/bench/gpu_peers.py" copy 1073741824 "$REPS" 2>"$DIR/copy.err" |
        python3 -c 'import json, sys; print("%.2f" % json.load(sys.stdin)["gbps"])' 2>/dev/null) || copy="n/a"
    say "bench-gpu: one process into one GPU, $unique bytes in ${#SHARDS[@]} shard files; pinned -> GPU copy $copy GB/s"
    say "| page cache | dcpload s (GB/s; proc s) | cat s (GB/s) | safetensors s (proc) | torch dcp.load s | dcpfs Reader s | dcpfs.torch.load s (proc) | dcpload vs cat | vs safetensors | load vs dcpload |"
    say "|---|---|---|---|---|---|---|---|---|---|"
    phases_all=()
    for state in warm evicted; do
        d=$(best 1 rows "$state" --device cuda)
        read -r ds _ _ _ dproc <<<"$d"
        phases="$state, dcpload $(cat "$DIR/best.phases" 2>/dev/null)"
        c=$(cats "$state")
        st="nan nan"
        [ -n "$SAFE" ] && st=$(peer safetensors "$SAFE" "$state")
        to=$(peer torch "$CK" "$state")
        rd=$(peer reader "$CK" "$state")
        ld=$(peer load "$CK" "$state")
        [ "$state" = evicted ] && tcat=0.95 || tcat=""
        [ "$state" = warm ] && tst=5 || tst=""
        say "| $state | $ds ($(gbps "$ds"); $dproc) | $c ($(gbps "$c")) | ${st% *} (${st#* }) | ${to% *} | ${rd% *} | ${ld% *} (${ld#* }) | $(ratio "$c" "$ds" "$tcat") | $(ratio "${st% *}" "$ds" "$tst") | $(ratio "$ds" "${ld% *}" 0.9) |"
        phases_all+=("$phases")
    done
    say "(warm target: dcpload >= 30 GB/s into the GPU; the pinned -> GPU copy above is its ceiling)"
    for p in "${phases_all[@]}"; do say "$p"; done
    # past the page cache (O_DIRECT into staging / the pinned ring), evicted
    d=$(best 1 rows evicted --device cuda --direct)
    read -r ds _ _ _ dproc <<<"$d"
    c=$(cats evicted)
    ld=$(peer load-direct "$CK" evicted)
    say "evicted, O_DIRECT: dcpload --direct $ds s ($(gbps "$ds"); proc $dproc): cats $c s / dcpload $(ratio "$c" "$ds" 0.95); dcpfs.torch.load(direct=True) ${ld% *} s (proc ${ld#* })"
    # the GPU copying straight out of the page cache (--map: cudaHostRegister of a read-only
    # mapping of the shard) against the staged path, warm, side by side
    d=$(best 1 rows warm --device cuda)
    read -r ds _ _ _ dproc <<<"$d"
    m=$(best 1 rows warm --device cuda --map)
    read -r ms _ _ _ mproc <<<"$m"
    say "warm, mapped: dcpload --map $ms s ($(gbps "$ms"); proc $mproc) against staged $ds s ($(gbps "$ds"); proc $dproc): $(ratio "$ds" "$ms" 1) (the default should become the faster)"
    # how many reader threads the warm paths need (default 8): the page cache -> pinned copies
    # scale with threads up to the memory bus (a 16-core H100 machine: 5.3 / 14.1 / 23.6 / 39.2
    # GB/s on 1 / 4 / 8 / 16 threads), the mapped path copies none. T copies at once need all
    # three: T unit readers (DCPLOAD_IO_THREADS), T staging buffers to read into (--buffers,
    # default 4: readers beyond them wait) and a read-thread budget of T (DCP_READ_THREADS,
    # default 8: with fewer buffers a read is cut into the budget's threads left). Before
    # 2026-11-30 the sweep set only the first, so every line copied on about 8 threads.
    sweep="warm, by reader threads (readers = buffers = budget), staged / mapped:"
    for t in 4 8 16 32; do
        [ "$t" -le "$(($(nproc) * 2))" ] || continue
        ds=$(DCPLOAD_IO_THREADS=$t DCP_READ_THREADS=$t best 1 rows warm --device cuda --buffers "$t")
        ms=$(DCPLOAD_IO_THREADS=$t DCP_READ_THREADS=$t best 1 rows warm --device cuda --map --buffers "$t")
        sweep="$sweep $t: ${ds%% *} s ($(gbps "${ds%% *}")) / ${ms%% *} s ($(gbps "${ms%% *}"));"
    done
    say "$sweep"
    [ -n "$SAFE" ] && rm -f "$SAFE"
fi

if [[ " $PARTS " == *" replicate "* ]]; then
    one=$(best 1 replicate warm --device cuda)
    t1=${one%% *}
    say "bench-gpu: replicated, $unique unique bytes; one rank into GPU memory: $t1 s"
    say "| ranks | host | cuda-msg | cuda-ipc (proc s) | baseline (1 rank $t1 + N D2D) | baseline / cuda-ipc (target >= 1) | bytes read | bytes by IPC | delivery |"
    say "|---|---|---|---|---|---|---|---|---|"
    for n in $RANKS; do
        host=$(best "$n" replicate warm --device host)
        msg=$(best "$n" replicate warm --device cuda --host-delivery)
        ipc=$(best "$n" replicate warm --device cuda --device-delivery)
        d2d=$(python3 "$top_srcdir/bench/gpu_d2d.py" "$unique" "$n" "$REPS" 2>"$DIR/d2d.err") || d2d=nan
        read -r ti readb ipcb deliv iproc <<<"$ipc"
        base=$(awk -v a="$t1" -v b="$d2d" 'BEGIN { if (b == "nan") print "nan"; else printf "%.6f", a + b }')
        say "| $n | ${host%% *} | ${msg%% *} | $ti ($iproc) | $base (D2D $d2d) | $(ratio "$base" "$ti" 1) | $readb | $ipcb | $deliv |"
    done
fi

if [[ " $PARTS " == *" rows "* ]]; then
    say "bench-gpu: row-sharded on N ranks into GPU memory, $unique unique bytes (seconds of dcp_load, slowest rank; proc the launch)"
    say "| ranks | warm s (GB/s; proc s) | warm cats s | vs cats | evicted s (GB/s; proc s) | evicted cats s | vs cats (target >= 0.95) | bytes read |"
    say "|---|---|---|---|---|---|---|---|"
    cw=$(cats warm)
    ce=$(cats evicted)
    for n in $RANKS; do
        w=$(best "$n" rows warm --device cuda)
        e=$(best "$n" rows evicted --device cuda)
        read -r ws _ _ _ wproc <<<"$w"
        read -r es readb _ _ eproc <<<"$e"
        say "| $n | $ws ($(gbps "$ws"); $wproc) | $cw | $(ratio "$cw" "$ws" "") | $es ($(gbps "$es"); $eproc) | $ce | $(ratio "$ce" "$es" 0.95) | $readb |"
    done
fi
