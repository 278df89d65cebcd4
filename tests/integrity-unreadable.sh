# dcp verify of a checkpoint with files it may not read (permissions): each named with the
# reason, once per check, status 1, every other file still checked; the .metadata unreadable
# leaves integrity.json to name the files. Run as root (as in CI), dcp runs as nobody
# (setpriv), since root reads any file; skipped when that cannot be done here.
. "$top_srcdir/tests/lib.sh"
need python3
scratch
run=
if [ "$(id -u)" = 0 ]; then
    need setpriv
    run="setpriv --reuid=65534 --regid=65534 --clear-groups"
    chmod 755 "$SCRATCH"
    $run "$DCP" --help >/dev/null 2>&1 || skip "nobody cannot run $DCP (a folder above it is not searchable)"
    $run test -r "$FIXTURES/05_mixed_2ranks/ckpt/.metadata" 2>/dev/null || skip "nobody cannot read the fixtures"
fi
cp -r "$FIXTURES/05_mixed_2ranks/ckpt" "$SCRATCH/ck"
chmod -R u+w,a+rX "$SCRATCH/ck"
python3 - "$SCRATCH/ck" <<'PY'
import hashlib, json, os, sys
d = sys.argv[1]
files = {e: hashlib.sha256(open(os.path.join(d, e), 'rb').read()).hexdigest() for e in sorted(os.listdir(d))}
json.dump({'algorithm': 'sha256', 'files': files}, open(os.path.join(d, 'integrity.json'), 'w'), indent=2)
PY
chmod a+r "$SCRATCH/ck/integrity.json"
n=$(ls -A "$SCRATCH/ck" | grep -vc '^integrity.json$')
sums() { (cd "$SCRATCH/ck" && ls -lA --time-style=full-iso && sha256sum .metadata ./*.distcp integrity.json) | sha256sum; }
verify_rc() { rc=0; $run timeout 120 "$DCP" --no-catalog verify "$SCRATCH/ck" >"$SCRATCH/out" 2>&1 || rc=$?; }

# A shard file unreadable: named on one line, the structure check's (integrity.json counts
# it without naming it again).
before=$(sums)
chmod 000 "$SCRATCH/ck/__0_1.distcp"
! $run test -r "$SCRATCH/ck/__0_1.distcp" || skip "a file of mode 000 is still readable here"
verify_rc
[ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/ck/__0_1.distcp: cannot open the data file: Permission denied$" "$SCRATCH/out" &&
    [ "$(grep -c '__0_1\.distcp' "$SCRATCH/out")" = 1 ] && [ "$(grep -c '^PROBLEM:' "$SCRATCH/out")" = 1 ] &&
    grep -q "^integrity.json: $n files re-hashed (SHA-256), 1 problems$" "$SCRATCH/out" &&
    grep -q "^structure: 1 problems$" "$SCRATCH/out" && tail -1 "$SCRATCH/out" | grep -q "^$SCRATCH/ck: FAILED$" ||
    fail "an unreadable shard (status $rc): $(cat "$SCRATCH/out")"
# ... and the .metadata too: the checkpoint does not open, integrity.json names both (no
# structure check to name the shard).
chmod 000 "$SCRATCH/ck/.metadata"
verify_rc
[ $rc = 1 ] && grep -q "^dcp: $SCRATCH/ck/.metadata: cannot open: Permission denied$" "$SCRATCH/out" &&
    grep -q "^PROBLEM: $SCRATCH/ck/.metadata: cannot read: Permission denied$" "$SCRATCH/out" &&
    grep -q "^PROBLEM: $SCRATCH/ck/__0_1.distcp: cannot read: Permission denied$" "$SCRATCH/out" &&
    grep -q "^integrity.json: $n files re-hashed (SHA-256), 2 problems$" "$SCRATCH/out" &&
    grep -q "^structure: not checked (the checkpoint does not open: the error above)$" "$SCRATCH/out" ||
    fail "an unreadable .metadata (status $rc): $(cat "$SCRATCH/out")"
# ... and integrity.json itself: refused, naming it and why.
chmod 000 "$SCRATCH/ck/integrity.json"
verify_rc
[ $rc = 1 ] && grep -q "^dcp: $SCRATCH/ck/integrity.json: cannot open: Permission denied$" "$SCRATCH/out" &&
    grep -q "^integrity.json: not checked$" "$SCRATCH/out" || fail "an unreadable integrity.json (status $rc): $(cat "$SCRATCH/out")"
chmod 644 "$SCRATCH/ck/integrity.json" "$SCRATCH/ck/.metadata" "$SCRATCH/ck/__0_1.distcp"
[ "$before" = "$(sums)" ] || fail "verify wrote into the checkpoint folder"
# Digests recorded before (a sidecar), a shard unreadable since: its blobs are named in one
# line.
"$DCP" synth "$SCRATCH/syn" --keys 5 --shape 8,8 --ranks 2 >/dev/null
"$DCP" --no-catalog verify --record --export "$SCRATCH/side.txt" "$SCRATCH/syn" >/dev/null
chmod -R a+rX "$SCRATCH/syn" "$SCRATCH/side.txt"
chmod 000 "$SCRATCH/syn/__1_0.distcp"
rc=0; $run "$DCP" --no-catalog verify --import "$SCRATCH/side.txt" "$SCRATCH/syn" >"$SCRATCH/out" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "^PROBLEM: $SCRATCH/syn/__1_0.distcp: cannot open the data file: Permission denied$" "$SCRATCH/out" &&
    grep -q "^PROBLEM: $SCRATCH/syn/__1_0.distcp: model.layers.0.weight: cannot re-hash the bytes at offset 0 (length [0-9]*): Permission denied (and 4 more blobs of the file alike)$" "$SCRATCH/out" &&
    [ "$(grep -c '^PROBLEM:' "$SCRATCH/out")" = 2 ] &&
    grep -q "^content: 10 blobs checked against their recorded digests, 1 problems$" "$SCRATCH/out" ||
    fail "an unreadable shard, digests recorded (status $rc): $(cat "$SCRATCH/out")"
echo "integrity-unreadable: ok${run:+ (as nobody)}"
