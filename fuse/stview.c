/* dcpfs: all.safetensors, every tensor of a checkpoint as one safetensors file.
 *
 * The file sits in each checkpoint's root directory. Its name cannot be a
 * key's: encoded key components never contain a dot, and the only names with
 * one that keys produce end in ".data" or ".npy" (names.h); plain files of
 * the checkpoint folder ending in ".safetensors" are data files and never
 * shown. So a key named "all.safetensors" is the file all/safetensors, and a
 * key "all" is all (all.data beside a directory all/, all.npy in the npy view).
 *
 * The layout (the JSON header, each tensor's place) comes from
 * dcp_st_view_build and is computed on the first lookup, stat or read of the
 * file, not when the checkpoint is opened: a mount of a checkpoint of many
 * keys stays fast, and one that never touches the file never pays for it.
 * Reads are served like tensor files (read.c): the header from memory, tensor
 * bytes planned per request, never a whole tensor. Left out, as the format
 * has no place for them: bytes items, tensors of dtypes safetensors cannot
 * name, and a key "__metadata__" (the format's reserved name; logged).
 */
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "dcpfs.h"

struct stview {
    pthread_mutex_t lock;   /* serialises building */
    _Atomic int state;      /* 0 not built, 1 built, -errno when building failed for good */
    dcp_st_view *view;
};

struct select_ctx {
    struct dfs_ckpt *ck;
    uint64_t total;         /* tensor bytes accepted so far */
};

/* Which tensors go in: those with a size that adds up (the view itself
 * leaves out, and counts, what the format cannot hold). */
static int select_entry(void *p, const dcp_entry *e)
{
    struct select_ctx *s = p;
    uint64_t nb;
    dcp_error err;
    if (dcp_entry_nbytes(s->ck->ck, e, &nb, &err) < 0 || nb > (uint64_t)INT64_MAX - s->total) {
        dfs_log(LOG_WARNING, "%s: %s: not in %s: its size is not representable", s->ck->path, e->key,
                DFS_STVIEW_NAME);
        return 0;
    }
    s->total += nb;
    return 1;
}

/* Lay the view out: 1, or -errno (logged). */
static int build(struct dfs_node *n, struct stview *v)
{
    struct select_ctx sc = {.ck = n->ck};
    dcp_error err;
    int rc = dcp_st_view_build(n->ck->ck, select_entry, &sc, &v->view, &err);
    /* Building the JSON header takes far more memory than the header keeps
     * (about 1 KiB per key): hand the freed pages back. */
    malloc_trim(0);
    if (rc < 0) {
        dfs_log(LOG_ERR, "%s (laying out %s)", err.msg, DFS_STVIEW_NAME);
        return -DFS_REPLY_ERRNO(err.code);
    }
    for (size_t i = 0; i < v->view->nskipped; i++) {   /* tensors left out: say why */
        const dcp_entry *e = v->view->skipped[i];
        if (e->kind == DCP_KIND_TENSOR)
            dfs_log(LOG_WARNING, "%s: %s: not in %s: %s", n->ck->path, e->key, DFS_STVIEW_NAME, dcp_st_refusal(e));
    }
    dfs_log(LOG_INFO, "%s/%s: laid out: %zu tensors, %zu items left out, a header of %llu bytes", n->ck->path,
            DFS_STVIEW_NAME, v->view->ntensors, v->view->nskipped, (unsigned long long)v->view->header_len);
    if (v->view->size > (uint64_t)INT64_MAX) {
        dfs_log(LOG_ERR, "%s/%s: too large", n->ck->path, DFS_STVIEW_NAME);
        return -EFBIG;
    }
    return 1;
}

static int stview_layout(struct dfs_node *n, struct dfs_layout *out)
{
    struct stview *v = n->vdata;
    int st = atomic_load(&v->state);
    if (st == 0) {
        pthread_mutex_lock(&v->lock);
        st = atomic_load(&v->state);
        if (st == 0) {
            st = build(n, v);
            /* Out of memory may pass: try again next time. Anything else is
             * the checkpoint's and stays (it is immutable). */
            if (st != -ENOMEM)
                atomic_store(&v->state, st);
            else {
                dcp_st_view_free(v->view);
                v->view = NULL;
            }
        }
        pthread_mutex_unlock(&v->lock);
    }
    if (st < 0)
        return st;
    const dcp_st_view *l = v->view;
    *out = (struct dfs_layout){.hdr = l->header, .hdr_len = l->header_len, .segs = l->tensors,
                               .nsegs = l->ntensors, .size = l->size};
    return 0;
}

static void stview_destroy(struct dfs_node *n)
{
    struct stview *v = n->vdata;
    if (!v)
        return;
    dcp_st_view_free(v->view);
    pthread_mutex_destroy(&v->lock);
    free(v);
    n->vdata = NULL;
}

static const struct dfs_vfile_ops stview_ops = {
    .layout = stview_layout,
    .destroy = stview_destroy,
};

struct dfs_node *dfs_stview_new(struct dfs *fs, struct dfs_node *root)
{
    struct stview *v = calloc(1, sizeof *v);
    if (!v)
        return NULL;
    struct dfs_node *n = dfs_node_new(fs, root, DFS_STVIEW_NAME, strlen(DFS_STVIEW_NAME), DFS_N_VIRTUAL);
    if (!n) {
        free(v);
        return NULL;
    }
    pthread_mutex_init(&v->lock, NULL);
    atomic_init(&v->state, 0);
    n->vdata = v;
    n->vops = &stview_ops;
    return n;
}
