/* The model's store: where a checkpoint's entries and chunks come from.
 *
 * The model (model.c) answers the public API (dcp_find, dcp_seek,
 * dcp_entry_at, dcp_entry_chunks, dcp_chunk_record) from ck->entries and
 * ck->priv, and asks its store for what is not there yet. Two stores:
 *
 *   dcpi_store_mem      (store_mem.c) a parsed model: every entry and chunk
 *                       is in memory from the open on (the format loaders
 *                       fill them through dcpi_model_*); lookups by a hash of
 *                       the keys, seeks by a sorted index made on first use.
 *   dcpi_store_spill    (store_spill.c) a parsed model too large to hold:
 *                       its entries in memory, its chunks in scratch files
 *                       as the parse went, read back in sets.
 *   dcpi_store_catalog  (integrity/modelcache.c) a model served by the
 *                       SQLite catalog: entries read on demand, chunks in
 *                       sets pinned while used and kept in a bounded cache.
 *
 * The catalog depends on the model's types; the model knows the catalog only
 * through this table (installed by dcpi_catalog_load), and the loaders
 * (metadata.c, safetensors.c) know neither the catalog nor the stores.
 */
#ifndef DCP_STORE_H
#define DCP_STORE_H

#include "internal.h"

struct dcpi_store {
    const char *name;
    /* Fill every entry (dcp_entry_at, listings): 0, or -1 with err. all and
     * find take the const handle of the lookups: what they fill lies behind
     * its pointers (entries[], the store's own state, ck->order). */
    int (*all)(const dcp_checkpoint *ck, dcp_error *err);
    /* The index of the entry with key (seek 0) or of the first with a key
     * >= key in byte order (seek 1), filled; SIZE_MAX when there is none.
     * 0, or -1 with err. */
    int (*find)(const dcp_checkpoint *ck, const char *key, int seek, size_t *idx, dcp_error *err);
    /* A new chunk set of entry idx (pins 0, not yet cached), or NULL for a
     * store whose chunks stay in ck->priv[idx].chunks as long as ck. */
    int (*chunks)(dcp_checkpoint *ck, size_t idx, dcpi_chunkset **out, dcp_error *err);
    /* A chunk set is dropped from the cache (outside ck->lock): keep the
     * records it located. NULL when there is nothing to keep. */
    void (*drop)(dcp_checkpoint *ck, const dcpi_chunkset *s);
    /* dcp_close, before the chunk sets are freed: store what is pending and
     * free the store's own data. May be NULL. */
    void (*close)(dcp_checkpoint *ck);
};

extern const dcpi_store dcpi_store_mem;
/* A parsed model whose chunks wait in scratch files (store_spill.c; made by
 * dcpi_spill_begin): the in-memory store's entries, chunk sets read back. */
extern const dcpi_store dcpi_store_spill;
/* The in-memory store's all and find, which the spill store shares. */
int dcpi_mem_all(const dcp_checkpoint *ck, dcp_error *err);
int dcpi_mem_find(const dcp_checkpoint *ck, const char *key, int seek, size_t *idx, dcp_error *err);

/* A parsed model's key order for seeks (store_mem.c), made with the model
 * (dcpi_ck_new) and sorted at the first seek, under its own lock. */
struct dcpi_keyorder *dcpi_keyorder_new(void);
void dcpi_keyorder_free(struct dcpi_keyorder *o);

/* Whether ck's chunks come in sets read on demand (pinned by
 * dcp_entry_chunks, cached within ck->chunk_budget), not kept for ck's life. */
bool dcpi_store_sets(const dcp_checkpoint *ck);

#endif
