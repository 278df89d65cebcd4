# The name encoding of dcpfs(1), on keys saved by PyTorch: empty components
# ("x..y", ".lead", "trail."), '%' and '/' in a component, and keys that are
# also prefixes of other keys ("a.b" beside "a.b.c"), in the raw and npy views;
# names longer than 255 bytes are ENAMETOOLONG.
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_torch
need_fuse
fuse_scratch
timeout 300 python3 "$top_srcdir/tests/fuse_torch_save.py" "$SCRATCH/names" names >"$SCRATCH/save.log" 2>&1 ||
    { cat "$SCRATCH/save.log"; fail "PyTorch save failed"; }
truth="$SCRATCH/names/truth.json"
mnt="$SCRATCH/mnt"
mount_dcpfs "$SCRATCH/names/ckpt" "$mnt"
python3 "$FUSE_CHECK" tree "$mnt" "$truth"
for f in a/b.data a/b/c.data a/b/c/d a/x x/%/y %/lead trail/% p%25q/r s%2Ft/u v/w/not all.data all/safetensors \
        __metadata__ all.safetensors; do
    [ -f "$mnt/$f" ] || fail "$f is not a file: $(cd "$mnt" && find . | sort | tr '\n' ' ')"
done
for d in a/b a/b/c x/% s%2Ft all; do
    [ -d "$mnt/$d" ] || fail "$d is not a directory"
done
[ "$(getfattr --absolute-names --only-values -n user.dcp.key "$mnt/a/b.data" 2>/dev/null || python3 -c 'import os,sys; print(os.getxattr(sys.argv[1], "user.dcp.key").decode(), end="")' "$mnt/a/b.data")" = a.b ] ||
    fail "user.dcp.key of a/b.data is not a.b"
# dcpfs's all.safetensors beside the keys "all" and "all.safetensors"; "__metadata__" is left out.
if python3 -c 'import safetensors, numpy' 2>/dev/null; then
    python3 "$FUSE_CHECK" safetensors "$mnt" "$truth" "$DCP" "$SCRATCH/names/ckpt"
    grep -q "__metadata__: not in all.safetensors" "$mnt.log" || fail "no log line for the key __metadata__"
fi
# A name longer than NAME_MAX (255 bytes) is too long, as on a disk filesystem (it was
# ENOENT: the kernel passes names up to 1024 bytes); one of 255 bytes is just not there.
n255=$(printf 'x%.0s' $(seq 255))
for d in "" a/ a/b/; do
    for name in "${n255}y" "$n255$n255$n255"; do
        out=$(LC_ALL=C stat "$mnt/$d$name" 2>&1) && fail "$d${name:0:20}...: found"
        case "$out" in *"File name too long"*) ;; *) fail "$d(${#name} bytes): $out, not ENAMETOOLONG" ;; esac
    done
    out=$(LC_ALL=C stat "$mnt/$d$n255" 2>&1) && fail "$d$n255: found"
    case "$out" in *"No such file or directory"*) ;; *) fail "$d(255 bytes): $out, not ENOENT" ;; esac
done
[ "$(stat -f -c %l "$mnt")" = 255 ] || fail "statfs: namemax $(stat -f -c %l "$mnt")"
unmount_dcpfs "$mnt"

# npy view: tensors are NAME.npy (no collision suffix needed); bytes items keep their names.
if python3 -c 'import numpy' 2>/dev/null; then
    mount_dcpfs "$SCRATCH/names/ckpt" "$mnt" -o view=npy
    for f in a/b.npy a/b/c.npy a/b/c/d.npy x/%/y.npy trail/%.npy s%2Ft/u.npy v/w/not all.npy all/safetensors.npy \
            all.safetensors; do
        [ -f "$mnt/$f" ] || fail "npy view: $f is not a file"
    done
    python3 "$FUSE_CHECK" tree "$mnt" "$truth" --npy
    python3 "$FUSE_CHECK" npy "$mnt" "$truth"
    unmount_dcpfs "$mnt"
fi
echo "ok"
