# dcpfs.torch.load under real torchrun (2 gloo ranks): a failure on one rank
# ends the load on every rank with the same DcpError naming that rank, and
# the ranks stay in step for the next load (never a hang, never one rank
# raising while its peer waits for its messages): rank 1 out of address space
# mid-load, passing a copy with a shard cut short, asking for an unknown key,
# lacking the class of a stored object; rank 1 outside the process group;
# rank 1 killed: torchrun ends non-zero. The checkpoint folder is never
# written to. Worker: tests/load_torchrun.py.
. "$top_srcdir/tests/python_lib.sh"
use_python_package torch
need torchrun
need timeout
scratch
W="$top_srcdir/tests/load_torchrun.py"
CK=$SCRATCH/ck
python3 "$W" make "$CK" 2>"$SCRATCH/err" || fail "saving the checkpoint: $(cat "$SCRATCH/err")"
cp -r "$CK" "$SCRATCH/other"
truncate -s 5000 "$SCRATCH/other/__0_0.distcp"
snapshot() { (cd "$CK" && find . -printf '%p %s %T@ %m\n' | LC_ALL=C sort && cat .metadata ./*.distcp | cksum); }
snapshot >"$SCRATCH/before"

# torchrun_cases CASES: one torchrun job; its status in RC, every rank's lines in $SCRATCH/out
torchrun_cases() {
    RC=0
    OMP_NUM_THREADS=1 timeout -k 10 150 torchrun --standalone --nproc-per-node 2 "$W" "$CK" "$SCRATCH/other" "$1" \
        >"$SCRATCH/out" 2>"$SCRATCH/log" || RC=$?
    [ "$RC" -ne 124 ] && [ "$RC" -ne 137 ] ||
        fail "torchrun $1 hung (killed by timeout): $(grep RESULT "$SCRATCH/out"; tail -20 "$SCRATCH/log")"
}
# result RANK CASE: that rank's line's tail
result() { sed -n "s/^RESULT $1 $2 //p" "$SCRATCH/out"; }
# agreed CASE WANT...: both ranks raised the same DcpError, containing every WANT
agreed() {
    local c=$1 r0 r1; shift
    r0=$(result 0 "$c"); r1=$(result 1 "$c")
    [ -n "$r0" ] && [ -n "$r1" ] || fail "$c: a rank gave no result: $(cat "$SCRATCH/out"; tail -20 "$SCRATCH/log")"
    [ "$r0" = "$r1" ] || fail "$c: the ranks disagree: rank 0: $r0 / rank 1: $r1"
    case "$r0" in "error DcpError: "*) ;; *) fail "$c: not an agreed DcpError: $r0" ;; esac
    for w in "$@"; do
        case "$r0" in *"$w"*) ;; *) fail "$c: the error lacks '$w': $r0" ;; esac
    done
    echo "$c: $r0"
}
clean() {
    [ "$(result 0 "$1")" = ok ] && [ "$(result 1 "$1")" = ok ] ||
        fail "$1: the load after the failures: rank 0: $(result 0 "$1") / rank 1: $(result 1 "$1")"
}

torchrun_cases enomem,clean,other,badkey,unpickle,subgroup,clean2
[ "$RC" -eq 0 ] || fail "torchrun exited $RC: $(tail -20 "$SCRATCH/log")"
# out of memory on rank 1 while the plan runs (its read threads cannot start)
agreed enomem "rank 1: $CK" "can't start new thread"
clean clean
agreed other "rank 1 passes another checkpoint than rank 0: $SCRATCH/other (rank 0: $CK): __0_0.distcp: 5000 bytes on rank 1, "
agreed badkey "rank 1: $CK: no.such.key: no such key in the checkpoint"
# a stored object whose class rank 1 lacks: every rank raises, none returns
agreed unpickle "rank 1: $CK: obj: AttributeError: Can't get attribute 'Obj'"
# a group of rank 0 alone: rank 0 loads, rank 1 (outside it) is told so
[ "$(result 0 subgroup)" = ok ] || fail "subgroup: rank 0: $(result 0 subgroup)"
[ "$(result 1 subgroup)" = "error ValueError: dcpfs.torch.load: this rank (global rank 1) is not in process_group: call it on the group's ranks only" ] ||
    fail "subgroup: rank 1: $(result 1 subgroup)"
clean clean2

# rank 1 killed: the job ends, non-zero, and rank 0 does not report a load
torchrun_cases clean,kill
[ "$RC" -ne 0 ] || fail "kill: torchrun exited 0 with a rank killed"
clean clean
case "$(result 0 kill)" in error*|"") ;; *) fail "kill: rank 0 reports $(result 0 kill)" ;; esac
grep -q "SIGKILL\|exitcode: -9" "$SCRATCH/log" || fail "kill: torchrun does not name the killed rank: $(tail "$SCRATCH/log")"

snapshot >"$SCRATCH/after"
cmp -s "$SCRATCH/before" "$SCRATCH/after" ||
    fail "the checkpoint folder changed: $(diff "$SCRATCH/before" "$SCRATCH/after")"
