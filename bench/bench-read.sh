#!/bin/bash
# One process reading evicted shard files into fresh memory: reader threads
# against io_uring (issue 16: "measure both, keep the faster"), and dcpload on
# one rank against both (run by `make bench`, never by the tests).
#
# A synthetic checkpoint of 2 GiB (32 float32 tensors of 4096x4096, 8 shard
# files, rows), written into a scratch folder under $DCPFS_BENCH_DIR and
# deleted at the end. Before every run the shard files are evicted from the
# page cache (bench/evict.py); the variants take turns within each of
# $DCPFS_BENCH_REPS rounds (storage speed drifts by minutes on a VM), and the
# best of each is printed, with the ratio of the reader threads' seconds to
# its seconds (> 1: faster than the threads):
#   cat8         8 dd's of file pieces to /dev/null: the device's limit
#   threads-8    bench/read_probe threads 8 8: 8 threads pread 8 MiB pieces in
#                file order into one fresh huge-page buffer (what dcpload's
#                unit readers do; libdcp's files.c)
#   threads-16   the same on 16 threads
#   uring-8/16   bench/read_probe uring: one thread, 8 or 16 reads of 8 MiB in
#                flight with io_uring, through the page cache
#   uring-8-direct  the same with O_DIRECT, straight into the buffer (a loader
#                can do this only where a destination's address and the file
#                offset agree modulo the block size: torch aligns records to 64)
#   dcpload      mpiexec -n 1 dcpload (fresh destinations, the whole process)
#   dcpload-direct  the same with --direct: evicted units read with O_DIRECT
#                straight into destinations dcpload places to agree with the
#                file modulo the block size, faulted in ahead of the readers
# The buffer of read_probe is allocated inside the clock, untouched, as a
# program's new tensors are: the reads fault it in.
set -euo pipefail
: "${top_builddir:=$(cd "$(dirname "$0")/.." && pwd)}" "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
DCP="$top_builddir/dcp"
DCPLOAD="$top_builddir/dcpload"
PROBE="$top_builddir/bench/read_probe"
REPS="${DCPFS_BENCH_REPS:-3}"
MPIEXEC="${MPIEXEC:-mpiexec.mpich}"
say() { printf '%s\n' "$*"; }
[ -x "$PROBE" ] && [ -x "$DCPLOAD" ] || { say "bench-read: bench/read_probe or dcpload is not built: skipped"; exit 0; }
BASE="${DCPFS_BENCH_DIR:-${TMPDIR:-/tmp}/dcpfs-bench}"
mkdir -p "$BASE"
DIR=$(mktemp -d "$BASE/read.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
CK="$DIR/ckpt"
"$DCP" synth "$CK" --keys 32 --shape 4096,4096 --ranks 8 --shard rows >"$DIR/synth.log" 2>&1 ||
    { say "bench-read: 'dcp synth' failed: $(tail -1 "$DIR/synth.log"): skipped"; exit 0; }
files=("$CK"/*.distcp)
evict() { python3 "$top_srcdir/bench/evict.py" "${files[@]}"; }
wall() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.6f\n", b-a}'; }
. "$top_srcdir/bench/par_read.sh"
cat8() { par_read "${files[@]}"; }
probe() {   # the probe's own seconds, or "-" where it cannot run (io_uring refused)
    local out rc=0
    out=$("$PROBE" "$@" "${files[@]}" 2>/dev/null) || rc=$?
    if [ "$rc" = 77 ]; then echo -; elif [ "$rc" != 0 ]; then echo "bench-read: read_probe $* failed" >&2; exit 1; else echo "${out%% *}"; fi
}
dcpload_proc() { wall timeout 300 "$MPIEXEC" -launcher fork -n 1 "$DCPLOAD" "$CK" --json --no-digests "$@"; }
names=(cat8 threads-8 threads-16 uring-8 uring-16 uring-8-direct dcpload dcpload-direct)
declare -A best
for _ in $(seq "$REPS"); do
    for v in "${names[@]}"; do
        evict
        case $v in
            cat8) s=$(wall cat8) ;;
            threads-8) s=$(probe threads 8 8) ;;
            threads-16) s=$(probe threads 16 8) ;;
            uring-8) s=$(probe uring 8 8) ;;
            uring-16) s=$(probe uring 16 8) ;;
            uring-8-direct) s=$(probe uring 8 8 direct) ;;
            dcpload) s=$(dcpload_proc) ;;
            dcpload-direct) s=$(dcpload_proc --direct) ;;
        esac
        [ "$s" = - ] && { best[$v]=-; continue; }
        if [ -z "${best[$v]:-}" ] || awk -v a="$s" -v b="${best[$v]}" 'BEGIN{exit !(a<b)}'; then best[$v]=$s; fi
    done
done
UNIQUE=$(stat -c %s "${files[@]}" | awk '{s+=$1} END{print s}')
say "bench-read: $(awk -v b="$UNIQUE" 'BEGIN{printf "%.2f", b/1073741824}') GiB in ${#files[@]} shard files, evicted before each run, $(nproc) CPUs, best of $REPS interleaved rounds, load average $(cut -d' ' -f1 /proc/loadavg)"
t8=${best[threads-8]}
for v in "${names[@]}"; do
    s=${best[$v]}
    if [ "$s" = - ]; then say "$(printf '%-15s' "$v") skipped (io_uring unavailable: no liburing at build time, or the kernel refuses it)"; continue; fi
    say "$(printf '%-15s %7.3f s  %5.2f GB/s  %5.2fx threads-8' "$v" "$s" "$(awk -v b="$UNIQUE" -v s="$s" 'BEGIN{print b/s/1e9}')" "$(awk -v a="$t8" -v s="$s" 'BEGIN{print a/s}')")"
done
say "dcpload: the whole mpiexec launch (start-up, metadata, plan, load into fresh destinations), no digests."
ratios() { awk -v c="${best[cat8]}" -v t="$t8" -v s="${best[$1]}" 'BEGIN{printf "%.2fx cat8, %.2fx threads-8", c/s, t/s}'; }
say "issue 16 (1 rank >= 0.95x a parallel read of the shard files): dcpload $(ratios dcpload); --direct $(ratios dcpload-direct)"
