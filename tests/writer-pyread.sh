# The Python safetensors package (safe_open, numpy) reads what dcp convert writes:
# single files and sharded folders, byte-exact against the fixture manifests.
. "$top_srcdir/tests/lib.sh"
need python3
need_python_module numpy
need_python_module safetensors
scratch
for name in 02_rowwise_4ranks 05_mixed_2ranks 08_single_file_per_rank; do
    $DCP convert -q "$FIXTURES/$name/ckpt" "$SCRATCH/$name.safetensors"
    $DCP convert -q --max-shard-size 4K "$FIXTURES/$name/ckpt" "$SCRATCH/$name-shards"
    python3 - "$SCRATCH/$name.safetensors" "$SCRATCH/$name-shards" "$FIXTURES/$name/expected/manifest.json" <<'PY' || fail "$name"
import glob, hashlib, json, os, sys
from safetensors import safe_open
single, shards, manifest = sys.argv[1:4]
want = {e["key"]: e for e in json.load(open(manifest))["entries"] if e["kind"] == "tensor"}
numpy_ok = {k: e for k, e in want.items() if e["dtype"] not in ("bfloat16",)}
def check(path, keys):
    with safe_open(path, framework="numpy") as f:
        for k in f.keys():
            if k not in numpy_ok:
                continue
            a = f.get_tensor(k)
            assert list(a.shape) == want[k]["shape"], (path, k)
            assert hashlib.sha256(a.tobytes()).hexdigest() == want[k]["sha256"], (path, k)
            keys.add(k)
seen = set()
check(single, seen)
assert seen == set(numpy_ok), (sorted(seen), sorted(numpy_ok))
index = json.load(open(os.path.join(shards, "model.safetensors.index.json")))
assert set(index["weight_map"]) == set(want)
assert index["metadata"]["total_size"] == sum(e["nbytes"] for e in want.values())
seen = set()
for p in sorted(glob.glob(os.path.join(shards, "model-*.safetensors"))):
    check(p, seen)
assert seen == set(numpy_ok)
print("ok", single)
PY
done
