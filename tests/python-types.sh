#!/bin/bash
# The Python package's type hints hold: mypy (pinned in .ci/run and quickstart.sh) checks
# python/dcpfs against its own annotations and torch's and numpy's stubs. A wrong
# annotation, a None not ruled out, or an attribute a class does not declare fails here.
. "$top_srcdir/tests/lib.sh"
need python3
need_python_module mypy
need_python_module torch
need_python_module numpy
scratch
dir=$SCRATCH
# dcpfs._native is the cffi module the build makes: not in the source tree, so not followed.
out=$(cd "$top_srcdir/python" && python3 -m mypy --ignore-missing-imports --cache-dir "$dir/cache" \
    --no-error-summary dcpfs 2>&1) || fail "mypy found errors in python/dcpfs:
$out"
[ -z "$out" ] || fail "mypy printed: $out"
echo "mypy: python/dcpfs checks clean ($(python3 -m mypy --version))"
