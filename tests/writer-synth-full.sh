# dcp synth on a full disk, emulated by a file size limit (ulimit -f, with SIGXFSZ ignored so that
# a write past it fails with EFBIG as one on a full disk fails with ENOSPC): it fails part way and
# leaves nothing that looks like a checkpoint (it left DST with its shard files): DST goes when
# synth made it, an empty folder given stays, empty, and nothing beside it is touched. Skipped
# where a file size limit cannot be set or does not stop a write.
. "$top_srcdir/tests/lib.sh"
scratch
# limited CMD...: CMD with files limited to 2048 blocks (1 or 2 MiB: the shells' units differ).
limited() { (trap '' XFSZ && ulimit -f 2048 && exec "$@"); }
(ulimit -f 2048) 2>/dev/null || skip "this shell cannot set a file size limit (ulimit -f)"
limited head -c 4194304 /dev/zero >"$SCRATCH/probe" 2>/dev/null || true
[ "$(wc -c <"$SCRATCH/probe")" -lt 4194304 ] || skip "a file size limit (ulimit -f) does not stop writes here"
rm -f "$SCRATCH/probe"
echo "not synth's" >"$SCRATCH/beside"

# 64 keys of 256 KiB over 2 ranks: 8 MiB a shard file, past the limit after a few keys.
for dst in new given; do
    [ $dst = new ] || mkdir "$SCRATCH/$dst"
    rc=0
    limited "$DCP" synth "$SCRATCH/$dst" --keys 64 --shape 256,256 --ranks 2 2>"$SCRATCH/err" || rc=$?
    [ $rc = 1 ] || fail "$dst: exit $rc, not 1: $(cat "$SCRATCH/err")"
    grep -q "File too large" "$SCRATCH/err" || fail "$dst: not the file size limit: $(cat "$SCRATCH/err")"
    if [ $dst = new ]; then
        [ ! -e "$SCRATCH/new" ] || fail "new: a failed synth left DST: $(ls -A "$SCRATCH/new")"
    else
        [ -d "$SCRATCH/given" ] || fail "given: synth removed the empty folder it was given"
        [ -z "$(ls -A "$SCRATCH/given")" ] || fail "given: a failed synth left: $(ls -A "$SCRATCH/given")"
        rmdir "$SCRATCH/given"
    fi
done
[ "$(ls -A "$SCRATCH" | tr "\n" " ")" = "beside err " ] || fail "the folder around DST changed: $(ls -A "$SCRATCH")"
[ "$(cat "$SCRATCH/beside")" = "not synth's" ] || fail "a file beside DST changed"
# Within the limit it works.
limited "$DCP" synth "$SCRATCH/small" --keys 4 --shape 64,64 --ranks 2 || fail "synth within the limit"
[ -f "$SCRATCH/small/.metadata" ] || fail "synth within the limit wrote no .metadata"
echo ok
