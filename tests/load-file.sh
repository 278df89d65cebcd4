# dcpload on single files (issue 6, PyTorch's BroadcastingTorchSaveReader
# case): a torch.save file written by real PyTorch (views sharing a storage,
# strided and transposed views, 0-d, empty, several dtypes), and fixtures
# converted by `dcp convert` to a .pt and a .safetensors file. On 1..4 ranks
# and several layouts each rank's region equals the ground truth, and the
# ranks together read each needed byte of the file once.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need python3
need_python_module numpy
scratch

# check_file NAME FILE TRUTH UNIQUE LAYOUTS...: every layout on 1..4 ranks
check_file() {
    local name=$1 file=$2 truth=$3 unique=$4; shift 4
    local runs="$SCRATCH/runs-$name"
    mkdir -p "$runs"
    for n in 1 2 3 4; do
        for layout in "$@"; do
            mpirun "$n" "$DCPLOAD" "$file" --layout "$layout" --json >"$runs/$layout-$n.json" 2>"$runs/err" ||
                fail "$name: dcpload -n $n --layout $layout failed: $(cat "$runs/err")"
        done
    done
    python3 "$top_srcdir/tests/load_check.py" "$DCP" "$file" "$truth" "$runs" "$unique" || fail "$name"
}

if python3 -c 'import torch' 2>/dev/null; then
    mkdir -p "$SCRATCH/torch"
    python3 "$top_srcdir/tests/load_torch_save.py" "$SCRATCH/torch" || fail "writing the torch.save file"
    check_file torch "$SCRATCH/torch/model.pt" "$SCRATCH/torch/truth.json" "$(cat "$SCRATCH/torch/unique")" \
        rows cols blocks replicate
    # a small staging size: records cut into units, deliveries of parts
    runs="$SCRATCH/runs-torch-small"
    mkdir -p "$runs"
    for layout in cols replicate; do
        mpirun 3 "$DCPLOAD" "$SCRATCH/torch/model.pt" --layout "$layout" --json --staging 4096 --no-bcast \
            >"$runs/$layout-3.json" 2>"$runs/err" || fail "torch --staging 4096: $(cat "$runs/err")"
    done
    python3 "$top_srcdir/tests/load_check.py" "$DCP" "$SCRATCH/torch/model.pt" "$SCRATCH/torch/truth.json" \
        "$runs" "$(cat "$SCRATCH/torch/unique")" || fail "torch, small staging"
    # strict errors on a file too: every rank fails with the same message, printed once
    rc=0
    DCPLOAD_TEST_BAD_KEY_RANK=2 mpirun 3 "$DCPLOAD" "$SCRATCH/torch/model.pt" >"$SCRATCH/out" 2>"$SCRATCH/err" || rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "bad key on a .pt: status $rc"
    [ "$(grep -c "^dcpload: rank 2: .*model.pt: dcpload.test.no_such_key: no such key" "$SCRATCH/err")" -eq 1 ] &&
        [ "$(grep -c '^dcpload: ' "$SCRATCH/err")" -eq 1 ] || fail "bad key on a .pt: $(cat "$SCRATCH/err")"
else
    echo "PyTorch is not installed: the torch.save file written by PyTorch is not tested"
fi

for name in 04_block_4ranks 05_mixed_2ranks; do
    for ext in pt safetensors; do
        file="$SCRATCH/$name.$ext"
        "$DCP" convert "$FIXTURES/$name/ckpt" "$file" >/dev/null 2>"$SCRATCH/err" ||
            fail "dcp convert $name to .$ext: $(cat "$SCRATCH/err")"
        # a converted file stores each tensor once, whole: its ranks read the tensors' bytes
        check_file "$name-$ext" "$file" "$FIXTURES/$name/expected/manifest.json" "$(tensor_bytes "$file")" \
            rows cols replicate
    done
done

# a file that is neither format fails clearly on every rank (said once)
printf 'not a checkpoint at all\n' >"$SCRATCH/junk"
rc=0
mpirun 2 "$DCPLOAD" "$SCRATCH/junk" >/dev/null 2>"$SCRATCH/err" || rc=$?
[ "$rc" -ne 0 ] || fail "dcpload accepted a junk file"
[ "$(grep -c "neither a torch.save nor a safetensors file" "$SCRATCH/err")" -eq 1 ] &&
    [ "$(grep -c '^dcpload: ' "$SCRATCH/err")" -eq 1 ] || fail "junk file: $(cat "$SCRATCH/err")"
# a checkpoint's .metadata named instead of its folder: the error says a checkpoint is the folder
rc=0
mpirun 2 "$DCPLOAD" "$FIXTURES/05_mixed_2ranks/ckpt/.metadata" >/dev/null 2>"$SCRATCH/err" || rc=$?
[ "$rc" -ne 0 ] || fail "dcpload accepted a .metadata file"
[ "$(grep -c "a DCP checkpoint is the folder that holds .metadata" "$SCRATCH/err")" -eq 1 ] &&
    [ "$(grep -c '^dcpload: ' "$SCRATCH/err")" -eq 1 ] ||
    fail ".metadata file: $(cat "$SCRATCH/err")"
