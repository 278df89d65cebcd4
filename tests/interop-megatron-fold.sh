# Megatron-Core's reformulated tensors folded back to their original shapes
# (DCP_OPEN_MEGATRON_FOLD; src/megatron_fold.c), over checkpoints stored the way
# Megatron-Core stores its distributed optimizer's states but written by PyTorch alone
# (tests/interop/save_reformulated.py: 1-D to 4-D, random cuts of the flattened ranges, two
# seeds), beside keys the fold must leave stored. Every reader must give the originals for
# the folded keys and the stored tensors for the rest: dcp digest (--megatron-fold, with the
# catalog asked for and not used: a later served open still gives the stored view), dcp
# --megatron-fold diff (the same tensors stored under other blocks: equal), dcp
# --megatron-fold convert (to safetensors; to a plain DCP folder, which PyTorch's own
# dcp.load reads as the originals), a dcpfs mount with -o megatron_fold, dcpload
# --megatron-fold on 1 to 3 ranks (each stored byte read once), and dcpfs.open /
# dcpfs.torch.load / dcp.load with dcpfs.torch.Reader with megatron_fold=True.
# tests/interop-megatron-releases.sh does the same on the releases' own saves.
. "$top_srcdir/tests/python_lib.sh"
. "$top_srcdir/tests/fuse_lib.sh"
. "$top_srcdir/tests/load_lib.sh"
need python3
need_torch
need_python_module xxhash
need_python_module numpy
fuse_scratch
export XDG_CACHE_HOME="$SCRATCH/cache"

# KEY<TAB>[SHAPE]<TAB>XXH3 lines of `dcp ARGS`, sorted
digest_lines() {
    "$DCP" "$@" >"$SCRATCH/digest.json" || return 1
    python3 "$top_srcdir/tests/truth_check.py" lines <"$SCRATCH/digest.json" | LC_ALL=C sort
}

for seed in 1 2; do
    out=$SCRATCH/seed$seed
    mkdir "$out"
    timeout 300 python3 "$top_srcdir/tests/interop/save_reformulated.py" "$out" $seed >"$out/save.log" 2>&1 ||
        { cat "$out/save.log"; fail "seed $seed: the save failed"; }
    ck=$out/ckpt
    LC_ALL=C sort "$out/folded.truth" >"$out/folded.want"
    LC_ALL=C sort "$out/stored.truth" >"$out/stored.want"
    nfold=$(diff "$out/stored.want" "$out/folded.want" | grep -c '^>' || true)
    [ "$nfold" = 10 ] || fail "seed $seed: the truths differ in $nfold keys, not the 10 reformulated ones"

    # dcp: folded; the catalog is not used for it (nor filled by it); stored before and after
    cat=$SCRATCH/catalog.sqlite
    digest_lines --catalog "$cat" digest --json "$ck" >"$out/got" || fail "seed $seed: dcp digest failed"
    diff "$out/stored.want" "$out/got" || fail "seed $seed: dcp digest differs from PyTorch's view"
    digest_lines --catalog "$cat" --megatron-fold digest --json "$ck" >"$out/got" ||
        fail "seed $seed: dcp --megatron-fold digest failed"
    diff "$out/folded.want" "$out/got" || fail "seed $seed: dcp --megatron-fold digest differs from the originals"
    "$DCP" --catalog "$cat" --megatron-fold info "$ck" | grep -q 'rebuilt from the catalog' &&
        fail "seed $seed: the folded model was served from the catalog"
    digest_lines --catalog "$cat" digest --json "$ck" >"$out/got" || fail "seed $seed: dcp digest (served) failed"
    diff "$out/stored.want" "$out/got" || fail "seed $seed: after the fold, the catalog serves another view"
    "$DCP" --catalog "$cat" info "$ck" | grep -q 'rebuilt from the catalog' || fail "seed $seed: not served from the catalog"
    # dcp info counts them: 11 stored so (the 10, and the one whose chunks span blocks), 10 folded;
    # the catalog keeps the count
    for how in --no-catalog "--catalog $cat" --megatron-fold; do
        line=$("$DCP" $how info "$ck" | grep '^reformulated:') || line=
        case $how in --megatron-fold) want="11 tensors, 10 shown in their original shapes (--megatron-fold; 1 kept stored" ;;
                     *) want="11 tensors stored as Megatron-Core's distributed optimizer stores them" ;; esac
        case $line in "reformulated:   $want"*) ;; *) fail "seed $seed: dcp $how info says '$line', not '$want'" ;; esac
    done
    line=$("$DCP" --no-catalog --megatron-fold info "$out/alt" | grep '^reformulated:') || line=
    [ "$line" = "reformulated:   10 tensors, shown in their original shapes (--megatron-fold)" ] ||
        fail "seed $seed: dcp --megatron-fold info of one block each says '$line'"
    "$DCP" --megatron-fold --no-catalog verify "$ck" >"$out/verify" 2>&1 ||
        { cat "$out/verify"; fail "seed $seed: dcp --megatron-fold verify failed"; }
    # a box of a folded tensor: rows 1 to 3 of d2 (START:COUNT) ([8, 6] from blocks [4, 6] in two ranges each)
    "$DCP" --megatron-fold --no-catalog cat --box 1:3,0:6 "$ck" optimizer.state.exp_avg.d2 >"$out/box" ||
        fail "seed $seed: dcp --megatron-fold cat --box failed"
    "$DCP" --megatron-fold --no-catalog cat "$ck" optimizer.state.exp_avg.d2 | head -c 96 | tail -c 72 |
        cmp - "$out/box" || fail "seed $seed: a box of a folded tensor is not the same rows of the whole"

    # dcp diff: the same tensors under other blocks (another TP size) differ in shape as
    # stored, and are equal folded
    rc=0; "$DCP" --no-catalog diff "$ck" "$out/alt" >"$out/diff" 2>&1 || rc=$?
    [ $rc = 1 ] && grep -q "^shape: optimizer.state.exp_avg.d3: \[2,3,2,20\] -> \[1,1,1,240\]" "$out/diff" ||
        fail "seed $seed: dcp diff of two block layouts: exit $rc: $(cat "$out/diff")"
    "$DCP" --no-catalog --megatron-fold diff --content "$ck" "$out/alt" >"$out/diff" 2>&1 || rc=$?
    grep -v '^only in A: optimizer.state.exp_avg_sq\.\|^only in A: plain$' "$out/diff" >"$out/diff.rest" || true
    [ ! -s "$out/diff.rest" ] && grep -q "^only in A: plain$" "$out/diff" ||
        fail "seed $seed: dcp --megatron-fold diff --content: $(cat "$out/diff")"

    # dcp convert: the originals written out (a safetensors file; a DCP folder, read plainly)
    "$DCP" --megatron-fold convert --quiet --no-sync "$ck" "$out/folded.safetensors" ||
        fail "seed $seed: dcp --megatron-fold convert to safetensors failed"
    "$DCP" --megatron-fold convert --quiet --no-sync "$ck" "$out/folded-dcp" ||
        fail "seed $seed: dcp --megatron-fold convert to DCP failed"
    for conv in folded.safetensors folded-dcp; do
        digest_lines --no-catalog digest --json "$out/$conv" >"$out/got" || fail "seed $seed: dcp digest $conv failed"
        diff "$out/folded.want" "$out/got" || fail "seed $seed: $conv differs from the originals"
    done

    # the mount
    mount_dcpfs "$ck" "$out/mnt" -o no_catalog,megatron_fold
    python3 "$top_srcdir/tests/truth_check.py" mount "$out/mnt" "$out/folded.truth" ||
        fail "seed $seed: the folded mount's files differ from the originals"
    shape=$(getfattr --only-values -n user.dcp.shape "$out/mnt/optimizer/state/exp_avg/d4" 2>/dev/null ||
            getfattr --only-values -n user.dcp.shape "$out/mnt/optimizer.state.exp_avg.d4")
    case $shape in *2*4*6*4*) ;; *) fail "seed $seed: the mount's d4 has shape '$shape', not [2,4,6,4]" ;; esac
    unmount_dcpfs "$out/mnt"

    # dcpload: each rank's region of the originals, each stored byte read once
    unique=$(tensor_bytes "$ck" --no-catalog)
    dcpload_runs "seed $seed" "$ck" "$out/runs" "rows-1 rows-3 blocks-3 cols-2" --megatron-fold
    LOAD_CHECK_DCP_OPTS=--megatron-fold python3 "$top_srcdir/tests/load_check.py" "$DCP" "$ck" \
        "$out/folded.truth.json" "$out/runs" "$unique" >"$out/load" 2>&1 ||
        { cat "$out/load"; fail "seed $seed: dcpload --megatron-fold's regions"; }
    echo "seed $seed: $nfold tensors folded: dcp, the mount and dcpload give the originals"
done

# Python: dcpfs.open, dcpfs.torch.load and dcp.load with dcpfs.torch.Reader
use_python_package torch
python3 - "$SCRATCH/seed1" "$SCRATCH/seed2" <<'PY' || fail "the Python package's folded view differs from the originals"
import json, sys, hashlib
import torch
import torch.distributed.checkpoint as dcp
import dcpfs, dcpfs.torch
bad = 0
for out in sys.argv[1:]:
    ck = out + "/ckpt"
    for fold, truth in ((False, "stored"), (True, "folded")):
        doc = json.load(open(f"{out}/{truth}.truth.json"))
        c = dcpfs.open(ck, catalog=False, megatron_fold=fold)
        counts = (c.meta["megatron_reformulated"], c.meta["megatron_folded"])
        if counts != ((11, 10) if fold else (11, 0)):
            print(f"{out}: dcpfs.open(megatron_fold={fold}).meta counts {counts} reformulated, folded")
            bad += 1
        for key, d in doc.items():
            if list(c.info(key).shape) != d["shape"]:
                print(f"{key}: dcpfs.open(megatron_fold={fold}) gives shape {c.info(key).shape}, not {d['shape']}")
                bad += 1
        for how in ("read", "dcpfs.torch.load", "Reader"):
            sd = {k: torch.zeros(d["shape"], dtype=getattr(torch, d["dtype"])) for k, d in doc.items()}
            if how == "read":
                for k, t in sd.items():
                    c.read(k, out=t)
            elif how == "dcpfs.torch.load":
                dcpfs.torch.load(sd, ck, catalog=False, megatron_fold=fold)
            else:
                dcp.load(sd, storage_reader=dcpfs.torch.Reader(ck, catalog=False, megatron_fold=fold), no_dist=True)
            for k, t in sd.items():
                got = hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
                if got != doc[k]["sha256"]:
                    print(f"{out}: {k}: {how} (megatron_fold={fold}) gives other bytes than the {truth} truth")
                    bad += 1
        c.close()
    # what dcp --megatron-fold convert wrote: a plain DCP of the originals, for PyTorch itself
    doc = json.load(open(f"{out}/folded.truth.json"))
    sd = {k: torch.zeros(d["shape"], dtype=getattr(torch, d["dtype"])) for k, d in doc.items()}
    dcp.load(sd, storage_reader=dcp.FileSystemReader(f"{out}/folded-dcp"), no_dist=True)
    for k, t in sd.items():
        if hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest() != doc[k]["sha256"]:
            print(f"{out}: {k}: PyTorch's own load of the folded conversion gives other bytes than the originals")
            bad += 1
print("python: dcpfs.open, dcpfs.torch.load and dcp.load with the Reader: both views; "
      "PyTorch's own load of the folded conversion: the originals" if not bad else "")
sys.exit(1 if bad else 0)
PY
echo ok
