# 8 concurrent readers of the same file and of different files, in both read
# modes, each compared byte for byte with `dcp cat` (all.safetensors: with the
# file `dcp convert` writes). A slow request (user.dcp.xxh3_128 reads the whole
# value) holds up no other: while one waits on its shard, other files are
# looked up and read.
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

# The digest attribute of a key whose shard cannot be read yet: its shard is a link to a
# file of another dcpfs mount (a scan folder's plain file) whose daemon is stopped. It
# used to be answered by the thread that receives every request: the mount stalled
# (no lookup, stat or read answered) until the digest was done.
S=$SCRATCH/slow
mkdir -p "$S/src" "$S/ck"
"$DCP" --no-catalog synth "$S/synth" --keys 2 --shape 256,256 --seed 3 >/dev/null || fail "dcp synth"
cp "$S/synth/__0_0.distcp" "$S/src/shard.bin"
cp "$S/synth/.metadata" "$S/ck/"
ln -s ../a/shard.bin "$S/ck/__0_0.distcp"
mount_dcpfs "$S/src" "$S/a" -o no_catalog; apid=$DCPFS_PID
mount_dcpfs "$S/ck" "$S/b" -o no_catalog; bpid=$DCPFS_PID
resume() { kill -CONT "$apid" 2>/dev/null || true; }
kill -STOP "$apid"
timeout 60 python3 -c 'import os, sys; print(os.getxattr(sys.argv[1], "user.dcp.xxh3_128").decode())' \
    "$S/b/model/layers/0/weight" >"$S/digest" 2>"$S/digest.err" &
gpid=$!
sleep 0.5
kill -0 "$gpid" 2>/dev/null || { resume; fail "the digest did not wait on the stopped mount: $(cat "$S/digest.err")"; }
st=$(timeout 10 stat -c %s "$S/b/model/layers/1/weight") ||
    { resume; fail "a stat waited for another file's digest"; }
[ "$st" = 262144 ] || { resume; fail "model/layers/1/weight: size $st"; }
st=$(timeout 10 stat -c %s "$S/b/all.safetensors") ||
    { resume; fail "all.safetensors: its lookup (laying it out) waited for another file's digest"; }
[ "$st" -gt 524288 ] || { resume; fail "all.safetensors: size $st"; }
resume
wait "$gpid" || fail "getxattr user.dcp.xxh3_128 failed: $(cat "$S/digest.err")"
want=$("$DCP" --no-catalog digest "$S/synth" | awk '$2 == "model.layers.0.weight" {print $1}')
[ "$(cat "$S/digest")" = "$want" ] || fail "user.dcp.xxh3_128 is $(cat "$S/digest"), dcp digest says $want"
unmount_dcpfs "$S/b" "$bpid"
unmount_dcpfs "$S/a" "$apid"
echo "ok"
