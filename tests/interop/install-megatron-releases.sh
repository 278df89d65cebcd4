#!/bin/sh
# Install the megatron-core releases of tests/interop/megatron-releases.txt, each with
# pip --no-deps --target into its own folder (they cannot share one site-packages), and what
# a release's line adds after it, each once into a folder of its own, for
# tests/interop-megatron-releases.sh. Already installed ones are kept.
#   install-megatron-releases.sh            install what is missing
#   install-megatron-releases.sh --where    print the folder (DCPFS_MEGATRON_RELEASES, or
#                                            ~/.cache/dcpfs-tests/megatron-core)
#   install-megatron-releases.sh --path V   print release V's PYTHONPATH
set -eu
here=$(cd "$(dirname "$0")" && pwd)
home=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
dir=${DCPFS_MEGATRON_RELEASES:-$home/.cache/dcpfs-tests/megatron-core}   # not XDG_CACHE_HOME: make check sets it
list=$(grep -v '^#' "$here/megatron-releases.txt")
# The folder of a requirement (triton==3.9.0 -> deps/triton-3.9.0).
folder() { echo "$dir/deps/$(echo "$1" | sed 's/==/-/')"; }
case "${1:-}" in
--where)
    echo "$dir"
    exit 0 ;;
--path)
    line=$(echo "$list" | awk -v v="${2:-}" '$1 == v')
    [ -n "$line" ] || { echo "megatron-core ${2:-} is not in $here/megatron-releases.txt" >&2; exit 2; }
    path="$dir/$2"
    for req in $(echo "$line" | cut -s -d' ' -f2-); do
        path="$path:$(folder "$req")"
    done
    echo "$path"
    exit 0 ;;
esac
# pip_target FOLDER MARKER REQUIREMENT: install into FOLDER unless MARKER is there.
status=0
pip_target() {
    [ ! -e "$2" ] || return 0
    echo "== pip install --no-deps --target $1 $3"
    rm -rf "$1.tmp"
    if PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-deps --ignore-requires-python --target "$1.tmp" "$3"; then
        rm -rf "$1"
        mv "$1.tmp" "$1"
    else
        echo "pip install $3 failed: tests/interop-megatron-releases.sh will skip"
        status=1
    fi
}
while read -r v reqs; do
    [ -n "$v" ] || continue
    pip_target "$dir/$v" "$dir/$v/megatron/core/__init__.py" "megatron-core==$v"
    for req in $reqs; do
        f=$(folder "$req")
        pip_target "$f" "$f/${req%%==*}/__init__.py" "$req"
    done
done <<LIST
$list
LIST
exit $status
