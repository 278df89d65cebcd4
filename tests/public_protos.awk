# The functions a public header declares, one per line: "NAME" for a
# function the library exports, "NAME inline" for a static inline one.
# usage: awk -f public_protos.awk include/*.h
#
# A plain reading of C, enough for our headers: comments, preprocessor lines
# (with their continuation lines) and the C++ guard (#ifdef __cplusplus ...
# #endif) are dropped; the rest is cut into statements at ';', '{' and '}',
# and a statement at brace depth 0 (not inside a struct or an inline body)
# that is not a typedef and reads "TYPE [*]NAME(" declares NAME (function
# pointer typedefs, "(*NAME)(", and struct members are not functions).
BEGIN { cxx = 0 }
FNR == 1 { incomment = 0; cxx = 0; cont = 0; depth = 0; stmt = "" }
{
    line = $0
    # comments, possibly spanning lines
    out = ""
    while (line != "") {
        if (incomment) {
            i = index(line, "*/")
            if (i == 0) { line = ""; break }
            line = substr(line, i + 2); incomment = 0
        } else {
            i = index(line, "/*"); j = index(line, "//")
            if (j && (!i || j < i)) { out = out substr(line, 1, j - 1); line = ""; break }
            if (i == 0) { out = out line; line = ""; break }
            out = out substr(line, 1, i - 1) " "; line = substr(line, i + 2); incomment = 1
        }
    }
    line = out
    if (cont) { cont = (line ~ /\\[ \t]*$/); next }    # a directive's continuation line
    if (line ~ /^[ \t]*#[ \t]*if(def)?[ \t]+__cplusplus/) { cxx = 1; next }
    if (cxx) { if (line ~ /^[ \t]*#[ \t]*endif/) cxx = 0; next }
    if (line ~ /^[ \t]*#/) { cont = (line ~ /\\[ \t]*$/); next }
    n = length(line)
    for (k = 1; k <= n; k++) {
        c = substr(line, k, 1)
        if (c == ";" || c == "{" || c == "}") {
            if (depth == 0) statement(stmt, c)
            if (c == "{") depth++
            else if (c == "}") depth--
            stmt = ""
        } else {
            stmt = stmt c
        }
    }
    stmt = stmt " "
}

function statement(s, end,    name) {
    gsub(/[ \t]+/, " ", s)
    sub(/^ /, "", s)
    if (s ~ /^typedef / || s ~ /^return /) return
    if (!match(s, /^([A-Za-z_][A-Za-z0-9_]* )*[A-Za-z_][A-Za-z0-9_]*( |\*)+dcp_[A-Za-z0-9_]+ ?\(/)) return
    name = substr(s, 1, RLENGTH)
    sub(/ ?\($/, "", name)
    sub(/^.*[ *]/, "", name)
    if (s ~ /^static /) print name " inline"
    else print name
}
