#!/bin/bash
# Per-rank DTensor saves read as one checkpoint: torch-checkpointing folders (model_R.pt ...)
# and verl FSDP checkpoints (model_world_size_W_rank_R.pt), written by real 2- and 4-process
# gloo saves (rows sharded unevenly, columns with an empty last piece, replicated, a strided
# local tensor, FSDP2 parameters, _StridedShard, 2-D meshes; FSDP1's ShardedTensors in a verl
# folder), read byte-exact by `dcp cat` against the full tensors the writer had, `dcp digest`
# equal to the same weights saved as DCP, non-tensor items as torch.save bytes items,
# dcpload's regions on 2 and 3 ranks; hostile folders (truncated, garbled, random rank files,
# a rank file of another save with another global shape, Partial placements, a missing rank)
# fail with the file or key named.
. "$top_srcdir/tests/lib.sh"
need python3
need_torch
python3 -c 'import torch_checkpointing' 2>/dev/null ||
    fail "torch_checkpointing is not installed (pip install --no-deps torch-checkpointing==0.1.1, as .ci/run does)"
scratch
export XDG_CACHE_HOME="$SCRATCH/cache"
for world in 2 4; do
    S="$SCRATCH/w$world"
    timeout 300 python3 "$top_srcdir/tests/interop/save_rankfiles.py" "$S" "$world" >"$S.log" 2>&1 ||
        { cat "$S.log"; fail "the $world-rank save failed"; }
    ls "$S/tc/model_$((world - 1)).pt" "$S/verl/model_world_size_${world}_rank_0.pt" >/dev/null ||
        fail "the save did not write the expected rank files: $(ls "$S"/*)"
    "$DCP" info "$S/tc" | grep -q 'torch-checkpointing' || fail "dcp info does not name torch-checkpointing"
    "$DCP" info "$S/verl" | grep -q 'verl' || fail "dcp info does not name verl"
    # byte-exact against full_tensor(), the bytes items torch.load-able
    python3 "$top_srcdir/tests/interop/check_truth.py" "$DCP" "$S/tc" "$S/truth.json"
    python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))
json.dump({k: v for k, v in t.items() if k.startswith("model.")}, open(sys.argv[2], "w"))' \
        "$S/truth.json" "$S/model.json"
    python3 "$top_srcdir/tests/interop/check_truth.py" "$DCP" "$S/verl" "$S/model.json"
    python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))
json.dump({k: t[k] for k in ("model.w0", "model.w1", "model.cols", "model.ids")}, open(sys.argv[2], "w"))' \
        "$S/truth.json" "$S/fsdp1.json"
    python3 "$top_srcdir/tests/interop/check_truth.py" "$DCP" "$S/verl_fsdp1" "$S/fsdp1.json"
    [ "$("$DCP" cat "$S/tc" step | python3 -c 'import io, sys, torch
print(torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=False))')" = 42 ] ||
        fail "item step is not the torch.save of 42"
    # a replicated tensor is stored once, an empty piece not at all
    [ "$("$DCP" layout "$S/tc" | grep -c '^model.rep ')" = 1 ] || fail "model.rep: not one chunk: $("$DCP" layout "$S/tc")"
    [ "$("$DCP" layout "$S/tc" | grep -c '^model.cols ')" = "$([ "$world" = 4 ] && echo 3 || echo 2)" ] ||
        fail "model.cols: wrong chunk count: $("$DCP" layout "$S/tc" | grep '^model.cols')"
    # the same digests as the weights saved by torch.distributed.checkpoint
    # (but model.strided1d, which torch.distributed.checkpoint cannot save: its pieces are
    # several runs of rows a rank)
    for f in tc verl dcp; do
        "$DCP" digest --keys 'model.*' "$S/$f" | grep -v ' model\.strided1d$' | sort >"$S/digest.$f" ||
            fail "dcp digest $f"
    done
    [ "$(wc -l <"$S/digest.dcp")" -ge 10 ] || fail "too few digests: $(cat "$S/digest.dcp")"
    diff "$S/digest.dcp" "$S/digest.tc" || fail "$world ranks: torch-checkpointing digests differ from DCP's"
    diff "$S/digest.dcp" "$S/digest.verl" || fail "$world ranks: verl digests differ from DCP's"
    # dcp convert to a torch.save file holds the same weights
    "$DCP" convert --quiet "$S/tc" "$S/all.pt" || fail "dcp convert"
    "$DCP" digest --keys 'model.*' "$S/all.pt" | grep -v ' model\.strided1d$' | sort | diff "$S/digest.dcp" - ||
        fail "converted digests differ"
    # a rank holding several runs of rows: two chunks a rank
    [ "$("$DCP" layout "$S/tc" | grep -c '^model.strided1d ')" = "$([ "$world" = 4 ] && echo 6 || echo 4)" ] ||
        fail "model.strided1d: $("$DCP" layout "$S/tc" | grep '^model.strided1d')"
    # the collective loader (dcpload, 2 and 3 ranks, by rows and by columns): each rank's region
    # of every tensor equals the truth (CI has MPICH; without it this part says so)
    if [ -x "$top_builddir/dcpload" ] && [ -n "${MPIEXEC:-}" ] && command -v "$MPIEXEC" >/dev/null 2>&1; then
        mkdir -p "$S/runs"
        for n in 2 3; do
            for layout in rows cols; do
                # Under --enable-sanitizers MPI_Init leaks hwloc plugin state (not ours): the
                # suppressions load_lib.sh sets, for dcpload alone (a full unwind would slow python).
                LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$top_srcdir/tests/load.supp" \
                ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0" \
                timeout -k 10 120 "$MPIEXEC" -launcher fork -n "$n" "$top_builddir/dcpload" "$S/tc" --layout "$layout" \
                    --json >"$S/runs/$layout-$n.json" 2>"$S/runs/err" || fail "dcpload -n $n --layout $layout: $(cat "$S/runs/err")"
            done
        done
        python3 "$top_srcdir/tests/load_check.py" "$DCP" "$S/tc" "$S/truth.json" "$S/runs" || fail "dcpload regions"
    else
        echo "dcpload part not run: no dcpload or MPIEXEC"
    fi
done

# hostile folders, from the 2-rank save
S="$SCRATCH/w2"
H="$SCRATCH/bad"
mkdir "$H"
cp -r "$S/tc" "$H/trunc"; truncate -s 3000 "$H/trunc/model_1.pt"
expect_fail "trunc/model_1.pt: rank file: corrupt torch.save archive" "$DCP" ls "$H/trunc"
cp -r "$S/tc" "$H/garbled"
python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); i = b.find(b"_coordinate_on_dim")
b[i + 30:i + 60] = b"\xff" * 30; open(p, "wb").write(b)' "$H/garbled/model_1.pt"
expect_fail "garbled/model_1.pt: data.pkl: unknown opcode" "$DCP" ls "$H/garbled"
cp -r "$S/tc" "$H/random"; head -c 5000 /dev/urandom >"$H/random/model_0.pt"
expect_fail "random/model_0.pt" "$DCP" ls "$H/random"
cp -r "$S/tc" "$H/shape"; cp "$S/alt/model_1.pt" "$H/shape/"
expect_fail "model_1.pt: model.w0: global shape [12, 6] differs from [10, 6] in model_0.pt" "$DCP" ls "$H/shape"
expect_fail "model_0.pt: model.p: placement 0 is Partial" "$DCP" ls "$S/partial"
cp -r "$S/tc" "$H/missing"; rm "$H/missing/model_1.pt"
expect_fail "item extra has 2 rank files, item model 1" "$DCP" ls "$H/missing"
mkdir "$H/onlymodel"; cp "$S/tc/model_0.pt" "$H/onlymodel/"
expect_fail "model.w0: the ranks' shards hold 30 of its 60 elements" "$DCP" ls "$H/onlymodel"
cp -r "$S/verl" "$H/verl"; rm "$H/verl/model_world_size_2_rank_1.pt" "$H/verl/extra_state_world_size_2_rank_1.pt"
expect_fail "1 rank files of world size 2" "$DCP" ls "$H/verl"
mkdir "$H/epochs"; cp "$S/tc/model_0.pt" "$H/epochs/model_10.pt"
expect_fail "not a checkpoint" "$DCP" ls "$H/epochs"

# A DTensor with no element but a dimension of 2^62 (torch.empty(2**62, 0) distributed) refused
# the whole folder ("dimension 0 of the global shape (4611686018427387904) is too large": the
# pieces of a dimension past 2^59 were computed, though there is nothing to place): one empty
# chunk now, the other keys read. (A one-process save: torch's own full_tensor() of it overflows.)
Z="$SCRATCH/emptyhuge"
mkdir "$Z"
timeout 120 python3 - "$Z" >"$Z.log" 2>&1 <<'PY' || { cat "$Z.log"; fail "the empty DTensor save failed"; }
import sys, warnings
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
warnings.simplefilter("ignore")
d = sys.argv[1]
dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
sd = {"z": distribute_tensor(torch.empty(2**62, 0), mesh, [Shard(0)]),
      "z2": distribute_tensor(torch.empty(0, 2**62, dtype=torch.float64), mesh, [Shard(1)]),
      "w": distribute_tensor(torch.tensor([1.0, 2.0, 3.0]), mesh, [Shard(0)])}
torch.save(sd, f"{d}/model_world_size_1_rank_0.pt")
dist.destroy_process_group()
PY
rm -f "$Z/store"
got=$("$DCP" --no-catalog ls "$Z" | awk 'NR > 1 { print $1, $2, $3, $4, $5 }' | sort | tr '\n' ';')
[ "$got" = "model.w float32 [3] 12 B;model.z float32 [4611686018427387904,0] 0 B;model.z2 float64 [0,4611686018427387904] 0 B;" ] ||
    fail "an empty DTensor of 2^62 rows: dcp ls: $got"
[ "$("$DCP" --no-catalog cat "$Z" model.z | wc -c)" = 0 ] && [ "$("$DCP" --no-catalog cat "$Z" model.z2 | wc -c)" = 0 ] ||
    fail "an empty DTensor of 2^62 rows: dcp cat is not empty"
[ "$("$DCP" --no-catalog cat "$Z" model.w | od -An -tf4 | tr -s ' ')" = " 1 2 3" ] || fail "model.w beside an empty DTensor"
"$DCP" --no-catalog verify "$Z" | tail -1 | grep -qx "$Z: OK" || fail "dcp verify of an empty DTensor of 2^62 rows"
echo "ok"
