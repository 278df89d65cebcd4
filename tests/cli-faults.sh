# The CLI while the checkpoint changes under it: `dcp convert`, `dcp cat` and
# `dcp verify` run over and over while a shard is truncated, deleted, or the
# .metadata and shards are replaced by another checkpoint's by rename. Each
# run ends within 10 s with output equal to one version's (the original's
# or, for a replacement, the new one's) or an error: a failed convert leaves
# no output file, half-written or temporary, and verify never says OK of a
# changed checkpoint it could not read. (Without a hook to slow them, the
# fault lands before, during or after the first runs; the later ones meet
# the changed files.)
# Known and counted, not failed: a replacement by rename that lands between
# dcp_open's read of the metadata and its record of the data files'
# identities (after that, a replaced shard reads as EIO) can give a run
# bytes mixed from both versions (each chunk whole from one of them).
# Bytes in neither fail.
. "$top_srcdir/tests/lib.sh"
need timeout
scratch
A=$SCRATCH/a B=$SCRATCH/b
"$DCP" synth "$A" --keys 8 --shape 2048,1024 --ranks 2 --seed 1 >/dev/null || fail "dcp synth"
"$DCP" synth "$B" --keys 8 --shape 2048,1024 --ranks 2 --seed 2 >/dev/null || fail "dcp synth"
key=model.layers.5.weight
for v in a b; do
    "$DCP" convert --quiet --no-sync "$SCRATCH/$v" "$SCRATCH/$v.safetensors" >/dev/null || fail "dcp convert $v"
    "$DCP" cat "$SCRATCH/$v" "$key" >"$SCRATCH/$v.bytes" || fail "dcp cat $v"
done
shard=__1_0.distcp

# strike NAME CK: the fault on checkpoint CK
strike() {
    case $1 in
    truncate) truncate -s $(($(stat -c %s "$2/$shard") / 2)) "$2/$shard" ;;
    delete) rm -f "$2/$shard" ;;
    replace)
        local f
        for f in "$B"/* "$B"/.metadata; do cp "$f" "$2/.new.$(basename "$f")"; done
        for f in "$B"/* "$B"/.metadata; do mv "$2/.new.$(basename "$f")" "$2/$(basename "$f")"; done ;;
    esac
}

# half_of FILE N: half N (1 or 2) of FILE equals that half of a.bytes or b.bytes
half_of() {
    local n=$(($(stat -c %s "$SCRATCH/a.bytes") / 2)) v
    for v in a b; do
        if [ "$2" = 1 ]; then
            cmp -s <(head -c "$n" "$1") <(head -c "$n" "$SCRATCH/$v.bytes") && return 0
        else
            cmp -s <(tail -c +$((n + 1)) "$1") <(tail -c +$((n + 1)) "$SCRATCH/$v.bytes") && return 0
        fi
    done
    return 1
}

# one_of FILE REF...: FILE equals one of the references
one_of() {
    local f=$1 r; shift
    for r in "$@"; do cmp -s "$f" "$r" && return 0; done
    return 1
}

for fault in truncate delete replace; do
    ck=$SCRATCH/ck-$fault out=$SCRATCH/out-$fault
    rm -rf "$ck" "$out"; cp -r "$A" "$ck"; mkdir "$out"
    others=()
    [ "$fault" = replace ] && others=("$SCRATCH/b.safetensors")
    ( sleep 0.05; strike "$fault" "$ck" ) &
    striker=$!
    ok=0 failed=0 mixed=0
    for i in $(seq 8); do
        rc=0
        timeout 10 "$DCP" convert --quiet --no-sync "$ck" "$out/c$i.safetensors" >/dev/null 2>"$out/c$i.err" || rc=$?
        [ "$rc" -ne 124 ] || fail "$fault: dcp convert hung"
        if [ "$rc" -eq 0 ]; then
            if ! one_of "$out/c$i.safetensors" "$SCRATCH/a.safetensors" "${others[@]}"; then
                [ "$fault" = replace ] || fail "$fault: dcp convert succeeded with other bytes"
                mixed=$((mixed + 1))
            fi
            ok=$((ok + 1))
        else
            [ -z "$(ls -A "$out" | grep "c$i\.safetensors")" ] ||
                fail "$fault: a failed dcp convert left $(ls -A "$out" | grep "c$i\.safetensors")"
            failed=$((failed + 1))
        fi
        rc=0
        timeout 10 "$DCP" cat "$ck" "$key" >"$out/k$i" 2>/dev/null || rc=$?
        [ "$rc" -ne 124 ] || fail "$fault: dcp cat hung"
        if [ "$rc" -eq 0 ]; then
            if [ "$fault" = replace ]; then
                if ! one_of "$out/k$i" "$SCRATCH/a.bytes" "$SCRATCH/b.bytes"; then
                    # each half (one chunk a shard) whole from one version
                    half_of "$out/k$i" 1 && half_of "$out/k$i" 2 || fail "$fault: dcp cat: bytes of neither version"
                    mixed=$((mixed + 1))
                fi
            else
                one_of "$out/k$i" "$SCRATCH/a.bytes" || fail "$fault: dcp cat succeeded with other bytes"
            fi
        fi
        rm -f "$out/k$i"
    done
    wait "$striker"
    # after the fault: verify reads every blob again
    rc=0
    timeout 30 "$DCP" verify --no-catalog "$ck" >"$out/verify" 2>&1 || rc=$?
    [ "$rc" -ne 124 ] || fail "$fault: dcp verify hung"
    case $fault in
    truncate | delete) [ "$rc" -ne 0 ] || fail "$fault: dcp verify says OK: $(cat "$out/verify")" ;;
    replace) [ "$rc" -eq 0 ] || fail "$fault: dcp verify of the replacing checkpoint failed: $(cat "$out/verify")" ;;
    esac
    echo "$fault: dcp convert: $ok succeeded, $failed failed cleanly; runs with mixed versions (known): $mixed;" \
        "verify status $rc"
done
