#!/bin/bash
# dcpfs over a run that keeps only its last saves, as Hugging Face's Trainer
# does with save_total_limit: each save is a folder (checkpoint-N) holding DCP
# folders (pytorch_model_fsdp_0, optimizer_0), a plain file and, while it is
# written, a partial one; the oldest save folder is removed whole. A scan
# folder that leaves its parent's listing gives up what lies below it: its
# checkpoints are retired (their models freed once nothing uses them), its
# .partial nodes too, and its own scan folders in turn. Only the folder's
# node, its .partial node and its plain files stay until unmount: the
# mount's node count (statfs f_files, `stat -f -c %c`) grows by those three
# a removed save, not by every key read (it used to keep all of them, and
# each model opened, until unmount). A save made again under a removed name
# reads its new bytes. A process working in a removed save (its working
# directory in a checkpoint's folder there, looking up names in it after the
# removal) or holding a folder of one open (no -o opendir: dcpfs sees no
# close) keeps that checkpoint, which answers lookups and reads, until it
# lets go; then it is freed: dcpfs tells the kernel to drop the names of a
# retired checkpoint's folders, and each name looked up in one (it used to
# drop only the checkpoint's own name, and the kernel kept such folders, and
# the model, until memory ran short). A process working in a removed save
# folder finds it empty, even once a save is made again under its name.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need_fuse
fuse_scratch
S=$SCRATCH src="$S/runs" mnt="$S/mnt"
mkdir "$S/a" "$S/b"
"$DCP" --no-catalog synth "$S/a/model" --keys 3 --shape 8,4 --ranks 2 --shard rows --seed 5 >/dev/null || fail "dcp synth"
"$DCP" --no-catalog synth "$S/a/optim" --keys 2 --shape 16 --ranks 2 --seed 6 >/dev/null || fail "dcp synth"
"$DCP" --no-catalog synth "$S/b/model" --keys 3 --shape 8,4 --ranks 2 --shard rows --seed 7 >/dev/null || fail "dcp synth"
mkdir -p "$src/run"
keys="model.layers.0.weight model.layers.1.weight model.layers.2.weight"

# save N [a|b]: checkpoint-N as the Trainer writes it, with a partial folder
save() {
    local d="$src/run/checkpoint-$1"
    mkdir "$d"
    cp -r "$S/${2:-a}/model" "$d/pytorch_model_fsdp_0"
    cp -r "$S/a/optim" "$d/optimizer_0"
    mkdir "$d/optimizer_1" && cp "$S/a/optim"/*.distcp "$d/optimizer_1/"   # still being written
    echo '{"global_step": '"$1"'}' >"$d/trainer_state.json"
}
# read N [a|b]: every key of both checkpoints of checkpoint-N through the mount
# equals dcp cat's bytes; .partial lists the partial folder
read_save() {
    local d="$mnt/run/checkpoint-$1" k
    [ "$(ls -A "$d")" = "$(printf '.partial\noptimizer_0\npytorch_model_fsdp_0\ntrainer_state.json')" ] ||
        fail "checkpoint-$1 lists: $(ls -A "$d" 2>&1 | tr '\n' ' ')"
    [ "$(ls -A "$d/.partial")" = optimizer_1 ] || fail "checkpoint-$1/.partial lists: $(ls -A "$d/.partial" 2>&1)"
    stat "$d/.partial/optimizer_1" >/dev/null || fail "stat checkpoint-$1/.partial/optimizer_1"
    for k in $keys; do
        cmp -s <("$DCP" --no-catalog cat "$S/${2:-a}/model" "$k") "$d/pytorch_model_fsdp_0/${k//.//}" ||
            fail "checkpoint-$1: $k differs from dcp cat"
    done
    find "$d/optimizer_0" -type f -exec cat {} + >/dev/null || fail "checkpoint-$1: reading optimizer_0"
}
nodes() { mount_nodes "$mnt"; }
wait_nodes() { wait_mount_nodes "$mnt" "$@"; }
removed() { rm -rf "$src/run/checkpoint-$1"; sleep 1.1; ls "$mnt/run" >/dev/null; }   # listed after the kernel's second

save 0
mount_dcpfs "$src" "$mnt" -o no_catalog
read_save 0
base=$(nodes)
[ -n "$base" ] && [ "$base" -gt 0 ] || fail "statfs gives no node count: '$base'"
# eight saves, the last two kept (save_total_limit=2), each read whole before
# the next; then the two kept ones removed too
gone=0
for n in $(seq 1 8); do
    save "$n"
    read_save "$n"
    [ "$(nodes)" -gt $((base + 3 * gone)) ] || fail "checkpoint-$n read: $(nodes) nodes"
    if [ "$n" -ge 3 ]; then
        removed $((n - 2))
        gone=$((gone + 1))
        [ -e "$mnt/run/checkpoint-$((n - 2))" ] && fail "the removed checkpoint-$((n - 2)) is still shown"
    fi
done
removed 7; removed 8; gone=$((gone + 2))
[ "$(ls -A "$mnt/run")" = checkpoint-0 ] || fail "run lists: $(ls -A "$mnt/run" | tr '\n' ' ')"
wait_nodes $((base + 3 * gone)) "after $gone saves removed"
read_save 0

# a save made again under a removed name, with other bytes: a new folder node,
# read anew (the removed one's checkpoints are not reused)
save 1 b
sleep 1.1
read_save 1 b

# processes in a removed save keep its checkpoints, which answer lookups,
# until they let go: one working in a folder of one (and looking up names
# there after the removal), one holding a folder of the other open (no
# -o opendir: the kernel tells dcpfs of no open or close of it)
(cd "$mnt/run/checkpoint-1/pytorch_model_fsdp_0/model/layers" 2>"$S/cd.err" && exec sleep 120) &
spid=$!
DAEMONS+=("$spid")
python3 -c 'import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY); print(flush=True); time.sleep(120)' \
    "$mnt/run/checkpoint-1/optimizer_0/model/layers" >"$S/held" &
opid=$!
DAEMONS+=("$opid")
for t in $(seq 50); do
    [ -n "$(readlink "/proc/$spid/cwd" 2>/dev/null | grep layers)" ] && [ -s "$S/held" ] && break
    sleep 0.1
done
readlink "/proc/$spid/cwd" 2>/dev/null | grep -q layers ||
    fail "a shell did not cd into checkpoint-1/pytorch_model_fsdp_0/model/layers: $(cat "$S/cd.err")"
[ -s "$S/held" ] || fail "python did not open optimizer_0/model/layers"
removed 1; gone=$((gone + 1))
[ -e "$mnt/run/checkpoint-1" ] && fail "the removed checkpoint-1 is still shown"
sleep 0.5
cmp -s <("$DCP" --no-catalog cat "$S/b/model" model.layers.0.weight) "/proc/$spid/cwd/0/weight" ||
    fail "a held checkpoint's file differs from dcp cat after its folder was removed"
stat "/proc/$spid/cwd/1" >/dev/null || fail "a held checkpoint's folder does not answer a lookup"
[ -e "/proc/$spid/cwd/nothing" ] && fail "a held checkpoint's folder has a name it does not have"
ls "/proc/$opid/fd/3/" >/dev/null || fail "a checkpoint folder held open does not list"
[ "$(nodes)" -gt $((base + 3 * gone)) ] || fail "the held checkpoints' nodes were freed while the kernel holds them"
kill "$spid"; wait "$spid" 2>/dev/null || true
sleep 0.5
[ "$(nodes)" -gt $((base + 3 * gone)) ] || fail "the folder held open was freed while open"
kill "$opid"; wait "$opid" 2>/dev/null || true
wait_nodes $((base + 3 * gone)) "once the held checkpoints were let go"

# a process working in a save folder that is removed, then saved again under its name: the
# folder it works in lists nothing from then on (as a removed folder does; it used to list
# the new save and open its checkpoints under a node nothing retires), the new save reads
# its own bytes under the name, and once it is removed too only the six nodes of the two
# removed folders stay
save 5
sleep 1.1
read_save 5
(cd "$mnt/run/checkpoint-5" 2>"$S/cd.err" && exec sleep 120) &
spid=$!
DAEMONS+=("$spid")
for t in $(seq 50); do
    [ -n "$(readlink "/proc/$spid/cwd" 2>/dev/null | grep checkpoint-5)" ] && break
    sleep 0.1
done
readlink "/proc/$spid/cwd" 2>/dev/null | grep -q checkpoint-5 ||
    fail "a shell did not cd into checkpoint-5: $(cat "$S/cd.err")"
removed 5; gone=$((gone + 1))
save 5 b
sleep 1.1
read_save 5 b
stale=$(ls -A "/proc/$spid/cwd" 2>&1) || fail "a removed save folder a process works in: ls fails: $stale"
[ -z "$stale" ] || fail "a removed save folder a process works in lists the new save's: $(echo $stale)"
[ -e "/proc/$spid/cwd/pytorch_model_fsdp_0" ] && fail "a removed save folder a process works in has the new save's checkpoint"
kill "$spid"; wait "$spid" 2>/dev/null || true
removed 5; gone=$((gone + 1))
wait_nodes $((base + 3 * gone)) "a save folder removed while a process worked in it, saved again and removed"
unmount_dcpfs "$mnt"
echo "ok"
