/* The planner: turn "this box of tensor X" or "these bytes of X's flat image"
 * into a list of reads (dcp_op), each one contiguous range of source bytes
 * placed contiguously or with a fixed stride in the caller's region buffer.
 * One planner serves the FUSE driver, the CLI and the MPI loader; the reader
 * (reader.c) executes plans.
 *
 * Per chunk that overlaps the box, the overlap's dimensions are ordered by
 * source stride: the run goes along the dimension of source stride 1, absorbs
 * further dimensions while the source stays contiguous and the destination
 * pattern continues, and the remaining dimensions are looped to emit ops. So a
 * C-contiguous chunk read whole is one op, a transposed chunk one op per
 * column. Consecutive ops contiguous in source and destination are coalesced.
 *
 * Cost: a linear scan over the entry's chunks per box (dcp_plan_bytes uses at
 * most 2*ndim+1 boxes); no allocation beyond the plan's reused ops array.
 * A tensor with very many chunks would want a per-dimension interval index.
 *
 * Every record comes from a hostile file: strides and offsets are checked so
 * that every element the plan touches lies inside the chunk's storage record.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void dcp_plan_init(dcp_plan *p) { memset(p, 0, sizeof *p); }

void dcp_plan_reset(dcp_plan *p)
{
    p->entry = NULL;
    p->nops = 0;
    p->nbytes = 0;
    p->zero_fill = 0;
    p->dtype = DCP_DTYPE_INVALID;
}

void dcp_plan_free(dcp_plan *p)
{
    free(p->ops);
    dcp_plan_init(p);
}

/* ------------------------------------------------------------ op list */

/* Can b continue a: same source stream and flags, adjacent in the source, and
 * the destination goes on with a single stride (a one-element op fits any). */
static int try_coalesce(dcp_op *a, const dcp_op *b)
{
    if (a->file != b->file || a->flags != b->flags || a->elem_size != b->elem_size)
        return 0;
    if ((a->flags & DCP_OP_DECODED) &&
        (a->blob.file != b->blob.file || a->blob.offset != b->blob.offset))
        return 0;   /* offsets live in different decoded blobs */
    if (a->src_offset + a->length != b->src_offset)
        return 0;
    uint64_t esz = a->elem_size, na = a->length / esz, nb = b->length / esz, s, next;
    if (na > 1 && nb > 1) {
        if (a->dest_stride != b->dest_stride)
            return 0;
        s = a->dest_stride;
    } else if (na > 1) {
        s = a->dest_stride;
    } else if (nb > 1) {
        s = b->dest_stride;
    } else {
        if (b->dest_offset <= a->dest_offset)
            return 0;
        s = b->dest_offset - a->dest_offset;
    }
    if (s < esz || !dcpi_mul_u64(na, s, &next) || !dcpi_add_u64(next, a->dest_offset, &next) ||
        next != b->dest_offset)
        return 0;
    a->length += b->length;
    a->dest_stride = s;
    return 1;
}

static int push_op(dcp_plan *p, const dcp_op *op, dcp_error *err)
{
    if (p->nops && try_coalesce(&p->ops[p->nops - 1], op))
        return 0;
    if (p->nops == p->cap) {
        size_t ncap = p->cap ? p->cap * 2 : 16;
        if (ncap < p->cap || ncap > SIZE_MAX / sizeof *p->ops)
            return dcpi_err(err, ENOMEM, "%s: plan too large", p->entry ? p->entry->key : "(plan)");
        dcp_op *n = realloc(p->ops, ncap * sizeof *n);
        if (!n)
            return dcpi_err(err, ENOMEM, "%s: out of memory for %zu read operations",
                            p->entry ? p->entry->key : "(plan)", ncap);
        p->ops = n;
        p->cap = ncap;
    }
    p->ops[p->nops++] = *op;
    return 0;
}

/* ------------------------------------------------------------ one chunk */

/* Check that every element of chunk ci lies inside its storage record, and
 * that its dtype has the entry's element size. */
static int check_record(dcp_checkpoint *ck, const dcp_entry *e, const dcp_chunk *c, size_t ci,
                        const dcp_record *r, dcp_error *err)
{
    size_t esz = dcp_dtype_size(e->dtype);
    if (dcp_dtype_size(r->dtype) != esz)
        return dcpi_err(err, EINVAL, "%s: %s: chunk %zu is stored as %s but the metadata says %s",
                       ck->path, e->key, ci, dcp_dtype_name(r->dtype) ? dcp_dtype_name(r->dtype) : "an unknown dtype",
                       dcp_dtype_name(e->dtype));
    if (r->storage_offset < 0)
        return dcpi_err(err, EINVAL, "%s: %s: chunk %zu has a negative storage offset", ck->path, e->key, ci);
    uint64_t last = (uint64_t)r->storage_offset;
    for (int d = 0; d < e->ndim; d++) {
        if (c->sizes[d] <= 1)
            continue;   /* the stride of a size-1 dim is never used */
        uint64_t t;
        if (r->stride[d] < 0)
            return dcpi_err(err, EINVAL, "%s: %s: chunk %zu has a negative stride %" PRId64 " in dimension %d",
                           ck->path, e->key, ci, r->stride[d], d);
        if (!dcpi_mul_u64((uint64_t)(c->sizes[d] - 1), (uint64_t)r->stride[d], &t) ||
            !dcpi_add_u64(last, t, &last))
            return dcpi_err(err, EOVERFLOW, "%s: %s: chunk %zu: strides overflow", ck->path, e->key, ci);
    }
    uint64_t need, end;
    if (!dcpi_add_u64(last, 1, &need) || !dcpi_mul_u64(need, esz, &need) || need > r->data_length ||
        !dcpi_add_u64(r->data_offset, r->data_length, &end))
        return dcpi_err(err, EINVAL,
                       "%s: %s: chunk %zu: its strides reach beyond its storage record of %" PRIu64 " bytes",
                       ck->path, e->key, ci, r->data_length);
    return 0;
}

static uint32_t op_flags(uint32_t rf)
{
    uint32_t f = 0;
    if (rf & DCP_RECORD_BIG_ENDIAN) f |= DCP_OP_BSWAP;
    if (rf & DCP_RECORD_CONJ) f |= DCP_OP_CONJ;
    if (rf & DCP_RECORD_NEG) f |= DCP_OP_NEG;
    if (rf & DCP_RECORD_DECODED) f |= DCP_OP_DECODED;
    return f;
}

/* Emit the ops of the overlap [lo, hi) of chunk ci with the box (box offsets
 * roff, C-order destination strides dstr in elements, at dest_base bytes). */
static int plan_chunk(dcp_checkpoint *ck, const dcp_entry *e, const dcp_chunk *c, size_t ci, const int64_t *lo,
                      const int64_t *hi, const int64_t *roff, const uint64_t *dstr,
                      uint64_t dest_base, dcp_plan *p, dcp_error *err)
{
    if (!c->has_blob)
        return dcpi_err(err, ENOENT, "%s: %s: chunk %zu has no storage entry in the metadata",
                       ck->path, e->key, ci);
    const dcp_record *r;
    if (dcp_chunk_record(ck, e, ci, &r, err) < 0 || check_record(ck, e, c, ci, r, err) < 0)
        return -1;
    if (p->dtype == DCP_DTYPE_INVALID)
        p->dtype = r->dtype;
    else if (p->dtype != r->dtype)
        return dcpi_err(err, EINVAL, "%s: %s: chunks are stored with different dtypes (%s and %s)",
                       ck->path, e->key, dcp_dtype_name(p->dtype), dcp_dtype_name(r->dtype));

    /* The looped dims (count > 1), in elements; bounded by check_record and
     * by the box volume, so no sum below can overflow. */
    uint64_t cnt[DCPI_MAX_NDIM], ss[DCPI_MAX_NDIM], ds[DCPI_MAX_NDIM];
    int m = 0;
    uint64_t src = (uint64_t)r->storage_offset, dst = 0;
    for (int d = 0; d < e->ndim; d++) {
        uint64_t n = (uint64_t)(hi[d] - lo[d]);
        if (c->sizes[d] > 1)   /* else the (unchecked) stride is never used */
            src += (uint64_t)(lo[d] - c->offsets[d]) * (uint64_t)r->stride[d];
        if (n > 1) {
            cnt[m] = n;
            ss[m] = (uint64_t)r->stride[d];
            ds[m] = dstr[d];
            m++;
        }
        dst += (uint64_t)(lo[d] - roff[d]) * dstr[d];
    }

    /* The run: along the source-contiguous dim (the innermost one in the
     * destination if several claim stride 1), then absorb dims while both
     * patterns continue. */
    uint64_t run = 1, step = 1;
    int inner = -1;
    for (int j = 0; j < m; j++)
        if (ss[j] == 1 && (inner < 0 || ds[j] < ds[inner]))
            inner = j;
    if (inner >= 0) {
        run = cnt[inner];
        step = ds[inner];
        cnt[inner] = cnt[--m], ss[inner] = ss[m], ds[inner] = ds[m];
        for (int j = 0; j < m;) {
            uint64_t want;
            if (ss[j] == run && dcpi_mul_u64(run, step, &want) && ds[j] == want) {
                run *= cnt[j];
                cnt[j] = cnt[--m], ss[j] = ss[m], ds[j] = ds[m];
                j = 0;
            } else {
                j++;
            }
        }
    }
    /* Outer loops by decreasing source stride, so ops come out in file order. */
    for (int i = 1; i < m; i++)
        for (int j = i; j > 0 && ss[j] > ss[j - 1]; j--) {
            uint64_t t;
            t = cnt[j], cnt[j] = cnt[j - 1], cnt[j - 1] = t;
            t = ss[j], ss[j] = ss[j - 1], ss[j - 1] = t;
            t = ds[j], ds[j] = ds[j - 1], ds[j - 1] = t;
        }

    uint32_t esz = (uint32_t)dcp_dtype_size(e->dtype);
    dcp_op op = {
        .file = c->blob.file,
        .flags = op_flags(r->flags),
        .length = run * esz,
        .dest_stride = (run > 1 ? step : 1) * esz,
        .elem_size = esz,
        .chunk = (uint32_t)ci,
        .blob = c->blob,
    };
    uint64_t idx[DCPI_MAX_NDIM] = {0};
    for (;;) {
        op.src_offset = r->data_offset + src * esz;
        op.dest_offset = dest_base + dst * esz;
        if (push_op(p, &op, err) < 0)
            return dcpi_err_prefix(err, "%s: %s", ck->path, e->key);
        int j = m - 1;
        for (; j >= 0; j--) {
            src += ss[j];
            dst += ds[j];
            if (++idx[j] < cnt[j])
                break;
            src -= ss[j] * cnt[j];
            dst -= ds[j] * cnt[j];
            idx[j] = 0;
        }
        if (j < 0)
            break;
    }
    return 0;
}

/* ------------------------------------------------------------ boxes */

static int first_pair(void *ctx, size_t a, size_t b)
{
    (void)ctx, (void)a, (void)b;
    return 1;
}

/* 1 when some of e's chunks overlap. A box's count of covered elements then
 * proves nothing (chunks that overlap by as many elements as a hole has
 * cancel it out), so every region of such an entry is zero-filled before its
 * chunks are placed: no byte of a hole is left to what the buffer held.
 * Without overlaps the count is exact (a box inside stored chunks needs no
 * fill, one that meets a hole does). Decided once an entry (the first plan
 * of it; a race computes the same answer twice): an exact tiling in linear
 * time, anything else by a sweep. */
static int chunks_overlap(dcp_checkpoint *ck, const dcp_entry *e, const dcp_chunk *chunks)
{
    size_t i = dcpi_entry_index(ck, e);
    int t = i == SIZE_MAX ? 0 : __atomic_load_n(&ck->priv[i].tiling, __ATOMIC_RELAXED);
    if (t)
        return t == 2;
    uint64_t vol = 0;
    size_t m = 0, *idx = malloc((e->nchunks ? e->nchunks : 1) * sizeof *idx);
    if (!idx)
        return 1;   /* zero-filling is never wrong */
    for (size_t c = 0; c < e->nchunks; c++) {
        uint64_t v = 0;
        dcpi_shape_numel(e->ndim, chunks[c].sizes, &v);   /* <= numel: chunks lie inside the tensor */
        if (v)
            idx[m++] = c;
        vol = dcpi_add_u64(vol, v, &vol) ? vol : UINT64_MAX;
    }
    int r = vol == dcp_entry_numel(e) ? dcpi_chunks_tile(e, chunks, idx, m) : 0;
    if (r == 0)   /* holes, overlaps or both: only overlaps matter */
        r = dcpi_chunk_overlaps(e, chunks, idx, m, first_pair, NULL) == 0;
    free(idx);
    if (r < 0)
        return 1;
    t = r ? 1 : 2;
    if (i != SIZE_MAX)
        __atomic_store_n(&ck->priv[i].tiling, t, __ATOMIC_RELAXED);
    return t == 2;
}

/* Append the ops of box [off, off+len) (already validated) placed in C order
 * at dest_base; *covered gets the number of box elements some chunk covers. */
static int plan_box(dcp_checkpoint *ck, const dcp_entry *e, const dcp_chunk *chunks, const int64_t *off, const int64_t *len,
                    uint64_t dest_base, dcp_plan *p, uint64_t *covered, dcp_error *err)
{
    int nd = e->ndim;
    uint64_t dstr[DCPI_MAX_NDIM];
    uint64_t vol = 1;
    *covered = 0;
    for (int d = 0; d < nd; d++)
        if (len[d] == 0)
            return 0;   /* no element, whatever the other counts (up to INT64_MAX) */
    for (int d = nd - 1; d >= 0; d--) {
        dstr[d] = vol;
        vol *= (uint64_t)len[d];   /* bounded by the entry's numel */
    }
    int64_t lo[DCPI_MAX_NDIM], hi[DCPI_MAX_NDIM];
    for (size_t ci = 0; ci < e->nchunks; ci++) {
        const dcp_chunk *c = &chunks[ci];
        uint64_t ov = 1;
        int d = 0;
        for (; d < nd; d++) {
            int64_t cend = c->offsets[d] + c->sizes[d], rend = off[d] + len[d];
            lo[d] = off[d] > c->offsets[d] ? off[d] : c->offsets[d];
            hi[d] = rend < cend ? rend : cend;
            if (lo[d] >= hi[d])
                break;
            ov *= (uint64_t)(hi[d] - lo[d]);
        }
        if (d < nd)
            continue;
        if (plan_chunk(ck, e, c, ci, lo, hi, off, dstr, dest_base, p, err) < 0)
            return -1;
        if (!dcpi_add_u64(*covered, ov, covered))
            *covered = UINT64_MAX;   /* overlapping chunks: chunks_overlap() says so */
    }
    return 0;
}

static int check_tensor(dcp_checkpoint *ck, const dcp_entry *e, dcp_error *err)
{
    if (e->kind != DCP_KIND_TENSOR)
        return dcpi_err(err, EINVAL, "%s: %s: not a tensor", ck->path, e->key);
    if (!dcp_dtype_size(e->dtype) || e->ndim < 0 || e->ndim > DCPI_MAX_NDIM)
        return dcpi_err(err, EINVAL, "%s: %s: malformed tensor entry", ck->path, e->key);
    return 0;
}

int dcp_plan_region(dcp_checkpoint *ck, const dcp_entry *e, const int64_t *offsets,
                    const int64_t *lengths, dcp_plan *plan, dcp_error *err)
{
    dcp_plan_reset(plan);
    if (check_tensor(ck, e, err) < 0)
        return -1;
    if (e->ndim > 0 && (!offsets || !lengths))
        return dcpi_err(err, EINVAL, "%s: %s: a region of a %d-d tensor needs offsets and lengths",
                       ck->path, e->key, e->ndim);
    uint64_t vol = 1;
    for (int d = 0; d < e->ndim; d++) {
        uint64_t end;
        if (offsets[d] < 0 || lengths[d] < 0 ||
            !dcpi_add_u64((uint64_t)offsets[d], (uint64_t)lengths[d], &end) || end > (uint64_t)e->shape[d])
            return dcpi_err(err, EINVAL,
                           "%s: %s: region offset %" PRId64 " length %" PRId64
                           " lies outside dimension %d of size %" PRId64,
                           ck->path, e->key, offsets[d], lengths[d], d, e->shape[d]);
    }
    dcpi_shape_numel(e->ndim, lengths, &vol);   /* <= numel, bounded when the entry was built */
    uint64_t esz = dcp_dtype_size(e->dtype), covered;
    if (!dcpi_mul_u64(vol, esz, &plan->nbytes)) {
        dcp_plan_reset(plan);
        return dcpi_err(err, EOVERFLOW, "%s: %s: region too large", ck->path, e->key);
    }
    plan->entry = e;   /* dtype: from the first stored chunk, else the metadata's */
    const dcp_chunk *chunks;
    if (dcp_entry_chunks(ck, e, &chunks, err) < 0) {
        dcp_plan_reset(plan);
        return -1;
    }
    int rc = plan_box(ck, e, chunks, offsets, lengths, 0, plan, &covered, err);
    int zero_all = rc == 0 && vol && chunks_overlap(ck, e, chunks);
    dcp_release_chunks(ck, e);
    if (rc < 0) {
        dcp_plan_reset(plan);
        return -1;
    }
    if (plan->dtype == DCP_DTYPE_INVALID)
        plan->dtype = e->dtype;
    plan->zero_fill = covered != vol || zero_all;
    return 0;
}

/* ------------------------------------------------------------ flat bytes */

/* Plan elements [a, b) of the sub-tensor of dims >= d (dims < d fixed in off
 * with length 1) as boxes contiguous in C order: a head partial slab, the
 * full middle slabs as one box, a tail partial slab. At most 2*ndim+1 boxes. */
static int plan_range(dcp_checkpoint *ck, const dcp_entry *e, const dcp_chunk *chunks, int d, int64_t *off, int64_t *len,
                      const uint64_t *block, uint64_t a, uint64_t b, uint64_t base, uint64_t esz,
                      dcp_plan *p, int *partial, dcp_error *err)
{
    if (a >= b)
        return 0;
    uint64_t covered;
    if (d == e->ndim) {   /* a single element: a == 0, b == 1 */
        if (plan_box(ck, e, chunks, off, len, (base + a) * esz, p, &covered, err) < 0)
            return -1;
        *partial |= covered != 1;
        return 0;
    }
    uint64_t B = block[d];
    uint64_t i0 = a / B, r0 = a % B, i1 = b / B, r1 = b % B;
    uint64_t start = base;
    if (i0 == i1) {
        off[d] = (int64_t)i0, len[d] = 1;
        return plan_range(ck, e, chunks, d + 1, off, len, block, r0, r1, base + i0 * B, esz, p, partial, err);
    }
    if (r0) {
        off[d] = (int64_t)i0, len[d] = 1;
        if (plan_range(ck, e, chunks, d + 1, off, len, block, r0, B, start + i0 * B, esz, p, partial, err) < 0)
            return -1;
        i0++;
    }
    if (i1 > i0) {
        off[d] = (int64_t)i0, len[d] = (int64_t)(i1 - i0);
        for (int k = d + 1; k < e->ndim; k++)
            off[k] = 0, len[k] = e->shape[k];
        if (plan_box(ck, e, chunks, off, len, (start + i0 * B) * esz, p, &covered, err) < 0)
            return -1;
        *partial |= covered != (i1 - i0) * B;
    }
    if (r1) {
        off[d] = (int64_t)i1, len[d] = 1;
        if (plan_range(ck, e, chunks, d + 1, off, len, block, 0, r1, start + i1 * B, esz, p, partial, err) < 0)
            return -1;
    }
    return 0;
}

static int plan_bytes_item(dcp_checkpoint *ck, const dcp_entry *e, uint64_t offset, uint64_t length,
                           dcp_plan *p, dcp_error *err)
{
    if (!e->has_blob)
        return dcpi_err(err, ENOENT, "%s: %s: no storage entry for this bytes item", ck->path, e->key);
    uint64_t size = e->blob.length, end;
    if (e->blob.transforms && dcpi_blob_size(ck, &e->blob, &size, e->key, err) < 0)
        return -1;
    p->entry = e;
    p->dtype = DCP_UINT8;
    if (offset >= size || length == 0)
        return 0;
    if (!dcpi_add_u64(offset, length, &end) || end > size)
        end = size;
    dcp_op op = {
        .file = e->blob.file,
        .flags = e->blob.transforms ? DCP_OP_DECODED : 0,
        .src_offset = offset,
        .length = end - offset,
        .dest_offset = 0,
        .dest_stride = 1,
        .elem_size = 1,
        .chunk = 0,
        .blob = e->blob,
    };
    if (!e->blob.transforms && !dcpi_add_u64(e->blob.offset, offset, &op.src_offset))
        return dcpi_err(err, EOVERFLOW, "%s: %s: blob offset overflows", ck->path, e->key);
    if (push_op(p, &op, err) < 0)
        return dcpi_err_prefix(err, "%s: %s", ck->path, e->key);
    p->nbytes = op.length;
    return 0;
}

int dcp_plan_bytes(dcp_checkpoint *ck, const dcp_entry *e, uint64_t offset, uint64_t length,
                   dcp_plan *plan, dcp_error *err)
{
    dcp_plan_reset(plan);
    if (e->kind == DCP_KIND_BYTES) {
        if (plan_bytes_item(ck, e, offset, length, plan, err) < 0) {
            dcp_plan_reset(plan);
            return -1;
        }
        return 0;
    }
    if (check_tensor(ck, e, err) < 0)
        return -1;
    uint64_t esz = dcp_dtype_size(e->dtype), total, end;
    if (!dcpi_mul_u64(dcp_entry_numel(e), esz, &total))
        return dcpi_err(err, EOVERFLOW, "%s: %s: tensor too large", ck->path, e->key);
    if (offset % esz)
        return dcpi_err(err, EINVAL, "%s: %s: byte offset %" PRIu64 " is not a multiple of the element size %" PRIu64,
                       ck->path, e->key, offset, esz);
    plan->entry = e;
    plan->dtype = e->dtype;
    if (offset >= total || length == 0)
        return 0;
    if (!dcpi_add_u64(offset, length, &end) || end > total)
        end = total;   /* like read(2) at the end of a file */
    if (end % esz)
        return dcpi_err(err, EINVAL, "%s: %s: byte range end %" PRIu64 " is not a multiple of the element size %" PRIu64,
                       ck->path, e->key, end, esz);

    uint64_t block[DCPI_MAX_NDIM];
    int64_t off[DCPI_MAX_NDIM], len[DCPI_MAX_NDIM];
    uint64_t b = 1;
    for (int d = e->ndim - 1; d >= 0; d--) {
        block[d] = b;
        b *= (uint64_t)e->shape[d];
    }
    uint64_t a0 = offset / esz;
    int partial = 0;
    plan->dtype = DCP_DTYPE_INVALID;
    /* base is -a0 in elements so that each box lands at (start - a0) * esz;
     * unsigned wrap-around makes that exact. */
    const dcp_chunk *chunks;
    if (dcp_entry_chunks(ck, e, &chunks, err) < 0) {
        dcp_plan_reset(plan);
        return -1;
    }
    int rc = plan_range(ck, e, chunks, 0, off, len, block, a0, end / esz, (uint64_t)0 - a0, esz, plan, &partial,
                        err);
    if (rc == 0 && end > offset && chunks_overlap(ck, e, chunks))
        partial = 1;
    dcp_release_chunks(ck, e);
    if (rc < 0) {
        dcp_plan_reset(plan);
        return -1;
    }
    if (plan->dtype == DCP_DTYPE_INVALID)
        plan->dtype = e->dtype;
    plan->entry = e;
    plan->nbytes = end - offset;
    plan->zero_fill = partial;
    return 0;
}
