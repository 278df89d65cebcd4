#!/bin/bash
# dcpfs read throughput (run by `make bench`, never by the tests).
#
# A 4-rank checkpoint of one float32 [SIDE, SIDE] tensor (16384: 1 GiB) is
# generated with `dcp synth`, row-sharded and column-sharded, into a scratch
# folder deleted at exit. For each, these read the same bytes, sequentially
# in 1 MiB reads into a page-aligned buffer (bench/fuse_read.py):
#   raw          the four shard files, directly
#   passthrough  the four shard files through bench/passthrough, a minimal
#                libfuse mount, as libfuse's passthrough_ll answers (read=splice:
#                an fd buffer libfuse splices, or copies when it outgrows the
#                pipe) and with pread into a reused buffer (read=pread)
#   dcpfs        the tensor's file, with its defaults and with each read mode
# and measure
#   first read   right after mounting, with the shard files in the page cache
#                (evicted and read sequentially just before: this measures the
#                mount, not the disk),
#                and again with them evicted (posix_fadvise DONTNEED on the
#                shard files only), the same way for dcpfs and the baselines;
#   re-read      a second read through the same mount: dcpfs keeps the kernel
#                page cache (keep_cache), so no request reaches the daemon;
#                compared with the raw read of cached shard files;
#   peak RSS     of the daemon, VmHWM of /proc/PID/status read before each
#                unmount (the high-water mark: it covers the whole mount).
# Each is the best of REPS runs (fresh mount each); CPU time is user + system
# of the reader and of the daemon (less sensitive to a busy machine than
# wall time). One line per measurement, with its throughput ratio to the
# baseline, the CPU ratio (baseline CPU / its CPU: above 1 is cheaper) and,
# for the issue's targets, whether it is met:
#   first read (shards cached or evicted), dcpfs defaults vs the faster
#   passthrough: rows >= 0.9x, cols >= 0.6x; re-read vs raw >= 0.8x;
#   daemon RSS < 64 MiB.
# Skips (exit 0 with a message) when it cannot mount or lacks room.
#
# Environment: DCPFS_BENCH_SIDE (16384), DCPFS_BENCH_REPS (3), DCPFS_BENCH_DIR
# (where the scratch folder goes; default $TMPDIR or /tmp), DCPFS_BENCH_COLD=0
# to skip the evicted-shards runs.
set -euo pipefail
: "${top_builddir:=$(cd "$(dirname "$0")/.." && pwd)}" "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
DCP="$top_builddir/dcp"
DCPFS="$top_builddir/dcpfs"
PT="$top_builddir/bench/passthrough"
FOLIOS="$top_builddir/bench/folios"
READ="$top_srcdir/bench/fuse_read.py"
SIDE="${DCPFS_BENCH_SIDE:-16384}"
REPS="${DCPFS_BENCH_REPS:-3}"
COLD="${DCPFS_BENCH_COLD:-1}"

say() { printf '%s\n' "$*"; }
skip() { say "bench-fuse: skipped: $*"; exit 0; }
[ -x "$DCPFS" ] && [ -x "$PT" ] && [ -x "$DCP" ] || skip "build first (make)"
command -v python3 >/dev/null || skip "python3 is not installed"
[ -c /dev/fuse ] || skip "no /dev/fuse"
command -v fusermount3 >/dev/null || skip "fusermount3 is not installed"

BYTES=$((SIDE * SIDE * 4))
parent="${DCPFS_BENCH_DIR:-${TMPDIR:-/tmp}}"
mkdir -p "$parent"
avail=$(df -P -k "$parent" | awk 'NR == 2 {printf "%.0f", $4 * 1024}')
[ "$avail" -gt $((2 * BYTES + BYTES / 4)) ] || skip "$parent has $((avail >> 20)) MiB free, needs $(((2 * BYTES + BYTES / 4) >> 20))"
WORK=$(mktemp -d "$parent/dcpfs-bench.XXXXXX")
export XDG_CACHE_HOME="$WORK/cache"   # the catalog of these throwaway checkpoints goes too
MNTS=()
PIDS=()
cleanup() {
    local m p
    for m in "${MNTS[@]}"; do mountpoint -q "$m" 2>/dev/null && fusermount3 -u "$m" 2>/dev/null; done
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT

# gen LAYOUT: the checkpoint, synced so that its pages can be evicted.
gen() {
    local out="$WORK/$1"
    if ! "$DCP" synth "$out" --keys 1 --shape "$SIDE,$SIDE" --dtype float32 --ranks 4 --shard "$1" --seed 1 \
            >"$WORK/synth.log" 2>&1; then
        say "bench-fuse: \`dcp synth\` failed:"; sed 's/^/    /' "$WORK/synth.log"
        exit 1
    fi
    sync "$out"/__*.distcp
}

# mount_with PROGRAM SOURCE MNT [options]: mount, wait for the ready byte, set PID.
mount_with() {
    local prog=$1 src=$2 mnt=$3; shift 3
    mkdir -p "$mnt"
    rm -f "$mnt.ready"; mkfifo "$mnt.ready"
    "$prog" -f -o ready_fd=3 "$@" "$src" "$mnt" 3>"$mnt.ready" 2>"$mnt.log" &
    PID=$!
    PIDS+=("$PID"); MNTS+=("$mnt")
    local b=""; read -r -t 120 -n 1 b <"$mnt.ready" || true
    rm -f "$mnt.ready"
    [ "$b" = 1 ] || skip "$(basename "$prog") could not mount $src: $(head -3 "$mnt.log")"
    # The same kernel readahead on every FUSE mount (dcpfs sets its own default).
    local dev; dev=$(mountpoint -d "$mnt")
    if [ -w "/sys/class/bdi/$dev/read_ahead_kb" ]; then echo 1024 >"/sys/class/bdi/$dev/read_ahead_kb"; fi
}

umount_with() { fusermount3 -u "$1"; wait "$PID" 2>/dev/null || true; }

# Best-of accumulators: RATE[k] (GB/s, max), CPU[k] (s, min, "reader+daemon"), RSS[k] (MiB, max).
declare -A RATE CPU RSS FOL
note() {   # note KEY "BYTES WALL READER_CPU DAEMON_CPU"
    local k=$1 r c
    r=$(awk '{printf "%.3f", $1 / $2 / 1e9}' <<<"$2")
    c=$(awk '{printf "%.3f|%.2f+%.2f", $3 + $4, $3, $4}' <<<"$2")
    if [ -z "${RATE[$k]:-}" ] || awk -v a="$r" -v b="${RATE[$k]}" 'BEGIN {exit !(a > b)}'; then RATE[$k]=$r; fi
    if [ -z "${CPU[$k]:-}" ] || awk -v a="${c%%|*}" -v b="${CPU[$k]%%|*}" 'BEGIN {exit !(a < b)}'; then CPU[$k]=$c; fi
}
note_rss() {
    local k=$1 v; v=$(awk '/VmHWM/ {printf "%.1f", $2 / 1024}' "/proc/$PID/status")
    if [ -z "${RSS[$k]:-}" ] || awk -v a="$v" -v b="${RSS[$k]}" 'BEGIN {exit !(a > b)}'; then RSS[$k]=$v; fi
}

# Bring the shard files into the page cache the way a plain sequential read
# leaves them (evicted first: how much sits in large folios depends on how
# the pages were filled, and re-reads depend on it).
prime() { python3 "$READ" "${EVICT[@]}" "${SHARDS[@]}" >/dev/null; }
EVICT=()   # --evict SHARD for each shard, set per layout

# run_raw LAYOUT
run_raw() {
    local l=$1
    prime
    note "$l raw cached" "$(python3 "$READ" "${SHARDS[@]}")"
    [ "$COLD" = 1 ] && note "$l raw evicted" "$(python3 "$READ" "${EVICT[@]}" "${SHARDS[@]}")"
    return 0
}

# run_mount LAYOUT NAME PROGRAM [options]: first read (cached), re-read, then first read (evicted).
run_mount() {
    local l=$1 name=$2 prog=$3; shift 3
    local mnt="$WORK/mnt" files=()
    if [ "$prog" = "$PT" ]; then files=("${SHARDS[@]/#$CK/$mnt}"); else files=("$mnt/$REL"); fi
    prime
    mount_with "$prog" "$CK" "$mnt" "$@"
    note "$l $name first cached" "$(python3 "$READ" --pid "$PID" "${files[@]}")"
    note "$l $name reread" "$(python3 "$READ" --pid "$PID" "${files[@]}")"
    note_rss "$l $name"
    # Why re-reads cost what they cost: the folios the page cache holds the bytes in.
    if [ -z "${FOL[$l $name]:-}" ] && [ -x "$FOLIOS" ]; then
        FOL[$l $name]=$("$FOLIOS" "${files[0]}" 2>/dev/null | awk '{print $3}') || FOL[$l $name]=""
    fi
    umount_with "$mnt"
    if [ "$COLD" = 1 ]; then
        mount_with "$prog" "$CK" "$mnt" "$@"
        note "$l $name first evicted" "$(python3 "$READ" --pid "$PID" "${EVICT[@]}" "${files[@]}")"
        note_rss "$l $name"
        umount_with "$mnt"
    fi
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
verdict() { awk -v r="$1" -v t="$2" 'BEGIN {print (r >= t ? "met" : "NOT MET")}'; }

# line LAYOUT WHAT CONFIG KEY [BASEKEY BASENAME [TARGET]]
line() {
    local l=$1 what=$2 cfg=$3 k=$4 base=${5:-} bname=${6:-} target=${7:-}
    local c=${CPU[$k]} extra=""
    if [ -n "$base" ]; then
        local r b=${CPU[$base]}; r=$(ratio "${RATE[$k]}" "${RATE[$base]}")
        # The CPU ratio (baseline's CPU time / this one's) says the same with less noise.
        extra="  ${r}x $bname (cpu $(ratio "${b%%|*}" "${c%%|*}")x)"
        [ -n "$target" ] && extra="$extra  target >= ${target}x: $(verdict "$r" "$target")"
    fi
    printf '%-5s %-26s %-40s %6.2f GB/s  cpu %5.2f s (reader+daemon %s)%s\n' \
        "$l" "$what" "$cfg" "${RATE[$k]}" "${c%%|*}" "${c#*|}" "$extra"
}

say "bench-fuse: float32 [$SIDE, $SIDE] ($((BYTES >> 20)) MiB), 4 ranks, generated by dcp synth in $WORK;"
say "  best of $REPS runs, each on a fresh mount; 1 MiB sequential reads; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg);"
say "  fs/pipe-max-size $(cat /proc/sys/fs/pipe-max-size 2>/dev/null || echo '?'), kernel $(uname -r)"
declare -A TARGET=([rows]=0.9 [cols]=0.6)
PT_CONFIGS=("read=splice" "read=pread" "read=splice,max_read=524288")
FS_CONFIGS=("" "read=splice" "read=pread" "read=pread,max_read=1048576")
for l in rows cols; do
    gen "$l"
    CK="$WORK/$l"
    SHARDS=("$CK"/__*.distcp)
    EVICT=(); for f in "${SHARDS[@]}"; do EVICT+=(--evict "$f"); done
    key=$("$DCP" ls --json "$CK" | head -1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["key"])')
    REL=$(python3 "$top_srcdir/tests/fuse_check.py" path "$key")
    for _ in $(seq "$REPS"); do
        run_raw "$l"
        for c in "${PT_CONFIGS[@]}"; do run_mount "$l" "pt $c" "$PT" -o "$c"; done
        for c in "${FS_CONFIGS[@]}"; do run_mount "$l" "fs $c" "$DCPFS" ${c:+-o "$c"}; done
    done
    for cond in cached evicted; do
        [ "$cond" = evicted ] && [ "$COLD" != 1 ] && continue
        # The baseline: the faster passthrough.
        best=""
        for c in "${PT_CONFIGS[@]}"; do
            k="$l pt $c first $cond"
            if [ -z "$best" ] || awk -v a="${RATE[$k]}" -v b="${RATE[$best]}" 'BEGIN {exit !(a > b)}'; then best=$k; fi
        done
        what="first read, shards $cond"
        line "$l" "$what" "raw shard files" "$l raw $cond"
        for c in "${PT_CONFIGS[@]}"; do line "$l" "$what" "passthrough -o $c" "$l pt $c first $cond"; done
        for c in "${FS_CONFIGS[@]}"; do
            if [ -z "$c" ]; then
                line "$l" "$what" "dcpfs (defaults)" "$l fs  first $cond" "$best" "faster passthrough" "${TARGET[$l]}"
            else
                line "$l" "$what" "dcpfs -o $c" "$l fs $c first $cond" "$best" "faster passthrough"
            fi
        done
    done
    for c in "${PT_CONFIGS[@]}"; do line "$l" "re-read" "passthrough -o $c" "$l pt $c reread" "$l raw cached" "raw (cached)"; done
    for c in "${FS_CONFIGS[@]}"; do
        if [ -z "$c" ]; then
            line "$l" "re-read" "dcpfs (defaults)" "$l fs  reread" "$l raw cached" "raw (cached)" 0.8
            # For reference: against reading the shard files from the disk.
            [ "$COLD" = 1 ] && line "$l" "re-read" "dcpfs (defaults)" "$l fs  reread" "$l raw evicted" "raw (evicted)"
        else
            line "$l" "re-read" "dcpfs -o $c" "$l fs $c reread" "$l raw cached" "raw (cached)"
        fi
    done
    raw_fol=$("$FOLIOS" "${SHARDS[0]}" 2>/dev/null | awk '{print $3}') || raw_fol=""
    if [ -n "$raw_fol" ] && [ -n "${FOL[$l fs ]:-}" ]; then
        printf '%-5s %-26s %s\n' "$l" "re-read: page cache folios" \
            "${raw_fol}% of a shard file's cached pages are in large folios, ${FOL[$l fs ]}% of dcpfs's file's, ${FOL[$l pt ${PT_CONFIGS[0]}]:-?}% of the passthrough's"
    fi
    for c in "${FS_CONFIGS[@]}"; do
        v=${RSS["$l fs $c"]}
        if [ -z "$c" ]; then label="dcpfs (defaults)"; else label="dcpfs -o $c"; fi
        printf '%-5s %-26s %-40s %6.1f MiB  (target < 64 MiB: %s)\n' "$l" "daemon peak RSS (VmHWM)" \
            "$label" "$v" "$(awk -v v="$v" 'BEGIN {print (v < 64 ? "met" : "NOT MET")}')"
    done
    rm -rf "$CK"
done
