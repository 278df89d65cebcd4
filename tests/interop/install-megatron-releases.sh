#!/bin/sh
# Install the megatron-core releases of tests/interop/megatron-releases.txt, each with
# pip --no-deps --target into its own folder (they cannot share one site-packages), for
# tests/interop-megatron-releases.sh. Already installed ones are kept.
#   install-megatron-releases.sh          install what is missing
#   install-megatron-releases.sh --where  print the folder (DCPFS_MEGATRON_RELEASES, or
#                                          ~/.cache/dcpfs-tests/megatron-core)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
home=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
dir=${DCPFS_MEGATRON_RELEASES:-$home/.cache/dcpfs-tests/megatron-core}   # not XDG_CACHE_HOME: make check sets it
if [ "${1:-}" = --where ]; then
    echo "$dir"
    exit 0
fi
status=0
for v in $(grep -v '^#' "$here/megatron-releases.txt"); do
    [ ! -f "$dir/$v/megatron/core/__init__.py" ] || continue
    echo "== pip install --no-deps --target $dir/$v megatron-core==$v"
    rm -rf "$dir/$v.tmp"
    if PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps --target "$dir/$v.tmp" "megatron-core==$v"; then
        rm -rf "$dir/$v"
        mv "$dir/$v.tmp" "$dir/$v"
    else
        echo "pip install megatron-core==$v failed: tests/interop-megatron-releases.sh will skip"
        status=1
    fi
done
exit $status
