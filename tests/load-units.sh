# dcpload with small staging buffers on 3 and 4 ranks: records split into many
# units (cuts inside ops), delivered three ways: by messages (the default on
# one node: packed spans for ranks needing parts of a unit), by broadcast
# groups (--bcast-local), and through node shared memory (--shm: copies out
# of the reader's staging buffer). Checked against the ground truth like
# load-fixtures.sh, and each variant's statistics show its path was taken.
# A sanitizer build runs each variant on one rank count (messages on 3, the
# others on 4).
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need python3
need_python_module numpy
scratch
for name in 02_rowwise_4ranks 03_colwise_4ranks 04_block_4ranks 05_mixed_2ranks; do
    for variant in p2p bcast shm; do
        dir="$SCRATCH/$name-$variant"
        mkdir -p "$dir"
        extra="--staging 4096"
        [ "$variant" = bcast ] && extra="$extra --bcast-local"
        [ "$variant" = shm ] && extra="$extra --shm --buffers 2"
        ns="3 4"
        if [ -n "${DCP_SANITIZED:-}" ]; then   # ~1.5 s a sanitized run: each variant on one count
            case $variant in p2p) ns=3 ;; *) ns=4 ;; esac
        fi
        for n in $ns; do
            for layout in rows cols blocks replicate; do
                # shellcheck disable=SC2086
                mpirun "$n" "$DCPLOAD" "$FIXTURES/$name/ckpt" --layout "$layout" --json $extra \
                    >"$dir/$layout-$n.json" 2>"$dir/err" ||
                    fail "$name: dcpload -n $n --layout $layout $extra failed: $(cat "$dir/err")"
            done
            # replicated: every unit goes to every other rank, by the variant's path
            python3 - "$variant" "$dir/replicate-$n.json" <<'PY' || fail "$name -n $n $variant: path not used"
import json, sys
variant, path = sys.argv[1], sys.argv[2]
st = [r for r in map(json.loads, open(path)) if "bytes_read" in r]
shm = sum(r["bytes_shm"] for r in st)
bc = sum(r["broadcasts"] for r in st)
recv = sum(r["bytes_received"] for r in st)
ok = recv > 0 and {"p2p": shm == 0 and bc == 0, "bcast": bc > 0 and shm == 0,
                   "shm": shm == recv and bc == 0}[variant]
if not ok:
    sys.exit(f"{variant}: received {recv}, through shared memory {shm}, broadcasts {bc}")
PY
        done
        python3 "$top_srcdir/tests/load_check.py" "$DCP" "$FIXTURES/$name/ckpt" "$FIXTURES/$name/expected/manifest.json" "$dir" || fail "$name $variant"
    done
done
