#!/bin/bash
# Keys that are not UTF-8: a lone surrogate, which Python pickles as its three
# bytes ("surrogatepass") and torch loads back, and bytes that are no UTF-8 at
# all (a damaged .metadata). JSON output (dcp ls/digest/layout --json,
# dcpload --json) stays JSON and gives the str Python would ("\udc80", and
# "\udcff" for a stray byte 0xff); text output and messages show such bytes as
# \xHH; safetensors, whose names are UTF-8 text, leaves those keys out and
# says why (convert and dcpfs's all.safetensors) instead of failing or
# writing a file no reader opens; the torch.save output keeps them.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need python3
need_python_module torch
need_python_module safetensors
need_fuse
fuse_scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
S=$SCRATCH
python3 - "$S/good" "$S/bad" >"$S/save.log" 2>&1 <<'PY' || { cat "$S/save.log"; fail "PyTorch save failed"; }
import shutil, sys, torch, torch.distributed.checkpoint as dcp
good, bad = sys.argv[1:]
sd = {"plain": torch.arange(6, dtype=torch.float32).reshape(2, 3),
      "sur\udc80rogate": torch.arange(4, dtype=torch.int64) * 7,
      "caf\u00e9.w": torch.arange(3, dtype=torch.int32),
      "badQQQkey": torch.arange(5, dtype=torch.int16),
      "extra": {"epoch": 3}}
try:
    dcp.save(sd, checkpoint_id=good, no_dist=True)
except TypeError:   # torch before 2.5
    dcp.save(sd, checkpoint_id=good)
shutil.copytree(good, bad)
m = open(bad + "/.metadata", "rb").read()
assert b"QQQ" in m and b"sur\xed\xb2\x80rogate" in m
open(bad + "/.metadata", "wb").write(m.replace(b"QQQ", b"\xff\xe2\x82"))
PY
KEYS='["bad\udcff\udce2\udc82key", "caf\u00e9.w", "extra.epoch", "plain", "sur\udc80rogate"]'

# keys_of FILE [FIELD]: the sorted set of "key" fields of JSON lines, as a JSON list (fails on a line that is not JSON)
keys_of() {
    python3 -c 'import json, sys
print(json.dumps(sorted({json.loads(l)["key"] for l in open(sys.argv[1]) if "\"key\"" in l})))' "$1"
}
same_keys() {   # same_keys WHAT GOT WANT (JSON lists)
    python3 -c 'import json, sys; sys.exit(json.loads(sys.argv[1]) != json.loads(sys.argv[2]))' "$2" "$3" ||
        fail "$1: keys $2, expected $3"
}

# JSON output of the CLI and the loader
for cmd in ls digest layout; do
    "$DCP" "$cmd" --json "$S/bad" >"$S/$cmd.json" 2>"$S/err" || fail "dcp $cmd --json: $(cat "$S/err")"
    got=$(keys_of "$S/$cmd.json") || fail "dcp $cmd --json is not JSON: $(head -c 600 "$S/$cmd.json")"
    same_keys "dcp $cmd --json" "$got" "$KEYS"
done
mpirun 2 "$DCPLOAD" "$S/bad" --json >"$S/load.json" 2>"$S/err" || fail "dcpload --json: $(cat "$S/err")"
got=$(keys_of "$S/load.json") || fail "dcpload --json is not JSON: $(head -c 600 "$S/load.json")"
same_keys "dcpload --json" "$got" "$(python3 -c 'import json,sys; print(json.dumps([k for k in json.loads(sys.argv[1]) if k != "extra.epoch"]))' "$KEYS")"

# text output: the stray bytes as \xHH, a valid é as it is (and its column padded by display width: tests/cli-columns.sh)
"$DCP" ls "$S/bad" >"$S/ls.txt" || fail "dcp ls"
grep -q '^bad\\xff\\xe2\\x82key  ' "$S/ls.txt" || fail "dcp ls: the key with stray bytes: $(cat -v "$S/ls.txt")"
grep -q '^sur\\xed\\xb2\\x80rogate  ' "$S/ls.txt" || fail "dcp ls: the surrogate key: $(cat -v "$S/ls.txt")"
[ "$(grep '^caf' "$S/ls.txt" | sed 's/ *int32.*//' | python3 -c 'import sys; print(len(sys.stdin.read().rstrip("\n")))')" = 6 ] ||
    fail "dcp ls: café.w: $(grep '^caf' "$S/ls.txt")"
[ "$(awk '/^plain/ {print index($0, "float32")}' "$S/ls.txt")" = \
  "$(grep '^caf' "$S/ls.txt" | python3 -c 'import sys; print(sys.stdin.read().index("int32") + 1)')" ] ||
    fail "dcp ls: the dtype column moves on the line with é: $(cat "$S/ls.txt")"
expect_fail 'bad\xffzz' "$DCP" cat "$S/bad" $'bad\xffzz'   # the message shows the stray byte as \xff

# safetensors: the keys that are not UTF-8 are left out, said so; the file opens and holds the rest
"$DCP" convert "$S/bad" "$S/out.safetensors" 2>"$S/err" || fail "dcp convert to safetensors: $(cat "$S/err")"
for k in 'bad\\xff\\xe2\\x82key' 'sur\\xed\\xb2\\x80rogate'; do
    grep -q "^dcp: convert: skipped $k: not UTF-8" "$S/err" || fail "convert: no 'skipped' line for $k: $(cat -v "$S/err")"
done
check_st() {   # check_st FILE: safetensors loads it; it holds plain and café.w with their values
    python3 - "$1" <<'PY' || fail "$1 is not the expected safetensors file"
import sys, torch
from safetensors.torch import load_file
d = load_file(sys.argv[1])
assert sorted(d) == ["caf\u00e9.w", "plain"], sorted(d)
assert torch.equal(d["plain"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
assert torch.equal(d["caf\u00e9.w"], torch.arange(3, dtype=torch.int32))
PY
}
check_st "$S/out.safetensors"
# torch.save output keeps every key as torch would load it
"$DCP" convert "$S/good" "$S/out.pt" 2>"$S/err" || fail "dcp convert to .pt: $(cat "$S/err")"
python3 - "$S/out.pt" <<'PY' || fail "torch.load of the .pt"
import sys, torch
sd = torch.load(sys.argv[1], weights_only=True)
assert torch.equal(sd["sur\udc80rogate"], torch.arange(4) * 7), sorted(sd)
PY

# dcpfs: the key files are there under their bytes; all.safetensors holds what it can, the log says why not the rest
mnt="$S/mnt"
mount_dcpfs "$S/bad" "$mnt"
python3 - "$mnt" <<'PY' || fail "the mount's key files"
import os, sys
m = os.fsencode(sys.argv[1])
names = set(os.listdir(m))
want = {b"bad\xff\xe2\x82key", b"sur\xed\xb2\x80rogate", "café".encode(), b"plain", b"extra", b"all.safetensors"}
assert want <= names, names
assert open(os.path.join(m, b"bad\xff\xe2\x82key"), "rb").read() == b"".join(i.to_bytes(2, "little") for i in range(5))
PY
check_st "$mnt/all.safetensors"
for k in 'bad\xff\xe2\x82key' 'sur\xed\xb2\x80rogate'; do   # the log shows them as text does
    grep -qF "$k: not in all.safetensors: not UTF-8" "$mnt.log" || fail "no log line for $k: $(cat -v "$mnt.log")"
done
grep -q "laid out: 2 tensors, 3 items left out" "$mnt.log" || fail "the view's summary: $(cat -v "$mnt.log")"
unmount_dcpfs "$mnt"
echo "ok"
