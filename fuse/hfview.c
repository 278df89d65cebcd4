/* dcpfs: -o view=hf:RECIPE, each checkpoint as the Hugging Face model folder
 * that `dcp convert --to hf --recipe RECIPE` would write: config.json,
 * model.safetensors (or model.safetensors.index.json and
 * model-0000I-of-0000N.safetensors), so that a mount can be handed to
 * transformers' from_pretrained as it is.
 *
 * libdcp lays the folder out (dcp_hf_view_build: keys mapped, shards
 * assigned, headers and JSON made) when the checkpoint is opened, so a
 * recipe error (an unmapped key, a missing parameter) fails the checkpoint
 * (and, for a single checkpoint, the mount) with the export's message; and
 * renders the bytes of any range of any file on read (dcp_hf_view_read):
 * only the rows of the output tensors a request touches are read and
 * reshaped or cast, into the thread's buffer (read.c). The layout is the
 * export's own, so the mount and an export are the same bytes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dcpfs.h"

/* A node's vdata: the file's index in its checkpoint's view (ck->hf). */
static size_t file_index(const struct dfs_node *n)
{
    return (size_t)(uintptr_t)n->vdata;
}

static int hf_layout(struct dfs_node *n, struct dfs_layout *out)
{
    size_t nf;
    const dcp_hf_file *f = dcp_hf_view_files(n->ck->hf, &nf);
    if (!f || file_index(n) >= nf)
        return -EIO;
    *out = (struct dfs_layout){.size = f[file_index(n)].size};
    return 0;
}

static int hf_read(struct dfs_node *n, uint64_t off, void *buf, size_t len, size_t *got, dcp_plan *plan,
                   void *stage, size_t stage_len)
{
    dcp_error err;
    if (dcp_hf_view_read(n->ck->hf, file_index(n), off, buf, len, got, plan, stage, stage_len, &err) < 0) {
        dfs_log(LOG_ERR, "%s (reading %s/%s)", err.msg, n->ck->path, n->name);
        return -DFS_REPLY_ERRNO(err.code);
    }
    return 0;
}

static const struct dfs_vfile_ops hf_ops = {
    .layout = hf_layout,
    .read = hf_read,
};

int dfs_hfview_add_files(struct dfs *fs, struct dfs_node *root, struct dfs_node ***kids, size_t *nkids,
                         size_t *kcap)
{
    struct dfs_ckpt *ck = root->ck;
    dcp_error err;
    if (!ck->hf && dcp_hf_view_build(ck->ck, &fs->hf, &ck->hf, &err) < 0) {
        dfs_log(LOG_ERR, "%s", err.msg);
        return err.code == ENOMEM ? -ENOMEM : -EIO;
    }
    size_t nf;
    const dcp_hf_file *f = dcp_hf_view_files(ck->hf, &nf);
    for (size_t i = 0; i < nf; i++) {
        struct dfs_node *n = dfs_node_new(fs, root, f[i].name, strlen(f[i].name), DFS_N_VIRTUAL);
        if (!n)
            return -ENOMEM;
        n->vdata = (void *)(uintptr_t)i;
        n->vops = &hf_ops;
        atomic_store(&n->size, (int64_t)f[i].size);
        int rc = dfs_push_kid(fs, n, kids, nkids, kcap);
        if (rc < 0)
            return rc;
    }
    dfs_log(LOG_INFO, "%s: the Hugging Face export by recipe %s: %zu files", ck->path, fs->hf.recipe, nf);
    return 0;
}
