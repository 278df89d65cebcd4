#!/bin/bash
# The whole test suite, as CI runs it: a normal build and `make check`, the
# same suite under AddressSanitizer and UndefinedBehaviorSanitizer, and
# `make distcheck`. Prints "N passed, N failed, N skipped" last.
set -uo pipefail
cd "$(dirname "$0")/.."
top=$PWD
jobs=$(nproc)
status=0
pass=0; failed=0; skipped=0

count() {  # add up one build's test-suite.log summary
    local log=$1/test-suite.log
    [ -f "$log" ] || return 0
    pass=$((pass + $(sed -n 's/^# PASS: *//p' "$log" | head -1)))
    failed=$((failed + $(sed -n 's/^# FAIL: *//p' "$log" | head -1) + $(sed -n 's/^# ERROR: *//p' "$log" | head -1) + $(sed -n 's/^# XPASS: *//p' "$log" | head -1)))
    skipped=$((skipped + $(sed -n 's/^# SKIP: *//p' "$log" | head -1)))
}

run() {  # run NAME MAKE-CFLAGS CONFIGURE-FLAGS...
    local name=$1 cflags=$2; shift 2
    echo "=== $name: configure $*"
    rm -rf "build-$name"; mkdir "build-$name"
    if ! (cd "build-$name" && "$top/configure" -q "$@" && make -j"$jobs" CFLAGS="$cflags" >/dev/null); then
        echo "=== $name: BUILD FAILED"; status=1; failed=$((failed + 1)); return
    fi
    echo "=== $name: make check"
    (cd "build-$name" && make -j"$jobs" CFLAGS="$cflags" check) || status=1
    if [ -f "build-$name/test-suite.log" ] && grep -q '^# FAIL: *[1-9]\|^# ERROR: *[1-9]' "build-$name/test-suite.log"; then
        cat "build-$name/test-suite.log"
    fi
    count "build-$name"
}

autoreconf -fi >/dev/null 2>&1 || { echo "autoreconf failed"; autoreconf -fi; exit 1; }
run default "-O2 -g -Werror"
run sanitizers "-O1 -g" --enable-sanitizers

echo "=== make distcheck (a short suite inside the tarball)"
if (cd build-default && make -j"$jobs" distcheck TESTS="tests/cli-fixtures.sh" >distcheck.log 2>&1); then
    echo "distcheck: ok"; pass=$((pass + 1))
else
    tail -50 build-default/distcheck.log; echo "distcheck: FAILED"; failed=$((failed + 1)); status=1
fi

echo "${pass} passed, ${failed} failed, ${skipped} skipped"
exit $status
