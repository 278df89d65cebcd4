# Shared by tests/python-*.sh (sourced): run one pytest file of python/tests against the
# package make check built into $top_builddir/python-pkg (tests/python_build.sh).
. "$top_srcdir/tests/lib.sh"

# use_python_package [torch]: the package make check built first on PYTHONPATH (and, in a
# sanitizer build, the sanitizers' runtimes preloaded); "torch" when the caller needs
# PyTorch (skip without it). Sets PY_NO_TORCH=yes when torch is missing and not needed.
use_python_package() {
    local needs=${1:-} pkg=$top_builddir/python-pkg
    need python3
    [ ! -f "$pkg.skip" ] || skip "the python package was not built: $(cat "$pkg.skip")"
    [ -f "$pkg/dcpfs/__init__.py" ] || fail "the python package is not built ($pkg): make check builds it"
    PY_NO_TORCH=
    if ! python3 -c 'import torch' 2>/dev/null; then
        [ "$needs" != torch ] || skip "PyTorch is not installed (pip install torch==2.13.0)"
        PY_NO_TORCH=yes
    fi
    PYTHONPATH=$pkg${PYTHONPATH:+:$PYTHONPATH}
    export PYTHONPATH
    if [ -n "${DCP_SANITIZED:-}" ]; then
        # libdcp.so is built with ASan/UBSan: their runtimes must come first in the process.
        local so=$top_builddir/.libs/libdcp.so rt
        rt=$(ldd "$so" | awk '$1 ~ /^lib(asan|ubsan)\.so/ { print $3 }' | tr '\n' ' ')
        [ -n "$rt" ] || fail "sanitizer build, but ldd $so names no libasan/libubsan"
        export LD_PRELOAD="$rt${LD_PRELOAD:+ $LD_PRELOAD}"
        export ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
        local probe='import numpy, dcpfs'
        [ -n "$PY_NO_TORCH" ] || probe="$probe, torch"
        local out
        out=$(python3 -c "$probe" 2>&1) ||
            skip "sanitizer build: python3 cannot run '$probe' with LD_PRELOAD=$rt: $(printf '%s\n' "$out" | tail -3)"
    fi
}

# run_pytest FILE [torch]: python/tests/FILE with python3 -m pytest; "torch" when the file
# needs PyTorch (skip without it). Without torch, test_open's torch tests are deselected.
run_pytest() {
    local name=$1 needs=${2:-} file=$top_srcdir/python/tests/$1
    [ -f "$file" ] || skip "python/tests/$name does not exist yet"
    need python3
    python3 -c 'import pytest' 2>/dev/null || skip "python3 module pytest is missing (pip install pytest)"
    use_python_package "$needs"
    local deselect=
    if [ -n "$PY_NO_TORCH" ]; then
        echo "PyTorch is not installed: tests of $name that need it are deselected"
        deselect=torch
    fi
    set -- python3 -m pytest -q -p no:cacheprovider "$file"
    [ -z "$deselect" ] || set -- "$@" -k "not torch"
    # pytest exits 5 when every test was deselected: nothing ran, so a skip.
    local rc=0
    "$@" || rc=$?
    [ "$rc" -ne 5 ] || skip "no test of $name ran"
    return "$rc"
}
