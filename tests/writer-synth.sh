# dcp synth: every sharding gives the documented chunks, and every key's bytes follow the
# formula of dcp-synth(1) (computed independently by tests/interop/writer_synth_expect.py).
. "$top_srcdir/tests/lib.sh"
need python3
scratch
EXPECT="python3 $top_srcdir/tests/interop/writer_synth_expect.py"

# check DIR SEED DTYPE_SIZE NUMEL KEYS [bool]
check() {
    for k in $(seq 0 $(($5 - 1))); do
        got=$($DCP --no-catalog cat "$1" "model.layers.$k.weight" | sha256sum | cut -d' ' -f1)
        want=$($EXPECT "$2" "$k" $(($3 * $4)) ${6:-})
        [ "$got" = "$want" ] || fail "$1: model.layers.$k.weight: bytes differ from the formula"
    done
}
# chunks DIR KEY N
chunks() {
    n=$($DCP --no-catalog ls --json "$1" | python3 -c "import json,sys
for l in sys.stdin:
    r=json.loads(l)
    if r['key']==sys.argv[1]: print(r['chunks'])" "$2")
    [ "$n" = "$3" ] || fail "$1: $2 has $n chunks, expected $3"
}

$DCP synth "$SCRATCH/rows" --keys 3 --shape 10,7 --dtype bfloat16 --ranks 4 --shard rows --seed 5 --chunks-per-key 2
chunks "$SCRATCH/rows" model.layers.0.weight 7
check "$SCRATCH/rows" 5 2 70 3
[ "$(ls "$SCRATCH/rows"/*.distcp | wc -l)" = 4 ] || fail "rows: one file per rank"

$DCP synth "$SCRATCH/cols" --keys 2 --shape 10,7 --dtype float32 --ranks 4 --shard cols --seed 1
chunks "$SCRATCH/cols" model.layers.1.weight 4
check "$SCRATCH/cols" 1 4 70 2

$DCP synth "$SCRATCH/blocks" --keys 2 --shape 5,9,3 --dtype int8 --ranks 6 --shard blocks --seed 9 --crc
chunks "$SCRATCH/blocks" model.layers.0.weight 6
check "$SCRATCH/blocks" 9 1 135 2

$DCP synth "$SCRATCH/repl" --keys 4 --shape 33 --dtype bool --ranks 3 --shard replicated --seed 2 --bytes-items 2
chunks "$SCRATCH/repl" model.layers.3.weight 1
check "$SCRATCH/repl" 2 1 33 4 bool
$DCP --no-catalog ls "$SCRATCH/repl" | grep -q '^extra.1 *bytes' || fail "bytes items missing"
# Replicated data is written once, spread over the ranks' files.
[ "$(ls "$SCRATCH/repl"/*.distcp | wc -l)" = 3 ] || fail "replicated: keys should spread over 3 files"

$DCP synth "$SCRATCH/scalar" --keys 2 --shape scalar --dtype float64 --ranks 2
check "$SCRATCH/scalar" 0 8 1 2

# --total picks the key count.
$DCP synth "$SCRATCH/total" --total 1M --shape 256,256 --dtype float16
[ "$($DCP --no-catalog ls --json "$SCRATCH/total" | wc -l)" = 8 ] || fail "--total 1M of 128 KiB keys is 8 keys"
# --keys and --total both: a usage error (2), not one of them silently ignored
rc=0; $DCP synth "$SCRATCH/both" --keys 2 --total 1M 2>"$SCRATCH/err" || rc=$?
[ $rc = 2 ] && grep -q "give one of them" "$SCRATCH/err" && [ ! -e "$SCRATCH/both" ] || fail "--keys with --total: exit $rc: $(cat "$SCRATCH/err")"

# Many keys quickly (the 100,000-key case is in bench).
$DCP synth "$SCRATCH/many" --keys 5000 --shape 4 --dtype float32 --ranks 2
[ "$($DCP --no-catalog ls --json "$SCRATCH/many" | wc -l)" = 5000 ] || fail "5000 keys"
echo ok
