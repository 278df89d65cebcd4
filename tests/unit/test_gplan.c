/* ldi_gplan_build, the loader's global plan, without MPI: every rank must
 * compute the same plan (the same units, readers, order, fragments,
 * deliveries and groups for every `me`), no unit may exceed the staging
 * size, and for every op of every request the fragments must cover its
 * source bytes exactly once. On fixture 02 with overlapping, irregular
 * requests of 1..4 ranks, every option combination and several staging
 * sizes. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/load/load.h"

static char fixtures[4096];

/* Requests of nranks ranks for 02: overlapping row bands, a column band,
 * a key twice, the last rank nothing. */
static void make_reqs(dcp_checkpoint *ck, int nranks, ldi_reqs *r)
{
    static const char *keys[] = {"model.embed_tokens.weight", "model.lm_head.weight", "model.embed_tokens.weight",
                                 "model.tiny"};
    size_t per = 4, n = nranks > 1 ? per * (size_t)(nranks - 1) : per;
    r->v = calloc(n, sizeof *r->v);
    r->dims = calloc(n * 4, sizeof *r->dims);
    r->first = calloc((size_t)nranks + 1, sizeof *r->first);
    r->n = n;
    size_t q = 0;
    for (int rk = 0; rk < nranks; rk++) {
        r->first[rk] = q;
        if (nranks > 1 && rk == nranks - 1)
            continue;
        int64_t boxes[4][4] = {{rk * 150, 0, 300, 257},
                               {0, rk * 40, 999, 60},
                               {rk * 150 + 10, 5, 7, 250},
                               {1, 1, 3, 2}};
        for (size_t i = 0; i < per; i++, q++) {
            ldi_req *x = &r->v[q];
            x->rank = rk;
            x->e = dcp_find(ck, keys[i]);
            ck_assert_ptr_nonnull(x->e);
            x->dtype = x->e->dtype;
            x->ndim = 2;
            x->off = r->dims + 4 * q;
            x->len = x->off + 2;
            x->off[0] = boxes[i][0];
            x->off[1] = boxes[i][1];
            x->len[0] = boxes[i][2];
            x->len[1] = boxes[i][3];
            x->nbytes = dcp_dtype_size(x->dtype) * (uint64_t)x->len[0] * (uint64_t)x->len[1];
            x->mem = DCP_LOAD_HOST;
        }
    }
    r->first[nranks] = q;
    ck_assert_uint_eq(q, n);
}

#define SAME(a, b, n, what) ck_assert_msg(!(n) || !memcmp((a), (b), (n) * sizeof *(a)), "%s differ between ranks", what)

static void same_plan(const ldi_gplan *a, const ldi_gplan *b)
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
        const ldi_unit *x = &a->units[i], *y = &b->units[i];
        ck_assert_msg(x->space == y->space && x->off == y->off && x->len == y->len && x->reader == y->reader &&
                          x->seq == y->seq && x->frag0 == y->frag0 && x->nfrag == y->nfrag &&
                          x->dlv0 == y->dlv0 && x->ndlv == y->ndlv,
                      "unit %zu differs between ranks", i);
    }
    for (size_t i = 0; i < a->nfrags; i++) {
        const ldi_frag *x = &a->frags[i], *y = &b->frags[i];
        ck_assert_msg(x->gop == y->gop && x->rank == y->rank && x->src == y->src && x->len == y->len &&
                          x->img == y->img,
                      "fragment %zu differs between ranks", i);
    }
    for (size_t i = 0; i < a->ndlvs; i++) {
        const ldi_dlv *x = &a->dlvs[i], *y = &b->dlvs[i];
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
static void check_plan(const ldi_gplan *g, const ldi_reqs *r, uint64_t unit_max)
{
    for (size_t i = 0; i < g->nunits; i++) {
        ck_assert_uint_gt(g->units[i].len, 0);
        ck_assert_uint_le(g->units[i].len, unit_max);
        if (i)
            ck_assert_uint_lt(g->units[i - 1].seq, g->units[i].seq);
        for (size_t k = 0; k < g->units[i].nfrag; k++) {
            const ldi_frag *f = &g->frags[g->units[i].frag0 + k];
            ck_assert_int_eq(f->rank, g->gops[f->gop].rank);
            ck_assert_uint_ge(f->src, g->units[i].off);
            ck_assert_uint_le(f->src + f->len, g->units[i].off + g->units[i].len);
        }
    }
    uint64_t *bytes = calloc(r->n, sizeof *bytes);
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

START_TEST(plans_agree_and_cover)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/02_rowwise_4ranks/ckpt", fixtures);
    dcp_checkpoint *ck;
    dcp_error err;
    ck_assert_msg(dcp_open(path, 0, &ck, &err) == 0, "%s", err.msg);
    static const uint64_t sizes[] = {4096, 10000, 65536, (uint64_t)16 << 20};
    for (int nranks = 1; nranks <= 4; nranks++) {
        ldi_reqs r = {0};
        make_reqs(ck, nranks, &r);
        int node[4] = {0, 0, 2, 2};   /* two "nodes" of two ranks */
        for (unsigned variant = 0; variant < 16; variant++)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
                ldi_plan_opts po = {.unit_max = sizes[s], .no_bcast = variant & 1, .node = node,
                                    .shm = (variant >> 1) & 1, .bcast_local = (variant >> 2) & 1};
                if (variant & 8) {
                    static const int one_node[4] = {0, 0, 0, 0};
                    po.node = one_node;
                }
                ldi_gplan g0;
                ck_assert_msg(ldi_gplan_build(ck, &r, nranks, 0, &po, &g0, &err) == 0, "%s", err.msg);
                check_plan(&g0, &r, sizes[s]);
                for (int me = 1; me < nranks; me++) {
                    ldi_gplan g;
                    ck_assert_msg(ldi_gplan_build(ck, &r, nranks, me, &po, &g, &err) == 0, "%s", err.msg);
                    same_plan(&g0, &g);
                    ldi_gplan_free(&g);
                }
                ldi_gplan_free(&g0);
            }
        ldi_reqs_free(&r);
    }
    dcp_close(ck);
}
END_TEST

int main(void)
{
    const char *top = getenv("top_srcdir");
    snprintf(fixtures, sizeof fixtures, "%s/tests/fixtures", top ? top : "..");
    Suite *s = suite_create("gplan");
    TCase *t = tcase_create("gplan");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, plans_agree_and_cover);
    suite_add_tcase(s, t);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
