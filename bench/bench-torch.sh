#!/bin/bash
# The Python package's loaders against PyTorch's own (run by `make bench`, never by the tests).
#
# A synthetic checkpoint of 2 GiB (32 float32 tensors of 4096x4096, saved
# row-sharded by 4 ranks into 4 shard files: `dcp synth`), written into a
# scratch folder under $DCPFS_BENCH_DIR and deleted at the end. On 1, 2 and 4
# gloo ranks (CPU processes, as torchrun starts them), for the layouts rows,
# cols (DTensors sharded on dimension 0 / 1) and replicate (whole tensors on
# every rank), the best of $DCPFS_BENCH_REPS runs (by load time) of
#   torch    torch.distributed.checkpoint.load with PyTorch's FileSystemReader
#   reader   torch.distributed.checkpoint.load with dcpfs.torch.Reader
#   load     dcpfs.torch.load (every stored byte read once across the ranks)
# into the same preallocated destinations (bench/torch_load.py: one launch per
# line, REPS loads in it), with the page cache warm and with the shard files
# evicted before each load (fsync + POSIX_FADV_DONTNEED; DCPFS_BENCH_COLD=0
# skips those lines). Each line gives the load's seconds (barrier to barrier,
# slowest rank), the whole process's seconds as a user sees it (from python's
# start to the end of the first load: interpreter, torch import, process
# group, destinations, one load), GB/s of unique bytes over the
# load, bytes read (rchar) over the unique bytes, and the largest peak RSS of
# a rank above its RSS just before the load (the destinations are already
# resident then). Ratios are PyTorch's seconds over the tool's: > 1 is faster.
# Targets (issue 12): reader and load never slower than torch; load on 4
# ranks, replicate, >= 2x torch; peak RSS above the destinations <= 64 MiB.
set -euo pipefail
: "${top_builddir:=$(cd "$(dirname "$0")/.." && pwd)}" "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
DCP="$top_builddir/dcp"
REPS="${DCPFS_BENCH_REPS:-5}"
RANKS="${DCPFS_BENCH_RANKS:-1 2 4}"
LAYOUTS="${DCPFS_BENCH_LAYOUTS:-rows cols replicate}"
SIZE="${DCPFS_BENCH_LOAD_BYTES:-2147483648}"
COLD="${DCPFS_BENCH_COLD:-1}"
say() { printf '%s\n' "$*"; }
PKG="$top_builddir/python-pkg"
[ -d "$PKG/dcpfs" ] || sh "$top_srcdir/tests/python_build.sh" "$top_srcdir" "$top_builddir" >/dev/null || true
if ! PYTHONPATH="$PKG" python3 -c 'import torch, dcpfs.torch' 2>/dev/null; then
    say "bench-torch: torch or the dcpfs package is not importable ($PKG: see tests/python_build.sh and $PKG.skip): skipped"
    exit 0
fi
BASE="${DCPFS_BENCH_DIR:-${TMPDIR:-/tmp}/dcpfs-bench}"
mkdir -p "$BASE"
DIR=$(mktemp -d "$BASE/torch.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
CK="$DIR/ckpt"
"$DCP" synth "$CK" --total "$SIZE" --shape 4096,4096 --dtype float32 --ranks 4 --shard rows >"$DIR/synth.log" 2>&1 ||
    { say "bench-torch: 'dcp synth' failed: $(tail -1 "$DIR/synth.log"): skipped"; exit 0; }
files=("$CK"/*.distcp)
cat "${files[@]}" >/dev/null
export XDG_CACHE_HOME="$DIR/cache" THP_MEM_ALLOC_ENABLE=1 PYTHONPATH="$PKG"
UNIQUE=$("$DCP" ls --json "$CK" | python3 -c 'import json,sys; print(sum(json.loads(l)["nbytes"] for l in sys.stdin))')
PYTHONPATH="$PKG" python3 -c 'import dcpfs, sys; dcpfs.open(sys.argv[1]).close()' "$CK"   # the catalog: parsed once

# one CACHE N LAYOUT TOOL: "load_s process_s rchar cpu rss_mib", the best of REPS loads in one launch
one() {
    local out
    out=$(timeout -k 10 1800 python3 "$top_srcdir/bench/torch_load.py" "$CK" "$2" "$3" "$4" "$REPS" "$1" | tail -1)
    python3 -c 'import json, sys
r = json.loads(sys.argv[1]); print("%.4f %.2f %d %.2f %.1f" % (r["seconds"], r["process_seconds"], r["rchar"], r["cpu"], r["rss_above_mib"]))' "$out"
}
ratio() { awk -v r="$1" -v s="$2" 'BEGIN{printf "%.2f", r/s}'; }
met() { awk -v v="$1" -v t="$2" 'BEGIN{print (v >= t ? "met" : "NOT met")}'; }

say "bench-torch: $(awk -v b="$UNIQUE" 'BEGIN{printf "%.2f", b/1073741824}') GiB in ${#files[@]} shard files, $(nproc) CPUs, torch $(python3 -c 'import torch; print(torch.__version__)'), best of $REPS, load average $(cut -d' ' -f1 /proc/loadavg)"
printf '%-5s %-9s %-2s %-7s %8s %9s %7s %7s %7s %8s  %s\n' cache layout n tool "load s" "process s" "GB/s" "read x" "cpu s" "RSS+ MiB" "vs torch"
caches="warm"; [ "$COLD" = 1 ] && caches="warm evicted"
for cache in $caches; do
    for n in $RANKS; do
        for layout in $LAYOUTS; do
            t_s=""
            for tool in torch reader load; do
                read -r s p rc c rss < <(one "$cache" "$n" "$layout" "$tool")
                notes=""
                if [ "$tool" = torch ]; then t_s=$s; else
                    r=$(ratio "$t_s" "$s")
                    notes="${r}x: $(met "$r" 1.0)"
                    if [ "$tool" = load ] && [ "$layout" = replicate ] && [ "$n" = 4 ]; then notes="$notes; >= 2x: $(met "$r" 2.0)"; fi
                    notes="$notes; RSS+ <= 64 MiB: $(met 64 "$rss")"
                fi
                printf '%-5s %-9s %-2s %-7s %8.3f %9.2f %7.2f %7.2f %7.2f %8.1f  %s\n' "$cache" "$layout" "$n" "$tool" "$s" "$p" \
                    "$(awk -v b="$UNIQUE" -v s="$s" 'BEGIN{printf "%.2f", b/s/1e9}')" "$(ratio "$rc" "$UNIQUE")" "$c" "$rss" "$notes"
            done
        done
    done
done
say "load s: barrier to barrier, slowest rank; process s: the whole launch as a user sees it. read x: rchar / unique bytes."
say "RSS+: the largest per-rank peak RSS above the RSS before the load (shared staging pages count)."
