# 8 concurrent readers of the same file and of different files, in both read
# modes, each compared byte for byte with `dcp cat` (all.safetensors: with the
# file `dcp convert` writes).
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_fuse
fuse_scratch
case="$FIXTURES/02_rowwise_4ranks"
cols="$FIXTURES/03_colwise_4ranks"
"$DCP" cat "$case/ckpt" model.embed_tokens.weight >"$SCRATCH/embed" || fail "dcp cat"
"$DCP" cat "$case/ckpt" model.lm_head.weight >"$SCRATCH/head" || fail "dcp cat"
"$DCP" cat "$cols/ckpt" model.proj.weight >"$SCRATCH/proj" || fail "dcp cat"
mixed="$FIXTURES/05_mixed_2ranks"
"$DCP" convert --quiet --no-sync "$mixed/ckpt" "$SCRATCH/mixed.safetensors" >/dev/null || fail "dcp convert"
for mode in splice pread; do
    mnt="$SCRATCH/rows-$mode"; mnt2="$SCRATCH/cols-$mode"
    mount_dcpfs "$case/ckpt" "$mnt" -o read=$mode; pid1=$DCPFS_PID
    mount_dcpfs "$cols/ckpt" "$mnt2" -o read=$mode; pid2=$DCPFS_PID
    # Same file, 8 readers with random offsets and sizes (threads of one process).
    python3 "$top_srcdir/tests/fuse_readers.py" 8 "$mnt/model/embed_tokens/weight=$SCRATCH/embed"
    # Different files, 8 processes reading whole files.
    pids=()
    for r in 1 2 3 4 5 6 7 8; do
        case $((r % 3)) in
            0) cmp "$mnt/model/embed_tokens/weight" "$SCRATCH/embed" & ;;
            1) cmp "$mnt/model/lm_head/weight" "$SCRATCH/head" & ;;
            2) cmp "$mnt2/model/proj/weight" "$SCRATCH/proj" & ;;
        esac
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || fail "a concurrent reader saw different bytes ($mode)"; done
    python3 "$top_srcdir/tests/fuse_readers.py" 8 "$mnt/model/embed_tokens/weight=$SCRATCH/embed" \
        "$mnt/model/lm_head/weight=$SCRATCH/head" "$mnt2/model/proj/weight=$SCRATCH/proj"
    unmount_dcpfs "$mnt" "$pid1"
    unmount_dcpfs "$mnt2" "$pid2"
    mount_dcpfs "$mixed/ckpt" "$SCRATCH/mixed-$mode" -o read=$mode
    python3 "$top_srcdir/tests/fuse_readers.py" 8 "$SCRATCH/mixed-$mode/all.safetensors=$SCRATCH/mixed.safetensors"
    unmount_dcpfs "$SCRATCH/mixed-$mode"
done
echo "ok"
