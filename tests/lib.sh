# Shared helpers for the integration tests (sourced). Exit 77 means "skipped".
set -eu
: "${top_srcdir:?run through make check}" "${top_builddir:?run through make check}"
DCP="$top_builddir/dcp"
# A shared build's dcp is libtool's wrapper script: a bash start (~16 ms) before each of the
# suite's thousands of calls. Call the program it wraps, with the library path it would set.
if [ -x "$top_builddir/.libs/dcp" ] && [ -f "$top_builddir/.libs/libdcp.so" ]; then
    DCP="$top_builddir/.libs/dcp"
    LD_LIBRARY_PATH="$top_builddir/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
fi
FIXTURES="$top_srcdir/tests/fixtures"
# The large public cases (06, 07) live only beside a developer checkout.
SHARED_FIXTURES="$top_srcdir/../shared/fixtures/dcp-pt113"

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || skip "$1 is not installed"; }
need_python_module() { python3 -c "import $1" 2>/dev/null || skip "python3 module $1 is not installed"; }
need_torch() { python3 -c 'import torch' 2>/dev/null || skip "PyTorch is not installed (pip install torch==2.13.0)"; }

# need_rss: skip where a peak RSS cannot be measured (no /usr/bin/time) or means nothing
# (libdcp built with AddressSanitizer), for the tests that bound it (tests/*-rss.sh).
need_rss() {
    [ -x /usr/bin/time ] || skip "/usr/bin/time is not installed"
    if ldd "$top_builddir/.libs/libdcp.so" 2>/dev/null | grep -q libasan; then
        skip "sanitizer build: AddressSanitizer's shadow memory makes RSS meaningless"
    fi
}

# have_zstd: whether python3 decodes zstd (zstandard or pyzstd), as PyTorch's zstd saves need.
have_zstd() { python3 -c 'import zstandard' 2>/dev/null || python3 -c 'import pyzstd' 2>/dev/null; }

# save_dtensor VARIANT...: every VARIANT of tests/interop/save_dtensor.py saved by one set of
# 4 forked ranks (torch imported once) into $SCRATCH/VARIANT, zstd left out without
# have_zstd; its output in $SCRATCH/save.log, shown when it fails.
save_dtensor() {
    local variants="$*"
    have_zstd || variants=${variants/ zstd/}
    # shellcheck disable=SC2086
    timeout 600 python3 "$top_srcdir/tests/interop/save_dtensor.py" "$SCRATCH" $variants >"$SCRATCH/save.log" 2>&1 ||
        { cat "$SCRATCH/save.log"; fail "PyTorch save ($variants) failed"; }
}

# A scratch folder removed on exit.
scratch() {
    SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/dcpfs-test.XXXXXX")
    trap 'rm -rf "$SCRATCH"' EXIT
}

# framework_setup MODULE NAME "PIP LINE" SCRIPT, for the tests that export a training
# framework's own checkpoints (tests/export-*.sh): skip without torch, transformers or
# MODULE, or when tests/interop/SCRIPT's probe exits 77; then make the framework's models
# and checkpoints into a scratch folder with it. Sets PY (the script), D (dcp without the
# catalog) and DCP_RECIPE_PATH (the shipped recipes).
framework_setup() {
    local module=$1 name=$2 pip=$3 why
    need python3
    need_torch
    python3 -c "import transformers" 2>/dev/null || skip "transformers is not installed (pip install transformers==5.24.0)"
    python3 -c "import $module" 2>/dev/null || skip "$name is not installed ($pip)"
    PY="python3 $top_srcdir/tests/interop/$4"
    why=$($PY probe 2>&1) || { [ $? = 77 ] && skip "$why ($pip)"; fail "probing $name: $why"; }
    scratch
    export DCP_RECIPE_PATH="$top_srcdir/recipes"
    D="$DCP --no-catalog"
    $PY make "$SCRATCH" >"$SCRATCH/make.log" 2>&1 || { cat "$SCRATCH/make.log"; fail "building the $name models and checkpoints"; }
}

# Megatron-Core releases, each installed into a folder of its own by
# tests/interop/install-megatron-releases.sh (under ~/.cache/dcpfs-tests/megatron-core).
MEGATRON_INSTALL="$top_srcdir/tests/interop/install-megatron-releases.sh"

# megatron_path V: release V's PYTHONPATH (its folder and those of what its line in
# tests/interop/megatron-releases.txt adds); status 1 when one of them is missing or empty.
megatron_path() {
    local path d
    path=$(sh "$MEGATRON_INSTALL" --path "$1") || return 1
    for d in $(echo "$path" | tr : ' '); do
        [ -n "$(ls -A "$d" 2>/dev/null)" ] || return 1
    done
    echo "$path"
}

# need_megatron [--any] V...: skip without PyTorch, or unless every release V is installed
# (--any: one of them). MEGATRON_PATH: the PYTHONPATH of the last V (--any: of the first
# installed one, MEGATRON_VERSION).
need_megatron() {
    local any= v missing= sep=" "
    [ "$1" != --any ] || { any=yes; sep=" or "; shift; }
    need python3
    need_torch
    for v in "$@"; do
        if MEGATRON_PATH=$(megatron_path "$v"); then
            [ -z "$any" ] || { MEGATRON_VERSION=$v; return 0; }
        else
            missing="$missing${missing:+$sep}$v"
        fi
    done
    [ -n "$missing" ] || return 0
    skip "megatron-core $missing not installed in $(sh "$MEGATRON_INSTALL" --where) (sh tests/interop/install-megatron-releases.sh)"
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
