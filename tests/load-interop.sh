# dcpload on checkpoints PyTorch 2.x saves with 4 gloo ranks (DTensors by rows,
# columns, blocks, replicated) in three serializations: torch.save records,
# SAFETENSORS shards, zstd-compressed records (decoded streams). 3 ranks, so
# no layout matches the saved one.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need python3
need_python_module numpy
need_torch
scratch
save_dtensor torch_save safetensors zstd
for variant in torch_save safetensors zstd; do
    if [ "$variant" = zstd ] && ! have_zstd; then
        echo "zstd variant skipped: no zstandard/pyzstd module"; continue
    fi
    runs="$SCRATCH/$variant-runs"
    mkdir -p "$runs"
    for n in 1 3; do
        for layout in rows cols blocks replicate; do
            mpirun "$n" "$DCPLOAD" "$SCRATCH/$variant/ckpt" --layout "$layout" --json --staging 8192 \
                >"$runs/$layout-$n.json" 2>"$runs/err" ||
                fail "$variant: dcpload -n $n --layout $layout failed: $(cat "$runs/err")"
        done
    done
    python3 "$top_srcdir/tests/load_check.py" "$DCP" "$SCRATCH/$variant/ckpt" "$SCRATCH/$variant/truth.json" \
        "$runs" || fail "$variant"
    # the independent mode on one rank, everything: the same bytes; of zstd
    # records it counts the decoded bytes it needs, what the collective load
    # read (plain records are read whole, so it reads more there)
    mpirun 1 "$DCPLOAD" "$SCRATCH/$variant/ckpt" --layout replicate --json --strategy independent \
        >"$SCRATCH/$variant-indep.json" 2>"$runs/err" || fail "$variant: independent: $(cat "$runs/err")"
    python3 - "$runs/replicate-1.json" "$SCRATCH/$variant-indep.json" "$variant" <<'PY' || fail "$variant: independent differs"
import json, sys
coll, indep = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
hashes = lambda rs: sorted((r["key"], r["xxh3"]) for r in rs if "xxh3" in r)
read = lambda rs: [r["bytes_read"] for r in rs if "bytes_read" in r]
if hashes(coll) != hashes(indep):
    sys.exit("independent: other bytes")
if sys.argv[3] == "zstd" and read(coll) != read(indep):
    sys.exit(f"independent read {read(indep)} bytes, collective {read(coll)}")
PY
done
