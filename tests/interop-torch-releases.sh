# Checkpoints written by PyTorch releases 2.0 to 2.15 themselves (tests/data/torch-releases,
# made once a release by tests/interop/save_torch_release.py: one process, a file an item,
# DTensors on 1-D and 2-D meshes, ShardedTensors, FSDP2 with Adam state, zstd, as far as each
# release writes them). For every key of every checkpoint, dcp ls, dcp digest (parsed, and
# through a catalog written then served), dcpfs.open, dcp.load with dcpfs.torch.Reader and a
# dcpfs mount of the whole folder must give the bytes and values that release's own load
# gave; dcp verify passes (tests/interop/check_releases.py). dcpload on 1 and 3 ranks, by
# rows and in blocks (small staging pieces): each rank's region is cut from those bytes, and
# 3 ranks together read what one rank reads, each stored byte once (tests/load_check.py).
. "$top_srcdir/tests/python_lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need_fuse
data="$top_srcdir/tests/data/torch-releases"
[ -d "$data" ] || fail "$data is missing"
need python3
need_python_module numpy
fuse_scratch
releases=$(cd "$data" && ls | sort -t. -k1,1n -k2,2n -k3,3n)
if [ -n "${DCP_SANITIZED:-}" ]; then   # the sanitizers watch dcpload: oldest and newest release
    releases="$(echo "$releases" | head -1) $(echo "$releases" | tail -1)"
fi
for v in $releases; do
    for case in "$data/$v"/*/; do
        case=${case%/}
        name=$(basename "$case")
        [ "$name" != files ] || continue   # single's items, a file each: the 1.13 fixtures' layout
        runs="$SCRATCH/runs/$v/$name"
        dcpload_runs "torch $v $name" "$case/ckpt" "$runs" "rows-1 rows-3 blocks-3"
        python3 "$top_srcdir/tests/load_check.py" "$DCP" "$case/ckpt" "$case/truth.json" "$runs" >/dev/null ||
            fail "torch $v $name: dcpload's regions"
    done
    echo "torch $v: dcpload's regions hold PyTorch's bytes"
done
# After dcpload: in a sanitizer build the package's runtimes are preloaded from here on.
use_python_package torch
need_python_module xxhash
need_python_module safetensors
mount_dcpfs "$data" "$SCRATCH/mnt" -o no_catalog
python3 "$top_srcdir/tests/interop/check_releases.py" "$DCP" "$data" "$SCRATCH/mnt" ||
    fail "a release's checkpoint reads otherwise than PyTorch wrote it"
unmount_dcpfs "$SCRATCH/mnt"
echo ok
