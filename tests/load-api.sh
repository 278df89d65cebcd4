# libdcpload through its API on 1..4 ranks: irregular, overlapping regions,
# bytes items, tiny staging buffers, p2p only, the independent mode, and the
# strict errors agreed on every rank (tests/load_api.c); also without the I/O
# thread (MPI_THREAD_SINGLE); options or a checkpoint differing on one rank
# fail every rank with one message.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/load_lib.sh"
API="$top_builddir/tests/load_api"
[ -x "$API" ] || skip "tests/load_api was not built"
# another checkpoint with the same keys: 02 with one data file a byte longer
scratch
cp -r "$FIXTURES/02_rowwise_4ranks/ckpt" "$SCRATCH/other"
printf x >>"$SCRATCH/other/__3_1.distcp"
export LOAD_API_OTHER_CKPT="$SCRATCH/other"
for n in 1 2 3 4; do
    mpirun "$n" "$API" "$FIXTURES" || fail "load_api on $n ranks"
done
LOAD_API_THREAD_SINGLE=1 mpirun 3 "$API" "$FIXTURES" || fail "load_api on 3 ranks, MPI_THREAD_SINGLE"
