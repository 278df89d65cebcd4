/* The checkpoint model: opening a folder, the entry and file tables that the
 * format loaders fill, and the accessors of the public API. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

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
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return dcpi_err(err, EINVAL, "%s: %s: negative dimension %lld", ck->path, e->key,
                           (long long)shape[d]);
        if (!dcpi_mul_u64(numel, (uint64_t)shape[d], &numel) || numel > (UINT64_MAX >> 5))
            return dcpi_err(err, EOVERFLOW, "%s: %s: shape too large", ck->path, e->key);
    }
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
        e->chunks = nc;
    }
    size_t n = (size_t)e->ndim * sizeof(int64_t);
    int64_t *box = dcpi_arena_alloc(&ck->arena, 2 * n + 1);
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

const char *dcpi_model_strdup(dcp_checkpoint *ck, const char *s)
{
    return s ? dcpi_arena_strndup(&ck->arena, s, strlen(s)) : NULL;
}

/* ---------------------------------------------------------------- open */

static int has_file(int dirfd, const char *name)
{
    struct stat st;
    return fstatat(dirfd, name, &st, 0) == 0 && S_ISREG(st.st_mode);
}

/* Which layout the folder holds, from what is in it. */
static int detect_and_load(dcp_checkpoint *ck, dcp_error *err)
{
    if (has_file(ck->dirfd, ".metadata"))
        return dcpi_load_metadata(ck, ".metadata", err);

    int fd = openat(ck->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dcpi_err(err, errno, "%s: cannot list the folder: %s", ck->path, strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return dcpi_err(err, errno, "%s: cannot list the folder: %s", ck->path, strerror(errno));
    }
    int rank_local = 0, safetensors = 0, distcp = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n > 11 && strncmp(de->d_name, "__", 2) == 0 && strcmp(de->d_name + n - 9, ".metadata") == 0)
            rank_local = 1;
        else if (n > 12 && strcmp(de->d_name + n - 12, ".safetensors") == 0)
            safetensors = 1;
        else if (n > 7 && strcmp(de->d_name + n - 7, ".distcp") == 0)
            distcp = 1;
    }
    closedir(d);
    if (rank_local)
        return dcpi_load_rank_local(ck, err);
    if (safetensors)
        return dcpi_load_huggingface(ck, err);
    if (distcp)
        return dcpi_err(err, ENOENT,
                       "%s: no .metadata: the checkpoint is incomplete (still being written, or the save was interrupted)",
                       ck->path);
    return dcpi_err(err, ENOENT, "%s: not a checkpoint: no .metadata, __R.metadata or .safetensors files",
                   ck->path);
}

/* An empty checkpoint on the folder at path. */
static dcp_checkpoint *ck_new(const char *path, dcp_error *err)
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
    ck->path = strdup(path);
    if (!ck->path) {
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

int dcp_open(const char *path, unsigned flags, dcp_checkpoint **out, dcp_error *err)
{
    dcp_open_options o = {.flags = flags, .catalog = NULL};
    return dcp_open_ex(path, &o, out, err);
}

int dcp_open_ex(const char *path, const dcp_open_options *opts, dcp_checkpoint **out, dcp_error *err)
{
    *out = NULL;
    dcp_checkpoint *ck = ck_new(path, err);
    if (!ck)
        return -1;
    int use_catalog = (opts->flags & DCP_OPEN_CATALOG) && has_file(ck->dirfd, ".metadata");
    if (use_catalog && dcpi_catalog_load(ck, opts->catalog) == 0) {
        ck->from_catalog = 1;
    } else {
        if (use_catalog) {   /* a partial load is thrown away: parse afresh */
            dcp_close(ck);
            if (!(ck = ck_new(path, err)))
                return -1;
        }
        if (has_file(ck->dirfd, "metadata.json"))
            ck->info.megatron = 1;   /* Megatron-Core writes it next to DCP data */
        if (detect_and_load(ck, err) < 0) {
            dcp_close(ck);
            return -1;
        }
    }
    ck->fds = malloc((ck->nfiles ? ck->nfiles : 1) * sizeof *ck->fds);
    ck->file_sizes = malloc((ck->nfiles ? ck->nfiles : 1) * sizeof *ck->file_sizes);
    if (!ck->fds || !ck->file_sizes) {
        dcp_close(ck);
        return dcpi_err(err, ENOMEM, "%s: out of memory", path);
    }
    for (size_t i = 0; i < ck->nfiles; i++) {
        ck->fds[i] = -1;
        ck->file_sizes[i] = -1;
    }
    if (use_catalog && !ck->from_catalog)
        dcpi_catalog_store(ck, opts->catalog);   /* best effort: a failure only costs a later parse */
    *out = ck;
    return 0;
}

int dcp_from_catalog(const dcp_checkpoint *ck) { return ck->from_catalog; }

void dcp_close(dcp_checkpoint *ck)
{
    if (!ck)
        return;
    if (ck->fds)
        for (size_t i = 0; i < ck->nfiles; i++)
            if (ck->fds[i] >= 0)
                close(ck->fds[i]);
    for (int i = 0; i < DCPI_DECODED_CACHE; i++)
        free(ck->decoded[i].data);
    for (size_t i = 0; i < ck->nentries; i++) {
        free(ck->priv[i].chunks);
        free(ck->priv[i].records);
    }
    free(ck->entries);
    free(ck->priv);
    free(ck->files);
    free(ck->fds);
    free(ck->file_sizes);
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

const dcp_entry *dcp_entry_at(const dcp_checkpoint *ck, size_t i)
{
    return i < ck->nentries ? &ck->entries[i] : NULL;
}

const dcp_entry *dcp_find(const dcp_checkpoint *ck, const char *key)
{
    uint64_t v;
    return dcpi_strmap_get(&ck->keys, key, strlen(key), &v) ? &ck->entries[v] : NULL;
}

const char *dcp_file_name(const dcp_checkpoint *ck, uint32_t file)
{
    return file < ck->nfiles ? ck->files[file] : NULL;
}

uint64_t dcp_entry_numel(const dcp_entry *e)
{
    if (e->kind != DCP_KIND_TENSOR)
        return 0;
    uint64_t n = 1;
    for (int d = 0; d < e->ndim; d++)
        n *= (uint64_t)e->shape[d];   /* bounded when the entry was built */
    return n;
}

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
    size_t idx = (size_t)(e - ck->entries);
    if (idx >= ck->nentries || e->kind != DCP_KIND_TENSOR || i >= e->nchunks)
        return dcpi_err(err, EINVAL, "%s: %s: no chunk %zu", ck->path, e->key, i);
    struct dcpi_entry_priv *p = &ck->priv[idx];
    pthread_mutex_lock(&ck->lock);
    if (!p->records) {
        p->records = calloc(e->nchunks, sizeof *p->records);
        if (!p->records) {
            pthread_mutex_unlock(&ck->lock);
            return dcpi_err(err, ENOMEM, "%s: %s: out of memory", ck->path, e->key);
        }
    }
    dcpi_record_slot *slot = &p->records[i];
    int state = slot->state;
    pthread_mutex_unlock(&ck->lock);
    if (state == 1) {
        *out = &slot->rec;
        return 0;
    }
    /* Locate without the lock (it does I/O); two threads may race to the same
     * answer, and the first one stored wins. */
    dcp_record rec;
    if (dcpi_locate_record(ck, e, i, &rec, err) < 0)
        return -1;
    pthread_mutex_lock(&ck->lock);
    if (slot->state != 1) {
        slot->rec = rec;
        __atomic_store_n(&slot->state, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ck->lock);
    *out = &slot->rec;
    return 0;
}
