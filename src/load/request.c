/* Requests: check this rank's regions, then allgather every rank's call
 * header (ldi_call, native byte order: all ranks run the same binary)
 * followed by its requests encoded by libdcp (dcp_greqs_encode: key, dtype,
 * box) so that each rank can build the same global plan. What arrives from
 * peers is decoded by libdcp with every length checked (dcp_greqs_decode). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "load.h"

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
        if (r->ndim < 0 || r->ndim > DCP_GREQ_MAX_NDIM)
            return ldi_err(err, EINVAL, "%s: %s: invalid ndim %d", ldi_name(ck), r->key, r->ndim);
        if (dcp_greq_check(ck, r->key, r->dtype, r->ndim, r->offsets, r->lengths, &e, &nb, err) < 0)
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

/* Every rank's call header against rank 0's: the same result on every rank,
 * since all hold every header. 0; -1 with err for other options; the rank,
 * with err, whose checkpoint is not rank 0's. */
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
        if (c.identity != c0.identity) {
            ldi_err(err, EINVAL, "dcp_load: rank %d passes another checkpoint than rank 0", rk);
            return rk;   /* the caller finds out how (ldi_identity_diff) */
        }
        if (c.flags != c0.flags || c.nstaging != c0.nstaging || c.staging != c0.staging)
            return ldi_err(err, EINVAL,
                           "dcp_load: rank %d passes other options than rank 0 (flags 0x%" PRIx64
                           ", %" PRIu64 " staging buffers of %" PRIu64 " bytes; rank 0: flags 0x%" PRIx64
                           ", %" PRIu64 " of %" PRIu64 ")",
                           rk, c.flags, c.nstaging, c.staging, c0.flags, c0.nstaging, c0.staging);
    }
    return 0;
}

/* This rank's block: the call header, then its encoded requests. */
static int encode_mine(const ldi_call *call, const dcp_load_region *regions, size_t n, unsigned char **out,
                       size_t *len, dcp_error *err)
{
    dcp_gregion *gr = calloc(n ? n : 1, sizeof *gr);
    if (!gr)
        return ldi_err(err, ENOMEM, "dcp_load: out of memory");
    for (size_t i = 0; i < n; i++)
        gr[i] = (dcp_gregion){regions[i].key, regions[i].dtype, regions[i].ndim, regions[i].offsets,
                              regions[i].lengths};
    unsigned char *enc = NULL;
    size_t elen = 0;
    int rc = dcp_greqs_encode(gr, n, &enc, &elen, err);
    free(gr);
    if (rc < 0)
        return -1;
    if (elen > SIZE_MAX - sizeof *call || !(*out = malloc(sizeof *call + elen))) {
        free(enc);
        return ldi_err(err, ENOMEM, "dcp_load: out of memory");
    }
    memcpy(*out, call, sizeof *call);
    memcpy(*out + sizeof *call, enc, elen);
    *len = sizeof *call + elen;
    free(enc);
    return 0;
}

int ldi_exchange(MPI_Comm comm, dcp_checkpoint *ck, const ldi_call *call, const dcp_load_region *regions,
                 size_t n, dcp_greqs *out, dcp_error *err)
{
    int me, nranks;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &nranks);
    memset(out, 0, sizeof *out);
    unsigned char *mine = NULL;
    size_t len = 0;
    int *counts = calloc((size_t)nranks, sizeof *counts), *displs = calloc((size_t)nranks, sizeof *displs);
    size_t *zcounts = calloc((size_t)nranks, sizeof *zcounts), *zdispls = calloc((size_t)nranks, sizeof *zdispls);
    unsigned char *all = NULL;
    int rc = -1, lrc = 0;
    if (!counts || !displs || !zcounts || !zdispls)
        lrc = ldi_err(err, ENOMEM, "dcp_load: out of memory");
    else if (encode_mine(call, regions, n, &mine, &len, err) < 0)
        lrc = -1;
    else if (len > INT_MAX)
        lrc = ldi_err(err, EOVERFLOW, "dcp_load: this rank's requests exceed 2 GiB");
    /* every rank encoded before the collectives that need buffers */
    if ((rc = ldi_agree(comm, lrc, err)) < 0)
        goto out;
    rc = -1;
    int mylen = (int)len;
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
    ldi_allgatherv(mine, mylen, all, counts, displs, comm);
    int differs = check_calls(all, counts, displs, nranks, err);
    if (differs != 0) {
        if (differs > 0)
            ldi_identity_diff(comm, ck, differs, err);
        rc = LDI_AGREED;
        goto out;
    }
    for (int r = 0; r < nranks; r++) {   /* the requests follow the header */
        zdispls[r] = (size_t)displs[r] + sizeof *call;
        zcounts[r] = (size_t)counts[r] - sizeof *call;
    }
    if (dcp_greqs_decode(ck, all, zcounts, zdispls, nranks, out, err) < 0)
        goto out;
    /* this rank's own destinations */
    for (size_t i = 0; i < n; i++) {
        dcp_greq *q = &out->v[out->first[me] + i];
        q->dest = regions[i].dest;
        q->mem = regions[i].mem;
    }
    rc = 0;
out:
    if (rc < 0)
        dcp_greqs_free(out);
    free(mine);
    free(counts);
    free(displs);
    free(zcounts);
    free(zdispls);
    free(all);
    return rc;
}
