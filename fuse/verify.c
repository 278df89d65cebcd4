/* dcpfs -o verify: before a chunk's bytes are served for the first time, its
 * blob is re-hashed and compared with the digest `dcp verify --record`
 * stored in the catalog; a mismatch makes every read of it EIO. Each blob is
 * checked once per mount; blobs without a recorded digest are served. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dcpfs.h"

enum { UNCHECKED = 0, GOOD = 1, BAD = 2 };

struct slot {
    uint32_t file;
    uint64_t offset;
    int state;
};

struct dfs_verified {
    pthread_mutex_t lock;
    struct slot *slots;
    size_t cap, count;
};

int dfs_verify_open(struct dfs *fs)
{
    if (!fs->opt.verify)
        return 0;
    dcp_error err;
    if (dcp_catalog_open(fs->opt.catalog, &fs->catalog, &err) < 0) {
        dfs_log(LOG_ERR, "-o verify: %s", err.msg);
        return -1;
    }
    return 0;
}

static struct slot *find(struct dfs_verified *v, uint32_t file, uint64_t offset, int insert)
{
    if (insert && (v->count + 1) * 2 > v->cap) {
        size_t ncap = v->cap ? v->cap * 2 : 256;
        struct slot *ns = calloc(ncap, sizeof *ns);
        if (!ns)
            return NULL;
        for (size_t i = 0; i < v->cap; i++)
            if (v->slots[i].state) {
                size_t j = (v->slots[i].offset * 31 + v->slots[i].file) & (ncap - 1);
                while (ns[j].state)
                    j = (j + 1) & (ncap - 1);
                ns[j] = v->slots[i];
            }
        free(v->slots);
        v->slots = ns;
        v->cap = ncap;
    }
    if (!v->cap)
        return NULL;
    size_t j = (offset * 31 + file) & (v->cap - 1);
    while (v->slots[j].state && (v->slots[j].file != file || v->slots[j].offset != offset))
        j = (j + 1) & (v->cap - 1);
    if (!v->slots[j].state && !insert)
        return NULL;
    return &v->slots[j];
}

/* GOOD or BAD for one blob, hashing it the first time. */
static int check_blob(struct dfs *fs, struct dfs_ckpt *ck, const dcp_entry *e, const dcp_blob *b)
{
    struct dfs_verified *v = ck->verified;
    if (b->transforms & DCP_TRANSFORM_MEMORY)   /* no stored bytes, so no digest recorded */
        return GOOD;
    pthread_mutex_lock(&v->lock);
    struct slot *s = find(v, b->file, b->offset, 0);
    int state = s ? s->state : UNCHECKED;
    pthread_mutex_unlock(&v->lock);
    if (state != UNCHECKED)
        return state;
    uint64_t want, got;
    int found;
    dcp_error err;
    state = GOOD;
    if (dcp_catalog_digest(fs->catalog, ck->ck, b, &want, &found, &err) < 0) {
        dfs_log(LOG_ERR, "-o verify: %s", err.msg);
        return BAD;   /* cannot tell: do not serve possibly wrong bytes */
    }
    if (found) {
        if (dcp_blob_digest(ck->ck, b, &got, &err) < 0) {
            dfs_log(LOG_ERR, "%s", err.msg);
            state = BAD;
        } else if (got != want) {
            dfs_log(LOG_ERR, "%s/%s: %s: bytes at offset %" PRIu64 " do not match the recorded digest (xxh3 %016" PRIx64 ", recorded %016" PRIx64 ")",
                    ck->path, dcp_file_name(ck->ck, b->file), e->key, b->offset, got, want);
            state = BAD;
        }
    }
    pthread_mutex_lock(&v->lock);
    s = find(v, b->file, b->offset, 1);
    if (s) {
        s->file = b->file;
        s->offset = b->offset;
        if (!s->state)
            v->count++;
        s->state = state;
    }
    pthread_mutex_unlock(&v->lock);
    return state;
}

int dfs_verify_plan(struct dfs *fs, struct dfs_ckpt *ck, const dcp_entry *e, const dcp_plan *plan)
{
    if (!fs->catalog)
        return 0;
    if (!ck->verified) {
        pthread_mutex_lock(&ck->lock);
        if (!ck->verified) {
            struct dfs_verified *v = calloc(1, sizeof *v);
            if (v)
                pthread_mutex_init(&v->lock, NULL);
            ck->verified = v;
        }
        pthread_mutex_unlock(&ck->lock);
        if (!ck->verified)
            return -ENOMEM;
    }
    if (e->kind == DCP_KIND_BYTES)
        return e->has_blob && check_blob(fs, ck, e, &e->blob) == BAD ? -EIO : 0;
    /* Ops may merge neighbouring chunks of a file: check every chunk whose
     * blob the op's source range touches. */
    const dcp_chunk *chunks;
    dcp_error err;
    if (dcp_entry_chunks(ck->ck, e, &chunks, &err) < 0) {
        dfs_log(LOG_ERR, "%s", err.msg);
        return -EIO;
    }
    int rc = 0;
    for (size_t i = 0; i < plan->nops && rc == 0; i++) {
        const dcp_op *op = &plan->ops[i];
        for (size_t c = 0; c < e->nchunks && rc == 0; c++) {
            const dcp_blob *b = &chunks[c].blob;
            int touches = (op->flags & DCP_OP_DECODED)
                              ? (b->file == op->blob.file && b->offset == op->blob.offset &&
                                 b->transforms == op->blob.transforms)
                              : (b->file == op->file && op->src_offset < b->offset + b->length &&
                                 b->offset < op->src_offset + op->length);
            if (chunks[c].has_blob && touches && check_blob(fs, ck, e, b) == BAD)
                rc = -EIO;
        }
    }
    dcp_release_chunks(ck->ck, e);
    return rc;
}

void dfs_verify_free(struct dfs_ckpt *ck)
{
    if (!ck->verified)
        return;
    pthread_mutex_destroy(&ck->verified->lock);
    free(ck->verified->slots);
    free(ck->verified);
    ck->verified = NULL;
}
