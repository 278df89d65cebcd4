/* safetensors output: the header of a list of tensors, the writer of a
 * single file, and the virtual safetensors view of a checkpoint (header bytes
 * plus each tensor's byte range, assembled on read through the planner).
 *
 * Layout (as the safetensors package writes it): 8-byte little-endian header
 * length N, N bytes of JSON {"__metadata__": {"format": "pt"}, key: {"dtype",
 * "shape", "data_offsets": [begin, end]}, ...} padded with spaces to a
 * multiple of 8, then the tensors' bytes back to back with no holes. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcp_write.h"
#include "atomic.h"
#include "internal.h"
#include "safetensors.h"
#include "st_header.h"
#include "zip_write.h"

#define PIECE (1u << 20)              /* bytes at a time: stays in L2 between read, CRC and write */

int dcpw_st_header(const dcp_item *items, size_t n, const char *what, unsigned char **out, uint64_t *out_len,
                   uint64_t *data_len, dcp_error *err)
{
    json_t *root = json_object(), *meta = json_object();
    int rc = 0;
    uint64_t off = 0;
    if (!root || !meta || json_object_set_new(root, "__metadata__", meta) < 0) {
        json_decref(root);
        return dcpi_err(err, ENOMEM, "%s: out of memory", what);
    }
    json_object_set_new(meta, "format", json_string("pt"));
    for (size_t i = 0; i < n && rc == 0; i++) {
        const dcp_item *it = &items[i];
        const char *dts = it->kind == DCP_KIND_TENSOR ? dcp_dtype_safetensors(it->dtype) : NULL;
        if (!dts) {
            rc = dcpi_err(err, EINVAL, "%s: %s: safetensors cannot hold %s", what, it->key,
                          it->kind == DCP_KIND_TENSOR ? dcp_dtype_name(it->dtype) : "a bytes item");
            break;
        }
        if (!dcp_key_utf8(it->key)) {
            rc = dcpi_err(err, EINVAL, "%s: %s: a tensor name that is not UTF-8", what, it->key);
            break;
        }
        if (!strcmp(it->key, "__metadata__") || json_object_get(root, it->key)) {
            rc = dcpi_err(err, EINVAL, "%s: %s: duplicate or reserved tensor name", what, it->key);
            break;
        }
        uint64_t end;
        if (!dcpi_add_u64(off, it->nbytes, &end) || end > INT64_MAX) {
            rc = dcpi_err(err, EFBIG, "%s: %s: data offsets overflow (%" PRIu64 " + %" PRIu64 " bytes)", what, it->key,
                          off, it->nbytes);
            break;
        }
        json_t *t = json_object(), *shape = json_array(), *offs = json_array();
        for (int d = 0; d < it->ndim; d++)
            json_array_append_new(shape, json_integer(it->shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)end));
        json_object_set_new(t, "dtype", json_string(dts));
        json_object_set_new(t, "shape", shape);
        json_object_set_new(t, "data_offsets", offs);
        if (json_object_set_new(root, it->key, t) < 0)
            rc = dcpi_err(err, ENOMEM, "%s: %s: cannot add to the header", what, it->key);
        off = end;
    }
    char *js = rc == 0 ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (rc < 0)
        return -1;
    if (!js)
        return dcpi_err(err, ENOMEM, "%s: cannot build the header", what);
    size_t jl = strlen(js), pad = (8 - jl % 8) % 8;
    if (jl + pad > DCPI_ST_HEADER_MAX) {
        free(js);
        return dcpi_err(err, EFBIG, "%s: safetensors header of %zu bytes exceeds the format's 100 MB", what, jl);
    }
    unsigned char *h = malloc(8 + jl + pad);
    if (!h) {
        free(js);
        return dcpi_err(err, ENOMEM, "%s: out of memory", what);
    }
    uint64_t hl = jl + pad;
    for (int i = 0; i < 8; i++)
        h[i] = (unsigned char)(hl >> (8 * i));
    memcpy(h + 8, js, jl);
    memset(h + 8 + jl, ' ', pad);
    free(js);
    *out = h;
    *out_len = 8 + hl;
    *data_len = off;
    return 0;
}

const char *dcp_st_refusal(const dcp_entry *e)
{
    if (e->kind != DCP_KIND_TENSOR)
        return "a bytes item: safetensors holds tensors only";
    if (!dcp_dtype_safetensors(e->dtype))
        return "safetensors has no such dtype";
    if (!strcmp(e->key, "__metadata__"))
        return "safetensors reserves that name";
    if (!dcp_key_utf8(e->key))
        return "not UTF-8: safetensors names are UTF-8 text";
    return NULL;
}

int dcp_write_safetensors(const char *path, const dcp_item *items, size_t n, unsigned flags, const dcp_source *src,
                          dcp_progress_fn progress, void *pctx, dcp_error *err)
{
    unsigned char *hdr;
    uint64_t hlen, total;
    if (dcpw_st_header(items, n, path, &hdr, &hlen, &total, err) < 0)
        return -1;
    int fd;
    char tmp[4200];
    if (dcpw_tmp_create(path, tmp, sizeof tmp, &fd, err) < 0) {
        free(hdr);
        return -1;
    }
    zw_out out;
    unsigned char *piece = aligned_alloc(4096, PIECE);
    int rc = piece ? zw_out_init(&out, fd, 0, path, err) : dcpi_err(err, ENOMEM, "%s: out of memory", path);
    if (rc == 0) {
        rc = zw_out_write(&out, hdr, (size_t)hlen, err);
        uint64_t done = 0;
        for (size_t i = 0; i < n && rc == 0; i++)
            if (zw_pump(&out, NULL, src, items[i].tag, items[i].nbytes, piece, PIECE, &done, total, progress, pctx,
                        err) < 0)
                rc = dcpi_err_prefix(err, "%s: %s", path, items[i].key);
        if (rc == 0)
            rc = zw_out_flush(&out, err);
        zw_out_free(&out);
    }
    if (rc == 0 && !(flags & DCP_WRITE_NO_SYNC) && fsync(fd) < 0)
        rc = dcpi_err(err, errno, "%s: fsync: %s", path, strerror(errno));
    if (close(fd) < 0 && rc == 0)
        rc = dcpi_err(err, errno, "%s: close: %s", path, strerror(errno));
    if (rc == 0)
        rc = dcpw_rename(tmp, path, !!(flags & DCP_WRITE_NO_REPLACE), !(flags & DCP_WRITE_NO_SYNC), err);
    if (rc < 0)
        unlink(tmp);
    free(piece);
    free(hdr);
    return rc;
}

/* ------------------------------------------------------------ the view */

int dcp_st_view_build(dcp_checkpoint *ck, int (*select)(void *ctx, const dcp_entry *e), void *sctx,
                      dcp_st_view **out, dcp_error *err)
{
    *out = NULL;
    size_t n = dcp_num_entries(ck);
    dcp_st_view *l = calloc(1, sizeof *l);
    dcp_item *items = calloc(n ? n : 1, sizeof *items);
    if (l)
        l->tensors = calloc(n ? n : 1, sizeof *l->tensors);
    if (l)
        l->skipped = calloc(n ? n : 1, sizeof *l->skipped);
    if (!l || !items || !l->tensors || !l->skipped) {
        free(items);
        dcp_st_view_free(l);
        return dcpi_err(err, ENOMEM, "%s: out of memory", dcp_path(ck));
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const dcp_entry *e = dcp_entry_at(ck, i);
        if (!e) {   /* the first call reads every header: later ones cannot fail */
            free(items);
            dcp_st_view_free(l);
            return dcpi_err(err, ESTALE, "%s: the checkpoint changed while it was read", dcp_path(ck));
        }
        if (dcp_st_refusal(e)) {
            l->skipped[l->nskipped++] = e;
            continue;
        }
        if (select && !select(sctx, e))
            continue;
        items[m] = (dcp_item){.key = e->key, .kind = e->kind, .dtype = e->dtype, .ndim = e->ndim, .shape = e->shape,
                              .nbytes = dcp_entry_numel(e) * dcp_dtype_size(e->dtype), .tag = i};
        l->tensors[m].entry = e;
        m++;
    }
    uint64_t total;
    if (dcpw_st_header(items, m, dcp_path(ck), &l->header, &l->header_len, &total, err) < 0) {
        free(items);
        dcp_st_view_free(l);
        return -1;
    }
    uint64_t off = l->header_len;
    for (size_t i = 0; i < m; i++) {
        l->tensors[i].offset = off;
        l->tensors[i].length = items[i].nbytes;
        if (!dcpi_add_u64(off, items[i].nbytes, &off)) {
            dcpi_err(err, EFBIG, "%s: %s: the virtual file's size overflows", dcp_path(ck), items[i].key);
            free(items);
            dcp_st_view_free(l);
            return -1;
        }
    }
    l->ntensors = m;
    l->size = off;
    free(items);
    *out = l;
    return 0;
}

void dcp_st_view_free(dcp_st_view *l)
{
    if (!l)
        return;
    free(l->header);
    free(l->tensors);
    free(l->skipped);
    free(l);
}

/* Bytes [a, b) of tensor t (relative to its start) into dst, any alignment:
 * whole elements straight from the planner, partial ones through a small
 * bounce buffer. */
static int tensor_bytes(dcp_checkpoint *ck, const dcp_st_view_tensor *t, uint64_t a, uint64_t b,
                        unsigned char *dst, dcp_plan *plan, dcp_error *err)
{
    uint64_t esz = dcp_dtype_size(t->entry->dtype);
    while (a < b) {
        uint64_t ea = a - a % esz;
        if (ea != a || b - a < esz) {
            /* A partial element: fetch it whole. */
            unsigned char tmp[32];
            if (dcp_plan_bytes(ck, t->entry, ea, esz, plan, err) < 0 || dcp_plan_execute(ck, plan, tmp, err) < 0)
                return -1;
            uint64_t n = (ea + esz < b ? ea + esz : b) - a;
            memcpy(dst, tmp + (a - ea), (size_t)n);
            dst += n;
            a += n;
            continue;
        }
        uint64_t n = (b - a) - (b - a) % esz;
        if (dcp_plan_bytes(ck, t->entry, a, n, plan, err) < 0 || dcp_plan_execute(ck, plan, dst, err) < 0)
            return -1;
        dst += n;
        a += n;
    }
    return 0;
}

size_t dcp_st_view_find(const dcp_st_view_tensor *t, size_t n, uint64_t off)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t[mid].offset + t[mid].length <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int dcp_st_view_read(dcp_checkpoint *ck, const dcp_st_view *l, uint64_t off, void *buf, size_t len, size_t *got,
                     dcp_plan *plan, dcp_error *err)
{
    unsigned char *dst = buf;
    *got = 0;
    if (off >= l->size)
        return 0;
    if (len > l->size - off)
        len = (size_t)(l->size - off);
    uint64_t end = off + len;
    if (off < l->header_len) {
        size_t n = (size_t)((end < l->header_len ? end : l->header_len) - off);
        memcpy(dst, l->header + off, n);
        dst += n;
        off += n;
    }
    for (size_t i = dcp_st_view_find(l->tensors, l->ntensors, off); i < l->ntensors && off < end; i++) {
        const dcp_st_view_tensor *t = &l->tensors[i];
        uint64_t a = off - t->offset, b = (end < t->offset + t->length ? end : t->offset + t->length) - t->offset;
        if (b > a && tensor_bytes(ck, t, a, b, dst, plan, err) < 0)
            return -1;
        dst += b - a;
        off += b - a;
    }
    *got = len;
    return 0;
}
