# The zip CRC-32s dcp convert writes (torch.save files, DCP chunk archives) pass Python's
# zipfile checks on every copy path: the kernel copy or read+write of runs whose CRC the
# source recorded (taken over, combined per record), and runs read for a computed CRC (no
# recorded CRC, CRCs stored as 0 by synth's default, strided column shards, safetensors).
# Output written with --no-crc fails the same check, so the check does read the CRCs. Every
# output is compared with its source, byte for byte, by `dcp diff --content`.
. "$top_srcdir/tests/lib.sh"
need python3
scratch
ZC="python3 $top_srcdir/tests/writer_zipcheck.py $DCP"
same() {   # same A B: equal keys, shapes and bytes
    local out
    out=$($DCP --no-catalog diff --content "$1" "$2") || fail "$2 differs from $1: $out"
    [ "$out" = "no differences" ] || fail "$2 differs from $1: $out"
}
# 512 KiB tensors over 2 ranks: 256 KiB runs, past the 64 KiB under which runs are always read.
$DCP synth "$SCRATCH/crc" --keys 3 --shape 512,256 --dtype float32 --ranks 2 --shard rows --seed 5 --crc
$DCP synth "$SCRATCH/zero" --keys 3 --shape 512,256 --dtype float32 --ranks 2 --shard rows --seed 5
$DCP synth "$SCRATCH/cols" --keys 3 --shape 512,256 --dtype float32 --ranks 2 --shard cols --seed 5 --crc
$ZC "$SCRATCH/crc"
$ZC "$SCRATCH/zero" --expect-bad
for s in crc zero cols; do
    src="$SCRATCH/$s"
    $DCP --no-catalog convert -q "$src" "$src.pt"
    $ZC "$src.pt"
    same "$src" "$src.pt"
    $DCP --no-catalog convert -q "$src.pt" "$src-from-pt"
    $ZC "$src-from-pt"
    same "$src" "$src-from-pt"
    $DCP --no-catalog convert -q --to dcp "$src" "$src-resharded"
    $ZC "$src-resharded"
    same "$src" "$src-resharded"
    $DCP --no-catalog convert -q "$src" "$src.safetensors"
    $DCP --no-catalog convert -q "$src.safetensors" "$src-from-st"
    $ZC "$src-from-st"
    same "$src" "$src-from-st"
done
# Two hops of taken-over CRCs: DCP -> .pt -> DCP -> .pt.
$DCP --no-catalog convert -q "$SCRATCH/crc-from-pt" "$SCRATCH/again.pt"
$ZC "$SCRATCH/again.pt"
same "$SCRATCH/crc" "$SCRATCH/again.pt"
# --no-crc: CRCs stored as 0, which zipfile rejects (torch.load does not check them).
$DCP --no-catalog convert -q --no-crc "$SCRATCH/crc" "$SCRATCH/nocrc.pt"
$ZC "$SCRATCH/nocrc.pt" --expect-bad
same "$SCRATCH/crc" "$SCRATCH/nocrc.pt"
$DCP --no-catalog convert -q --no-crc "$SCRATCH/crc.pt" "$SCRATCH/nocrc-dcp"
$ZC "$SCRATCH/nocrc-dcp" --expect-bad
same "$SCRATCH/crc" "$SCRATCH/nocrc-dcp"
# ... and a --no-crc source converted with the defaults gets real CRCs again.
$DCP --no-catalog convert -q "$SCRATCH/nocrc.pt" "$SCRATCH/recrc"
$ZC "$SCRATCH/recrc"
echo ok
