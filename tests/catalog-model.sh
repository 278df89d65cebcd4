# The catalog remembers parsed metadata: a second open is served from it, a
# changed checkpoint is parsed again, a damaged catalog is never trusted.
. "$top_srcdir/tests/lib.sh"
need python3
scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
cp -r "$FIXTURES/02_rowwise_4ranks/ckpt" "$SCRATCH/ck"; chmod -R u+w "$SCRATCH/ck"
ck="$SCRATCH/ck"
served() { "$DCP" info "$ck" | grep -q "rebuilt from the catalog"; }

"$DCP" ls --json "$ck" > "$SCRATCH/parsed.json"
served || fail "the second open was not served from the catalog"
"$DCP" ls --json "$ck" > "$SCRATCH/cached.json"
cmp "$SCRATCH/parsed.json" "$SCRATCH/cached.json" || fail "the catalog's model differs from the parsed one"
"$DCP" cat "$ck" model.embed_tokens.weight | sha256sum > "$SCRATCH/a"
"$DCP" --no-catalog cat "$ck" model.embed_tokens.weight | sha256sum > "$SCRATCH/b"
cmp "$SCRATCH/a" "$SCRATCH/b" || fail "bytes differ between a cached and a parsed model"

# --no-catalog neither reads nor writes one.
rm -rf "$XDG_CACHE_HOME"
"$DCP" --no-catalog info "$ck" | grep -q "rebuilt from the catalog" && fail "--no-catalog used the catalog"
[ ! -e "$XDG_CACHE_HOME" ] || fail "--no-catalog wrote a catalog"

# A changed .metadata (mtime) or a changed shard size: parsed again.
"$DCP" info "$ck" >/dev/null; served || fail "not cached"
touch -d '2002-02-02' "$ck/.metadata"
served && fail "a changed .metadata was served from a stale record"
served || fail "the re-parsed model was not stored"
truncate -s +1 "$ck/__0_0.distcp"
served && fail "a changed shard size was served from a stale record"

# A tampered model row is parsed as hostile input and falls back to parsing.
served || fail "not cached"
python3 - "$XDG_CACHE_HOME/dcpfs/catalog.sqlite" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT id, head FROM models").fetchall()
assert rows, "no model records"
for id, head in rows:
    bad = bytearray(head); bad[len(bad) // 2] ^= 0xff; bad = bytes(bad[:-3])
    db.execute("UPDATE models SET head=? WHERE id=?", (bad, id))
db.commit()
PY
"$DCP" ls --json "$ck" > "$SCRATCH/after.json"
cmp "$SCRATCH/parsed.json" "$SCRATCH/after.json" || fail "a tampered record changed the listing"

# A tampered entry row is met only when used: that use falls back to parsing
# (same answers), and the model is dropped so the next open stores it afresh.
"$DCP" --no-catalog layout --json "$ck" > "$SCRATCH/layout.json"
served || fail "not cached"
tamper() {   # tamper COLUMN KEY
    python3 - "$XDG_CACHE_HOME/dcpfs/catalog.sqlite" "$1" "$2" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
col, key = sys.argv[2], sys.argv[3].encode()
(data,) = db.execute(f"SELECT {col} FROM model_entries WHERE key=?", (key,)).fetchone()
bad = bytearray(data); bad[0] ^= 0x01
db.execute(f"UPDATE model_entries SET {col}=? WHERE key=?", (bytes(bad), key))
db.commit()
PY
}
tamper chunks model.embed_tokens.weight
"$DCP" layout --json "$ck" > "$SCRATCH/layout2.json" || fail "a tampered chunk list broke dcp layout"
cmp "$SCRATCH/layout.json" "$SCRATCH/layout2.json" || fail "the layout differs with a tampered chunk list"
served && fail "a model with a damaged row was kept"
served || fail "not stored again"
tamper head model.embed_tokens.weight
"$DCP" ls --json "$ck" > "$SCRATCH/after.json" || fail "a tampered entry header broke dcp ls"
cmp "$SCRATCH/parsed.json" "$SCRATCH/after.json" || fail "the listing differs with a tampered header"
"$DCP" layout --json "$ck" > "$SCRATCH/layout2.json" || fail "dcp layout after a tampered header"
cmp "$SCRATCH/layout.json" "$SCRATCH/layout2.json" || fail "the layout differs after a tampered header"

# A file that is not a catalog is moved aside and rebuilt.
echo "garbage" > "$XDG_CACHE_HOME/dcpfs/catalog.sqlite"
rm -f "$XDG_CACHE_HOME/dcpfs/catalog.sqlite-wal" "$XDG_CACHE_HOME/dcpfs/catalog.sqlite-shm"
"$DCP" ls --json "$ck" > "$SCRATCH/after.json" || fail "a garbage catalog broke dcp ls"
cmp "$SCRATCH/parsed.json" "$SCRATCH/after.json" || fail "listing differs after a garbage catalog"
served || fail "the rebuilt catalog does not serve"

# Two processes at once on a fresh catalog.
rm -rf "$XDG_CACHE_HOME"
for i in 1 2 3 4; do "$DCP" ls --json "$ck" > "$SCRATCH/p$i.json" & done
wait
for i in 1 2 3 4; do cmp "$SCRATCH/parsed.json" "$SCRATCH/p$i.json" || fail "concurrent open $i differs"; done
served || fail "no record after concurrent opens"
echo "catalog-model: ok"
