# Helpers for the dcpfs tests (sourced after tests/lib.sh). They really mount:
# a test skips (77) when /dev/fuse or fusermount3 is missing or mounting is
# not permitted. Mounts wait for readiness on a pipe (-o ready_fd), never poll,
# and are always unmounted by the EXIT trap.
DCPFS="$top_builddir/dcpfs"
FUSE_CHECK="$top_srcdir/tests/fuse_check.py"
MOUNTS=()
DAEMONS=()

need_fuse() {
    [ -c /dev/fuse ] || skip "/dev/fuse is missing"
    command -v fusermount3 >/dev/null 2>&1 || skip "fusermount3 is not installed"
    [ -x "$DCPFS" ] || fail "$DCPFS was not built"
}

# A scratch folder; the trap unmounts everything we mounted, then removes it.
fuse_scratch() {
    SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/dcpfs-test.XXXXXX")
    trap fuse_cleanup EXIT
}

fuse_cleanup() {
    local m p
    for m in "${MOUNTS[@]}"; do
        mountpoint -q "$m" 2>/dev/null && { fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null; }
    done
    for p in "${DAEMONS[@]}"; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    rm -rf "$SCRATCH"
}

# mount_dcpfs SOURCE MOUNTPOINT [dcpfs options...]: start dcpfs in the
# foreground (its pid in DCPFS_PID, its stderr in MOUNTPOINT.log) and wait
# until the mount answers.
mount_dcpfs() {
    local src=$1 mnt=$2; shift 2
    mkdir -p "$mnt"
    local fifo="$mnt.ready" log="$mnt.log"
    rm -f "$fifo"; mkfifo "$fifo"
    "$DCPFS" -f -o ready_fd=3 "$@" "$src" "$mnt" 3>"$fifo" 2>"$log" &
    DCPFS_PID=$!
    DAEMONS+=("$DCPFS_PID")
    MOUNTS+=("$mnt")
    local byte=""
    read -r -t 60 -n 1 byte <"$fifo" || true
    rm -f "$fifo"
    if [ "$byte" != 1 ]; then
        wait "$DCPFS_PID" 2>/dev/null || true
        if grep -qiE "fuse: device not found|permission denied|operation not permitted|fusermount.*not found" "$log"; then
            skip "mounting is not permitted here: $(head -3 "$log")"
        fi
        fail "dcpfs $* $src $mnt did not mount: $(cat "$log")"
    fi
}

# mount_nodes MOUNTPOINT: how many nodes dcpfs holds (statfs f_files).
mount_nodes() { stat -f -c %c "$1"; }
# wait_mount_nodes MOUNTPOINT N WHAT: the count comes back to N within 10 s
# (once the kernel's FORGETs are in), else fail naming WHAT.
wait_mount_nodes() {
    local t
    for t in $(seq 100); do
        [ "$(mount_nodes "$1")" = "$2" ] && return 0
        sleep 0.1
    done
    fail "$3: $(mount_nodes "$1") nodes, $2 expected"
}

# unmount_dcpfs MOUNTPOINT: unmount and check the daemon is gone.
unmount_dcpfs() {
    local mnt=$1 pid=${2:-$DCPFS_PID}
    fusermount3 -u "$mnt" || fail "fusermount3 -u $mnt failed"
    local rc=0
    wait "$pid" || rc=$?
    [ "$rc" -eq 0 ] || fail "dcpfs exited with status $rc after unmount: $(cat "$mnt.log")"
    kill -0 "$pid" 2>/dev/null && fail "dcpfs (pid $pid) is still running after unmount"
    ! mountpoint -q "$mnt" || fail "$mnt is still mounted"
    return 0
}

# All fixture cases: the bundled ones, and 06/07 when the shared folder is present.
fixture_cases() {
    local c
    for c in "$FIXTURES"/*/; do echo "${c%/}"; done
    for c in 06_throughput_single 07_many_keys; do
        if [ -d "$SHARED_FIXTURES/$c/ckpt" ]; then echo "$SHARED_FIXTURES/$c"; else echo "(no $c: $SHARED_FIXTURES is absent)" >&2; fi
    done
}
