# dcp convert and dcp synth refuse bad requests with clear messages and leave nothing behind.
. "$top_srcdir/tests/lib.sh"
scratch
F="$FIXTURES/01_single_plain/ckpt"
mkdir "$SCRATCH/exists"
expect_fail "already exists" $DCP convert "$F" "$SCRATCH/exists"
expect_fail "no key matches" $DCP convert --keys 'nope.*' "$F" "$SCRATCH/none.pt"
expect_fail "cannot open" $DCP convert "$SCRATCH/missing" "$SCRATCH/x.pt"
printf 'not a zip' >"$SCRATCH/bad.pt"
expect_fail "bad.pt" $DCP convert "$SCRATCH/bad.pt" "$SCRATCH/y"
printf '\377\377\377\377\377\377\377\377' >"$SCRATCH/bad.safetensors"
expect_fail "out of range" $DCP convert "$SCRATCH/bad.safetensors" "$SCRATCH/z"
expect_fail "without .safetensors" $DCP convert --max-shard-size 1M "$F" "$SCRATCH/s.safetensors"
expect_fail "unknown format" $DCP convert --to zip "$F" "$SCRATCH/q"
expect_fail "bad value" $DCP synth "$SCRATCH/s" --shard diagonal
expect_fail "unknown dtype" $DCP synth "$SCRATCH/s" --dtype float7
expect_fail "too large" $DCP synth "$SCRATCH/s" --total 1G --shape 4294967296,4294967296,16
$DCP synth "$SCRATCH/s" --keys 1 --shape 4
expect_fail "already holds a checkpoint" $DCP synth "$SCRATCH/s" --keys 1 --shape 4
# A destination with trailing slashes names the folder (the man page's example).
$DCP convert -q --max-shard-size 5GB "$F" "$SCRATCH/hf/" || fail "convert to a folder given as hf/"
[ -f "$SCRATCH/hf/model.safetensors.index.json" ] || fail "hf/: no index"
$DCP convert "$F" "$SCRATCH/dcpout//" || fail "convert to a folder given as dcpout//"
[ -f "$SCRATCH/dcpout/.metadata" ] || fail "dcpout//: no .metadata"
if command -v python3 >/dev/null; then
    python3 "$top_srcdir/tests/writer_check.py" $DCP "$SCRATCH/hf" "$FIXTURES/01_single_plain/expected/manifest.json" \
        --no-bytes >/dev/null || fail "hf/: wrong bytes"
    python3 "$top_srcdir/tests/writer_check.py" $DCP "$SCRATCH/dcpout" "$FIXTURES/01_single_plain/expected/manifest.json" \
        >/dev/null || fail "dcpout//: wrong bytes"
fi
# A folder that exists and holds anything (here a rank-local checkpoint's
# file and a safetensors shard, no .metadata) is never written into.
mkdir "$SCRATCH/busy"
printf 'rank-local data' >"$SCRATCH/busy/__0_0.distcp"
printf 'shard bytes' >"$SCRATCH/busy/model.safetensors"
before=$(cd "$SCRATCH/busy" && sha256sum * | sha256sum)
expect_fail "the folder is not empty (it holds" $DCP synth "$SCRATCH/busy" --keys 1 --shape 4
# DST a file: named as such, left as it was (it said "cannot open the checkpoint folder: Not a directory").
echo keep >"$SCRATCH/afile"
expect_fail "$SCRATCH/afile: already exists and is not a folder: a checkpoint is written only into a new or empty folder" \
    $DCP synth "$SCRATCH/afile" --keys 1 --shape 4
[ "$(cat "$SCRATCH/afile")" = keep ] || fail "synth onto a file changed it"
after=$(cd "$SCRATCH/busy" && sha256sum * | sha256sum)
[ "$before" = "$after" ] || fail "synth changed the files of a non-empty folder"
[ "$(ls -A "$SCRATCH/busy" | wc -l)" -eq 2 ] || fail "synth added files to a non-empty folder: $(ls -A "$SCRATCH/busy")"
# An empty folder that exists is fine.
mkdir "$SCRATCH/empty"
$DCP synth "$SCRATCH/empty" --keys 1 --shape 4
[ -f "$SCRATCH/empty/.metadata" ] || fail "synth into an empty folder wrote no .metadata"
# Interrupted (Ctrl-C, a scheduler's SIGTERM): the conversion stops at its next piece, removes
# its hidden temporary (a full-size one was left behind) and ends by the signal (130, 143).
"$DCP" synth "$SCRATCH/s/big" --total 192MiB --ranks 2 --shard cols >/dev/null || fail "synth for the interrupts"
export DCP_RECIPE_PATH="$top_srcdir/recipes"
printf '%s\n' '{"recipe": "t", "rules": [{"from": "model.layers.{L}.weight", "to": "l.{L}.weight"}],' \
    ' "config": {"model_type": "llama"}}' >"$SCRATCH/s/r.json"
mkdir "$SCRATCH/intr"
for run in INT:130:x.safetensors TERM:143:xdcp HUP:129:xs HUP:129:xpt.pt INT:130:hf; do
    sig=${run%%:*} want=${run#*:} want=${want%%:*} dst=${run##*:}
    set --
    case $dst in xs) set -- --max-shard-size 8M ;; hf) set -- --to hf --recipe "$SCRATCH/s/r.json" --dtype bfloat16 ;; esac
    "$DCP" convert -q "$@" "$SCRATCH/s/big" "$SCRATCH/intr/$dst" 2>"$SCRATCH/intr.err" &
    pid=$!
    # the signal once the temporary holds bytes: the writer is mid-way
    i=0
    until [ -n "$(find "$SCRATCH/intr" -name ".$dst.tmp-*" -size +1k 2>/dev/null | head -1)" ] ||
          ! kill -0 $pid 2>/dev/null || [ $i -ge 2000 ]; do
        sleep 0.005; i=$((i + 1))
    done
    kill -$sig $pid 2>/dev/null || fail "$dst: the conversion ended before the signal (make the source bigger)"
    rc=0; wait $pid || rc=$?
    [ $rc = $want ] || fail "$dst: SIG$sig: exit $rc, not $want: $(cat "$SCRATCH/intr.err")"
    grep -q "convert: $SCRATCH/intr/$dst: interrupted" "$SCRATCH/intr.err" || fail "$dst: $(cat "$SCRATCH/intr.err")"
    [ -z "$(ls -A "$SCRATCH/intr")" ] || fail "$dst: SIG$sig left behind: $(ls -A "$SCRATCH/intr")"
done
# dcp synth interrupted the same way: it stops at its next key or piece and removes what it
# wrote (the folder was left with its shard files): DST itself when it made the folder, the
# files only when given an empty one, which stays.
for run in INT:130:new TERM:143:given HUP:129:many; do
    sig=${run%%:*} want=${run#*:} want=${want%%:*} dst=${run##*:}
    [ $dst != given ] || mkdir "$SCRATCH/intr/given"
    case $dst in
    new) set -- --keys 1 --shape 65536,32768 ;;             # one 8 GiB chunk: between its pieces
    given) set -- --total 4GiB --shape 2048,2048 --ranks 2 ;;
    many) set -- --keys 5000000 --shape 0 --ranks 3 ;;     # between keys of no bytes
    esac
    "$DCP" synth "$SCRATCH/intr/$dst" "$@" 2>"$SCRATCH/intr.err" &
    pid=$!
    i=0
    until [ -n "$(find "$SCRATCH/intr/$dst" -name '*.distcp' -size +1k 2>/dev/null | head -1)" ] ||
          ! kill -0 $pid 2>/dev/null || [ $i -ge 2000 ]; do
        sleep 0.005; i=$((i + 1))
    done
    kill -$sig $pid 2>/dev/null || fail "synth $dst: it ended before the signal (make it bigger)"
    if [ $dst = new ]; then   # stopped at its next piece (1 MiB), not at the end of the chunk
        sleep 1
        f="$SCRATCH/intr/new/__0_0.distcp"
        if [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 268435456 ]; then
            kill -KILL $pid
            fail "synth new: still writing its chunk 1 s after SIG$sig"
        fi
    fi
    rc=0; wait $pid || rc=$?
    [ $rc = $want ] || fail "synth $dst: SIG$sig: exit $rc, not $want: $(cat "$SCRATCH/intr.err")"
    grep -q "synth: $SCRATCH/intr/$dst: interrupted" "$SCRATCH/intr.err" || fail "synth $dst: $(cat "$SCRATCH/intr.err")"
    if [ $dst = given ]; then
        [ -d "$SCRATCH/intr/given" ] || fail "synth removed the empty folder it was given"
        [ -z "$(ls -A "$SCRATCH/intr/given")" ] || fail "synth given: SIG$sig left: $(ls -A "$SCRATCH/intr/given")"
        rmdir "$SCRATCH/intr/given"
    fi
    [ -z "$(ls -A "$SCRATCH/intr")" ] || fail "synth $dst: SIG$sig left behind: $(ls -A "$SCRATCH/intr")"
done
rm -rf "$SCRATCH/s/big" "$SCRATCH/intr" "$SCRATCH/intr.err"
# A signal while .metadata is written (the last step before it is renamed into place) stops synth
# and convert as an earlier one does: nothing left, exit by the signal. (They went on: a complete
# checkpoint and exit 0.) The command is frozen (SIGSTOP) at a moment .metadata.tmp exists and
# .metadata does not, sent the signal, and let go. Once .metadata is in place it is complete:
# exit 0 is right then, so a run that got past it before the freeze is tried again (10 times).
# at_metadata SIG WANT TMPGLOB FINAL CMD...: TMPGLOB the .metadata.tmp (a glob), FINAL the .metadata
at_metadata() {
    local sig=$1 want=$2 tmpglob=$3 final=$4 try i pid rc state caught f
    shift 4
    for try in 1 2 3 4 5 6 7 8 9 10; do
        "$@" 2>"$SCRATCH/fin.err" &
        pid=$!
        caught=
        for ((i = 0; i < 20000; i++)); do
            for f in $tmpglob; do
                [ -e "$f" ] || continue
                kill -STOP $pid 2>/dev/null || break
                state=
                until [ "$state" = T ] || [ ! -e /proc/$pid/stat ]; do read -r _ _ state _ </proc/$pid/stat || break; done
                if [ "$state" = T ] && [ -e "$f" ] && [ ! -e "$final" ]; then
                    kill -$sig $pid && caught=1
                fi
                kill -CONT $pid
                break 2
            done
            kill -0 $pid 2>/dev/null || break
            sleep 0.001
        done
        rc=0; wait $pid || rc=$?
        if [ -n "$caught" ]; then
            [ $rc = $want ] || fail "$*: SIG$sig while .metadata was written: exit $rc, not $want: $(cat "$SCRATCH/fin.err")"
            grep -q ": interrupted (" "$SCRATCH/fin.err" || fail "$*: SIG$sig: $(cat "$SCRATCH/fin.err")"
            echo "dcp $2: SIG$sig while .metadata was written (run $try): exit $rc"
            return 0
        fi
        [ $rc = 0 ] || fail "$*: exit $rc: $(cat "$SCRATCH/fin.err")"
        rm -rf "$SCRATCH/fin"
        mkdir "$SCRATCH/fin"
    done
    fail "$*: never caught while .metadata.tmp existed in 10 runs (make it bigger)"
}
mkdir "$SCRATCH/fin"
at_metadata TERM 143 "$SCRATCH/fin/s/.metadata.tmp" "$SCRATCH/fin/s/.metadata" \
    "$DCP" synth "$SCRATCH/fin/s" --keys 20000 --shape 1 --dtype int8
[ -z "$(ls -A "$SCRATCH/fin")" ] || fail "synth: SIGTERM while .metadata was written left: $(ls -A "$SCRATCH/fin")"
"$DCP" synth "$SCRATCH/many" --keys 20000 --shape 1 --dtype int8 || fail "synth for convert's .metadata"
at_metadata INT 130 "$SCRATCH/fin/.c.tmp-*/.metadata.tmp" "$SCRATCH/fin/c" \
    "$DCP" convert -q --no-sync "$SCRATCH/many" "$SCRATCH/fin/c"
[ -z "$(ls -A "$SCRATCH/fin")" ] || fail "convert: SIGINT while .metadata was written left: $(ls -A "$SCRATCH/fin")"
rm -rf "$SCRATCH/fin" "$SCRATCH/many" "$SCRATCH/fin.err"
# A shape the writer refuses (its strides overflow int64, torch.empty's own refusal, a 0 in it or
# not; or more than 2^59 elements) is refused by synth up front, naming DST and the shape, before
# anything is created: DST's missing parent is not the error, a folder given stays empty. (It
# failed at the first chunk, naming only the key; a synth that fails part way, a full disk, is in
# tests/writer-synth-full.sh.) An empty shape whose strides fit is torch's: written, 0 bytes.
for shape in 0,9223372036854775807 4611686018427387904,0; do
    $DCP synth "$SCRATCH/nothing" --keys 2 --shape $shape --ranks 4 --shard cols --dtype float64 >/dev/null ||
        fail "synth --shape $shape (no element) failed"
    got=$($DCP --no-catalog ls "$SCRATCH/nothing" | awk 'NR > 1 { print $1, $3, $4, $5 }' | tr '\n' ';')
    [ "$got" = "model.layers.0.weight [$shape] 0 B;model.layers.1.weight [$shape] 0 B;" ] || fail "synth --shape $shape lists as: $got"
    [ "$($DCP --no-catalog cat "$SCRATCH/nothing" model.layers.1.weight | wc -c)" = 0 ] || fail "synth --shape $shape: cat not empty"
    rm -rf "$SCRATCH/nothing"
done
for shape in 0,9223372036854775807,2 4611686018427387904,2,0 3,4294967296,4294967296; do
    expect_fail "$SCRATCH/nodir/part: shape [$shape]: too large (its strides or element count overflow)" \
        $DCP synth "$SCRATCH/nodir/part" --keys 2 --shape $shape --ranks 4 --shard cols
    expect_fail "$SCRATCH/part: shape [$shape]: too large" $DCP synth "$SCRATCH/part" --total 1M --shape $shape
    [ ! -e "$SCRATCH/part" ] || fail "a refused synth created $SCRATCH/part: $(ls -A "$SCRATCH/part")"
    mkdir "$SCRATCH/part"
    expect_fail "$SCRATCH/part: shape [$shape]: too large" $DCP synth "$SCRATCH/part" --keys 2 --shape $shape
    [ -z "$(ls -A "$SCRATCH/part")" ] || fail "a refused synth wrote in the folder given: $(ls -A "$SCRATCH/part")"
    rmdir "$SCRATCH/part"
done
[ ! -e "$SCRATCH/nodir" ] || fail "a refused synth created $SCRATCH/nodir"
# Chunks are bounded before anything is written (DCP_SYNTH_CHUNKS_MAX, 2^24): a zero-size key has
# no bytes but costs a chunk's record in memory and a torch.save archive on disk; a huge --keys
# ran on without end. The count is of the chunks a key is written as (compared with a small one).
to=
command -v timeout >/dev/null && to="timeout 10"
for run in 1:0:rows:1 3:0:rows:1 4:10,7:rows:2 4:10,7:cols:1 6:5,9,3:blocks:2 3:33:replicated:5 2:scalar:rows:1; do
    r=${run%%:*} shape=${run#*:} shape=${shape%%:*} shard=${run#*:*:} shard=${shard%%:*} cpk=${run##*:}
    set -- --shape $shape --ranks $r --shard $shard --chunks-per-key $cpk --dtype int8
    $DCP synth "$SCRATCH/few" --keys 2 "$@" >/dev/null || fail "synth --keys 2 $*"
    n=$($DCP --no-catalog ls --json "$SCRATCH/few" | sed -n 's/.*"chunks": *\([0-9]*\).*/\1/p' | head -1)
    rm -rf "$SCRATCH/few"
    [ "$n" = 1 ] && s= || s=s
    expect_fail "too many chunks: 100000000000 keys of $n chunk$s each and 0 bytes items, past the limit of 16777216" \
        $to $DCP synth "$SCRATCH/huge" --keys 100000000000 "$@"
    [ ! -e "$SCRATCH/huge" ] || fail "a refused synth created $SCRATCH/huge"
done
expect_fail "16777216 keys of 1 chunk each and 1 bytes items" $to $DCP synth "$SCRATCH/huge" --keys 16777216 \
    --shape 0 --bytes-items 1
expect_fail "too many chunks" $to $DCP synth "$SCRATCH/huge" --total 1T --shape 1 --dtype int8
[ ! -e "$SCRATCH/huge" ] || fail "a refused synth created $SCRATCH/huge"
# A DST name of 250 bytes (its temporary's name is cut to stay one name of at most 255).
long=$(printf 'n%.0s' $(seq 1 247)).pt
"$DCP" convert -q "$F" "$SCRATCH/$long" || fail "a DST name of ${#long} bytes"
[ -f "$SCRATCH/$long" ] || fail "no $long"
rm -f "$SCRATCH/$long"
# Failed conversions leave no output and no temporary.
left=$(ls -A "$SCRATCH" | grep -v -e '^exists$' -e '^bad\.' -e '^s$' -e '^busy$' -e '^afile$' -e '^empty$' -e '^hf$' -e '^dcpout$' || true)
[ -z "$left" ] || fail "left behind: $left"
echo ok
