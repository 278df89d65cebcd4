# dcp verify checks Megatron-Core's integrity.json (the SHA-256 of every file of the folder):
# a manifest made here over a fixture, hostile manifests (each refused naming integrity.json
# and why, never a crash or a hang), then a checkpoint saved by megatron-core 0.19.2 or
# 0.18.2 itself (dist_checkpointing.save(..., verify_integrity=True), one gloo rank on the
# CPU; tests/interop/save_integrity.py; skipped when neither release is installed): intact,
# a flipped byte, a removed file, a truncated .metadata. A .metadata that does not open still
# has the manifest checked. The checkpoint folder is never written to.
. "$top_srcdir/tests/lib.sh"
need python3
scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
D="$DCP --no-catalog"
# sums FOLDER [NAME]: of its listing and files' bytes, NAME left out (a manifest the test rewrites)
sums() { (cd "$1" && ls -lA --time-style=full-iso -I "${2:-/}" && find . -type f ! -name "${2:-/}" -exec sha256sum {} + |
          LC_ALL=C sort) | sha256sum; }
# manifest FOLDER [ALGORITHM]: integrity.json over the folder's files, as Megatron-Core writes it
manifest() {
    python3 - "$@" <<'PY'
import hashlib, json, os, sys
d = sys.argv[1]
files = {e: hashlib.sha256(open(os.path.join(d, e), 'rb').read()).hexdigest()
         for e in sorted(os.listdir(d)) if e != 'integrity.json' and os.path.isfile(os.path.join(d, e))}
json.dump({'algorithm': sys.argv[2] if len(sys.argv) > 2 else 'sha256', 'files': files},
          open(os.path.join(d, 'integrity.json'), 'w'), indent=2)
PY
}
# verify_rc CKPT: dcp verify's status into rc, its output into $SCRATCH/out (stdout and stderr)
verify_rc() { rc=0; timeout 120 $D verify "$1" >"$SCRATCH/out" 2>&1 || rc=$?; }

# No manifest: nothing said about one.
cp -r "$FIXTURES/05_mixed_2ranks/ckpt" "$SCRATCH/ck"
chmod -R u+w "$SCRATCH/ck"
verify_rc "$SCRATCH/ck"
[ $rc = 0 ] && ! grep -q integrity.json "$SCRATCH/out" || fail "no manifest: $(cat "$SCRATCH/out")"

# A manifest of every file: each re-hashed, OK; a file it does not list is noted, not failed.
manifest "$SCRATCH/ck"
n=$(ls -A "$SCRATCH/ck" | grep -vc '^integrity.json$')
verify_rc "$SCRATCH/ck"
[ $rc = 0 ] && grep -q "^integrity.json: $n files re-hashed (SHA-256), 0 problems$" "$SCRATCH/out" ||
    fail "intact: $(cat "$SCRATCH/out")"
echo extra >"$SCRATCH/ck/notes.txt"
verify_rc "$SCRATCH/ck"
[ $rc = 0 ] && grep -q "^note: $SCRATCH/ck/notes.txt: not listed in integrity.json (not checked)$" "$SCRATCH/out" ||
    fail "unlisted file: $(cat "$SCRATCH/out")"
rm "$SCRATCH/ck/notes.txt"
# A flipped byte and a removed file, in a copy: each named once, status 1.
cp -r "$SCRATCH/ck" "$SCRATCH/bad"
printf '\001' | dd of="$SCRATCH/bad/__0_3.distcp" bs=1 seek=100 conv=notrunc status=none
rm "$SCRATCH/bad/__1_2.distcp"
verify_rc "$SCRATCH/bad"
[ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/bad/__0_3.distcp: SHA-256 [0-9a-f]\{64\}, integrity.json lists [0-9a-f]\{64\}$" "$SCRATCH/out" &&
    grep -q "^PROBLEM: $SCRATCH/bad/__1_2.distcp: the data file is missing$" "$SCRATCH/out" &&
    [ "$(grep -c '^PROBLEM:' "$SCRATCH/out")" = 2 ] ||
    fail "a flipped byte and a missing file: $(cat "$SCRATCH/out")"
# The hashing rate says what was hashed, how much and how fast.
grep -q "^integrity.json: read and hashed [0-9.]* [KMGT]*i*B of files in [0-9.]* s at [0-9]* MB/s$" "$SCRATCH/out" ||
    fail "the rate line: $(cat "$SCRATCH/out")"
# Only a missing shard: named once, by the structure check (the content check goes on over
# the other files: no error, no "not checked"); the manifest counts it, not naming it again.
rm -rf "$SCRATCH/bad" && cp -r "$SCRATCH/ck" "$SCRATCH/bad" && rm "$SCRATCH/bad/__1_2.distcp"
verify_rc "$SCRATCH/bad"
[ $rc = 1 ] && [ "$(grep -c '__1_2\.distcp' "$SCRATCH/out")" = 1 ] &&
    grep -q "^PROBLEM: $SCRATCH/bad/__1_2.distcp: the data file is missing$" "$SCRATCH/out" &&
    [ "$(grep -c '^PROBLEM:' "$SCRATCH/out")" = 1 ] &&
    ! grep -q "not checked\|^dcp:" "$SCRATCH/out" && grep -q "^integrity.json: $n files re-hashed (SHA-256), 1 problems$" "$SCRATCH/out" ||
    fail "a missing shard (status $rc): $(cat "$SCRATCH/out")"

# A .metadata that does not open (truncated, not a pickle, missing, a folder or a FIFO in its
# place: damage, not a partial save; never waited on):
# the checkpoint cannot be read, but integrity.json still names the damaged file, status 1
# (a folder with integrity.json is a finished save: said once, never called partial, and
# not a partial one's status 3), and nothing is written to the folder.
meta_sum=$(sha256sum <"$SCRATCH/ck/.metadata" | cut -d' ' -f1)
for case in truncated garbage missing folder fifo; do
    rm -rf "$SCRATCH/bad" && cp -r "$SCRATCH/ck" "$SCRATCH/bad"
    case $case in
    truncated) truncate -s 500 "$SCRATCH/bad/.metadata"
               why="^dcp: $SCRATCH/bad/.metadata: truncated pickle";;
    garbage) printf 'not a pickle at all' >"$SCRATCH/bad/.metadata"
             why="^dcp: $SCRATCH/bad/.metadata: is not a pickle";;
    missing) rm "$SCRATCH/bad/.metadata"
             why="^dcp: $SCRATCH/bad: a damaged checkpoint, not a partial save: it holds integrity.json, which Megatron-Core writes last, so the save finished and files were lost or damaged since$";;
    folder) rm "$SCRATCH/bad/.metadata" && mkdir "$SCRATCH/bad/.metadata"
            why="^dcp: $SCRATCH/bad/.metadata: not a regular file (a folder)$";;
    fifo) rm "$SCRATCH/bad/.metadata" && mkfifo "$SCRATCH/bad/.metadata"
          why="^dcp: $SCRATCH/bad/.metadata: not a regular file (a FIFO)$";;
    esac
    case $case in
    truncated|garbage) want="^PROBLEM: $SCRATCH/bad/.metadata: SHA-256 [0-9a-f]\{64\}, integrity.json lists $meta_sum$";;
    missing) want="^PROBLEM: $SCRATCH/bad/.metadata: listed in integrity.json, missing$";;
    folder|fifo) want="^PROBLEM: $SCRATCH/bad/.metadata: listed in integrity.json, not a regular file$";;
    esac
    before=$(sums "$SCRATCH/bad")
    verify_rc "$SCRATCH/bad"
    [ $rc = 1 ] && grep -q "$why" "$SCRATCH/out" && grep -q "$want" "$SCRATCH/out" &&
        [ "$(grep -c '^PROBLEM:' "$SCRATCH/out")" = 1 ] &&
        grep -q "^integrity.json: $n files re-hashed (SHA-256), 1 problems$" "$SCRATCH/out" &&
        grep -q "^structure: not checked (the checkpoint does not open: the error above)$" "$SCRATCH/out" &&
        ! grep -q "partial checkpoint\|did not finish\|^note:" "$SCRATCH/out" && [ "$(grep -c '^dcp:' "$SCRATCH/out")" = 1 ] &&
        tail -1 "$SCRATCH/out" | grep -q "^$SCRATCH/bad: FAILED$" ||
        fail ".metadata $case (status $rc): $(cat "$SCRATCH/out")"
    [ "$before" = "$(sums "$SCRATCH/bad")" ] || fail ".metadata $case: verify wrote into the folder"
    # ... and, the manifest damaged too, that is named (status 1); without one, the error alone
    printf '{"algorithm": "sha256", "files": {' >"$SCRATCH/bad/integrity.json"
    verify_rc "$SCRATCH/bad"
    [ $rc = 1 ] && grep -q "$why" "$SCRATCH/out" && grep -q "^dcp: $SCRATCH/bad/integrity.json: not valid JSON" "$SCRATCH/out" &&
        grep -q '^integrity.json: not checked$' "$SCRATCH/out" ||
        fail ".metadata $case, a broken manifest (status $rc): $(cat "$SCRATCH/out")"
    rm "$SCRATCH/bad/integrity.json"
    want_rc=1; case $case in missing) want_rc=3 why="^dcp: $SCRATCH/bad: a partial checkpoint: [0-9]* shard files, no .metadata (the save did not finish)$";; esac
    verify_rc "$SCRATCH/bad"
    [ $rc = $want_rc ] && grep -q "$why" "$SCRATCH/out" && [ "$(wc -l <"$SCRATCH/out")" = 1 ] ||
        fail ".metadata $case, no manifest (status $rc, not $want_rc): $(cat "$SCRATCH/out")"
done

# Hostile manifests: refused with integrity.json and the reason named, status 1, the folder
# unchanged. (NAME|JSON-of-the-whole-manifest; D: a digest of 64 hex digits.)
H=$(printf '%064d' 0)
cp "$SCRATCH/ck/integrity.json" "$SCRATCH/good.json"
before=$(sums "$SCRATCH/ck" integrity.json)
for case in \
    'not valid JSON|{"algorithm": "sha256", "files": {' \
    'not valid JSON|{"algorithm": "sha256", "files": {"a": "'$H'", "a": "'$H'"}}' \
    'not valid JSON|{"algorithm": "sha256", "files": {"a\u0000b": "'$H'"}}' \
    'not a JSON object|["sha256"]' \
    'no "algorithm" string|{"files": {}}' \
    'algorithm "md5": only sha256 is known|{"algorithm": "md5", "files": {".metadata": "'$H'"}}' \
    'not valid JSON|{"algorithm": "sha256\u0000x", "files": {}}' \
    'no "files" object|{"algorithm": "sha256", "files": [".metadata"]}' \
    '"../x": not a plain file name of the folder (it holds '"'/'"')|{"algorithm": "sha256", "files": {"../x": "'$H'"}}' \
    '"sub/x": not a plain file name of the folder|{"algorithm": "sha256", "files": {"sub/x": "'$H'"}}' \
    '"/etc/passwd": not a plain file name|{"algorithm": "sha256", "files": {"/etc/passwd": "'$H'"}}' \
    '"..": not a file of the folder|{"algorithm": "sha256", "files": {"..": "'$H'"}}' \
    '"": an empty file name|{"algorithm": "sha256", "files": {"": "'$H'"}}' \
    'a name longer than any file name|{"algorithm": "sha256", "files": {"'$(printf '%0300d' 0)'": "'$H'"}}' \
    '"integrity.json": the manifest lists itself|{"algorithm": "sha256", "files": {"integrity.json": "'$H'"}}' \
    '".metadata": the digest is not a SHA-256 (64 lowercase hex digits)|{"algorithm": "sha256", "files": {".metadata": "'${H#0}'"}}' \
    '".metadata": the digest is not a SHA-256|{"algorithm": "sha256", "files": {".metadata": "'${H}0'"}}' \
    '".metadata": the digest is not a SHA-256|{"algorithm": "sha256", "files": {".metadata": "'${H%0}A'"}}' \
    '".metadata": the digest is not a SHA-256|{"algorithm": "sha256", "files": {".metadata": "'${H%0}g'"}}' \
    '".metadata": the digest is not a SHA-256|{"algorithm": "sha256", "files": {".metadata": 5}}'; do
    want=${case%%|*}
    printf '%s' "${case#*|}" >"$SCRATCH/ck/integrity.json"
    verify_rc "$SCRATCH/ck"
    [ $rc = 1 ] && grep -qF "$SCRATCH/ck/integrity.json: " "$SCRATCH/out" && grep -qF -- "$want" "$SCRATCH/out" &&
        grep -q '^integrity.json: not checked$' "$SCRATCH/out" && tail -1 "$SCRATCH/out" | grep -q ': FAILED$' ||
        fail "manifest ${case#*|} (want '$want', status $rc): $(cat "$SCRATCH/out")"
    cp "$SCRATCH/good.json" "$SCRATCH/ck/integrity.json"
done
# 10 MB, larger than any manifest of the folder's files, is refused before it is read
python3 -c "
import json; h = '$H'
json.dump({'algorithm': 'sha256', 'files': {'f%07d' % i: h for i in range(130000)}}, open('$SCRATCH/ck/integrity.json', 'w'))"
[ "$(stat -c %s "$SCRATCH/ck/integrity.json")" -gt 10000000 ] || fail "the large manifest is not 10 MB"
verify_rc "$SCRATCH/ck"
[ $rc = 1 ] && grep -q "integrity.json: [0-9]* bytes: larger than a manifest of the folder's $n files ([0-9]* bytes at most)" "$SCRATCH/out" ||
    fail "10 MB manifest: $(cat "$SCRATCH/out")"
# A listed name with control characters (missing): shown escaped, never raw; a FIFO listed,
# and a FIFO as the manifest: refused, never waited on.
printf '{"algorithm": "sha256", "files": {"x\\u001b[31m\\nPROBLEM": "%s"}}' "$H" >"$SCRATCH/ck/integrity.json"
verify_rc "$SCRATCH/ck"
[ $rc = 1 ] && grep -qF 'ck/x\x1b[31m\nPROBLEM: listed in integrity.json, missing' "$SCRATCH/out" &&
    ! grep -q "$(printf '\033')" "$SCRATCH/out" || fail "control characters: $(cat -v "$SCRATCH/out")"
cp "$SCRATCH/good.json" "$SCRATCH/ck/integrity.json"
after=$(sums "$SCRATCH/ck" integrity.json)
[ "$before" = "$after" ] || fail "verify wrote into the checkpoint folder"
rm -rf "$SCRATCH/fifo" && cp -r "$SCRATCH/ck" "$SCRATCH/fifo" && mkfifo "$SCRATCH/fifo/pipe"
printf '{"algorithm": "sha256", "files": {"pipe": "%s"}}' "$H" >"$SCRATCH/fifo/integrity.json"
verify_rc "$SCRATCH/fifo"
[ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/fifo/pipe: listed in integrity.json, not a regular file$" "$SCRATCH/out" ||
    fail "a FIFO listed (status $rc): $(cat "$SCRATCH/out")"
rm "$SCRATCH/fifo/integrity.json" && mkfifo "$SCRATCH/fifo/integrity.json"
verify_rc "$SCRATCH/fifo"
[ $rc = 1 ] && grep -q "integrity.json: not a regular file" "$SCRATCH/out" || fail "a FIFO manifest (status $rc): $(cat "$SCRATCH/out")"

# Megatron-Core's own: 0.19.2, else 0.18.2.
need_megatron --any 0.19.2 0.18.2
v=$MEGATRON_VERSION
mpy() { PYTHONPATH=$MEGATRON_PATH timeout 600 python3 "$top_srcdir/tests/interop/save_integrity.py" "$@"; }
mpy save "$SCRATCH/mck" >"$SCRATCH/save.log" 2>&1 || { tail -30 "$SCRATCH/save.log"; fail "megatron-core $v: saving failed"; }
[ -f "$SCRATCH/mck/integrity.json" ] || fail "megatron-core $v wrote no integrity.json"
m=$(python3 -c "import json; print(len(json.load(open('$SCRATCH/mck/integrity.json'))['files']))")
before=$(sums "$SCRATCH/mck")
verify_rc "$SCRATCH/mck"
[ $rc = 0 ] && grep -q "^integrity.json: $m files re-hashed (SHA-256), 0 problems$" "$SCRATCH/out" &&
    ! grep -q "^note:" "$SCRATCH/out" || fail "megatron-core $v, intact: $(cat "$SCRATCH/out")"
[ "$before" = "$(sums "$SCRATCH/mck")" ] || fail "verify wrote into megatron-core's checkpoint folder"
# One byte of a .distcp flipped, in a copy: dcp verify and Megatron-Core both fail, naming it.
cp -r "$SCRATCH/mck" "$SCRATCH/flip"
distcp=$(cd "$SCRATCH/flip" && ls | grep '\.distcp$' | head -1)
python3 - "$SCRATCH/flip/$distcp" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 0x01; open(p, 'wb').write(b)
PY
before=$(sums "$SCRATCH/flip")
verify_rc "$SCRATCH/flip"
[ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/flip/$distcp: SHA-256 [0-9a-f]\{64\}, integrity.json lists [0-9a-f]\{64\}$" "$SCRATCH/out" &&
    grep -q "^integrity.json: $m files re-hashed (SHA-256), 1 problems$" "$SCRATCH/out" && tail -1 "$SCRATCH/out" | grep -q ': FAILED$' ||
    fail "megatron-core $v, a flipped byte in $distcp (status $rc): $(cat "$SCRATCH/out")"
[ "$before" = "$(sums "$SCRATCH/flip")" ] || fail "verify wrote into the flipped copy"
mrc=0; mpy verify "$SCRATCH/flip" >"$SCRATCH/mout" 2>&1 || mrc=$?
[ $mrc = 1 ] && grep -q "$distcp" "$SCRATCH/mout" || fail "megatron-core $v itself passed the flipped copy: $(cat "$SCRATCH/mout")"
# A listed file removed: named missing.
cp -r "$SCRATCH/mck" "$SCRATCH/gone"
rm "$SCRATCH/gone/metadata.json"
verify_rc "$SCRATCH/gone"
[ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/gone/metadata.json: listed in integrity.json, missing$" "$SCRATCH/out" ||
    fail "megatron-core $v, metadata.json removed (status $rc): $(cat "$SCRATCH/out")"
# Its .metadata cut short: the checkpoint does not open, integrity.json names it.
cp -r "$SCRATCH/mck" "$SCRATCH/cut"
truncate -s 100 "$SCRATCH/cut/.metadata"
verify_rc "$SCRATCH/cut"
[ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/cut/.metadata: SHA-256 [0-9a-f]\{64\}, integrity.json lists [0-9a-f]\{64\}$" "$SCRATCH/out" &&
    grep -q "^integrity.json: $m files re-hashed (SHA-256), 1 problems$" "$SCRATCH/out" ||
    fail "megatron-core $v, .metadata truncated (status $rc): $(cat "$SCRATCH/out")"
echo "megatron-core $v: integrity.json of $m files checked"
