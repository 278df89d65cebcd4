# PyTorch interop tier: 4-rank gloo saves of DTensors (rows, cols, 2x2 blocks, replicated),
# plain tensors, nested dicts and non-tensor values, in each serialization PyTorch offers
# (torch.save records, SAFETENSORS shards, zstd, rank-local __R.metadata, the HF storage layout);
# every key read back byte-exact by dcp.
. "$top_srcdir/tests/lib.sh"
need python3
need_torch
scratch
save_dtensor torch_save safetensors zstd ranklocal hf
for variant in torch_save safetensors zstd ranklocal hf; do
    if [ "$variant" = zstd ] && ! have_zstd; then
        echo "zstd variant skipped: no zstandard/pyzstd module"; continue
    fi
    python3 "$top_srcdir/tests/interop/check_truth.py" "$DCP" "$SCRATCH/$variant/ckpt" "$SCRATCH/$variant/truth.json"
done
