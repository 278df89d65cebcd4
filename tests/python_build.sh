#!/bin/sh
# Build the Python package (python/) against this build tree's libdcp into
# BUILDDIR/python-pkg, for the python-*.sh tests (make check runs this once).
#
# usage: python_build.sh ABS_SRCDIR ABS_BUILDDIR
#
# The source tree may be read-only (distcheck): python/ is copied to a scratch
# folder and built there. pkg-config finds libdcp through the build tree's
# libdcp-uninstalled.pc. When python3, pip, numpy, cffi or setuptools are
# missing, the reason goes to BUILDDIR/python-pkg.skip (the tests skip with
# it) and the build does not fail; a failing compile does.
set -eu
src=$1 build=$2
out=$build/python-pkg
rm -rf "$out.tmp" "$out.skip"

reason=
if ! command -v python3 >/dev/null 2>&1; then
    reason="python3 is not installed"
else
    for m in pip numpy cffi setuptools; do
        python3 -c "import $m" 2>/dev/null || reason="${reason:+$reason, }python3 module $m is missing"
    done
    [ -z "$reason" ] || reason="$reason (pip install numpy cffi setuptools)"
fi
if [ -n "$reason" ]; then
    echo "python package not built: $reason" >&2
    echo "$reason" >"$out.skip"
    rm -rf "$out"
    exit 0
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dcpfs-pybuild.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$src/python" && tar -cf - --exclude=__pycache__ --exclude=build --exclude='*.egg-info' \
    --exclude='*.so' .) | (mkdir "$tmp/src" && cd "$tmp/src" && tar -xf -)
chmod -R u+w "$tmp/src"

start=$(date +%s)
if ! PKG_CONFIG_PATH="$build${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" PIP_ROOT_USER_ACTION=ignore \
        python3 -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir \
        --disable-pip-version-check --target "$out.tmp" "$tmp/src" >"$out.log" 2>&1; then
    cat "$out.log" >&2
    echo "python package: pip install failed (log above, and in $out.log)" >&2
    rm -rf "$out.tmp"
    exit 1
fi
rm -rf "$out"
mv "$out.tmp" "$out"      # the old package stays usable until here
echo "python package built into $out in $(( $(date +%s) - start )) s" >"$out.log.tmp"
cat "$out.log" >>"$out.log.tmp"; mv "$out.log.tmp" "$out.log"
