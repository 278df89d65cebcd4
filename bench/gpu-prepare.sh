#!/bin/bash
# Prepare the GPU checks on the development machine (issues 12 and 16): the
# lent GPU machines have CUDA, a Python with torch and no package registry.
#   bench/gpu-prepare.sh [OUT]   (OUT default .gpu, a folder git ignores)
# Builds dcpload and dcp with CUDA and statically linked libdcp into
# build-gpu/ (configure --with-cuda --disable-shared), packs them with the
# libraries they need ($DCPFS_GPU_BUNDLE, default ../shared/gpu/bundle.sh:
# OUT/bundle.tgz), copies a shared libdcp with its libraries and headers
# (OUT/pylib, OUT/include: the Python package is built there against them)
# and downloads the cffi and pycparser wheels for the GPU machine's Python
# 3.12 (OUT/wheels). Then, on
# the GPU machine, from the repository root with OUT carried:
#   bash bench/gpu-run.sh [OUT] [parts]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-.gpu}
cd "$top"
bundle=${DCPFS_GPU_BUNDLE:-../shared/gpu/bundle.sh}
[ -f "$bundle" ] || { echo "gpu-prepare: $bundle not found: it comes with the lent GPU machines (set DCPFS_GPU_BUNDLE)" >&2; exit 1; }
grep -qx "/$out/" .git/info/exclude 2>/dev/null || echo "/$out/" >>.git/info/exclude
grep -qx "/build-gpu/" .git/info/exclude || echo "/build-gpu/" >>.git/info/exclude
mkdir -p build-gpu "$out"
[ -f configure ] || autoreconf -i
(cd build-gpu && { [ -f Makefile ] || ../configure -q --with-cuda --disable-shared; } && make -j"$(nproc)" dcpload dcp >/dev/null)
bash "$bundle" "$out/bundle.tgz" build-gpu/dcpload build-gpu/dcp
# a shared libdcp for the Python package (any build of this tree will do)
shared=$(ls -d build*/.libs/libdcp.so.0 2>/dev/null | head -1)
[ -n "$shared" ] || { mkdir -p build-shared && (cd build-shared && { [ -f Makefile ] || ../configure -q; } && make -j"$(nproc)" libdcp.la >/dev/null); shared=build-shared/.libs/libdcp.so.0; }
rm -rf "$out/pylib" "$out/include" && mkdir -p "$out/pylib" "$out/include"
cp -L "$shared" "$out/pylib/libdcp.so.0" && ln -sf libdcp.so.0 "$out/pylib/libdcp.so"
ldd "$shared" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
    xargs -r -I{} cp -L {} "$out/pylib/"
cp include/*.h "$out/include/"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$out/wheels" cffi==2.0.0 pycparser==2.23
du -sh "$out"
