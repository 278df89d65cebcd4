/* The accessors of the public API that read the shard files: a chunk's
 * record, located in its torch.save zip on first use (torchsave.c) and kept
 * in the model's record slot, and a bytes item's size, decoded when it is
 * compressed (blob.c). Kept apart from model.c so that the model stays below
 * the readers: model.c calls no file format code. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "store.h"

int dcp_entry_nbytes(dcp_checkpoint *ck, const dcp_entry *e, uint64_t *out, dcp_error *err)
{
    if (e->kind == DCP_KIND_TENSOR) {
        *out = dcp_entry_numel(e) * dcp_dtype_size(e->dtype);
        return 0;
    }
    if (!e->has_blob)
        return dcpi_err(err, ENOENT, "%s: %s: no storage entry for this bytes item", ck->path, e->key);
    if (!e->blob.transforms) {   /* stored as is: no I/O needed */
        *out = e->blob.length;
        return 0;
    }
    return dcpi_blob_size(ck, &e->blob, out, e->key, err);
}

int dcp_chunk_record(dcp_checkpoint *ck, const dcp_entry *e, size_t i,
                     const dcp_record **out, dcp_error *err)
{
    size_t idx = dcpi_entry_index(ck, e);
    if (idx == SIZE_MAX || e->kind != DCP_KIND_TENSOR || i >= e->nchunks)
        return dcpi_err(err, EINVAL, "%s: %s: no chunk %zu", ck->path, idx == SIZE_MAX ? "?" : e->key, i);
    struct dcpi_entry_priv *p = &ck->priv[idx];
    const dcp_chunk *chunk;
    dcpi_record_slot *slot;
    int64_t *strides = NULL;   /* a served model's room for them; a parsed one uses the arena */
    int sets = dcpi_store_sets(ck);
    pthread_mutex_lock(&ck->lock);
    if (sets) {
        if (!p->set || !p->set->pins) {
            pthread_mutex_unlock(&ck->lock);
            return dcpi_err(err, EINVAL, "%s: %s: the entry's chunks are not held (dcp_entry_chunks)", ck->path, e->key);
        }
        chunk = &p->set->chunks[i];
        slot = &p->set->records[i];
        strides = p->set->strides + i * (size_t)e->ndim;
    } else {
        if (!p->records && !(p->records = calloc(e->nchunks, sizeof *p->records))) {
            pthread_mutex_unlock(&ck->lock);
            return dcpi_err(err, ENOMEM, "%s: %s: out of memory", ck->path, e->key);
        }
        chunk = &p->chunks[i];
        slot = &p->records[i];
    }
    int state = slot->state;
    pthread_mutex_unlock(&ck->lock);
    if (state == 1) {
        *out = &slot->rec;
        return 0;
    }
    /* Locate without the lock (it does I/O); two threads may race to the same
     * answer, and the first one stored wins. */
    dcp_record rec;
    int64_t stride[DCPI_MAX_NDIM];
    if ((p->fold ? dcpi_fold_record(ck, e, p->fold, chunk, i, &rec, stride, err)
                 : dcpi_locate_record(ck, e, chunk, i, &rec, stride, err)) < 0)
        return -1;
    pthread_mutex_lock(&ck->lock);
    if (slot->state != 1) {
        size_t n = (size_t)e->ndim * sizeof *stride;
        if (!strides)
            strides = dcpi_arena_alloc(&ck->arena, n ? n : 1);
        if (!strides) {
            pthread_mutex_unlock(&ck->lock);
            return dcpi_err(err, ENOMEM, "%s: %s: out of memory", ck->path, e->key);
        }
        if (n)
            memcpy(strides, stride, n);
        rec.stride = strides;
        slot->rec = rec;
        __atomic_store_n(&slot->state, 1, __ATOMIC_RELEASE);
        if (sets)
            p->set->dirty = 1;
    }
    pthread_mutex_unlock(&ck->lock);
    *out = &slot->rec;
    return 0;
}
