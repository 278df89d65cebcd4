# Every on-disk format PyTorch 2.13 writes for one process, read back by `dcp cat`:
# torch.save records (one file, and one file per item), SerializationFormat.SAFETENSORS
# shards, the zstd stream extension, and the Hugging Face storage writer (index + two
# files, per-rank shard files, sharded/ + consolidated). Tensors cover every dtype
# torch.save rebuilds with v2 (typed storages) and v3 (UntypedStorage: float8, uint16-64),
# 0-d, empty, transposed, channels-last, conj and neg views; each key's bytes must hash
# to the sha256 PyTorch computed, and each bytes item must torch.load to its value.
. "$top_srcdir/tests/lib.sh"
need python3
need sha256sum
need_torch
need_python_module safetensors
scratch
GEN="$top_srcdir/tests/interop/save_formats.py"
variants="torch_save torch_save_files safetensors zstd hf hf_distributed hf_consolidated"
python3 -c 'import zstandard' 2>/dev/null || {
    echo "zstd variant skipped: no zstandard module"; variants=$(echo "$variants" | sed 's/ zstd//'); }

# One Python process writes them all (importing torch dominates the run time).
timeout 600 python3 "$GEN" "$SCRATCH" $variants >"$SCRATCH/save.log" 2>&1 || {
    cat "$SCRATCH/save.log"; fail "PyTorch save failed"; }

tab=$(printf '\t')
bytes_items=
for v in $variants; do
    out="$SCRATCH/$v"
    ck="$out/ckpt"
    # Exactly the saved keys with PyTorch's dtypes and shapes.
    "$DCP" --no-catalog ls "$ck" | awk 'NR > 1 { print $1, $2, $3 }' | sort >"$out.ls"
    awk -F"$tab" '{ print $1, ($2 == "bytes" ? "bytes" : $3), ($2 == "bytes" ? "-" : $4) }' "$out/truth.tsv" |
        sort >"$out.want"
    diff "$out.want" "$out.ls" || fail "$v: dcp ls differs from what PyTorch saved (< saved, > listed)"
    n=0
    mkdir "$out/bytes"
    while IFS="$tab" read -r key kind dtype shape sha; do
        n=$((n + 1))
        if [ "$kind" = bytes ]; then
            "$DCP" --no-catalog cat "$ck" "$key" >"$out/bytes/$key" || fail "$v: dcp cat $key failed"
            bytes_items="$bytes_items $out/bytes/$key"
            continue
        fi
        got=$("$DCP" --no-catalog cat "$ck" "$key" 2>"$out.err" | sha256sum | cut -d' ' -f1)
        [ -s "$out.err" ] && { cat "$out.err"; fail "$v: dcp cat $key failed"; }
        [ "$got" = "$sha" ] || fail "$v: $key: sha256 $got, PyTorch's bytes hash to $sha"
    done <"$out/truth.tsv"
    [ "$n" -ge 8 ] || fail "$v: only $n keys in the truth"
    case $v in
        hf*) "$DCP" --no-catalog info "$ck" | grep -q 'hf_safetensors' || fail "$v: dcp info does not say hf_safetensors" ;;
    esac
    echo "$v: $n keys byte-exact"
done
# Bytes items are whole torch.save blobs: PyTorch must load them back to the saved values.
[ -z "$bytes_items" ] || python3 "$GEN" --check-bytes $bytes_items || fail "bytes items differ"

# An empty tensor with a huge dimension, torch.empty(2**62, 0), is one torch saves and loads: one
# such key refused the whole checkpoint ("z: shape too large", its element count multiplied past
# 64 bits before the 0). Saved by dcp.save (torch.save records, SAFETENSORS shards, the Hugging
# Face writer) and torch.save beside a plain key, in float64 too (byte strides past 64 bits); z3, [0, 2^62, 2^62], is a shape torch cannot make (its strides overflow),
# forged into a copy of the DCP's .metadata. Every command reads them as the empty tensors they
# are; convert writes z and z2 as torch does, and refuses z3 naming it.
E="$SCRATCH/empty"
mkdir "$E"
python3 - "$E" >"$E/save.log" 2>&1 <<'PY' || { cat "$E/save.log"; fail "saving the empty tensors failed"; }
import pickle, shutil, sys, warnings
import torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorStorageMetadata
warnings.simplefilter("ignore")
d = sys.argv[1]
sd = {"z": torch.empty(2**62, 0), "z2": torch.empty(0, 2**62, dtype=torch.float64),
      "w": torch.tensor([1.0, 2.0, 3.0])}
dcp.save(sd, checkpoint_id=f"{d}/dcp", no_dist=True)
torch.save(sd, f"{d}/t.pt")
from torch.distributed.checkpoint.filesystem import SerializationFormat
dcp.save(sd, storage_writer=dcp.FileSystemWriter(f"{d}/st", serialization_format=SerializationFormat.SAFETENSORS),
         no_dist=True)
dcp.save(sd, storage_writer=dcp.HuggingFaceStorageWriter(f"{d}/hf"), no_dist=True)
shutil.copytree(f"{d}/dcp", f"{d}/forged")
with open(f"{d}/forged/.metadata", "rb") as f:
    m = pickle.load(f)
size = torch.Size([0, 2**62, 2**62])
m.state_dict_metadata["z3"] = TensorStorageMetadata(
    properties=m.state_dict_metadata["z2"].properties, size=size,
    chunks=[ChunkStorageMetadata(offsets=torch.Size([0, 0, 0]), sizes=size)])
m.storage_data[MetadataIndex("z3", torch.Size([0, 0, 0]), 0)] = m.storage_data[MetadataIndex("z2", torch.Size([0, 0]), 0)]
with open(f"{d}/forged/.metadata", "wb") as f:
    pickle.dump(m, f)
PY
want_ls="w float32 [3] 12 B;z float32 [4611686018427387904,0] 0 B;z2 float64 [0,4611686018427387904] 0 B;"
printf '\000\000\200\077\000\000\000\100\000\000\100\100' >"$E/w.bytes"   # 1.0, 2.0, 3.0 little-endian
# The keys' lines sorted (the Hugging Face writer's order is the names')
listing() { "$DCP" "$@" | awk 'NR > 1 { print $1, $2, $3, $4, $5 }' | sort | tr '\n' ';'; }
for ck in "$E/dcp" "$E/t.pt" "$E/st" "$E/hf" "$E/forged"; do
    want=$want_ls
    [ "$ck" = "$E/forged" ] && want="${want}z3 float64 [0,4611686018427387904,4611686018427387904] 0 B;"
    got=$(listing --no-catalog ls "$ck")
    [ "$got" = "$want" ] || fail "$ck: dcp ls: $got"
    # Parsed into the catalog, then listed from it.
    for i in 1 2; do
        got=$(listing --catalog "$E/cat.sqlite" ls "$ck")
        [ "$got" = "$want" ] || fail "$ck: dcp ls with the catalog ($i): $got"
    done
    for key in z z2 $([ "$ck" = "$E/forged" ] && echo z3); do
        "$DCP" --no-catalog cat "$ck" "$key" >"$E/out" || fail "$ck: dcp cat $key failed"
        [ ! -s "$E/out" ] || fail "$ck: dcp cat $key wrote $(wc -c <"$E/out") bytes"
    done
    "$DCP" --no-catalog cat --box 5:3,0:0 "$ck" z >"$E/out" && [ ! -s "$E/out" ] || fail "$ck: a box of z"
    "$DCP" --no-catalog cat "$ck" w | cmp - "$E/w.bytes" || fail "$ck: dcp cat w differs from PyTorch's bytes"
    "$DCP" --no-catalog digest "$ck" >"$E/digest" || fail "$ck: dcp digest failed"
    [ "$(awk '{ print $2 }' "$E/digest" | sort | head -3 | tr '\n' ' ')" = "w z z2 " ] ||
        fail "$ck: dcp digest: $(cat "$E/digest")"
    "$DCP" --no-catalog info "$ck" | grep -q '^keys: *[34] ([34] tensors' || fail "$ck: dcp info"
done
# Every format gives w the same digest (the value's).
"$DCP" --no-catalog digest "$E/dcp" | grep ' w$' >"$E/w.a"
"$DCP" --no-catalog digest "$E/t.pt" | grep ' w$' | cmp - "$E/w.a" || fail "w's digest differs between dcp and .pt"
for ck in dcp st hf; do
    "$DCP" --no-catalog verify "$E/$ck" | tail -1 | grep -qx "$E/$ck: OK" || fail "dcp verify of the empty tensors ($ck)"
done
# convert: z and z2 written as torch.save, safetensors and DCP write them, read back by torch.
for dst in c.pt c.safetensors cdcp; do
    "$DCP" --no-catalog convert -q "$E/dcp" "$E/$dst" || fail "convert to $dst failed"
done
"$DCP" --no-catalog convert -q "$E/t.pt" "$E/from-pt.safetensors" || fail "convert .pt to safetensors failed"
python3 - "$E" <<'PY' 2>&1 | grep -v Warning | grep -q '^ok$' || fail "torch read the converted files otherwise"
import sys, warnings
import torch, torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
warnings.simplefilter("ignore")
d = sys.argv[1]
want = {"z": ((2**62, 0), torch.float32), "z2": ((0, 2**62), torch.float64), "w": ((3,), torch.float32)}
def check(sd, what):
    got = {k: (tuple(v.shape), v.dtype) for k, v in sd.items()}
    assert got == want, (what, got)
    assert sd["w"].tolist() == [1.0, 2.0, 3.0], what
check(torch.load(f"{d}/c.pt"), "c.pt")
check(load_file(f"{d}/c.safetensors"), "c.safetensors")
check(load_file(f"{d}/from-pt.safetensors"), "from-pt.safetensors")
sd = {"z": torch.empty(2**62, 0), "z2": torch.empty(0, 2**62, dtype=torch.float64), "w": torch.zeros(3)}
dcp.load(sd, checkpoint_id=f"{d}/cdcp", no_dist=True)
check(sd, "cdcp")
print("ok")
PY
# z3's contiguous strides pass int64 (torch.save cannot write it either): refused, named.
expect_fail "dcp: $E/f.pt: z3: shape [0,4611686018427387904,4611686018427387904]: too large (its strides or element count overflow)" \
    "$DCP" --no-catalog convert -q "$E/forged" "$E/f.pt"
expect_fail ": z3: shape [0,4611686018427387904,4611686018427387904]: too large (its strides or element count overflow)" \
    "$DCP" --no-catalog convert -q "$E/forged" "$E/fdcp"
[ ! -e "$E/f.pt" ] && [ ! -e "$E/fdcp" ] || fail "a refused convert left its output"
echo "empty tensors with a dimension of 2^62: read, digested, verified, converted"
