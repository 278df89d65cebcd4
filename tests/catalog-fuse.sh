# dcpfs over models served by the catalog: directories are listed on demand
# (a small one when it is looked up) and single names in a large one are
# answered one by one, so on fresh mounts every file is reached by its path
# alone (no readdir anywhere), with the right size, bytes and xattrs, in the
# raw and npy views; names no key encodes to are not found; and a second
# mount (served from the catalog filled by the first) shows the same tree
# when listed. The same holds with -o no_catalog (a parsed model).
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
need python3
need_fuse
fuse_scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
cat > "$SCRATCH/by_path.py" <<'PY'
# Reach every key's file by its path only, in a shuffled order (no listing).
import hashlib, os, random, sys
sys.path.insert(0, os.path.dirname(sys.argv[3]))
from fuse_check import load_entries, paths
mnt, manifest, npy = sys.argv[1], sys.argv[2], "--npy" in sys.argv
entries = load_entries(manifest)
want, dirs = paths(entries, npy)
keys = sorted(entries)
random.Random(7).shuffle(keys)
for k in keys:
    e, p = entries[k], os.path.join(mnt, want[k])
    st = os.stat(p)
    if os.getxattr(p, "user.dcp.key").decode() != k:
        sys.exit(f"FAIL: {p}: user.dcp.key is not {k}")
    data = open(p, "rb").read()
    if npy and e["kind"] == "tensor":
        # NAME.npy: a header (magic, version, a 2- or 4-byte length), then the bytes
        if data[:6] != b"\x93NUMPY":
            sys.exit(f"FAIL: {p}: not an npy file")
        hlen = int.from_bytes(data[8:10], "little") + 10 if data[6] == 1 else int.from_bytes(data[8:12], "little") + 12
        data = data[hlen:]
    elif "nbytes" in e and st.st_size != e["nbytes"]:
        sys.exit(f"FAIL: {p}: size {st.st_size} != {e['nbytes']}")
    if "nbytes" in e and len(data) != e["nbytes"]:
        sys.exit(f"FAIL: {p}: {len(data)} bytes of data != {e['nbytes']}")
    if "sha256" in e and hashlib.sha256(data).hexdigest() != e["sha256"]:
        sys.exit(f"FAIL: {p}: bytes differ from the manifest")
for d in dirs:
    if not os.path.isdir(os.path.join(mnt, d)):
        sys.exit(f"FAIL: {d} is not a directory")
print(f"{mnt}: {len(keys)} files reached by path")
PY

for case in 01_single_plain 05_mixed_2ranks 09_megatron_torch_dist; do
    ck="$FIXTURES/$case/ckpt" manifest="$FIXTURES/$case/expected/manifest.json" mnt="$SCRATCH/$case"
    [ -f "$manifest" ] || fail "$manifest is missing"
    # -d: the log says whether the model was parsed or served from the catalog (a debug line)
    mount_dcpfs "$ck" "$mnt" -d       # parses, stores, and serves from the catalog
    python3 "$SCRATCH/by_path.py" "$mnt" "$manifest" "$FUSE_CHECK" || fail "$case: first mount"
    unmount_dcpfs "$mnt"
    grep -q ": model parsed" "$mnt.log" || fail "$case: the first mount did not parse: $(cat "$mnt.log")"
    mount_dcpfs "$ck" "$mnt" -d       # served from the catalog at once
    python3 "$SCRATCH/by_path.py" "$mnt" "$manifest" "$FUSE_CHECK" || fail "$case: second mount"
    grep -q ": model served from the catalog" "$mnt.log" ||
        fail "$case: the second mount was not served from the catalog: $(cat "$mnt.log")"
    python3 "$FUSE_CHECK" tree "$mnt" "$manifest" --ckpt="$ck" >/dev/null || fail "$case: listing after lookups"
    unmount_dcpfs "$mnt"
done

# The manifest of a checkpoint, from dcp itself (parsing, no catalog).
manifest_of() {   # manifest_of CKPT OUT
    python3 - "$DCP" "$1" "$2" <<'PY'
import hashlib, json, subprocess, sys
dcp, ck, out = sys.argv[1:]
entries = []
for line in subprocess.run([dcp, "--no-catalog", "ls", "--json", ck], check=True, capture_output=True).stdout.splitlines():
    e = json.loads(line)
    e.pop("chunks", None)
    data = subprocess.run([dcp, "--no-catalog", "cat", ck, e["key"]], check=True, capture_output=True).stdout
    e["sha256"] = hashlib.sha256(data).hexdigest()
    entries.append(e)
json.dump({"entries": entries}, open(out, "w"))
PY
}
by_path_twice() {   # by_path_twice CKPT MANIFEST [dcpfs options]: a first mount, then one served
    local ck=$1 manifest=$2 mnt="$SCRATCH/m" npy=""; shift 2
    case " $* " in *view=npy*) npy=--npy ;; esac
    for pass in first served; do
        mount_dcpfs "$ck" "$mnt" "$@"
        python3 "$SCRATCH/by_path.py" "$mnt" "$manifest" "$FUSE_CHECK" $npy || fail "$ck $*: $pass mount"
        unmount_dcpfs "$mnt"
        # which way the model came is a debug line: without -d, every mount logged it
        ! grep -E ": model (parsed|served from the catalog)$" "$mnt.log" || fail "$ck $*: $pass mount: logged without -d"
    done
}

# Directories of more than 16 entries (model/layers/0..39, extra/0..19): each
# name is answered on its own, in both views.
"$DCP" synth "$SCRATCH/synth" --keys 40 --shape 6,4 --ranks 2 --bytes-items 20 --seed 3 >/dev/null ||
    fail "dcp synth failed"
manifest_of "$SCRATCH/synth" "$SCRATCH/synth.json"
by_path_twice "$SCRATCH/synth" "$SCRATCH/synth.json"
by_path_twice "$SCRATCH/synth" "$SCRATCH/synth.json" -o view=npy
by_path_twice "$SCRATCH/synth" "$SCRATCH/synth.json" -o no_catalog   # the parsed model's key order

# The same with the name encoding: escapes, empty components, and a key that
# is also a directory (NAME.data) among more than 16 siblings.
if python3 -c 'import torch' 2>/dev/null; then
    timeout 300 python3 - "$SCRATCH/names" <<'PY' || fail "PyTorch save failed"
import sys, torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
sd = {f"big.k{i}": torch.full((i + 1,), float(i)) for i in range(20)}
sd.update({"big.k3.sub": torch.arange(4), "big.p%q": torch.ones(2), "big.s/t": torch.zeros(3),
           "big..e": torch.ones(1), "big.t.": torch.ones(2), "big.k7.deep.er": torch.arange(5, dtype=torch.int16),
           "big.meta": {"note": "bytes"}})
dcp.save(sd, storage_writer=FileSystemWriter(sys.argv[1]))
PY
    manifest_of "$SCRATCH/names" "$SCRATCH/names.json"
    by_path_twice "$SCRATCH/names" "$SCRATCH/names.json"
    by_path_twice "$SCRATCH/names" "$SCRATCH/names.json" -o view=npy
    by_path_twice "$SCRATCH/names" "$SCRATCH/names.json" -o no_catalog
    mnt="$SCRATCH/m"
    mount_dcpfs "$SCRATCH/names" "$mnt"
    for f in big/k3.data big/k3/sub big/p%25q big/s%2Ft big/%/e big/t/% big/k7.data big/k7/deep/er big/meta/note; do
        [ -f "$mnt/$f" ] || fail "$f is not a file"
    done
    for f in big/k3 big/k7/deep.data big/k0.data big/p%q big/s%2ft big/k19.npy big/meta.data; do
        [ ! -f "$mnt/$f" ] || fail "$f should not exist"
    done
    python3 "$FUSE_CHECK" tree "$mnt" "$SCRATCH/names.json" >/dev/null || fail "names: listing after lookups"
    unmount_dcpfs "$mnt"
else
    echo "(no PyTorch: the name-encoding case is not run)"
fi

# Names that no key encodes to, in a directory not listed yet: not found.
mnt="$SCRATCH/neg"
mount_dcpfs "$FIXTURES/01_single_plain/ckpt" "$mnt"
for name in dtypes/nosuch dtypes/float32.data dtypes/float32.npy dtypes/float32.x dtypes/%zz dtypes/%2f \
            dtypes/float32/x dtypes. "dtypes/%" "%" scalar/int64.data; do
    [ ! -e "$mnt/$name" ] || fail "$name exists"
done
[ -f "$mnt/dtypes/float32" ] || fail "dtypes/float32 is not found after negative lookups"
[ "$(stat -c %h "$mnt/dtypes")" = 2 ] || fail "dtypes has $(stat -c %h "$mnt/dtypes") links"
unmount_dcpfs "$mnt"

# A relative -o catalog=PATH is the starting directory's, also for a daemon in the
# background (it works from "/") that opens a checkpoint of a folder on first use: that
# catalog was made in "/" instead.
rel="dcpfs-test-catalog-$$.sqlite" cwd="$SCRATCH/cwd" mnt="$SCRATCH/bg"
mkdir -p "$cwd" "$SCRATCH/run" "$mnt"
cp -r "$FIXTURES/05_mixed_2ranks/ckpt" "$SCRATCH/run/step_1"
mkfifo "$SCRATCH/bg.ready"
MOUNTS+=("$mnt")
(cd "$cwd" && exec "$DCPFS" -o "ready_fd=3,catalog=$rel" "$SCRATCH/run" "$mnt" 3>"$SCRATCH/bg.ready" 2>"$mnt.log") &
byte=""
read -r -t 60 -n 1 byte <"$SCRATCH/bg.ready" || true
[ "$byte" = 1 ] || fail "dcpfs in the background did not mount: $(cat "$mnt.log")"
wait $! || fail "dcpfs in the background: its starting process failed: $(cat "$mnt.log")"
f=$(cd "$mnt/step_1" && find . -type f ! -name all.safetensors | head -1)
k=$(python3 -c 'import os, sys; print(os.getxattr(sys.argv[1], "user.dcp.key").decode())' "$mnt/step_1/$f")
"$DCP" --no-catalog cat "$SCRATCH/run/step_1" "$k" | cmp - "$mnt/step_1/$f" || fail "$f differs from dcp cat $k"
fusermount3 -u "$mnt" || fail "fusermount3 -u $mnt"
if [ ! -f "$cwd/$rel" ]; then
    [ -f "/$rel" ] && rm -f "/$rel" "/$rel-wal" "/$rel-shm" && fail "-o catalog=$rel was made in /, not in dcpfs's starting directory"
    fail "-o catalog=$rel: no catalog in dcpfs's starting directory: $(ls -A "$cwd")"
fi
echo "catalog-fuse: ok"
