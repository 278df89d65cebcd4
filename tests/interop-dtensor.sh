# PyTorch interop tier: 4-rank gloo saves of DTensors (rows, cols, 2x2 blocks, replicated),
# plain tensors, nested dicts and non-tensor values, in each serialization PyTorch offers
# (torch.save records, SAFETENSORS shards, zstd, rank-local __R.metadata, the HF storage layout);
# every key read back byte-exact by dcp.
. "$top_srcdir/tests/lib.sh"
need python3
need_torch
scratch
# Every variant saved by one set of 4 forked ranks (torch imported once).
variants="torch_save safetensors zstd ranklocal hf"
python3 -c 'import zstandard' 2>/dev/null || python3 -c 'import pyzstd' 2>/dev/null || variants=${variants/ zstd/}
timeout 600 python3 "$top_srcdir/tests/interop/save_dtensor.py" "$SCRATCH" $variants >"$SCRATCH/save.log" 2>&1 ||
    { cat "$SCRATCH/save.log"; fail "PyTorch save ($variants) failed"; }
for variant in torch_save safetensors zstd ranklocal hf; do
    if [ "$variant" = zstd ] && ! python3 -c 'import zstandard' 2>/dev/null && ! python3 -c 'import pyzstd' 2>/dev/null; then
        echo "zstd variant skipped: no zstandard/pyzstd module"; continue
    fi
    python3 "$top_srcdir/tests/interop/check_truth.py" "$DCP" "$SCRATCH/$variant/ckpt" "$SCRATCH/$variant/truth.json"
done
