#!/usr/bin/env python3
"""Check the zip archives dcp wrote with Python's zipfile, which verifies every record's CRC-32.

usage: writer_zipcheck.py DCP PATH [--expect-bad]
PATH is a torch.save file (one archive) or a DCP folder (every chunk and bytes-item blob that
`dcp layout --json` lists, each a torch.save archive of its own). Prints the count checked.
--expect-bad inverts the verdict: every archive with a non-empty record must fail (files
written with --no-crc store 0), which shows this check does look at the CRCs.
"""
import io, json, os, subprocess, sys, zipfile

dcp, path = sys.argv[1], sys.argv[2]
expect_bad = "--expect-bad" in sys.argv


def bad_record(data):
    """The first record whose CRC does not match (testzip), or an error text; None if all match."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return z.testzip()
    except zipfile.BadZipFile as e:
        return f"bad zip: {e}"


if os.path.isdir(path):
    out = subprocess.run([dcp, "--no-catalog", "layout", "--json", path], check=True, capture_output=True,
                         text=True).stdout
    blobs = {}
    for line in out.splitlines():
        row = json.loads(line)
        blobs[(row["file"], row["offset"])] = (row["length"], row["key"])
    archives = []
    for (name, off), (length, key) in sorted(blobs.items()):
        with open(os.path.join(path, name), "rb") as f:
            f.seek(off)
            archives.append((f"{name}@{off} ({key})", f.read(length)))
else:
    with open(path, "rb") as f:
        archives = [(path, f.read())]

checked = 0
for what, data in archives:
    if data[:2] != b"PK":
        continue   # a bytes item stored raw is no archive
    bad = bad_record(data)
    if expect_bad and bad is None:
        sys.exit(f"{what}: every CRC matches, expected written-as-0 CRCs to fail")
    if not expect_bad and bad is not None:
        sys.exit(f"{what}: zipfile finds a bad CRC-32 in {bad}")
    checked += 1
if checked == 0:
    sys.exit(f"{path}: no zip archive found")
print(f"{path}: {checked} archive(s) {'fail as expected' if expect_bad else 'pass zipfile CRC checks'}")
