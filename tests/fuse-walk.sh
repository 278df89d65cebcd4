# A whole walk of a mount (os.walk and a stat of every file, as ls -lR does):
# names and sizes equal `dcp ls`, and it costs the daemon only listing
# requests: no LOOKUP of any name a listing gave (every listing is
# READDIRPLUS), no OPENDIR/RELEASEDIR after the first (the kernel opens
# directories itself). A second walk sends no LOOKUP, GETATTR or OPENDIR for
# anything below the root (entries and attributes are cached for the life of
# the mount), and lists again only directories whose cached listing the kernel
# dropped (its pages are reclaimable: DAMON pageout on CI's VMs takes cold ones
# at random), fewer than half. The root of a single checkpoint is asked again
# each second (it may be saved again).
# With -o opendir the walk gives the same names and sizes. Directories say
# st_blksize 4096 (glibc's getdents buffer, the kernel's per listing).
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_fuse
fuse_scratch
DCP="$top_builddir/dcp"
ck="$SCRATCH/ck"
"$DCP" synth "$ck" --keys 300 --shape 4,2 --ranks 2 >/dev/null || fail "dcp synth failed"
"$DCP" --no-catalog ls --json "$ck" >"$SCRATCH/ls.json" || fail "dcp ls failed"

walk() {   # walk MNT OUT: "path size" of every file below MNT/model, sorted
    python3 - "$1" >"$2" <<'PY' || fail "walking $1 failed"
import os, sys
root = sys.argv[1]
out = []
for d, dirs, files in os.walk(os.path.join(root, "model")):
    for f in files:
        p = os.path.join(d, f)
        out.append(f"{os.path.relpath(p, root).replace('/', '.')} {os.stat(p).st_size}")
print("\n".join(sorted(out)))
PY
}
python3 -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\n".join(sorted("%s %d" % (r["key"], r["nbytes"]) for r in rows)))' "$SCRATCH/ls.json" >"$SCRATCH/want"
[ "$(wc -l <"$SCRATCH/want")" -eq 300 ] || fail "dcp ls lists $(wc -l <"$SCRATCH/want") keys, not 300"

ops() {   # ops LOG OPCODE: how many requests of that kind the debug log shows
    grep -c "opcode: $2\b" "$1" || true
}
mnt="$SCRATCH/mnt"
mount_dcpfs "$ck" "$mnt" -d -o no_catalog
ls "$mnt" >/dev/null   # the checkpoint opened and its root listed
n0=$(ops "$mnt.log" LOOKUP)
walk "$mnt" "$SCRATCH/got"
cmp -s "$SCRATCH/want" "$SCRATCH/got" || fail "the walk differs from dcp ls: $(diff "$SCRATCH/want" "$SCRATCH/got" | head -5)"
lookups=$(( $(ops "$mnt.log" LOOKUP) - n0 ))
opendirs=$(ops "$mnt.log" OPENDIR)
plain=$(ops "$mnt.log" READDIR)
plus=$(ops "$mnt.log" READDIRPLUS)
[ "$lookups" -le 2 ] || fail "walking 302 directories looked up $lookups names (the listings should bring them)"
[ "$plain" -eq 0 ] || fail "$plain listings were READDIR, not READDIRPLUS"
[ "$plus" -ge 302 ] || fail "only $plus READDIRPLUS requests for 302 directories"
if [ "$opendirs" -gt 1 ]; then
    echo "note: this kernel sent $opendirs OPENDIR (no opendir-less directories before Linux 5.1)"
fi
sleep 1.2   # the root's one-second timeouts run out: the walk asks for it again
before=$(wc -l <"$mnt.log")
walk "$mnt" "$SCRATCH/again"
cmp -s "$SCRATCH/want" "$SCRATCH/again" || fail "a second walk differs"
tail -n +$((before + 1)) "$mnt.log" | grep "opcode:" >"$SCRATCH/again.ops" || true
grep -v "nodeid: 1," "$SCRATCH/again.ops" >"$SCRATCH/below.ops" || true
! grep -v "opcode: READDIRPLUS" "$SCRATCH/below.ops" >"$SCRATCH/bad.ops" ||
    fail "a second walk sent $(wc -l <"$SCRATCH/bad.ops") requests other than listings for what is below the root (entries and attributes should be cached): $(head -3 "$SCRATCH/bad.ops")"
relisted=$(sed 's/.*nodeid: \([0-9]*\),.*/\1/' "$SCRATCH/below.ops" | sort -u | wc -l)
[ $((relisted * 2)) -lt 302 ] || fail "a second walk listed $relisted of 302 directories again (their listings should be cached)"
grep -q "opcode: LOOKUP.*nodeid: 1," "$SCRATCH/again.ops" ||
    fail "a second walk 1.2 s later did not look up model again (the root of a single checkpoint is cached for a second)"
# A directory's st_blksize sizes glibc's getdents buffer (32 KiB to 1 MiB), and
# the kernel allocates that much for each listing request (1 MiB cost ls -R of
# 100,000 directories 10 s of system time): a page, as ext4 says. Files keep
# 1 MiB, which cp sizes its buffer from.
dir_bs=$(stat -c %o "$mnt/model") file_bs=$(stat -c %o "$(find "$mnt/model" -type f | head -1)")
[ "$dir_bs" -le 4096 ] || fail "directories say st_blksize $dir_bs: each listing request would allocate that much"
[ "$file_bs" = 1048576 ] || fail "files say st_blksize $file_bs, not 1 MiB"
unmount_dcpfs "$mnt"

mnt2="$SCRATCH/mnt2"
mount_dcpfs "$ck" "$mnt2" -o no_catalog -o opendir
walk "$mnt2" "$SCRATCH/got2"
cmp -s "$SCRATCH/want" "$SCRATCH/got2" || fail "with -o opendir the walk differs from dcp ls"
unmount_dcpfs "$mnt2"
echo "ok: 300 files, $lookups lookups, $plus READDIRPLUS, $opendirs OPENDIR; a second walk listed $relisted directories again"
