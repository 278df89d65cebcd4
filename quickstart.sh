#!/bin/bash
# Quick start on a fresh Debian machine (as root): install what is missing,
# build, and show the bundled sample checkpoint through dcp and dcpfs.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES="build-essential autoconf automake libtool pkg-config libfuse3-dev fuse3 libmpich-dev mpich
          libsqlite3-dev libxxhash-dev libzstd-dev libjansson-dev libssl-dev zlib1g-dev libdeflate-dev liburing-dev check attr strace python3 python3-pip python3-dev"
missing=$(for p in $PACKAGES; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'ok installed' || echo "$p"; done)
if [ -n "$missing" ]; then
    echo "== installing:" $missing
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

# The Python package (python/) and the PyTorch interop tier: a CPU build of PyTorch, pinned
# (an unpinned torch is a multi-GB CUDA build). Debian's python3 is "externally managed"
# (PEP 668): pip installs into it anyway, as a fresh machine for dcpfs.
if ! python3 -c 'import torch, numpy, cffi, setuptools, pytest, safetensors, zstandard, transformers' 2>/dev/null; then
    echo "== pip install torch==2.13.0 numpy safetensors zstandard cffi setuptools pytest xxhash transformers==5.24.0"
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q torch==2.13.0 numpy safetensors zstandard \
        cffi setuptools pytest xxhash transformers==5.24.0 || echo "pip install failed: the Python package and its tests will skip"
fi
if ! python3 -c 'import mypy' 2>/dev/null; then
    echo "== pip install mypy==2.4.1"   # the package's type hints (tests/python-types.sh)
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q mypy==2.4.1 || echo "pip install mypy failed: tests/python-types.sh will skip"
fi
if python3 -c 'import torch' 2>/dev/null && ! python3 -c 'import torch_checkpointing' 2>/dev/null; then
    echo "== pip install --no-deps torch-checkpointing==0.1.1"
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps torch-checkpointing==0.1.1 ||
        echo "pip install torch-checkpointing failed: tests/*-rankfiles.sh will fail"
fi
if python3 -c 'import torch' 2>/dev/null && ! python3 -c 'import torchtitan, megatron.core, psutil' 2>/dev/null; then
    # The frameworks' own code for tests/export-torchtitan.sh and tests/export-megatron.sh: --no-deps
    # (their declared dependencies pull a CUDA torch), with the light packages they import.
    echo "== pip install --no-deps torchtitan==0.3.0 spmd-types==0.2.3 tyro==1.0.16 docstring-parser==0.18.0 typeguard==4.6.1 megatron-core==0.16.1 psutil==7.2.2"
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps torchtitan==0.3.0 spmd-types==0.2.3 tyro==1.0.16 \
        docstring-parser==0.18.0 typeguard==4.6.1 megatron-core==0.16.1 psutil==7.2.2 ||
        echo "pip install torchtitan / megatron-core failed: tests/export-torchtitan.sh and tests/export-megatron.sh will skip"
fi

if python3 -c 'import torch' 2>/dev/null; then
    # Older megatron-core releases for tests/interop-megatron-releases.sh, each in its own
    # folder under ~/.cache/dcpfs-tests (installed ones are kept).
    sh tests/interop/install-megatron-releases.sh || true
fi

echo "== building"
[ -x configure ] || autoreconf -fi >/dev/null
mkdir -p build
(cd build && { [ -f Makefile ] || ../configure -q; } && make -j"$(nproc)" >/dev/null)

# The Python package, built against this build tree (as make check builds it).
sh tests/python_build.sh "$PWD" "$PWD/build" || true

SAMPLE=tests/fixtures/05_mixed_2ranks/ckpt
echo "== dcp info $SAMPLE"
build/dcp info "$SAMPLE"
echo "== dcp ls $SAMPLE"
build/dcp ls "$SAMPLE"

if [ -x build/dcpfs ] && [ -e /dev/fuse ]; then
    mnt=$(mktemp -d)
    echo "== dcpfs $SAMPLE $mnt"
    build/dcpfs "$SAMPLE" "$mnt"
    trap 'fusermount3 -u "$mnt" 2>/dev/null; rmdir "$mnt"' EXIT
    find "$mnt" | sort
    echo "-- getfattr -d $mnt/enc/weight"
    getfattr -d "$mnt/enc/weight" 2>/dev/null || true
    echo "-- the bytes of enc.weight through the mount equal dcp cat:"
    cmp "$mnt/enc/weight" <(build/dcp cat "$SAMPLE" enc.weight) && echo "   identical"
fi

if [ -d build/python-pkg/dcpfs ]; then
    echo "== python3 -c 'import dcpfs; ...'   (PYTHONPATH=build/python-pkg)"
    PYTHONPATH=build/python-pkg python3 -c '
import dcpfs
with dcpfs.open("'"$SAMPLE"'") as ck:
    print(ck.keys())
    print(ck.info("enc.weight"))
    print(ck.read("enc.weight", [(0, 2), slice(0, 4)]))'
else
    echo "== the Python package was not built: $(cat build/python-pkg.skip 2>/dev/null)"
fi
