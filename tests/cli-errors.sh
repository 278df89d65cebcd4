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

# A folder that holds checkpoint folders names them and what to open, every command alike
# (libdcp's message): one; several (natural order: step-10 after step-4; more than 4: the first
# two and the last two; names escaped); none (an empty folder and a checkpoint two levels down);
# 100 subfolders: probed from both ends, at most 64 (quick, and said so).
nc="no .metadata, __R.metadata or .safetensors files"
mkdir "$SCRATCH/one"; cp -r "$src" "$SCRATCH/one/ckpt"
for cmd in ls info digest; do
    expect_fail "dcp: $SCRATCH/one: not a checkpoint: $nc; it holds the checkpoint folder ckpt/: open $SCRATCH/one/ckpt" \
        "$DCP" $cmd "$SCRATCH/one"
done
rc=0; "$DCP" ls "$SCRATCH/one/" 2>"$SCRATCH/err" || rc=$?
[ $rc = 1 ] && echo "dcp: $SCRATCH/one/: not a checkpoint: $nc; it holds the checkpoint folder ckpt/: open $SCRATCH/one/ckpt" |
    diff - "$SCRATCH/err" || fail "one checkpoint folder inside: exit $rc"
# A path too long to repeat within libdcp's 1024-byte message: "that folder", not a cut path.
long="$SCRATCH/$(printf 'a%.0s' $(seq 250))/$(printf 'b%.0s' $(seq 250))"
mkdir -p "$long"; cp -r "$src" "$long/ckpt"
rc=0; "$DCP" ls "$long" 2>"$SCRATCH/err" || rc=$?
[ $rc = 1 ] && echo "dcp: $long: not a checkpoint: $nc; it holds the checkpoint folder ckpt/: open that folder" |
    diff - "$SCRATCH/err" || fail "a long path: exit $rc"
rm -r "$SCRATCH/aaa"*
mkdir "$SCRATCH/several"
for d in step-3 step-10 step-1 step-2 step-4 "$(printf 'x\nb\377')"; do cp -r "$src" "$SCRATCH/several/$d"; done
mkdir "$SCRATCH/several/notes"; : >"$SCRATCH/several/README"
cp -r "$src" "$SCRATCH/several/tmp-checkpoint-9"   # a save staged, not renamed yet: partial, not named
rc=0; "$DCP" ls "$SCRATCH/several" 2>"$SCRATCH/err" || rc=$?
[ $rc = 1 ] && printf '%s\n' "dcp: $SCRATCH/several: not a checkpoint: $nc; it holds the checkpoint folders step-1/, step-2/, ..., step-10/ and x\\nb\\xff/ (6 in all): open one of them" \
    "dcp: $SCRATCH/several holds 1 partial checkpoint (a save that did not finish)" | diff - "$SCRATCH/err" || fail "several checkpoint folders inside: exit $rc"
rm -r "$SCRATCH/several/step-"[234]
rc=0; "$DCP" ls "$SCRATCH/several" 2>"$SCRATCH/err" || rc=$?
[ $rc = 1 ] && printf '%s\n' "dcp: $SCRATCH/several: not a checkpoint: $nc; it holds the checkpoint folders step-1/, step-10/ and x\\nb\\xff/: open one of them" \
    "dcp: $SCRATCH/several holds 1 partial checkpoint (a save that did not finish)" | diff - "$SCRATCH/err" || fail "three checkpoint folders inside, one with a hostile name: exit $rc"
rc=0; "$DCP" ls "$SCRATCH" 2>"$SCRATCH/err" || rc=$?
[ $rc = 1 ] && echo "dcp: $SCRATCH: not a checkpoint: $nc" | diff - "$SCRATCH/err" || fail "checkpoints two levels down: exit $rc"
rc=0; "$DCP" ls "$SCRATCH/empty" 2>"$SCRATCH/err" || rc=$?
[ $rc = 1 ] && echo "dcp: $SCRATCH/empty: not a checkpoint: $nc" | diff - "$SCRATCH/err" || fail "an empty folder: exit $rc"
mkdir "$SCRATCH/many"; (cd "$SCRATCH/many" && mkdir $(seq -f 'd%03g' 1 100))
for d in d003 d004 d050 d097 d098; do cp -r "$src"/. "$SCRATCH/many/$d/"; done
rc=0; "$DCP" ls "$SCRATCH/many" 2>"$SCRATCH/err" || rc=$?
[ $rc = 1 ] && echo "dcp: $SCRATCH/many: not a checkpoint: $nc; it holds the checkpoint folders d003/, d004/, ..., d097/ and d098/ (8 of its 100 subfolders were looked at): open one of them" |
    diff - "$SCRATCH/err" || fail "100 subfolders: exit $rc"
rm -r "$SCRATCH/many/d003" "$SCRATCH/many/d004" "$SCRATCH/many/d097" "$SCRATCH/many/d098"
rc=0; "$DCP" ls "$SCRATCH/many" 2>"$SCRATCH/err" || rc=$?   # d050: among the 32 not probed
[ $rc = 1 ] && echo "dcp: $SCRATCH/many: not a checkpoint: $nc" | diff - "$SCRATCH/err" || fail "96 subfolders, d050 a checkpoint: exit $rc"

# A file of the checkpoint instead of its folder names the folder to open; another file says
# what a checkpoint is (both were "not a single-file format").
expect_fail "$src/.metadata: a file of a checkpoint folder, not a checkpoint of its own: open the folder $src" \
    "$DCP" ls "$src/.metadata"
expect_fail "open the folder $src" "$DCP" info "$src/__1_0.distcp"
(cd "$src" && expect_fail ".metadata: a file of a checkpoint folder, not a checkpoint of its own: open the folder ." \
    "$DCP" ls .metadata)
echo notes >"$SCRATCH/notes.txt"
expect_fail "$SCRATCH/notes.txt: not a checkpoint: neither a folder" "$DCP" ls "$SCRATCH/notes.txt"

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

# A data file that is a link into /proc (or /sys): "regular" files of size 0 that read the
# reading process's own environment or memory. Refused, naming the file and the filesystem.
for target in /proc/self/environ /proc/self/maps /sys/kernel/mm/transparent_hugepage/enabled; do
    [ -e "$target" ] || continue
    fresh; rm "$SCRATCH/ck/__1_0.distcp"; ln -s "$target" "$SCRATCH/ck/__1_0.distcp"
    expect_fail "__1_0.distcp: " "$DCP" --no-catalog digest "$SCRATCH/ck"
    out=$("$DCP" --no-catalog digest "$SCRATCH/ck" 2>&1 >/dev/null) || true
    case "$out" in *"the data file is a kernel file (procfs), not checkpoint data"* | \
                   *"the data file is a kernel file (sysfs), not checkpoint data"*) ;;
        *) fail "a data file linked to $target: $out" ;; esac
done

# Unknown key, bad box.
expect_fail "no such key" "$DCP" cat "$src" no.such.key
expect_fail "--box" "$DCP" cat --box 0:1 "$src" enc.weight
expect_fail "$src: enc.weight: --box 0:41 lies outside dimension 0 (size 40)" "$DCP" cat --box 0:41,0:24 "$src" enc.weight
# A module's name (a dotted prefix of keys) for a key: the keys under it are named; a typo is just
# "no such key"; layout says the same.
expect_fail "$src: enc: no such key; 2 keys lie under it (enc.bias, enc.weight): dcp ls --keys 'enc' $src lists them" \
    "$DCP" cat "$src" enc
expect_fail "$src: optim: no such key; 1 key lies under it (optim.state)" "$DCP" layout "$src" optim
out=$("$DCP" cat "$src" en 2>&1 >/dev/null) || true
[ "$out" = "dcp: $src: en: no such key" ] || fail "a key that is no prefix: $out"
# The whole box is checked before a byte is written: a count past the end of dimension 0 (a
# slab at a time, the first slabs were written), a negative or wrapping count (rows of
# 2^64-4 bytes), an offset near INT64_MAX (an overflowing end).
for box in 0:41,0:24 0:40,0:-1 0:1,0:2305843009213693952 9223372036854775807:9223372036854775807,0:1 40:0,25:0; do
    expect_fail "enc.weight: --box" "$DCP" cat --box "$box" "$src" enc.weight
    [ "$("$DCP" cat --box "$box" "$src" enc.weight 2>/dev/null | wc -c)" = 0 ] || fail "--box $box: bytes written before the error"
done
[ "$("$DCP" cat --box 40:0,24:0 "$src" enc.weight | wc -c)" = 0 ] || fail "an empty box at the end"
# A pattern that matches no key is an error (a typo must not read as an empty checkpoint).
expect_fail "no key matches 'enc.wieght'" "$DCP" digest --keys enc.wieght "$src"
expect_fail "no key matches 'enc.wieght'" "$DCP" ls --keys enc.wieght "$src"
# A mistyped option names the command as "dcp ls" (getopt said "ls: unrecognized option", as if ls(1)).
expect_fail "dcp ls: unrecognized option '--jsn'" "$DCP" ls --jsn "$src"
expect_fail "dcp synth: unrecognized option '--keyz'" "$DCP" synth --keyz 3 "$SCRATCH/never"
out=$("$DCP" ls --keys enc.wieght "$src" 2>/dev/null) || true
[ -z "$out" ] || fail "a --keys pattern that matches nothing printed a table's header: $out"
# synth's numbers are decimal: 010 is ten keys, not octal eight; a sign or a space is refused.
"$DCP" synth "$SCRATCH/ten" --keys 010 --shape 2 >/dev/null || fail "synth --keys 010"
[ "$("$DCP" ls --json "$SCRATCH/ten" | wc -l)" = 10 ] || fail "synth --keys 010 is not ten keys"
expect_fail "bad value ' 5' for --keys" "$DCP" synth "$SCRATCH/sp" --keys ' 5'
expect_fail "bad value '+5' for --keys" "$DCP" synth "$SCRATCH/sp" --keys +5
expect_fail "bad value '0x10' for --keys" "$DCP" synth "$SCRATCH/sp" --keys 0x10

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

# convert and export never write into the source checkpoint folder: not beside its shards, not
# into a safetensors folder (the copy would join it: every key two overlapping chunks), not
# through a path that only resolves inside it.
fresh
"$DCP" convert -q "$src" "$SCRATCH/one.safetensors" || fail "convert to safetensors"
mkdir "$SCRATCH/hfdir"; cp "$SCRATCH/one.safetensors" "$SCRATCH/hfdir/model.safetensors"
ln -s "$SCRATCH/ck" "$SCRATCH/cklink"
before=$(ls -lAR --time-style=full-iso "$SCRATCH/ck" "$SCRATCH/hfdir" | sha256sum)
for dst in "$SCRATCH/ck/x.pt" "$SCRATCH/ck/sub" "$SCRATCH/ck/new/deeper.safetensors" "$SCRATCH/cklink/x.safetensors" \
           "$SCRATCH/ck/../ck/y.pt"; do
    expect_fail "lies inside the source checkpoint $SCRATCH/ck, which convert never writes into" \
        "$DCP" convert "$SCRATCH/ck" "$dst"
done
expect_fail "lies inside the source checkpoint $SCRATCH/hfdir" "$DCP" convert "$SCRATCH/hfdir" "$SCRATCH/hfdir/copy.safetensors"
export DCP_RECIPE_PATH="$top_srcdir/recipes"
expect_fail "which an export never writes into" \
    "$DCP" convert --to hf --recipe llama-megatron "$SCRATCH/ck" "$SCRATCH/ck/hf"
after=$(ls -lAR --time-style=full-iso "$SCRATCH/ck" "$SCRATCH/hfdir" | sha256sum)
[ "$before" = "$after" ] || fail "convert wrote into a source folder"
"$DCP" --no-catalog verify "$SCRATCH/hfdir" >/dev/null || fail "the safetensors folder no longer verifies"
"$DCP" convert -q "$SCRATCH/ck" "$SCRATCH/ck/../beside.pt" || fail "a path that leaves the folder is refused"
# A shard size for an output without shards is a usage error, not a folder of safetensors named
# like a .pt file nor silently ignored; an empty path is named before anything is written.
expect_fail "which has no shards" "$DCP" convert --max-shard-size 2K "$src" "$SCRATCH/shards.pt"
expect_fail "which has no shards" "$DCP" convert --to dcp --max-shard-size 2K "$src" "$SCRATCH/shards-dcp"
[ ! -e "$SCRATCH/shards.pt" ] && [ ! -e "$SCRATCH/shards-dcp" ] || fail "a refused convert wrote its DST"
expect_fail "convert: an empty DST path" "$DCP" convert "$src" ""

# Control characters in a key are escaped in text output (a newline would forge a digest line,
# an ESC reach the terminal); --json gives the key exactly.
if python3 -c 'import torch' 2>/dev/null; then
    python3 - "$SCRATCH/ctl" <<'PY'
import sys, torch, torch.distributed.checkpoint as dcp
dcp.save({"w\n0123456789abcdef0123456789abcdef  forged.key": torch.ones(2), "e\x1b[31m\x7f": torch.zeros(2)},
         checkpoint_id=sys.argv[1], no_dist=True)
PY
    "$DCP" --no-catalog digest "$SCRATCH/ctl" >"$SCRATCH/ctl.txt" || fail "digest of control-character keys"
    [ "$(wc -l <"$SCRATCH/ctl.txt")" = 2 ] || fail "dcp digest printed other than 2 lines: $(cat "$SCRATCH/ctl.txt")"
    grep -qF '  w\n0123456789abcdef0123456789abcdef  forged.key' "$SCRATCH/ctl.txt" &&
        grep -qF '  e\x1b[31m\x7f' "$SCRATCH/ctl.txt" || fail "dcp digest's escapes: $(cat "$SCRATCH/ctl.txt")"
    [ "$("$DCP" --no-catalog ls "$SCRATCH/ctl" | wc -l)" = 3 ] || fail "dcp ls: a key's newline broke its table"
    "$DCP" --no-catalog ls --json "$SCRATCH/ctl" | python3 -c '
import json, sys
keys = sorted(json.loads(line)["key"] for line in sys.stdin)
assert keys == ["e\x1b[31m\x7f", "w\n0123456789abcdef0123456789abcdef  forged.key"], keys' ||
        fail "dcp ls --json does not give the keys exactly"
fi

# A quantized tensor of torch.ao (scale and zero point in its record's data.pkl): refused naming
# the key, never its integer bytes as if they were its values; the checkpoint's other keys read.
if python3 -c 'import torch' 2>/dev/null; then
    python3 - "$SCRATCH/qck" <<'PY'
import sys, torch, torch.distributed.checkpoint as dcp
q = torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 3, torch.qint8)
dcp.save({"q": q, "w": torch.ones(2)}, checkpoint_id=sys.argv[1], no_dist=True)
PY
    expect_fail "__0_0.distcp: q: chunk 0 at offset 0: data.pkl does not rebuild a plain tensor (torch._utils._rebuild_qtensor, a rebuild libdcp does not read: its stored bytes alone are not the values)" \
        "$DCP" --no-catalog cat "$SCRATCH/qck" q
    # an intact record libdcp does not read: no damage to dcp verify
    "$DCP" --no-catalog verify "$SCRATCH/qck" | grep -q 'structure: 0 problems' ||
        fail "dcp verify of a checkpoint with a quantized tensor: $("$DCP" --no-catalog verify "$SCRATCH/qck" 2>&1)"
    [ "$("$DCP" --no-catalog cat "$SCRATCH/qck" w | od -An -tx1 | tr -d ' \n')" = 0000803f0000803f ] ||
        fail "the key beside a quantized tensor"
fi

# A storage offset or length that is not a 64-bit size: the message names the field and why.
if python3 -c 'import torch' 2>/dev/null; then
    for how in "offset 18446744073709551616 negative or past 2^63" "length -1 negative or past 2^63" \
               "offset 'x' not an int"; do
        set -- $how
        fresh; python3 - "$SCRATCH/ck/.metadata" "$1" "$2" <<'PY'
import ast, pickle, sys, warnings
warnings.simplefilter("ignore")
p, field, value = sys.argv[1], sys.argv[2], ast.literal_eval(sys.argv[3])
md = pickle.load(open(p, "rb"))
for k, v in md.storage_data.items():
    if k.fqn == "enc.weight":
        setattr(v, field, value)
pickle.dump(md, open(p, "wb"))
PY
        field=$1; shift 2
        expect_fail "enc.weight: _StorageInfo's $field is $*" "$DCP" --no-catalog cat "$SCRATCH/ck" enc.weight
    done
fi

# A single file is its own checkpoint, not its folder: info finds its one file; a catalog beside it
# (the default ~/.cache for a file in $HOME) is allowed, only the file itself is refused.
mkdir -p "$SCRATCH/single"
"$DCP" convert -q "$src" "$SCRATCH/single/m.safetensors" || fail "convert to one safetensors file"
"$DCP" info "$SCRATCH/single/m.safetensors" >"$SCRATCH/info" || fail "dcp info of a single file: $(cat "$SCRATCH/info")"
grep -q '^shard files: *1, ' "$SCRATCH/info" && ! grep -q MISSING "$SCRATCH/info" || fail "dcp info: $(cat "$SCRATCH/info")"
"$DCP" --catalog "$SCRATCH/single/catalog.sqlite" verify "$SCRATCH/single/m.safetensors" >"$SCRATCH/out" 2>&1 ||
    fail "verify with the catalog beside the file: $(cat "$SCRATCH/out")"
expect_fail "may not live inside" "$DCP" --catalog "$SCRATCH/single/m.safetensors" verify "$SCRATCH/single/m.safetensors"
"$DCP" --no-catalog digest "$SCRATCH/single/m.safetensors" >/dev/null || fail "the refused catalog damaged the file"

# A torch.save file's plain values are bytes items (torch.save of each, as DCP stores them), so a
# diff sees them; objects torch.load would rebuild are not keys, and every command says how many.
# Lists are walked as torch's flatten_state_dict walks them (layers.0). A value that shares one
# tuple 2^60 times (pickle's memo) ends the plain values at 256 MiB; a dict or list shared under
# 2^40 keys is refused for what its few bytes could not hold.
if python3 -c 'import torch' 2>/dev/null; then
    python3 - "$SCRATCH" <<'PY'
import collections, sys, torch
d = sys.argv[1]
torch.save({"w": torch.ones(2), "epoch": 5, "opt": {"lr": 0.1, "groups": [{"params": [0, 1]}]}}, f"{d}/plain.pt")
torch.save({"w": torch.ones(2), "epoch": 5, "opt": {"lr": 0.2, "groups": [{"params": [0, 1]}]},
            "seen": collections.Counter("ab")}, f"{d}/plain2.pt")
deep = ()
for _ in range(60):
    deep = (deep, deep)
torch.save({"w": torch.ones(2), "deep": deep, "after": 1}, f"{d}/deep.pt")
for name, shared in (("dictbomb", {"t": torch.ones(1)}), ("listbomb", [torch.ones(1)])):
    for _ in range(40):
        shared = {"a": shared, "b": shared} if name == "dictbomb" else [shared, shared]
    torch.save({"w": torch.ones(2), "bomb": shared}, f"{d}/{name}.pt")
torch.save({"layers": [torch.ones(2), torch.zeros(3)], "mixed": [1, torch.arange(2)], "plain": [1, 2],
            "nested": [[torch.ones(1)], {"a": torch.ones(4)}], "tup": (1, torch.ones(1))}, f"{d}/lists.pt")
PY
    "$DCP" ls "$SCRATCH/plain.pt" >"$SCRATCH/out" 2>"$SCRATCH/err" || fail "ls of a .pt: $(cat "$SCRATCH/err")"
    [ "$(awk 'NR > 1 {print $1, $2}' "$SCRATCH/out" | sort | tr '\n' ' ')" = "epoch bytes opt.groups.0.params bytes opt.lr bytes w float32 " ] ||
        fail "a .pt's plain values as bytes items: $(cat "$SCRATCH/out")"
    [ ! -s "$SCRATCH/err" ] || fail "a .pt of plain values only: $(cat "$SCRATCH/err")"
    "$DCP" cat "$SCRATCH/plain.pt" opt.groups.0.params >"$SCRATCH/groups" || fail "cat of a plain value"
    python3 -c 'import sys, torch; v = torch.load(sys.argv[1]); assert v == [0, 1], v' "$SCRATCH/groups" ||
        fail "a plain value's bytes item is not torch.save of it"
    rc=0; "$DCP" diff --content "$SCRATCH/plain.pt" "$SCRATCH/plain2.pt" >"$SCRATCH/out" 2>"$SCRATCH/err" || rc=$?
    [ $rc = 1 ] || fail "diff of two .pt differing in a plain value exited $rc"
    grep -qx "values: opt.lr differ" "$SCRATCH/out" && ! grep -q "epoch\|groups" "$SCRATCH/out" ||
        fail "diff of two .pt differing in a plain value: $(cat "$SCRATCH/out")"
    grep -q "plain2.pt: 1 value not shown: not tensors nor plain data" "$SCRATCH/err" ||
        fail "no note of the value left out: $(cat "$SCRATCH/err")"
    "$DCP" layout --json "$SCRATCH/plain.pt" epoch | python3 -c 'import json, sys; d = json.load(sys.stdin); assert d["memory"] and d["file"] == "plain.pt" and "offset" not in d, d' ||
        fail "layout of a plain value"
    "$DCP" ls "$SCRATCH/deep.pt" >"$SCRATCH/out" 2>"$SCRATCH/err" || fail "ls of a .pt sharing one tuple: $(cat "$SCRATCH/err")"
    [ "$(awk 'NR > 1 {print $1}' "$SCRATCH/out")" = w ] && grep -q "deep.pt: 2 values not shown" "$SCRATCH/err" ||
        fail "a .pt sharing one tuple 2^60 times: $(cat "$SCRATCH/out" "$SCRATCH/err")"
    expect_fail "dictbomb.pt: more values than its data.pkl has bytes" "$DCP" ls "$SCRATCH/dictbomb.pt"
    expect_fail "listbomb.pt: more values than its data.pkl has bytes" "$DCP" ls "$SCRATCH/listbomb.pt"
    "$DCP" ls "$SCRATCH/lists.pt" >"$SCRATCH/out" || fail "ls of a .pt with lists"
    [ "$(awk 'NR > 1 {print $1, $2}' "$SCRATCH/out" | sort | tr '\n' ' ')" = "layers.0 float32 layers.1 float32 mixed.0 bytes mixed.1 int64 nested.0.0 float32 nested.1.a float32 plain bytes " ] ||
        fail "a .pt's lists as flatten_state_dict walks them: $(cat "$SCRATCH/out")"
fi

# dcp --rank R: rank R's view of a rank-local save (its __R.metadata alone, as
# torch's dcp.load reads it on rank R); merged without it, info counting the keys several ranks saved.
rl="$top_srcdir/tests/data/metadata/pt_ranklocal"
"$DCP" --no-catalog info "$rl" >"$SCRATCH/out" || fail "info of a rank-local save"
grep -q '^replicated: *1 key saved by several ranks' "$SCRATCH/out" || fail "info's replicated line: $(cat "$SCRATCH/out")"
for r in 0 1; do
    "$DCP" --rank $r ls "$rl" >"$SCRATCH/out" || fail "--rank $r ls"
    [ "$(awk 'NR > 1 {print $1}' "$SCRATCH/out" | LC_ALL=C sort | tr '\n' ' ')" = "rank$r.meta.rank rank$r.only sharded shared " ] ||
        fail "--rank $r ls lists rank $r's keys only: $(cat "$SCRATCH/out")"
    "$DCP" --rank $r layout "$rl" shared | grep -q "__${r}_0.distcp" || fail "--rank $r reads its own copy of shared"
    "$DCP" --rank $r info "$rl" | grep -q "^layout: *rank-local __R.metadata, rank $r's view" || fail "--rank $r info"
done
"$DCP" --rank 1 cat "$rl" rank1.only | od -An -tx1 | tr -d ' \n' | grep -qx '003c003c' || fail "--rank 1 cat rank1.only"
expect_fail "rank1.only" "$DCP" --rank 0 cat "$rl" rank1.only
expect_fail "pt_ranklocal/__2.metadata: no such file" "$DCP" --rank 2 ls "$rl"
expect_fail "--rank x: a rank is a decimal number" "$DCP" --rank x ls "$rl"
expect_fail "--rank -1: a rank is a decimal number" "$DCP" --rank -1 ls "$rl"
# dcp --rank R convert: that rank's view written (to .pt and DCP), digests equal to dcp --rank R digest's
for r in 0 1; do
    "$DCP" --rank $r digest "$rl" | sort >"$SCRATCH/rank$r.digest"
    grep -q " rank$r.only\$" "$SCRATCH/rank$r.digest" || fail "--rank $r digest lacks rank$r.only"
    for out in rl$r.pt rl$r.dcp; do
        "$DCP" --no-catalog --rank $r convert --quiet "$rl" "$SCRATCH/$out" || fail "--rank $r convert to $out"
        "$DCP" --no-catalog digest "$SCRATCH/$out" | sort | diff "$SCRATCH/rank$r.digest" - ||
            fail "--rank $r convert to $out did not write rank $r's view"
    done
done
# libdcp's messages name no C flag (DCP_OPEN_RANK...): dcp shows them as they are, and a path
# that holds such a name is shown as it is
no5="dcp: $rl/__5.metadata: no such file: rank 5 saved no rank-local metadata here (only a use_collectives=False save writes an __R.metadata per rank)"
for cmd in "ls" "digest" "convert" "convert --to hf --recipe llama-torchtitan"; do
    out=$SCRATCH/rl5.pt; case $cmd in *hf*) out=$SCRATCH/rl5hf ;; ls|digest) out= ;; esac
    rc=0; "$DCP" --rank 5 $cmd "$rl" $out 2>"$SCRATCH/err" >/dev/null || rc=$?
    [ $rc = 1 ] && echo "$no5" | diff - "$SCRATCH/err" || fail "--rank 5 $cmd: exit $rc"
done
expect_fail "rl0.pt: rank 1's view is of a rank-local checkpoint folder, its __1.metadata; this is a single file" \
    "$DCP" --rank 1 convert "$SCRATCH/rl0.pt" "$SCRATCH/rl1.safetensors"
expect_fail "rank 1's view is of a rank-local checkpoint folder" \
    "$DCP" --rank 1 convert --to hf --recipe llama-torchtitan "$SCRATCH/rl0.pt" "$SCRATCH/rl1hf"
[ ! -e "$SCRATCH/rl5.pt" ] && [ ! -e "$SCRATCH/rl5hf" ] && [ ! -e "$SCRATCH/rl1.safetensors" ] && [ ! -e "$SCRATCH/rl1hf" ] ||
    fail "a refused convert --rank wrote something"
"$DCP" --no-catalog convert "$rl" "$SCRATCH/rl.pt" >/dev/null 2>&1 || fail "convert of a rank-local save"
expect_fail "this is a single file" "$DCP" --rank 0 ls "$SCRATCH/rl.pt"
mkdir "$SCRATCH/DCP_OPEN_RANK-DCP_WRITE_RANK"
rc=0; "$DCP" --rank 0 ls "$SCRATCH/DCP_OPEN_RANK-DCP_WRITE_RANK" 2>"$SCRATCH/err" >/dev/null || rc=$?
[ $rc = 1 ] && echo "dcp: $SCRATCH/DCP_OPEN_RANK-DCP_WRITE_RANK/__0.metadata: no such file: rank 0 saved no rank-local metadata here (only a use_collectives=False save writes an __R.metadata per rank)" | diff - "$SCRATCH/err" ||
    fail "a path holding a libdcp flag's name is not shown as it is (exit $rc)"
rc=0; "$DCP" --rank 5 ls "$rl" >/dev/null 2>&1 || rc=$?
[ $rc = 1 ] || fail "--rank of a rank that saved nothing exits 1, not $rc"
rc=0; "$DCP" --rank x ls "$rl" >/dev/null 2>&1 || rc=$?
[ $rc = 2 ] || fail "--rank x is a usage error (exit 2), not $rc"

# Reading never writes into the checkpoint folder.
fresh; before=$(ls -lA --time-style=full-iso "$SCRATCH/ck" | sha256sum)
"$DCP" ls "$SCRATCH/ck" >/dev/null; "$DCP" info "$SCRATCH/ck" >/dev/null
"$DCP" cat "$SCRATCH/ck" enc.weight >/dev/null
after=$(ls -lA --time-style=full-iso "$SCRATCH/ck" | sha256sum)
[ "$before" = "$after" ] || fail "the checkpoint folder changed while reading"
echo "cli-errors: ok"
