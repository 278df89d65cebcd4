# Megatron-Core checkpoints as each release of tests/interop/megatron-releases.txt writes
# them (its own dist_checkpointing.save, PyTorch 2.13 underneath; tests/interop/megatron_releases.py):
# a GPTModel from one rank, and from 4 ranks (tensor parallel 2 x data parallel 2, fully
# parallel save) with the distributed optimizer's flattened tensors. For every key, dcp ls's
# shape and dcp digest's XXH3-128 must equal PyTorch's own view of the checkpoint
# (torch.distributed.checkpoint.load into a full tensor; a bytes item's stored bytes), first
# parse and served from the catalog; dcp info names the layout and dcp verify passes; mounted
# with dcpfs, every key's file holds the same bytes; dcpload on 1 and 3 ranks, by rows and in
# blocks, cuts each rank's region from those bytes and reads each stored byte once
# (tests/load_check.py); dcpfs.torch.load and dcp.load with dcpfs.torch.Reader fill full
# tensors with them (megatron_releases.py check).
. "$top_srcdir/tests/python_lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need python3
need getfattr
need_fuse
python3 -c 'import torch' 2>/dev/null || skip "PyTorch is not installed (pip install torch==2.13.0)"
need_python_module xxhash
need_python_module psutil
install="$top_srcdir/tests/interop/install-megatron-releases.sh"
dir=$(sh "$install" --where)
releases=$(grep -v '^#' "$top_srcdir/tests/interop/megatron-releases.txt")
missing=
for v in $releases; do
    [ -f "$dir/$v/megatron/core/__init__.py" ] || missing="$missing $v"
done
[ -z "$missing" ] || skip "megatron-core$missing not installed in $dir (sh tests/interop/install-megatron-releases.sh)"
if [ -n "${DCP_SANITIZED:-}" ]; then   # the sanitizers watch dcp; the saves are Python's: oldest and newest
    releases="$(echo "$releases" | head -1) $(echo "$releases" | tail -1)"
    echo "sanitizer build: megatron-core $releases only"
fi
fuse_scratch
for v in $releases; do
    PYTHONPATH="$dir/$v" timeout 600 python3 "$top_srcdir/tests/interop/megatron_releases.py" save "$SCRATCH/$v" \
        >"$SCRATCH/$v.log" 2>&1 || { tail -30 "$SCRATCH/$v.log"; fail "megatron-core $v: saving failed"; }
    for case in tp1 tp2dp2; do
        ck="$SCRATCH/$v/$case"
        for how in parsed catalog-written catalog-served; do
            if [ $how = parsed ]; then set -- --no-catalog; else set -- --catalog "$SCRATCH/catalog.sqlite"; fi
            "$DCP" "$@" digest --json "$ck" >"$ck.digest" || fail "megatron-core $v $case: dcp digest ($how) failed"
            python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    shape = "bytes" if r["dtype"] == "bytes" else "[" + ",".join(map(str, r["shape"])) + "]"
    print("%s\t%s\t%s" % (r["key"], shape, r["xxh3_128"]))' "$ck.digest" >"$ck.lines" ||
                fail "megatron-core $v $case: dcp digest --json ($how) printed something else"
            LC_ALL=C sort "$ck.lines" >"$ck.got"
            LC_ALL=C sort "$ck.truth" >"$ck.want"
            [ -s "$ck.want" ] || fail "megatron-core $v $case: no keys in PyTorch's view"
            diff "$ck.want" "$ck.got" >"$ck.diff" ||
                { cat "$ck.diff"; fail "megatron-core $v $case: dcp digest ($how) differs from PyTorch's view (< PyTorch, > dcp)"; }
        done
        "$DCP" --catalog "$SCRATCH/catalog.sqlite" info "$ck" | grep -q 'rebuilt from the catalog' ||
            fail "megatron-core $v $case: not served from the catalog"
        "$DCP" --no-catalog info "$ck" | grep -q 'Megatron-Core torch_dist' ||
            fail "megatron-core $v $case: dcp info does not name the Megatron-Core layout"
        "$DCP" --no-catalog verify "$ck" >"$ck.verify" 2>&1 || { cat "$ck.verify"; fail "megatron-core $v $case: dcp verify failed"; }
        mount_dcpfs "$ck" "$ck.mnt" -o no_catalog
        python3 - "$ck.mnt" "$ck.truth" <<'PY' || fail "megatron-core $v $case: the mount's files differ from PyTorch's view"
import os, sys, xxhash
mnt, truth = sys.argv[1], sys.argv[2]
want = {line.split("\t")[0]: line.split("\t")[2].strip() for line in open(truth)}
seen = {}
for top, dirs, files in os.walk(mnt):
    for name in files:
        path = os.path.join(top, name)
        try:
            key = os.getxattr(path, "user.dcp.key").decode()
        except OSError:
            continue   # metadata.json, common.pt: Megatron's own files, as they are
        with open(path, "rb") as f:
            seen[key] = xxhash.xxh3_128_hexdigest(f.read())
bad = sorted(k for k in want if seen.get(k) != want[k])
extra = sorted(set(seen) - set(want))
for k in bad:
    print(f"{k}: mount {seen.get(k, 'missing')}, PyTorch {want[k]}")
for k in extra:
    print(f"{k}: on the mount, not in PyTorch's view")
sys.exit(1 if bad or extra else 0)
PY
        unmount_dcpfs "$ck.mnt"
        mkdir "$ck.runs"
        for run in rows-1 rows-3 blocks-3; do
            mpirun "${run#*-}" "$DCPLOAD" "$ck" --layout "${run%-*}" --json --staging 8192 \
                >"$ck.runs/$run.json" 2>"$ck.err" ||
                fail "megatron-core $v $case: dcpload -n ${run#*-} --layout ${run%-*} failed: $(cat "$ck.err")"
        done
        # Megatron's tensors are saved unshared (each chunk its own storage): every byte of
        # every tensor is stored once, so the ranks must read exactly their sum
        unique=$("$DCP" --no-catalog ls --json "$ck" | python3 -c '
import json, sys
print(sum(r["nbytes"] for r in map(json.loads, sys.stdin) if r["kind"] == "tensor"))') ||
            fail "megatron-core $v $case: dcp ls --json failed"
        python3 "$top_srcdir/tests/load_check.py" "$DCP" "$ck" "$ck.truth.json" "$ck.runs" "$unique" >"$ck.load" 2>&1 ||
            { cat "$ck.load"; fail "megatron-core $v $case: dcpload's regions"; }
    done
    echo "megatron-core $v: tp1 $(wc -l <"$SCRATCH/$v/tp1.truth") keys, tp2dp2 $(wc -l <"$SCRATCH/$v/tp2dp2.truth") keys: dcp's view equals PyTorch's, dcpload's regions too"
done
# After the saves and dcpload: in a sanitizer build the package's runtimes are preloaded from here on.
use_python_package torch
outs=
for v in $releases; do outs="$outs $SCRATCH/$v"; done
# shellcheck disable=SC2086
python3 "$top_srcdir/tests/interop/megatron_releases.py" check $outs ||
    fail "dcpfs.torch.load or dcp.load with dcpfs.torch.Reader differs from PyTorch's own load"
echo ok
