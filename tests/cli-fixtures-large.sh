# The two large public fixtures (06, 07), used only where ../shared exists.
. "$top_srcdir/tests/lib.sh"
need python3
[ -d "$SHARED_FIXTURES/06_throughput_single" ] || skip "large fixtures need $SHARED_FIXTURES"
for case in 06_throughput_single 07_many_keys; do
    python3 "$top_srcdir/tests/check_fixture.py" "$DCP" "$SHARED_FIXTURES/$case"
done
