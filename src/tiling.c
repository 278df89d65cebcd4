/* Whether chunks tile a tensor exactly once: no overlap, no hole.
 *
 * dcp verify reports a tiling that is not exact (coverage.c); the planner
 * asks once an entry, since a box's count of covered elements proves the box
 * whole only when no two chunks overlap (an overlap and a hole of one size
 * cancel).
 *
 * Exact cover in O(n 2^k) for k "cut" dimensions (those some chunk does
 * not span entirely). Take f = (sum of the chunks' indicator functions) -
 * (the tensor's). Chunks tile the tensor exactly once iff f = 0, and f is the
 * k-fold prefix sum of its mixed finite difference, which is +-1 at each
 * box's 2^k corners. So: add every chunk's signed corners to a hash map,
 * subtract the tensor's, and the tiling is exact iff every count is zero.
 * A tiling that is not exact is swept for overlapping pairs
 * (dcpi_chunk_overlaps): verify names them, the planner needs only to know
 * whether there is one (holes alone leave a box's count exact).
 * Layer 0: it uses nothing but the model's types.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct corners {
    int64_t *pts;      /* cap * k coordinates */
    int32_t *count;    /* cap counts; INT32_MIN marks an empty slot */
    size_t cap, used;
    int k;
} corners;

static uint64_t pt_hash(const int64_t *p, int k)
{
    uint64_t h = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < k; i++) {
        h ^= (uint64_t)p[i];
        h *= 0xff51afd7ed558ccdu;
        h ^= h >> 33;
    }
    return h;
}

static int corners_grow(corners *c)
{
    size_t ncap = c->cap ? c->cap * 2 : 1024;
    int64_t *np = malloc(ncap * (size_t)c->k * sizeof *np);
    int32_t *nc = malloc(ncap * sizeof *nc);
    if (!np || !nc) {
        free(np);
        free(nc);
        return -1;
    }
    for (size_t i = 0; i < ncap; i++)
        nc[i] = INT32_MIN;
    for (size_t i = 0; i < c->cap; i++) {
        if (c->count[i] == INT32_MIN)
            continue;
        size_t j = pt_hash(c->pts + i * (size_t)c->k, c->k) & (ncap - 1);
        while (nc[j] != INT32_MIN)
            j = (j + 1) & (ncap - 1);
        memcpy(np + j * (size_t)c->k, c->pts + i * (size_t)c->k, (size_t)c->k * sizeof *np);
        nc[j] = c->count[i];
    }
    free(c->pts);
    free(c->count);
    c->pts = np;
    c->count = nc;
    c->cap = ncap;
    return 0;
}

static int corners_add(corners *c, const int64_t *p, int32_t v)
{
    if (2 * (c->used + 1) > c->cap && corners_grow(c) < 0)
        return -1;
    size_t j = pt_hash(p, c->k) & (c->cap - 1);
    while (c->count[j] != INT32_MIN && memcmp(c->pts + j * (size_t)c->k, p, (size_t)c->k * sizeof *p))
        j = (j + 1) & (c->cap - 1);
    if (c->count[j] == INT32_MIN) {
        memcpy(c->pts + j * (size_t)c->k, p, (size_t)c->k * sizeof *p);
        c->count[j] = 0;
        c->used++;
    }
    c->count[j] += v;   /* |count| <= chunks sharing a corner: no overflow for < 2^31 chunks */
    return 0;
}

/* The 2^k signed corners of box [lo, lo+size) over dims[0..k). */
static int add_box(corners *c, const int *dims, const int64_t *lo, const int64_t *size, int32_t sign)
{
    int64_t p[6];
    for (unsigned m = 0; m < (1u << c->k); m++) {
        int32_t s = sign;
        for (int i = 0; i < c->k; i++) {
            int upper = (m >> i) & 1;
            p[i] = lo[dims[i]] + (upper ? size[dims[i]] : 0);
            if (upper)
                s = -s;
        }
        if (corners_add(c, p, s) < 0)
            return -1;
    }
    return 0;
}

int dcpi_chunks_tile(const dcp_entry *e, const dcp_chunk *chunks, const size_t *idx, size_t m)
{
    int dims[DCPI_MAX_NDIM], k = 0;
    for (int d = 0; d < e->ndim; d++)
        for (size_t i = 0; i < m; i++)
            if (chunks[idx[i]].offsets[d] != 0 || chunks[idx[i]].sizes[d] != e->shape[d]) {
                dims[k++] = d;
                break;
            }
    if (k == 0)
        return m == 1;   /* every chunk spans the whole tensor */
    if (k > 6 || m >= INT32_MAX)
        return 0;        /* not worth it: the sweep decides */
    corners c = {NULL, NULL, 0, 0, k};
    static const int64_t zero[DCPI_MAX_NDIM];
    int rc = 1;
    for (size_t i = 0; i < m && rc == 1; i++)
        if (add_box(&c, dims, chunks[idx[i]].offsets, chunks[idx[i]].sizes, 1) < 0)
            rc = -1;
    if (rc == 1 && add_box(&c, dims, zero, e->shape, -1) < 0)
        rc = -1;
    for (size_t i = 0; i < c.cap && rc == 1; i++)
        if (c.count[i] != INT32_MIN && c.count[i] != 0)
            rc = 0;
    free(c.pts);
    free(c.count);
    return rc;
}


static int overlaps(const dcp_entry *e, const dcp_chunk *a, const dcp_chunk *b)
{
    for (int d = 0; d < e->ndim; d++)
        if (a->offsets[d] >= b->offsets[d] + b->sizes[d] || b->offsets[d] >= a->offsets[d] + a->sizes[d])
            return 0;
    return 1;
}

struct sweep { const dcp_chunk *chunks; int dim; };

static int by_start(const void *x, const void *y, void *arg)
{
    const struct sweep *s = arg;
    int64_t a = s->chunks[*(const size_t *)x].offsets[s->dim];
    int64_t b = s->chunks[*(const size_t *)y].offsets[s->dim];
    return (a > b) - (a < b);
}

/* A sweep along the dimension with the most distinct chunk starts: only
 * chunks whose ranges meet there are compared, so a tiling broken in a few
 * places costs a sort, not n^2 box tests. */
int64_t dcpi_chunk_overlaps(const dcp_entry *e, const dcp_chunk *chunks, size_t *idx, size_t m,
                            int (*fn)(void *ctx, size_t a, size_t b), void *ctx)
{
    int best = 0;
    size_t best_distinct = 0;
    struct sweep sw = {chunks, 0};
    for (int d = 0; d < e->ndim && m > 1; d++) {
        sw.dim = d;
        qsort_r(idx, m, sizeof *idx, by_start, &sw);
        size_t distinct = 1;
        for (size_t i = 1; i < m; i++)
            distinct += chunks[idx[i]].offsets[d] != chunks[idx[i - 1]].offsets[d];
        if (distinct > best_distinct) {
            best_distinct = distinct;
            best = d;
        }
    }
    if (e->ndim == 0)
        return m > 1 ? (fn(ctx, idx[0], idx[1]), 1) : 0;   /* 0-d: any two chunks are the same element */
    sw.dim = best;
    qsort_r(idx, m, sizeof *idx, by_start, &sw);
    int64_t found = 0;
    size_t lo = 0;   /* chunks before lo end before the current start on the sweep dim */
    for (size_t i = 0; i < m; i++) {
        const dcp_chunk *c = &chunks[idx[i]];
        while (lo < i && chunks[idx[lo]].offsets[best] + chunks[idx[lo]].sizes[best] <= c->offsets[best])
            lo++;
        for (size_t j = lo; j < i; j++) {
            const dcp_chunk *p = &chunks[idx[j]];
            if (p->offsets[best] + p->sizes[best] > c->offsets[best] && overlaps(e, p, c)) {
                found++;
                if (fn(ctx, idx[j], idx[i]))
                    return found;
            }
        }
    }
    return found;
}
