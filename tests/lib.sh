# Shared helpers for the integration tests (sourced). Exit 77 means "skipped".
set -eu
: "${top_srcdir:?run through make check}" "${top_builddir:?run through make check}"
DCP="$top_builddir/dcp"
FIXTURES="$top_srcdir/tests/fixtures"
# The large public cases (06, 07) live only beside a developer checkout.
SHARED_FIXTURES="$top_srcdir/../shared/fixtures/dcp-pt113"

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || skip "$1 is not installed"; }
need_python_module() { python3 -c "import $1" 2>/dev/null || skip "python3 module $1 is not installed"; }

# A scratch folder removed on exit.
scratch() {
    SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/dcpfs-test.XXXXXX")
    trap 'rm -rf "$SCRATCH"' EXIT
}

# expect_fail "substring" cmd...: the command must fail and print the substring on stderr.
expect_fail() {
    local want=$1; shift
    local out rc=0
    out=$("$@" 2>&1 >/dev/null) || rc=$?
    [ "$rc" -ne 0 ] || fail "expected failure from: $*"
    [ "$rc" -lt 128 ] || fail "crashed (status $rc): $* -- $out"
    case "$out" in
        *"$want"*) ;;
        *) fail "error from '$*' lacks '$want': $out" ;;
    esac
}
