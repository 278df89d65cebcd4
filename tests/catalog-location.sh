# The catalog never lives in (or writes into) a checkpoint folder; an older
# or foreign catalog is set aside; processes share one catalog; checkpoints
# written by the project's own writer verify clean and their damage is named.
. "$top_srcdir/tests/lib.sh"
need python3
scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
cp -r "$FIXTURES/05_mixed_2ranks/ckpt" "$SCRATCH/ck"; chmod -R u+w "$SCRATCH/ck"
ck="$SCRATCH/ck"
snap() { (cd "$ck" && ls -lAR --time-style=full-iso | sha256sum); }
before=$(snap)

# A catalog path inside the checkpoint: opening still works (parsed), nothing is written there.
"$DCP" --catalog "$ck/catalog.sqlite" ls "$ck" >/dev/null || fail "ls with a catalog inside the checkpoint failed"
"$DCP" --catalog "$ck/catalog.sqlite" info "$ck" | grep -q "rebuilt from the catalog" && fail "served from a catalog inside the checkpoint"
rc=0; "$DCP" verify --record --catalog "$ck/sub/catalog.sqlite" "$ck" > "$SCRATCH/out" 2>&1 || rc=$?
[ $rc != 0 ] && grep -q "may not live inside the checkpoint folder" "$SCRATCH/out" || fail "verify: $(cat "$SCRATCH/out")"
# A sidecar may be kept next to the checkpoint, not in it.
rc=0; "$DCP" verify --record --export "$ck/digests.txt" "$ck" > "$SCRATCH/out" 2>&1 || rc=$?
[ $rc != 0 ] && grep -q "will not write into the checkpoint folder" "$SCRATCH/out" || fail "export: $(cat "$SCRATCH/out")"
[ "$before" = "$(snap)" ] || fail "something was written into the checkpoint folder"
"$DCP" verify --export "$SCRATCH/digests.txt" "$ck" > "$SCRATCH/out" || fail "export next to it: $(cat "$SCRATCH/out")"
[ "$(grep -c '^[0-9a-f]\{16\} ' "$SCRATCH/digests.txt")" = 13 ] || fail "sidecar: $(cat "$SCRATCH/digests.txt")"

# A catalog of an older format (or another program's database) is moved aside and rebuilt.
rm -rf "$XDG_CACHE_HOME"; mkdir -p "$XDG_CACHE_HOME/dcpfs"
python3 - "$XDG_CACHE_HOME/dcpfs/catalog.sqlite" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.executescript("CREATE TABLE catalog_meta(key TEXT PRIMARY KEY, value TEXT);"
                 "INSERT INTO catalog_meta VALUES('format', 'dcpfs-catalog-1');"
                 "CREATE TABLE models(metadata_key TEXT PRIMARY KEY, path TEXT, data BLOB);")
db.commit()
PY
"$DCP" ls "$ck" >/dev/null || fail "ls over an old catalog"
[ -f "$XDG_CACHE_HOME/dcpfs/catalog.sqlite.corrupt" ] || fail "the old catalog was not moved aside"
"$DCP" info "$ck" | grep -q "rebuilt from the catalog" || fail "the rebuilt catalog does not serve"

# Many processes at once: readers of the model and writers of digests share one catalog.
rm -rf "$XDG_CACHE_HOME"
for i in 1 2 3; do cp -r "$ck" "$SCRATCH/c$i"; done
pids=""
for i in 1 2 3; do
    "$DCP" verify --record "$SCRATCH/c$i" > "$SCRATCH/rec$i" 2>&1 & pids="$pids $!"
    "$DCP" ls --json "$SCRATCH/c$i" > "$SCRATCH/ls$i" 2>&1 & pids="$pids $!"
done
for p in $pids; do wait "$p" || fail "a concurrent dcp failed: $(cat "$SCRATCH"/rec* "$SCRATCH"/ls*)"; done
"$DCP" --no-catalog ls --json "$ck" > "$SCRATCH/ls.ref"
for i in 1 2 3; do
    grep -q "recorded 13 digests" "$SCRATCH/rec$i" || fail "record $i: $(cat "$SCRATCH/rec$i")"
    cmp -s "$SCRATCH/ls.ref" "$SCRATCH/ls$i" || fail "listing $i differs"
    "$DCP" verify "$SCRATCH/c$i" | grep -q "13 blobs checked against their recorded digests, 0 problems" || fail "digests of c$i lost"
    "$DCP" info "$SCRATCH/c$i" | grep -q "rebuilt from the catalog" || fail "model of c$i not stored"
done

# Checkpoints written by the project's own writer (dcp synth, issue 4).
if "$DCP" synth "$SCRATCH/syn" --keys 3 --shape 16,12 --dtype float32 --ranks 4 --shard blocks --seed 7 \
        > "$SCRATCH/synth.log" 2>&1; then
    "$DCP" verify --record "$SCRATCH/syn" > "$SCRATCH/out" || fail "synth checkpoint: $(cat "$SCRATCH/out")"
    f=$(cd "$SCRATCH/syn" && ls *.distcp | head -1)
    size=$(stat -c %s "$SCRATCH/syn/$f")
    python3 - "$SCRATCH/syn/$f" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[len(b) - 5] ^= 0x10; open(p, 'wb').write(b)
PY
    rc=0; "$DCP" verify "$SCRATCH/syn" > "$SCRATCH/out" || rc=$?
    [ $rc = 1 ] && grep -q "$f: .* changed" "$SCRATCH/out" || fail "synth flipped byte: $(cat "$SCRATCH/out")"
    truncate -s $((size / 2)) "$SCRATCH/syn/$f"
    rc=0; "$DCP" verify "$SCRATCH/syn" > "$SCRATCH/out" || rc=$?
    [ $rc = 1 ] && grep -q "$f: .*ends past the file" "$SCRATCH/out" || fail "synth truncated: $(cat "$SCRATCH/out")"
else
    echo "writer cases skipped: dcp synth is not available ($(head -1 "$SCRATCH/synth.log"))"
fi
echo "catalog-location: ok"
