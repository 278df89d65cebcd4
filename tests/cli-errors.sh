# Bad input gives a clear error naming the file, key and reason, never a crash,
# and the checkpoint folder is never written to.
. "$top_srcdir/tests/lib.sh"
scratch
src="$FIXTURES/05_mixed_2ranks/ckpt"
fresh() { rm -rf "$SCRATCH/ck"; cp -r "$src" "$SCRATCH/ck"; chmod -R u+w "$SCRATCH/ck"; }

# Not a checkpoint at all; a folder that does not exist.
mkdir "$SCRATCH/empty"
expect_fail "not a checkpoint" "$DCP" ls "$SCRATCH/empty"
expect_fail "$SCRATCH/nope" "$DCP" ls "$SCRATCH/nope"

# Shards but no .metadata: a save still being written.
fresh; rm "$SCRATCH/ck/.metadata"
expect_fail "no .metadata" "$DCP" ls "$SCRATCH/ck"

# Empty, truncated and non-pickle metadata.
fresh; : > "$SCRATCH/ck/.metadata"
expect_fail ".metadata" "$DCP" ls "$SCRATCH/ck"
fresh; head -c 1000 "$src/.metadata" > "$SCRATCH/ck/.metadata"
expect_fail "truncated" "$DCP" ls "$SCRATCH/ck"
fresh; echo "this is not a pickle" > "$SCRATCH/ck/.metadata"
expect_fail "not a pickle" "$DCP" ls "$SCRATCH/ck"

# A relative path that leaves the folder, and an absolute one (same length, so
# the pickle stays well-formed).
fresh; python3 - "$SCRATCH/ck/.metadata" <<'PY'
import sys
p = sys.argv[1]; b = open(p, 'rb').read()
assert b.count(b'__0_0.distcp') == 1
open(p, 'wb').write(b.replace(b'__0_0.distcp', b'../_0.distcp'))
PY
expect_fail "leaves the checkpoint folder" "$DCP" ls "$SCRATCH/ck"
fresh; python3 - "$SCRATCH/ck/.metadata" <<'PY'
import sys
p = sys.argv[1]; b = open(p, 'rb').read()
open(p, 'wb').write(b.replace(b'__0_0.distcp', b'/a__0.distcp'))
PY
expect_fail "absolute path" "$DCP" ls "$SCRATCH/ck"

# A missing shard file and a short one: the error names file and key.
fresh; rm "$SCRATCH/ck/__0_0.distcp"
expect_fail "__0_0.distcp" "$DCP" cat "$SCRATCH/ck" enc.weight
fresh; truncate -s 2000 "$SCRATCH/ck/__0_0.distcp"
expect_fail "enc.weight" "$DCP" cat "$SCRATCH/ck" enc.weight
fresh; truncate -s 600 "$SCRATCH/ck/__0_0.distcp"
expect_fail "__0_0.distcp" "$DCP" cat "$SCRATCH/ck" enc.weight

# Unknown key, bad box.
expect_fail "no such key" "$DCP" cat "$src" no.such.key
expect_fail "--box" "$DCP" cat --box 0:1 "$src" enc.weight
expect_fail "enc.weight" "$DCP" cat --box 0:41,0:24 "$src" enc.weight

# Megatron's metadata.json: a finished save in a backend without DCP files is
# named; beside a .metadata, an unknown backend or a damaged file changes
# nothing (the DCP files are what is read).
mg="$FIXTURES/09_megatron_torch_dist/ckpt"
mkdir -p "$SCRATCH/zarr/decoder.layers.weight"
cp "$mg/common.pt" "$SCRATCH/zarr/"
echo '{"sharded_backend": "zarr", "sharded_backend_version": 1}' >"$SCRATCH/zarr/metadata.json"
expect_fail 'zarr/metadata.json: a Megatron-Core checkpoint in the "zarr" backend: dcpfs reads the torch_dist backend only' \
    "$DCP" ls "$SCRATCH/zarr"
rm -rf "$SCRATCH/mg"; cp -r "$mg" "$SCRATCH/mg"
want=$("$DCP" --no-catalog digest "$mg")
for cfg in '{"sharded_backend": "some_future_backend"}' 'not json {' '' '[1,2]'; do
    printf '%s' "$cfg" >"$SCRATCH/mg/metadata.json"
    got=$("$DCP" --no-catalog digest "$SCRATCH/mg") || fail "metadata.json '$cfg' beside .metadata: no longer opens"
    [ "$got" = "$want" ] || fail "metadata.json '$cfg' beside .metadata: other values"
done

# Reading never writes into the checkpoint folder.
fresh; before=$(ls -lA --time-style=full-iso "$SCRATCH/ck" | sha256sum)
"$DCP" ls "$SCRATCH/ck" >/dev/null; "$DCP" info "$SCRATCH/ck" >/dev/null
"$DCP" cat "$SCRATCH/ck" enc.weight >/dev/null
after=$(ls -lA --time-style=full-iso "$SCRATCH/ck" | sha256sum)
[ "$before" = "$after" ] || fail "the checkpoint folder changed while reading"
echo "cli-errors: ok"
