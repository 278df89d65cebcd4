# dcpload on 1..4 ranks, every fixture and every layout: each rank's region
# equals the same region cut from the ground truth, and the ranks together
# read each needed storage byte exactly once. LOAD_FIXTURES_ARGS adds options
# to every run (on a GPU machine: "--device cuda --device-delivery").
. "$top_srcdir/tests/lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need python3
need_python_module numpy
scratch
read -r -a EXTRA <<<"${LOAD_FIXTURES_ARGS:-}"
for case in "$FIXTURES"/*/; do
    case=${case%/}
    name=$(basename "$case")
    mkdir -p "$SCRATCH/$name"
    for n in 1 2 3 4; do
        for layout in rows cols blocks replicate; do
            out="$SCRATCH/$name/$layout-$n.json"
            mpirun "$n" "$DCPLOAD" "$case/ckpt" --layout "$layout" --json ${EXTRA[@]+"${EXTRA[@]}"} >"$out" 2>"$out.err" ||
                fail "$name: dcpload -n $n --layout $layout ${EXTRA[*]} failed: $(cat "$out.err")"
        done
    done
    python3 "$top_srcdir/tests/load_check.py" "$DCP" "$case/ckpt" "$case/expected/manifest.json" "$SCRATCH/$name" || fail "$name"
done

