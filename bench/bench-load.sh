#!/bin/bash
# The collective loader against the alternatives (run by `make bench`, never by the tests).
#
# A synthetic checkpoint of 2 GiB (32 float32 tensors of 4096x4096, each saved
# row-sharded by 4 ranks into 4 shard files), written with `dcp synth` into a
# scratch folder under $DCPFS_BENCH_DIR and deleted at the end. On 1, 2 and 4
# ranks, for the rows and replicate layouts (shapes divide evenly, so every
# tool splits alike), the best of $DCPFS_BENCH_REPS runs (by wall time) of:
#   raw         bench/load_raw --dest: N MPI processes pread the shard files,
#               split into N equal contiguous shares, in 16 MiB requests
#               (dcpload's staging size), each into a buffer the size of its
#               share touched before the clock, as a loader's destinations
#               are. The unique bytes, read once into rank memory: the
#               baseline of the targets, for both layouts.
#   raw-buf     the same into one reused 16 MiB buffer, for information: it
#               stays in the CPU cache, so the bytes never reach memory (no
#               loader can do that: its destinations are the point).
#   raw-all     replicate only: every process preads all the bytes into its
#               own buffer (touched before the clock): what the ranks' memory
#               must receive, each rank reading it itself. Not a storage
#               baseline (it reads N times the bytes) but the memory-bound
#               floor of a replicated load on a warm page cache; shown as a
#               second ratio.
#   dcpload     the collective load (dcp_load): each byte read once, with
#               --touch (destinations touched before the clock, as raw's);
#               dcpload-fresh-stor into fresh memory.
#   dcp-way     dcpload --strategy independent: every rank reads its own
#               needs, each overlapping record whole (DCP's default reader).
#   torch       PyTorch's torch.distributed.checkpoint.load on N gloo ranks
#               into preallocated tensors of the same layout (DTensors
#               sharded on dim 0 for rows, whole tensors for replicate).
#   ... (storage) raw and dcpload again reading storage: the shard files'
#               pages evicted before each run (fsync + posix_fadvise
#               DONTNEED), and their reads limited to DCPFS_BENCH_STORAGE_BPS
#               bytes per second (default 1000000000) by a cgroup (v1 blkio
#               or v2 io; needs root), as a device or network file system of
#               that speed would. On the development VM the host caches the
#               virtual disk, and an unlimited read of the evicted files took
#               0.75 s to 3.3 s from one run to the next; the limit makes the
#               storage one thing. DCPFS_BENCH_STORAGE_BPS=0: evicted, no
#               limit; =off: no storage lines. cat-stor: the shard files read
#               by 8 readers at once (dd of file pieces to /dev/null), the
#               device's limit as parallel cats see it; pread8-stor:
#               load_raw --dest --fresh --threads 8, each rank's share read on
#               8 threads into fresh huge-page memory that the reads fault in,
#               as dcpload-fresh-stor's are (issue 16: 1 rank of dcpload
#               >= 0.95x of it); dcpload-stor: with --touch, like
#               raw-stor; dcpload-direct-stor: dcpload
#               --direct (O_DIRECT past the page cache). dcp-way too (its ranks'
#               reads of the same bytes meet in the node's page cache).
# Every line: wall seconds (barrier to barrier, slowest rank), CPU seconds
# (user+system, summed over ranks), unique bytes per second, bytes read from
# storage (dcpload: its statistics; torch: rchar of /proc/self/io; raw: what
# it read), and the ratio to raw (raw seconds / tool seconds: > 1 is faster).
# Warm page cache for all but the storage lines (the checkpoint was just written and is read first).
# Destinations of raw and dcpload are 2 MiB-aligned in transparent huge pages
# (madvise); torch's too (THP_MEM_ALLOC_ENABLE=1).
# Targets (issue 6): dcpload >= 0.85x the raw read; bytes read == unique bytes.
set -euo pipefail
: "${top_builddir:=$(cd "$(dirname "$0")/.." && pwd)}" "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
DCP="$top_builddir/dcp"
DCPLOAD="$top_builddir/dcpload"
RAW="$top_builddir/bench/load_raw"
REPS="${DCPFS_BENCH_REPS:-3}"
BPS="${DCPFS_BENCH_STORAGE_BPS:-1000000000}"
RANKS="${DCPFS_BENCH_RANKS:-1 2 4}"
SIZE="${DCPFS_BENCH_LOAD_BYTES:-2147483648}"
MPIEXEC="${MPIEXEC:-mpiexec.mpich}"

say() { printf '%s\n' "$*"; }
[ -x "$DCPLOAD" ] && [ -x "$RAW" ] || { say "bench-load: dcpload or bench/load_raw is not built: skipped"; exit 0; }
command -v "$MPIEXEC" >/dev/null 2>&1 || { say "bench-load: no mpiexec ($MPIEXEC): skipped"; exit 0; }
BASE="${DCPFS_BENCH_DIR:-${TMPDIR:-/tmp}/dcpfs-bench}"
mkdir -p "$BASE"
DIR=$(mktemp -d "$BASE/load.XXXXXX")
trap 'rm -rf "$DIR"; [ -z "$CG" ] || rmdir "$CG" 2>/dev/null || true' EXIT
CK="$DIR/ckpt"
if ! "$DCP" synth "$CK" --total "$SIZE" --shape 4096,4096 --dtype float32 --ranks 4 --shard rows \
    >"$DIR/synth.log" 2>&1; then
    say "bench-load: 'dcp synth' could not write the checkpoint: $(tail -1 "$DIR/synth.log"): skipped"
    exit 0
fi
have_torch=1
python3 -c 'import torch' 2>/dev/null || { have_torch=0; say "bench-load: PyTorch not installed: no torch lines"; }
files=("$CK"/*.distcp)
cat "${files[@]}" >/dev/null   # warm the page cache for everyone

mpi() { timeout -k 10 900 "$MPIEXEC" -launcher fork -n "$@"; }
# The storage lines' cgroup: reads of the checkpoint's device limited to BPS.
CG=""
storage_setup() {
    [ "$BPS" != off ] || return 1
    [ "$BPS" != 0 ] || return 0
    [ "$(id -u)" = 0 ] || { say "bench-load: storage lines skipped: limiting reads needs root (DCPFS_BENCH_STORAGE_BPS=0: evicted files, no limit)"; return 1; }
    local dev
    dev=$(findmnt -no MAJ:MIN -T "$DIR" 2>/dev/null | tr -d ' ') || dev=""
    [ -n "$dev" ] && [ -e "/sys/dev/block/$dev" ] || { say "bench-load: storage lines skipped: $DIR is on no block device"; return 1; }
    [ ! -e "/sys/dev/block/$dev/partition" ] || dev=$(cat "/sys/dev/block/$dev/../dev")
    if [ -d /sys/fs/cgroup/blkio ]; then
        CG=/sys/fs/cgroup/blkio/dcpfs-bench.$$
        mkdir "$CG" && echo "$dev $BPS" >"$CG/blkio.throttle.read_bps_device" && return 0
    elif grep -qw io /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
        echo +io >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
        CG=/sys/fs/cgroup/dcpfs-bench.$$
        mkdir "$CG" && echo "$dev rbps=$BPS" >"$CG/io.max" && return 0
    fi
    say "bench-load: storage lines skipped: no cgroup read limit could be set"
    [ -z "$CG" ] || rmdir "$CG" 2>/dev/null || true
    CG=""
    return 1
}
# storage CMD...: evict the shard files from the page cache, then run CMD (a
# function too) in a subshell inside the limiting cgroup
storage() {
    python3 "$top_srcdir/bench/evict.py" "${files[@]}"
    (
        [ -z "$CG" ] || echo "$BASHPID" >"$CG/cgroup.procs"
        "$@"
    )
}

# par_cat: the shard files read by 8 readers at once (bench/par_read.sh): "SECONDS BYTES CPU"
# -- the limit of the device as parallel cats see it
. "$top_srcdir/bench/par_read.sh"
par_cat() {
    local t0 t1
    t0=$(date +%s.%N)
    par_read "${files[@]}"
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v u="$UNIQUE" 'BEGIN{printf "%.6f %d 0\n", b-a, u}'
}

# best REPS CMD...: the run of least wall time of a command printing "SECONDS BYTES_READ CPU_SECONDS"
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

# dcpload ... --json: the slowest rank's seconds, bytes read and CPU seconds summed over ranks,
# and the whole launch's seconds as a user sees it (mpiexec, start-up, destinations, load, digests)
dcpload_run() {
    local t0 t1 out
    t0=$(date +%s.%N)
    out=$(mpi "$@" --json --no-digests)
    t1=$(date +%s.%N)
    printf '%s\n' "$out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if "bytes_read" in l]
print("%.6f %d %.6f %.2f" % (max(r["seconds"] for r in rows), sum(r["bytes_read"] for r in rows),
                        sum(r["cpu_seconds"] for r in rows), float(sys.argv[2]) - float(sys.argv[1])))' "$t0" "$t1"
}

# load_raw ARGS...: its "SECONDS BYTES CPU" and the whole launch's seconds
raw_run() {
    local t0 t1 out
    t0=$(date +%s.%N)
    out=$(mpi "$@")
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v o="$out" 'BEGIN{printf "%s %.2f\n", o, b-a}'
}
raw_run_n() { local n=$1; shift; raw_run "$n" "$RAW" "$@"; }

UNIQUE=$("$DCP" ls --json "$CK" | python3 -c 'import json,sys; print(sum(json.loads(l)["nbytes"] for l in sys.stdin))')
gib() { awk -v b="$1" 'BEGIN{printf "%.2f", b/1073741824}'; }
rate() { awk -v b="$1" -v s="$2" 'BEGIN{printf "%.2f", b/s/1e9}'; }
ratio() { awk -v r="$1" -v s="$2" 'BEGIN{printf "%.2f", r/s}'; }
met() { awk -v v="$1" -v t="$2" 'BEGIN{print (v >= t ? "met" : "NOT met")}'; }

# line N LAYOUT TOOL SECONDS BYTES_READ CPU [NOTES] [PROCESS_SECONDS]
line() {
    printf 'load n=%s %-9s %-8s %7.3f s  process %6s s  cpu %6.2f s  %6s GB/s  read %6s GiB  %s\n' "$1" "$2" "$3" "$4" \
        "${8:--}" "$6" "$(rate "$UNIQUE" "$4")" "$(gib "$5")" "${7:-}"
}

have_storage=0
if storage_setup; then
    have_storage=1
    if [ -n "$CG" ]; then storage_what="evicted, reads limited to $(rate "$BPS" 1) GB/s"; else storage_what="evicted, no limit"; fi
fi
say "bench-load: $(gib "$UNIQUE") GiB of tensors in ${#files[@]} shard files, $(nproc) CPUs, best of $REPS, warm page cache, load average $(cut -d' ' -f1 /proc/loadavg)"
for n in $RANKS; do
    read -r raw_s raw_b raw_c < <(best mpi "$n" "$RAW" --dest "${files[@]}")
    read -r buf_s buf_b buf_c < <(best mpi "$n" "$RAW" "${files[@]}")
    for layout in rows replicate; do
        line "$n" "$layout" raw "$raw_s" "$raw_b" "$raw_c" "(baseline: the unique bytes read once, in parallel, into rank memory)"
        line "$n" "$layout" raw-buf "$buf_s" "$buf_b" "$buf_c" "(into a reused cache-resident buffer: $(ratio "$raw_s" "$buf_s")x raw)"
        all_s=""
        if [ "$layout" = replicate ] && [ "$n" -gt 1 ]; then
            read -r all_s all_b all_c < <(best mpi "$n" "$RAW" --all --dest "${files[@]}")
            line "$n" "$layout" raw-all "$all_s" "$all_b" "$all_c" \
                "(every rank preads all bytes itself: $(ratio "$raw_s" "$all_s")x raw)"
        fi
        for tool in dcpload dcp-way torch; do
            case $tool in
                dcpload) read -r s b c p < <(best dcpload_run "$n" "$DCPLOAD" "$CK" --layout "$layout" --touch) ;;
                dcp-way) read -r s b c p < <(best dcpload_run "$n" "$DCPLOAD" "$CK" --layout "$layout" --strategy independent --touch) ;;
                torch)
                    [ "$have_torch" = 1 ] || continue
                    p=""
                    read -r s b c < <(THP_MEM_ALLOC_ENABLE=1 best python3 "$top_srcdir/bench/load_torch.py" "$CK" "$n" "$layout") ;;
            esac
            r=$(ratio "$raw_s" "$s")
            notes="$r x raw, $(ratio "$buf_s" "$s") x raw-buf"
            [ -n "$all_s" ] && notes="$notes, $(ratio "$all_s" "$s") x raw-all"
            if [ "$tool" = dcpload ]; then
                notes="$notes; target >= 0.85x raw: $(met "$r" 0.85); read == unique: $([ "$b" = "$UNIQUE" ] && echo met || echo "NOT met")"
            else
                notes="$notes; read $(ratio "$b" "$UNIQUE") x unique"
            fi
            line "$n" "$layout" "$tool" "$s" "$b" "$c" "$notes" "$p"
        done
        [ "$have_storage" = 1 ] || continue
        read -r sr_s sr_b sr_c < <(best storage mpi "$n" "$RAW" --dest "${files[@]}")
        line "$n" "$layout" raw-stor "$sr_s" "$sr_b" "$sr_c" "(raw reading storage: $storage_what)"
        read -r pc_s pc_b pc_c < <(best storage par_cat)
        line "$n" "$layout" cat-stor "$pc_s" "$pc_b" "$pc_c" "(8 readers at once, as 8 cats of file pieces, into /dev/null: the device's limit)"
        read -r pr_s pr_b pr_c pr_p < <(best storage raw_run_n "$n" --dest --fresh --threads 8 "${files[@]}")
        line "$n" "$layout" pread8-stor "$pr_s" "$pr_b" "$pr_c" "(each rank's share on 8 threads into fresh huge-page memory, faulted in by the reads)" "$pr_p"
        read -r s b c p < <(best storage dcpload_run "$n" "$DCPLOAD" "$CK" --layout "$layout" --touch)
        r=$(ratio "$sr_s" "$s")
        line "$n" "$layout" dcpload-stor "$s" "$b" "$c" \
            "$r x raw-stor; target >= 0.85x raw: $(met "$r" 0.85); read == unique: $([ "$b" = "$UNIQUE" ] && echo met || echo "NOT met")" "$p"
        read -r s b c p < <(best storage dcpload_run "$n" "$DCPLOAD" "$CK" --layout "$layout")
        [ "$n" != 1 ] || notes_cat="; $(ratio "$pc_s" "$s") x cat-stor (issue 16, 1 rank: >= 0.95x pread8-stor: $(met "$(ratio "$pr_s" "$s")" 0.95))"
        line "$n" "$layout" dcpload-fresh-stor "$s" "$b" "$c" \
            "fresh destinations (N ranks fault N x their bytes in): $(ratio "$pr_s" "$s") x pread8-stor, process $(ratio "$pr_p" "$p") x${notes_cat:-}; read == unique: $([ "$b" = "$UNIQUE" ] && echo met || echo "NOT met")" "$p"
        read -r s b c p < <(best storage dcpload_run "$n" "$DCPLOAD" "$CK" --layout "$layout" --direct)
        [ "$n" != 1 ] || notes_cat="; $(ratio "$pc_s" "$s") x cat-stor (issue 16, 1 rank: >= 0.95x: $(met "$(ratio "$pc_s" "$s")" 0.95))"
        line "$n" "$layout" dcpload-direct-stor "$s" "$b" "$c" \
            "--direct (O_DIRECT past the page cache): $(ratio "$sr_s" "$s") x raw-stor${notes_cat:-}; read == unique: $([ "$b" = "$UNIQUE" ] && echo met || echo "NOT met")" "$p"
        read -r s b c p < <(best storage dcpload_run "$n" "$DCPLOAD" "$CK" --layout "$layout" --strategy independent)
        line "$n" "$layout" dcp-way-stor "$s" "$b" "$c" "$(ratio "$sr_s" "$s") x raw-stor; preads $(ratio "$b" "$UNIQUE") x unique (repeats of the same bytes are served by the node's page cache)" "$p"
    done
done
say "process: the whole mpiexec launch as a user sees it (start-up, destinations allocated, touched where --touch, load, digests)."
say "dcpload lines: --touch (destinations touched before the clock, as raw's); dcpload-fresh-stor: fresh destinations,"
say "as a program's new tensors are (the load faults them in), against pread8-stor, which does the same."
say "GB/s: unique tensor bytes / wall time. read: bytes fetched from storage (dcpload: its statistics;"
say "torch: rchar; raw: pread). x raw: raw seconds / tool seconds, higher is better. A replicated load on N"
say "ranks must write N times the bytes into rank memory, so on a warm page cache it is bound by memory"
say "copies, not storage: compare it with raw-all too (the README explains). -stor lines read storage"
say "(evicted files, reads limited by a cgroup): where the raw read of the unique bytes is the bound."
