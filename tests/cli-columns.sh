#!/bin/bash
# dcp ls pads its key column by display width, as a terminal shows the text:
# a CJK character takes 2 columns, a combining mark none, an escaped control
# (\t) its 2 printed characters. The dtype column starts at the same column
# on every line (measured here with Python's unicodedata, in any locale the
# command runs under: the printed text is UTF-8 whatever the locale), and a
# key wider than the column is followed by one space.
. "$top_srcdir/tests/lib.sh"
need python3
scratch
S=$SCRATCH
# A safetensors file (its header is JSON: no torch needed), converted to DCP.
python3 - "$S/in.safetensors" <<'PY' || fail "writing the safetensors file"
import json, struct, sys
keys = ["ascii.key", "\u5c64.\u91cd\u307f", "e\u0301\u0301.combining", "tab\there",
        "\uff26\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48", "\u5c64" * 30]
hdr, off = {}, 0
for k in keys:
    hdr[k] = {"dtype": "F32", "shape": [2, 3], "data_offsets": [off, off + 24]}
    off += 24
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(off))
PY
"$DCP" --no-catalog convert "$S/in.safetensors" "$S/ck" 2>"$S/err" || fail "dcp convert: $(cat "$S/err")"

# check FILE: every line's text before its dtype takes 49 columns (48 and a space), or is a
# key wider than 48 followed by one space; all six keys are listed
check() {
    python3 - "$1" <<'PY' || fail "dcp ls ($2): columns do not line up:
$(cat "$1")"
import sys, unicodedata

def width(s):
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
               for c in s)

lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
assert lines[0].startswith("KEY ") and lines[0].index("DTYPE") == 49, lines[0]
rows = lines[1:]
assert len(rows) == 6, rows
seen = set()
for line in rows:
    at = line.index(" float32 ")
    key = line[:at].rstrip(" ")
    seen.add(key)
    if width(key) >= 48:
        assert line[at:at + 2] == " f", ("wide key: one space", line)
    else:
        assert width(line[:at + 1]) == 49, (width(line[:at + 1]), line)
assert "tab\\there" in seen and "e\u0301\u0301.combining" in seen and "\u5c64" * 30 in seen, seen
PY
}
for loc in C C.UTF-8; do
    LC_ALL=$loc "$DCP" --no-catalog ls "$S/ck" >"$S/ls.$loc" 2>"$S/err" || fail "dcp ls (LC_ALL=$loc): $(cat "$S/err")"
    check "$S/ls.$loc" "LC_ALL=$loc"
done
cmp -s "$S/ls.C" "$S/ls.C.UTF-8" || fail "dcp ls prints differently with LC_ALL=C and C.UTF-8"
echo ok
