# The first parse of a .metadata streams it: 100,000 chunks (a 13 MB pickle)
# are read in under 64 MiB of peak RSS (the whole pickle tree took ~140 MiB),
# and the model is the same as a parse of the whole tree (DCP_WHOLE_PARSE=1).
# The 1M and 10M-chunk figures are measured by bench/bench-catalog.sh.
. "$top_srcdir/tests/lib.sh"
need_rss
scratch
LIMIT_KB=65536
$DCP synth "$SCRATCH/ck" --keys 10000 --shape 10,8 --ranks 10 --shard rows --seed 5 >/dev/null ||
    fail "synth failed"
/usr/bin/time -f '%M' -o "$SCRATCH/rss" $DCP --no-catalog info "$SCRATCH/ck" > "$SCRATCH/info" ||
    fail "dcp info failed"
kb=$(tail -1 "$SCRATCH/rss")
echo "first parse of 100,000 chunks: peak RSS $kb KiB"
[ "$kb" -le $LIMIT_KB ] || fail "peak RSS $kb KiB > $LIMIT_KB KiB"
grep -q '^chunks: *100000$' "$SCRATCH/info" || fail "dcp info does not count 100000 chunks"
$DCP --no-catalog layout "$SCRATCH/ck" > "$SCRATCH/streamed" || fail "dcp layout failed"
DCP_WHOLE_PARSE=1 $DCP --no-catalog layout "$SCRATCH/ck" > "$SCRATCH/whole" || fail "whole parse failed"
[ "$(wc -l < "$SCRATCH/streamed")" -ge 100000 ] || fail "layout lists too few chunks"
cmp -s "$SCRATCH/streamed" "$SCRATCH/whole" || fail "the streamed model differs from the whole parse's"
echo ok
