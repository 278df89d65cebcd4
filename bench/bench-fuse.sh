#!/bin/bash
# dcpfs read throughput (run by `make bench`, never by the tests).
#
# For a row-sharded and a column-sharded float32 tensor of 1 GiB in a 4-rank
# checkpoint (generated with `dcp synth`, kept in $DCPFS_BENCH_DIR between runs):
#   raw          cat of the checkpoint's shard files
#   passthrough  the same shard files through bench/passthrough (a minimal libfuse mount)
#   dcpfs        the tensor's file through dcpfs, with -o read=splice, read=pread and auto, and
#                splice with 512 KiB requests (libfuse can only splice replies that fit
#                fs/pipe-max-size, 1 MiB without CAP_SYS_RESOURCE)
# each as a first read after mounting (page cache dropped when root) and a re-read.
# Reports GB/s, the ratios the README quotes (first read vs passthrough, re-read vs raw)
# and the dcpfs daemon's peak RSS (VmHWM).
set -euo pipefail
: "${top_builddir:=$(cd "$(dirname "$0")/.." && pwd)}" "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
DCP="$top_builddir/dcp"
DCPFS="$top_builddir/dcpfs"
PT="$top_builddir/bench/passthrough"
DIR="${DCPFS_BENCH_DIR:-${TMPDIR:-/tmp}/dcpfs-bench}"
SIDE="${DCPFS_BENCH_SIDE:-16384}"          # SIDE x SIDE float32: 16384 -> 1 GiB
REPS="${DCPFS_BENCH_REPS:-3}"        # best of REPS (shared VMs are noisy)

say() { printf '%s\n' "$*"; }
[ -x "$DCPFS" ] && [ -x "$PT" ] && [ -x "$DCP" ] || { say "bench-fuse: build first (make)"; exit 0; }
[ -c /dev/fuse ] && command -v fusermount3 >/dev/null || { say "bench-fuse: no /dev/fuse or fusermount3: skipped"; exit 0; }
mkdir -p "$DIR"

MNTS=()
cleanup() { for m in "${MNTS[@]}"; do fusermount3 -u "$m" 2>/dev/null || true; done; }
trap cleanup EXIT

drop_caches() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; DROPPED=yes; else DROPPED=no; fi
}

# gen NAME SHARD: the checkpoint, generated once.
gen() {
    local name=$1 shard=$2 out="$DIR/$1"
    [ -f "$out/.metadata" ] && return 0
    rm -rf "$out"
    if ! "$DCP" synth "$out" --keys 1 --shape "$SIDE,$SIDE" --dtype float32 --ranks 4 --shard "$shard" --seed 1 \
            >"$DIR/synth.log" 2>&1; then
        say "bench-fuse: cannot generate the $name checkpoint: \`dcp synth\` failed:"
        sed 's/^/    /' "$DIR/synth.log"
        say "bench-fuse: skipped (needs \`dcp synth\`, the writer issue)"
        rm -rf "$out"
        exit 0
    fi
}

# mount_with PROGRAM SOURCE MNT [options]: mount, wait for the ready byte, set PID.
mount_with() {
    local prog=$1 src=$2 mnt=$3; shift 3
    mkdir -p "$mnt"
    rm -f "$mnt.ready"; mkfifo "$mnt.ready"
    "$prog" -f -o ready_fd=3 "$@" "$src" "$mnt" 3>"$mnt.ready" 2>"$mnt.log" &
    PID=$!
    MNTS+=("$mnt")
    local b=""; read -r -t 120 -n 1 b <"$mnt.ready" || true
    rm -f "$mnt.ready"
    [ "$b" = 1 ] || { say "bench-fuse: $prog did not mount: $(cat "$mnt.log")"; exit 1; }
    # Same kernel readahead for every FUSE mount (dcpfs sets its own; do it for the baseline).
    local dev; dev=$(mountpoint -d "$mnt")
    [ -w "/sys/class/bdi/$dev/read_ahead_kb" ] && echo 1024 >"/sys/class/bdi/$dev/read_ahead_kb" || true
}

umount_with() { fusermount3 -u "$1"; wait "$PID" 2>/dev/null || true; }

# rate FILES...: GB/s reading the files once (sequential cat, 1 MiB reads).
rate() {
    local t0 t1 bytes
    bytes=$(stat -L -c %s "$@" | awk '{s += $1} END {print s}')
    t0=$(date +%s%N)
    for f in "$@"; do dd if="$f" of=/dev/null bs=1M status=none; done
    t1=$(date +%s%N)
    awk -v b="$bytes" -v ns=$((t1 - t0)) 'BEGIN {printf "%.2f", b / ns}'
}

max() { awk -v a="$1" -v b="$2" 'BEGIN {print (a > b ? a : b)}'; }

# measure FILES...: best first read (caches dropped) and best re-read of REPS, in COLD and WARM.
measure() {
    COLD=0; WARM=0
    for _ in $(seq "$REPS"); do
        drop_caches; COLD=$(max "$(rate "$@")" "$COLD")
        WARM=$(max "$(rate "$@")" "$WARM")
    done
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }

for layout in rows cols; do
    gen "$layout" "$layout"
    ck="$DIR/$layout"
    shards=("$ck"/__*.distcp)
    key=$("$DCP" ls --json "$ck" | head -1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["key"])')
    rel=$(python3 "$top_srcdir/tests/fuse_check.py" path "$key")

    measure "${shards[@]}"; raw_cold=$COLD; raw_warm=$WARM
    mount_with "$PT" "$ck" "$DIR/pt"
    measure "${shards[@]/#$ck/$DIR/pt}"; pt_cold=$COLD; pt_warm=$WARM
    umount_with "$DIR/pt"

    say "== $layout-sharded float32 [$SIDE, $SIDE], 4 ranks (caches dropped: $DROPPED, best of $REPS)"
    say "   raw shard files:      first $raw_cold GB/s, re-read $raw_warm GB/s"
    say "   passthrough mount:    first $pt_cold GB/s, re-read $pt_warm GB/s"
    for mode in read=splice read=pread read=auto read=splice,max_read=524288; do
        mount_with "$DCPFS" "$ck" "$DIR/fs" -o "$mode"
        measure "$DIR/fs/$rel"
        rss=$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$PID/status")
        umount_with "$DIR/fs"
        say "   dcpfs -o $mode: first $COLD GB/s ($(ratio "$COLD" "$pt_cold")x passthrough), re-read $WARM GB/s ($(ratio "$WARM" "$raw_warm")x raw), peak RSS ${rss} MiB"
    done
done
