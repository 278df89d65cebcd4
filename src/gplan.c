/* The global load plan (dcp_gplan.h). Every rank runs this on the same
 * exchanged requests and gets the same result, so no plan is ever sent. A
 * transport executes it (libdcpload over MPI; the Python package over
 * torch.distributed); nothing here knows either.
 *
 * 0. Requests: each rank's regions are encoded into a block, the blocks of
 *    all ranks exchanged by the transport, then decoded and checked here,
 *    every length of the untrusted bytes checked.
 * 1. Every request is planned with the core planner: ops, each a contiguous
 *    byte range of a source stream (a data file or a decoded blob).
 * 2. The ops' source ranges are merged per stream into segments (their union),
 *    and segments are cut into units of at most unit_max bytes, at element
 *    boundaries of the ops crossing the cut. Each unit is read once.
 * 3. Units are assigned to reader ranks balanced by bytes: a unit needed by a
 *    single rank goes to that rank while it stays under its share; the rest
 *    are handed out in stream and offset order, filling one rank after the
 *    other, so neighbouring runs of a shard file stay with one reader and are
 *    read in offset order.
 * 4. Per unit, the bytes each other rank needs (its spans) are delivered by
 *    a point-to-point message, or, to ranks on other nodes needing the same
 *    spans, by one broadcast among them (MPICH's broadcast within a node
 *    measured slower than messages). Optionally a rank on the reader's node
 *    copies its bytes out of the reader's staging buffer in node shared
 *    memory instead (one copy; two small tokens).
 * 5. The global order interleaves the readers' units round-robin, so every
 *    reader works at once; all ranks post their transfers in that order.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp_gplan.h"
#include "internal.h"
#include "sized_opts.h"

/* ------------------------------------------------------------ growable arrays */

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem)
            return -1;
        c *= 2;
    }
    void *q = realloc(*p, c * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

#define GROW(arr, cap, need) grow((void **)&(arr), &(cap), (need), sizeof *(arr))

/* ------------------------------------------------------------ source streams */

struct spacemap {
    uint64_t *keys;    /* hash slots: index+1, 0 empty */
    size_t cap;
};

static uint64_t space_hash(uint32_t file, int decoded, uint64_t off)
{
    uint64_t h = file * 0x9E3779B97F4A7C15ull ^ (uint64_t)decoded * 0xC2B2AE3D27D4EB4Full ^ off;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}

static int same_space(const dcp_gspace *s, uint32_t file, int decoded, const dcp_blob *b)
{
    return s->file == file && s->decoded == decoded &&
           (!decoded || (s->blob.offset == b->offset && s->blob.length == b->length &&
                         s->blob.transforms == b->transforms));
}

/* The stream index of an op, added when new. */
static int space_of(dcp_gplan *g, size_t *scap, struct spacemap *m, const dcp_op *op,
                    const dcp_entry *e, uint32_t *out)
{
    int decoded = (op->flags & DCP_OP_DECODED) != 0;
    uint32_t file = decoded ? op->blob.file : op->file;
    uint64_t off = decoded ? op->blob.offset : 0;
    if (g->nspaces * 2 + 2 > m->cap) {   /* rehash at half load */
        size_t cap = m->cap ? m->cap * 2 : 64;
        uint64_t *k = calloc(cap, sizeof *k);
        if (!k)
            return -1;
        for (size_t i = 0; i < g->nspaces; i++) {
            const dcp_gspace *s = &g->spaces[i];
            size_t h = space_hash(s->file, s->decoded, s->decoded ? s->blob.offset : 0) & (cap - 1);
            while (k[h])
                h = (h + 1) & (cap - 1);
            k[h] = i + 1;
        }
        free(m->keys);
        m->keys = k;
        m->cap = cap;
    }
    size_t h = space_hash(file, decoded, off) & (m->cap - 1);
    while (m->keys[h]) {
        if (same_space(&g->spaces[m->keys[h] - 1], file, decoded, &op->blob)) {
            *out = (uint32_t)(m->keys[h] - 1);
            return 0;
        }
        h = (h + 1) & (m->cap - 1);
    }
    if (g->nspaces >= UINT32_MAX || GROW(g->spaces, *scap, g->nspaces + 1) < 0)
        return -1;
    dcp_gspace *s = &g->spaces[g->nspaces];
    memset(s, 0, sizeof *s);
    s->file = file;
    s->decoded = decoded;
    if (decoded)
        s->blob = op->blob;
    s->e = e;
    m->keys[h] = g->nspaces + 1;
    *out = (uint32_t)g->nspaces++;
    return 0;
}

/* ------------------------------------------------------------ step 1: ops */

static int plan_all(dcp_checkpoint *ck, const dcp_greqs *r, dcp_gplan *g, dcp_error *err)
{
    dcp_plan p;
    dcp_plan_init(&p);
    size_t gcap = 0, scap = 0;
    struct spacemap m = {0};
    int rc = -1;
    g->zero = calloc(r->n ? r->n : 1, 1);
    if (!g->zero) {
        dcpi_err(err, ENOMEM, "dcp_load: out of memory");
        goto out;
    }
    for (size_t qi = 0; qi < r->n; qi++) {
        const dcp_greq *q = &r->v[qi];
        int prc = q->e->kind == DCP_KIND_BYTES ? dcp_plan_bytes(ck, q->e, 0, q->nbytes, &p, err)
                                               : dcp_plan_region(ck, q->e, q->off, q->len, &p, err);
        if (prc < 0)
            goto out;
        if (p.nbytes != q->nbytes) {
            dcpi_err(err, EIO, "%s: %s: the planner sized the region %" PRIu64 " bytes, expected %" PRIu64,
                    dcpi_ck_name(ck), q->e->key, p.nbytes, q->nbytes);
            goto out;
        }
        g->zero[qi] = (unsigned char)p.zero_fill;
        for (size_t i = 0; i < p.nops; i++) {
            const dcp_op *op = &p.ops[i];
            if (!op->length)
                continue;
            if (!op->elem_size || op->length % op->elem_size) {
                dcpi_err(err, EIO, "%s: %s: malformed plan op", dcpi_ck_name(ck), q->e->key);
                goto out;
            }
            if (GROW(g->gops, gcap, g->ngops + 1) < 0) {
                dcpi_err(err, ENOMEM, "dcp_load: out of memory for the global plan");
                goto out;
            }
            dcp_gop *o = &g->gops[g->ngops];
            o->op = *op;
            o->req = (uint32_t)qi;
            o->rank = q->rank;
            o->dtype = p.dtype;
            if (space_of(g, &scap, &m, op, q->e, &o->space) < 0) {
                dcpi_err(err, ENOMEM, "dcp_load: out of memory for the global plan");
                goto out;
            }
            g->ngops++;
        }
    }
    rc = 0;
out:
    dcp_plan_free(&p);
    free(m.keys);
    return rc;
}

/* ------------------------------------------------------------ step 2: units */

static int cmp_gop(const void *a, const void *b, void *arg)
{
    const dcp_gop *gops = arg;
    const dcp_gop *x = &gops[*(const uint32_t *)a], *y = &gops[*(const uint32_t *)b];
    if (x->space != y->space)
        return x->space < y->space ? -1 : 1;
    if (x->op.src_offset != y->op.src_offset)
        return x->op.src_offset < y->op.src_offset ? -1 : 1;
    return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

/* Spaces are numbered in first-use order; units must follow file and offset
 * order, so renumber them by (decoded, file, blob offset). */
static int cmp_space(const void *a, const void *b, void *arg)
{
    const dcp_gspace *sp = arg;
    const dcp_gspace *x = &sp[*(const uint32_t *)a], *y = &sp[*(const uint32_t *)b];
    if (x->decoded != y->decoded)
        return x->decoded - y->decoded;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    if (x->blob.offset != y->blob.offset)
        return x->blob.offset < y->blob.offset ? -1 : 1;
    return x->blob.length < y->blob.length ? -1 : x->blob.length > y->blob.length;
}

static int renumber_spaces(dcp_gplan *g, dcp_error *err)
{
    size_t n = g->nspaces;
    uint32_t *idx = malloc((n ? n : 1) * sizeof *idx), *perm = malloc((n ? n : 1) * sizeof *perm);
    dcp_gspace *sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (!idx || !perm || !sorted) {
        free(idx);
        free(perm);
        free(sorted);
        return dcpi_err(err, ENOMEM, "dcp_load: out of memory for the global plan");
    }
    for (size_t i = 0; i < n; i++)
        idx[i] = (uint32_t)i;
    if (n > 1)
        qsort_r(idx, n, sizeof *idx, cmp_space, g->spaces);
    for (size_t k = 0; k < n; k++) {
        sorted[k] = g->spaces[idx[k]];
        perm[idx[k]] = (uint32_t)k;
    }
    for (size_t i = 0; i < g->ngops; i++)
        g->gops[i].space = perm[g->gops[i].space];
    free(g->spaces);
    g->spaces = sorted;
    free(idx);
    free(perm);
    return 0;
}

struct builder {
    dcp_checkpoint *ck;
    dcp_gplan *g;
    const dcp_gplan_opts *o;
    size_t ucap, fcap, dcap, scap, gcap, grcap;
    uint32_t *active;
    size_t nactive, acap;
};

static uint64_t gop_end(const dcp_gop *o) { return o->op.src_offset + o->op.length; }

/* Move the cut x down until it is on the element grid of every op crossing it. */
static int align_cut(struct builder *b, uint64_t s, uint64_t *x)
{
    for (int pass = 0; pass < 8; pass++) {
        int moved = 0;
        for (size_t i = 0; i < b->nactive; i++) {
            const dcp_gop *o = &b->g->gops[b->active[i]];
            uint64_t st = o->op.src_offset;
            if (st < *x && gop_end(o) > *x && (*x - st) % o->op.elem_size) {
                *x = st + (*x - st) / o->op.elem_size * o->op.elem_size;
                moved = 1;
            }
        }
        if (*x <= s)
            return -1;
        if (!moved)
            return 0;
    }
    return -1;
}

static int cmp_frag(const void *a, const void *b)
{
    const dcp_gfrag *x = a, *y = b;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    if (x->src != y->src)
        return x->src < y->src ? -1 : 1;
    return x->gop < y->gop ? -1 : x->gop > y->gop;
}

static int add_unit(struct builder *b, uint32_t space, uint64_t s, uint64_t x, dcp_error *err)
{
    dcp_gplan *g = b->g;
    if (GROW(g->units, b->ucap, g->nunits + 1) < 0 || GROW(g->frags, b->fcap, g->nfrags + b->nactive) < 0)
        return dcpi_err(err, ENOMEM, "dcp_load: out of memory for the global plan");
    dcp_gunit *u = &g->units[g->nunits++];
    memset(u, 0, sizeof *u);
    u->space = space;
    u->off = s;
    u->len = x - s;
    u->reader = -1;
    u->frag0 = g->nfrags;
    for (size_t i = 0; i < b->nactive; i++) {
        const dcp_gop *o = &g->gops[b->active[i]];
        uint64_t a = o->op.src_offset > s ? o->op.src_offset : s, e = gop_end(o) < x ? gop_end(o) : x;
        if (a >= e)
            continue;
        dcp_gfrag *f = &g->frags[g->nfrags++];
        f->gop = b->active[i];
        f->rank = o->rank;
        f->src = a;
        f->len = e - a;
        f->img = a - s;
    }
    u->nfrag = g->nfrags - u->frag0;
    if (u->nfrag > 1)
        qsort(g->frags + u->frag0, u->nfrag, sizeof *g->frags, cmp_frag);
    return 0;
}

static int build_units(struct builder *b, dcp_error *err)
{
    dcp_gplan *g = b->g;
    uint32_t *ord = malloc((g->ngops ? g->ngops : 1) * sizeof *ord);
    if (!ord)
        return dcpi_err(err, ENOMEM, "dcp_load: out of memory for the global plan");
    for (size_t i = 0; i < g->ngops; i++)
        ord[i] = (uint32_t)i;
    if (g->ngops > 1)
        qsort_r(ord, g->ngops, sizeof *ord, cmp_gop, g->gops);
    int rc = -1;
    for (size_t i = 0; i < g->ngops;) {
        /* one segment: ops of one stream whose ranges overlap or touch */
        uint32_t space = g->gops[ord[i]].space;
        uint64_t start = g->gops[ord[i]].op.src_offset, end = gop_end(&g->gops[ord[i]]);
        size_t j = i + 1;
        while (j < g->ngops && g->gops[ord[j]].space == space && g->gops[ord[j]].op.src_offset <= end) {
            uint64_t e = gop_end(&g->gops[ord[j]]);
            if (e > end)
                end = e;
            j++;
        }
        g->unique_bytes += end - start;
        /* cut it into units, sweeping the ops crossing each unit */
        b->nactive = 0;
        size_t next = i;
        for (uint64_t s = start; s < end;) {
            uint64_t x = end - s > b->o->unit_max ? s + b->o->unit_max : end;
            while (next < j && g->gops[ord[next]].op.src_offset < x) {
                if (GROW(b->active, b->acap, b->nactive + 1) < 0) {
                    dcpi_err(err, ENOMEM, "dcp_load: out of memory for the global plan");
                    goto out;
                }
                b->active[b->nactive++] = ord[next++];
            }
            if (x < end && align_cut(b, s, &x) < 0) {
                dcpi_err(err, EIO, "%s/%s: %s: overlapping reads of different element sizes cannot be split",
                        dcp_path(b->ck), dcp_file_name(b->ck, g->spaces[space].file),
                        g->spaces[space].e->key);
                goto out;
            }
            if (add_unit(b, space, s, x, err) < 0)
                goto out;
            s = x;
            size_t k = 0;   /* drop ops that end before the next unit */
            for (size_t a = 0; a < b->nactive; a++)
                if (gop_end(&g->gops[b->active[a]]) > s)
                    b->active[k++] = b->active[a];
            b->nactive = k;
        }
        i = j;
    }
    rc = 0;
out:
    free(ord);
    return rc;
}

/* ------------------------------------------------------------ step 3: readers */

/* The only rank needing bytes of u, or -1. */
static int sole_rank(const dcp_gplan *g, const dcp_gunit *u)
{
    const dcp_gfrag *f = g->frags + u->frag0;
    return u->nfrag && f[0].rank == f[u->nfrag - 1].rank ? f[0].rank : -1;   /* sorted by rank */
}

static int assign_readers(dcp_gplan *g, dcp_error *err)
{
    int n = g->nranks;
    g->load = calloc((size_t)n, sizeof *g->load);
    if (!g->load)
        return dcpi_err(err, ENOMEM, "dcp_load: out of memory for the global plan");
    uint64_t target = (g->unique_bytes + (uint64_t)n - 1) / (uint64_t)n, slack = target / 8;
    /* units only one rank needs: read by it while it stays near its share */
    for (size_t i = 0; i < g->nunits; i++) {
        dcp_gunit *u = &g->units[i];
        int d = sole_rank(g, u);
        if (d >= 0 && g->load[d] + u->len <= target + slack) {
            u->reader = d;
            g->load[d] += u->len;
        }
    }
    /* the rest in stream and offset order, filling one rank after another */
    int k = 0;
    for (size_t i = 0; i < g->nunits; i++) {
        dcp_gunit *u = &g->units[i];
        if (u->reader >= 0)
            continue;
        while (k < n - 1 && g->load[k] >= target)
            k++;
        u->reader = k;
        g->load[k] += u->len;
    }
    /* a decoded (zstd) blob is decompressed whole by whoever reads part of
     * it: one reader per blob, the one of its first unit */
    for (size_t i = 0, first = 0; i < g->nunits; i++) {
        dcp_gunit *u = &g->units[i];
        if (!g->spaces[u->space].decoded)
            continue;
        if (i == 0 || u->space != g->units[i - 1].space) {
            first = i;
            continue;
        }
        int to = g->units[first].reader;
        g->load[u->reader] -= u->len;
        g->load[to] += u->len;
        u->reader = to;
    }
    return 0;
}

/* ------------------------------------------------------------ step 4: deliveries */

struct cand {
    int rank;
    int local;               /* on the reader's node: a message, not a broadcast */
    size_t span0, nspan;
    uint64_t hash, bytes;
};

static int cmp_cand(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->local != y->local)
        return y->local - x->local;   /* local ones first: never grouped */
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    if (x->nspan != y->nspan)
        return x->nspan < y->nspan ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int same_spans(const dcp_gplan *g, const struct cand *x, const struct cand *y)
{
    return !x->local && !y->local && x->nspan == y->nspan &&
           !memcmp(g->spans + x->span0, g->spans + y->span0, x->nspan * sizeof *g->spans);
}

/* The group of these sorted ranks, created when new; -1 when there are
 * already DCP_GPLAN_MAX_GROUPS groups. */
static int intern_group(struct builder *b, const int *ranks, size_t n)
{
    dcp_gplan *g = b->g;
    for (size_t i = 0; i < g->ngroups; i++)
        if (g->groups[i].n == n && !memcmp(g->group_ranks + g->groups[i].rank0, ranks, n * sizeof *ranks))
            return (int)i;
    if (g->ngroups >= DCP_GPLAN_MAX_GROUPS || GROW(g->groups, b->gcap, g->ngroups + 1) < 0 ||
        GROW(g->group_ranks, b->grcap, g->ngroup_ranks + n) < 0)
        return -1;
    dcp_ggroup *gr = &g->groups[g->ngroups];
    gr->rank0 = g->ngroup_ranks;
    gr->n = n;
    memcpy(g->group_ranks + g->ngroup_ranks, ranks, n * sizeof *ranks);
    g->ngroup_ranks += n;
    return (int)g->ngroups++;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

static int add_dlv(struct builder *b, int kind, int peer, int group, const struct cand *c)
{
    dcp_gplan *g = b->g;
    if (GROW(g->dlvs, b->dcap, g->ndlvs + 1) < 0)
        return -1;
    dcp_gdlv *d = &g->dlvs[g->ndlvs++];
    d->kind = kind;
    d->peer = peer;
    d->group = group;
    d->bytes = c->bytes;
    d->cov0 = c->span0;
    d->ncov = c->nspan;
    return 0;
}

static int unit_deliveries(struct builder *b, dcp_gunit *u, struct cand **cands, size_t *ccap,
                           int **members, size_t *mcap)
{
    dcp_gplan *g = b->g;
    dcp_gfrag *fr = g->frags + u->frag0;
    size_t nc = 0;
    u->dlv0 = g->ndlvs;
    /* spans and image offsets of every receiving rank */
    for (size_t i = 0; i < u->nfrag;) {
        size_t j = i;
        while (j < u->nfrag && fr[j].rank == fr[i].rank)
            j++;
        if (fr[i].rank == u->reader) {
            i = j;
            continue;
        }
        int local = b->o->node && b->o->node[fr[i].rank] == b->o->node[u->reader];
        if (local && b->o->shm) {
            /* copied out of the reader's shared staging buffer; the
             * fragments keep their offsets in the unit */
            struct cand c = {.rank = fr[i].rank, .span0 = g->nspans};
            for (size_t k = i; k < j; k++)
                c.bytes += fr[k].len;
            if (add_dlv(b, DCP_GDLV_SHM, c.rank, -1, &c) < 0)
                return -1;
            g->has_shm = 1;
            i = j;
            continue;
        }
        if (GROW(*cands, *ccap, nc + 1) < 0)
            return -1;
        struct cand *c = &(*cands)[nc++];
        c->rank = fr[i].rank;
        c->local = local && !b->o->bcast_local;
        c->span0 = g->nspans;
        c->bytes = 0;
        uint64_t h = 1469598103934665603ull;
        for (size_t k = i; k < j; k++) {
            uint64_t a = fr[k].src - u->off, e = a + fr[k].len;
            dcp_gspan *last = g->nspans > c->span0 ? &g->spans[g->nspans - 1] : NULL;
            if (last && a <= last->b) {
                if (e > last->b) {
                    c->bytes += e - last->b;
                    last->b = e;
                }
                fr[k].img = c->bytes - (last->b - a);
                continue;
            }
            if (GROW(g->spans, b->scap, g->nspans + 1) < 0)
                return -1;
            g->spans[g->nspans++] = (dcp_gspan){a, e};
            fr[k].img = c->bytes;
            c->bytes += e - a;
        }
        c->nspan = g->nspans - c->span0;
        for (size_t k = c->span0; k < g->nspans; k++)
            h = (h ^ g->spans[k].a ^ (g->spans[k].b << 1)) * 1099511628211ull;
        c->hash = h;
        i = j;
    }
    if (nc > 1)   /* qsort must not see the NULL of an empty array */
        qsort(*cands, nc, sizeof **cands, cmp_cand);
    /* ranks on other nodes needing identical spans share one broadcast */
    for (size_t i = 0; i < nc;) {
        size_t j = i + 1;
        while (j < nc && same_spans(g, &(*cands)[i], &(*cands)[j]))
            j++;
        int group = -1;
        if (j - i >= 2 && !b->o->no_bcast) {
            if (GROW(*members, *mcap, j - i + 1) < 0)
                return -1;
            size_t m = 0;
            for (size_t k = i; k < j; k++)
                (*members)[m++] = (*cands)[k].rank;
            (*members)[m++] = u->reader;
            qsort(*members, m, sizeof **members, cmp_int);
            group = intern_group(b, *members, m);
        }
        if (group >= 0) {
            if (add_dlv(b, DCP_GDLV_BCAST, -1, group, &(*cands)[i]) < 0)
                return -1;
        } else {
            for (size_t k = i; k < j; k++)
                if (add_dlv(b, DCP_GDLV_P2P, (*cands)[k].rank, -1, &(*cands)[k]) < 0)
                    return -1;
        }
        i = j;
    }
    u->ndlv = g->ndlvs - u->dlv0;
    return 0;
}

static int build_deliveries(struct builder *b, dcp_error *err)
{
    struct cand *cands = NULL;
    int *members = NULL;
    size_t ccap = 0, mcap = 0;
    int rc = 0;
    for (size_t i = 0; i < b->g->nunits && rc == 0; i++)
        rc = unit_deliveries(b, &b->g->units[i], &cands, &ccap, &members, &mcap);
    free(cands);
    free(members);
    return rc < 0 ? dcpi_err(err, ENOMEM, "dcp_load: out of memory for the global plan") : 0;
}

/* ------------------------------------------------------------ step 5: order */

static int cmp_seq(const void *a, const void *b)
{
    const dcp_gunit *x = a, *y = b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* The k-th unit of every reader comes before the (k+1)-th of any. */
static int order_units(dcp_gplan *g, dcp_error *err)
{
    uint64_t *count = calloc((size_t)g->nranks, sizeof *count);
    if (!count)
        return dcpi_err(err, ENOMEM, "dcp_load: out of memory for the global plan");
    for (size_t i = 0; i < g->nunits; i++) {
        dcp_gunit *u = &g->units[i];
        u->seq = count[u->reader]++ * (uint64_t)g->nranks + (uint64_t)u->reader;
    }
    if (g->nunits > 1)
        qsort(g->units, g->nunits, sizeof *g->units, cmp_seq);
    free(count);
    return 0;
}

/* ------------------------------------------------------------ entry points */

int dcp_gplan_build(dcp_checkpoint *ck, const dcp_greqs *reqs, int nranks, int me,
                    const dcp_gplan_opts *caller, dcp_gplan *g, dcp_error *err)
{
    memset(g, 0, sizeof *g);
    g->nranks = nranks;
    g->me = me;
    dcp_gplan_opts opts;
    const dcp_gplan_opts *o = &opts;
    struct builder b = {.ck = ck, .g = g, .o = o};
    int rc = -1;
    if (!ck || !reqs || !caller || nranks < 1 || me < 0 || me >= nranks) {
        dcpi_err(err, EINVAL, "dcp_gplan_build: invalid arguments (rank %d of %d)", me, nranks);
        goto out;
    }
    /* At least the first sized layout (0.2), which ends at the field named. */
    if (dcpi_sized_opts(&opts, sizeof opts, DCPI_OPTS_MIN(dcp_gplan_opts, bcast_local), caller, "dcp_gplan_build",
                        "DCP_GPLAN_OPTS_INIT", err) < 0)
        goto out;
    if (o->unit_max == 0) {
        dcpi_err(err, EINVAL, "dcp_load: zero staging size");
        goto out;
    }
    if (reqs->n > UINT32_MAX || (reqs->n && (!reqs->v || !reqs->first))) {
        dcpi_err(err, EINVAL, "dcp_gplan_build: malformed request table");
        goto out;
    }
    for (size_t i = 0; i < reqs->n; i++)
        if (reqs->v[i].rank < 0 || reqs->v[i].rank >= nranks || !reqs->v[i].e) {
            dcpi_err(err, EINVAL, "dcp_gplan_build: request %zu: rank %d of %d, or no entry", i,
                     reqs->v[i].rank, nranks);
            goto out;
        }
    if (plan_all(ck, reqs, g, err) < 0 || renumber_spaces(g, err) < 0 || build_units(&b, err) < 0 ||
        assign_readers(g, err) < 0 || build_deliveries(&b, err) < 0 || order_units(g, err) < 0)
        goto out;
    rc = 0;
out:
    free(b.active);
    if (rc < 0)
        dcp_gplan_free(g);
    return rc;
}

void dcp_gplan_free(dcp_gplan *g)
{
    if (!g)
        return;
    free(g->spaces);
    free(g->gops);
    free(g->zero);
    free(g->units);
    free(g->frags);
    free(g->dlvs);
    free(g->spans);
    free(g->groups);
    free(g->group_ranks);
    free(g->load);
    memset(g, 0, sizeof *g);
}

/* ------------------------------------------------------------ requests */

/* "[0:4,8:2]" for messages */
static void box_str(char *buf, size_t cap, int ndim, const int64_t *off, const int64_t *len)
{
    size_t pos = 0;
    pos += (size_t)snprintf(buf + pos, cap - pos, "[");
    for (int d = 0; d < ndim && pos < cap; d++)
        pos += (size_t)snprintf(buf + pos, cap - pos, "%s%" PRId64 ":%" PRId64, d ? "," : "",
                                off ? off[d] : 0, len ? len[d] : 0);
    if (pos < cap)
        snprintf(buf + pos, cap - pos, "]");
}

static void shape_str(char *buf, size_t cap, const dcp_entry *e)
{
    size_t pos = 0;
    pos += (size_t)snprintf(buf + pos, cap - pos, "[");
    for (int d = 0; d < e->ndim && pos < cap; d++)
        pos += (size_t)snprintf(buf + pos, cap - pos, "%s%" PRId64, d ? "," : "", e->shape[d]);
    if (pos < cap)
        snprintf(buf + pos, cap - pos, "]");
}

int dcp_greq_check(dcp_checkpoint *ck, const char *key, dcp_dtype dt, int ndim, const int64_t *off,
                   const int64_t *len, const dcp_entry **out, uint64_t *nbytes, dcp_error *err)
{
    const char *path = dcpi_ck_name(ck);
    const dcp_entry *e;
    dcp_error fe;
    if (dcp_find_entry(ck, key, &e, &fe) < 0) {
        if (fe.code == DCP_ENOTFOUND)   /* ENOENT, as in 0.1 */
            return dcpi_err(err, ENOENT, "%s: %s: no such key in the checkpoint", path, key);
        return dcpi_err(err, fe.code, "%s", fe.msg);
    }
    *out = e;
    if (e->kind == DCP_KIND_BYTES) {
        if (ndim != 0)
            return dcpi_err(err, EINVAL, "%s: %s: a bytes item is loaded whole (ndim 0), not with %d dimensions",
                            path, key, ndim);
        if (dt != DCP_DTYPE_INVALID && dt != DCP_UINT8)
            return dcpi_err(err, EINVAL, "%s: %s: dtype mismatch: the region asks for %s, the entry is a bytes item",
                            path, key, dcp_dtype_name(dt) ? dcp_dtype_name(dt) : "an invalid dtype");
        return dcp_entry_nbytes(ck, e, nbytes, err);
    }
    if (ndim != e->ndim) {
        char shp[256];
        shape_str(shp, sizeof shp, e);
        return dcpi_err(err, EINVAL, "%s: %s: the region has %d dimensions, the tensor has %d (shape %s)",
                        path, key, ndim, e->ndim, shp);
    }
    if (dt != DCP_DTYPE_INVALID && dt != e->dtype)
        return dcpi_err(err, EINVAL, "%s: %s: dtype mismatch: the region asks for %s, the checkpoint stores %s",
                        path, key, dcp_dtype_name(dt) ? dcp_dtype_name(dt) : "an invalid dtype",
                        dcp_dtype_name(e->dtype) ? dcp_dtype_name(e->dtype) : "?");
    if (ndim > 0 && (!off || !len))
        return dcpi_err(err, EINVAL, "%s: %s: the region has no offsets or lengths", path, key);
    for (int d = 0; d < ndim; d++)
        if (off[d] < 0 || len[d] < 0 || off[d] > e->shape[d] || len[d] > e->shape[d] - off[d]) {
            char box[512], shp[256];
            box_str(box, sizeof box, ndim, off, len);
            shape_str(shp, sizeof shp, e);
            return dcpi_err(err, EINVAL, "%s: %s: region %s (start:count) lies outside the tensor of shape %s",
                            path, key, box, shp);
        }
    /* A region with a count of 0 is 0 bytes, whatever its other counts (a
     * share of torch.empty(2**62, 0)): not a product that overflows first. */
    uint64_t n;
    if (!dcpi_shape_numel(ndim, len, &n) || !dcpi_mul_u64(n, dcp_dtype_size(e->dtype), &n))
        return dcpi_err(err, EOVERFLOW, "%s: %s: region too large", path, key);
    *nbytes = n;
    return 0;
}

/* The wire format (dcp_gplan.h): little-endian fixed widths, whatever the
 * host, so that blocks made by another implementation decode here. */
struct wbuf {
    unsigned char *p;
    size_t len, cap;
};

static int put(struct wbuf *w, const void *src, size_t n)
{
    if (n > SIZE_MAX / 2 - w->len)
        return -1;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap *= 2;
        unsigned char *q = realloc(w->p, cap);
        if (!q)
            return -1;
        w->p = q;
        w->cap = cap;
    }
    if (n)
        memcpy(w->p + w->len, src, n);
    w->len += n;
    return 0;
}

static int put_le(struct wbuf *w, uint64_t v, size_t n)
{
    unsigned char b[8];
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    return put(w, b, n);
}

int dcp_greqs_encode(const dcp_gregion *regions, size_t n, unsigned char **buf, size_t *len,
                     dcp_error *err)
{
    *buf = NULL;
    *len = 0;
    if (n && !regions)
        return dcpi_err(err, EINVAL, "dcp_greqs_encode: %zu regions but no region array", n);
    if (n > UINT32_MAX)
        return dcpi_err(err, EOVERFLOW, "dcp_load: too many regions (%zu)", n);
    struct wbuf w = {0};
    int rc = put_le(&w, n, 4);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const dcp_gregion *r = &regions[i];
        if (!r->key) {
            free(w.p);
            return dcpi_err(err, EINVAL, "dcp_greqs_encode: region %zu has no key", i);
        }
        if (r->ndim < 0 || r->ndim > DCP_GREQ_MAX_NDIM || (r->ndim && (!r->offsets || !r->lengths))) {
            free(w.p);
            return dcpi_err(err, EINVAL, "dcp_greqs_encode: %s: invalid ndim %d, or no offsets or lengths",
                            r->key, r->ndim);
        }
        size_t kl = strlen(r->key);
        if (kl > UINT32_MAX) {
            free(w.p);
            return dcpi_err(err, EOVERFLOW, "dcp_load: key too long");
        }
        rc = put_le(&w, kl, 4) | put(&w, r->key, kl) | put_le(&w, (uint32_t)(int32_t)r->dtype, 4) |
             put_le(&w, (uint32_t)(int32_t)r->ndim, 4);
        for (int d = 0; d < r->ndim && rc == 0; d++)
            rc = put_le(&w, (uint64_t)r->offsets[d], 8) | put_le(&w, (uint64_t)r->lengths[d], 8);
    }
    if (rc) {
        free(w.p);
        return dcpi_err(err, ENOMEM, "dcp_load: out of memory");
    }
    *buf = w.p;
    *len = w.len;
    return 0;
}

struct rbuf {
    const unsigned char *p;
    size_t len, pos;
};

static int get_le(struct rbuf *r, size_t n, uint64_t *v)
{
    if (n > r->len - r->pos)
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++)
        x |= (uint64_t)r->p[r->pos + i] << (8 * i);
    r->pos += n;
    *v = x;
    return 0;
}

void dcp_greqs_free(dcp_greqs *r)
{
    if (!r)
        return;
    free(r->v);
    free(r->dims);
    free(r->first);
    memset(r, 0, sizeof *r);
}

/* Parse every rank's requests (two passes: count, then fill). */
int dcp_greqs_decode(dcp_checkpoint *ck, const unsigned char *all, const size_t *counts,
                     const size_t *displs, int nranks, dcp_greqs *out, dcp_error *err)
{
    memset(out, 0, sizeof *out);
    if (!ck || nranks < 1 || !counts || !displs)
        return dcpi_err(err, EINVAL, "dcp_greqs_decode: invalid arguments (%d ranks)", nranks);
    for (int rk = 0; rk < nranks; rk++)
        if (counts[rk] && !all)
            return dcpi_err(err, EINVAL, "dcp_greqs_decode: no buffer");
    size_t nreq = 0, ndims = 0, kcap = 256;
    char *key = malloc(kcap);
    if (!key)
        return dcpi_err(err, ENOMEM, "dcp_load: out of memory");
    int rc = -1;
    for (int pass = 0; pass < 2; pass++) {
        size_t qi = 0, di = 0;
        for (int rk = 0; rk < nranks; rk++) {
            struct rbuf b = {counts[rk] ? all + displs[rk] : NULL, counts[rk], 0};
            uint64_t cnt;
            if (pass)
                out->first[rk] = qi;
            if (get_le(&b, 4, &cnt) < 0) {
                dcpi_err(err, EPROTO, "dcp_load: truncated requests from rank %d", rk);
                goto out;
            }
            for (uint64_t i = 0; i < cnt; i++) {
                uint64_t kl, dt, nd;
                if (get_le(&b, 4, &kl) < 0 || kl > b.len - b.pos) {
                    dcpi_err(err, EPROTO, "dcp_load: malformed request %" PRIu64 " from rank %d", i, rk);
                    goto out;
                }
                if (kl >= kcap) {
                    char *k2 = realloc(key, (size_t)kl + 1);
                    if (!k2) {
                        dcpi_err(err, ENOMEM, "dcp_load: out of memory");
                        goto out;
                    }
                    key = k2;
                    kcap = (size_t)kl + 1;
                }
                memcpy(key, b.p + b.pos, (size_t)kl);
                b.pos += (size_t)kl;
                key[kl] = '\0';
                /* nd is an i32: values past DCP_GREQ_MAX_NDIM, negative ones included, are refused */
                if (get_le(&b, 4, &dt) < 0 || get_le(&b, 4, &nd) < 0 || nd > DCP_GREQ_MAX_NDIM ||
                    (size_t)nd * 16 > b.len - b.pos) {
                    dcpi_err(err, EPROTO, "dcp_load: malformed request %" PRIu64 " from rank %d", i, rk);
                    goto out;
                }
                if (!pass) {
                    b.pos += (size_t)nd * 16;
                    nreq++;
                    ndims += 2 * (size_t)nd;
                    continue;
                }
                dcp_greq *q = &out->v[qi];
                q->rank = rk;
                q->ndim = (int)nd;
                q->off = out->dims + di;
                q->len = out->dims + di + nd;
                for (uint64_t d = 0; d < nd; d++) {
                    uint64_t o = 0, l = 0;
                    get_le(&b, 8, &o);   /* checked above: 16 bytes per dimension are there */
                    get_le(&b, 8, &l);
                    q->off[d] = (int64_t)o;
                    q->len[d] = (int64_t)l;
                }
                di += 2 * (size_t)nd;
                if (dcp_greq_check(ck, key, (dcp_dtype)(int32_t)(uint32_t)dt, (int)nd, q->off, q->len, &q->e,
                                   &q->nbytes, err) < 0)
                    goto out;
                q->dtype = q->e->kind == DCP_KIND_BYTES ? DCP_UINT8 : q->e->dtype;
                qi++;
            }
            if (b.pos != b.len) {
                dcpi_err(err, EPROTO, "dcp_load: malformed requests from rank %d (%zu bytes after the last)", rk,
                         b.len - b.pos);
                goto out;
            }
        }
        if (!pass) {
            if (nreq > UINT32_MAX) {
                dcpi_err(err, EOVERFLOW, "dcp_load: too many requests (%zu)", nreq);
                goto out;
            }
            out->v = calloc(nreq ? nreq : 1, sizeof *out->v);
            out->dims = calloc(ndims ? ndims : 1, sizeof *out->dims);
            out->first = calloc((size_t)nranks + 1, sizeof *out->first);
            if (!out->v || !out->dims || !out->first) {
                dcpi_err(err, ENOMEM, "dcp_load: out of memory for %zu requests", nreq);
                goto out;
            }
            out->n = nreq;
        } else {
            out->first[nranks] = qi;
        }
    }
    rc = 0;
out:
    free(key);
    if (rc < 0)
        dcp_greqs_free(out);
    return rc;
}

/* ------------------------------------------------------------ executing a plan */

const dcp_gfrag *dcp_gunit_frags(const dcp_gplan *g, const dcp_gunit *u, int rank, size_t *n)
{
    const dcp_gfrag *f = g->frags + u->frag0;
    size_t i = 0;
    while (i < u->nfrag && f[i].rank < rank)
        i++;
    size_t j = i;
    while (j < u->nfrag && f[j].rank == rank)
        j++;
    *n = j - i;
    return f + i;
}

dcp_op dcp_gunit_op(const dcp_gplan *g, const dcp_gunit *u)
{
    const dcp_gspace *sp = &g->spaces[u->space];
    dcp_op op = {0};
    op.file = sp->file;
    op.flags = sp->decoded ? DCP_OP_DECODED : 0;
    op.blob = sp->blob;
    op.src_offset = u->off;
    op.length = u->len;
    op.elem_size = 1;
    op.dest_stride = 1;
    return op;
}

/* The bytes already cached are taken first without waiting; when some are
 * not, the kernel is asked to start reading the next unit before this one's
 * rest is read: otherwise, when the reading thread waits for a CPU after
 * each read (ranks copying replicated bytes), the device sits idle in
 * between. With the shard files evicted, a replicated load on 4 ranks took
 * 1.7 s instead of 2.2 and a load on 1 rank 1.4-2.1 s instead of 2.2-3.5
 * (noisy virtual disk; deeper advice gained nothing); advising every unit
 * cost 5-8% on a warm page cache, hence the cached read first. */
int dcp_gunit_read(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, const dcp_gunit *next,
                   void *buf, dcp_error *err)
{
    dcp_op op = dcp_gunit_op(g, u);
    uint64_t got = dcp_op_fetch_cached(ck, &op, buf);
    if (got == op.length)
        return 0;
    if (next) {
        dcp_op nop = dcp_gunit_op(g, next);
        dcp_op_prefetch(ck, &nop);
    }
    op.src_offset += got;
    op.length -= got;
    return dcp_op_fetch(ck, g->spaces[u->space].e, &op, (unsigned char *)buf + got, err);
}

/* Is the unit cached? One block from its middle is asked (read into
 * at + its place, where the unit's bytes go): a read with RWF_NOWAIT that
 * misses starts readahead of what it asked for, which O_DIRECT would then
 * read from the device a second time (the whole unit asked so made --direct
 * slower than buffered reads), and its ends are often cached by the record
 * locator's reads of the zip headers beside them. */
static int unit_cached(dcp_checkpoint *ck, const dcp_op *op, unsigned char *at)
{
    uint64_t mid = op->length / 2 / DCP_DIRECT_ALIGN * DCP_DIRECT_ALIGN;
    dcp_op probe = *op;
    probe.src_offset += mid;
    probe.length = op->length - mid < DCP_DIRECT_ALIGN ? op->length - mid : DCP_DIRECT_ALIGN;
    return dcp_op_fetch_cached(ck, &probe, at + mid) == probe.length;
}

int dcp_gunit_read_direct(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, void *buf, size_t cap,
                          size_t *lead, dcp_error *err)
{
    dcp_op op = dcp_gunit_op(g, u);
    *lead = (size_t)(op.src_offset % DCP_DIRECT_ALIGN);
    if (cap < *lead || cap - *lead < op.length) {
        *lead = 0;
        return dcp_gunit_read(ck, g, u, NULL, buf, err);
    }
    unsigned char *at = (unsigned char *)buf + *lead;
    if (unit_cached(ck, &op, at))
        return dcp_gunit_read(ck, g, u, NULL, at, err);   /* cached: through the page cache */
    size_t rlead;
    if (dcp_op_fetch_direct(ck, &op, buf, cap, &rlead) == 0)
        return 0;
    return dcp_op_fetch(ck, g->spaces[u->space].e, &op, at, err);
}

int dcp_gunit_read_direct_at(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, void *dest,
                             dcp_error *err)
{
    dcp_op op = dcp_gunit_op(g, u);
    if (((uintptr_t)dest - op.src_offset) % DCP_DIRECT_ALIGN || unit_cached(ck, &op, dest) ||
        dcp_op_fetch_direct_at(ck, &op, dest) != 0)
        return dcp_gunit_read(ck, g, u, NULL, dest, err);
    return 0;
}

int dcp_gunit_cache(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, const dcp_gunit *next,
                    void *scratch, size_t len, dcp_error *err)
{
    if (len == 0)
        return dcpi_err(err, EINVAL, "%s: dcp_gunit_cache: no scratch buffer", dcpi_ck_name(ck));
    dcp_op op = dcp_gunit_op(g, u);
    int advised = 0;
    for (uint64_t done = 0; done < op.length;) {
        dcp_op sub = op;
        sub.src_offset += done;
        sub.length = op.length - done < len ? op.length - done : len;
        uint64_t got = dcp_op_fetch_cached(ck, &sub, scratch);
        if (got < sub.length) {
            if (next && !advised) {
                dcp_op nop = dcp_gunit_op(g, next);
                dcp_op_prefetch(ck, &nop);
                advised = 1;
            }
            sub.src_offset += got;
            sub.length -= got;
            if (dcp_op_fetch(ck, g->spaces[u->space].e, &sub, scratch, err) < 0)
                return -1;
            got += sub.length;
        }
        done += got;
    }
    return 0;
}

void dcp_gdlv_pack(const dcp_gplan *g, const dcp_gdlv *d, const void *unit, void *out)
{
    const unsigned char *src = unit;
    unsigned char *dst = out;
    const dcp_gspan *s = g->spans + d->cov0;
    for (size_t i = 0; i < d->ncov; i++) {
        memcpy(dst, src + s[i].a, (size_t)(s[i].b - s[i].a));
        dst += s[i].b - s[i].a;
    }
}

void dcp_gfrag_place(const dcp_gplan *g, const dcp_greqs *r, const dcp_gfrag *f, size_t n,
                     const void *buf)
{
    for (size_t i = 0; i < n; i++) {
        const dcp_gop *o = &g->gops[f[i].gop];
        dcp_op sub = dcp_gfrag_op(g, &f[i]);
        dcp_op_place(&sub, (const unsigned char *)buf + f[i].img, r->v[o->req].dest, o->dtype);
    }
}

int dcp_gfrag_read(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_greqs *r, const dcp_gfrag *f, size_t n,
                   dcp_error *err)
{
    dcp_op small[64];
    dcp_op *ops = small;
    if (n > sizeof small / sizeof small[0]) {
        if (n > SIZE_MAX / sizeof *ops || !(ops = malloc(n * sizeof *ops)))
            return dcpi_err(err, ENOMEM, "%s: out of memory for %zu fragments", dcpi_ck_name(ck), n);
    }
    int rc = 0;
    /* one dcp_plan_execute per run of fragments of one request: its fast
     * paths (adjacent direct ops in one preadv, strided ones bounced) apply */
    for (size_t i = 0; i < n && rc == 0;) {
        const dcp_gop *o = &g->gops[f[i].gop];
        size_t j = i;
        for (; j < n && g->gops[f[j].gop].req == o->req; j++)
            ops[j - i] = dcp_gfrag_op(g, &f[j]);
        const dcp_greq *q = &r->v[o->req];
        dcp_plan p = {.entry = q->e, .ops = ops, .nops = j - i, .cap = j - i, .nbytes = q->nbytes,
                      .zero_fill = 0, .dtype = o->dtype};
        rc = dcp_plan_execute(ck, &p, q->dest, err);
        i = j;
    }
    if (ops != small)
        free(ops);
    return rc;
}
