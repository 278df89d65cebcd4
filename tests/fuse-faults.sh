# Faults under load: while 8 readers (tests/fuse_readers.py --faults) read
# tensors whole through a dcpfs mount, again and again, one fault strikes:
# (a) a shard is truncated, (b) a shard is deleted, (c) the .metadata and
# shards are replaced by another checkpoint's (same keys, other bytes) by
# rename, (d) the mount is lazily unmounted (fusermount3 -u -z), (e) the
# daemon is killed (kill -9). Every reader must end within 10 s of its time
# with the original bytes (or, whole, the replacing checkpoint's) or an
# error: never a hang, never bytes mixed from both or in neither. After
# (a)-(c) the daemon still unmounts cleanly; after (d) it exits by itself.
# Both read modes: splice (the kernel moves shard bytes; a truncated shard
# must still give EIO, not a short read) and pread.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need prlimit
need_fuse
fuse_scratch
A=$SCRATCH/a B=$SCRATCH/b
# 2 ranks, rows: every key has a chunk in each of the two shard files.
"$DCP" synth "$A" --keys 4 --shape 512,1024 --ranks 2 --seed 1 >/dev/null || fail "dcp synth"
"$DCP" synth "$B" --keys 4 --shape 512,1024 --ranks 2 --seed 2 >/dev/null || fail "dcp synth"
keys=$("$DCP" ls "$A" | awk 'NR > 1 {print $1}' | head -4)
[ -n "$keys" ] || fail "no keys in $A"
shards=$(cd "$A" && ls -- *.distcp)
for k in $keys; do
    "$DCP" cat "$A" "$k" >"$SCRATCH/ref.$k" || fail "dcp cat $k"
    "$DCP" cat "$B" "$k" >"$SCRATCH/other.$k" || fail "dcp cat $k"
    cmp -s "$SCRATCH/ref.$k" "$SCRATCH/other.$k" && fail "$k: the two checkpoints hold the same bytes"
done
cp -r "$A" "$SCRATCH/a.orig"

# run_fault NAME MODE [NOFILE]: mount a fresh copy of A (the daemon allowed
# NOFILE fds, set before its first read), start the readers, strike after 1 s.
run_fault() {
    local name=$1 mode=$2 ck=$SCRATCH/ck-$1-$2 mnt=$SCRATCH/mnt-$1-$2 pairs=() k
    rm -rf "$ck"; cp -r "$SCRATCH/a.orig" "$ck"
    mount_dcpfs "$ck" "$mnt" -o read="$mode"
    local pid=$DCPFS_PID
    if [ -n "${3:-}" ]; then
        prlimit --pid "$pid" --nofile="$3:$3" || fail "prlimit --pid $pid --nofile=$3"
    fi
    for k in $keys; do
        pairs+=("$mnt/$(echo "$k" | tr . /)=$SCRATCH/ref.$k=$SCRATCH/other.$k")
    done
    python3 "$top_srcdir/tests/fuse_readers.py" --faults 3 8 "${pairs[@]}" >"$SCRATCH/readers-$name-$mode" 2>&1 &
    local readers=$!
    sleep 1
    local shard
    shard=$(echo "$shards" | tail -1)
    case $name in
    truncate) truncate -s $(($(stat -c %s "$ck/$shard") / 2)) "$ck/$shard" ;;
    delete) rm -f "$ck/$shard" ;;
    replace)
        local f
        for f in "$B"/* "$B"/.metadata; do cp "$f" "$ck/.new.$(basename "$f")"; done
        for f in "$B"/* "$B"/.metadata; do mv "$ck/.new.$(basename "$f")" "$ck/$(basename "$f")"; done ;;
    lazy-unmount) fusermount3 -u -z "$mnt" || fail "fusermount3 -u -z $mnt" ;;
    kill) kill -9 "$pid" ;;
    esac
    local t0=$SECONDS rc=0
    # The readers stop 2 s after the fault and give up on a hang 10 s later.
    wait "$readers" || rc=$?
    sed "s/^/  $name ($mode): /" "$SCRATCH/readers-$name-$mode"
    [ "$rc" -eq 0 ] || fail "$name: a reader hung or saw wrong bytes (exit $rc)"
    [ $((SECONDS - t0)) -le 13 ] || fail "$name: the readers took $((SECONDS - t0)) s"
    case $name in
    lazy-unmount)
        # Detached, the daemon exits once its last file is closed.
        local i
        for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && fail "$name: dcpfs still runs 10 s after the lazy unmount"
        wait "$pid" || true ;;
    kill)
        wait "$pid" 2>/dev/null || true
        fusermount3 -u -z "$mnt" 2>/dev/null || true ;;
    *)
        kill -0 "$pid" 2>/dev/null || fail "$name: dcpfs died: $(tail -5 "$mnt.log")"
        unmount_dcpfs "$mnt" "$pid" ;;
    esac
    echo "$name ($mode): ok"
}

for mode in splice pread; do
    for f in truncate delete replace lazy-unmount kill; do
        run_fault "$f" "$mode"
    done
done

# A replacement while the daemon's fds are closed: 32 shard files, every key
# chunked over all of them, and a daemon allowed 40 fds keeps at most 20
# open (pread mode: fds are cached, not pinned). Before the fix a reopened
# shard gave the new checkpoint's bytes beside the old ones; now EIO.
A=$SCRATCH/a32 B=$SCRATCH/b32
"$DCP" synth "$A" --keys 2 --shape 512,1024 --ranks 32 --seed 1 >/dev/null || fail "dcp synth"
"$DCP" synth "$B" --keys 2 --shape 512,1024 --ranks 32 --seed 2 >/dev/null || fail "dcp synth"
keys=$("$DCP" ls "$A" | awk 'NR > 1 {print $1}')
shards=$(cd "$A" && ls -- *.distcp)
for k in $keys; do
    "$DCP" cat "$A" "$k" >"$SCRATCH/ref.$k" || fail "dcp cat $k"
    "$DCP" cat "$B" "$k" >"$SCRATCH/other.$k" || fail "dcp cat $k"
done
rm -rf "$SCRATCH/a.orig"; cp -r "$A" "$SCRATCH/a.orig"
run_fault replace pread 40
grep -q "EIO" "$SCRATCH/readers-replace-pread" ||
    fail "replace with evicted fds: no reader met the replaced shards"
