/* The encoding of the catalog's rows: LEB128 varints and a closing XXH3 (see
 * integrity.h). Everything read back is hostile: a reader latches bad on any
 * overrun or overlong varint, and callers check every value. */
#include <stdlib.h>
#include <string.h>

#include "integrity.h"

void dcpi_put(dcpi_wbuf *w, const void *src, size_t n)
{
    if (w->oom || n == 0)   /* n == 0: src may be NULL (a 0-d shape) */
        return;
    if (w->n + n > w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 1 << 12;
        while (nc < w->n + n)
            nc *= 2;
        unsigned char *np = realloc(w->p, nc);
        if (!np) {
            w->oom = 1;
            return;
        }
        w->p = np;
        w->cap = nc;
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
}

void dcpi_put_u64(dcpi_wbuf *w, uint64_t v)
{
    unsigned char b[10];
    size_t n = 0;
    do {
        b[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        b[n++] |= v ? 0x80 : 0;
    } while (v);
    dcpi_put(w, b, n);
}

void dcpi_put_sum(dcpi_wbuf *w, uint64_t seed)
{
    uint64_t h = w->oom ? 0 : XXH3_64bits_withSeed(w->p, w->n, seed);
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(h >> (8 * i));
    dcpi_put(w, b, 8);
}

const void *dcpi_take(dcpi_rbuf *r, size_t n)
{
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = 1;
        return NULL;
    }
    const void *p = r->p;
    r->p += n;
    return p;
}

uint64_t dcpi_get_u64(dcpi_rbuf *r)
{
    uint64_t v = 0;
    for (unsigned shift = 0; !r->bad; shift += 7) {
        if (r->p == r->end || shift > 63 || (shift == 63 && (*r->p & 0x7e))) {
            r->bad = 1;
            break;
        }
        unsigned char b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    return 0;
}

int dcpi_sum_ok(const void *data, size_t len, uint64_t seed, dcpi_rbuf *r)
{
    if (!data || len < 8)
        return 0;
    const unsigned char *p = data, *s = p + len - 8;
    uint64_t h = 0;
    for (int i = 0; i < 8; i++)
        h |= (uint64_t)s[i] << (8 * i);
    r->p = p;
    r->end = s;
    r->bad = 0;
    return XXH3_64bits_withSeed(p, len - 8, seed) == h;
}
