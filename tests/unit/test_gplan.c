/* libdcp's global load plan (dcp_gplan.h), without any transport:
 *  - requests: dcp_greqs_encode / dcp_greqs_decode round trip, the wire
 *    format's bytes, truncated, malformed and random blocks (EPROTO with a
 *    message, never a crash), and the checks against the checkpoint;
 *  - plans: every rank computes the same plan (the same units, readers,
 *    order, fragments, deliveries and groups for every `me`), no unit
 *    exceeds the staging size, the fragments of every op cover its source
 *    bytes exactly once;
 *  - execution: reading every unit (dcp_gunit_read), packing each
 *    delivery (dcp_gdlv_pack) and placing every rank's fragments from the
 *    buffer it holds (dcp_gfrag_place) gives, for every rank, exactly the
 *    bytes dcp_plan_execute gives for each of its requests; with p2p,
 *    broadcast and shm deliveries.
 * On fixtures 02 (overlapping, irregular requests of 1..4 ranks) and 05
 * (dtypes, 0-d tensors, bytes items), every option combination and several
 * staging sizes. Public API only: it links libdcp.la. */
#include "check_quiet.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcp.h"
#include "dcp_gplan.h"

static char fixtures[4096];

static dcp_checkpoint *open_fixture(const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s/ckpt", fixtures, name);
    dcp_checkpoint *ck;
    dcp_error err;
    ck_assert_msg(dcp_open(path, 0, &ck, &err) == 0, "%s", err.msg);
    return ck;
}

/* ------------------------------------------------------------ requests */

#define MAXREG 64

/* One rank's regions, with the storage of their boxes. */
struct rank_regions {
    dcp_gregion v[MAXREG];
    int64_t dims[MAXREG][2][8];
    size_t n;
};

static void add_region(struct rank_regions *rr, const char *key, dcp_dtype dt, int ndim, const int64_t *off,
                       const int64_t *len)
{
    ck_assert_uint_lt(rr->n, MAXREG);
    ck_assert_int_le(ndim, 8);
    size_t i = rr->n++;
    for (int d = 0; d < ndim; d++) {
        rr->dims[i][0][d] = off[d];
        rr->dims[i][1][d] = len[d];
    }
    rr->v[i] = (dcp_gregion){key, dt, ndim, ndim ? rr->dims[i][0] : NULL, ndim ? rr->dims[i][1] : NULL};
}

/* 02: overlapping row bands, a column band, a key twice, the last rank
 * nothing. */
static void regions_02(dcp_checkpoint *ck, int nranks, int rk, struct rank_regions *rr)
{
    static const char *keys[] = {"model.embed_tokens.weight", "model.lm_head.weight", "model.embed_tokens.weight",
                                 "model.tiny"};
    memset(rr, 0, sizeof *rr);
    if (nranks > 1 && rk == nranks - 1)
        return;
    int64_t boxes[4][4] = {{rk * 150, 0, 300, 257}, {0, rk * 40, 999, 60}, {rk * 150 + 10, 5, 7, 250}, {1, 1, 3, 2}};
    for (size_t i = 0; i < 4; i++) {
        const dcp_entry *e = dcp_find(ck, keys[i]);
        ck_assert_ptr_nonnull(e);
        int64_t off[2] = {boxes[i][0], boxes[i][1]}, len[2] = {boxes[i][2], boxes[i][3]};
        add_region(rr, keys[i], i == 3 ? DCP_DTYPE_INVALID : e->dtype, 2, off, len);
    }
}

/* Any checkpoint: overlapping bands of dim 0 per rank, the last dimension cut
 * on odd ranks (strided placements), 0-d tensors and bytes items whole on
 * some ranks. */
static void regions_any(dcp_checkpoint *ck, int nranks, int rk, struct rank_regions *rr)
{
    memset(rr, 0, sizeof *rr);
    for (size_t i = 0; i < dcp_num_entries(ck); i++) {
        const dcp_entry *e = dcp_entry_at(ck, i);
        ck_assert_ptr_nonnull(e);
        if (e->kind == DCP_KIND_BYTES) {
            if (rk == 0 || (size_t)rk % 2 == i % 2)
                add_region(rr, e->key, DCP_UINT8, 0, NULL, NULL);
            continue;
        }
        if (e->ndim == 0) {
            if ((size_t)(rk + 1) % 2 == i % 2 || nranks == 1)
                add_region(rr, e->key, e->dtype, 0, NULL, NULL);
            continue;
        }
        int64_t off[8], len[8];
        for (int d = 0; d < e->ndim; d++) {
            off[d] = 0;
            len[d] = e->shape[d];
        }
        int64_t s = e->shape[0];
        off[0] = s * rk / (nranks + 1);
        len[0] = 2 * s / (nranks + 1) + 1;
        if (off[0] + len[0] > s)
            len[0] = s - off[0];
        int last = e->ndim - 1;
        if (rk % 2 && e->shape[last] > 2) {
            off[last] = 1;
            len[last] = e->shape[last] - 2;
        }
        add_region(rr, e->key, e->dtype, e->ndim, off, len);
    }
}

/* The exchange without a transport: every rank's block, concatenated. */
struct exchange {
    unsigned char *all;
    size_t counts[8], displs[8];
};

static void exchange(const struct rank_regions *rr, int nranks, struct exchange *x)
{
    size_t total = 0;
    unsigned char *blk[8];
    dcp_error err;
    for (int rk = 0; rk < nranks; rk++) {
        ck_assert_msg(dcp_greqs_encode(rr[rk].v, rr[rk].n, &blk[rk], &x->counts[rk], &err) == 0, "%s", err.msg);
        x->displs[rk] = total;
        total += x->counts[rk];
    }
    x->all = malloc(total ? total : 1);
    for (int rk = 0; rk < nranks; rk++) {
        if (x->counts[rk])
            memcpy(x->all + x->displs[rk], blk[rk], x->counts[rk]);
        free(blk[rk]);
    }
}

/* Encode every rank's regions, decode them all, check the round trip. */
static void make_reqs(dcp_checkpoint *ck, const struct rank_regions *rr, int nranks, dcp_greqs *r)
{
    struct exchange x;
    exchange(rr, nranks, &x);
    dcp_error err;
    ck_assert_msg(dcp_greqs_decode(ck, x.all, x.counts, x.displs, nranks, r, &err) == 0, "%s", err.msg);
    free(x.all);
    for (int rk = 0; rk < nranks; rk++) {
        ck_assert_uint_eq(r->first[rk + 1] - r->first[rk], rr[rk].n);
        for (size_t i = 0; i < rr[rk].n; i++) {
            const dcp_greq *q = &r->v[r->first[rk] + i];
            const dcp_gregion *g = &rr[rk].v[i];
            ck_assert_int_eq(q->rank, rk);
            ck_assert_str_eq(q->e->key, g->key);
            ck_assert_int_eq(q->ndim, g->ndim);
            ck_assert_int_eq(q->dtype, q->e->kind == DCP_KIND_BYTES ? DCP_UINT8 : q->e->dtype);
            ck_assert_ptr_null(q->dest);
            ck_assert_int_eq(q->mem, 0);
            uint64_t nb = q->e->kind == DCP_KIND_BYTES ? 0 : dcp_dtype_size(q->e->dtype);
            for (int d = 0; d < g->ndim; d++) {
                ck_assert_int_eq(q->off[d], g->offsets[d]);
                ck_assert_int_eq(q->len[d], g->lengths[d]);
                nb *= (uint64_t)g->lengths[d];
            }
            if (q->e->kind == DCP_KIND_BYTES)
                ck_assert_int_eq(dcp_entry_nbytes(ck, q->e, &nb, &err), 0);
            ck_assert_uint_eq(q->nbytes, nb);
        }
    }
    ck_assert_uint_eq(r->first[nranks], r->n);
}

/* Decoding one rank's block must fail with EPROTO and a message. */
static void expect_eproto(dcp_checkpoint *ck, const unsigned char *blk, size_t len, const char *what)
{
    dcp_greqs r;
    dcp_error err = {0};
    size_t counts[1] = {len}, displs[1] = {0};
    int rc = dcp_greqs_decode(ck, len ? blk : NULL, counts, displs, 1, &r, &err);
    ck_assert_msg(rc == -1 && err.code == EPROTO && err.msg[0], "%s: rc %d, code %d, \"%s\"", what, rc, err.code,
                  err.msg);
    ck_assert_ptr_null(r.v);
    ck_assert_uint_eq(r.n, 0);
}

START_TEST(wire_format)
{
    /* the exact bytes: little-endian fixed widths */
    int64_t off[2] = {1, -2}, len[2] = {3, 0x0102030405060708};
    dcp_gregion g[2] = {{"ab", DCP_FLOAT32, 2, off, len}, {"c", DCP_DTYPE_INVALID, 0, NULL, NULL}};
    unsigned char *buf;
    size_t n;
    dcp_error err;
    ck_assert_int_eq(dcp_greqs_encode(g, 2, &buf, &n, &err), 0);
    unsigned char want[4 + 4 + 2 + 4 + 4 + 32 + 4 + 1 + 4 + 4], *p = want;
#define LE(v, w)                                          \
    do {                                                  \
        uint64_t v_ = (uint64_t)(v);                      \
        for (int i_ = 0; i_ < (w); i_++)                  \
            *p++ = (unsigned char)(v_ >> (8 * i_));       \
    } while (0)
    LE(2, 4);
    LE(2, 4);
    *p++ = 'a';
    *p++ = 'b';
    LE((int32_t)DCP_FLOAT32, 4);
    LE(2, 4);
    LE(1, 8);
    LE(3, 8);
    LE(-2, 8);
    LE(0x0102030405060708, 8);
    LE(1, 4);
    *p++ = 'c';
    LE((int32_t)DCP_DTYPE_INVALID, 4);
    LE(0, 4);
#undef LE
    ck_assert_uint_eq(n, sizeof want);
    ck_assert_uint_eq((size_t)(p - want), sizeof want);
    ck_assert_msg(!memcmp(buf, want, n), "encoded bytes differ from the documented wire format");
    free(buf);

    /* no regions: a count of 0 */
    ck_assert_int_eq(dcp_greqs_encode(NULL, 0, &buf, &n, &err), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(buf[0] | buf[1] | buf[2] | buf[3], 0);
    free(buf);

    /* refused: no key, bad ndim, missing box */
    dcp_gregion bad[3] = {{NULL, DCP_FLOAT32, 0, NULL, NULL},
                          {"k", DCP_FLOAT32, DCP_GREQ_MAX_NDIM + 1, off, len},
                          {"k", DCP_FLOAT32, 1, NULL, len}};
    for (int i = 0; i < 3; i++) {
        err.code = 0;
        buf = (unsigned char *)1;
        ck_assert_int_eq(dcp_greqs_encode(&bad[i], 1, &buf, &n, &err), -1);
        ck_assert_int_eq(err.code, EINVAL);
        ck_assert_ptr_null(buf);
    }
}
END_TEST

START_TEST(decode_round_trip_and_hostile_blocks)
{
    dcp_checkpoint *ck = open_fixture("05_mixed_2ranks");
    struct rank_regions rr[3];
    for (int rk = 0; rk < 3; rk++)
        regions_any(ck, 3, rk, &rr[rk]);
    dcp_greqs r;
    make_reqs(ck, rr, 3, &r);
    dcp_greqs_free(&r);
    ck_assert_ptr_null(r.v);

    /* one rank's block, cut anywhere, with a byte too many, or mutated */
    unsigned char *blk;
    size_t len;
    dcp_error err;
    ck_assert_int_eq(dcp_greqs_encode(rr[0].v, rr[0].n, &blk, &len, &err), 0);
    ck_assert_uint_gt(len, 100);
    for (size_t cut = 0; cut < len; cut++) {
        unsigned char *t = malloc(cut ? cut : 1);   /* exactly cut bytes: the sanitizer sees overreads */
        memcpy(t, blk, cut);
        expect_eproto(ck, t, cut, "truncated block");
        free(t);
    }
    unsigned char *t = malloc(len + 1);
    memcpy(t, blk, len);
    t[len] = 0;
    expect_eproto(ck, t, len + 1, "trailing byte");
    /* malformed fields of the first request: key length, ndim, count */
    static const struct {
        size_t at;
        uint32_t v;
        const char *what;
    } field[] = {{4, 0xffffffffu, "huge key length"}, {0, 0xffffffffu, "huge count"}, {0, 1000, "count too large"}};
    for (size_t i = 0; i < sizeof field / sizeof field[0]; i++) {
        memcpy(t, blk, len);
        for (int b = 0; b < 4; b++)
            t[field[i].at + (size_t)b] = (unsigned char)(field[i].v >> (8 * b));
        expect_eproto(ck, t, len, field[i].what);
    }
    uint32_t kl = (uint32_t)blk[4] | (uint32_t)blk[5] << 8 | (uint32_t)blk[6] << 16 | (uint32_t)blk[7] << 24;
    size_t nd_at = 8 + kl + 4;
    static const uint32_t bad_nd[] = {0xffffffffu, 0x80000000u, DCP_GREQ_MAX_NDIM + 1, 0x7fffffffu, 1000};
    for (size_t i = 0; i < sizeof bad_nd / sizeof bad_nd[0]; i++) {
        memcpy(t, blk, len);
        for (int b = 0; b < 4; b++)
            t[nd_at + (size_t)b] = (unsigned char)(bad_nd[i] >> (8 * b));
        expect_eproto(ck, t, len, "bad ndim");
    }
    /* every byte replaced: decodes, or fails with a message; never crashes */
    uint64_t seed = 88172645463325252ull;
    for (size_t at = 0; at < len; at++)
        for (int k = 0; k < 4; k++) {
            memcpy(t, blk, len);
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            t[at] = (unsigned char)(k == 0 ? 0xff : k == 1 ? 0x80 : seed);
            size_t counts[1] = {len}, displs[1] = {0};
            err.msg[0] = 0;
            if (dcp_greqs_decode(ck, t, counts, displs, 1, &r, &err) == 0)
                dcp_greqs_free(&r);
            else
                ck_assert_msg(err.msg[0] && err.code, "byte %zu: a failure without a message", at);
        }
    free(t);
    free(blk);
    /* random blocks */
    for (int i = 0; i < 3000; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        size_t n = (size_t)(seed % 200);
        unsigned char *g = malloc(n ? n : 1);
        for (size_t k = 0; k < n; k++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            g[k] = (unsigned char)(seed >> 24);
        }
        expect_eproto(ck, g, n, "random block");
        free(g);
    }
    /* a later rank's bad block names it */
    {
        struct exchange x;
        exchange(rr, 3, &x);
        x.counts[2] -= 1;
        ck_assert_int_eq(dcp_greqs_decode(ck, x.all, x.counts, x.displs, 3, &r, &err), -1);
        ck_assert_int_eq(err.code, EPROTO);
        ck_assert_msg(strstr(err.msg, "from rank 2"), "%s", err.msg);
        free(x.all);
    }
    dcp_close(ck);
}
END_TEST

/* A peer's request checked here: today's messages. */
START_TEST(decode_checks_requests)
{
    dcp_checkpoint *ck = open_fixture("02_rowwise_4ranks");
    static const struct {
        const char *key;
        dcp_dtype dt;
        int ndim;
        int64_t off[2], len[2];
        int code;
        const char *msg;
    } c[] = {
        {"no.such.key", DCP_FLOAT32, 2, {0, 0}, {1, 1}, ENOENT, ": no.such.key: no such key in the checkpoint"},
        {"model.tiny", DCP_FLOAT32, 2, {4, 0}, {2, 3}, EINVAL,
         ": model.tiny: region [4:2,0:3] (start:count) lies outside the tensor of shape [5,3]"},
        {"model.tiny", DCP_FLOAT32, 1, {0, 0}, {1, 0}, EINVAL,
         ": model.tiny: the region has 1 dimensions, the tensor has 2 (shape [5,3])"},
        {"model.tiny", DCP_FLOAT64, 2, {0, 0}, {1, 1}, EINVAL,
         ": model.tiny: dtype mismatch: the region asks for float64, the checkpoint stores float32"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        struct rank_regions rr[2];
        memset(rr, 0, sizeof rr);
        int64_t off[2] = {0, 0}, len[2] = {1, 1};
        add_region(&rr[0], "model.tiny", DCP_FLOAT32, 2, off, len);
        add_region(&rr[1], c[i].key, c[i].dt, c[i].ndim, c[i].off, c[i].len);
        struct exchange x;
        exchange(rr, 2, &x);
        dcp_greqs r;
        dcp_error err = {0};
        ck_assert_int_eq(dcp_greqs_decode(ck, x.all, x.counts, x.displs, 2, &r, &err), -1);
        free(x.all);
        ck_assert_int_eq(err.code, c[i].code);
        char want[4400];
        snprintf(want, sizeof want, "%s%s", dcp_path(ck), c[i].msg);
        ck_assert_str_eq(err.msg, want);
        ck_assert_ptr_null(r.v);
        /* the same check on its own */
        const dcp_entry *e = NULL;
        uint64_t nb;
        err.msg[0] = 0;
        ck_assert_int_eq(dcp_greq_check(ck, c[i].key, c[i].dt, c[i].ndim, c[i].off, c[i].len, &e, &nb, &err), -1);
        ck_assert_str_eq(err.msg, want);
    }
    const dcp_entry *e = NULL;
    uint64_t nb = 0;
    dcp_error err;
    int64_t off[2] = {1, 1}, len[2] = {3, 2};
    ck_assert_int_eq(dcp_greq_check(ck, "model.tiny", DCP_DTYPE_INVALID, 2, off, len, &e, &nb, &err), 0);
    ck_assert_ptr_eq(e, dcp_find(ck, "model.tiny"));
    ck_assert_uint_eq(nb, 3 * 2 * 4);
    dcp_close(ck);
}
END_TEST

/* ------------------------------------------------------------ plans */

#define SAME(a, b, n, what) ck_assert_msg(!(n) || !memcmp((a), (b), (n) * sizeof *(a)), "%s differ between ranks", what)

static void same_plan(const dcp_gplan *a, const dcp_gplan *b)
{
    ck_assert_uint_eq(a->nunits, b->nunits);
    ck_assert_uint_eq(a->nfrags, b->nfrags);
    ck_assert_uint_eq(a->ndlvs, b->ndlvs);
    ck_assert_uint_eq(a->nspans, b->nspans);
    ck_assert_uint_eq(a->ngroups, b->ngroups);
    ck_assert_uint_eq(a->ngroup_ranks, b->ngroup_ranks);
    ck_assert_uint_eq(a->ngops, b->ngops);
    ck_assert_uint_eq(a->unique_bytes, b->unique_bytes);
    ck_assert_int_eq(a->has_shm, b->has_shm);
    /* field by field: the structs have padding */
    for (size_t i = 0; i < a->nunits; i++) {
        const dcp_gunit *x = &a->units[i], *y = &b->units[i];
        ck_assert_msg(x->space == y->space && x->off == y->off && x->len == y->len && x->reader == y->reader &&
                          x->seq == y->seq && x->frag0 == y->frag0 && x->nfrag == y->nfrag &&
                          x->dlv0 == y->dlv0 && x->ndlv == y->ndlv,
                      "unit %zu differs between ranks", i);
    }
    for (size_t i = 0; i < a->nfrags; i++) {
        const dcp_gfrag *x = &a->frags[i], *y = &b->frags[i];
        ck_assert_msg(x->gop == y->gop && x->rank == y->rank && x->src == y->src && x->len == y->len &&
                          x->img == y->img,
                      "fragment %zu differs between ranks", i);
    }
    for (size_t i = 0; i < a->ndlvs; i++) {
        const dcp_gdlv *x = &a->dlvs[i], *y = &b->dlvs[i];
        ck_assert_msg(x->kind == y->kind && x->peer == y->peer && x->group == y->group && x->bytes == y->bytes &&
                          x->cov0 == y->cov0 && x->ncov == y->ncov,
                      "delivery %zu differs between ranks", i);
    }
    SAME(a->spans, b->spans, a->nspans, "spans");
    SAME(a->group_ranks, b->group_ranks, a->ngroup_ranks, "group ranks");
    for (size_t i = 0; i < a->ngroups; i++) {
        ck_assert_uint_eq(a->groups[i].rank0, b->groups[i].rank0);
        ck_assert_uint_eq(a->groups[i].n, b->groups[i].n);
    }
    for (size_t i = 0; i < a->ngops; i++) {
        ck_assert_int_eq(a->gops[i].rank, b->gops[i].rank);
        ck_assert_uint_eq(a->gops[i].req, b->gops[i].req);
        ck_assert_uint_eq(a->gops[i].op.src_offset, b->gops[i].op.src_offset);
        ck_assert_uint_eq(a->gops[i].op.length, b->gops[i].op.length);
    }
}

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Units within the staging size; every op's source bytes covered by its
 * rank's fragments exactly once; those bytes sum to each request's size. */
static void check_plan(const dcp_gplan *g, const dcp_greqs *r, uint64_t unit_max)
{
    for (size_t i = 0; i < g->nunits; i++) {
        ck_assert_uint_gt(g->units[i].len, 0);
        ck_assert_uint_le(g->units[i].len, unit_max);
        if (i)
            ck_assert_uint_lt(g->units[i - 1].seq, g->units[i].seq);
        for (size_t k = 0; k < g->units[i].nfrag; k++) {
            const dcp_gfrag *f = &g->frags[g->units[i].frag0 + k];
            ck_assert_int_eq(f->rank, g->gops[f->gop].rank);
            ck_assert_uint_ge(f->src, g->units[i].off);
            ck_assert_uint_le(f->src + f->len, g->units[i].off + g->units[i].len);
        }
    }
    uint64_t *bytes = calloc(r->n ? r->n : 1, sizeof *bytes);
    uint64_t (*iv)[2] = malloc((g->nfrags + 1) * sizeof *iv);
    for (size_t o = 0; o < g->ngops; o++) {
        const dcp_op *op = &g->gops[o].op;
        size_t n = 0;
        for (size_t i = 0; i < g->nfrags; i++)
            if (g->frags[i].gop == o) {
                iv[n][0] = g->frags[i].src;
                iv[n][1] = g->frags[i].len;
                n++;
            }
        qsort(iv, n, sizeof *iv, cmp_u64);
        uint64_t pos = op->src_offset;
        for (size_t i = 0; i < n; i++) {
            ck_assert_msg(iv[i][0] == pos, "op %zu: fragment at %llu, expected %llu (gap or overlap)", o,
                          (unsigned long long)iv[i][0], (unsigned long long)pos);
            pos += iv[i][1];
        }
        ck_assert_msg(pos == op->src_offset + op->length, "op %zu: fragments end at %llu, op at %llu", o,
                      (unsigned long long)pos, (unsigned long long)(op->src_offset + op->length));
        bytes[g->gops[o].req] += op->length;
    }
    for (size_t q = 0; q < r->n; q++)
        if (!g->zero[q])
            ck_assert_uint_eq(bytes[q], r->v[q].nbytes);
    free(bytes);
    free(iv);
}

/* ------------------------------------------------------------ execution */

static int seen_kind[4];
static int seen_read;   /* shm deliveries taken with dcp_gfrag_read */

/* The delivery of unit u reaching rank, or NULL. */
static const dcp_gdlv *delivery_of(const dcp_gplan *g, const dcp_gunit *u, int rank)
{
    const dcp_gdlv *found = NULL;
    for (size_t i = 0; i < u->ndlv; i++) {
        const dcp_gdlv *d = &g->dlvs[u->dlv0 + i];
        int mine = 0;
        if (d->kind == DCP_GDLV_BCAST) {
            const dcp_ggroup *gr = &g->groups[d->group];
            for (size_t k = 0; k < gr->n; k++)
                mine |= g->group_ranks[gr->rank0 + k] == rank;
        } else {
            mine = d->peer == rank;
        }
        if (mine) {
            ck_assert_msg(!found, "two deliveries of one unit reach rank %d", rank);
            found = d;
        }
    }
    return found;
}

/* dcp_gunit_read_direct_at gives unit u's bytes (want) in memory that
 * agrees with the file modulo the block size (read with O_DIRECT when the
 * file was evicted first) and in memory that does not (read as usual),
 * writing no byte outside them. */
static void direct_at_matches(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u,
                              const unsigned char *want, int evict)
{
    dcp_error err;
    dcp_op op = dcp_gunit_op(g, u);
    int fd;
    if (evict && !(op.flags & DCP_OP_DECODED) && dcp_file_fd(ck, op.file, &fd, &err) == 0) {
        (void)fdatasync(fd);
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    const size_t A = DCP_DIRECT_ALIGN, room = u->len + 3 * A;
    unsigned char *mem = NULL;
    ck_assert_int_eq(posix_memalign((void **)&mem, A, room), 0);
    for (unsigned skew = 0; skew < 2; skew++) {
        memset(mem, 0x5a, room);
        unsigned char *dest = mem + A + (op.src_offset + skew) % A;
        ck_assert_msg(dcp_gunit_read_direct_at(ck, g, u, dest, &err) == 0, "%s", err.msg);
        ck_assert_msg(!memcmp(dest, want, u->len), "direct_at (skew %u): bytes differ", skew);
        int outside = 0;
        for (const unsigned char *p = mem; p < dest; p++)
            outside |= *p != 0x5a;
        for (const unsigned char *p = dest + u->len; p < mem + room; p++)
            outside |= *p != 0x5a;
        ck_assert_msg(!outside, "direct_at (skew %u): a byte outside dest written", skew);
    }
    free(mem);
}

/* Run plan g as all ranks at once, in the global order: the reader reads
 * each unit, every other rank gets the buffer its delivery gives it, and all
 * place their fragments. Then every request must hold what
 * dcp_plan_execute gives. */
static void execute_and_compare(dcp_checkpoint *ck, dcp_greqs *r, const dcp_gplan *g, const int *node,
                                unsigned char **expected)
{
    dcp_error err;
    for (size_t q = 0; q < r->n; q++) {
        r->v[q].dest = malloc(r->v[q].nbytes ? r->v[q].nbytes : 1);
        memset(r->v[q].dest, 0xa5, r->v[q].nbytes);
        if (g->zero[q])
            memset(r->v[q].dest, 0, r->v[q].nbytes);
    }
    for (size_t i = 0; i < g->nunits; i++) {
        const dcp_gunit *u = &g->units[i], *next = NULL;
        for (size_t k = i + 1; k < g->nunits && !next; k++)
            if (g->units[k].reader == u->reader)
                next = &g->units[k];
        unsigned char *buf = malloc(u->len);
        ck_assert_msg(dcp_gunit_read(ck, g, u, next, buf, &err) == 0, "%s", err.msg);
        if (i % 4 == 0)   /* a sample: reading twice, and evicting, cost the suite */
            direct_at_matches(ck, g, u, buf, i % 8 == 0);
        size_t nrank = 0;
        for (int rk = 0; rk < g->nranks; rk++) {
            size_t n;
            const dcp_gfrag *f = dcp_gunit_frags(g, u, rk, &n);
            for (size_t k = 0; k < n; k++)
                ck_assert_int_eq(f[k].rank, rk);
            if (!n)
                continue;
            nrank++;
            if (rk == u->reader) {
                if (i & 1) {    /* through a small scratch, then from the page cache */
                    unsigned char scratch[3000];
                    ck_assert_msg(dcp_gunit_cache(ck, g, u, next, scratch, sizeof scratch, &err) == 0, "%s",
                                  err.msg);
                    ck_assert_msg(dcp_gfrag_read(ck, g, r, f, n, &err) == 0, "%s", err.msg);
                } else {
                    dcp_gfrag_place(g, r, f, n, buf);
                }
                continue;
            }
            const dcp_gdlv *d = delivery_of(g, u, rk);
            ck_assert_msg(d != NULL, "unit %zu: rank %d needs bytes but has no delivery", i, rk);
            seen_kind[d->kind]++;
            if (d->kind == DCP_GDLV_SHM) {
                ck_assert_ptr_nonnull(node);
                ck_assert_int_eq(node[rk], node[u->reader]);
                if (i & 1)      /* from the page cache, as dcpfs.torch.load does by default */
                    ck_assert_msg(dcp_gfrag_read(ck, g, r, f, n, &err) == 0, "%s", err.msg);
                else            /* out of the reader's buffer */
                    dcp_gfrag_place(g, r, f, n, buf);
                seen_read += i & 1;
                continue;
            }
            unsigned char *img = malloc(d->bytes + 1);
            img[d->bytes] = 0x5a;
            dcp_gdlv_pack(g, d, buf, img);
            ck_assert_int_eq(img[d->bytes], 0x5a);
            for (size_t k = 0; k < n; k++)
                ck_assert_uint_le(f[k].img + f[k].len, d->bytes);
            dcp_gfrag_place(g, r, f, n, img);
            free(img);
        }
        free(buf);
    }
    for (size_t q = 0; q < r->n; q++) {
        ck_assert_msg(!memcmp(r->v[q].dest, expected[q], r->v[q].nbytes),
                      "rank %d, request %zu (%s): bytes differ from dcp_plan_execute", r->v[q].rank, q,
                      r->v[q].e->key);
        free(r->v[q].dest);
        r->v[q].dest = NULL;
    }
}

/* What dcp_plan_execute gives for each request. */
static unsigned char **expected_bytes(dcp_checkpoint *ck, const dcp_greqs *r)
{
    unsigned char **exp = calloc(r->n ? r->n : 1, sizeof *exp);
    dcp_plan p;
    dcp_plan_init(&p);
    dcp_error err;
    for (size_t q = 0; q < r->n; q++) {
        const dcp_greq *x = &r->v[q];
        int rc = x->e->kind == DCP_KIND_BYTES ? dcp_plan_bytes(ck, x->e, 0, x->nbytes, &p, &err)
                                              : dcp_plan_region(ck, x->e, x->off, x->len, &p, &err);
        ck_assert_msg(rc == 0, "%s", err.msg);
        ck_assert_uint_eq(p.nbytes, x->nbytes);
        exp[q] = calloc(1, x->nbytes ? x->nbytes : 1);
        ck_assert_msg(dcp_plan_execute(ck, &p, exp[q], &err) == 0, "%s", err.msg);
    }
    dcp_plan_free(&p);
    return exp;
}

static void plans_for(const char *fixture, void (*regions)(dcp_checkpoint *, int, int, struct rank_regions *))
{
    dcp_checkpoint *ck = open_fixture(fixture);
    dcp_error err;
    static const uint64_t sizes[] = {4096, 10000, 65536, (uint64_t)16 << 20};
    for (int nranks = 1; nranks <= 4; nranks++) {
        struct rank_regions rr[4];
        for (int rk = 0; rk < nranks; rk++)
            regions(ck, nranks, rk, &rr[rk]);
        dcp_greqs r;
        make_reqs(ck, rr, nranks, &r);
        unsigned char **exp = expected_bytes(ck, &r);
        int node[4] = {0, 0, 2, 2};   /* two "nodes" of two ranks */
        for (unsigned variant = 0; variant < 16; variant++)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
                dcp_gplan_opts po = {.size = sizeof po, .unit_max = sizes[s], .no_bcast = variant & 1, .node = node,
                                     .shm = (variant >> 1) & 1, .bcast_local = (variant >> 2) & 1};
                if (variant & 8) {
                    static const int one_node[4] = {0, 0, 0, 0};
                    po.node = one_node;
                }
                dcp_gplan g0;
                ck_assert_msg(dcp_gplan_build(ck, &r, nranks, 0, &po, &g0, &err) == 0, "%s", err.msg);
                check_plan(&g0, &r, sizes[s]);
                for (int me = 1; me < nranks; me++) {
                    dcp_gplan g;
                    ck_assert_msg(dcp_gplan_build(ck, &r, nranks, me, &po, &g, &err) == 0, "%s", err.msg);
                    ck_assert_int_eq(g.me, me);
                    same_plan(&g0, &g);
                    dcp_gplan_free(&g);
                }
                execute_and_compare(ck, &r, &g0, po.node, exp);
                dcp_gplan_free(&g0);
            }
        for (size_t q = 0; q < r.n; q++)
            free(exp[q]);
        free(exp);
        dcp_greqs_free(&r);
    }
    dcp_close(ck);
}

START_TEST(plans_agree_cover_and_execute)
{
    memset(seen_kind, 0, sizeof seen_kind);
    seen_read = 0;
    plans_for("02_rowwise_4ranks", regions_02);
    plans_for("05_mixed_2ranks", regions_any);
    plans_for("03_colwise_4ranks", regions_any);
    /* every kind of delivery was executed */
    ck_assert_int_gt(seen_kind[DCP_GDLV_P2P], 0);
    ck_assert_int_gt(seen_kind[DCP_GDLV_BCAST], 0);
    ck_assert_int_gt(seen_kind[DCP_GDLV_SHM], 0);
    ck_assert_int_gt(seen_read, 0);
}
END_TEST

START_TEST(bad_arguments)
{
    dcp_checkpoint *ck = open_fixture("02_rowwise_4ranks");
    struct rank_regions rr[1];
    regions_02(ck, 1, 0, rr);
    dcp_greqs r;
    make_reqs(ck, rr, 1, &r);
    dcp_gplan g;
    dcp_error err;
    dcp_gplan_opts po = DCP_GPLAN_OPTS_INIT;
    ck_assert_int_eq(dcp_gplan_build(ck, &r, 1, 0, &po, &g, &err), -1);
    ck_assert_str_eq(err.msg, "dcp_load: zero staging size");
    po.unit_max = 4096;
    ck_assert_int_eq(dcp_gplan_build(ck, &r, 1, 1, &po, &g, &err), -1);   /* me out of range */
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_int_eq(dcp_gplan_build(ck, &r, 0, 0, &po, &g, &err), -1);
    r.v[0].rank = 3;   /* a request of a rank that is not there */
    ck_assert_int_eq(dcp_gplan_build(ck, &r, 1, 0, &po, &g, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    ck_assert_ptr_null(g.units);
    dcp_gplan_free(&g);   /* empty: fine */
    dcp_greqs_free(&r);
    dcp_greqs_free(&r);   /* twice: fine */
    ck_assert_int_eq(dcp_greqs_decode(ck, NULL, NULL, NULL, 0, &r, &err), -1);
    ck_assert_int_eq(err.code, EINVAL);
    dcp_close(ck);
}
END_TEST

int main(void)
{
    const char *top = getenv("top_srcdir");
    snprintf(fixtures, sizeof fixtures, "%s/tests/fixtures", top ? top : "..");
    Suite *s = suite_create("gplan");
    TCase *t = tcase_create("gplan");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, wire_format);
    tcase_add_test(t, decode_round_trip_and_hostile_blocks);
    tcase_add_test(t, decode_checks_requests);
    tcase_add_test(t, plans_agree_cover_and_execute);
    tcase_add_test(t, bad_arguments);
    suite_add_tcase(s, t);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
