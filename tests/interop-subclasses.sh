#!/bin/bash
# Checkpoints holding tensor subclasses (tests/data/subclasses, made once by
# tests/interop/save_subclasses.py with torch 2.13.0 and torchao 0.18.0): torchao's float8
# training weights and MoE float8/MXFP8 expert weights, which torch.save pickles as the wrapper
# with the plain tensor it holds, and a subclass of Tensor holding its own storage (pickled with
# its class), read byte-exact by `dcp cat` in a one-process DCP save, in
# FSDP2-style DTensor shards of two ranks (saved by dcp.save and by torch.save per rank, as
# torch-checkpointing does) and in a torch.save file; an NF4 weight (4-bit codes
# and scales, not its values) refused naming its class; a record whose wrapper class or dtype
# was changed refused, not read as the tensor it holds. No torchao needed here.
. "$top_srcdir/tests/lib.sh"
need python3
data="$top_srcdir/tests/data/subclasses"
[ -d "$data" ] || fail "$data is missing"
scratch
for c in dcp fsdp2 fsdp2-rankfiles single.pt; do
    python3 "$top_srcdir/tests/interop/check_truth.py" "$DCP" "$data/$c" "$data/${c%.pt}.truth.json" ||
        fail "$c: not the saved values"
done
nf4=torchao.quantization.quantize_.workflows.nf4.nf4_tensor.NF4Tensor
expect_fail "$data/dcp/__0_0.distcp: layers.2.qlora.weight: chunk 0 at offset 18038: data.pkl does not rebuild a plain tensor (a $nf4, a tensor subclass whose stored tensors libdcp does not know to be its values)" \
    "$DCP" cat "$data/dcp" layers.2.qlora.weight
# An intact record libdcp does not read is no damage: dcp verify passes.
out=$("$DCP" verify "$data/dcp") || fail "dcp verify of an intact checkpoint with an NF4 weight: $out"
case "$out" in *"structure: 0 problems"*) ;; *) fail "dcp verify: $out" ;; esac
# The same record with its class renamed (same length: the zip is intact), or the wrapper's
# dtype changed: refused.
mkdir "$SCRATCH/renamed" "$SCRATCH/dtype"
for c in renamed dtype; do cp "$data/dcp/.metadata" "$data/dcp/__0_0.distcp" "$SCRATCH/$c/"; done
python3 - "$SCRATCH" <<'PY'
import sys
for case, old, new in (("renamed", b"WeightWithDynamicFloat8CastTensor", b"WeightWithDynamicFloat8CastTensoX"),
                       ("dtype", b"torch\nfloat32", b"torch\nfloat64")):
    p = f"{sys.argv[1]}/{case}/__0_0.distcp"
    b = open(p, "rb").read()
    assert b.count(old) >= 1, (case, b.count(old))
    open(p, "wb").write(b.replace(old, new, 1))
PY
expect_fail "data.pkl does not rebuild a plain tensor (a torchao.float8.fsdp_utils.WeightWithDynamicFloat8CastTensoX, a tensor subclass whose stored tensors libdcp does not know to be its values)" \
    "$DCP" cat "$SCRATCH/renamed" layers.0.attention.wq.weight
# (its structure intact, the renamed class is found by the records' CRC-32)
out=$("$DCP" verify --crc "$SCRATCH/renamed" 2>&1) && fail "dcp verify --crc passed a changed data.pkl: $out"
case "$out" in
    *"PROBLEM: $SCRATCH/renamed/__0_0.distcp: layers.0.attention.wq.weight: record archive/data.pkl of the torch.save archive at offset 0: CRC-32"*) ;;
    *) fail "dcp verify --crc: $out" ;;
esac
expect_fail "$SCRATCH/dtype/__0_0.distcp: layers.0.attention.wq.weight: chunk 0 at offset 0: data.pkl: the WeightWithDynamicFloat8CastTensor wrapper's dtype or shape is not that of the tensor it holds" \
    "$DCP" cat "$SCRATCH/dtype" layers.0.attention.wq.weight
echo "torchao's float8 training weights read as the tensors they hold; NF4 and changed wrappers refused"
