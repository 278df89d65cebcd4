#!/bin/bash
# `make fuzz`: build libdcp and the harnesses with clang's libFuzzer, ASan and
# UBSan, then run each target for FUZZ_SECONDS from its committed seeds and
# crash inputs, with the dictionary of its formats. A crash, leak, timeout
# (-timeout, 10 s) or allocation over 2 GiB (-rss_limit_mb, -malloc_limit_mb)
# fails the target. Prints one line per target: corpus files, seconds,
# executions, edges, findings. Exit 77 where clang or libFuzzer is missing.
# usage: run.sh SRCDIR OUTDIR (env from tests/fuzz/local.mk)
set -u
src=$1 out=$2
cc=${FUZZ_CC:-clang} secs=${FUZZ_SECONDS:-60} jobs=$(nproc)
if ! command -v "$cc" >/dev/null; then
    echo "fuzz: $cc not found: skipped (apt-get install clang llvm)"; exit 77
fi
mkdir -p "$out/obj" "$out/corpus"
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' >"$out/probe.c"
if ! "$cc" -fsanitize=fuzzer "$out/probe.c" -o "$out/probe" 2>/dev/null; then
    echo "fuzz: $cc has no libFuzzer (-fsanitize=fuzzer): skipped"; exit 77
fi
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
cflags="-std=c11 -O1 -g -fno-omit-frame-pointer -pthread -Wall -Wextra -Werror $san"

# libdcp, instrumented for coverage (fuzzer-no-link); rebuilt when a source or header is newer.
newest_h=$(ls -t "$src"/include/*.h "$src"/src/*.h "$src"/src/*/*.h | head -1)
objs=() stale=()
for s in $FUZZ_SOURCES; do
    o=$out/obj/$(echo "$s" | tr / _).o
    objs+=("$o")
    if [ ! -e "$o" ] || [ "$src/$s" -nt "$o" ] || [ "$newest_h" -nt "$o" ]; then stale+=("$src/$s" "$o"); fi
done
printf '%s\n' "${stale[@]}" | xargs -r -P "$jobs" -n 2 sh -c "$cc $cflags -fsanitize=fuzzer-no-link $FUZZ_CPPFLAGS -c \"\$0\" -o \"\$1\"" ||
    { echo "fuzz: building libdcp with $cc failed"; exit 1; }
for h in fuzz_open fuzz_catalog; do
    "$cc" $cflags -fsanitize=fuzzer $FUZZ_CPPFLAGS "$src/tests/fuzz/$h.c" "${objs[@]}" $FUZZ_LIBS -o "$out/$h" ||
        { echo "fuzz: building $h failed"; exit 1; }
done

status=0
printf '%-12s %7s %6s %10s %7s %s\n' target corpus seconds executions edges findings
for t in $FUZZ_TARGETS; do
    case $t in
    metadata | spilled | megatron | ranklocal) dicts="pickle" h=fuzz_open ;;
    shard | torchfile) dicts="zip pickle" h=fuzz_open ;;
    zstd) dicts="zstd zip pickle" h=fuzz_open ;;
    rankfile) dicts="zip pickle dtensor" h=fuzz_open ;;
    safetensors | hfindex | mcoreconfig | recipe | manifest) dicts="json" h=fuzz_open ;;
    rows) dicts="rows" h=fuzz_catalog ;;
    sidecar) dicts="sidecar" h=fuzz_catalog ;;
    *) echo "fuzz: unknown target $t"; exit 2 ;;
    esac
    for d in $dicts; do cat "$src/tests/fuzz/dict/$d.dict"; done >"$out/$t.dict"
    dirs=("$out/corpus/$t" "$src/tests/fuzz/corpus/$t")
    [ -d "$src/tests/fuzz/crashes/$t" ] && dirs+=("$src/tests/fuzz/crashes/$t")
    mkdir -p "$out/corpus/$t"
    rm -f "$out/$t"-crash-* "$out/$t"-leak-* "$out/$t"-timeout-* "$out/$t"-oom-* "$out/$t"-slow-unit-*
    SRCDIR=$src FUZZ_TARGET=$t "$out/$h" -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        -timeout=10 -max_len=65536 -dict="$out/$t.dict" -print_final_stats=1 -artifact_prefix="$out/$t-" \
        "${dirs[@]}" >"$out/$t.log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t.log" | tail -1)
    edges=$(grep -o 'cov: [0-9]*' "$out/$t.log" | tail -1 | cut -d' ' -f2)
    found=$(ls "$out/$t"-crash-* "$out/$t"-leak-* "$out/$t"-timeout-* "$out/$t"-oom-* 2>/dev/null | wc -l)
    printf '%-12s %7s %6s %10s %7s %s\n' "$t" "$(ls "$src/tests/fuzz/corpus/$t" | wc -l)" "$secs" "${execs:-?}" \
        "${edges:-?}" "$found"
    if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
        status=1
        grep -A 30 '^==[0-9]*==ERROR\|runtime error\|ERROR: libFuzzer' "$out/$t.log" | head -40
        echo "fuzz: $t failed (exit $rc): log $out/$t.log, inputs $out/$t-*"
    fi
done
exit $status
