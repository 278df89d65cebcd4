#!/bin/sh
# The ABI of libdcp.so and libdcpload.so (README: Layout of the source).
#
# Each library exports its public calls through a linker version script
# (src/libdcp.map, src/load/libdcpload.map), and tests/abi/LIB.symbols lists
# what it exports, "NAME VERSION" per line. Against `nm -D --defined-only` of
# the built library this fails on
#   - a listed symbol that is gone, or now has another version (an ABI break),
#   - an exported symbol outside every version node (the version script is
#     not in use),
#   - an exported symbol that is not listed: additions are made on purpose,
#     by adding the line this prints to the list,
#   - an exported symbol no public header declares, and a header's call
#     (other than a static inline one) the library does not export;
# and, before any of that, on version macros in include/dcp.h that disagree
# with configure.ac's version. Skips (77) when the libraries are built
# static only (configure --disable-shared).
. "$top_srcdir/tests/lib.sh"
need nm

# The header's version against configure's (config.h's PACKAGE_VERSION).
ver() { sed -n "s/^#define DCP_VERSION_$1 \\([0-9][0-9]*\\)\$/\\1/p" "$top_srcdir/include/dcp.h"; }
hdr="$(ver MAJOR).$(ver MINOR).$(ver PATCH)"
pkg=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"$/\1/p' "$top_builddir/config.h")
[ -n "$pkg" ] || fail "no PACKAGE_VERSION in $top_builddir/config.h"
[ "$hdr" = "$pkg" ] ||
    fail "include/dcp.h says version $hdr (DCP_VERSION_MAJOR/MINOR/PATCH), configure.ac says $pkg: make them agree"

errors=0
checked=0
# check LIB HEADER...
check() {
    lib=$1; shift
    la="$top_builddir/$lib.la"
    [ -f "$la" ] || fail "$la is not built"
    dlname=$(sed -n "s/^dlname='\(.*\)'\$/\1/p" "$la")
    if [ -z "$dlname" ]; then
        echo "$lib: built static only, no shared library to check"
        return 0
    fi
    so="$top_builddir/.libs/$dlname"
    [ -f "$so" ] || fail "$so is missing (make $lib.la)"
    list="$top_srcdir/tests/abi/$lib.symbols"
    [ -f "$list" ] || fail "$list is missing"
    checked=$((checked + 1))

    want="$SCRATCH/$lib.want" got="$SCRATCH/$lib.got" bad="$SCRATCH/$lib.bad"
    grep -v '^#' "$list" | grep -v '^[[:space:]]*$' | LC_ALL=C sort >"$want"
    # "ADDR TYPE NAME@@VERSION" (the default version), "NAME@VERSION" (an
    # older one), bare "NAME" (no version); "ADDR A VERSION" lines define the
    # version nodes themselves.
    nm -D --defined-only "$so" >"$SCRATCH/$lib.nm" || fail "nm -D $so failed"
    awk -v got="$got" -v bad="$bad" '
        NF < 2 { next }
        { name = $NF; type = $(NF - 1) }
        type == "A" && name !~ /@/ { next }
        {
            n = index(name, "@@"); sep = 2
            if (n == 0) { n = index(name, "@"); sep = 1 }
            if (n == 0) { print name >bad; next }
            sym = substr(name, 1, n - 1); v = substr(name, n + sep)
            if (type == "A" && sym == v) next
            print sym, v >got
        }' "$SCRATCH/$lib.nm"
    touch "$got" "$bad"
    LC_ALL=C sort -o "$got" "$got"

    if [ -s "$bad" ]; then
        echo "$lib: exported outside every version node (is $lib's version script in use?):" >&2
        sed 's/^/    /' "$bad" >&2
        errors=$((errors + 1))
    fi
    gone=$(LC_ALL=C comm -23 "$want" "$got")
    new=$(LC_ALL=C comm -13 "$want" "$got")
    if [ -n "$gone" ]; then
        echo "$lib: listed in tests/abi/$lib.symbols but not exported (removed, or now in another version: an ABI break):" >&2
        echo "$gone" | sed 's/^/    /' >&2
        errors=$((errors + 1))
    fi
    if [ -n "$new" ]; then
        echo "$lib: exports symbols tests/abi/$lib.symbols does not list:" >&2
        echo "$new" | sed 's/^/    /' >&2
        echo "  if they are meant to be public, add these lines to tests/abi/$lib.symbols" >&2
        echo "  (and, once a version is released, put new calls in a new version node of the map)" >&2
        errors=$((errors + 1))
    fi

    # The headers and the exports agree.
    awk -f "$top_srcdir/tests/public_protos.awk" "$@" >"$SCRATCH/$lib.protos"
    awk 'NF == 1' "$SCRATCH/$lib.protos" | LC_ALL=C sort -u >"$SCRATCH/$lib.decl"
    cut -d' ' -f1 "$got" | LC_ALL=C sort -u >"$SCRATCH/$lib.names"
    undecl=$(LC_ALL=C comm -13 "$SCRATCH/$lib.decl" "$SCRATCH/$lib.names")
    unexp=$(LC_ALL=C comm -23 "$SCRATCH/$lib.decl" "$SCRATCH/$lib.names")
    if [ -n "$undecl" ]; then
        echo "$lib: exports calls no public header declares (make them static, or rename them off dcp_):" >&2
        echo "$undecl" | sed 's/^/    /' >&2
        errors=$((errors + 1))
    fi
    if [ -n "$unexp" ]; then
        echo "$lib: public headers declare calls it does not export:" >&2
        echo "$unexp" | sed 's/^/    /' >&2
        errors=$((errors + 1))
    fi
    echo "$lib: $(wc -l <"$got") symbols in $(cut -d' ' -f2 "$got" | LC_ALL=C sort -u | tr '\n' ' ')"
}

scratch
# libdcpload declares its calls in dcp_load.h; every other public header is libdcp's.
core_headers=
for h in "$top_srcdir"/include/*.h; do
    [ "${h##*/}" = dcp_load.h ] || core_headers="$core_headers $h"
done
# shellcheck disable=SC2086 # a list of paths without spaces in this tree
check libdcp $core_headers
check libdcpload "$top_srcdir/include/dcp_load.h"
[ "$errors" = 0 ] || fail "the libraries' exports differ from tests/abi (above)"
[ "$checked" -gt 0 ] || skip "the libraries are built static only (no .so to check)"
exit 0
