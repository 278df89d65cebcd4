#!/bin/bash
# dcpload into GPU memory (issue 16; run by `make bench`, never by the tests;
# skipped without a GPU).
#
# A synthetic checkpoint of $DCPFS_BENCH_GPU_BYTES (default 4 GiB: float32
# tensors of 4096x4096 saved row-sharded by 4 ranks), written with `dcp synth`
# into a scratch folder under $DCPFS_BENCH_DIR, warm in the page cache, and
# deleted at the end. Replicated on N ranks of this node (default 1 2 4:
# DCPFS_BENCH_GPU_RANKS; rank i uses device i mod the device count, so on a
# single-GPU machine all ranks share it), best of $DCPFS_BENCH_REPS (3) runs,
# seconds of dcp_load on the slowest rank:
#   host       --device host: destinations in host memory (for comparison)
#   cuda-msg   --device cuda --host-delivery: node peers get host messages and
#              each copies its bytes up to its GPU (the default path)
#   cuda-ipc   --device cuda --device-delivery: the reader stages each unit once into its device
#              staging buffer, node peers copy device to device out of it
#              (CUDA IPC); its "delivery" statistic must say "ipc"
#   baseline   one rank loading the bytes once into GPU memory (dcpload -n 1
#              --device cuda) plus N device-to-device copies of all the bytes
#              (bench/gpu_d2d.py: cudaMemcpyPeerAsync, timed by CUDA events)
# Target (issue 16): cuda-ipc <= baseline (ratio baseline / cuda-ipc >= 1).
# Also printed per line: bytes read (sum over ranks; must equal the unique
# bytes) and bytes node peers got by IPC. DCPFS_BENCH_GPU_ARGS adds options to
# every dcpload run (say "--buffers 8 --staging 64MiB").
set -euo pipefail
: "${top_builddir:=$(cd "$(dirname "$0")/.." && pwd)}" "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
DCP="$top_builddir/dcp"
DCPLOAD="$top_builddir/dcpload"
REPS="${DCPFS_BENCH_REPS:-3}"
RANKS="${DCPFS_BENCH_GPU_RANKS:-1 2 4}"
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
if ! "$DCP" synth "$CK" --total "$SIZE" --shape 4096,4096 --dtype float32 --ranks 4 --shard rows \
    >"$DIR/synth.log" 2>&1; then
    say "bench-gpu: 'dcp synth' could not write the checkpoint: $(tail -1 "$DIR/synth.log"): skipped"
    exit 0
fi
cat "$CK"/*.distcp >/dev/null   # warm the page cache
if ! mpi 1 "$DCPLOAD" "$CK" --layout replicate --device cuda --json >"$DIR/probe.json" 2>"$DIR/probe.err"; then
    say "bench-gpu: dcpload --device cuda fails here: $(tail -1 "$DIR/probe.err"): skipped"
    exit 0
fi

# summary FILE: "SECONDS BYTES_READ BYTES_IPC DELIVERY" of one --json run (slowest rank)
summary() {
    python3 - "$1" <<'PY'
import json, sys
st = [r for r in map(json.loads, open(sys.argv[1])) if "bytes_read" in r]
print("%.6f %d %d %s" % (max(r["seconds"] for r in st), sum(r["bytes_read"] for r in st),
                         sum(r.get("bytes_ipc", 0) for r in st), ",".join(sorted({r.get("delivery", "?") for r in st}))))
PY
}
# best N ARGS...: the best of REPS runs: "SECONDS BYTES_READ BYTES_IPC DELIVERY"
best() {
    local n=$1 b="" line
    shift
    for _ in $(seq "$REPS"); do
        mpi "$n" "$DCPLOAD" "$CK" --layout replicate --json "$@" ${EXTRA[@]+"${EXTRA[@]}"} >"$DIR/run.json" 2>"$DIR/run.err" ||
            { say "bench-gpu: dcpload -n $n $* failed: $(tail -1 "$DIR/run.err")" >&2; echo "nan 0 0 failed"; return; }
        line=$(summary "$DIR/run.json")
        if [ -z "$b" ] || awk -v a="${line%% *}" -v c="${b%% *}" 'BEGIN { exit !(a < c) }'; then b=$line; fi
    done
    echo "$b"
}

one=$(best 1 --device cuda)
t1=${one%% *}
unique=$(python3 -c 'import json, sys; print([r for r in map(json.loads, open(sys.argv[1])) if "bytes_read" in r][0]["bytes_unique"])' "$DIR/probe.json")
say "bench-gpu: $unique unique bytes; one rank into GPU memory: $t1 s"
say "| ranks | host | cuda-msg | cuda-ipc | baseline (1 rank $t1 + N D2D) | baseline / cuda-ipc (target >= 1) | bytes read | bytes by IPC | delivery |"
say "|---|---|---|---|---|---|---|---|---|"
for n in $RANKS; do
    host=$(best "$n" --device host)
    msg=$(best "$n" --device cuda --host-delivery)
    ipc=$(best "$n" --device cuda --device-delivery)
    d2d=$(python3 "$top_srcdir/bench/gpu_d2d.py" "$unique" "$n" "$REPS" 2>"$DIR/d2d.err") || d2d=nan
    read -r ti readb ipcb deliv <<<"$ipc"
    base=$(awk -v a="$t1" -v b="$d2d" 'BEGIN { if (b == "nan") print "nan"; else printf "%.6f", a + b }')
    ratio=$(awk -v a="$base" -v b="$ti" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "n/a";
        else printf "%.2fx: %s", a / b, (a / b >= 1 ? "met" : "not met") }')
    say "| $n | ${host%% *} | ${msg%% *} | $ti | $base (D2D $d2d) | $ratio | $readb | $ipcb | $deliv |"
done
