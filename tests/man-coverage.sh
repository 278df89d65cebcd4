#!/bin/sh
# Every public call has a man page (README: Layout of the source): each
# function a public header (include/*.h) declares, static inline ones too,
# must be named in the NAME section of a page under man/, or appear as
# "NAME(" in its SYNOPSIS. Fails naming each call no page documents, and
# on a page under man/ that no dist_man_MANS lists.
. "$top_srcdir/tests/lib.sh"
scratch

awk -f "$top_srcdir/tests/public_protos.awk" "$top_srcdir"/include/*.h | cut -d' ' -f1 | LC_ALL=C sort -u \
    >"$SCRATCH/calls"
[ -s "$SCRATCH/calls" ] || fail "no function prototypes found in $top_srcdir/include/*.h"

# What the pages document: the words of NAME sections, and "word(" in SYNOPSIS sections.
for page in "$top_srcdir"/man/*.[1-9]; do
    awk '
        /^\.SH/ { sec = $0; sub(/^\.SH[ \t]+/, "", sec); gsub(/"/, "", sec); next }
        sec == "NAME" {
            s = $0; gsub(/\\-/, " ", s); gsub(/[^A-Za-z0-9_]+/, " ", s)
            n = split(s, w, " "); for (i = 1; i <= n; i++) print w[i]
        }
        sec == "SYNOPSIS" {
            s = $0
            while (match(s, /[A-Za-z_][A-Za-z0-9_]*[ \t]*\(/)) {
                name = substr(s, RSTART, RLENGTH); sub(/[ \t]*\($/, "", name); print name
                s = substr(s, RSTART + RLENGTH)
            }
        }' "$page"
done | LC_ALL=C sort -u >"$SCRATCH/documented"

missing=$(LC_ALL=C comm -23 "$SCRATCH/calls" "$SCRATCH/documented")
total=$(wc -l <"$SCRATCH/calls")
if [ -n "$missing" ]; then
    n=$(echo "$missing" | wc -l)
    echo "$n of $total public calls have no man page (no man/* names them in NAME or SYNOPSIS):" >&2
    echo "$missing" | sed 's/^/    /' >&2
    fail "undocumented public calls (above): add them to a page under man/ and to dist_man_MANS"
fi

# Every page is installed and distributed: listed in dist_man_MANS of Makefile.am or a *.mk.
unlisted=
for page in "$top_srcdir"/man/*.[1-9]; do
    rel="man/${page##*/}"
    grep -qs "dist_man_MANS.*[[:space:]]$rel\([[:space:]]\|\$\)" "$top_srcdir/Makefile.am" \
        "$top_srcdir"/*.mk "$top_srcdir"/*/*.mk "$top_srcdir"/*/*/*.mk || unlisted="$unlisted $rel"
done
[ -z "$unlisted" ] || fail "pages not in dist_man_MANS (add them in the .mk of their area):$unlisted"
echo "all $total public calls have a man page"
exit 0
