# The PyTorch interop tier for the writers: torch.distributed.checkpoint.load reads checkpoints
# written by `dcp synth` (four shardings) and `dcp convert`, on 1 and on 2 gloo ranks, and
# torch.load(weights_only=True) reads converted .pt files, all byte-exact against the source.
. "$top_srcdir/tests/lib.sh"
need python3
need_torch
scratch
# The torch checks are collected and run at the end in one batch (torch imported
# once, one process group a rank count): each names its checkpoint when it fails.
PY=check
check() { echo "$*" >> "$SCRATCH/checks"; }
seed=11
for shard in rows cols blocks replicated; do
    d="$SCRATCH/synth-$shard"
    $DCP synth "$d" --keys 3 --shape 12,10 --dtype float32 --ranks 4 --shard "$shard" --seed $seed --chunks-per-key 2
    $PY synth "$d" $seed 3 1
    $PY synth "$d" $seed 3 2
done
$DCP synth "$SCRATCH/synth-bf16" --keys 2 --shape 7,5,3 --dtype bfloat16 --ranks 2 --shard blocks --seed 4
$PY synth "$SCRATCH/synth-bf16" 4 2 1
$DCP synth "$SCRATCH/synth-f8" --keys 2 --shape 8,8 --dtype float8_e4m3fn --ranks 2 --shard cols --seed 4
$PY synth "$SCRATCH/synth-f8" 4 2 1
# Tensors of 512 KiB: runs long enough for the kernel-copy and recorded-CRC paths of convert
# (the fixtures above are too small for them), through every direction.
big="$SCRATCH/big"
$DCP synth "$big" --keys 3 --shape 512,256 --dtype float32 --ranks 2 --shard rows --seed 8 --crc
$DCP convert -q "$big" "$big.pt"
$PY ptsynth "$big.pt" 8 3
$DCP convert -q "$big.pt" "$big-from-pt"
$PY synth "$big-from-pt" 8 3 2
$DCP convert -q "$big" "$big.safetensors"
$DCP convert -q "$big.safetensors" "$big-from-st"
$PY synth "$big-from-st" 8 3 1
for name in 01_single_plain 03_colwise_4ranks 05_mixed_2ranks; do
    m="$FIXTURES/$name/expected/manifest.json"
    $DCP convert -q "$FIXTURES/$name/ckpt" "$SCRATCH/$name.pt"
    $PY pt "$SCRATCH/$name.pt" "$m"
    $DCP convert -q "$SCRATCH/$name.pt" "$SCRATCH/$name-dcp"
    $PY dcp "$SCRATCH/$name-dcp" "$m" 1
    $PY dcp "$SCRATCH/$name-dcp" "$m" 2
done
# Values torch.save writes lazily or wrapped (conj and neg views, nn.Parameter) and
# plain bytes, alone and in a list, survive .pt -> DCP -> .pt.
VAL="python3 $top_srcdir/tests/interop/writer_values.py"
$VAL make "$SCRATCH/values.pt"
$DCP convert -q "$SCRATCH/values.pt" "$SCRATCH/values-dcp" || fail "values.pt -> DCP"
$DCP convert -q "$SCRATCH/values-dcp" "$SCRATCH/values-back.pt" || fail "values DCP -> .pt"
$VAL check "$SCRATCH/values.pt" "$SCRATCH/values-back.pt" || fail "conj/neg views, Parameter, bytes after a round trip"
# planner_data holds each key's path as torch writes it: a .pt's nesting and a DCP source's
# own planner_data carry over, so dcp_to_torch_save rebuilds the same structure as from a
# checkpoint torch.distributed.checkpoint.save wrote; synth keys stay flat.
NEST="python3 $top_srcdir/tests/interop/writer_nesting.py"
$NEST make "$SCRATCH/nest"
$DCP convert -q "$SCRATCH/nest/nested.pt" "$SCRATCH/nest/from-pt"
$NEST same "$SCRATCH/nest/torch-dcp" "$SCRATCH/nest/from-pt" || fail "planner_data of a DCP converted from a nested .pt"
$DCP convert -q "$SCRATCH/nest/torch-dcp" "$SCRATCH/nest/from-dcp"
$NEST same "$SCRATCH/nest/torch-dcp" "$SCRATCH/nest/from-dcp" || fail "planner_data of a DCP converted from a DCP"
$NEST flat "$SCRATCH/synth-rows" || fail "planner_data of a synth checkpoint"
# convert --nested to a .pt nests as dcp_to_torch_save does, from the source's own paths (a
# module's "0.weight" stays one key; list indexes make lists), from DCP and from .pt sources.
$DCP convert -q --nested "$SCRATCH/nest/torch-dcp" "$SCRATCH/nest/nested-from-dcp.pt"
$NEST pt "$SCRATCH/nest/torch-dcp" "$SCRATCH/nest/nested-from-dcp.pt" || fail "convert --nested of a DCP to .pt"
$DCP convert -q --nested "$SCRATCH/nest/nested.pt" "$SCRATCH/nest/nested-from-pt.pt"
$NEST pt "$SCRATCH/nest/torch-dcp" "$SCRATCH/nest/nested-from-pt.pt" || fail "convert --nested of a .pt to .pt"
# Values that are no plain data (a torch.device), or whose pickle shares one list under itself
# 2^40 times, stay the bytes of their torch.save.
python3 -c "
import sys, warnings; warnings.filterwarnings('ignore')
import torch, torch.distributed.checkpoint as dcp
deep = [1]
for _ in range(40):
    deep = (deep, deep)   # a tuple: torch walks lists (2^40 steps), not tuples
dcp.save({'t': torch.ones(2), 'dev': torch.device('cpu'), 'deep': deep, 'n': {'x': None, 'y': 'z'}},
         checkpoint_id=sys.argv[1], no_dist=True)" "$SCRATCH/nest/odd"
$DCP convert -q --nested "$SCRATCH/nest/odd" "$SCRATCH/nest/odd.pt" || fail "convert --nested of odd values"
python3 -c "
import io, sys, torch
sd = torch.load(sys.argv[1], weights_only=True)
assert torch.equal(sd['t'], torch.ones(2)) and sd['n'] == {'x': None, 'y': 'z'}, sd
assert isinstance(sd['dev'], bytes) and torch.load(io.BytesIO(sd['dev']), weights_only=False) == torch.device('cpu'), sd
assert isinstance(sd['deep'], bytes) and len(sd['deep']) < 4096, sd
d = torch.load(io.BytesIO(sd['deep']), weights_only=False)
for _ in range(40):
    assert d[0] is d[1]; d = d[0]
assert d == [1]" "$SCRATCH/nest/odd.pt" || fail "odd values of a --nested .pt"
# Hostile paths: a list of 2^40 Nones, and "hist" a list for one key and a dict for another,
# are refused naming the key, no file left; without --nested the keys stay flat and convert.
$NEST hostile "$SCRATCH/nest/torch-dcp" "$SCRATCH/nest"
for bad in bigindex:"hist.1099511627776: list index 1099511627776 is out of range" \
           clash:"hist.2.0: key's path puts a dict key where another key's puts a list index"; do
    d=${bad%%:*}
    ! $DCP convert -q --nested "$SCRATCH/nest/$d" "$SCRATCH/nest/$d.pt" 2>"$SCRATCH/nest/$d.err" ||
        fail "convert --nested of $d succeeded"
    grep -qF "${bad#*:}" "$SCRATCH/nest/$d.err" || fail "$d: $(cat "$SCRATCH/nest/$d.err")"
    [ ! -e "$SCRATCH/nest/$d.pt" ] || fail "$d: a failed convert left its output"
    $DCP convert -q "$SCRATCH/nest/$d" "$SCRATCH/nest/$d-flat.pt" || fail "flat convert of $d"
done
# Values convert cannot carry are reported one by one, by key.
python3 -c "import sys, torch; torch.save({'t': torch.ones(2), 'dev': torch.device('cpu'), 'sub': {'d2': torch.device('cpu')}}, sys.argv[1])" \
    "$SCRATCH/skip.pt"
$DCP convert "$SCRATCH/skip.pt" "$SCRATCH/skip" 2>"$SCRATCH/skip.err" || fail "convert of skip.pt"
grep -q "skipped dev: " "$SCRATCH/skip.err" || fail "no report for key dev: $(cat "$SCRATCH/skip.err")"
grep -q "skipped sub.d2: " "$SCRATCH/skip.err" || fail "no report for key sub.d2: $(cat "$SCRATCH/skip.err")"
[ "$(wc -l <"$SCRATCH/skip.err")" -eq 2 ] || fail "expected two reports: $(cat "$SCRATCH/skip.err")"
python3 "$top_srcdir/tests/interop/writer_load.py" batch "$SCRATCH/checks" ||
    fail "torch.distributed.checkpoint.load or torch.load disagreed with a checkpoint dcp wrote (above)"
[ "$(grep -c . "$SCRATCH/checks")" -ge 20 ] || fail "too few torch checks collected"
echo ok
