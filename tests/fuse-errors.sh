# Damaged checkpoints: a missing or truncated shard gives EIO (and a log line
# naming the file and the key) for the files that need it, never a crash or a
# hang; other files still read; a folder that is not a checkpoint fails to mount.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_fuse
fuse_scratch
ck="$SCRATCH/ck"
cp -r "$FIXTURES/02_rowwise_4ranks/ckpt" "$ck"
# Which shard holds which key, from dcp layout; delete one shard of
# embed_tokens and truncate one of lm_head.
gone=$(python3 - "$DCP" "$ck" <<'PY'
import json, subprocess, sys
rows = [json.loads(l) for l in subprocess.run([sys.argv[1], "layout", "--json", sys.argv[2]],
        check=True, capture_output=True, text=True).stdout.splitlines()]
def files(key):
    out = []
    for r in rows:
        if r.get("key") == key:
            for c in r.get("chunks", [r]):
                f = c.get("file")
                if f and f not in out:
                    out.append(f)
    return out
print(files("model.embed_tokens.weight")[1], files("model.lm_head.weight")[2])
PY
) || fail "dcp layout --json"
set -- $gone
rm "$ck/$1"
truncate -s 100000 "$ck/$2"
for mode in splice pread; do
    mnt="$SCRATCH/mnt-$mode"
    mount_dcpfs "$ck" "$mnt" -o read=$mode
    for f in embed_tokens lm_head; do
        python3 - "$mnt/model/$f/weight" <<'PY' || fail "reading a damaged tensor did not give EIO ($mode)"
import errno, sys
try:
    with open(sys.argv[1], "rb", buffering=0) as fh:
        while fh.read(1 << 20):
            pass
except OSError as e:
    sys.exit(0 if e.errno == errno.EIO else f"errno {e.errno}")
sys.exit("read succeeded")
PY
    done
    grep -q "$1" "$mnt.log" || fail "no log line names the missing shard $1: $(cat "$mnt.log")"
    grep -q "model.embed_tokens.weight" "$mnt.log" || fail "no log line names the key"
    grep -q "$2" "$mnt.log" || fail "no log line names the truncated shard $2"
    cmp <("$DCP" cat "$FIXTURES/02_rowwise_4ranks/ckpt" model.tiny) "$mnt/model/tiny" || fail "an intact tensor does not read"
    # all.safetensors: EIO across a damaged tensor, its header and intact tensors still read.
    "$DCP" cat "$FIXTURES/02_rowwise_4ranks/ckpt" model.tiny >"$SCRATCH/tiny"
    python3 "$FUSE_CHECK" eio "$mnt/all.safetensors" model.tiny "$SCRATCH/tiny" model.embed_tokens.weight ||
        fail "all.safetensors over a damaged checkpoint ($mode)"
    unmount_dcpfs "$mnt"
done

# Unmounted (lazily) while a directory and a file are still open: the kernel
# does not release them before the session ends, and the daemon still exits cleanly (in the sanitizer
# build: with nothing leaked, which LeakSanitizer would fail it for).
mnt="$SCRATCH/mlazy"
mount_dcpfs "$FIXTURES/02_rowwise_4ranks/ckpt" "$mnt" -o no_catalog
python3 - "$mnt" "$SCRATCH/held" <<'PY' &
import os, sys, time
d = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
f = os.open(os.path.join(sys.argv[1], "all.safetensors"), os.O_RDONLY)
assert os.listdir(d) and len(os.read(f, 8)) == 8
open(sys.argv[2], "w").close()
time.sleep(30)
PY
holder=$!
for _ in $(seq 100); do [ -e "$SCRATCH/held" ] && break; sleep 0.1; done
[ -e "$SCRATCH/held" ] || fail "the files were not opened through the mount"
fusermount3 -u -z "$mnt" || fail "fusermount3 -u -z $mnt"
kill "$holder" 2>/dev/null || true   # the connection ends with the last open file
wait "$holder" 2>/dev/null || true
timeout 30 tail --pid="$DCPFS_PID" -f /dev/null || fail "dcpfs did not exit after a lazy unmount"
rc=0; wait "$DCPFS_PID" || rc=$?
[ "$rc" -eq 0 ] || fail "dcpfs exited with $rc after a lazy unmount with open files: $(tail -20 "$mnt.log")"

# Not a checkpoint: the mount fails with a message, the ready pipe sees EOF.
bad="$SCRATCH/bad"
mkdir -p "$bad"
printf 'not a pickle' >"$bad/.metadata"
mkdir -p "$SCRATCH/mbad"
mkfifo "$SCRATCH/rbad"
rc=0
"$DCPFS" -f -o ready_fd=3 "$bad" "$SCRATCH/mbad" 3>"$SCRATCH/rbad" 2>"$SCRATCH/bad.log" & bpid=$!
byte=""; read -r -t 30 -n 1 byte <"$SCRATCH/rbad" || true
wait "$bpid" || rc=$?
[ -z "$byte" ] || fail "the ready pipe got a byte for a failed mount"
[ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] || fail "mounting garbage exited with $rc"
grep -q "$bad/.metadata" "$SCRATCH/bad.log" || fail "the error does not name the file: $(cat "$SCRATCH/bad.log")"
mountpoint -q "$SCRATCH/mbad" && fail "garbage got mounted"
expect_fail "usage" "$DCPFS" "$bad"
# A mount point that is a file: refused (the kernel mounted over it, a root answering only EIO);
# a SOURCE that is a file of a checkpoint names the folder to mount (it said "Not a directory").
good="$FIXTURES/05_mixed_2ranks/ckpt"
: >"$SCRATCH/afile"
expect_fail "mount point $SCRATCH/afile: not a folder" timeout 20 "$DCPFS" -f "$good" "$SCRATCH/afile"
mountpoint -q "$SCRATCH/afile" && fail "dcpfs mounted over a file"
expect_fail "$good/.metadata: a file, not a folder: SOURCE is a checkpoint folder" \
    timeout 20 "$DCPFS" -f "$good/.metadata" "$SCRATCH/mbad"
expect_fail "; mount $good instead" timeout 20 "$DCPFS" -f "$good/__0_0.distcp" "$SCRATCH/mbad"
expect_fail "bad mount point" timeout 20 "$DCPFS" -f "$good" "$SCRATCH/no-such-folder"
mountpoint -q "$SCRATCH/mbad" && fail "a file was mounted as SOURCE"
# No FUSE permission (a user other than root where /dev/fuse is root's alone): libfuse's reason, then
# a line naming the mount point and what is needed. Only where that is so and setpriv can switch.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && id nobody >/dev/null 2>&1 &&
   ! setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups sh -c 'test -r /dev/fuse && test -w /dev/fuse' 2>/dev/null; then
    chmod o+x "$SCRATCH"
    cp -r "$good" "$SCRATCH/nobody-src" && chmod -R o+rX "$SCRATCH/nobody-src"
    mkdir -p "$SCRATCH/mnobody" && chown nobody "$SCRATCH/mnobody"
    if setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups test -r "$SCRATCH/nobody-src/.metadata" 2>/dev/null &&
       setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups test -x "$DCPFS" 2>/dev/null; then
        expect_fail "dcpfs: $SCRATCH/mnobody: could not mount $SCRATCH/nobody-src there (the reason: libfuse's line above; a user other than root needs read and write access to /dev/fuse" \
            timeout 20 setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups "$DCPFS" -f -o no_catalog \
            "$SCRATCH/nobody-src" "$SCRATCH/mnobody"
        mountpoint -q "$SCRATCH/mnobody" && fail "mounted without FUSE permission"
    fi
fi
# -o rank=R: a rank-local save (__R.metadata) as rank R's dcp.load reads it, as `dcp --rank R`.
rl="$top_srcdir/tests/data/metadata/pt_ranklocal"
for r in 0 1; do
    mount_dcpfs "$rl" "$SCRATCH/mr$r" -o no_catalog,rank=$r
    [ "$(cd "$SCRATCH/mr$r" && find . -type f ! -name '*.json' ! -name '*.safetensors' | LC_ALL=C sort | tr '\n' ' ')" = \
      "./rank$r/meta/rank ./rank$r/only ./sharded ./shared " ] || fail "-o rank=$r shows rank $r's keys only: $(cd "$SCRATCH/mr$r" && find . -type f)"
    for k in shared rank$r.only rank$r.meta.rank; do
        cmp -s <("$DCP" --rank $r cat "$rl" $k) "$SCRATCH/mr$r/${k//.//}" || fail "-o rank=$r: $k is not dcp --rank $r cat's bytes"
    done
    unmount_dcpfs "$SCRATCH/mr$r"
done
expect_fail "rank 5 saved no rank-local metadata here" timeout 20 "$DCPFS" -f -o no_catalog,rank=5 "$rl" "$SCRATCH/mbad"
for bad in x -1 1x "" 100000001; do
    expect_fail "-o rank=$bad: a rank is a decimal number" timeout 20 "$DCPFS" -f -o rank=$bad "$rl" "$SCRATCH/mbad"
done
mountpoint -q "$SCRATCH/mbad" && fail "a bad -o rank mounted"
"$DCPFS" --version | grep -q "dcpfs version" || fail "--version"
"$DCPFS" --help | grep -q "view=raw|npy" || fail "--help"
echo "ok"
