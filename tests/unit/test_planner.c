/* Planner tests: dcp_plan_region / dcp_plan_bytes + dcp_plan_execute against a
 * naive element-by-element reference on random tensors, chunk grids, stored
 * strides and regions; plus the op shapes promised for common layouts
 * (coalescing), zero fill and region errors. DCP_TEST_SEED overrides the seed. */
#include "check_quiet.h"
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_gplan.h"
#include "planner_ck.h"

/* ------------------------------------------------------------ random */

static uint64_t rng_state;

static uint64_t rnd64(void)
{
    uint64_t x = rng_state;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static uint64_t rnd(uint64_t n) { return n ? rnd64() % n : 0; }

/* ------------------------------------------------------------ a random case */

#define MAXD 5
#define MAXFILES 3

struct rchunk {
    int64_t off[MAXD], size[MAXD], stride[MAXD];
    int64_t storage_offset;
    uint32_t file;
    uint64_t data_offset, data_length;
    int present;
};

struct rcase {
    dcp_checkpoint *ck;
    const dcp_entry *e;
    int ndim;
    int64_t shape[MAXD];
    dcp_dtype dt;
    size_t esz;
    uint64_t numel;
    int nb[MAXD];                /* grid boundaries per dim: cuts[d][0..nb] */
    int64_t cuts[MAXD][8];
    struct rchunk *chunks;
    size_t nchunks;
    unsigned char *img[MAXFILES];
    size_t imglen[MAXFILES];
    int nfiles;
    unsigned char *ref;          /* the flat C-order image, computed element by element */
};

static const dcp_dtype rdtypes[] = { DCP_UINT8, DCP_FLOAT16, DCP_FLOAT32, DCP_FLOAT64, DCP_COMPLEX128 };

/* The source bytes of global element g, or NULL when no chunk holds it. */
static const unsigned char *ref_elem(const struct rcase *c, const int64_t *g)
{
    /* the grid is a product: find the cell per dim, then its chunk */
    size_t ci = 0;
    for (int d = 0; d < c->ndim; d++) {
        int k = 0;
        while (g[d] >= c->cuts[d][k + 1])
            k++;
        ci = ci * (size_t)c->nb[d] + (size_t)k;
    }
    const struct rchunk *ch = &c->chunks[ci];
    if (!ch->present)
        return NULL;
    int64_t pos = ch->storage_offset;
    for (int d = 0; d < c->ndim; d++) {
        ck_assert(g[d] >= ch->off[d] && g[d] < ch->off[d] + ch->size[d]);
        pos += (g[d] - ch->off[d]) * ch->stride[d];
    }
    return c->img[ch->file] + ch->data_offset + (uint64_t)pos * c->esz;
}

static void rcase_build(struct rcase *c)
{
    memset(c, 0, sizeof *c);
    c->ndim = (int)rnd(MAXD + 1);
    c->dt = rdtypes[rnd(sizeof rdtypes / sizeof rdtypes[0])];
    c->esz = dcp_dtype_size(c->dt);
    c->numel = 1;
    c->nchunks = 1;
    for (int d = 0; d < c->ndim; d++) {
        c->shape[d] = rnd(100) < 6 ? 0 : 1 + (int64_t)rnd(6);
        c->numel *= (uint64_t)c->shape[d];
        /* split at up to 3 random points */
        int64_t pts[8];
        int np = 0;
        pts[np++] = 0;
        int want = (int)rnd(4);
        for (int k = 0; k < want && c->shape[d] > 1; k++) {
            int64_t p = 1 + (int64_t)rnd((uint64_t)c->shape[d] - 1);
            int dup = 0;
            for (int q = 0; q < np; q++)
                dup |= pts[q] == p;
            if (!dup)
                pts[np++] = p;
        }
        for (int i = 1; i < np; i++)   /* sort */
            for (int j = i; j > 0 && pts[j] < pts[j - 1]; j--) {
                int64_t t = pts[j]; pts[j] = pts[j - 1]; pts[j - 1] = t;
            }
        pts[np] = c->shape[d];
        c->nb[d] = np;
        memcpy(c->cuts[d], pts, (size_t)(np + 1) * sizeof pts[0]);
        c->nchunks *= (size_t)np;
    }
    c->chunks = calloc(c->nchunks, sizeof *c->chunks);
    ck_assert_ptr_nonnull(c->chunks);
    c->nfiles = 1 + (int)rnd(MAXFILES);
    int holes = rnd(5) == 0;
    for (size_t ci = 0; ci < c->nchunks; ci++) {
        struct rchunk *ch = &c->chunks[ci];
        size_t rest = ci;
        for (int d = c->ndim - 1; d >= 0; d--) {
            int k = (int)(rest % (size_t)c->nb[d]);
            rest /= (size_t)c->nb[d];
            ch->off[d] = c->cuts[d][k];
            ch->size[d] = c->cuts[d][k + 1] - c->cuts[d][k];
        }
        ch->present = !(holes && rnd(3) == 0);
        /* dense strides for a random order of the dims (or C order) */
        int order[MAXD];
        for (int d = 0; d < c->ndim; d++)
            order[d] = d;
        if (rnd(3))
            for (int d = c->ndim - 1; d > 0; d--) {
                int j = (int)rnd((uint64_t)d + 1), t = order[d];
                order[d] = order[j], order[j] = t;
            }
        int64_t s = 1;
        for (int k = c->ndim - 1; k >= 0; k--) {
            ch->stride[order[k]] = s;
            s *= ch->size[order[k]];
        }
        uint64_t nel = (uint64_t)s;
        for (int d = 0; d < c->ndim; d++)
            if (ch->size[d] == 1 && rnd(4) == 0)
                ch->stride[d] = 999999;   /* never used: size-1 dims have any stride */
        ch->storage_offset = (int64_t)rnd(4);
        ch->data_length = ((uint64_t)ch->storage_offset + nel + rnd(3)) * c->esz;
        ch->file = (uint32_t)rnd((uint64_t)c->nfiles);
        ch->data_offset = c->imglen[ch->file] + rnd(64);
        c->imglen[ch->file] = ch->data_offset + ch->data_length;
    }
    dcp_checkpoint *ck = tck_new();
    for (int f = 0; f < c->nfiles; f++) {
        c->imglen[f] += rnd(16);
        c->img[f] = malloc(c->imglen[f] + 1);
        ck_assert_ptr_nonnull(c->img[f]);
        for (size_t i = 0; i < c->imglen[f]; i++)
            c->img[f][i] = (unsigned char)rnd64();
        char name[32];
        snprintf(name, sizeof name, "__%d_0.distcp", f);
        tck_file(ck, name, c->img[f], c->imglen[f]);
    }
    size_t idx = tck_tensor(ck, "model.layers.0.w", c->dt, c->ndim, c->shape);
    size_t *map = calloc(c->nchunks, sizeof *map);
    size_t n = 0;
    /* add the present chunks in a shuffled order: the planner must not rely on it */
    size_t *perm = malloc(c->nchunks * sizeof *perm);
    for (size_t i = 0; i < c->nchunks; i++)
        perm[i] = i;
    for (size_t i = c->nchunks; i > 1; i--) {
        size_t j = rnd(i), t = perm[i - 1];
        perm[i - 1] = perm[j], perm[j] = t;
    }
    for (size_t k = 0; k < c->nchunks; k++) {
        struct rchunk *ch = &c->chunks[perm[k]];
        if (ch->present)
            map[n++] = perm[k], tck_chunk(ck, idx, ch->off, ch->size, ch->file, ch->data_offset, ch->data_length);
    }
    tck_finish(ck);
    for (size_t k = 0; k < n; k++) {
        struct rchunk *ch = &c->chunks[map[k]];
        tck_record(ck, idx, k, c->dt, ch->data_offset, ch->data_length, ch->storage_offset, ch->stride, 0);
    }
    free(map);
    free(perm);
    c->ck = ck;
    c->e = &ck->entries[idx];

    /* the reference image, element by element */
    c->ref = calloc(c->numel * c->esz + 1, 1);
    int64_t g[MAXD] = {0};
    for (uint64_t i = 0; i < c->numel; i++) {
        const unsigned char *src = ref_elem(c, g);
        if (src)
            memcpy(c->ref + i * c->esz, src, c->esz);
        for (int d = c->ndim - 1; d >= 0; d--) {
            if (++g[d] < c->shape[d])
                break;
            g[d] = 0;
        }
    }
}

static void rcase_free(struct rcase *c)
{
    tck_free(c->ck);
    for (int f = 0; f < c->nfiles; f++)
        free(c->img[f]);
    free(c->chunks);
    free(c->ref);
}

/* Every op lies inside the region buffer and is whole elements. */
static void check_ops(const dcp_plan *p)
{
    for (size_t i = 0; i < p->nops; i++) {
        const dcp_op *op = &p->ops[i];
        ck_assert_uint_gt(op->length, 0);
        ck_assert_uint_eq(op->length % op->elem_size, 0);
        uint64_t n = op->length / op->elem_size;
        ck_assert_uint_le(op->dest_offset + (n - 1) * op->dest_stride + op->elem_size, p->nbytes);
        ck_assert(n == 1 || op->dest_stride >= op->elem_size);
    }
}

static void run_region(struct rcase *c, dcp_plan *p, const int64_t *off, const int64_t *len)
{
    dcp_error err;
    int rc = dcp_plan_region(c->ck, c->e, off, len, p, &err);
    ck_assert_msg(rc == 0, "%s", err.msg);
    uint64_t vol = 1;
    for (int d = 0; d < c->ndim; d++)
        vol *= (uint64_t)len[d];
    ck_assert_uint_eq(p->nbytes, vol * c->esz);
    ck_assert_int_eq(p->dtype, c->dt);
    check_ops(p);
    unsigned char *buf = malloc(p->nbytes + 1), *want = malloc(p->nbytes + 1);
    memset(buf, 0xA5, p->nbytes + 1);
    rc = dcp_plan_execute(c->ck, p, buf, &err);
    ck_assert_msg(rc == 0, "%s", err.msg);
    /* the reference box, gathered from the reference image */
    int64_t g[MAXD] = {0};
    for (uint64_t i = 0; i < vol; i++) {
        uint64_t flat = 0;
        for (int d = 0; d < c->ndim; d++)
            flat = flat * (uint64_t)c->shape[d] + (uint64_t)(off[d] + g[d]);
        memcpy(want + i * c->esz, c->ref + flat * c->esz, c->esz);
        for (int d = c->ndim - 1; d >= 0; d--) {
            if (++g[d] < len[d])
                break;
            g[d] = 0;
        }
    }
    ck_assert_msg(memcmp(buf, want, p->nbytes) == 0, "region differs from the reference (ndim %d)", c->ndim);
    ck_assert_uint_eq(buf[p->nbytes], 0xA5);
    free(buf);
    free(want);
}

static void run_bytes(struct rcase *c, dcp_plan *p, uint64_t off, uint64_t len)
{
    dcp_error err;
    uint64_t total = c->numel * c->esz;
    int rc = dcp_plan_bytes(c->ck, c->e, off, len, p, &err);
    ck_assert_msg(rc == 0, "%s", err.msg);
    uint64_t want_n = off >= total ? 0 : (len > total - off ? total - off : len);
    ck_assert_uint_eq(p->nbytes, want_n);
    check_ops(p);
    /* boxes are contiguous in C order: at most 2*ndim+1 of them, and the ops
     * of a contiguous single chunk coalesce into one */
    unsigned char *buf = malloc(want_n + 1);
    memset(buf, 0xA5, want_n + 1);
    rc = dcp_plan_execute(c->ck, p, buf, &err);
    ck_assert_msg(rc == 0, "%s", err.msg);
    ck_assert_msg(memcmp(buf, c->ref + (want_n ? off : 0), want_n) == 0,
                  "bytes [%" PRIu64 ", +%" PRIu64 ") differ from the reference", off, len);
    ck_assert_uint_eq(buf[want_n], 0xA5);
    free(buf);
}

START_TEST(test_random)
{
    uint64_t seed = 0x5eed1234abcdull;
    const char *s = getenv("DCP_TEST_SEED");
    if (s && *s)
        seed = strtoull(s, NULL, 0);
    printf("test_planner: random seed 0x%" PRIx64 " (set DCP_TEST_SEED to change)\n", seed);
    fflush(stdout);
    rng_state = seed | 1;
    dcp_plan p;
    dcp_plan_init(&p);
    size_t regions = 0, ranges = 0, ops = 0, nonempty = 0;
    for (int iter = 0; iter < 500; iter++) {
        struct rcase c;
        rcase_build(&c);
        int64_t off[MAXD], len[MAXD];
        for (int d = 0; d < c.ndim; d++)
            off[d] = 0, len[d] = c.shape[d];
        run_region(&c, &p, off, len);
        regions++;
        for (int q = 0; q < 12; q++) {
            for (int d = 0; d < c.ndim; d++) {
                /* mostly non-empty boxes; now and then an empty one */
                off[d] = (int64_t)rnd((uint64_t)c.shape[d] + (rnd(10) == 0));
                len[d] = off[d] < c.shape[d] ? 1 + (int64_t)rnd((uint64_t)(c.shape[d] - off[d])) : 0;
                if (rnd(20) == 0)
                    len[d] = 0;
                else if (rnd(3) == 0)
                    len[d] = c.shape[d] - off[d];
            }
            run_region(&c, &p, off, len);
            ops += p.nops;
            regions++;
            nonempty += p.nbytes > 0;
        }
        uint64_t total = c.numel * c.esz;
        run_bytes(&c, &p, 0, total);
        for (int q = 0; q < 12; q++) {
            uint64_t o = rnd(c.numel + 2) * c.esz;
            uint64_t l = rnd(c.numel + 2) * c.esz;
            if (rnd(4) == 0 && o < total)
                l = total - o + rnd(3 * c.esz);   /* may end unaligned past the end */
            run_bytes(&c, &p, o, l);
            ranges++;
        }
        rcase_free(&c);
    }
    printf("test_planner: %zu regions (%zu non-empty), %zu byte ranges, %zu ops\n", regions, nonempty,
           ranges, ops);
    dcp_plan_free(&p);
}
END_TEST

/* ------------------------------------------------------------ fixed layouts */

/* A 2-D float32 tensor [rows, cols] cut into chunks; data value = global
 * index, so placement errors show. Chunk k is stored C-contiguous (or
 * transposed), gap bytes apart in one file. */
struct grid {
    dcp_checkpoint *ck;
    const dcp_entry *e;
    float *want;
};

static struct grid grid_make(int64_t rows, int64_t cols, int64_t rcut, int64_t ccut, uint64_t gap,
                             int transposed, int drop)
{
    struct grid g = {0};
    int64_t rb[] = {0, rcut, rows}, cb[] = {0, ccut, cols};
    int nr = rcut > 0 && rcut < rows ? 2 : 1, nc = ccut > 0 && ccut < cols ? 2 : 1;
    if (nr == 1) rb[1] = rows;
    if (nc == 1) cb[1] = cols;
    size_t cap = (size_t)(rows * cols) * 4 + 4 * gap + 64;
    unsigned char *img = calloc(cap, 1);
    g.want = calloc((size_t)(rows * cols) + 1, sizeof(float));
    struct { int64_t off[2], size[2], stride[2]; uint64_t pos, len; } ch[4];
    size_t n = 0;
    uint64_t pos = gap;
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nc; j++) {
            int64_t r0 = rb[i], c0 = cb[j], h = rb[i + 1] - r0, w = cb[j + 1] - c0;
            ch[n].off[0] = r0, ch[n].off[1] = c0, ch[n].size[0] = h, ch[n].size[1] = w;
            ch[n].stride[0] = transposed ? 1 : w;
            ch[n].stride[1] = transposed ? h : 1;
            ch[n].pos = pos, ch[n].len = (uint64_t)(h * w) * 4;
            int dropped = drop == (int)n;
            for (int64_t r = 0; r < h; r++)
                for (int64_t c = 0; c < w; c++) {
                    float v = (float)((r0 + r) * cols + c0 + c);
                    memcpy(img + pos + (uint64_t)(r * ch[n].stride[0] + c * ch[n].stride[1]) * 4, &v, 4);
                    if (!dropped)
                        g.want[(r0 + r) * cols + c0 + c] = v;
                }
            pos += ch[n].len + gap;
            n++;
        }
    g.ck = tck_new();
    tck_file(g.ck, "__0_0.distcp", img, pos);
    int64_t shape[2] = {rows, cols};
    size_t idx = tck_tensor(g.ck, "w", DCP_FLOAT32, 2, shape);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if ((int)i != drop)
            tck_chunk(g.ck, idx, ch[i].off, ch[i].size, 0, ch[i].pos, ch[i].len);
    tck_finish(g.ck);
    for (size_t i = 0; i < n; i++)
        if ((int)i != drop)
            tck_record(g.ck, idx, k++, DCP_FLOAT32, ch[i].pos, ch[i].len, 0, ch[i].stride, 0);
    g.e = &g.ck->entries[idx];
    free(img);
    return g;
}

static void grid_full(struct grid *g, dcp_plan *p)
{
    dcp_error err;
    int64_t off[2] = {0, 0};
    ck_assert_msg(dcp_plan_region(g->ck, g->e, off, g->e->shape, p, &err) == 0, "%s", err.msg);
    float *buf = malloc(p->nbytes);
    memset(buf, 0xA5, p->nbytes);
    ck_assert_msg(dcp_plan_execute(g->ck, p, buf, &err) == 0, "%s", err.msg);
    ck_assert(memcmp(buf, g->want, p->nbytes) == 0);
    free(buf);
}

static void grid_free(struct grid *g)
{
    tck_free(g->ck);
    free(g->want);
}

START_TEST(test_single_chunk_one_op)
{
    struct grid g = grid_make(6, 10, 0, 0, 40, 0, -1);
    dcp_plan p;
    dcp_plan_init(&p);
    grid_full(&g, &p);
    ck_assert_uint_eq(p.nops, 1);
    ck_assert_int_eq(p.zero_fill, 0);
    ck_assert_uint_eq(p.ops[0].length, 240);
    ck_assert_uint_eq(p.ops[0].src_offset, 40);
    /* a byte range across partial rows: head, middle and tail boxes coalesce */
    dcp_error err;
    ck_assert_int_eq(dcp_plan_bytes(g.ck, g.e, 12, 180, &p, &err), 0);
    ck_assert_uint_eq(p.nops, 1);
    ck_assert_uint_eq(p.ops[0].src_offset, 52);
    ck_assert_uint_eq(p.ops[0].length, 180);
    ck_assert_uint_eq(p.nbytes, 180);
    /* a region inside: one op per row */
    int64_t off[2] = {1, 2}, len[2] = {3, 5};
    ck_assert_int_eq(dcp_plan_region(g.ck, g.e, off, len, &p, &err), 0);
    ck_assert_uint_eq(p.nops, 3);
    dcp_plan_free(&p);
    grid_free(&g);
}
END_TEST

START_TEST(test_row_sharded)
{
    struct grid g = grid_make(8, 5, 3, 0, 64, 0, -1);
    dcp_plan p;
    dcp_plan_init(&p);
    grid_full(&g, &p);
    ck_assert_uint_eq(p.nops, 2);   /* one op per chunk */
    for (size_t i = 0; i < p.nops; i++)
        ck_assert_uint_eq(p.ops[i].dest_stride, 4);
    grid_free(&g);
    /* chunks adjacent in the file coalesce across chunks */
    g = grid_make(8, 5, 3, 0, 0, 0, -1);
    grid_full(&g, &p);
    ck_assert_uint_eq(p.nops, 1);
    grid_free(&g);
    dcp_plan_free(&p);
}
END_TEST

START_TEST(test_col_sharded)
{
    struct grid g = grid_make(4, 6, 0, 2, 16, 0, -1);
    dcp_plan p;
    dcp_plan_init(&p);
    grid_full(&g, &p);
    ck_assert_uint_eq(p.nops, 8);   /* one op per row per chunk */
    for (size_t i = 0; i < p.nops; i++)
        ck_assert_uint_eq(p.ops[i].dest_stride, 4);
    dcp_plan_free(&p);
    grid_free(&g);
}
END_TEST

START_TEST(test_transposed)
{
    struct grid g = grid_make(3, 4, 0, 0, 8, 1, -1);
    dcp_plan p;
    dcp_plan_init(&p);
    grid_full(&g, &p);
    ck_assert_uint_eq(p.nops, 4);   /* one op per column */
    for (size_t i = 0; i < p.nops; i++) {
        ck_assert_uint_eq(p.ops[i].dest_stride, 16);
        ck_assert_uint_eq(p.ops[i].length, 12);
    }
    dcp_plan_free(&p);
    grid_free(&g);
}
END_TEST

START_TEST(test_zero_fill)
{
    struct grid g = grid_make(6, 6, 2, 3, 8, 0, 1);   /* the top-right chunk is missing */
    dcp_plan p;
    dcp_plan_init(&p);
    grid_full(&g, &p);
    ck_assert_int_eq(p.zero_fill, 1);
    /* a box inside present chunks needs no zero fill */
    dcp_error err;
    int64_t off[2] = {2, 0}, len[2] = {4, 6};
    ck_assert_int_eq(dcp_plan_region(g.ck, g.e, off, len, &p, &err), 0);
    ck_assert_int_eq(p.zero_fill, 0);
    /* a byte range within the missing chunk: all zeros, no ops */
    ck_assert_int_eq(dcp_plan_bytes(g.ck, g.e, 3 * 4, 3 * 4, &p, &err), 0);
    ck_assert_int_eq(p.zero_fill, 1);
    ck_assert_uint_eq(p.nops, 0);
    float buf[3] = {1, 1, 1};
    ck_assert_int_eq(dcp_plan_execute(g.ck, &p, buf, &err), 0);
    ck_assert(buf[0] == 0 && buf[1] == 0 && buf[2] == 0);
    dcp_plan_free(&p);
    grid_free(&g);
}
END_TEST

START_TEST(test_region_errors)
{
    struct grid g = grid_make(4, 6, 0, 0, 0, 0, -1);
    dcp_plan p;
    dcp_plan_init(&p);
    dcp_error err;
    int64_t off[2] = {0, 4}, len[2] = {4, 3};
    ck_assert_int_eq(dcp_plan_region(g.ck, g.e, off, len, &p, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_msg(strstr(err.msg, ": w: ") && strstr(err.msg, "dimension 1") && strstr(err.msg, "size 6") &&
                  strstr(err.msg, "offset 4") && strstr(err.msg, "length 3"), "%s", err.msg);
    ck_assert_uint_eq(p.nops, 0);
    int64_t off2[2] = {-1, 0}, len2[2] = {1, 1};
    ck_assert_int_eq(dcp_plan_region(g.ck, g.e, off2, len2, &p, &err), -1);
    ck_assert_msg(strstr(err.msg, "dimension 0"), "%s", err.msg);
    int64_t off3[2] = {INT64_MAX, 0}, len3[2] = {INT64_MAX, 1};
    ck_assert_int_eq(dcp_plan_region(g.ck, g.e, off3, len3, &p, &err), -1);
    ck_assert_int_eq(dcp_plan_region(g.ck, g.e, NULL, NULL, &p, &err), -1);
    /* unaligned byte ranges */
    ck_assert_int_eq(dcp_plan_bytes(g.ck, g.e, 2, 8, &p, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_msg(strstr(err.msg, "multiple of the element size"), "%s", err.msg);
    ck_assert_int_eq(dcp_plan_bytes(g.ck, g.e, 4, 6, &p, &err), -1);
    /* unaligned end allowed only past the end; reads at or past the end are empty */
    ck_assert_int_eq(dcp_plan_bytes(g.ck, g.e, 88, 7, &p, &err), -1);   /* ends at 95 of 96 */
    ck_assert_int_eq(dcp_plan_bytes(g.ck, g.e, 88, 9, &p, &err), 0);
    ck_assert_uint_eq(p.nbytes, 8);
    ck_assert_int_eq(dcp_plan_bytes(g.ck, g.e, 96, 4, &p, &err), 0);
    ck_assert_uint_eq(p.nbytes, 0);
    ck_assert_int_eq(dcp_plan_bytes(g.ck, g.e, 1000, UINT64_MAX, &p, &err), 0);
    ck_assert_uint_eq(p.nbytes, 0);
    ck_assert_int_eq(dcp_plan_bytes(g.ck, g.e, 0, UINT64_MAX, &p, &err), 0);
    ck_assert_uint_eq(p.nbytes, 96);
    dcp_plan_free(&p);
    grid_free(&g);
}
END_TEST

/* A shape with a 0 anywhere holds no element whatever its other sizes (torch
 * saves and loads torch.empty(2**62, 0)): the model takes it, its element and
 * byte counts are 0, a chunk of it passes the bounds checks, and its regions,
 * byte ranges and load requests are 0 bytes, nothing multiplied past 64 bits.
 * A negative size and a nonzero shape past the limit are refused as before. */
START_TEST(test_empty_huge_shapes)
{
    dcp_checkpoint *ck = tck_new();
    uint32_t f = tck_file(ck, "d", "x", 1);
    const int64_t H = INT64_C(1) << 62;
    const int64_t shapes[][3] = {{H, 0, 0}, {0, H, 0}, {0, H, H}, {H, H, 0}, {INT64_MAX, 0, INT64_MAX}};
    const int nds[] = {2, 2, 3, 3, 3};
    size_t idx[5];
    dcp_error err;
    for (int i = 0; i < 5; i++) {
        char key[8];
        snprintf(key, sizeof key, "z%d", i);
        idx[i] = tck_tensor(ck, key, DCP_FLOAT64, nds[i], shapes[i]);
        const int64_t zero[3] = {0, 0, 0};
        tck_chunk(ck, idx[i], zero, shapes[i], f, 0, 1);   /* as dcp.save writes it: one chunk, the whole */
    }
    /* a chunk past the end of the huge dimension is still refused, no sum wrapping */
    const int64_t off1[2] = {1, 0};
    size_t ci;
    ck_assert_int_eq(dcpi_model_add_chunk(ck, idx[0], off1, shapes[0], &ci, &err), -1);
    char want[600];
    snprintf(want, sizeof want,
             "%s: z0: chunk at offset 1 size 4611686018427387904 lies outside dimension 0 of size 4611686018427387904",
             ck->path);
    ck_assert_str_eq(err.msg, want);
    tck_finish(ck);

    dcp_plan p;
    dcp_plan_init(&p);
    for (int i = 0; i < 5; i++) {
        const dcp_entry *e = &ck->entries[idx[i]];
        uint64_t nb = 7;
        ck_assert_uint_eq(dcp_entry_numel(e), 0);
        ck_assert_int_eq(dcp_entry_nbytes(ck, e, &nb, &err), 0);
        ck_assert_uint_eq(nb, 0);
        /* the whole, and a box inside it */
        const int64_t zero[3] = {0, 0, 0};
        ck_assert_msg(dcp_plan_region(ck, e, zero, e->shape, &p, &err) == 0, "%s", err.msg);
        ck_assert_uint_eq(p.nbytes, 0);
        ck_assert_uint_eq(p.nops, 0);
        int64_t o[3], l[3];
        for (int d = 0; d < e->ndim; d++)
            o[d] = e->shape[d] ? e->shape[d] - 3 : 0, l[d] = e->shape[d] ? 3 : 0;
        ck_assert_msg(dcp_plan_region(ck, e, o, l, &p, &err) == 0, "%s", err.msg);
        ck_assert_uint_eq(p.nbytes, 0);
        ck_assert_uint_eq(p.nops, 0);
        ck_assert_int_eq(dcp_plan_bytes(ck, e, 0, UINT64_MAX, &p, &err), 0);
        ck_assert_uint_eq(p.nbytes, 0);
        /* a load request of the whole: 0 bytes (it said "region too large") */
        const dcp_entry *got;
        nb = 7;
        ck_assert_msg(dcp_greq_check(ck, e->key, DCP_FLOAT64, e->ndim, zero, e->shape, &got, &nb, &err) == 0,
                      "%s", err.msg);
        ck_assert_ptr_eq(got, e);
        ck_assert_uint_eq(nb, 0);
    }
    dcp_plan_free(&p);

    /* Refused as before: elements past the limit, a negative size (even beside a 0). */
    const int64_t big[2] = {H, 4}, big3[3] = {INT64_C(1) << 31, INT64_C(1) << 31, INT64_C(1) << 31};
    const int64_t neg[2] = {0, -1}, neg2[3] = {H, H, -2};
    size_t b;
    ck_assert_int_eq(dcpi_model_entry(ck, "big", 3, DCP_KIND_TENSOR, &b, &err), 0);
    snprintf(want, sizeof want, "%s: big: shape too large", ck->path);
    ck_assert_int_eq(dcpi_model_set_tensor(ck, b, DCP_FLOAT32, 2, big, &err), -1);
    ck_assert_int_eq(err.code, EOVERFLOW);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(dcpi_model_set_tensor(ck, b, DCP_UINT8, 3, big3, &err), -1);
    ck_assert_str_eq(err.msg, want);
    snprintf(want, sizeof want, "%s: big: negative dimension -1", ck->path);
    ck_assert_int_eq(dcpi_model_set_tensor(ck, b, DCP_FLOAT32, 2, neg, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_str_eq(err.msg, want);
    snprintf(want, sizeof want, "%s: big: negative dimension -2", ck->path);
    ck_assert_int_eq(dcpi_model_set_tensor(ck, b, DCP_FLOAT32, 3, neg2, &err), -1);
    ck_assert_str_eq(err.msg, want);
    tck_free(ck);
}
END_TEST

/* Hostile records: strides or offsets reaching outside the storage record. */
START_TEST(test_hostile_record)
{
    dcp_checkpoint *ck = tck_new();
    unsigned char data[64] = {0};
    tck_file(ck, "__0_0.distcp", data, sizeof data);
    int64_t shape[2] = {2, 3}, zero[2] = {0, 0};
    size_t idx = tck_tensor(ck, "t", DCP_FLOAT32, 2, shape);
    tck_chunk(ck, idx, zero, shape, 0, 0, 64);
    tck_finish(ck);
    int64_t stride[2] = {3, 1};
    tck_record(ck, idx, 0, DCP_FLOAT32, 0, 20, 0, stride, 0);   /* 20 < 24 bytes needed */
    dcp_plan p;
    dcp_plan_init(&p);
    dcp_error err;
    ck_assert_int_eq(dcp_plan_bytes(ck, &ck->entries[idx], 0, 24, &p, &err), -1);
    ck_assert_msg(strstr(err.msg, "beyond its storage record"), "%s", err.msg);
    int64_t neg[2] = {-3, 1};
    tck_record(ck, idx, 0, DCP_FLOAT32, 0, 24, 0, neg, 0);
    ck_assert_int_eq(dcp_plan_bytes(ck, &ck->entries[idx], 0, 24, &p, &err), -1);
    ck_assert_msg(strstr(err.msg, "negative stride"), "%s", err.msg);
    int64_t huge[2] = {INT64_MAX / 2, 1};
    tck_record(ck, idx, 0, DCP_FLOAT32, 0, 24, 0, huge, 0);
    ck_assert_int_eq(dcp_plan_bytes(ck, &ck->entries[idx], 0, 24, &p, &err), -1);
    tck_record(ck, idx, 0, DCP_FLOAT64, 0, 48, 0, stride, 0);   /* wrong element size */
    ck_assert_int_eq(dcp_plan_bytes(ck, &ck->entries[idx], 0, 24, &p, &err), -1);
    ck_assert_msg(strstr(err.msg, "float64") && strstr(err.msg, "float32"), "%s", err.msg);
    tck_record(ck, idx, 0, DCP_INT32, UINT64_MAX - 8, 24, 0, stride, 0);   /* offset overflow */
    ck_assert_int_eq(dcp_plan_bytes(ck, &ck->entries[idx], 0, 24, &p, &err), -1);
    /* same size, other dtype: trusted over metadata */
    tck_record(ck, idx, 0, DCP_INT32, 0, 24, 0, stride, 0);
    ck_assert_int_eq(dcp_plan_bytes(ck, &ck->entries[idx], 0, 24, &p, &err), 0);
    ck_assert_int_eq(p.dtype, DCP_INT32);
    dcp_plan_free(&p);
    tck_free(ck);
}
END_TEST

/* 0-d tensors and offsets beyond 4 GiB. */
START_TEST(test_scalar_and_big_offsets)
{
    dcp_checkpoint *ck = tck_new();
    unsigned char data[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    tck_file(ck, "__0_0.distcp", data, sizeof data);
    int64_t none[1] = {0};   /* 0-d: nothing is read from these */
    size_t s = tck_tensor(ck, "step", DCP_INT64, 0, none);
    tck_chunk(ck, s, none, none, 0, 0, 16);
    int64_t shape[1] = {3}, zero[1] = {0};
    size_t b = tck_tensor(ck, "big", DCP_FLOAT32, 1, shape);
    tck_chunk(ck, b, zero, shape, 0, (uint64_t)5 << 32, 12);
    tck_finish(ck);
    tck_record(ck, s, 0, DCP_INT64, 8, 8, 0, none, 0);
    int64_t st[1] = {1};
    tck_record(ck, b, 0, DCP_FLOAT32, ((uint64_t)5 << 32) + 4, 12, 0, st, 0);
    dcp_plan p;
    dcp_plan_init(&p);
    dcp_error err;
    ck_assert_int_eq(dcp_plan_region(ck, &ck->entries[s], NULL, NULL, &p, &err), 0);
    ck_assert_uint_eq(p.nops, 1);
    ck_assert_uint_eq(p.nbytes, 8);
    unsigned char out[8];
    ck_assert_int_eq(dcp_plan_execute(ck, &p, out, &err), 0);
    ck_assert(memcmp(out, data + 8, 8) == 0);
    ck_assert_int_eq(dcp_plan_bytes(ck, &ck->entries[b], 4, 8, &p, &err), 0);
    ck_assert_uint_eq(p.nops, 1);
    ck_assert_uint_eq(p.ops[0].src_offset, ((uint64_t)5 << 32) + 8);
    dcp_plan_free(&p);
    tck_free(ck);
}
END_TEST


/* Bytes items (one op over the stored blob, clamped) and chunks whose
 * record lies in a decoded (zstd) blob. */
START_TEST(test_bytes_item_and_decoded)
{
    dcp_checkpoint *ck = tck_new();
    unsigned char data[64];
    for (int i = 0; i < 64; i++)
        data[i] = (unsigned char)i;
    tck_file(ck, "__0_0.distcp", data, sizeof data);
    size_t bi;
    dcp_error err;
    ck_assert_int_eq(dcpi_model_entry(ck, "optim.param_groups", 18, DCP_KIND_BYTES, &bi, &err), 0);
    ck->entries[bi].blob = (dcp_blob){ .file = 0, .offset = 10, .length = 20 };
    ck->entries[bi].has_blob = 1;
    int64_t shape[1] = {4}, zero[1] = {0}, s1[1] = {1};
    size_t z = tck_tensor(ck, "z", DCP_FLOAT32, 1, shape);
    tck_chunk(ck, z, zero, shape, 0, 40, 24);
    ck->priv[z].chunks[0].blob.transforms = DCP_TRANSFORM_ZSTD;
    tck_finish(ck);
    tck_record(ck, z, 0, DCP_FLOAT32, 100, 16, 0, s1, DCP_RECORD_DECODED | DCP_RECORD_NEG);
    const dcp_entry *b = &ck->entries[bi];
    dcp_plan p;
    dcp_plan_init(&p);
    ck_assert_int_eq(dcp_plan_bytes(ck, b, 5, 100, &p, &err), 0);
    ck_assert_uint_eq(p.nbytes, 15);
    ck_assert_uint_eq(p.nops, 1);
    ck_assert_uint_eq(p.ops[0].src_offset, 15);
    ck_assert_uint_eq(p.ops[0].elem_size, 1);
    unsigned char out[15];
    ck_assert_int_eq(dcp_plan_execute(ck, &p, out, &err), 0);
    ck_assert(memcmp(out, data + 15, 15) == 0);
    ck_assert_int_eq(dcp_plan_bytes(ck, b, 20, 1, &p, &err), 0);
    ck_assert_uint_eq(p.nbytes, 0);
    ck_assert_int_eq(dcp_plan_region(ck, b, NULL, NULL, &p, &err), -1);
    void *buf;
    uint64_t len;
    ck_assert_int_eq(dcp_read_entry(ck, b, &buf, &len, &err), 0);
    ck_assert_uint_eq(len, 20);
    ck_assert(memcmp(buf, data + 10, 20) == 0);
    free(buf);
    /* decoded: offsets in the decoded blob, the blob travels with the op */
    ck_assert_int_eq(dcp_plan_bytes(ck, &ck->entries[z], 4, 8, &p, &err), 0);
    ck_assert_uint_eq(p.nops, 1);
    ck_assert_uint_eq(p.ops[0].flags, DCP_OP_DECODED | DCP_OP_NEG);
    ck_assert_uint_eq(p.ops[0].src_offset, 104);
    ck_assert_uint_eq(p.ops[0].blob.offset, 40);
    ck_assert_uint_eq(p.ops[0].blob.transforms, DCP_TRANSFORM_ZSTD);
    dcp_plan_free(&p);
    tck_free(ck);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("planner");
    TCase *t = tcase_create("planner");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, test_single_chunk_one_op);
    tcase_add_test(t, test_row_sharded);
    tcase_add_test(t, test_col_sharded);
    tcase_add_test(t, test_transposed);
    tcase_add_test(t, test_zero_fill);
    tcase_add_test(t, test_region_errors);
    tcase_add_test(t, test_empty_huge_shapes);
    tcase_add_test(t, test_hostile_record);
    tcase_add_test(t, test_scalar_and_big_offsets);
    tcase_add_test(t, test_bytes_item_and_decoded);
    tcase_add_test(t, test_random);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
