# Every key of every bundled fixture: dcp ls --json and dcp cat match the manifest.
. "$top_srcdir/tests/lib.sh"
need python3
for case in "$FIXTURES"/*/; do
    python3 "$top_srcdir/tests/check_fixture.py" "$DCP" "${case%/}"
done
