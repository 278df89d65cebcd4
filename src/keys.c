/* Key selection shared by dcp ls/convert/cat, dcpload and the library's
 * users: one rule everywhere (dcp.h, dcp_key_matches); and how a key that is
 * not UTF-8 is told apart and shown (dcp_key_utf8, dcp_key_json, dcp_key_text). */
#include <fnmatch.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp.h"

int dcp_key_matches(const char *pattern, const char *key)
{
    if (!pattern)
        return 1;
    if (fnmatch(pattern, key, 0) == 0)
        return 1;
    /* A pattern without wildcards is also a dotted prefix: "model" selects
     * "model.layer.weight" (torch's _load_state_dict_from_keys does the same). */
    size_t n = strlen(pattern);
    return n && strpbrk(pattern, "*?[\\") == NULL && strncmp(pattern, key, n) == 0 && key[n] == '.';
}

/* The code point of the UTF-8 sequence at p (its length in *len), or -1 when
 * p starts no well-formed sequence (RFC 3629: no overlong forms, nothing
 * above U+10FFFF). The encodings of U+D800..DFFF decode as themselves: a
 * lone surrogate in a Python str is pickled so (pickle's "surrogatepass"). */
static long utf8_next(const unsigned char *p, size_t *len)
{
    unsigned c = p[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!n)
        return -1;
    long cp = c & (0x7f >> n);
    for (size_t i = 1; i < n; i++) {   /* a NUL ends the string: never read past it */
        if ((p[i] & 0xc0) != 0x80)
            return -1;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return -1;
    *len = n;
    return cp;
}

static int is_surrogate(long cp)
{
    return cp >= 0xd800 && cp <= 0xdfff;
}

int dcp_key_utf8(const char *key)
{
    const unsigned char *p = (const unsigned char *)key;
    size_t n;
    for (; *p; p += n) {
        long cp = utf8_next(p, &n);
        if (cp < 0 || is_surrogate(cp))
            return 0;
    }
    return 1;
}

char *dcp_key_json(const char *key)
{
    const unsigned char *p = (const unsigned char *)key;
    size_t len = strlen(key);
    if (len > (SIZE_MAX - 3) / 6)
        return NULL;
    char *out = malloc(6 * len + 3), *o = out;   /* each byte grows to at most 6 */
    if (!out)
        return NULL;
    *o++ = '"';
    size_t n;
    for (; *p; p += n) {
        long cp = utf8_next(p, &n);
        if (cp < 0) {                 /* not UTF-8: the byte as Python's "surrogateescape" shows it */
            n = 1;
            o += sprintf(o, "\\u%04x", 0xdc00u | *p);
        } else if (is_surrogate(cp)) {
            o += sprintf(o, "\\u%04lx", cp);
        } else if (cp == '"' || cp == '\\') {
            *o++ = '\\';
            *o++ = (char)cp;
        } else if (cp < 0x20) {
            const char *esc = cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : cp == '\t' ? "\\t" : NULL;
            o += esc ? (size_t)sprintf(o, "%s", esc) : (size_t)sprintf(o, "\\u%04lx", cp);
        } else {
            memcpy(o, p, n);
            o += n;
        }
    }
    *o++ = '"';
    *o = 0;
    return out;
}

size_t dcp_key_text(const char *key, char *out, size_t cap)
{
    const unsigned char *p = (const unsigned char *)key;
    size_t need = 0, n;
    char esc[5];
    for (; *p; p += n) {
        long cp = utf8_next(p, &n);
        const char *put = (const char *)p;
        size_t len = n;
        /* C0, DEL and C1 controls (U+009B is a terminal's CSI) and what is not
         * UTF-8: one byte at a time, escaped */
        if (cp < 0 || is_surrogate(cp) || cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) {
            n = 1;
            if (*p == '\n' || *p == '\t' || *p == '\r')
                snprintf(esc, sizeof esc, "\\%c", *p == '\n' ? 'n' : *p == '\t' ? 't' : 'r');
            else
                snprintf(esc, sizeof esc, "\\x%02x", *p);
            put = esc;
            len = strlen(esc);
        }
        for (size_t i = 0; i < len; i++, need++)
            if (need + 1 < cap)
                out[need] = put[i];
    }
    if (cap)
        out[need < cap ? need : cap - 1] = 0;
    return need;
}
