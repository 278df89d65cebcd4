/* dcpfs: the reversible key-component encoding described in names.h. */
#include <string.h>

#include "names.h"

int dfs_name_encode(const char *comp, size_t len, char *out, size_t outlen)
{
    size_t o = 0;
    if (len == 0) {
        if (outlen < 2)
            return -1;
        out[0] = '%';
        out[1] = '\0';
        return 1;
    }
    for (size_t i = 0; i < len; i++) {
        const char *rep = NULL;
        if (comp[i] == '%')
            rep = "%25";
        else if (comp[i] == '/')
            rep = "%2F";
        size_t n = rep ? 3 : 1;
        if (o + n + 1 > outlen)
            return -1;
        if (rep)
            memcpy(out + o, rep, 3);
        else
            out[o] = comp[i];
        o += n;
    }
    out[o] = '\0';
    return (int)o;
}

int dfs_name_decode(const char *name, char *out, size_t outlen)
{
    if (strcmp(name, "%") == 0) {
        if (outlen < 1)
            return -1;
        out[0] = '\0';
        return 0;
    }
    size_t o = 0;
    for (const char *p = name; *p; p++) {
        char c = *p;
        if (c == '.' || c == '/')
            return -1;
        if (c == '%') {
            if (p[1] == '2' && p[2] == '5')
                c = '%';
            else if (p[1] == '2' && p[2] == 'F')
                c = '/';
            else
                return -1;
            p += 2;
        }
        if (o + 1 >= outlen)
            return -1;
        out[o++] = c;
    }
    if (o == 0)
        return -1;
    out[o] = '\0';
    return (int)o;
}
