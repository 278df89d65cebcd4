# Parsing a big .metadata: CPU time and peak memory of `dcp --no-catalog ls` on a
# synthetic 2.x checkpoint of 1000 keys x 200 chunks (200k chunks, ~30 MB of pickle)
# written by PyTorch's own classes. Needs python3 with torch (else skipped).
set -e
DCP="$top_builddir/dcp"
if ! python3 -c 'import torch' 2>/dev/null; then echo "bench-metadata: skipped (no torch)"; exit 0; fi
dir=$(mktemp -d /tmp/dcp-bench-meta.XXXXXX)
trap 'rm -rf "$dir"' EXIT
python3 "$top_srcdir/bench/gen_big_metadata.py" "$dir/ck" "${KEYS:-1000}" "${CHUNKS:-200}"
size=$(stat -c %s "$dir/ck/.metadata")
for i in 1 2 3; do
    /usr/bin/time -f "%U %S %M" -o "$dir/t" "$DCP" --no-catalog ls "$dir/ck" > /dev/null
    read -r u s m < "$dir/t"
    echo "bench-metadata: .metadata $((size / 1048576)) MiB, $(( ${KEYS:-1000} * ${CHUNKS:-200} )) chunks: user ${u}s sys ${s}s, peak RSS $((m / 1024)) MiB"
done
