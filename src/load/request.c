/* Requests: check this rank's regions, then allgather every rank's requests
 * (key, dtype, box) so that each rank can build the same global plan. What
 * arrives from peers is parsed with every length checked. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "load.h"

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

/* Check one request against the checkpoint; *nbytes is its buffer size. */
static int check_one(dcp_checkpoint *ck, const char *key, dcp_dtype dt, int ndim, const int64_t *off,
                     const int64_t *len, const dcp_entry **out, uint64_t *nbytes, dcp_error *err)
{
    const char *path = ldi_name(ck);
    const dcp_entry *e = dcp_find(ck, key);
    if (!e)
        return ldi_err(err, ENOENT, "%s: %s: no such key in the checkpoint", path, key);
    *out = e;
    if (e->kind == DCP_KIND_BYTES) {
        if (ndim != 0)
            return ldi_err(err, EINVAL, "%s: %s: a bytes item is loaded whole (ndim 0), not with %d dimensions",
                           path, key, ndim);
        if (dt != DCP_DTYPE_INVALID && dt != DCP_UINT8)
            return ldi_err(err, EINVAL, "%s: %s: dtype mismatch: the region asks for %s, the entry is a bytes item",
                           path, key, dcp_dtype_name(dt) ? dcp_dtype_name(dt) : "an invalid dtype");
        return dcp_entry_nbytes(ck, e, nbytes, err);
    }
    if (ndim != e->ndim) {
        char shp[256];
        shape_str(shp, sizeof shp, e);
        return ldi_err(err, EINVAL, "%s: %s: the region has %d dimensions, the tensor has %d (shape %s)",
                       path, key, ndim, e->ndim, shp);
    }
    if (dt != DCP_DTYPE_INVALID && dt != e->dtype)
        return ldi_err(err, EINVAL, "%s: %s: dtype mismatch: the region asks for %s, the checkpoint stores %s",
                       path, key, dcp_dtype_name(dt) ? dcp_dtype_name(dt) : "an invalid dtype",
                       dcp_dtype_name(e->dtype) ? dcp_dtype_name(e->dtype) : "?");
    if (ndim > 0 && (!off || !len))
        return ldi_err(err, EINVAL, "%s: %s: the region has no offsets or lengths", path, key);
    uint64_t n = dcp_dtype_size(e->dtype);
    for (int d = 0; d < ndim; d++) {
        if (off[d] < 0 || len[d] < 0 || off[d] > e->shape[d] || len[d] > e->shape[d] - off[d]) {
            char box[512], shp[256];
            box_str(box, sizeof box, ndim, off, len);
            shape_str(shp, sizeof shp, e);
            return ldi_err(err, EINVAL, "%s: %s: region %s (start:count) lies outside the tensor of shape %s",
                           path, key, box, shp);
        }
        if (__builtin_mul_overflow(n, (uint64_t)len[d], &n))
            return ldi_err(err, EOVERFLOW, "%s: %s: region too large", path, key);
    }
    *nbytes = n;
    return 0;
}

int ldi_check_regions(dcp_checkpoint *ck, const dcp_load_region *regions, size_t n, int cuda_ok,
                      int device, const char *cuda_msg, dcp_error *err)
{
    if (n && !regions)
        return ldi_err(err, EINVAL, "dcp_load: %zu regions but no region array", n);
    for (size_t i = 0; i < n; i++) {
        const dcp_load_region *r = &regions[i];
        const dcp_entry *e;
        uint64_t nb = 0;
        if (!r->key)
            return ldi_err(err, EINVAL, "%s: region %zu has no key", ldi_name(ck), i);
        if (r->ndim < 0 || r->ndim > LDI_MAX_NDIM)
            return ldi_err(err, EINVAL, "%s: %s: invalid ndim %d", ldi_name(ck), r->key, r->ndim);
        if (check_one(ck, r->key, r->dtype, r->ndim, r->offsets, r->lengths, &e, &nb, err) < 0)
            return -1;
        if (r->mem != DCP_LOAD_HOST && r->mem != DCP_LOAD_CUDA)
            return ldi_err(err, EINVAL, "%s: %s: unknown destination kind %d", ldi_name(ck), r->key,
                           (int)r->mem);
        if (r->mem == DCP_LOAD_CUDA && !cuda_ok)
            return ldi_err(err, ENODEV, "%s: %s: CUDA destination: %s", ldi_name(ck), r->key, cuda_msg);
        if (nb && !r->dest)
            return ldi_err(err, EINVAL, "%s: %s: the region has no destination buffer", ldi_name(ck),
                           r->key);
        char msg[256];
        if (r->mem == DCP_LOAD_CUDA && nb && ldi_cuda_check_ptr(r->dest, device, msg, sizeof msg) < 0)
            return ldi_err(err, EINVAL, "%s: %s: CUDA destination: %s", ldi_name(ck), r->key, msg);
    }
    return 0;
}

/* ------------------------------------------------------------ wire format */

/* Per rank: u32 count, then per region: u32 key length, key bytes, i32 dtype,
 * i32 ndim, ndim (offset, length) pairs of i64. Native byte order: all ranks
 * run the same binary. */
struct wbuf {
    unsigned char *p;
    size_t len, cap;
};

static int put(struct wbuf *w, const void *src, size_t n)
{
    if (n > SIZE_MAX - w->len)
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
    memcpy(w->p + w->len, src, n);
    w->len += n;
    return 0;
}

static int encode(const dcp_load_region *regions, size_t n, struct wbuf *w, dcp_error *err)
{
    if (n > UINT32_MAX)
        return ldi_err(err, EOVERFLOW, "dcp_load: too many regions (%zu)", n);
    uint32_t cnt = (uint32_t)n;
    if (put(w, &cnt, 4) < 0)
        return ldi_err(err, ENOMEM, "dcp_load: out of memory");
    for (size_t i = 0; i < n; i++) {
        const dcp_load_region *r = &regions[i];
        size_t kl = strlen(r->key);
        if (kl > UINT32_MAX)
            return ldi_err(err, EOVERFLOW, "dcp_load: key too long");
        uint32_t k32 = (uint32_t)kl;
        int32_t dt = (int32_t)r->dtype, nd = r->ndim;
        int rc = put(w, &k32, 4) | put(w, r->key, kl) | put(w, &dt, 4) | put(w, &nd, 4);
        for (int d = 0; d < r->ndim && rc == 0; d++)
            rc = put(w, &r->offsets[d], 8) | put(w, &r->lengths[d], 8);
        if (rc)
            return ldi_err(err, ENOMEM, "dcp_load: out of memory");
    }
    return 0;
}

struct rbuf {
    const unsigned char *p;
    size_t len, pos;
};

static int get(struct rbuf *r, void *dst, size_t n)
{
    if (n > r->len - r->pos)
        return -1;
    memcpy(dst, r->p + r->pos, n);
    r->pos += n;
    return 0;
}

void ldi_reqs_free(ldi_reqs *r)
{
    free(r->v);
    free(r->dims);
    free(r->first);
    memset(r, 0, sizeof *r);
}

/* Parse every rank's requests (two passes: count, then fill). */
static int decode_all(dcp_checkpoint *ck, const unsigned char *all, const int *counts, const int *displs,
                      int nranks, ldi_reqs *out, dcp_error *err)
{
    size_t nreq = 0, ndims = 0, kcap = 256;
    char *key = malloc(kcap);
    if (!key)
        return ldi_err(err, ENOMEM, "dcp_load: out of memory");
    int rc = -1;
    for (int pass = 0; pass < 2; pass++) {
        size_t qi = 0, di = 0;
        for (int rk = 0; rk < nranks; rk++) {
            struct rbuf b = {all + displs[rk], (size_t)counts[rk], 0};
            uint32_t cnt;
            if (pass)
                out->first[rk] = qi;
            if (get(&b, &cnt, 4) < 0) {
                ldi_err(err, EPROTO, "dcp_load: truncated requests from rank %d", rk);
                goto out;
            }
            for (uint32_t i = 0; i < cnt; i++) {
                uint32_t kl;
                int32_t dt, nd;
                if (get(&b, &kl, 4) < 0 || kl > b.len - b.pos) {
                    ldi_err(err, EPROTO, "dcp_load: malformed request %" PRIu32 " from rank %d", i, rk);
                    goto out;
                }
                if (kl >= kcap) {
                    char *k2 = realloc(key, (size_t)kl + 1);
                    if (!k2) {
                        ldi_err(err, ENOMEM, "dcp_load: out of memory");
                        goto out;
                    }
                    key = k2;
                    kcap = (size_t)kl + 1;
                }
                if (get(&b, key, kl) < 0 || get(&b, &dt, 4) < 0 || get(&b, &nd, 4) < 0 || nd < 0 ||
                    nd > LDI_MAX_NDIM || (size_t)nd * 16 > b.len - b.pos) {
                    ldi_err(err, EPROTO, "dcp_load: malformed request %" PRIu32 " from rank %d", i, rk);
                    goto out;
                }
                key[kl] = '\0';
                if (!pass) {
                    b.pos += (size_t)nd * 16;
                    nreq++;
                    ndims += 2 * (size_t)nd;
                    continue;
                }
                ldi_req *q = &out->v[qi];
                q->rank = rk;
                q->ndim = nd;
                q->off = out->dims + di;
                q->len = out->dims + di + nd;
                for (int d = 0; d < nd; d++) {
                    get(&b, &q->off[d], 8);
                    get(&b, &q->len[d], 8);
                }
                di += 2 * (size_t)nd;
                if (check_one(ck, key, (dcp_dtype)dt, nd, q->off, q->len, &q->e, &q->nbytes, err) < 0)
                    goto out;
                q->dtype = q->e->kind == DCP_KIND_BYTES ? DCP_UINT8 : q->e->dtype;
                qi++;
            }
        }
        if (!pass) {
            if (nreq > UINT32_MAX) {
                ldi_err(err, EOVERFLOW, "dcp_load: too many requests (%zu)", nreq);
                goto out;
            }
            out->v = calloc(nreq ? nreq : 1, sizeof *out->v);
            out->dims = calloc(ndims ? ndims : 1, sizeof *out->dims);
            out->first = calloc((size_t)nranks + 1, sizeof *out->first);
            if (!out->v || !out->dims || !out->first) {
                ldi_err(err, ENOMEM, "dcp_load: out of memory for %zu requests", nreq);
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
    return rc;
}

/* Every rank's call header against rank 0's: the same result on every rank,
 * since all hold every header. */
static int check_calls(const unsigned char *all, const int *counts, const int *displs, int nranks,
                       dcp_error *err)
{
    ldi_call c0, c;
    for (int rk = 0; rk < nranks; rk++) {
        if ((size_t)counts[rk] < sizeof c)
            return ldi_err(err, EPROTO, "dcp_load: truncated requests from rank %d", rk);
        memcpy(rk ? &c : &c0, all + displs[rk], sizeof c);
        if (!rk)
            continue;
        if (c.identity != c0.identity)
            return ldi_err(err, EINVAL, "dcp_load: rank %d passes another checkpoint than rank 0", rk);
        if (c.flags != c0.flags || c.nstaging != c0.nstaging || c.staging != c0.staging)
            return ldi_err(err, EINVAL,
                           "dcp_load: rank %d passes other options than rank 0 (flags 0x%" PRIx64
                           ", %" PRIu64 " staging buffers of %" PRIu64 " bytes; rank 0: flags 0x%" PRIx64
                           ", %" PRIu64 " of %" PRIu64 ")",
                           rk, c.flags, c.nstaging, c.staging, c0.flags, c0.nstaging, c0.staging);
    }
    return 0;
}

int ldi_exchange(MPI_Comm comm, dcp_checkpoint *ck, const ldi_call *call, const dcp_load_region *regions,
                 size_t n, ldi_reqs *out, dcp_error *err)
{
    int me, nranks;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &nranks);
    memset(out, 0, sizeof *out);
    struct wbuf w = {0};
    int *counts = calloc((size_t)nranks, sizeof *counts), *displs = calloc((size_t)nranks, sizeof *displs);
    unsigned char *all = NULL;
    int rc = -1, lrc = 0;
    if (!counts || !displs || put(&w, call, sizeof *call) < 0)
        lrc = ldi_err(err, ENOMEM, "dcp_load: out of memory");
    else if (encode(regions, n, &w, err) < 0)
        lrc = -1;
    else if (w.len > INT_MAX)
        lrc = ldi_err(err, EOVERFLOW, "dcp_load: this rank's requests exceed 2 GiB");
    /* every rank encoded before the collectives that need buffers */
    if ((rc = ldi_agree(comm, lrc, err)) < 0)
        goto out;
    rc = -1;
    int mylen = (int)w.len;
    ldi_allgather(&mylen, 1, MPI_INT, counts, comm);
    uint64_t total = 0;
    for (int r = 0; r < nranks; r++) {
        displs[r] = (int)total;
        total += (uint64_t)counts[r];
    }
    if (total > INT_MAX) {   /* the same on every rank */
        ldi_err(err, EOVERFLOW, "dcp_load: the requests of all ranks exceed 2 GiB");
        rc = LDI_AGREED;
        goto out;
    }
    all = malloc(total ? total : 1);
    lrc = all ? 0 : ldi_err(err, ENOMEM, "dcp_load: out of memory for the requests of all ranks");
    if ((rc = ldi_agree(comm, lrc, err)) < 0)
        goto out;
    rc = -1;
    ldi_allgatherv(w.p, mylen, all, counts, displs, comm);
    if (check_calls(all, counts, displs, nranks, err) < 0) {
        rc = LDI_AGREED;
        goto out;
    }
    for (int r = 0; r < nranks; r++) {   /* the requests follow the header */
        displs[r] += (int)sizeof *call;
        counts[r] -= (int)sizeof *call;
    }
    if (decode_all(ck, all, counts, displs, nranks, out, err) < 0)
        goto out;
    /* this rank's own destinations */
    for (size_t i = 0; i < n; i++) {
        ldi_req *q = &out->v[out->first[me] + i];
        q->dest = regions[i].dest;
        q->mem = regions[i].mem;
    }
    rc = 0;
out:
    if (rc < 0)
        ldi_reqs_free(out);
    free(w.p);
    free(counts);
    free(displs);
    free(all);
    return rc;
}
