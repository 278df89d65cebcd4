/* The torch.save writer: a dict of tensors (flat, or nested on dotted keys)
 * that torch.load(weights_only=True) accepts, in the zip layout of torch 2.13
 * (zip_write.c). data.pkl names every tensor's storage ("0", "1", ... in item
 * order) and is written first, so the whole pickle is built before any data;
 * tensor bytes then stream record by record through a bounded buffer. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcp_write.h"
#include "atomic.h"
#include "internal.h"
#include "pickle_write.h"
#include "zip_write.h"

#define PIECE (1u << 20)              /* bytes at a time: stays in L2 between read, CRC and write */

/* A tree of dotted key parts for DCP_WRITE_NESTED: children in first-seen order. */
typedef struct tnode {
    const char *name;        /* arena; the part of the key */
    size_t len;
    long item;               /* leaf: index into items; -1 for an inner dict */
    size_t first, next;      /* first child, next sibling (SIZE_MAX: none) */
    size_t last;             /* last child (for appending) */
} tnode;

typedef struct tree {
    tnode *n;
    size_t count, cap;
    dcpi_strmap index;       /* full prefix -> node */
} tree;

static int tree_add(tree *t, size_t parent, const char *full, size_t plen, const char *part, size_t len,
                    long item, size_t *out)
{
    uint64_t v;
    if (dcpi_strmap_get(&t->index, full, plen, &v)) {
        *out = (size_t)v;
        return 0;
    }
    if (t->count == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 64;
        tnode *nn = realloc(t->n, nc * sizeof *nn);
        if (!nn)
            return -1;
        t->n = nn;
        t->cap = nc;
    }
    size_t i = t->count++;
    t->n[i] = (tnode){.name = part, .len = len, .item = item, .first = SIZE_MAX, .next = SIZE_MAX, .last = SIZE_MAX};
    if (parent != SIZE_MAX) {
        tnode *p = &t->n[parent];
        if (p->first == SIZE_MAX)
            p->first = i;
        else
            t->n[p->last].next = i;
        p->last = i;
    }
    if (dcpi_strmap_put(&t->index, full, plen, i) < 0)
        return -1;
    *out = i;
    return 0;
}

typedef struct ctx {
    const dcp_item *items;
    size_t n;
    const dcp_source *src;
    unsigned char *piece;
    const char *path;
    dcp_error *err;
} ctx;

static int value(ctx *c, pw *p, size_t i, const char *storage_key)
{
    const dcp_item *it = &c->items[i];
    if (it->kind == DCP_KIND_TENSOR) {
        pw_torch_tensor(p, it->dtype, it->ndim, it->shape, storage_key);
        return 0;
    }
    if (it->nbytes > DCP_WRITE_BYTES_MAX)   /* checked up front; kept for the allocation below */
        return dcpi_err(c->err, EFBIG, "%s: %s: bytes item of %" PRIu64 " bytes is too large", c->path, it->key,
                        it->nbytes);
    unsigned char *b = malloc(it->nbytes ? it->nbytes : 1);
    if (!b)
        return dcpi_err(c->err, ENOMEM, "%s: %s: out of memory", c->path, it->key);
    if (c->src->fill(c->src->ctx, it->tag, 0, b, (size_t)it->nbytes, c->err) < 0) {
        free(b);
        return dcpi_err_prefix(c->err, "%s: %s", c->path, it->key);
    }
    pw_bytes(p, b, (size_t)it->nbytes);
    free(b);
    return 0;
}

static int emit_node(ctx *c, pw *p, const tree *t, size_t node, const char **keys, int depth)
{
    if (depth > 60)
        return dcpi_err(c->err, EINVAL, "%s: keys nested too deeply", c->path);
    const tnode *n = &t->n[node];
    if (n->item >= 0)
        return value(c, p, (size_t)n->item, keys[n->item]);
    pw_dict_begin(p);
    for (size_t ch = n->first; ch != SIZE_MAX; ch = t->n[ch].next) {
        pw_dict_key(p);
        pw_str_shared(p, t->n[ch].name, t->n[ch].len);
        if (emit_node(c, p, t, ch, keys, depth + 1) < 0)
            return -1;
    }
    pw_dict_end(p);
    return 0;
}

/* data.pkl of the whole file: storage keys are the tensors' ordinals. */
static int build_pickle(ctx *c, unsigned flags, pw *p, char **keys)
{
    if (!(flags & DCP_WRITE_NESTED)) {
        pw_dict_begin(p);
        for (size_t i = 0; i < c->n; i++) {
            pw_dict_key(p);
            pw_str(p, c->items[i].key, strlen(c->items[i].key));
            if (value(c, p, i, keys[i]) < 0)
                return -1;
        }
        pw_dict_end(p);
        return 0;
    }
    tree t = {0};
    dcpi_strmap_init(&t.index);
    int rc = 0;
    size_t root;
    if (tree_add(&t, SIZE_MAX, "", 0, "", 0, -1, &root) < 0)
        rc = dcpi_err(c->err, ENOMEM, "%s: out of memory", c->path);
    for (size_t i = 0; i < c->n && rc == 0; i++) {
        const char *k = c->items[i].key;
        size_t parent = root, kl = strlen(k);
        for (size_t s = 0;;) {
            const char *dot = memchr(k + s, '.', kl - s);
            size_t e = dot ? (size_t)(dot - k) : kl, node;
            uint64_t v;
            int leaf = !dot;
            if (dcpi_strmap_get(&t.index, k, e, &v) && (leaf || t.n[v].item >= 0)) {
                rc = dcpi_err(c->err, EINVAL, "%s: %s: key clashes with another when nested (use a flat dict)",
                              c->path, k);
                break;
            }
            if (tree_add(&t, parent, k, e, k + s, e - s, leaf ? (long)i : -1, &node) < 0) {
                rc = dcpi_err(c->err, ENOMEM, "%s: out of memory", c->path);
                break;
            }
            if (leaf)
                break;
            parent = node;
            s = e + 1;
        }
    }
    if (rc == 0)
        rc = emit_node(c, p, &t, root, (const char **)keys, 0);
    free(t.n);
    dcpi_strmap_free(&t.index);
    return rc;
}

static const char *stem(const char *path, char *buf, size_t n)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    const char *dot = strrchr(b, '.');
    size_t l = dot && dot != b ? (size_t)(dot - b) : strlen(b);
    if (l >= n)
        l = n - 1;
    memcpy(buf, b, l);
    buf[l] = 0;
    return l ? buf : "archive";
}

int dcp_write_torch_save(const char *path, const char *archive_name, const dcp_item *items, size_t n,
                         unsigned flags, const dcp_source *src, dcp_progress_fn progress, void *pctx,
                         dcp_error *err)
{
    ctx c = {items, n, src, NULL, path, err};
    char **keys = calloc(n ? n : 1, sizeof *keys);
    char root[200];
    uint64_t total = 0, done = 0;
    if (!keys)
        return dcpi_err(err, ENOMEM, "%s: out of memory", path);
    int rc = 0;
    size_t ntensors = 0;
    /* Bytes items are pickled whole into data.pkl, which is built in memory
     * before any data is written: bound their total before reading any. */
    uint64_t bytes_total = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (items[i].kind != DCP_KIND_TENSOR &&
            (!dcpi_add_u64(bytes_total, items[i].nbytes, &bytes_total) || bytes_total > DCP_WRITE_BYTES_MAX))
            rc = dcpi_err(err, EFBIG,
                          "%s: %s: bytes items would total more than %llu bytes (they are held in memory in data.pkl)",
                          path, items[i].key, (unsigned long long)DCP_WRITE_BYTES_MAX);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (items[i].kind != DCP_KIND_TENSOR)
            continue;
        char k[24];
        snprintf(k, sizeof k, "%zu", ntensors++);
        if (!(keys[i] = strdup(k)))
            rc = dcpi_err(err, ENOMEM, "%s: out of memory", path);
        total += items[i].nbytes;
    }
    pw p;
    pw_init(&p, 2, -1, path);
    if (rc == 0)
        rc = build_pickle(&c, flags, &p, keys);
    if (rc == 0)
        rc = pw_finish(&p, err);
    int fd = -1;
    zw_out out = {.fd = -1};
    zw z = {0};
    char tmp[4200] = "";
    if (rc == 0)
        rc = dcpw_tmp_create(path, tmp, sizeof tmp, &fd, err);
    if (rc == 0)
        rc = zw_out_init(&out, fd, 0, path, err);
    if (rc == 0)
        rc = zw_begin(&z, &out, archive_name ? archive_name : stem(path, root, sizeof root), err);
    z.no_crc = !!(flags & DCP_WRITE_NO_CRC);
    if (rc == 0)
        rc = zw_torch_prologue(&z, p.buf, p.len, err);
    pw_free(&p);
    c.piece = rc == 0 ? aligned_alloc(4096, PIECE) : NULL;
    if (rc == 0 && !c.piece)
        rc = dcpi_err(err, ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const dcp_item *it = &items[i];
        if (it->kind != DCP_KIND_TENSOR)
            continue;
        char rname[40];
        snprintf(rname, sizeof rname, "data/%s", keys[i]);
        rc = zw_record_begin(&z, rname, it->nbytes, err);
        if (rc == 0 && zw_pump(&out, &z, src, it->tag, it->nbytes, c.piece, PIECE, &done, total, progress, pctx, err) < 0)
            rc = dcpi_err_prefix(err, "%s: %s", path, it->key);
        if (rc == 0)
            rc = zw_record_end(&z, err);
    }
    if (rc == 0)
        rc = zw_finish(&z, NULL, err);
    if (rc == 0)
        rc = zw_out_flush(&out, err);
    if (rc == 0 && !(flags & DCP_WRITE_NO_SYNC) && fsync(fd) < 0)
        rc = dcpi_err(err, errno, "%s: fsync: %s", path, strerror(errno));
    if (fd >= 0 && close(fd) < 0 && rc == 0)
        rc = dcpi_err(err, errno, "%s: close: %s", path, strerror(errno));
    if (rc == 0)
        rc = dcpw_rename(tmp, path, !!(flags & DCP_WRITE_NO_REPLACE), !(flags & DCP_WRITE_NO_SYNC), err);
    if (rc < 0 && fd >= 0)
        unlink(tmp);
    zw_free(&z);
    zw_out_free(&out);
    free(c.piece);
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
    return rc;
}
