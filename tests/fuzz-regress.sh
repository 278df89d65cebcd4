#!/bin/bash
# Replays every committed fuzz input (tests/fuzz/corpus: the seeds;
# tests/fuzz/crashes: every input a fuzzer ever failed on) through the
# harnesses built by the normal compiler (tests/fuzz/replay.c). A crash, a
# sanitizer report in the sanitizer build, or a run over 60 s per target fails.
. "$(dirname "$0")/lib.sh"
fz=$top_srcdir/tests/fuzz
n=0
for t in metadata spilled megatron ranklocal shard zstd safetensors torchfile hfindex mcoreconfig rankfile recipe rows sidecar manifest; do
    case $t in rows | sidecar) h=replay_catalog ;; *) h=replay_open ;; esac
    files=()
    for d in "$fz/corpus/$t" "$fz/crashes/$t"; do
        for f in "$d"/*; do
            if [ -f "$f" ]; then files+=("$f"); fi
        done
    done
    [ ${#files[@]} -gt 0 ] || fail "$t: no committed inputs under $fz/corpus/$t"
    SRCDIR=$top_srcdir timeout 60 "$top_builddir/tests/fuzz/$h" "$t" "${files[@]}" ||
        fail "$t: the harness failed (exit $?) on one of: ${files[*]}"
    n=$((n + ${#files[@]}))
done
# The rows seeds are stored rows (FUZZ_DUMP): each must still be served by the
# catalog as it is (not parsed, nor located and stored again), or the catalog's
# layout (modelcache.c's MAGIC) or fuzz_catalog.c's checksum seeds moved on
# and mutations of them no longer reach the decoders.
out=$(SRCDIR=$top_srcdir FUZZ_VERBOSE=1 "$top_builddir/tests/fuzz/replay_catalog" rows "$fz"/corpus/rows/model* 2>&1)
want=$(ls "$fz"/corpus/rows/model* | wc -l)
got=$(grep -c 'served by the catalog' <<<"$out" || true)
[ "$got" = "$want" ] || fail "rows: $got of $want stored rows were served by the catalog: regenerate tests/fuzz/corpus/rows (FUZZ_DUMP, see fuzz_catalog.c) or update its seeds"
echo "replayed $n inputs"
