#!/bin/bash
# dcpfs over a run folder where saves come and go, as beside a long training
# run: a step folder that is partial (shard files, no .metadata) while its
# save runs is listed and stat'ed under .partial, then completes or is
# removed, again and again. Each partial folder's node is freed once it left
# .partial and the kernel forgot it (dcpfs tells the kernel to drop the
# name): the mount's node count (statfs f_files, `stat -f -c %c`) comes back
# to what it was; it used to grow by one node a save, kept until unmount. A
# partial folder whose name and reason stay the same keeps its node (inode);
# one the kernel still holds (a process's working directory in it) is kept,
# and answers stat, until that process lets go, while lookups and listings
# in another process churn .partial; then it is freed too. With -o opendir
# (every listing asked for) and without (listings the kernel caches).
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need_fuse
fuse_scratch
S=$SCRATCH src="$S/runs" mnt="$S/mnt"
"$DCP" --no-catalog synth "$S/full" --keys 2 --shape 8,4 --ranks 2 --shard rows --seed 5 >/dev/null || fail "dcp synth"
mkdir -p "$src/run"
cp -r "$S/full" "$src/run/step_0"

nodes() { mount_nodes "$mnt"; }
# wait_nodes N WHAT: the count comes back to N once the kernel's FORGETs are in
wait_nodes() { wait_mount_nodes "$mnt" "$1" "$2 ($mode)"; }
# Without -o opendir the kernel keeps a listing until the folder's attributes
# (at most a second old) say it changed: wait that second after a change.
settle() { [ "$mode" = opendir ] || sleep 1.1; }
partial() { mkdir "$src/run/$1"; cp "$S/full"/*.distcp "$src/run/$1/"; settle; }
lists() { [ "$(ls -A "$1" 2>&1)" = "$2" ] || fail "$1 lists ($mode): $(ls -A "$1" 2>&1 | tr '\n' ' ')"; }

for mode in opendir default; do
    if [ $mode = opendir ]; then saves=40; mount_dcpfs "$src" "$mnt" -o no_catalog,opendir
    else saves=8; mount_dcpfs "$src" "$mnt" -o no_catalog; fi
    lists "$mnt/run" step_0
    # the first partial folder makes .partial, whose node stays: one more than now is
    # the count to come back to
    base=$(nodes)
    [ -n "$base" ] && [ "$base" -gt 0 ] || fail "statfs gives no node count: '$base'"
    base=$((base + 1))
    partial step_1
    lists "$mnt/run" "$(printf '.partial\nstep_0')"
    lists "$mnt/run/.partial" step_1
    ino=$(stat -c %i "$mnt/run/.partial/step_1")
    sleep 1.2   # past the kernel's entry and attribute timeouts: dcpfs is asked again
    lists "$mnt/run/.partial" step_1
    [ "$(stat -c %i "$mnt/run/.partial/step_1")" = "$ino" ] ||
        fail "the same partial folder got another inode: $(stat -c %i "$mnt/run/.partial/step_1"), $ino before"
    rm -rf "$src/run/step_1"; settle
    lists "$mnt/run" step_0
    wait_nodes "$base" "step_1 removed"

    # saves: partial, listed and looked up in .partial, then complete (and removed,
    # as a run keeping its last checkpoints does) or removed while partial
    for i in $(seq 2 $((saves + 1))); do
        partial "step_$i"
        lists "$mnt/run/.partial" "step_$i"
        stat "$mnt/run/.partial/step_$i" >/dev/null || fail "stat .partial/step_$i"
        [ -d "$mnt/run/.partial/step_$i" ] || fail ".partial/step_$i is not a directory"
        if [ $((i % 2)) = 0 ]; then
            cp "$S/full/.metadata" "$src/run/step_$i/"; settle
            lists "$mnt/run" "$(printf 'step_0\nstep_%s' "$i")"   # .partial is gone with it
        fi
        rm -rf "$src/run/step_$i"; settle
        lists "$mnt/run" step_0
    done
    wait_nodes "$base" "after $saves saves that were partial a while"

    # a partial folder the kernel holds (a working directory in it) outlives its
    # leaving .partial, and is freed once let go
    partial step_50
    lists "$mnt/run/.partial" step_50
    held=$(stat -c %i "$mnt/run/.partial/step_50")
    (cd "$mnt/run/.partial/step_50" && exec sleep 120) &
    spid=$!
    DAEMONS+=("$spid")
    for t in $(seq 50); do [ "$(readlink "/proc/$spid/cwd" 2>/dev/null)" = "$mnt/run/.partial/step_50" ] && break; sleep 0.1; done
    rm -rf "$src/run/step_50"; settle
    lists "$mnt/run" step_0
    # meanwhile: lookups and listings of .partial while partial folders come and go
    (
        set +e   # names come and go meanwhile
        for i in $(seq 60 99); do
            ls -A "$mnt/run/.partial" >/dev/null 2>&1
            stat "$mnt/run/.partial/step_$i" "$mnt/run/.partial/step_$((i - 1))" >/dev/null 2>&1
            getfattr -n user.dcp.partial "$mnt/run/.partial/step_$i" >/dev/null 2>&1
        done
    ) &
    lpid=$!
    for i in $(seq 60 99); do
        mkdir "$src/run/step_$i"; cp "$S/full"/*.distcp "$src/run/step_$i/"
        ls -A "$mnt/run/.partial" >/dev/null 2>&1 || true   # without opendir: maybe a listing a second old
        stat "$mnt/run/.partial/step_$i" >/dev/null 2>&1 || true
        rm -rf "$src/run/step_$i"
        ls -A "$mnt/run" >/dev/null
    done
    wait "$lpid" || true
    settle
    lists "$mnt/run" step_0
    for t in 1 2 3; do
        [ "$(stat -c %i "/proc/$spid/cwd/")" = "$held" ] ||
            fail "the held partial folder: inode $(stat -c %i "/proc/$spid/cwd/" 2>&1), $held expected"
        sleep 0.5
    done
    [ "$(nodes)" -gt "$base" ] || fail "the held partial folder's node was freed while the kernel holds it"
    kill "$spid"; wait "$spid" 2>/dev/null || true
    wait_nodes "$base" "once the held partial folder was let go"
    unmount_dcpfs "$mnt"
done
echo "ok"
