# Converting a 256 MiB checkpoint keeps the peak RSS under 64 MiB in every direction
# (the 2 GiB / 256 MiB figure is measured by bench/bench-convert.sh).
. "$top_srcdir/tests/lib.sh"
need_rss
scratch
LIMIT_KB=65536
# 16 keys of 4096x1024 float32, column-sharded over 4 ranks: strided reads on the way out.
$DCP synth "$SCRATCH/src" --keys 16 --shape 4096,1024 --dtype float32 --ranks 4 --shard cols --seed 3
rss() {   # rss LABEL CMD...: run, and fail if the peak RSS passes the limit
    local label=$1; shift
    /usr/bin/time -f '%M' -o "$SCRATCH/rss" "$@" || fail "$label failed"
    local kb; kb=$(tail -1 "$SCRATCH/rss")
    echo "$label: peak RSS $kb KiB"
    [ "$kb" -le $LIMIT_KB ] || fail "$label: peak RSS $kb KiB > $LIMIT_KB KiB"
}
rss "DCP -> torch.save" $DCP --no-catalog convert --no-sync "$SCRATCH/src" "$SCRATCH/a.pt"
rss "torch.save -> DCP" $DCP --no-catalog convert --no-sync "$SCRATCH/a.pt" "$SCRATCH/b"
rss "DCP -> safetensors shards" $DCP --no-catalog convert --no-sync --max-shard-size 100M "$SCRATCH/b" "$SCRATCH/c"
rss "safetensors -> DCP" $DCP --no-catalog convert --no-sync "$SCRATCH/c" "$SCRATCH/d"
for f in a.pt b c d; do
    got=$($DCP --no-catalog cat "$SCRATCH/$f" model.layers.15.weight | sha256sum)
    want=$($DCP --no-catalog cat "$SCRATCH/src" model.layers.15.weight | sha256sum)
    [ "$got" = "$want" ] || fail "$f: model.layers.15.weight differs"
done
echo ok
