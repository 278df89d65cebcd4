#!/bin/bash
# dcp convert and dcp synth speed (run by `make bench`, never by the tests).
#
# A 2 GiB checkpoint (32 float32 tensors of 4096x4096, column-sharded over 4 ranks, made by
# `dcp synth`) is converted DCP -> torch.save -> DCP -> safetensors, and compared with `cp` of
# the same shard files (warm page cache for both, no fsync for either: the bytes moved are the
# same). Reports GB/s, the ratio to cp (target >= 0.7), and each run's peak RSS (target
# < 256 MiB), with and without zip CRCs. Then the time `dcp synth` takes for 2 GiB and for
# 100,000 keys. Best of $REPS runs (shared VMs are noisy).
set -euo pipefail
: "${top_builddir:=$(cd "$(dirname "$0")/.." && pwd)}"
DCP="$top_builddir/dcp"
DIR="${DCPFS_BENCH_DIR:-${TMPDIR:-/tmp}/dcpfs-bench}/convert"
REPS="${DCPFS_BENCH_REPS:-3}"
say() { printf '%s\n' "$*"; }
[ -x "$DCP" ] || { say "bench-convert: build first (make)"; exit 0; }
[ -x /usr/bin/time ] || { say "bench-convert: /usr/bin/time is needed: skipped"; exit 0; }
mkdir -p "$DIR"
free_kb=$(df -Pk "$DIR" | awk 'NR==2 {print $4}')
[ "$free_kb" -gt $((9 * 1024 * 1024)) ] || { say "bench-convert: needs 9 GiB free in $DIR: skipped"; exit 0; }
trap 'rm -rf "$DIR"' EXIT
rm -rf "$DIR"/*

# best PRE CMD...: best of $REPS wall times (s) of CMD, after running PRE each time, into
# $best_s, and the peak RSS (KiB) of that run into $best_kb.
best() {
    local pre=$1; shift
    best_s=; best_kb=
    for _ in $(seq "$REPS"); do
        eval "$pre"
        /usr/bin/time -f '%e %M' -o "$DIR/t" "$@" >/dev/null
        read -r s kb <"$DIR/t"
        if [ -z "$best_s" ] || awk "BEGIN{exit !($s < $best_s)}"; then best_s=$s; best_kb=$kb; fi
    done
}

t0=$(date +%s.%N)
$DCP synth "$DIR/src" --keys 32 --shape 4096,4096 --dtype float32 --ranks 4 --shard cols
t1=$(date +%s.%N)
BYTES=$((32 * 4096 * 4096 * 4))
say "synth: 2 GiB, 4 ranks, cols: $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s"
cat "$DIR"/src/*.distcp >/dev/null   # warm

best 'rm -rf "$DIR/cp"; mkdir "$DIR/cp"' sh -c 'cp "$0"/src/*.distcp "$0"/cp/' "$DIR"
cp_s=$best_s
say "$(printf '%-34s %6.2f s %6.2f GB/s' 'cp of the shard files' "$cp_s" "$(awk "BEGIN{print $BYTES / $cp_s / 1e9}")")"

conv() {   # conv LABEL SRC DST [FLAGS...]
    local label=$1 src=$2 dst=$3; shift 3
    best "rm -rf '$dst'" $DCP --no-catalog convert -q --no-sync "$@" "$src" "$dst"
    say "$(printf '%-34s %6.2f s %6.2f GB/s  %4.2fx cp  peak RSS %5d MiB' "$label" "$best_s" \
        "$(awk "BEGIN{print $BYTES / $best_s / 1e9}")" "$(awk "BEGIN{print $cp_s / $best_s}")" $((best_kb / 1024)))"
}
conv "DCP -> torch.save (CRC)" "$DIR/src" "$DIR/a.pt"
conv "DCP -> torch.save (--no-crc)" "$DIR/src" "$DIR/a.pt" --no-crc
conv "torch.save -> DCP (CRC)" "$DIR/a.pt" "$DIR/b"
conv "torch.save -> DCP (--no-crc)" "$DIR/a.pt" "$DIR/b" --no-crc
conv "DCP -> safetensors" "$DIR/b" "$DIR/c.safetensors"
conv "safetensors -> DCP (--no-crc)" "$DIR/c.safetensors" "$DIR/d" --no-crc
rm -rf "$DIR"/a.pt "$DIR"/b "$DIR"/c.safetensors "$DIR"/d "$DIR"/cp

t0=$(date +%s.%N)
$DCP synth "$DIR/many" --keys 100000 --shape 64 --dtype float32 --ranks 8
t1=$(date +%s.%N)
say "synth: 100,000 keys, 8 ranks: $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s"
