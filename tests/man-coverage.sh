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
# Every option a user can give is named on the command's page (the calls above are only half of
# what a page documents): the long options of each dcp command's getopt table on its own page
# (man/dcp-CMD.1, else dcp.1), dcp's own options (main.c) on dcp.1, dcpload's on dcpload.1 and
# dcpfs's -o options (fuse_opt table) on dcpfs.1; and README's table of dcp commands. A page names
# an option as \-\-name (or name=).
page_text() { sed 's/\\f[BIRP]//g; s/\\//g' "$1"; }
undoc=
check_opts() {   # PAGE OPTION...
    local page=$1 o; shift
    local text; text=$(page_text "$top_srcdir/$page")
    for o in "$@"; do
        printf '%s\n' "$text" | grep -q -e "--$o\([^a-z0-9-]\|\$\)" || undoc="$undoc $page:--$o"
    done
}
long_opts() {   # FILE: the names of its struct option table
    grep -o '{"[a-z0-9-]*", *\(no_argument\|required_argument\|optional_argument\)' "$1" | sed 's/{"\([^"]*\)".*/\1/' | sort -u
}
# README's table of dcp commands names them too, in each command's rows (| `dcp CMD ...` |):
# its convert row lacked --nested, --no-crc, --no-sync and --quiet.
readme=$(grep '^| `dcp ' "$top_srcdir/README.md" || true)
for src in "$top_srcdir"/src/cli/cmd_*.c; do
    cmd=${src##*/cmd_}; cmd=${cmd%.c}
    page=man/dcp-$cmd.1; [ -f "$top_srcdir/$page" ] || page=man/dcp.1
    check_opts "$page" $(long_opts "$src" | grep -v '^help$')
    rows=$(printf '%s\n' "$readme" | grep "^| \`dcp $cmd[ \`]" || true)
    [ -n "$rows" ] || { undoc="$undoc README.md:dcp-$cmd"; continue; }
    for o in $(long_opts "$src" | grep -v '^help$'); do
        printf '%s\n' "$rows" | grep -q -e "--$o\([^a-z0-9-]\|\$\)" || undoc="$undoc README.md:dcp-$cmd:--$o"
    done
done
check_opts man/dcp.1 $(grep -o 'strcmp(argv\[1\], "--[a-z0-9-]*")' "$top_srcdir/src/cli/main.c" | sed 's/.*"--\([^"]*\)")/\1/' | sort -u)
check_opts man/dcpload.1 $(long_opts "$top_srcdir/src/load/dcpload.c")
n=$(grep -c 'OPT("' "$top_srcdir/fuse/main.c")
[ "$n" -gt 10 ] || fail "found $n -o options in fuse/main.c: has its option table changed form?"
fusetext=$(page_text "$top_srcdir/man/dcpfs.1")
for o in $(grep -o 'OPT("[a-z_]*' "$top_srcdir/fuse/main.c" | sed 's/OPT("//') max_read; do
    printf '%s\n' "$fusetext" | grep -q -e "^\.B[IR]* $o\b" -e "^$o\b" -e "-o \"\\? *$o\b" || undoc="$undoc man/dcpfs.1:-o $o"
done
[ -z "$undoc" ] || fail "options no page documents:$undoc"
echo "all $total public calls have a man page; every option of dcp, dcpload and dcpfs is on its page (dcp's in README's table too)"
exit 0
