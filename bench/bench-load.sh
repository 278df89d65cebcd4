#!/bin/bash
# The collective loader against the alternatives (run by `make bench`, never by the tests).
#
# A synthetic checkpoint of 2 GiB (32 float32 tensors of 4096x4096, each saved
# row-sharded by 4 ranks into 4 shard files), made with `dcp synth` and kept in
# $DCPFS_BENCH_DIR between runs. On 1, 2 and 4 ranks, for the rows and
# replicate layouts (shapes divide evenly, so every tool splits alike), the
# best of $DCPFS_BENCH_REPS runs of:
#   raw          N processes read the shard files, split into N equal
#                contiguous shares (16 MiB preadv into a reused buffer)
#   dcpload      the collective load (dcp_load): each byte read once
#   dcp-way      dcpload --strategy independent: every rank reads its own
#                needs, each overlapping record whole (DCP's default reader)
#   torch        PyTorch's torch.distributed.checkpoint.load on N gloo ranks
#                into preallocated tensors of the same layout (DTensors
#                sharded on dim 0 for rows, whole tensors for replicate)
# Reported: seconds, unique bytes per second (storage throughput), bytes
# delivered into rank memory per second, bytes read from storage (dcpload:
# its statistics; torch: rchar of /proc/self/io), and dcpload's ratio to raw.
# Warm page cache for all (the checkpoint was just written or read).
# Targets (issue 6): dcpload >= 0.85x the raw read, bytes read == unique bytes.
set -euo pipefail
: "${top_builddir:=$(cd "$(dirname "$0")/.." && pwd)}" "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
DCP="$top_builddir/dcp"
DCPLOAD="$top_builddir/dcpload"
DIR="${DCPFS_BENCH_DIR:-${TMPDIR:-/tmp}/dcpfs-bench}"
REPS="${DCPFS_BENCH_REPS:-3}"
RANKS="${DCPFS_BENCH_RANKS:-1 2 4}"
MPIEXEC="${MPIEXEC:-mpiexec.mpich}"
CK="$DIR/load-2g"

say() { printf '%s\n' "$*"; }
[ -x "$DCPLOAD" ] || { say "bench-load: dcpload is not built: skipped"; exit 0; }
command -v "$MPIEXEC" >/dev/null 2>&1 || { say "bench-load: no mpiexec ($MPIEXEC): skipped"; exit 0; }
mkdir -p "$DIR"
if [ ! -f "$CK/.metadata" ]; then
    rm -rf "$CK"
    if ! "$DCP" synth "$CK" --total 2147483648 --shape 4096,4096 --dtype float32 --ranks 4 --shard rows \
        >"$DIR/synth.log" 2>&1; then
        say "bench-load: 'dcp synth' could not write the 2 GiB checkpoint: $(tail -1 "$DIR/synth.log")"
        say "bench-load: skipped (needs a dcp with the synth command)"
        rm -rf "$CK"
        exit 0
    fi
fi
have_torch=1
python3 -c 'import torch' 2>/dev/null || { have_torch=0; say "bench-load: PyTorch not installed: no torch rows"; }
cat "$CK"/*.distcp >/dev/null   # warm the page cache for everyone

mpi() { timeout -k 10 900 "$MPIEXEC" -launcher fork -n "$@"; }

# best SECONDS of REPS runs of a command printing "SECONDS BYTES_READ"
best() {
    local b="" r=""
    for _ in $(seq "$REPS"); do
        local out
        out=$("$@")
        local s=${out%% *}
        if [ -z "$b" ] || awk -v a="$s" -v b="$b" 'BEGIN{exit !(a<b)}'; then b=$s; r=${out#* }; fi
    done
    echo "$b $r"
}

# dcpload ... --json: the slowest rank's seconds, and the sum of bytes read
dcpload_run() {
    mpi "$@" --json | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if "bytes_read" in l]
print("%.6f %d" % (max(r["seconds"] for r in rows), sum(r["bytes_read"] for r in rows)))'
}

UNIQUE=$("$DCP" ls --json "$CK" | python3 -c 'import json,sys; print(sum(json.loads(l)["nbytes"] for l in sys.stdin))')
gib() { awk -v b="$1" 'BEGIN{printf "%.2f", b/1073741824}'; }
rate() { awk -v b="$1" -v s="$2" 'BEGIN{printf "%.2f", b/s/1e9}'; }

say "bench-load: $CK, $(gib "$UNIQUE") GiB of tensors, $(nproc) CPUs, best of $REPS, warm page cache"
printf '%-5s %-9s %-8s %8s %10s %12s %11s %9s\n' ranks layout tool seconds "unique GB/s" "delivered GB/s" "read GiB" "vs raw"
for n in $RANKS; do
    files=("$CK"/*.distcp)
    read -r raw_s raw_b < <(best python3 "$top_srcdir/bench/load_raw.py" "$n" "${files[@]}")
    for layout in rows replicate; do
        delivered=$UNIQUE
        [ "$layout" = replicate ] && delivered=$((UNIQUE * n))
        printf '%-5s %-9s %-8s %8.3f %10s %12s %11s %9s\n' "$n" "$layout" raw "$raw_s" \
            "$(rate "$UNIQUE" "$raw_s")" - "$(gib "$raw_b")" 1.00
        for tool in dcpload dcp-way torch; do
            case $tool in
                dcpload) read -r s b < <(best dcpload_run "$n" "$DCPLOAD" "$CK" --layout "$layout") ;;
                dcp-way) read -r s b < <(best dcpload_run "$n" "$DCPLOAD" "$CK" --layout "$layout" --strategy independent) ;;
                torch)
                    [ "$have_torch" = 1 ] || continue
                    read -r s b < <(best python3 "$top_srcdir/bench/load_torch.py" "$CK" "$n" "$layout") ;;
            esac
            printf '%-5s %-9s %-8s %8.3f %10s %12s %11s %9s\n' "$n" "$layout" "$tool" "$s" \
                "$(rate "$UNIQUE" "$s")" "$(rate "$delivered" "$s")" "$(gib "$b")" \
                "$(awk -v r="$raw_s" -v s="$s" 'BEGIN{printf "%.2fx", r/s}')"
        done
    done
done
say "unique GB/s: tensor bytes / time; delivered: bytes placed in all ranks' memory / time;"
say "read GiB: dcpload = its bytes_read statistics summed over ranks, torch = rchar (read syscalls),"
say "raw = the shard files' bytes; vs raw: raw seconds / tool seconds (higher is better)."
