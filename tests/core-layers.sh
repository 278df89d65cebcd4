#!/bin/sh
# libdcp's files call each other in layers, never in a loop (README: Layout
# of the source): tests/core_layers.py reads the symbols of the built objects.
. "$top_srcdir/tests/lib.sh"
need python3
command -v nm >/dev/null 2>&1 || skip "nm (binutils) is not installed"
python3 "$top_srcdir/tests/core_layers.py" "$top_builddir"
rc=$?
[ $rc = 77 ] && skip "no libdcp objects in $top_builddir"
[ $rc = 0 ] || fail "libdcp's files call each other in a loop (above)"
exit 0
