# Collective errors: one rank asking for an unknown key, a missing
# checkpoint, a read failing mid-transfer, a CUDA destination without a
# usable GPU, ranks given different arguments. Every rank must fail
# with the same message, within the timeout (never hang), printed once.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/load_lib.sh"
scratch
CK="$FIXTURES/02_rowwise_4ranks/ckpt"

# every_rank_fails N WANT ARGS...: all N ranks fail with the same error containing WANT,
# printed once (rank 0), not once per rank
every_rank_fails() {
    local n=$1 want=$2 rc=0; shift 2
    mpirun "$n" "$DCPLOAD" "$@" >"$SCRATCH/out" 2>"$SCRATCH/err" || rc=$?
    [ "$rc" -ne 0 ] || fail "dcpload $* succeeded"
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "dcpload $* hung (timeout)"
    grep '^dcpload: ' "$SCRATCH/err" >"$SCRATCH/msgs" || fail "no error message: $(cat "$SCRATCH/err")"
    local lines
    lines=$(wc -l <"$SCRATCH/msgs")
    [ "$lines" -eq 1 ] || fail "$lines lines for the error of $n ranks (once expected): $(cat "$SCRATCH/err")"
    grep -q -- "$want" "$SCRATCH/msgs" || fail "error lacks '$want': $(cat "$SCRATCH/msgs")"
    [ ! -s "$SCRATCH/out" ] || fail "output despite the error: $(head -3 "$SCRATCH/out")"
}

for bad in 0 2 3; do
    DCPLOAD_TEST_BAD_KEY_RANK=$bad every_rank_fails 4 \
        "rank $bad: $CK: dcpload.test.no_such_key: no such key in the checkpoint" "$CK" --json
done
DCPLOAD_TEST_BAD_KEY_RANK=1 every_rank_fails 2 "rank 1: " "$CK" --layout replicate
# --keys that selects no tensor: an error, not a load of nothing (as dcp ls --keys)
every_rank_fails 3 "no tensor matches 'no.such.prefix'" "$CK" --keys no.such.prefix
DCPLOAD_TEST_BAD_KEY_RANK=0 every_rank_fails 1 "dcpload.test.no_such_key: no such key" "$CK"
DCPLOAD_TEST_BAD_KEY_RANK=1 every_rank_fails 3 "no such key" "$CK" --strategy independent

every_rank_fails 3 "$SCRATCH/none" "$SCRATCH/none" --json
# a run folder named instead of one of its checkpoints: libdcp's hint, once, naming them in
# natural order (step-900 before step-1000) and what to open
mkdir "$SCRATCH/run"; cp -r "$CK" "$SCRATCH/run/step-1000"; cp -r "$CK" "$SCRATCH/run/step-900"
every_rank_fails 2 "^dcpload: rank 0: $SCRATCH/run: not a checkpoint: no .metadata, __R.metadata or .safetensors files; it holds the checkpoint folders step-900/ and step-1000/: open one of them\$" \
    "$SCRATCH/run" --json
rm -r "$SCRATCH/run"

# a read failing mid-transfer (a copy with one shard cut short: it opens,
# the read of its tail fails) while peers wait for its bytes: every rank
# fails with the reader's message naming the file, by every delivery path
cp -r "$CK" "$SCRATCH/cut"
truncate -s 1000 "$SCRATCH/cut/__1_0.distcp"
for n in 3 4; do
    for extra in "" --shm --no-bcast "--bcast-local --staging 64K" --direct; do
        # shellcheck disable=SC2086
        every_rank_fails "$n" "$SCRATCH/cut/__1_0.distcp: model.embed_tokens.weight: short read at offset" \
            "$SCRATCH/cut" --layout replicate $extra
        grep -Eq "^dcpload: rank [0-9]+: $SCRATCH/cut/__1_0.distcp: " "$SCRATCH/msgs" ||
            fail "read error not named once with its rank: $(cat "$SCRATCH/msgs")"
    done
done

# without a GPU (or a CUDA build) a CUDA destination fails clearly everywhere
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    every_rank_fails 2 "CUDA destination: " "$CK" --device cuda
    # a CUDA build asked the runtime (device_cuda.c), a host-only build says what it lacks
    if grep -q '^#define HAVE_CUDA 1' "$top_builddir/config.h" 2>/dev/null; then want="no usable GPU"; else want="built without CUDA"; fi
    grep -q "$want" "$SCRATCH/msgs" || fail "CUDA message without '$want': $(cat "$SCRATCH/msgs")"
fi

# usage errors are not collective but must not hang either; every rank parses the same
# arguments, the message (and the usage) is printed once, by rank 0, not once per rank
usage_error() {
    local n=$1 want=$2 usage=$3 rc=0; shift 3
    mpirun "$n" "$DCPLOAD" "$@" >/dev/null 2>"$SCRATCH/err" || rc=$?
    [ "$rc" -eq 2 ] || fail "dcpload $* on $n ranks: status $rc: $(cat "$SCRATCH/err")"
    [ "$(grep -c '^dcpload: ' "$SCRATCH/err")" -eq 1 ] && grep -qx "dcpload: $want" "$SCRATCH/err" &&
        [ "$(grep -c '^usage: ' "$SCRATCH/err")" -eq "$usage" ] ||
        fail "dcpload $* on $n ranks: not 'dcpload: $want' once (and the usage $usage times): $(cat "$SCRATCH/err")"
}
usage_error 2 "unknown layout 'diagonal' (rows, cols, blocks, replicate)" 0 "$CK" --layout diagonal
usage_error 4 "unrecognized option '--bogus'" 1 --bogus "$CK"
usage_error 4 "bad --buffers '0' (1 to 64)" 0 "$CK" --buffers 0
usage_error 3 "option '--layout' requires an argument" 1 "$CK" --layout
usage_error 3 "invalid option -- 'x'" 1 -x "$CK"
usage_error 2 "no checkpoint named" 1
usage_error 2 "2 checkpoints named, one is loaded ('$CK' is extra)" 1 "$CK" "$CK"
# ranks given different arguments (mpiexec's MPMD form): a usage error on one
# rank, or --device or --megatron-fold on some ranks only, ends every rank
# with status 2 (the others waited in the first collective for ever; views
# of other shapes were refused as a region of the wrong rank)
mpmd() {
    RC=0
    mpirun "$@" >/dev/null 2>"$SCRATCH/err" || RC=$?
    [ "$RC" -ne 124 ] && [ "$RC" -ne 137 ] || fail "MPMD $*: hung (timeout)"
    [ "$RC" -eq 2 ] || fail "MPMD $*: status $RC: $(cat "$SCRATCH/err")"
}
mpmd 1 "$DCPLOAD" "$CK" : -n 2 "$DCPLOAD" "$CK" --layout diagonal
[ "$(grep -c "unknown layout 'diagonal'" "$SCRATCH/err")" -eq 2 ] ||
    fail "MPMD bad layout: the ranks with it do not say why: $(cat "$SCRATCH/err")"
grep -qx "dcpload: rank 1 was given bad arguments (its message above)" "$SCRATCH/err" ||
    fail "MPMD bad layout: rank 0 does not name rank 1: $(cat "$SCRATCH/err")"
# three ranks with good arguments: one line names the rank with bad ones, not three
mpmd 3 "$DCPLOAD" "$CK" : -n 1 "$DCPLOAD" "$CK" --layout diagonal
[ "$(grep -c "unknown layout 'diagonal'" "$SCRATCH/err")" -eq 1 ] &&
    [ "$(grep -cx "dcpload: rank 3 was given bad arguments (its message above)" "$SCRATCH/err")" -eq 1 ] ||
    fail "MPMD bad layout on rank 3 of 4: not once each: $(cat "$SCRATCH/err")"
mpmd 1 "$DCPLOAD" "$CK" --device cuda : -n 1 "$DCPLOAD" "$CK"
grep -q "every rank must pass the same --device" "$SCRATCH/err" || fail "MPMD --device: $(cat "$SCRATCH/err")"
mpmd 1 "$DCPLOAD" "$CK" : -n 1 "$DCPLOAD" "$CK" --megatron-fold
grep -q "every rank must pass the same --megatron-fold" "$SCRATCH/err" || fail "MPMD --megatron-fold: $(cat "$SCRATCH/err")"
