# Helpers for the collective loader tests (sourced after lib.sh).
DCPLOAD="$top_builddir/dcpload"
[ -x "$DCPLOAD" ] || skip "dcpload was not built"
[ -n "${MPIEXEC:-}" ] && command -v "$MPIEXEC" >/dev/null 2>&1 || skip "no mpiexec (MPICH's mpiexec.mpich)"
need timeout

# mpirun N ARGS...: run on N local ranks; never hang (hydra's fork launcher
# needs no ssh and works as root).
mpirun() {
    local n=$1; shift
    timeout -k 10 120 "$MPIEXEC" -launcher fork -n "$n" "$@"
}

# Under --enable-sanitizers: MPI_Init leaks inside hwloc's dlopened plugins;
# a full unwind lets the suppression see the hwloc frame.
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$top_srcdir/tests/load.supp"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"

# dcpload_runs WHAT CKPT RUNS "LAYOUT-N..." [OPTION...]: dcpload --json of CKPT on N ranks
# with --layout LAYOUT for each, with the OPTIONs and small staging pieces (8192 bytes),
# into a fresh folder RUNS as RUNS/LAYOUT-N.json (tests/load_check.py's run folder); a run
# that fails fails the test, named WHAT.
dcpload_runs() {
    local what=$1 ck=$2 runs=$3 list=$4 run
    shift 4
    rm -rf "$runs"
    mkdir -p "$runs"
    for run in $list; do
        mpirun "${run#*-}" "$DCPLOAD" "$ck" "$@" --layout "${run%-*}" --json --staging 8192 \
            >"$runs/$run.json" 2>"$runs/err" ||
            fail "$what: dcpload -n ${run#*-} --layout ${run%-*}${*:+ $*} failed: $(cat "$runs/err")"
    done
}

# tensor_bytes PATH [OPTION...]: the sum of the bytes of PATH's tensors (dcp OPTION... ls
# --json), what dcpload's ranks read together when each is stored once
tensor_bytes() {
    local path=$1
    shift
    "$DCP" "$@" ls --json "$path" | python3 -c '
import json, sys
print(sum(r["nbytes"] for r in map(json.loads, sys.stdin) if r["kind"] == "tensor"))'
}
