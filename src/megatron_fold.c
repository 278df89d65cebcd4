/* Megatron-Core's reformulated tensors shown in their original shape
 * (DCP_OPEN_MEGATRON_FOLD).
 *
 * Megatron-Core's distributed optimizer keeps each data-parallel rank's
 * flattened range of a tensor's tensor-parallel block. torch_dist cannot
 * store a flattened range of an N-D block, so Megatron-Core stores a tensor
 * of original shape G = [X, Y] split into blocks l = [x, y] as one of shape
 * [X/x, Y/y, x*y] (each block a row of the last dimension, each rank's range
 * a chunk [1, 1, len] of it), and writes G in the .metadata's mcore_data
 * (megatron/core/dist_checkpointing/strategies/resharding.py). PyTorch's
 * own load, and dcpfs by default, show the stored shape.
 *
 * Folded, the entry gets G and chunks in G's coordinates: a range of
 * elements of a C-ordered block is a union of at most 2n-1 boxes of it, each
 * a contiguous run of the range (a partial row, whole rows, whole planes,
 * ...), and each such box of the block is a box of G at the block's origin.
 * Each box becomes a chunk whose record is the stored chunk's, moved to the
 * run's first element and strided as the box (dcpi_fold_record), so the
 * planner, the mount and the loaders read it like any chunk, each stored
 * byte once. Only the model changes: nothing is read at open.
 *
 * What Megatron-Core guarantees, and is checked here (else the entry keeps
 * its stored shape): the stored shape is [F_0..F_{n-1}, P], G_i a multiple
 * of F_i, P the product of l_i = G_i / F_i, and every chunk [1, ..., 1, len]
 * (one block's range).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "store.h"

/* A stored chunk's record, located once for the up to 2n-1 folded chunks
 * that read from it (under ck->lock). */
typedef struct located {
    int state;                 /* 0 not yet, 1 rec and step hold */
    dcp_record rec;            /* without its strides: only step is needed */
    int64_t step;              /* elements between the chunk's consecutive elements */
} located;

struct dcpi_fold {
    dcp_entry stored;          /* the entry as stored: its shape, chunks and key */
    const dcp_chunk *parents;  /* the stored chunks (arena) */
    located *records;          /* per stored chunk (arena) */
    const size_t *parent;      /* per folded chunk: its stored chunk */
    const uint64_t *skip;      /* per folded chunk: elements of the stored chunk before its run */
};

/* The block shape l of entry e as a reformulation of g (n dims): 1 when
 * e's stored shape is [F_0..F_{n-1}, P] with g_i a multiple of F_i and P the
 * product of l_i = g_i / F_i, else 0. */
static int block_shape(const dcp_entry *e, const int64_t *g, int n, int64_t *l)
{
    if (e->kind != DCP_KIND_TENSOR || n < 1 || e->ndim != n + 1)
        return 0;
    uint64_t p = 1;
    for (int d = 0; d < n; d++) {
        if (e->shape[d] < 1 || g[d] < 0 || g[d] % e->shape[d])
            return 0;
        l[d] = g[d] / e->shape[d];
        if (!dcpi_mul_u64(p, (uint64_t)l[d], &p))
            return 0;
    }
    return p == (uint64_t)e->shape[n];
}

/* Whether every chunk is one block's range ([1, ..., 1, len]): what the
 * fold takes. */
static int block_ranges(const dcp_entry *e, const dcp_chunk *c, int n)
{
    for (size_t i = 0; i < e->nchunks; i++)
        for (int d = 0; d < n; d++)
            if (c[i].sizes[d] != 1)
                return 0;
    return 1;
}

/* The boxes of the elements [pos, end) of a C-ordered block of shape l (n
 * dims): calls take(ctx, box offsets, box sizes, run start) for each, in
 * order, and returns how many (at most 2n-1 for a nonempty range). */
typedef int (*box_fn)(void *ctx, const int64_t *off, const int64_t *size, uint64_t at);

static int64_t ranges(const int64_t *l, int n, uint64_t pos, uint64_t end, box_fn take, void *ctx)
{
    uint64_t tail[DCPI_MAX_NDIM];   /* tail[d]: elements of one step along dimension d */
    tail[n - 1] = 1;
    for (int d = n - 2; d >= 0; d--)
        tail[d] = tail[d + 1] * (uint64_t)l[d + 1];   /* <= P: no overflow */
    int64_t count = 0;
    while (pos < end) {
        /* The outermost dimension along which a whole step starts at pos and fits. */
        int d = 0;
        while (pos % tail[d] || tail[d] > end - pos)
            d++;
        int64_t off[DCPI_MAX_NDIM], size[DCPI_MAX_NDIM];
        uint64_t rest = pos;
        for (int k = 0; k < n; k++) {
            off[k] = (int64_t)(rest / tail[k]);
            rest %= tail[k];
            size[k] = k < d ? 1 : k == d ? 0 : l[k];
        }
        uint64_t steps = (end - pos) / tail[d], room = (uint64_t)(l[d] - off[d]);
        size[d] = (int64_t)(steps < room ? steps : room);
        if (take && take(ctx, off, size, pos) < 0)
            return -1;
        pos += (uint64_t)size[d] * tail[d];
        count++;
    }
    return count;
}

typedef struct folding {
    dcp_checkpoint *ck;
    const int64_t *l;
    const dcp_chunk *src;      /* the stored chunk: its block index, blob, first element */
    size_t parent;             /* and its index */
    int n;
    dcp_chunk *out;
    size_t *parents;
    uint64_t *skips;
    size_t nout;
    dcp_error *err;
} folding;

static int add_box(void *ctx, const int64_t *off, const int64_t *size, uint64_t at)
{
    folding *f = ctx;
    int n = f->n;
    int64_t *box = dcpi_arena_alloc(&f->ck->arena, 2 * (size_t)n * sizeof *box);
    if (!box)
        return dcpi_err(f->err, ENOMEM, "%s: out of memory", f->ck->path);
    for (int d = 0; d < n; d++) {
        box[d] = f->src->offsets[d] * f->l[d] + off[d];   /* < G[d]: no overflow */
        box[n + d] = size[d];
    }
    dcp_chunk *c = &f->out[f->nout];
    memset(c, 0, sizeof *c);
    c->offsets = box;
    c->sizes = box + n;
    c->blob = f->src->blob;   /* the same bytes (what the integrity checks and plans group by) */
    c->has_blob = f->src->has_blob;
    f->parents[f->nout] = f->parent;
    f->skips[f->nout] = at - (uint64_t)f->src->offsets[f->n];
    f->nout++;
    return 0;
}

static int fold_entry(dcp_checkpoint *ck, size_t idx, const dcpi_reform *r, dcp_error *err)
{
    dcp_entry *e = &ck->entries[idx];
    struct dcpi_entry_priv *p = &ck->priv[idx];
    const dcp_chunk *c = p->chunks;
    int n = r->ndim;
    int64_t l[DCPI_MAX_NDIM];
    if (p->records || p->fold || !block_shape(e, r->shape, n, l) || !block_ranges(e, c, n))
        return 0;   /* not what Megatron-Core writes: the stored view stays */
    size_t total = 0;
    for (size_t i = 0; i < e->nchunks; i++) {
        uint64_t first = (uint64_t)c[i].offsets[n], len = (uint64_t)c[i].sizes[n];
        total += (size_t)ranges(l, n, first, first + len, NULL, NULL);   /* <= (2n-1) a chunk */
    }
    struct dcpi_fold *f = dcpi_arena_alloc(&ck->arena, sizeof *f);
    dcp_chunk *parents = dcpi_arena_memdup(&ck->arena, c, (e->nchunks ? e->nchunks : 1) * sizeof *c);
    located *records = dcpi_arena_alloc(&ck->arena, (e->nchunks ? e->nchunks : 1) * sizeof *records);
    size_t *pidx = dcpi_arena_alloc(&ck->arena, (total ? total : 1) * sizeof *pidx);
    uint64_t *skips = dcpi_arena_alloc(&ck->arena, (total ? total : 1) * sizeof *skips);
    int64_t *shape = dcpi_arena_memdup(&ck->arena, r->shape, (size_t)n * sizeof *shape);
    dcp_chunk *out = malloc((total ? total : 1) * sizeof *out);
    if (!f || !parents || !records || !pidx || !skips || !shape || !out) {
        free(out);
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    }
    folding fo = {.ck = ck, .l = l, .n = n, .out = out, .parents = pidx, .skips = skips, .err = err};
    for (size_t i = 0; i < e->nchunks; i++) {
        uint64_t first = (uint64_t)c[i].offsets[n];
        fo.src = &c[i];
        fo.parent = i;
        if (ranges(l, n, first, first + (uint64_t)c[i].sizes[n], add_box, &fo) < 0) {
            free(out);
            return -1;
        }
    }
    f->stored = *e;
    f->parents = parents;
    f->records = records;
    f->parent = pidx;
    f->skip = skips;
    free(p->chunks);
    p->chunks = out;
    p->chunk_cap = total ? total : 1;
    p->fold = f;
    e->ndim = n;
    e->shape = shape;
    e->nchunks = total;
    return 0;
}

void dcpi_megatron_count(dcp_checkpoint *ck)
{
    /* mcore_data is a dict, but a hostile pickle may name a key twice */
    unsigned char *seen = ck->nreform ? calloc(ck->nentries ? ck->nentries : 1, 1) : NULL;
    size_t n = 0;
    for (size_t i = 0; i < ck->nreform && seen; i++) {
        uint64_t idx;
        int64_t l[DCPI_MAX_NDIM];
        if (dcpi_strmap_get(&ck->keys, ck->reform[i].key, ck->reform[i].keylen, &idx) && !seen[idx] &&
            block_shape(&ck->entries[idx], ck->reform[i].shape, ck->reform[i].ndim, l)) {
            seen[idx] = 1;
            n++;
        }
    }
    free(seen);
    ck->info.megatron_reformulated = n;   /* (0 if out of memory: a count for people) */
}

int dcpi_megatron_fold(dcp_checkpoint *ck, dcp_error *err)
{
    if (dcpi_store_sets(ck) || ck->spill)
        return dcpi_err(err, EINVAL, "%s: Megatron-Core tensors are folded in a parsed model only", ck->path);
    for (size_t i = 0; i < ck->nreform; i++) {
        uint64_t idx;
        if (dcpi_strmap_get(&ck->keys, ck->reform[i].key, ck->reform[i].keylen, &idx) &&
            fold_entry(ck, (size_t)idx, &ck->reform[i], err) < 0)
            return -1;
    }
    size_t folded = 0;
    for (size_t i = 0; i < ck->nentries; i++)
        folded += ck->priv[i].fold != NULL;
    ck->info.megatron_folded = folded;
    return 0;
}

int dcpi_fold_record(dcp_checkpoint *ck, const dcp_entry *e, const struct dcpi_fold *f, const dcp_chunk *c,
                     size_t i, dcp_record *rec, int64_t *stride, dcp_error *err)
{
    size_t pi = f->parent[i];
    const dcp_chunk *pc = &f->parents[pi];
    located *lr = &f->records[pi];
    int n = e->ndim;
    pthread_mutex_lock(&ck->lock);
    located got = *lr;
    pthread_mutex_unlock(&ck->lock);
    if (!got.state) {
        /* Locate without the lock (it does I/O); a racing thread finds the same. */
        int64_t pstride[DCPI_MAX_NDIM];
        if (dcpi_locate_record(ck, &f->stored, pc, pi, &got.rec, pstride, err) < 0)
            return -1;
        /* The stored chunk [1, ..., 1, len]: its k-th element at storage_offset + k * step. */
        got.step = pc->sizes[n] > 1 ? pstride[n] : 1;
        got.rec.stride = NULL;
        got.state = 1;
        pthread_mutex_lock(&ck->lock);
        if (!lr->state)
            *lr = got;
        pthread_mutex_unlock(&ck->lock);
    }
    *rec = got.rec;
    int64_t step = got.step, s, at;
    if (step < 0 || __builtin_mul_overflow((int64_t)f->skip[i], step, &s) ||
        __builtin_add_overflow(rec->storage_offset, s, &at))
        return dcpi_err(err, EOVERFLOW, "%s: %s: chunk %zu: its storage offset overflows", ck->path, e->key, i);
    rec->storage_offset = at;
    int64_t run = step;
    for (int d = n - 1; d >= 0; d--) {
        stride[d] = run;
        if (__builtin_mul_overflow(run, c->sizes[d] > 1 ? c->sizes[d] : 1, &run))
            return dcpi_err(err, EOVERFLOW, "%s: %s: chunk %zu: strides overflow", ck->path, e->key, i);
    }
    return 0;
}
