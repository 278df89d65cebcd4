/* The record locator: where a tensor chunk's elements are in its shard file.
 *
 * A chunk's blob is a whole torch.save zip (data.pkl names the storage record,
 * its offset, size, stride and dtype), or, with the SAFETENSORS serialization,
 * a safetensors buffer shared by the file's tensors, or (Hugging Face layout)
 * raw C-contiguous bytes. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pickle.h"
#include "safetensors.h"
#include "zip.h"

#define PKL_MAX (64u << 20)            /* a tensor chunk's data.pkl is ~150 bytes */

typedef struct loc {
    dcp_checkpoint *ck;
    const dcp_entry *e;
    const dcp_chunk *c;
    size_t chunk;
    dcp_error *err;
} loc;

#define LOCFAIL(l, code, ...) loc_fail(l, code, __VA_ARGS__)
__attribute__((format(printf, 3, 4)))
static int loc_fail(loc *l, int code, const char *fmt, ...)
{
    char why[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return dcpi_err(l->err, code, "%s/%s: %s: chunk %zu at offset %llu: %s", l->ck->path,
                    l->ck->files[l->c->blob.file], l->e->key, l->chunk,
                    (unsigned long long)l->c->blob.offset, why);
}

static int64_t *stride_copy(loc *l, const int64_t *s, int nd)
{
    pthread_mutex_lock(&l->ck->lock);
    int64_t *p = dcpi_arena_memdup(&l->ck->arena, s, (size_t)nd * sizeof *s);
    pthread_mutex_unlock(&l->ck->lock);
    if (!p)
        dcpi_err(l->err, ENOMEM, "%s: %s: out of memory", l->ck->path, l->e->key);
    return p;
}

static void c_strides(const int64_t *size, int nd, int64_t *stride)
{
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        stride[d] = s;
        s *= size[d] ? size[d] : 1;
    }
}

/* Raw C-contiguous bytes of exactly the chunk (safetensors data). */
static int raw_record(loc *l, uint64_t data_offset, uint64_t data_length, dcp_dtype dt, dcp_record *rec)
{
    const dcp_entry *e = l->e;
    uint64_t numel = 1;
    for (int d = 0; d < e->ndim; d++)
        numel *= (uint64_t)l->c->sizes[d];
    if (dcp_dtype_size(dt) != dcp_dtype_size(e->dtype))
        return LOCFAIL(l, EIO, "stored dtype %s has another element size than %s", dcp_dtype_name(dt),
                       dcp_dtype_name(e->dtype));
    if (data_length != numel * dcp_dtype_size(dt))
        return LOCFAIL(l, EIO, "%" PRIu64 " bytes stored, the chunk needs %" PRIu64, data_length,
                       numel * dcp_dtype_size(dt));
    int64_t st[DCPI_MAX_NDIM];
    c_strides(l->c->sizes, e->ndim, st);
    memset(rec, 0, sizeof *rec);
    rec->data_offset = data_offset;
    rec->data_length = data_length;
    rec->dtype = dt;
    rec->stride = stride_copy(l, st, e->ndim);
    return rec->stride ? 0 : -1;
}

/* SAFETENSORS-format .distcp: the blob offset is the start of a safetensors
 * buffer holding the file's tensors by key. */
static int safetensors_record(loc *l, dcp_record *rec)
{
    dcp_checkpoint *ck = l->ck;
    const dcp_blob *b = &l->c->blob;
    uint64_t fsize, data_start;
    int fd;
    char what[4096];
    json_t *root;
    snprintf(what, sizeof what, "%s/%s: %s", ck->path, ck->files[b->file], l->e->key);
    if (dcpi_ck_file_size(ck, b->file, &fsize, l->err) < 0 || dcpi_ck_fd(ck, b->file, &fd, l->err) < 0 ||
        dcpi_st_header(fd, b->offset, fsize, what, &root, &data_start, l->err) < 0)
        return -1;
    int rc;
    json_t *t = json_object_get(root, l->e->key);
    json_t *dts = json_object_get(t, "dtype"), *offs = json_object_get(t, "data_offsets");
    json_t *shape = json_object_get(t, "shape");
    if (!json_is_object(t) || !json_is_string(dts) || !json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_is_array(shape)) {
        rc = LOCFAIL(l, EIO, "the safetensors buffer has no well-formed entry for this key");
    } else {
        json_int_t b0 = json_integer_value(json_array_get(offs, 0)), b1 = json_integer_value(json_array_get(offs, 1));
        dcp_dtype dt = dcp_dtype_from_safetensors(json_string_value(dts));
        size_t nd = json_array_size(shape);
        int same = nd == (size_t)l->e->ndim;
        for (size_t d = 0; same && d < nd; d++)
            same = json_integer_value(json_array_get(shape, d)) == l->c->sizes[d];
        if (dt == DCP_DTYPE_INVALID)
            rc = LOCFAIL(l, EIO, "unknown safetensors dtype %s", json_string_value(dts));
        else if (!same)
            rc = LOCFAIL(l, EIO, "the stored shape differs from the chunk's sizes");
        else if (b0 < 0 || b1 < b0 || (uint64_t)b1 > fsize - data_start)
            rc = LOCFAIL(l, EIO, "data_offsets [%lld, %lld] lie outside the file", (long long)b0, (long long)b1);
        else
            rc = raw_record(l, data_start + (uint64_t)b0, (uint64_t)(b1 - b0), dt, rec);
    }
    json_decref(root);
    return rc;
}

static const pk_node *unwrap_tensor(const pk_node *n)
{
    /* torch._utils._rebuild_parameter(data, requires_grad, hooks) wraps a tensor. */
    const pk_node *g = pk_call_global(n);
    if (g && !strcmp(g->u.global.module, "torch._utils") && !strcmp(g->u.global.name, "_rebuild_parameter"))
        return pk_item(n->u.call.args, 0);
    return n;
}

static int vec(const pk_node *t, int64_t *out, int *nd)
{
    if (!t || (t->type != PK_TUPLE && t->type != PK_LIST) || pk_len(t) > DCPI_MAX_NDIM)
        return -1;
    for (size_t i = 0; i < pk_len(t); i++)
        if (!pk_int(pk_item(t, i), &out[i]))
            return -1;
    *nd = (int)pk_len(t);
    return 0;
}

static int zip_record(loc *l, dcp_record *rec)
{
    dcp_checkpoint *ck = l->ck;
    const dcp_blob *b = &l->c->blob;
    const char *key = l->e->key;
    dcpi_zip z;
    uint64_t blen;
    if (dcpi_blob_size(ck, b, &blen, key, l->err) < 0 || dcpi_zip_open(ck, b, key, &z, l->err) < 0)
        return -1;
    int rc = -1;
    char *pkl = NULL;
    pk_doc *doc = NULL;
    const pk_node *root;
    const dcpi_zip_entry *pe = dcpi_zip_find(&z, "data.pkl");
    uint64_t pstart, dstart;
    if (!pe) {
        LOCFAIL(l, EIO, "no data.pkl in the torch.save archive");
        goto out;
    }
    if (pe->size > PKL_MAX) {
        LOCFAIL(l, EIO, "data.pkl of %" PRIu64 " bytes is too large for a tensor chunk", pe->size);
        goto out;
    }
    if (dcpi_zip_data(ck, b, key, pe, blen, &pstart, l->err) < 0)
        goto out;
    pkl = malloc(pe->size ? pe->size : 1);
    if (!pkl) {
        dcpi_err(l->err, ENOMEM, "%s: %s: out of memory", ck->path, key);
        goto out;
    }
    if (dcpi_blob_read(ck, b, pkl, pe->size, pstart, key, l->err) < 0)
        goto out;
    char what[1024];
    snprintf(what, sizeof what, "%s/%s: %s: data.pkl", ck->path, ck->files[b->file], key);
    if (pk_parse(pkl, pe->size, what, &doc, &root, l->err) < 0)
        goto out;
    const pk_node *t = unwrap_tensor(root), *g = pk_call_global(t);
    int v3 = g && !strcmp(g->u.global.name, "_rebuild_tensor_v3");
    if (!g || strcmp(g->u.global.module, "torch._utils") || (!v3 && strcmp(g->u.global.name, "_rebuild_tensor_v2"))) {
        LOCFAIL(l, EIO, "data.pkl does not rebuild a plain tensor (%s.%s)", g ? g->u.global.module : "?",
                g ? g->u.global.name : "not a call");
        goto out;
    }
    const pk_node *args = t->u.call.args, *sto = pk_item(args, 0);
    const pk_node *pid = sto && sto->type == PK_PERSID ? sto->u.persid.pid : NULL;
    const char *tag, *skey;
    size_t skl;
    int64_t soff, snumel, size[DCPI_MAX_NDIM], stride[DCPI_MAX_NDIM];
    int nd, snd;
    const pk_node *cls = pk_item(pid, 1);
    if (!pid || pk_len(pid) < 5 || !pk_str(pk_item(pid, 0), &tag, NULL) || strcmp(tag, "storage") ||
        !cls || cls->type != PK_GLOBAL || !pk_str(pk_item(pid, 2), &skey, &skl) ||
        !pk_int(pk_item(pid, 4), &snumel) || !pk_int(pk_item(args, 1), &soff) ||
        vec(pk_item(args, 2), size, &nd) < 0 || vec(pk_item(args, 3), stride, &snd) < 0 || nd != snd) {
        LOCFAIL(l, EIO, "malformed _rebuild_tensor arguments in data.pkl");
        goto out;
    }
    dcp_dtype dt;
    const pk_node *meta = NULL;
    if (v3) {
        const pk_node *d = pk_item(args, 6);
        dt = d && d->type == PK_GLOBAL && !strcmp(d->u.global.module, "torch") ? dcp_dtype_from_name(d->u.global.name)
                                                                               : DCP_DTYPE_INVALID;
        meta = pk_item(args, 7);
    } else {
        dt = dcp_dtype_from_storage(cls->u.global.name);
        meta = pk_item(args, 6);
    }
    if (dt == DCP_DTYPE_INVALID) {
        LOCFAIL(l, EIO, "unknown storage type %s", cls->u.global.name);
        goto out;
    }
    size_t esz = dcp_dtype_size(dt);
    if (esz != dcp_dtype_size(l->e->dtype)) {
        LOCFAIL(l, EIO, "stored dtype %s differs in size from the metadata's %s", dcp_dtype_name(dt),
                dcp_dtype_name(l->e->dtype));
        goto out;
    }
    if (nd != l->e->ndim || memcmp(size, l->c->sizes, (size_t)nd * sizeof *size)) {
        LOCFAIL(l, EIO, "stored tensor shape differs from the chunk's sizes");
        goto out;
    }
    /* v2 storages count elements, UntypedStorage (v3) counts bytes. */
    uint64_t sbytes;
    if (snumel < 0 || !dcpi_mul_u64((uint64_t)snumel, strcmp(cls->u.global.name, "UntypedStorage") ? esz : 1, &sbytes)) {
        LOCFAIL(l, EIO, "bad storage size %" PRId64, snumel);
        goto out;
    }
    char rname[160];
    snprintf(rname, sizeof rname, "data/%.*s", (int)(skl > 100 ? 100 : skl), skey);
    const dcpi_zip_entry *de = dcpi_zip_find(&z, rname);
    if (!de) {
        LOCFAIL(l, EIO, "storage record %s is missing from the archive", rname);
        goto out;
    }
    if (de->size != sbytes) {
        LOCFAIL(l, EIO, "storage record %s holds %" PRIu64 " bytes, data.pkl says %" PRIu64, rname, de->size, sbytes);
        goto out;
    }
    /* Every element the view addresses must lie inside the record. */
    uint64_t last = (uint64_t)soff, empty = 0;
    for (int d = 0; d < nd; d++) {
        if (stride[d] < 0 || soff < 0) {
            LOCFAIL(l, EIO, "negative stride or storage offset");
            goto out;
        }
        if (size[d] == 0)
            empty = 1;
        uint64_t span;
        if (size[d] > 0 && (!dcpi_mul_u64((uint64_t)(size[d] - 1), (uint64_t)stride[d], &span) ||
                            !dcpi_add_u64(last, span, &last))) {
            LOCFAIL(l, EIO, "strides overflow");
            goto out;
        }
    }
    if (!empty && (last >= sbytes / esz)) {
        LOCFAIL(l, EIO, "the stored view reaches element %" PRIu64 " of a %" PRIu64 "-element storage", last,
                sbytes / esz);
        goto out;
    }
    if (dcpi_zip_data(ck, b, key, de, blen, &dstart, l->err) < 0)
        goto out;
    uint32_t flags = 0;
    const dcpi_zip_entry *bo = dcpi_zip_find(&z, "byteorder");
    if (bo && bo->size <= 16) {
        char order[17] = {0};
        uint64_t ostart;
        if (dcpi_zip_data(ck, b, key, bo, blen, &ostart, l->err) < 0 ||
            dcpi_blob_read(ck, b, order, bo->size, ostart, key, l->err) < 0)
            goto out;
        if (!strcmp(order, "big"))
            flags |= DCP_RECORD_BIG_ENDIAN;
        else if (strcmp(order, "little")) {
            LOCFAIL(l, EIO, "unknown byteorder '%s'", order);
            goto out;
        }
    }
    if (meta && meta->type == PK_DICT) {
        int64_t v;
        if (pk_int(pk_dict_get(meta, "conj"), &v) && v)
            flags |= DCP_RECORD_CONJ;
        if (pk_int(pk_dict_get(meta, "neg"), &v) && v)
            flags |= DCP_RECORD_NEG;
    }
    memset(rec, 0, sizeof *rec);
    rec->data_length = de->size;
    rec->storage_offset = soff;
    rec->dtype = dt;
    if (b->transforms & DCP_TRANSFORM_ZSTD) {
        flags |= DCP_RECORD_DECODED;
        rec->data_offset = dstart;
    } else {
        rec->data_offset = b->offset + dstart;
    }
    rec->flags = flags;
    rec->stride = stride_copy(l, stride, nd);
    rc = rec->stride ? 0 : -1;
out:
    pk_free(doc);
    free(pkl);
    dcpi_zip_close(&z);
    return rc;
}

int dcpi_locate_record(dcp_checkpoint *ck, const dcp_entry *e, size_t chunk, dcp_record *rec, dcp_error *err)
{
    const dcp_chunk *c = &e->chunks[chunk];
    loc l = {ck, e, c, chunk, err};
    if (!c->has_blob) {
        char box[256];
        size_t used = 0;
        for (int d = 0; d < e->ndim && used < sizeof box - 24; d++)
            used += (size_t)snprintf(box + used, sizeof box - used, "%s%lld", d ? "," : "", (long long)c->offsets[d]);
        box[used] = 0;
        return dcpi_err(err, ENOENT, "%s: %s: no storage entry for the chunk at offsets [%s]", ck->path, e->key, box);
    }
    if (c->blob.transforms & DCPI_BLOB_RAW)
        return raw_record(&l, c->blob.offset, c->blob.length, e->dtype, rec);
    unsigned char magic[4] = {0};
    uint64_t blen;
    if (dcpi_blob_size(ck, &c->blob, &blen, e->key, err) < 0)
        return -1;
    if (blen >= 4 && dcpi_blob_read(ck, &c->blob, magic, 4, 0, e->key, err) < 0)
        return -1;
    if (!memcmp(magic, "PK\3\4", 4))
        return zip_record(&l, rec);
    if (!(c->blob.transforms & DCP_TRANSFORM_ZSTD))
        return safetensors_record(&l, rec);
    return LOCFAIL(&l, EIO, "the decoded blob is not a torch.save archive");
}
