/* The DCP way, for comparison (DCP_LOAD_INDEPENDENT): every rank reads what
 * its own regions need by itself, each overlapping storage record whole, one
 * record after another, as torch.distributed.checkpoint's FileSystemReader
 * does; replicated bytes are read once per rank. Host destinations only.
 * bytes_read counts what was read: whole plain records, and of zstd records
 * the decoded bytes of each op (the core decodes them; the compressed
 * record is not read separately). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "load.h"

static int cmp_op_blob(const void *a, const void *b)
{
    const dcp_op *x = a, *y = b;
    if (x->blob.file != y->blob.file)
        return x->blob.file < y->blob.file ? -1 : 1;
    if (x->blob.offset != y->blob.offset)
        return x->blob.offset < y->blob.offset ? -1 : 1;
    return x->src_offset < y->src_offset ? -1 : x->src_offset > y->src_offset;
}

/* One request: its ops grouped by record; each record read whole once. */
static int load_one(dcp_checkpoint *ck, const dcp_greq *q, dcp_plan *p, dcp_load_stats *st, dcp_error *err)
{
    int rc = q->e->kind == DCP_KIND_BYTES ? dcp_plan_bytes(ck, q->e, 0, q->nbytes, p, err)
                                          : dcp_plan_region(ck, q->e, q->off, q->len, p, err);
    if (rc < 0)
        return -1;
    if (p->zero_fill)
        memset(q->dest, 0, (size_t)q->nbytes);
    if (p->nops > 1)
        qsort(p->ops, p->nops, sizeof *p->ops, cmp_op_blob);
    unsigned char *rec = NULL;
    for (size_t i = 0; i < p->nops && rc == 0;) {
        const dcp_blob *b = &p->ops[i].blob;
        size_t j = i;
        while (j < p->nops && p->ops[j].blob.file == b->file && p->ops[j].blob.offset == b->offset)
            j++;
        if (p->ops[i].flags & DCP_OP_DECODED) {
            /* a zstd record: the core reads and decodes it for each op (the
             * compressed bytes are of no use here); counted in decoded bytes */
            for (size_t k = i; k < j && rc == 0; k++) {
                const dcp_op *op = &p->ops[k];
                unsigned char *tmp = malloc(op->length ? (size_t)op->length : 1);
                if (!tmp) {
                    rc = ldi_err(err, ENOMEM, "dcp_load: out of memory");
                    break;
                }
                rc = dcp_op_fetch(ck, q->e, op, tmp, err);
                st->bytes_read += op->length;
                st->reads++;
                if (rc == 0)
                    dcp_op_place(op, tmp, q->dest, p->dtype);
                free(tmp);
            }
            i = j;
            continue;
        }
        /* the record whole: the blob, when its ops lie in it; in SAFETENSORS
         * shards the blob's offsets are not file offsets, so there the span
         * of the ops is read */
        uint64_t lo = UINT64_MAX, hi = 0, end;
        for (size_t k = i; k < j; k++) {
            const dcp_op *op = &p->ops[k];
            if (__builtin_add_overflow(op->src_offset, op->length, &end)) {
                rc = ldi_err(err, EIO, "%s: %s: a read past the largest offset", ldi_name(ck), q->e->key);
                break;
            }
            lo = op->src_offset < lo ? op->src_offset : lo;
            hi = end > hi ? end : hi;
        }
        if (rc < 0)
            break;
        if (lo >= b->offset && hi - b->offset <= b->length) {
            lo = b->offset;
            hi = b->offset + b->length;
        }
        if (hi - lo > SIZE_MAX || !(rec = malloc(hi > lo ? (size_t)(hi - lo) : 1))) {
            rc = ldi_err(err, ENOMEM, "%s: %s: cannot hold a record of %" PRIu64 " bytes", ldi_name(ck),
                         q->e->key, hi - lo);
            break;
        }
        dcp_op whole = {0};
        whole.file = b->file;
        whole.src_offset = lo;
        whole.length = hi - lo;
        whole.elem_size = 1;
        whole.dest_stride = 1;
        whole.blob = *b;
        rc = dcp_op_fetch(ck, q->e, &whole, rec, err);
        st->bytes_read += hi - lo;
        st->reads++;
        for (size_t k = i; k < j && rc == 0; k++)   /* each op lies in [lo, hi) by construction */
            dcp_op_place(&p->ops[k], rec + (p->ops[k].src_offset - lo), q->dest, p->dtype);
        free(rec);
        rec = NULL;
        i = j;
    }
    return rc;
}

int ldi_independent(dcp_checkpoint *ck, const dcp_greqs *reqs, int me, dcp_load_stats *st,
                    dcp_error *err)
{
    dcp_plan p;
    dcp_plan_init(&p);
    int rc = 0;
    double t0 = ldi_now();
    for (size_t i = reqs->first[me]; i < reqs->first[me + 1] && rc == 0; i++) {
        const dcp_greq *q = &reqs->v[i];
        if (q->mem != DCP_LOAD_HOST)
            rc = ldi_err(err, ENOTSUP, "%s: %s: the independent mode loads into host memory only",
                         ldi_name(ck), q->e->key);
        else if (q->nbytes)
            rc = load_one(ck, q, &p, st, err);
    }
    st->bytes_local = st->bytes_read;
    st->seconds_read = ldi_now() - t0;
    dcp_plan_free(&p);
    return rc;
}
