# Shares of 2 MiB and more: dcpload allocates them in huge pages, and the
# loader its staging buffers that large. 3 tensors of 4 MiB saved row-sharded
# by 2 ranks, loaded on 3 ranks in rows (read straight into the destination),
# cols (through staging buffers: 16 MiB and, with --staging 4M, 4 MiB ones)
# and replicate (delivered out of the reader's destination). The truth is
# dcp-synth(1)'s formula, computed by Python; the ranks together read each
# stored byte once.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need python3
need_python_module numpy
scratch

CK="$SCRATCH/ckpt"
"$DCP" synth "$CK" --keys 3 --shape 1024,1024 --dtype float32 --ranks 2 --shard rows --seed 11 \
    >/dev/null 2>"$SCRATCH/err" || fail "dcp synth: $(cat "$SCRATCH/err")"
python3 - "$top_srcdir/tests/interop" >"$SCRATCH/truth.json" <<'PY' || fail "the truth of the synthetic checkpoint"
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
from writer_synth_expect import synth_bytes
print(json.dumps({f"model.layers.{k}.weight": {"kind": "tensor", "dtype": "float32", "shape": [1024, 1024],
                  "sha256": hashlib.sha256(synth_bytes(11, k, 4 << 20)).hexdigest()} for k in range(3)}))
PY
for staging in 16M 4M; do
    runs="$SCRATCH/runs-$staging"
    mkdir -p "$runs"
    for layout in rows cols replicate; do
        mpirun 3 "$DCPLOAD" "$CK" --layout "$layout" --staging "$staging" --json >"$runs/$layout-3.json" \
            2>"$SCRATCH/err" || fail "--layout $layout --staging $staging: $(cat "$SCRATCH/err")"
    done
    python3 "$top_srcdir/tests/load_check.py" "$DCP" "$CK" "$SCRATCH/truth.json" "$runs" $((12 << 20)) ||
        fail "--staging $staging"
done
