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
