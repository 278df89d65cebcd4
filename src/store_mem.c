/* The in-memory store (store.h): a parsed model, every entry and chunk in
 * ck->entries and ck->priv from the open on. Lookups go through the key
 * hash the loaders fill (ck->keys); seeks through ck->order, the entry
 * indexes in key order, sorted on first use. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "store.h"

struct dcpi_keyorder {
    pthread_mutex_t lock;
    size_t *sorted;            /* nentries indexes, NULL until the first seek */
};

struct dcpi_keyorder *dcpi_keyorder_new(void)
{
    struct dcpi_keyorder *o = calloc(1, sizeof *o);
    if (o)
        pthread_mutex_init(&o->lock, NULL);
    return o;
}

void dcpi_keyorder_free(struct dcpi_keyorder *o)
{
    if (!o)
        return;
    pthread_mutex_destroy(&o->lock);
    free(o->sorted);
    free(o);
}

int dcpi_mem_all(const dcp_checkpoint *ck, dcp_error *err)
{
    (void)ck;
    (void)err;
    return 0;   /* every entry is there */
}

static int by_key(const void *a, const void *b, void *arg)
{
    const dcp_entry *e = arg;
    return strcmp(e[*(const size_t *)a].key, e[*(const size_t *)b].key);
}

int dcpi_mem_find(const dcp_checkpoint *ck, const char *key, int seek, size_t *idx, dcp_error *err)
{
    uint64_t v;
    *idx = SIZE_MAX;
    if (!seek) {
        if (dcpi_strmap_get(&ck->keys, key, strlen(key), &v))
            *idx = (size_t)v;
        return 0;
    }
    struct dcpi_keyorder *o = ck->order;
    if (!o)
        return dcpi_err(err, EINVAL, "%s: %s: the model has no key order (not made by dcpi_ck_new)", ck->path, key);
    pthread_mutex_lock(&o->lock);
    if (!o->sorted && ck->nentries) {
        size_t *s = malloc(ck->nentries * sizeof *s);
        if (s) {
            for (size_t i = 0; i < ck->nentries; i++)
                s[i] = i;
            qsort_r(s, ck->nentries, sizeof *s, by_key, ck->entries);
        }
        o->sorted = s;
    }
    const size_t *s = o->sorted;
    pthread_mutex_unlock(&o->lock);
    if (!s)
        return ck->nentries ? dcpi_err(err, ENOMEM, "%s: out of memory", ck->path) : 0;
    size_t lo = 0, hi = ck->nentries;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(ck->entries[s[mid]].key, key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < ck->nentries)
        *idx = s[lo];
    return 0;
}

const dcpi_store dcpi_store_mem = {
    .name = "memory",
    .all = dcpi_mem_all,
    .find = dcpi_mem_find,
    .chunks = NULL,   /* ck->priv[idx].chunks, for the model's life */
    .drop = NULL,
    .close = NULL,
};
