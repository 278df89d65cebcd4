#!/bin/bash
# The GPU checks of issues 12 and 16, on a GPU machine from the repository
# root, with what bench/gpu-prepare.sh made here carried there:
#   bash bench/gpu-run.sh [DIR] [parts]   (DIR default .gpu; parts: py
#   fixtures bench sanitizer device, default all; output also to $OUT/log.txt
#   when OUT is set)
#   py        the Python package built against DIR's libdcp (for the bench's peers)
#   fixtures  tests/load-fixtures.sh on CUDA destinations by device IPC: every
#             fixture, 1-4 ranks, 4 layouts, the ground-truth bytes
#   bench     bench/bench-gpu.sh (REPS, default 2; BENCH_S its time limit)
#   sanitizer compute-sanitizer memcheck of 2 ranks, by IPC and by host messages
#   device    LOAD_DEVICE_REAL=1 tests/load-device.sh on the real CUDA runtime
set -u
dir=${1:-.gpu}
[ $# -gt 0 ] && shift
PARTS=" ${*:-py fixtures bench sanitizer device} "
[ -n "${OUT:-}" ] && exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s); el() { echo "=== $(( $(date +%s) - t0 )) s: $*"; }
R=$PWD
D=$(cd "$dir" && pwd)
mkdir -p /opt/b && tar xzf "$D/bundle.tgz" -C /opt/b
export PATH=/opt/b/bin:$PATH LD_LIBRARY_PATH=/opt/b/lib UCX_MODULE_DIR=/opt/b/ucx HYDRA_LAUNCHER=fork MPIEXEC=mpiexec
nvidia-smi -L; nproc
BENCHDIR=/tmp
for d in /var/tmp /root /tmp; do [ -w "$d" ] && [ "$(stat -f -c %T "$d")" != tmpfs ] && { BENCHDIR=$d; break; }; done
echo "bench dir: $BENCHDIR ($(stat -f -c %T "$BENCHDIR"))"
mkdir -p /tmp/bd && ln -sf /opt/b/bin/dcpload /opt/b/bin/dcp /tmp/bd/
export top_srcdir=$R top_builddir=/tmp/bd
PYGPU="env LD_LIBRARY_PATH=$D/pylib PYTHONPATH=/tmp/bd/python-pkg:/tmp/site python3"
if [[ $PARTS == *" py "* ]]; then
  el python package
  env -u LD_LIBRARY_PATH python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$D"/wheels/*.whl
  printf '#!/bin/sh\ncase "$*" in *--cflags*) echo "-I%s/include";; *--libs*) echo "-L%s/pylib -ldcp";; esac\n' "$D" "$D" >/tmp/pkgconf
  chmod +x /tmp/pkgconf
  env -u LD_LIBRARY_PATH PYTHONPATH=/tmp/site PKG_CONFIG=/tmp/pkgconf timeout 120 sh tests/python_build.sh "$R" /tmp/bd
  cat /tmp/bd/python-pkg.skip 2>/dev/null
  $PYGPU -c 'import dcpfs.torch, torch; print("dcpfs", dcpfs.__file__, "torch", torch.__version__, torch.cuda.is_available())'
fi
if [[ $PARTS == *" fixtures "* ]]; then
  el "load-fixtures: every fixture, 1-4 ranks, 4 layouts, CUDA destinations by device IPC"
  LOAD_FIXTURES_ARGS="--device cuda --device-delivery" timeout 150 bash tests/load-fixtures.sh; echo "load-fixtures (cuda ipc) rc=$?"
fi
if [[ $PARTS == *" bench "* ]]; then
  el bench-gpu
  DCPFS_BENCH_DIR=$BENCHDIR/dcpfs-bench DCPFS_BENCH_REPS=${REPS:-2} DCPFS_BENCH_GPU_PYTHON="$PYGPU" timeout "${BENCH_S:-300}" bash bench/bench-gpu.sh
  echo "bench-gpu rc=$?"
fi
if [[ $PARTS == *" sanitizer "* ]]; then
  for how in --device-delivery --host-delivery "--device-delivery --map"; do
    el "compute-sanitizer memcheck, 2 ranks replicate $how"
    # shellcheck disable=SC2086 # $how: one or two options
    timeout 60 mpiexec -n 2 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 \
      /tmp/bd/dcpload tests/fixtures/04_block_4ranks/ckpt --layout replicate --device cuda $how --staging 4096 --json 2>&1 | tail -6
    echo "sanitizer $how rc=${PIPESTATUS[0]}"
  done
fi
if [[ $PARTS == *" device "* ]]; then
  el "load-device on the real CUDA runtime"
  LOAD_DEVICE_REAL=1 timeout 120 bash tests/load-device.sh; echo "load-device real rc=$?"
fi
el done
