/* The checkpoint model: the entry and file tables that the format loaders
 * fill, and the accessors of the public API, which ask the model's store
 * (store.h) for what is not in the tables yet: nothing for a parsed model,
 * entries and chunk sets for one served by the catalog. Opening is open.c. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "store.h"

/* The model's store; a model built by hand (unit tests) has the tables only. */
static const dcpi_store *store_of(const dcp_checkpoint *ck) { return ck->store ? ck->store : &dcpi_store_mem; }

int dcpi_check_relpath(const char *rel, size_t len, dcp_error *err)
{
    if (len == 0)
        return dcpi_err(err, EINVAL, "empty relative path");
    if (memchr(rel, 0, len))
        return dcpi_err(err, EINVAL, "relative path contains a NUL byte");
    if (rel[0] == '/')
        return dcpi_err(err, EINVAL, "'%.*s' is an absolute path, not relative to the checkpoint folder",
                       (int)len, rel);
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || rel[i] == '/') {
            size_t n = i - start;
            if (n == 2 && rel[start] == '.' && rel[start + 1] == '.')
                return dcpi_err(err, EINVAL, "relative path '%.*s' leaves the checkpoint folder",
                               (int)len, rel);
            if (n == 0)
                return dcpi_err(err, EINVAL, "relative path '%.*s' has an empty component", (int)len, rel);
            start = i + 1;
        }
    }
    return 0;
}

int dcpi_model_file(dcp_checkpoint *ck, const char *rel, size_t len, uint32_t *idx, dcp_error *err)
{
    uint64_t v;
    if (dcpi_strmap_get(&ck->file_index, rel, len, &v)) {
        *idx = (uint32_t)v;
        return 0;
    }
    if (dcpi_check_relpath(rel, len, err) < 0)
        return dcpi_err_prefix(err, "%s", ck->path);
    if (ck->nfiles >= UINT32_MAX)
        return dcpi_err(err, EOVERFLOW, "%s: too many data files", ck->path);
    if (ck->nfiles == ck->file_cap) {
        size_t ncap = ck->file_cap ? ck->file_cap * 2 : 16;
        char **nf = realloc(ck->files, ncap * sizeof *nf);
        if (!nf)
            return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
        ck->files = nf;
        ck->file_cap = ncap;
    }
    char *copy = dcpi_arena_strndup(&ck->arena, rel, len);
    if (!copy || dcpi_strmap_put(&ck->file_index, copy, len, ck->nfiles) < 0)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    ck->files[ck->nfiles] = copy;
    *idx = (uint32_t)ck->nfiles++;
    return 0;
}

int dcpi_model_entry(dcp_checkpoint *ck, const char *key, size_t len, dcp_kind kind,
                    size_t *idx, dcp_error *err)
{
    uint64_t v;
    if (dcpi_strmap_get(&ck->keys, key, len, &v)) {
        if (ck->entries[v].kind != kind)
            return dcpi_err(err, EINVAL, "%s: key '%.*s' is both a tensor and a bytes item",
                           ck->path, (int)len, key);
        *idx = (size_t)v;
        return 0;
    }
    if (memchr(key, 0, len))
        return dcpi_err(err, EINVAL, "%s: a key contains a NUL byte", ck->path);
    if (ck->nentries == ck->entry_cap) {
        size_t ncap = ck->entry_cap ? ck->entry_cap * 2 : 64;
        dcp_entry *ne = realloc(ck->entries, ncap * sizeof *ne);
        if (!ne)
            return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
        ck->entries = ne;
        struct dcpi_entry_priv *np = realloc(ck->priv, ncap * sizeof *np);
        if (!np)
            return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
        ck->priv = np;
        ck->entry_cap = ncap;
    }
    char *copy = dcpi_arena_strndup(&ck->arena, key, len);
    if (!copy || dcpi_strmap_put(&ck->keys, copy, len, ck->nentries) < 0)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    dcp_entry *e = &ck->entries[ck->nentries];
    memset(e, 0, sizeof *e);
    memset(&ck->priv[ck->nentries], 0, sizeof ck->priv[0]);
    e->key = copy;
    e->kind = kind;
    *idx = ck->nentries++;
    return 0;
}

int dcpi_model_set_tensor(dcp_checkpoint *ck, size_t idx, dcp_dtype dt, int ndim,
                         const int64_t *shape, dcp_error *err)
{
    dcp_entry *e = &ck->entries[idx];
    if (ndim < 0 || ndim > DCPI_MAX_NDIM)
        return dcpi_err(err, EINVAL, "%s: %s: %d dimensions (at most %d)", ck->path, e->key, ndim,
                       DCPI_MAX_NDIM);
    if (!dcp_dtype_size(dt))
        return dcpi_err(err, EINVAL, "%s: %s: unknown dtype", ck->path, e->key);
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0)
            return dcpi_err(err, EINVAL, "%s: %s: negative dimension %lld", ck->path, e->key,
                           (long long)shape[d]);
    /* A 0 anywhere makes it 0 elements, whatever the other dimensions (torch
     * saves and loads torch.empty(2**62, 0)): not a product that overflows
     * before the 0 is reached. */
    if (!dcpi_shape_ok(ndim, shape))
        return dcpi_err(err, EOVERFLOW, "%s: %s: shape too large", ck->path, e->key);
    if (e->shape && e->nchunks && (e->ndim != ndim || memcmp(e->shape, shape, ndim * sizeof *shape)))
        return dcpi_err(err, EINVAL, "%s: %s: conflicting global shapes", ck->path, e->key);
    int64_t *s = dcpi_arena_memdup(&ck->arena, shape, (size_t)ndim * sizeof *shape);
    if (!s)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    e->dtype = dt;
    e->ndim = ndim;
    e->shape = s;
    return 0;
}

int dcpi_model_reserve_chunks(dcp_checkpoint *ck, size_t idx, size_t more, dcp_error *err)
{
    struct dcpi_entry_priv *p = &ck->priv[idx];
    size_t need = ck->entries[idx].nchunks + more;
    if (need <= p->chunk_cap)
        return 0;
    if (need > SIZE_MAX / sizeof(dcp_chunk))
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    dcp_chunk *nc = realloc(p->chunks, need * sizeof *nc);
    if (!nc)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    p->chunks = nc;
    p->chunk_cap = need;
    return 0;
}

int dcpi_model_add_chunk(dcp_checkpoint *ck, size_t idx, const int64_t *offsets,
                        const int64_t *sizes, size_t *ci, dcp_error *err)
{
    dcp_entry *e = &ck->entries[idx];
    struct dcpi_entry_priv *p = &ck->priv[idx];
    for (int d = 0; d < e->ndim; d++) {
        uint64_t end;
        if (offsets[d] < 0 || sizes[d] < 0 ||
            !dcpi_add_u64((uint64_t)offsets[d], (uint64_t)sizes[d], &end) || end > (uint64_t)e->shape[d])
            return dcpi_err(err, EINVAL,
                           "%s: %s: chunk at offset %lld size %lld lies outside dimension %d of size %lld",
                           ck->path, e->key, (long long)offsets[d], (long long)sizes[d], d,
                           (long long)e->shape[d]);
    }
    if (e->nchunks == p->chunk_cap) {
        size_t ncap = p->chunk_cap ? p->chunk_cap * 2 : 4;
        dcp_chunk *nc = realloc(p->chunks, ncap * sizeof *nc);
        if (!nc)
            return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
        p->chunks = nc;
        p->chunk_cap = ncap;
    }
    size_t n = (size_t)e->ndim * sizeof(int64_t);
    int64_t *box = dcpi_arena_alloc(&ck->arena, n ? 2 * n : 1);
    if (!box)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    memcpy(box, offsets, n);
    memcpy(box + e->ndim, sizes, n);
    dcp_chunk *c = &p->chunks[e->nchunks];
    memset(c, 0, sizeof *c);
    c->offsets = box;
    c->sizes = box + e->ndim;
    *ci = e->nchunks++;
    return 0;
}

void dcpi_model_chunk_blob(dcp_checkpoint *ck, size_t idx, size_t ci, const dcp_blob *b)
{
    ck->priv[idx].chunks[ci].blob = *b;
    ck->priv[idx].chunks[ci].has_blob = 1;
}

int dcpi_model_chunk_record(dcp_checkpoint *ck, size_t idx, size_t ci, const dcp_record *rec, dcp_error *err)
{
    dcp_entry *e = &ck->entries[idx];
    struct dcpi_entry_priv *p = &ck->priv[idx];
    if (ci >= e->nchunks)
        return dcpi_err(err, EINVAL, "%s: %s: no chunk %zu", ck->path, e->key, ci);
    /* One slot per chunk, sized now: the loader has added every chunk. */
    if (!p->records && !(p->records = calloc(e->nchunks, sizeof *p->records)))
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    size_t n = (size_t)e->ndim * sizeof *rec->stride;
    int64_t *st = dcpi_arena_alloc(&ck->arena, n ? n : 1);
    if (!st)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    if (n)
        memcpy(st, rec->stride, n);
    p->records[ci].rec = *rec;
    p->records[ci].rec.stride = st;
    p->records[ci].state = 1;
    return 0;
}

int dcpi_model_reset(dcp_checkpoint *ck, dcp_error *err)
{
    (void)err;
    for (size_t i = 0; i < ck->nentries; i++) {
        free(ck->priv[i].chunks);
        free(ck->priv[i].records);
    }
    free(ck->entries);
    free(ck->priv);
    free(ck->files);
    ck->entries = NULL;
    ck->priv = NULL;
    ck->files = NULL;
    ck->nentries = ck->entry_cap = ck->nfiles = ck->file_cap = 0;
    ck->reform = NULL;   /* arena-owned */
    ck->nreform = 0;
    dcpi_strmap_free(&ck->keys);
    dcpi_strmap_free(&ck->file_index);
    dcpi_arena_free(&ck->arena);
    dcpi_strmap_init(&ck->keys);
    dcpi_strmap_init(&ck->file_index);
    dcpi_arena_init(&ck->arena);
    int megatron = ck->info.megatron;
    memset(&ck->info, 0, sizeof ck->info);
    ck->info.megatron = megatron;
    return 0;
}

const char *dcpi_model_strdup(dcp_checkpoint *ck, const char *s)
{
    return s ? dcpi_arena_strndup(&ck->arena, s, strlen(s)) : NULL;
}

/* An empty checkpoint on the folder at path. */
dcp_checkpoint *dcpi_ck_new(const char *path, dcp_error *err)
{
    dcp_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck) {
        dcpi_err(err, ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    dcpi_arena_init(&ck->arena);
    dcpi_strmap_init(&ck->keys);
    dcpi_strmap_init(&ck->file_index);
    pthread_mutex_init(&ck->lock, NULL);
    ck->dirfd = -1;
    ck->rank_view = -1;
    ck->chunk_budget = DCPI_CHUNK_BUDGET;
    ck->store = &dcpi_store_mem;
    ck->path = strdup(path);
    ck->order = dcpi_keyorder_new();
    if (!ck->path || !ck->order) {
        dcp_close(ck);
        dcpi_err(err, ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    ck->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (ck->dirfd < 0) {
        int e = errno;
        dcp_close(ck);
        dcpi_err(err, e, "%s: cannot open the checkpoint folder: %s", path, strerror(e));
        return NULL;
    }
    return ck;
}

int dcpi_ck_on_close(dcp_checkpoint *ck, void (*fn)(void *), void *state, dcp_error *err)
{
    if (ck->nclosers == DCPI_MAX_CLOSERS)
        return dcpi_err(err, EOVERFLOW, "%s: more than %d layers keep state (DCPI_MAX_CLOSERS)", ck->path,
                        DCPI_MAX_CLOSERS);
    ck->closers[ck->nclosers].fn = fn;
    ck->closers[ck->nclosers].state = state;
    ck->nclosers++;
    return 0;
}

int dcp_from_catalog(const dcp_checkpoint *ck) { return ck->from_catalog; }

void dcp_close(dcp_checkpoint *ck)
{
    if (!ck)
        return;
    while (ck->nclosers > 0) {   /* the layers' state: fds, decoded blobs */
        ck->nclosers--;
        ck->closers[ck->nclosers].fn(ck->closers[ck->nclosers].state);
    }
    if (store_of(ck)->close)
        store_of(ck)->close(ck);
    if (ck->priv)
        for (size_t i = 0; i < ck->nentries; i++) {
            free(ck->priv[i].chunks);
            free(ck->priv[i].records);
            free(ck->priv[i].set);
        }
    dcpi_keyorder_free(ck->order);
    free(ck->entries);
    free(ck->priv);
    free(ck->files);
    dcpi_strmap_free(&ck->keys);
    dcpi_strmap_free(&ck->file_index);
    dcpi_arena_free(&ck->arena);
    if (ck->dirfd >= 0)
        close(ck->dirfd);
    pthread_mutex_destroy(&ck->lock);
    free(ck->path);
    free(ck);
}

/* ---------------------------------------------------------------- accessors */

const char *dcp_path(const dcp_checkpoint *ck) { return ck->path; }
const dcp_info *dcp_get_info(const dcp_checkpoint *ck) { return &ck->info; }
size_t dcp_num_entries(const dcp_checkpoint *ck) { return ck->nentries; }
size_t dcp_num_files(const dcp_checkpoint *ck) { return ck->nfiles; }

bool dcpi_ck_is_file(const dcp_checkpoint *ck)
{
    return ck->info.layout && !strcmp(ck->info.layout, "single file") && ck->nfiles == 1;
}

int dcpi_path_inside(const char *path, dcp_checkpoint *ck)
{
    if (dcpi_ck_is_file(ck)) {   /* a single file's checkpoint is that file, not the folder it lies in */
        char a[PATH_MAX], b[PATH_MAX];
        return realpath(path, a) && realpath(dcpi_ck_name(ck), b) && !strcmp(a, b);
    }
    return dcpi_path_inside_folder(path, ck->path);
}

const char *dcpi_ck_name(const dcp_checkpoint *ck)
{
    static _Thread_local char buf[4352];
    if (dcpi_ck_is_file(ck)) {
        snprintf(buf, sizeof buf, "%s/%s", ck->path, ck->files[0]);
        return buf;
    }
    return ck->path;
}

bool dcpi_store_sets(const dcp_checkpoint *ck) { return store_of(ck)->chunks != NULL; }

static int filled(const dcp_entry *e) { return __atomic_load_n(&e->key, __ATOMIC_ACQUIRE) != NULL; }

/* A store's failure, about one key: "<checkpoint>: <what>: <reason>",
 * whether or not the store's message named the checkpoint. Returns -1. */
__attribute__((format(printf, 3, 4)))
static int about(const dcp_checkpoint *ck, dcp_error *err, const char *fmt, ...)
{
    if (!err)
        return -1;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    size_t n = strlen(ck->path);
    if (!strncmp(err->msg, ck->path, n) && !strncmp(err->msg + n, ": ", 2)) {
        char rest[DCP_ERRMSG_MAX];
        snprintf(rest, sizeof rest, "%s", err->msg + n + 2);
        return dcpi_err(err, err->code, "%s: %s: %s", ck->path, what, rest);
    }
    return dcpi_err_prefix(err, "%s: %s", ck->path, what);
}

int dcp_get_entry(const dcp_checkpoint *ck, size_t i, const dcp_entry **out, dcp_error *err)
{
    dcp_error local;
    if (!err)
        err = &local;   /* the stores read err->code */
    *out = NULL;
    if (i >= ck->nentries)
        return dcpi_err(err, DCP_ENOTFOUND, "%s: entry %zu: no such entry (the checkpoint has %zu)",
                        dcpi_ck_name(ck), i, ck->nentries);
    const dcp_entry *e = &ck->entries[i];
    if (!filled(e) && store_of(ck)->all(ck, err) < 0)
        return about(ck, err, "entry %zu", i);
    *out = e;
    return 0;
}

int dcp_find_entry(const dcp_checkpoint *ck, const char *key, const dcp_entry **out, dcp_error *err)
{
    size_t idx;
    dcp_error local;
    if (!err)
        err = &local;   /* the stores read err->code */
    *out = NULL;
    if (store_of(ck)->find(ck, key, 0, &idx, err) < 0)
        return about(ck, err, "%s", key);
    if (idx == SIZE_MAX)
        return dcpi_err(err, DCP_ENOTFOUND, "%s: %s: no such key", dcpi_ck_name(ck), key);
    *out = &ck->entries[idx];
    return 0;
}

/* The calls of 0.1: NULL for "no such entry" and for a failure alike. */
const dcp_entry *dcp_entry_at(const dcp_checkpoint *ck, size_t i)
{
    const dcp_entry *e;
    dcp_error err;
    return dcp_get_entry(ck, i, &e, &err) == 0 ? e : NULL;
}

const dcp_entry *dcp_find(const dcp_checkpoint *ck, const char *key)
{
    const dcp_entry *e;
    dcp_error err;
    return dcp_find_entry(ck, key, &e, &err) == 0 ? e : NULL;
}

int dcp_seek(dcp_checkpoint *ck, const char *from, const dcp_entry **out, dcp_error *err)
{
    size_t idx;
    *out = NULL;
    if (store_of(ck)->find(ck, from, 1, &idx, err) < 0)
        return -1;
    *out = idx == SIZE_MAX ? NULL : &ck->entries[idx];
    return 0;
}

const char *dcp_file_name(const dcp_checkpoint *ck, uint32_t file)
{
    return file < ck->nfiles ? ck->files[file] : NULL;
}

uint64_t dcp_entry_numel(const dcp_entry *e)
{
    if (e->kind != DCP_KIND_TENSOR)
        return 0;
    uint64_t n = 0;
    dcpi_shape_numel(e->ndim, e->shape, &n);   /* fits: checked when the entry was built */
    return n;
}

/* ---------------------------------------------------------------- chunks */

size_t dcpi_entry_index(const dcp_checkpoint *ck, const dcp_entry *e)
{
    return e >= ck->entries && e < ck->entries + ck->nentries ? (size_t)(e - ck->entries) : SIZE_MAX;
}

int dcp_entry_replicated(const dcp_checkpoint *ck, const dcp_entry *e)
{
    size_t idx = ck && e ? dcpi_entry_index(ck, e) : SIZE_MAX;
    return idx != SIZE_MAX && ck->priv && ck->priv[idx].replicated;
}

dcpi_chunkset *dcpi_chunkset_new(size_t idx, size_t n, size_t nd)
{
    size_t bytes = sizeof(dcpi_chunkset) + n * (sizeof(dcp_chunk) + sizeof(dcpi_record_slot) + 3 * nd * sizeof(int64_t));
    dcpi_chunkset *s = calloc(1, bytes);
    if (!s)
        return NULL;
    s->idx = idx;
    s->bytes = bytes;
    s->chunks = (dcp_chunk *)(s + 1);
    s->records = (dcpi_record_slot *)(s->chunks + n);
    s->strides = (int64_t *)(s->records + n) + 2 * n * nd;
    return s;
}

static void lru_unlink(dcp_checkpoint *ck, dcpi_chunkset *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        ck->lru_head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        ck->lru_tail = s->prev;
    s->prev = s->next = NULL;
}

/* Under ck->lock: unlink the least recently used unpinned sets beyond the
 * budget; they are returned (linked by next) for drop_sets, outside the lock. */
static dcpi_chunkset *evict(dcp_checkpoint *ck)
{
    dcpi_chunkset *dropped = NULL;
    while (ck->chunk_bytes > ck->chunk_budget && ck->lru_tail) {
        dcpi_chunkset *s = ck->lru_tail;
        lru_unlink(ck, s);
        ck->priv[s->idx].set = NULL;
        ck->chunk_bytes -= s->bytes;
        s->next = dropped;
        dropped = s;
    }
    return dropped;
}

/* Without ck->lock (every plan and read takes it): the records the evicted
 * sets located are kept for the catalog, and the sets freed. */
static void drop_sets(dcp_checkpoint *ck, dcpi_chunkset *s)
{
    while (s) {
        dcpi_chunkset *next = s->next;
        if (store_of(ck)->drop)
            store_of(ck)->drop(ck, s);
        free(s);
        s = next;
    }
}

int dcp_entry_chunks(dcp_checkpoint *ck, const dcp_entry *e, const dcp_chunk **out, dcp_error *err)
{
    size_t idx = dcpi_entry_index(ck, e);
    *out = NULL;
    if (idx == SIZE_MAX)
        return dcpi_err(err, EINVAL, "%s: not an entry of this checkpoint", ck->path);
    if (e->kind != DCP_KIND_TENSOR || !e->nchunks)
        return 0;
    if (!store_of(ck)->chunks) {   /* in memory for the model's life */
        *out = ck->priv[idx].chunks;
        return 0;
    }
    struct dcpi_entry_priv *p = &ck->priv[idx];
    pthread_mutex_lock(&ck->lock);
    dcpi_chunkset *s = p->set;
    if (s) {
        if (!s->pins++)
            lru_unlink(ck, s);
        pthread_mutex_unlock(&ck->lock);
        *out = s->chunks;
        return 0;
    }
    pthread_mutex_unlock(&ck->lock);
    dcpi_chunkset *fresh;   /* read without ck->lock: readers of other entries go on */
    if (store_of(ck)->chunks(ck, idx, &fresh, err) < 0)
        return -1;
    dcpi_chunkset *dropped = NULL;
    pthread_mutex_lock(&ck->lock);
    if ((s = p->set)) {   /* another thread read it meanwhile */
        if (!s->pins++)
            lru_unlink(ck, s);
        free(fresh);
    } else {
        s = p->set = fresh;
        s->pins = 1;
        ck->chunk_bytes += s->bytes;
        dropped = evict(ck);
    }
    pthread_mutex_unlock(&ck->lock);
    drop_sets(ck, dropped);
    *out = s->chunks;
    return 0;
}

void dcp_release_chunks(dcp_checkpoint *ck, const dcp_entry *e)
{
    size_t idx = dcpi_entry_index(ck, e);
    if (!store_of(ck)->chunks || idx == SIZE_MAX)
        return;
    dcpi_chunkset *dropped = NULL;
    pthread_mutex_lock(&ck->lock);
    dcpi_chunkset *s = ck->priv[idx].set;
    if (s && s->pins && !--s->pins) {
        s->next = ck->lru_head;
        if (ck->lru_head)
            ck->lru_head->prev = s;
        ck->lru_head = s;
        if (!ck->lru_tail)
            ck->lru_tail = s;
        dropped = evict(ck);
    }
    pthread_mutex_unlock(&ck->lock);
    drop_sets(ck, dropped);   /* (kept records are stored in the background, never here) */
}
