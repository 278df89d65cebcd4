#!/bin/bash
# dcp convert --to hf speed (run by `make bench`, never by the tests).
#
# Target (issue #15): an export whose recipe splits and permutes moves the bytes at >= 0.7x
# the speed of `cp` of the checkpoint's shard files, with a peak RSS <= 256 MiB; and against the
# framework's own converter where it runs.
#
# Method. `dcp synth` makes a 2 GiB checkpoint (32 float32 tensors of 4096x4096 over 4
# ranks, by rows as FSDP shards; DCPFS_BENCH_SHARD=cols for strided reads). A recipe maps
# each tensor as a Megatron-Core fused QKV of 24 query and 4 key/value heads of 128 rows:
# split into q, k and v, with the q and k rows permuted to Hugging Face's rotary layout (so
# 3/4 of the rows are read one 16 KiB row at a time, through the planner). Each round times,
# one after the other: `cp` of the 4 shard files, that export, the same with --dtype bfloat16
# (the cast: half the bytes written), a rename-only export, the permutation alone as
# llama-torchtitan applies it to wq (32 heads of 128 rows), and torchtitan's own converter
# doing the same (bench/torchtitan-to-hf.py: torch's dcp.load of the whole checkpoint,
# Llama3StateDictAdapter.to_hf, dcp.save with a HuggingFaceStorageWriter, as torchtitan's
# checkpointer does for to_hf; skipped, with the reason, where torchtitan 0.3.0 does not import
# or memory is short; its output is checked digest for digest against dcp's). Page cache warm, outputs not
# fsynced (cp neither; --no-sync), `sync` between runs; best of DCPFS_BENCH_REPS rounds
# (default 3) for wall and CPU time separately; ratio = cp's time / the export's. On a busy
# machine treat wall times as noisy and look at the CPU ratios.
set -euo pipefail
: "${top_builddir:=$(cd "$(dirname "$0")/.." && pwd)}"
DCP="$top_builddir/dcp"
DIR="${DCPFS_BENCH_DIR:-${TMPDIR:-/tmp}/dcpfs-bench}/export.$$"
REPS="${DCPFS_BENCH_REPS:-3}"
SHARD="${DCPFS_BENCH_SHARD:-rows}"
KEYS="${DCPFS_BENCH_EXPORT_KEYS:-32}" SHAPE=4096,4096 RANKS=4   # fewer keys: a quick check of the script
SRCDIR="$(cd "$(dirname "$0")/.." && pwd)"
BYTES=$((KEYS * 4096 * 4096 * 4))
TARGET=0.7 RSS_LIMIT_MIB=256
say() { printf '%s\n' "$*"; }
skip() { say "bench-export: skipped: $*"; exit 0; }
[ -x "$DCP" ] || skip "build first (make): $DCP is missing"
[ -x /usr/bin/time ] || skip "/usr/bin/time is needed (apt-get install time)"
case "$REPS" in '' | *[!0-9]* | 0) skip "DCPFS_BENCH_REPS must be a positive number" ;; esac
case "$KEYS" in '' | *[!0-9]* | 0) skip "DCPFS_BENCH_EXPORT_KEYS must be a positive number" ;; esac
mkdir -p "$(dirname "$DIR")" || skip "cannot create $(dirname "$DIR")"
free_kb=$(df -Pk "$(dirname "$DIR")" | awk 'NR==2 {print $4}')
need_kb=$((BYTES * 3 / 1024 + 1024 * 1024))   # the source, torchtitan's sharded and consolidated outputs
[ "$free_kb" -gt "$need_kb" ] || skip "needs $((need_kb >> 20)) GiB free in $(dirname "$DIR"), has $((free_kb / 1024)) MiB"
avail_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
[ "$avail_kb" -gt $((5 * 1024 * 1024)) ] || skip "needs 5 GiB of available memory for a warm page cache"
mkdir "$DIR"
trap 'rm -rf "$DIR"; rmdir "$(dirname "$DIR")" 2>/dev/null || true' EXIT
fmt() { awk "BEGIN{printf \"$1\", $2}"; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

cat >"$DIR/qkv.json" <<'J'
{"recipe": "bench-qkv", "rules": [{"from": "model.layers.{L}.weight", "op": "split_qkv", "heads": 24, "kv_heads": 4,
  "rope": "to_hf", "to": ["model.layers.{L}.self_attn.q_proj.weight", "model.layers.{L}.self_attn.k_proj.weight",
                          "model.layers.{L}.self_attn.v_proj.weight"]}], "config": {"model_type": "bench"}}
J
cat >"$DIR/rename.json" <<'J'
{"recipe": "bench-rename", "rules": [{"from": "model.layers.{L}.weight", "to": "model.layers.{L}.mlp.down_proj.weight"}],
 "config": {"model_type": "bench"}}
J
cat >"$DIR/permute.json" <<'J'
{"recipe": "bench-permute", "rules": [{"from": "model.layers.{L}.weight", "op": "rope_permute", "heads": 32,
  "rope": "to_hf", "to": "model.layers.{L}.self_attn.q_proj.weight"}], "config": {"model_type": "bench"}}
J
say "bench-export: $((BYTES >> 30)) GiB, $KEYS float32 tensors of $SHAPE over $RANKS ranks ($SHARD), in $DIR"
say "conditions: warm page cache, outputs not fsynced (cp neither; --no-sync), sync between runs;"
say "            best of $REPS rounds; $(nproc) CPUs; load average at start $(loadavg)"
$DCP synth "$DIR/src" --keys $KEYS --shape $SHAPE --dtype float32 --ranks $RANKS --shard "$SHARD" >/dev/null
cat "$DIR"/src/* >/dev/null
sync

CASES=(
    "cp of the $RANKS shard files|"
    "split_qkv + rope_permute|--recipe $DIR/qkv.json"
    "split_qkv + rope_permute, bfloat16|--recipe $DIR/qkv.json --dtype bfloat16"
    "rename only|--recipe $DIR/rename.json"
    "rope_permute (wq, 32 heads)|--recipe $DIR/permute.json"
)
PEER_CASE=""
peer_skip=""
if ! python3 -c 'import torchtitan' >/dev/null 2>&1; then
    peer_skip="torchtitan is not installed (pip install --no-deps torchtitan==0.3.0 spmd-types==0.2.3 tyro==1.0.16 docstring-parser==0.18.0 typeguard==4.6.1)"
elif [ "$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)" -lt $((BYTES * 3 / 1024 + 1024 * 1024)) ]; then
    peer_skip="it holds the checkpoint twice in memory (the load and to_hf's permuted copies): needs $((BYTES * 3 >> 30)) GiB + 1 GiB available"
else
    PEER_CASE=${#CASES[@]}
    CASES+=("torchtitan to_hf (dcp.load, HF writer)|peer")
fi
declare -A best_wall best_cpu best_rss
run_case() {
    local label flags
    IFS='|' read -r label flags <<<"${CASES[$1]}"
    rm -rf "$DIR/out"
    sync
    if [ "$1" = 0 ]; then
        mkdir "$DIR/out"
        /usr/bin/time -f '%e %U %S %M' -o "$DIR/t" cp "$DIR"/src/__*_0.distcp "$DIR/out"/
    elif [ "$1" = "$PEER_CASE" ]; then
        /usr/bin/time -f '%e %U %S %M' -o "$DIR/t" python3 "$SRCDIR/bench/torchtitan-to-hf.py" "$DIR/src" "$DIR/out" 32 \
            2>"$DIR/peer.err" || { cat "$DIR/peer.err"; skip "torchtitan's converter failed"; }
        grep '^torchtitan-to-hf:' "$DIR/peer.err" >"$DIR/peer.phases" || true
        [ -f "$DIR/peer.digest" ] || $DCP --no-catalog digest "$DIR/out"/model-00001-of-00001.safetensors | sort -k2 >"$DIR/peer.digest"
    else
        # shellcheck disable=SC2086
        /usr/bin/time -f '%e %U %S %M' -o "$DIR/t" $DCP --no-catalog convert -q --no-sync --to hf $flags \
            "$DIR/src" "$DIR/out"
        case "$flags" in *permute.json) [ -f "$DIR/dcp.digest" ] || $DCP --no-catalog digest "$DIR/out/model.safetensors" | sort -k2 >"$DIR/dcp.digest" ;; esac
    fi
    local wall user sys kb cpu
    read -r wall user sys kb <"$DIR/t"
    cpu=$(fmt %.3f "$user + $sys")
    if [ -z "${best_wall[$1]:-}" ] || awk "BEGIN{exit !($wall < ${best_wall[$1]})}"; then best_wall[$1]=$wall; fi
    if [ -z "${best_cpu[$1]:-}" ] || awk "BEGIN{exit !($cpu < ${best_cpu[$1]})}"; then best_cpu[$1]=$cpu; fi
    if [ -z "${best_rss[$1]:-}" ] || [ "$kb" -gt "${best_rss[$1]}" ]; then best_rss[$1]=$kb; fi
}
for _ in $(seq "$REPS"); do
    for i in "${!CASES[@]}"; do run_case "$i"; done
done
rm -rf "$DIR/out"
say ""
say "$(printf '%-38s %8s %8s %9s %6s %7s %8s  %s' 'what' 'wall s' 'GB/s' 'CPU s' 'x cp' 'CPU xcp' 'peak RSS' 'target (>= 0.7x cp, <= 256 MiB)')"
cp_wall=${best_wall[0]} cp_cpu=${best_cpu[0]}
for i in "${!CASES[@]}"; do
    IFS='|' read -r label flags <<<"${CASES[$i]}"
    w=${best_wall[$i]} c=${best_cpu[$i]} kb=${best_rss[$i]}
    gbs=$(fmt %.2f "$BYTES / $w / 1e9")
    if [ "$i" = 0 ]; then
        say "$(printf '%-38s %8.2f %8s %9.2f %6s %7s %5d MiB  %s' "$label" "$w" "$gbs" "$c" 1.00 1.00 $((kb / 1024)) baseline)"
        continue
    fi
    ratio=$(fmt %.2f "$cp_wall / $w")
    cratio=$(fmt %.2f "$cp_cpu / ($c > 0 ? $c : 0.001)")
    verdict=met
    awk "BEGIN{exit !($ratio >= $TARGET)}" || verdict="NOT met (speed)"
    [ $((kb / 1024)) -le $RSS_LIMIT_MIB ] || verdict="NOT met (memory)"
    [ "$i" != "$PEER_CASE" ] || verdict="the framework's converter (vs dcp's rope_permute: $(fmt %.2f "$w / ${best_wall[$((i - 1))]}")x the wall time)"
    say "$(printf '%-38s %8.2f %8s %9.2f %6s %7s %5d MiB  %s' "$label" "$w" "$gbs" "$c" "$ratio" "$cratio" $((kb / 1024)) "$verdict")"
done
say "(GB/s: source bytes read per second; load average at end $(loadavg))"
if [ -n "$peer_skip" ]; then
    say "torchtitan's converter: skipped: $peer_skip"
else
    say "torchtitan's converter, last round: $(cut -d' ' -f2- "$DIR/peer.phases")"
    if cmp -s "$DIR/peer.digest" "$DIR/dcp.digest"; then
        say "its output equals dcp's rope_permute export, digest for digest ($(wc -l <"$DIR/dcp.digest") tensors)"
    else
        say "its output DIFFERS from dcp's rope_permute export:"
        diff "$DIR/peer.digest" "$DIR/dcp.digest" | head -5
        exit 1
    fi
fi
