/* The torch.save writer: a dict of tensors (flat, or nested as the source
 * nested them, else on dotted keys)
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
#include "keypaths.h"
#include "pickle.h"
#include "pickle_write.h"
#include "zip_write.h"

#define PIECE (1u << 20)              /* bytes at a time: stays in L2 between read, CRC and write */

/* The nesting for DCP_WRITE_NESTED: each key's path (its source's, as torch's
 * planner_data records it, or its dot-separated parts), as a tree whose
 * inner nodes become dicts (str parts) or lists (int parts), as torch's
 * unflatten_state_dict rebuilds them. Children in first-seen order; a list's
 * are sorted by index when written, gaps holding None as torch leaves them. */
#define LIST_SLOTS_MAX (1u << 20)    /* list elements in all, None gaps included */

enum { T_LEAF, T_NEW, T_DICT, T_LIST };

typedef struct tnode {
    dcp_path_part part;      /* its key in the parent: str (not owned) or index */
    int kind;                /* T_LEAF (item), T_NEW (inner, no child yet), T_DICT, T_LIST */
    size_t item;             /* T_LEAF: index into items */
    size_t first, next;      /* first child, next sibling (SIZE_MAX: none) */
    size_t last;             /* last child (for appending) */
    int64_t max_index;       /* T_LIST: the largest child index */
} tnode;

typedef struct tree {
    tnode *n;
    size_t count, cap;
    dcpi_strmap index;       /* (parent, part) -> node */
    dcpi_arena arena;        /* the index's keys */
    uint64_t list_slots;
} tree;

/* The node under parent for part, made (as kind) if new: 1 made, 0 found, -1 out of memory. */
static int tree_child(tree *t, size_t parent, dcp_path_part part, int kind, size_t *out)
{
    size_t plen = part.str ? part.len : sizeof part.index;
    char *k = dcpi_arena_alloc(&t->arena, sizeof parent + 1 + plen);
    if (!k)
        return -1;
    memcpy(k, &parent, sizeof parent);
    k[sizeof parent] = part.str ? 's' : 'i';
    memcpy(k + sizeof parent + 1, part.str ? (const void *)part.str : (const void *)&part.index, plen);
    uint64_t v;
    if (dcpi_strmap_get(&t->index, k, sizeof parent + 1 + plen, &v)) {
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
    t->n[i] = (tnode){.part = part, .kind = kind, .first = SIZE_MAX, .next = SIZE_MAX, .last = SIZE_MAX};
    if (parent != SIZE_MAX) {
        tnode *p = &t->n[parent];
        if (p->first == SIZE_MAX)
            p->first = i;
        else
            t->n[p->last].next = i;
        p->last = i;
    }
    if (dcpi_strmap_put(&t->index, k, sizeof parent + 1 + plen, i) < 0)
        return -1;
    *out = i;
    return 1;
}

typedef struct ctx {
    const dcp_item *items;
    size_t n;
    const pk_node *const *values;   /* bytes items written as these values (NULL: as bytes) */
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
    if (c->values && c->values[i]) {   /* bounded and plain: the caller rendered it once */
        if (pw_value(p, c->values[i], UINT64_MAX) < 0)
            return dcpi_err(c->err, EINVAL, "%s: %s: the value cannot be written", c->path, it->key);
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
    if (depth > 4100)   /* paths have at most 4096 parts (dcp_ckpt_set_path) */
        return dcpi_err(c->err, EINVAL, "%s: keys nested too deeply", c->path);
    const tnode *n = &t->n[node];
    if (n->kind == T_LEAF)
        return value(c, p, n->item, keys[n->item]);
    if (n->kind == T_LIST) {
        size_t nch = 0, *ch = malloc((size_t)(n->max_index + 1) * sizeof *ch);
        if (!ch)
            return dcpi_err(c->err, ENOMEM, "%s: out of memory", c->path);
        for (size_t k = 0; k <= (size_t)n->max_index; k++)
            ch[k] = SIZE_MAX;
        for (size_t k = n->first; k != SIZE_MAX; k = t->n[k].next, nch++)
            ch[t->n[k].part.index] = k;
        pw_list_begin(p);
        int rc = 0;
        for (size_t k = 0; k <= (size_t)n->max_index && rc == 0; k++) {
            pw_list_elem(p);
            if (ch[k] == SIZE_MAX)
                pw_none(p);
            else
                rc = emit_node(c, p, t, ch[k], keys, depth + 1);
        }
        pw_list_end(p);
        free(ch);
        return rc;
    }
    pw_dict_begin(p);
    for (size_t ch = n->first; ch != SIZE_MAX; ch = t->n[ch].next) {
        pw_dict_key(p);
        if (t->n[ch].part.str)
            pw_str_shared(p, t->n[ch].part.str, t->n[ch].part.len);
        else   /* an int at the top: torch makes it a key of the root dict */
            pw_int(p, t->n[ch].part.index);
        if (emit_node(c, p, t, ch, keys, depth + 1) < 0)
            return -1;
    }
    pw_dict_end(p);
    return 0;
}

/* Put item i at its path under the root (node 0). */
static int tree_place(ctx *c, tree *t, size_t i, const dcp_path_part *parts, size_t np)
{
    const char *key = c->items[i].key;
    size_t node = 0;
    for (size_t k = 0; k < np; k++) {
        int leaf = k + 1 == np;
        size_t child;
        int made = tree_child(t, node, parts[k], leaf ? T_LEAF : T_NEW, &child);
        if (made < 0)
            return dcpi_err(c->err, ENOMEM, "%s: out of memory", c->path);
        tnode *pn = &t->n[node];
        int want = parts[k].str || node == 0 ? T_DICT : T_LIST;
        if (!made && (leaf || t->n[child].kind == T_LEAF))
            return dcpi_err(c->err, EINVAL, "%s: %s: key clashes with another when nested (use a flat dict)",
                            c->path, key);
        if (pn->kind != T_NEW && pn->kind != want)
            return dcpi_err(c->err, EINVAL,
                            "%s: %s: key's path puts a %s where another key's puts a %s (use a flat dict)",
                            c->path, key, want == T_LIST ? "list index" : "dict key",
                            want == T_LIST ? "dict key" : "list index");
        pn->kind = want;
        if (want == T_LIST && made) {
            if (parts[k].index < 0 || (uint64_t)parts[k].index >= LIST_SLOTS_MAX)
                return dcpi_err(c->err, EINVAL, "%s: %s: list index %" PRId64 " is out of range for a .pt", c->path,
                                key, parts[k].index);
            if (parts[k].index > pn->max_index || pn->first == child) {
                uint64_t before = pn->first == child ? 0 : (uint64_t)pn->max_index + 1;
                t->list_slots += (uint64_t)parts[k].index + 1 - before;
                pn->max_index = parts[k].index;
                if (t->list_slots > LIST_SLOTS_MAX)
                    return dcpi_err(c->err, EINVAL, "%s: %s: lists would hold more than %u elements in all", c->path,
                                    key, LIST_SLOTS_MAX);
            }
        }
        if (leaf)
            t->n[child].item = i;
        node = child;
    }
    return 0;
}

/* data.pkl of the whole file: storage keys are the tensors' ordinals. */
static int build_pickle(ctx *c, unsigned flags, const dcpw_keypaths *paths, pw *p, char **keys)
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
    dcpi_arena_init(&t.arena);
    dcp_path_part *split = NULL;
    size_t root;
    int rc = 0;
    if (tree_child(&t, SIZE_MAX, (dcp_path_part){.str = "", .len = 0}, T_DICT, &root) < 0)
        rc = dcpi_err(c->err, ENOMEM, "%s: out of memory", c->path);
    for (size_t i = 0; i < c->n && rc == 0; i++) {
        const char *k = c->items[i].key;
        size_t kl = strlen(k), np;
        const dcp_path_part *path = dcpw_kp_get(paths, k, &np);
        if (!path || !dcpw_path_spells(k, kl, path, np)) {   /* no path known: its dotted parts */
            free(split);
            np = 1;
            for (size_t s = 0; s < kl; s++)
                np += k[s] == '.';
            if (!(split = malloc(np * sizeof *split))) {
                rc = dcpi_err(c->err, ENOMEM, "%s: out of memory", c->path);
                break;
            }
            for (size_t s = 0, j = 0; j < np; j++) {
                const char *dot = memchr(k + s, '.', kl - s);
                size_t e = dot ? (size_t)(dot - k) : kl;
                split[j] = (dcp_path_part){.str = k + s, .len = e - s};
                s = e + 1;
            }
            path = split;
        }
        rc = tree_place(c, &t, i, path, np);
    }
    if (rc == 0)
        rc = emit_node(c, p, &t, root, (const char **)keys, 0);
    free(split);
    free(t.n);
    dcpi_strmap_free(&t.index);
    dcpi_arena_free(&t.arena);
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
    return dcpw_write_torch_save(path, archive_name, items, n, flags, NULL, NULL, src, progress, pctx, err);
}

int dcpw_write_torch_save(const char *path, const char *archive_name, const dcp_item *items, size_t n,
                          unsigned flags, const dcpw_keypaths *paths, const pk_node *const *values,
                          const dcp_source *src, dcp_progress_fn progress, void *pctx, dcp_error *err)
{
    ctx c = {items, n, values, src, NULL, path, err};
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
        if (items[i].kind != DCP_KIND_TENSOR && !(values && values[i]) &&
            (!dcpi_add_u64(bytes_total, items[i].nbytes, &bytes_total) || bytes_total > DCP_WRITE_BYTES_MAX))
            rc = dcpi_err(err, EFBIG,
                          "%s: %s: bytes items would total more than %llu bytes (they are held in memory in data.pkl)",
                          path, items[i].key, (unsigned long long)DCP_WRITE_BYTES_MAX);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (items[i].kind != DCP_KIND_TENSOR)
            continue;
        /* A shape torch.save cannot write either (its strides overflow int64:
         * [0, 2^62, 2^62]) is refused before anything is created, naming
         * the key; the pickle's own failure would name only the file. */
        if (pw_tensor_shape_check(path, items[i].key, items[i].ndim, items[i].shape, err) < 0) {
            rc = -1;
            break;
        }
        char k[24];
        snprintf(k, sizeof k, "%zu", ntensors++);
        if (!(keys[i] = strdup(k)))
            rc = dcpi_err(err, ENOMEM, "%s: out of memory", path);
        total += items[i].nbytes;
    }
    pw p;
    pw_init(&p, 2, -1, path);
    if (rc == 0)
        rc = build_pickle(&c, flags, paths, &p, keys);
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
