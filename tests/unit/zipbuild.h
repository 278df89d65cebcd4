/* Test helpers for the record locator: build torch.save-like zip archives and
 * data.pkl pickles byte by byte, so tests can corrupt any field. */
#ifndef ZIPBUILD_H
#define ZIPBUILD_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ a byte buffer */

typedef struct zb_buf {
    unsigned char *p;
    size_t n, cap;
} zb_buf;

static inline void zb_put(zb_buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p)
            abort();
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, src, n);
    b->n += n;
}

static inline void zb_le(zb_buf *b, uint64_t v, int bytes)
{
    unsigned char t[8];
    for (int i = 0; i < bytes; i++)
        t[i] = (unsigned char)(v >> (8 * i));
    zb_put(b, t, (size_t)bytes);
}

static inline void zb_set_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* ------------------------------------------------------------ zip archives */

typedef struct zb_rec {
    const char *name;
    const void *data;
    size_t len;
} zb_rec;

enum {
    ZB_ZIP64_EXTRA = 1u << 0,   /* central directory: all sizes and offsets in a 0x0001 extra */
    ZB_NO_ALIGN = 1u << 1       /* no "FB" padding extra in local headers */
};

/* Where the builder put things, for corrupting them afterwards. */
typedef struct zb_layout {
    size_t local[16];      /* local header offsets */
    size_t data[16];       /* record data offsets */
    size_t cdent[16];      /* central directory entry offsets */
    size_t cd, cd_size, z64eocd, locator, eocd;
} zb_layout;

/* A torch.save-style archive: stored records with zero sizes in the local
 * headers, data aligned to 64 by an "FB" extra, a data descriptor after each
 * non-empty record, a central directory, zip64 EOCD + locator + EOCD. */
static inline zb_buf zb_zip(const zb_rec *recs, int n, unsigned flags, zb_layout *lay)
{
    zb_buf b = {0};
    zb_layout dummy;
    if (!lay)
        lay = &dummy;
    memset(lay, 0, sizeof *lay);
    for (int i = 0; i < n; i++) {
        size_t nl = strlen(recs[i].name);
        lay->local[i] = b.n;
        size_t start = b.n + 30 + nl, pad = 0;
        if (!(flags & ZB_NO_ALIGN)) {
            pad = (64 - (start + 4) % 64) % 64;
            pad += 4;
        }
        zb_put(&b, "PK\3\4", 4);
        zb_le(&b, 0, 2);                             /* version needed */
        zb_le(&b, recs[i].len ? 0x0808 : 0x0800, 2); /* data descriptor, UTF-8 */
        zb_le(&b, 0, 2);                             /* method: stored */
        zb_le(&b, 0, 4);                             /* time, date */
        zb_le(&b, 0, 4);                             /* crc */
        zb_le(&b, 0, 4);                             /* csize */
        zb_le(&b, 0, 4);                             /* usize */
        zb_le(&b, nl, 2);
        zb_le(&b, pad, 2);
        zb_put(&b, recs[i].name, nl);
        if (pad) {
            zb_le(&b, 0x4246, 2);
            zb_le(&b, pad - 4, 2);
            for (size_t k = 0; k < pad - 4; k++)
                zb_put(&b, "Z", 1);
        }
        lay->data[i] = b.n;
        zb_put(&b, recs[i].data, recs[i].len);
        if (recs[i].len) {
            zb_put(&b, "PK\7\10", 4);
            zb_le(&b, 0, 4);
            zb_le(&b, recs[i].len, 4);
            zb_le(&b, recs[i].len, 4);
        }
    }
    lay->cd = b.n;
    for (int i = 0; i < n; i++) {
        size_t nl = strlen(recs[i].name);
        int z64 = (flags & ZB_ZIP64_EXTRA) != 0;
        lay->cdent[i] = b.n;
        zb_put(&b, "PK\1\2", 4);
        zb_le(&b, 45, 2);
        zb_le(&b, 45, 2);
        zb_le(&b, recs[i].len ? 0x0808 : 0x0800, 2);
        zb_le(&b, 0, 2);                             /* method */
        zb_le(&b, 0, 4);                             /* time, date */
        zb_le(&b, 0, 4);                             /* crc (not checked) */
        zb_le(&b, z64 ? 0xffffffffu : recs[i].len, 4);
        zb_le(&b, z64 ? 0xffffffffu : recs[i].len, 4);
        zb_le(&b, nl, 2);
        zb_le(&b, z64 ? 28 : 0, 2);                  /* extra */
        zb_le(&b, 0, 2);                             /* comment */
        zb_le(&b, 0, 2);                             /* disk */
        zb_le(&b, 0, 2);                             /* internal attributes */
        zb_le(&b, 0, 4);                             /* external attributes */
        zb_le(&b, z64 ? 0xffffffffu : lay->local[i], 4);
        zb_put(&b, recs[i].name, nl);
        if (z64) {
            zb_le(&b, 1, 2);
            zb_le(&b, 24, 2);
            zb_le(&b, recs[i].len, 8);
            zb_le(&b, recs[i].len, 8);
            zb_le(&b, lay->local[i], 8);
        }
    }
    lay->cd_size = b.n - lay->cd;
    lay->z64eocd = b.n;
    zb_put(&b, "PK\6\6", 4);
    zb_le(&b, 44, 8);
    zb_le(&b, 45, 2);
    zb_le(&b, 45, 2);
    zb_le(&b, 0, 4);
    zb_le(&b, 0, 4);
    zb_le(&b, (uint64_t)n, 8);
    zb_le(&b, (uint64_t)n, 8);
    zb_le(&b, lay->cd_size, 8);
    zb_le(&b, lay->cd, 8);
    lay->locator = b.n;
    zb_put(&b, "PK\6\7", 4);
    zb_le(&b, 0, 4);
    zb_le(&b, lay->z64eocd, 8);
    zb_le(&b, 1, 4);
    lay->eocd = b.n;
    zb_put(&b, "PK\5\6", 4);
    zb_le(&b, 0, 2);
    zb_le(&b, 0, 2);
    zb_le(&b, (flags & ZB_ZIP64_EXTRA) ? 0xffff : (uint64_t)n, 2);
    zb_le(&b, (flags & ZB_ZIP64_EXTRA) ? 0xffff : (uint64_t)n, 2);
    zb_le(&b, (flags & ZB_ZIP64_EXTRA) ? 0xffffffffu : lay->cd_size, 4);
    zb_le(&b, (flags & ZB_ZIP64_EXTRA) ? 0xffffffffu : lay->cd, 4);
    zb_le(&b, 0, 2);
    return b;
}

/* ------------------------------------------------------------ data.pkl */

/* Protocol-2 pickle pieces, as torch.save's data.pkl uses them. */
static inline void pb_op(zb_buf *b, const char *ops) { zb_put(b, ops, strlen(ops)); }
static inline void pb_byte(zb_buf *b, int c)
{
    unsigned char ch = (unsigned char)c;
    zb_put(b, &ch, 1);
}
static inline void pb_global(zb_buf *b, const char *mod, const char *name)
{
    pb_byte(b, 'c');
    pb_op(b, mod);
    pb_byte(b, '\n');
    pb_op(b, name);
    pb_byte(b, '\n');
}
static inline void pb_str(zb_buf *b, const char *s)
{
    pb_byte(b, 'X');
    zb_le(b, strlen(s), 4);
    pb_op(b, s);
}
static inline void pb_int(zb_buf *b, int64_t v)
{
    if (v >= INT32_MIN && v <= INT32_MAX) {
        pb_byte(b, 'J');
        zb_le(b, (uint64_t)v, 4);
    } else {
        pb_byte(b, 0x8a);   /* LONG1, 8 bytes two's complement */
        pb_byte(b, 8);
        zb_le(b, (uint64_t)v, 8);
    }
}
static inline void pb_ints(zb_buf *b, const int64_t *v, int n)
{
    pb_byte(b, '(');
    for (int i = 0; i < n; i++)
        pb_int(b, v[i]);
    pb_byte(b, 't');
}

/* What a tensor data.pkl says. */
typedef struct pb_tensor {
    int v3;                         /* _rebuild_tensor_v3 with a dtype global */
    const char *storage;            /* "FloatStorage", "UntypedStorage" */
    const char *dtype;              /* v3: "float8_e4m3fn" */
    const char *key;                /* "0" */
    int64_t numel;                  /* elements (typed) or bytes (untyped) */
    int64_t storage_offset;
    int ndim;
    int64_t size[8], stride[8];
    const char *meta_key;           /* "conj" / "neg": a metadata dict {key: True} */
    const char *wrap;               /* "parameter", "from_type" or NULL */
} pb_tensor;

/* The argument tuple of _rebuild_tensor_v2/v3. */
static inline void pb_rebuild_args(zb_buf *b, const pb_tensor *t)
{
    pb_byte(b, '(');
    pb_byte(b, '(');                                      /* persistent id */
    pb_str(b, "storage");
    /* torch 2.x writes torch.storage.UntypedStorage, typed storages as torch.<X>Storage */
    pb_global(b, strcmp(t->storage, "UntypedStorage") ? "torch" : "torch.storage", t->storage);
    pb_str(b, t->key ? t->key : "0");
    pb_str(b, "cpu");
    pb_int(b, t->numel);
    pb_byte(b, 't');
    pb_byte(b, 'Q');                                      /* BINPERSID */
    pb_int(b, t->storage_offset);
    pb_ints(b, t->size, t->ndim);
    pb_ints(b, t->stride, t->ndim);
    pb_byte(b, 0x89);                                     /* requires_grad False */
    pb_global(b, "collections", "OrderedDict");
    pb_op(b, ")R");
    if (t->v3)
        pb_global(b, "torch", t->dtype);
    if (t->meta_key) {
        pb_byte(b, '}');
        pb_str(b, t->meta_key);
        pb_byte(b, 0x88);                                 /* True */
        pb_byte(b, 's');
    }
    pb_byte(b, 't');
}

static inline zb_buf pb_tensor_pkl(const pb_tensor *t)
{
    zb_buf b = {0};
    const char *fn = t->v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2";
    pb_op(&b, "\x80\x02");
    if (t->wrap && !strcmp(t->wrap, "from_type")) {       /* (func, type, args, state) */
        pb_global(&b, "torch._tensor", "_rebuild_from_type_v2");
        pb_byte(&b, '(');
        pb_global(&b, "torch._utils", fn);
        pb_global(&b, "torch", "Tensor");
        pb_rebuild_args(&b, t);
        pb_byte(&b, '}');
        pb_byte(&b, 't');
        pb_byte(&b, 'R');
    } else if (t->wrap && !strcmp(t->wrap, "parameter")) {   /* (data, requires_grad, hooks) */
        pb_global(&b, "torch._utils", "_rebuild_parameter");
        pb_byte(&b, '(');
        pb_global(&b, "torch._utils", fn);
        pb_rebuild_args(&b, t);
        pb_byte(&b, 'R');
        pb_byte(&b, 0x89);
        pb_global(&b, "collections", "OrderedDict");
        pb_op(&b, ")R");
        pb_byte(&b, 't');
        pb_byte(&b, 'R');
    } else {
        pb_global(&b, "torch._utils", fn);
        pb_rebuild_args(&b, t);
        pb_byte(&b, 'R');
    }
    pb_byte(&b, '.');
    return b;
}

/* An archive holding data.pkl, byteorder (unless NULL) and data/<key>. */
static inline zb_buf zb_tensor_zip(const pb_tensor *t, const char *byteorder, const void *data, size_t len,
                                   unsigned flags, zb_layout *lay)
{
    zb_buf pkl = pb_tensor_pkl(t);
    char rname[64];
    snprintf(rname, sizeof rname, "archive/data/%s", t->key ? t->key : "0");
    zb_rec recs[4];
    int n = 0;
    recs[n++] = (zb_rec){"archive/data.pkl", pkl.p, pkl.n};
    if (byteorder)
        recs[n++] = (zb_rec){"archive/byteorder", byteorder, strlen(byteorder)};
    recs[n++] = (zb_rec){rname, data, len};
    recs[n++] = (zb_rec){"archive/version", "3\n", 2};
    zb_buf z = zb_zip(recs, n, flags, lay);
    free(pkl.p);
    return z;
}

#endif
