/* The model cache: what parsing .metadata produced, stored in the catalog so
 * that a later open of an unchanged checkpoint skips the pickle entirely and
 * reads only what it uses.
 *
 *   models         one row per .metadata (keyed by its size, mtime and
 *                  XXH3, and found first by its stat stamp and path): the
 *                  files and their sizes, the info strings, the number of
 *                  entries and chunks. An open reads only this.
 *   model_entries  one row per entry: its key, its header (kind, dtype,
 *                  shape, bytes-item blob, chunk count) and its chunks (boxes
 *                  and blob locations) in a separate column, so that reading
 *                  a header never reads the chunks. The primary key (model,
 *                  idx) serves dcp_entry_at and the chunks of an entry; the
 *                  index (model, key, head) serves dcp_find and dcp_seek
 *                  (listings by key prefix) without touching the table.
 *
 * Chunk lists are one row per entry, not one row per chunk: a million-chunk
 * checkpoint makes 100k rows, not 1M, and an entry's chunks come back in one
 * B-tree lookup (about 10 us, decoded), with no offsets into a shared blob
 * to keep consistent. Chunk records found in the shards: recordcache.c.
 *
 * Everything read back is hostile input: each header and chunk list carries
 * an XXH3 of its bytes (SQLite checks its pages, not what is in them), and
 * every value is bounds-checked as the parser's model builder does. A
 * mismatch at open means "parse again"; a damaged row met later, or a model
 * removed by another process, makes this open parse the metadata and serve
 * the rest from the parse (fall_back), and drops the model from the catalog.
 * A model is tied to the .metadata and checked against the shard files'
 * sizes at open; any doubt means "parse again".
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "integrity.h"
#include "../store.h"

#define MAGIC "DCPMODL5"   /* little-endian varints; see put_head(). Bump when
                            * parsing changes what a model holds (3: generation
                            * strings, rank-local file names; 4: rows per entry;
                            * 5: the count of Megatron-Core reformulated keys) */
#define SEED_HEAD 0x68656164u       /* "head": the checksum of an entry's header */
#define SEED_CHUNKS 0x63686b73u     /* "chks": the checksum of its chunk list */
#define LAZY_CACHE_KIB 4096         /* SQLite page cache of a served model's connection */
#define DCPI_STR_(x) #x
#define DCPI_STR(x) DCPI_STR_(x)


/* ------------------------------------------------------------ metadata key */

static int stamp_usable(const dcp_checkpoint *ck) { return ck->meta.stamp[0] && ck->meta.stamp[0] != '-'; }

/* The content key, read from the file unless a parse (or an earlier
 * lookup) gave it. */
static int metadata_key(dcp_checkpoint *ck, char key[33])
{
    if (ck->meta.key[0]) {
        memcpy(key, ck->meta.key, 33);
        return 0;
    }
    int fd = openat(ck->dirfd, ".metadata", O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return -1;
    if (fstat(fd, &sb) < 0) {
        close(fd);
        return -1;
    }
    dcpi_identity *id = dcpi_identity_begin(&sb);
    char *buf = malloc(1u << 20);   /* stays in cache while it is hashed */
    ssize_t r = -1;
    if (id && buf) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        while ((r = read(fd, buf, 1u << 20)) > 0)
            dcpi_identity_update(id, buf, (size_t)r);
        dcpi_identity_key(id, key);
    }
    free(buf);
    dcpi_identity_free(id);
    close(fd);
    if (r != 0)
        return -1;
    memcpy(ck->meta.key, key, 33);
    return 0;
}

/* The stamp of the .metadata, unless known. */
static void metadata_stamp(dcp_checkpoint *ck)
{
    struct stat sb;
    if (ck->meta.stamp[0])
        return;
    if (fstatat(ck->dirfd, ".metadata", &sb, 0) < 0)
        snprintf(ck->meta.stamp, sizeof ck->meta.stamp, "-");
    else
        dcpi_identity_stamp(ck, &sb);
}

/* ------------------------------------------------------------ serialising */

static void put_dims(dcpi_wbuf *w, const int64_t *d, int ndim)
{
    for (int i = 0; i < ndim; i++)
        dcpi_put_u64(w, (uint64_t)d[i]);
}
static void put_str(dcpi_wbuf *w, const char *s)
{
    dcpi_put_u64(w, s ? strlen(s) : UINT64_MAX);
    if (s)
        dcpi_put(w, s, strlen(s));
}
static void put_blob(dcpi_wbuf *w, const dcp_blob *b)
{
    dcpi_put_u64(w, b->file);
    dcpi_put_u64(w, b->transforms);
    dcpi_put_u64(w, b->offset);
    dcpi_put_u64(w, b->length);
}
/* The model row: files, info, counts. */
static int put_head(dcp_checkpoint *ck, dcpi_wbuf *w, uint64_t nchunks)
{
    dcpi_put(w, MAGIC, 8);
    dcpi_put_u64(w, ck->nfiles);
    for (size_t f = 0; f < ck->nfiles; f++) {
        uint64_t size;
        dcp_error err;
        if (dcpi_ck_file_size(ck, (uint32_t)f, &size, &err) < 0)
            return -1;   /* a missing shard: not worth caching */
        put_str(w, ck->files[f]);
        dcpi_put_u64(w, size);
    }
    const dcp_info *in = &ck->info;
    put_str(w, in->generation);
    put_str(w, in->serialization);
    put_str(w, in->layout);
    put_str(w, in->version);
    put_str(w, in->checkpoint_id);
    put_str(w, in->save_id);
    dcpi_put_u64(w, (uint64_t)in->has_planner_data | (uint64_t)in->megatron << 1);
    dcpi_put_u64(w, in->metadata_bytes);
    dcpi_put_u64(w, in->megatron_reformulated);
    dcpi_put_u64(w, ck->nentries);
    dcpi_put_u64(w, nchunks);
    return w->oom ? -1 : 0;
}

/* An entry's header, checksummed with its key and index. */
static void put_entry(dcpi_wbuf *w, const dcp_entry *e, size_t idx)
{
    w->n = 0;
    dcpi_put_u64(w, (uint64_t)e->kind | (uint64_t)e->dtype << 8 | (uint64_t)e->ndim << 16 | (uint64_t)e->has_blob << 32);
    put_dims(w, e->shape, e->ndim);
    put_blob(w, &e->blob);
    dcpi_put_u64(w, e->nchunks);
    dcpi_put_sum(w, XXH3_64bits_withSeed(e->key, strlen(e->key), SEED_HEAD ^ (uint64_t)idx));
}

static void put_chunks(dcpi_wbuf *w, const dcp_entry *e, const dcp_chunk *c, size_t idx)
{
    w->n = 0;
    for (size_t i = 0; i < e->nchunks; i++) {
        put_dims(w, c[i].offsets, e->ndim);
        put_dims(w, c[i].sizes, e->ndim);
        dcpi_put_u64(w, (uint64_t)c[i].has_blob);
        put_blob(w, &c[i].blob);
    }
    dcpi_put_sum(w, SEED_CHUNKS ^ (uint64_t)idx);
}

/* ------------------------------------------------------------ reading */

/* ndim dimensions; each must fit int64 (callers check the rest). */
static int get_dims(dcpi_rbuf *r, int64_t *d, int ndim)
{
    for (int i = 0; i < ndim; i++) {
        uint64_t v = dcpi_get_u64(r);
        if (v > INT64_MAX)
            r->bad = 1;
        d[i] = (int64_t)v;
    }
    return r->bad ? -1 : 0;
}
/* A string copied into the arena (NULL stays NULL). */
static const char *get_str(dcpi_rbuf *r, dcpi_arena *a, size_t *len)
{
    uint64_t n = dcpi_get_u64(r);
    if (n == UINT64_MAX)
        return NULL;
    const char *p = n <= (size_t)(r->end - r->p) ? dcpi_take(r, (size_t)n) : (r->bad = 1, NULL);
    if (!p)
        return NULL;
    if (len)
        *len = n;
    char *s = dcpi_arena_strndup(a, p, n);
    if (!s)
        r->bad = 1;
    return s;
}
static void get_blob(dcpi_rbuf *r, dcp_blob *b, size_t nfiles)
{
    uint64_t f = dcpi_get_u64(r), t = dcpi_get_u64(r);
    b->offset = dcpi_get_u64(r);
    b->length = dcpi_get_u64(r);
    if (f >= nfiles || t > UINT32_MAX || b->offset > UINT64_MAX - b->length)
        r->bad = 1;
    b->file = (uint32_t)f;
    b->transforms = (uint32_t)t;
}
/* The model row into an empty ck: files (each must still have its size),
 * info, and room for every entry. */
static int get_head(dcp_checkpoint *ck, const unsigned char *data, size_t len, uint64_t db_bytes,
                    uint64_t *nchunks)
{
    dcpi_rbuf r = {data, data + len, 0};
    dcp_error err;
    const char *magic = dcpi_take(&r, 8);
    if (!magic || memcmp(magic, MAGIC, 8))
        return -1;
    uint64_t nfiles = dcpi_get_u64(&r);
    if (nfiles > len / 2)
        return -1;
    for (uint64_t f = 0; f < nfiles && !r.bad; f++) {
        size_t n = 0;
        const char *name = get_str(&r, &ck->arena, &n);
        uint64_t size = dcpi_get_u64(&r);
        uint32_t idx;
        if (!name || dcpi_model_file(ck, name, n, &idx, &err) < 0 || idx != f)
            return -1;
        /* A shard whose size changed makes the record stale. */
        struct stat sb;
        if (fstatat(ck->dirfd, name, &sb, 0) < 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != size)
            return -1;
    }
    dcp_info *in = &ck->info;
    in->generation = get_str(&r, &ck->arena, NULL);
    in->serialization = get_str(&r, &ck->arena, NULL);
    in->layout = get_str(&r, &ck->arena, NULL);
    in->version = get_str(&r, &ck->arena, NULL);
    in->checkpoint_id = get_str(&r, &ck->arena, NULL);
    in->save_id = get_str(&r, &ck->arena, NULL);
    uint64_t flags = dcpi_get_u64(&r);
    in->has_planner_data = (int)(flags & 1);
    in->megatron = (int)((flags >> 1) & 1);
    in->metadata_bytes = dcpi_get_u64(&r);
    uint64_t reformulated = dcpi_get_u64(&r);
    uint64_t nentries = dcpi_get_u64(&r);
    *nchunks = dcpi_get_u64(&r);
    /* Every entry and chunk takes bytes of the catalog file: that bounds the
     * tables allocated here (calloc: pages are touched as entries are read). */
    if (r.bad || r.p != r.end || nentries > db_bytes / 8 || *nchunks > db_bytes || reformulated > nentries)
        return -1;
    in->megatron_reformulated = (size_t)reformulated;
    if (nentries) {
        ck->entries = calloc((size_t)nentries, sizeof *ck->entries);
        ck->priv = calloc((size_t)nentries, sizeof *ck->priv);
        if (!ck->entries || !ck->priv)
            return -1;
    }
    ck->nentries = ck->entry_cap = (size_t)nentries;
    return 0;
}

/* Under lz->lock: a row failed its checksum or bounds. The model is dropped
 * from the catalog (best effort) so that the next open parses afresh; this
 * one falls back to parsing (fall_back). */
static int damaged(const dcp_checkpoint *ck, const char *what, dcp_error *err)
{
    struct dcpi_lazy *lz = ck->lazy;
    sqlite3 *db = dcpi_catalog_db(lz->cat);
    char sql[256];
    snprintf(sql, sizeof sql, "DELETE FROM model_entries WHERE model=%lld; DELETE FROM model_records WHERE model=%lld;"
             " DELETE FROM models WHERE id=%lld", (long long)lz->model, (long long)lz->model, (long long)lz->model);
    sqlite3_stmt *busy[] = {lz->all, lz->exact, lz->seek, lz->chunks, lz->alive, lz->records};
    for (size_t i = 0; i < sizeof busy / sizeof *busy; i++)
        sqlite3_reset(busy[i]);
    sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK)
        sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    else
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return dcpi_err(err, EIO, "%s: %s: the catalog's copy of the model is damaged (a checksum or bound failed);"
                    " it was dropped from %s, and the next open parses the metadata again", ck->path, what,
                    dcp_catalog_path(lz->cat));
}

/* Under lz->lock: fill ck->entries[idx] from its row (a no-op when filled). */
static int fill_entry(const dcp_checkpoint *ck, uint64_t idx, const void *key, size_t klen, const void *head,
                      size_t hlen, dcp_error *err)
{
    struct dcpi_lazy *lz = ck->lazy;
    if (!key && klen == 0)
        key = "";   /* SQLite gives NULL for an empty blob: the key "" */
    if (idx >= ck->nentries || !key)
        return damaged(ck, "an entry", err);
    dcp_entry *e = &ck->entries[idx];
    if (e->key)
        return 0;
    dcpi_rbuf r;
    if (memchr(key, 0, klen) ||
        !dcpi_sum_ok(head, hlen, XXH3_64bits_withSeed(key, klen, SEED_HEAD ^ idx), &r))
        goto bad;
    uint64_t bits = dcpi_get_u64(&r);
    dcp_kind kind = (dcp_kind)(bits & 0xff);
    dcp_dtype dt = (dcp_dtype)((bits >> 8) & 0xff);
    int ndim = (int)((bits >> 16) & 0xffff);
    int64_t shape[DCPI_MAX_NDIM];
    if ((kind != DCP_KIND_TENSOR && kind != DCP_KIND_BYTES) || ndim > DCPI_MAX_NDIM ||
        get_dims(&r, shape, ndim) < 0)
        goto bad;
    if (!dcpi_shape_ok(ndim, shape))   /* dcpi_model_set_tensor's rule */
        goto bad;
    dcp_blob blob;
    get_blob(&r, &blob, ck->nfiles);
    uint64_t nchunks = dcpi_get_u64(&r);
    if (r.bad || r.p != r.end || nchunks > lz->nchunks || (kind == DCP_KIND_BYTES && (nchunks || ndim)) ||
        (kind == DCP_KIND_TENSOR && !dcp_dtype_size(dt)))
        goto bad;
    int64_t *s = dcpi_arena_memdup(&lz->arena, shape, (size_t)ndim * sizeof *shape + 1);
    char *k = dcpi_arena_strndup(&lz->arena, key, klen);
    if (!s || !k)
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    e->kind = kind;
    e->dtype = kind == DCP_KIND_TENSOR ? dt : DCP_DTYPE_INVALID;
    e->ndim = ndim;
    e->shape = s;
    e->nchunks = (size_t)nchunks;
    e->blob = blob;
    e->has_blob = (int)((bits >> 32) & 1);
    __atomic_store_n(&e->key, k, __ATOMIC_RELEASE);   /* last: the entry is there */
    return 0;
bad:;
    char what[160];
    snprintf(what, sizeof what, "entry %llu (%.*s)", (unsigned long long)idx, klen > 100 ? 100 : (int)klen,
             (const char *)key);
    return damaged(ck, what, err);
}

static int sqlfail(const dcp_checkpoint *ck, int rc, const char *what, dcp_error *err)
{
    dcpi_catalog_fail(ck->lazy->cat, rc, err, what);
    return dcpi_err_prefix(err, "%s", ck->path);
}

/* Under lz->lock: is the model row still there? A model is removed when its
 * folder's .metadata changed and another open stored the new one. */
static int gone(const dcp_checkpoint *ck, dcp_error *err)
{
    struct dcpi_lazy *lz = ck->lazy;
    sqlite3_reset(lz->alive);
    sqlite3_bind_int64(lz->alive, 1, lz->model);
    int rc = sqlite3_step(lz->alive);
    sqlite3_reset(lz->alive);
    if (rc == SQLITE_ROW)
        return 0;
    if (rc != SQLITE_DONE)
        return sqlfail(ck, rc, "reading the model", err);
    return dcpi_err(err, ESTALE, "%s: the catalog %s no longer holds this checkpoint's model (its .metadata "
                    "changed since it was opened): reopen it", ck->path, dcp_catalog_path(lz->cat));
}

/* ------------------------------------------------------------ falling back */

/* An entry given out from the catalog describes the parsed one: the parse's
 * chunks are copied by the catalog entry's nchunks and ndim (copy_parsed). */
static int same_entry(const dcp_entry *e, const dcp_entry *pe)
{
    if (e->kind != pe->kind || e->dtype != pe->dtype || e->ndim != pe->ndim || e->nchunks != pe->nchunks ||
        e->has_blob != pe->has_blob || memcmp(&e->blob, &pe->blob, sizeof e->blob))
        return 0;
    for (int d = 0; d < e->ndim; d++)
        if (e->shape[d] != pe->shape[d])
            return 0;
    return 1;
}

/* Under lz->lock: the catalog failed (a damaged row, a model removed by
 * another process, an I/O error). Parse the .metadata now and serve the rest
 * of the model from the parse, provided it is still the model that was
 * opened: the same .metadata and the same keys at the entries given out. */
static int fall_back(const dcp_checkpoint *ck, dcp_error *err)
{
    struct dcpi_lazy *lz = ck->lazy;
    if (lz->parsed)
        return 0;
    dcp_checkpoint *p;
    char key[33];
    if (lz->parse(ck->path, &p, err) < 0)
        return -1;
    int same = metadata_key(p, key) == 0 && !strcmp(key, ck->meta.key) && p->nentries == ck->nentries &&
               p->nfiles == ck->nfiles;
    for (size_t i = 0; same && i < ck->nentries; i++)
        same = !ck->entries[i].key ||
               (!strcmp(ck->entries[i].key, p->entries[i].key) && same_entry(&ck->entries[i], &p->entries[i]));
    for (size_t f = 0; same && f < ck->nfiles; f++)
        same = !strcmp(ck->files[f], p->files[f]);
    if (!same) {
        dcp_close(p);
        return dcpi_err(err, ESTALE, "%s: the checkpoint changed since it was opened: reopen it", ck->path);
    }
    __atomic_store_n(&lz->parsed, p, __ATOMIC_RELEASE);   /* read without lz->lock by dcpi_records_keep */
    return 0;
}

/* Under lz->lock: fill entry idx from the parse. */
static void fill_parsed(const dcp_checkpoint *ck, size_t idx)
{
    dcp_entry *e = &ck->entries[idx];
    if (e->key)
        return;
    const dcp_entry *pe = &ck->lazy->parsed->entries[idx];
    e->kind = pe->kind;
    e->dtype = pe->dtype;
    e->ndim = pe->ndim;
    e->shape = pe->shape;   /* the parse lives as long as ck */
    e->nchunks = pe->nchunks;
    e->blob = pe->blob;
    e->has_blob = pe->has_blob;
    __atomic_store_n(&e->key, pe->key, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------ entries */

/* Under lz->lock: every entry's header from the catalog. */
static int all_from_catalog(const dcp_checkpoint *ck, dcp_error *err)
{
    struct dcpi_lazy *lz = ck->lazy;
    int rc = 0, src;
    uint64_t next = 0;
    sqlite3_reset(lz->all);
    sqlite3_bind_int64(lz->all, 1, lz->model);
    while (rc == 0 && (src = sqlite3_step(lz->all)) == SQLITE_ROW) {
        uint64_t idx = (uint64_t)sqlite3_column_int64(lz->all, 0);
        if (idx != next++)
            rc = damaged(ck, "the entry list", err);
        else
            rc = fill_entry(ck, idx, sqlite3_column_blob(lz->all, 1), (size_t)sqlite3_column_bytes(lz->all, 1),
                            sqlite3_column_blob(lz->all, 2), (size_t)sqlite3_column_bytes(lz->all, 2), err);
    }
    if (rc == 0 && src != SQLITE_DONE)
        rc = sqlfail(ck, src, "reading the entries", err);
    if (rc == 0 && next != ck->nentries && gone(ck, err) == 0)
        rc = damaged(ck, "the entry list", err);
    else if (rc == 0 && next != ck->nentries)
        rc = -1;
    sqlite3_reset(lz->all);
    return rc;
}

static int lazy_all(const dcp_checkpoint *ck, dcp_error *err)
{
    struct dcpi_lazy *lz = ck->lazy;
    pthread_mutex_lock(&lz->lock);
    int rc = 0;
    if (!lz->all_done && !lz->parsed && all_from_catalog(ck, err) < 0)
        rc = err->code == ENOMEM ? -1 : fall_back(ck, err);
    if (rc == 0 && lz->parsed)
        for (size_t i = 0; i < ck->nentries; i++)
            fill_parsed(ck, i);
    lz->all_done = rc == 0;
    pthread_mutex_unlock(&lz->lock);
    return rc;
}

/* Under lz->lock: a seek answered by the rows the last seek statement read:
 * key at or after where it started and at or before its last row. */
static int seek_in_rows(const dcp_checkpoint *ck, const char *key, size_t *idx)
{
    const struct dcpi_lazy *lz = ck->lazy;
    if (!lz->seek_from || strcmp(key, lz->seek_from) < 0)
        return 0;
    for (size_t r = 0; r < lz->nseek_rows; r++)
        if (strcmp(ck->entries[lz->seek_rows[r]].key, key) >= 0) {
            *idx = lz->seek_rows[r];
            return 1;
        }
    return 0;
}

/* Under lz->lock: the rows after a seek's answer, kept for the seeks that
 * follow it (seek_in_rows). A row that cannot be taken ends them quietly:
 * it fails the seek that asks for it. */
static void keep_seek_rows(const dcp_checkpoint *ck, sqlite3_stmt *st, const char *key, size_t first)
{
    struct dcpi_lazy *lz = ck->lazy;
    size_t kl = strlen(key);
    char *from = realloc(lz->seek_from, kl + 1);
    lz->nseek_rows = 0;
    if (!from) {
        free(lz->seek_from);
        lz->seek_from = NULL;
        return;
    }
    lz->seek_from = memcpy(from, key, kl + 1);
    lz->seek_rows[lz->nseek_rows++] = first;
    dcp_error quiet;
    while (lz->nseek_rows < DCPI_SEEK_ROWS && sqlite3_step(st) == SQLITE_ROW) {
        uint64_t i = (uint64_t)sqlite3_column_int64(st, 0);
        if (fill_entry(ck, i, sqlite3_column_blob(st, 1), (size_t)sqlite3_column_bytes(st, 1),
                       sqlite3_column_blob(st, 2), (size_t)sqlite3_column_bytes(st, 2), &quiet) < 0)
            break;
        lz->seek_rows[lz->nseek_rows++] = (size_t)i;
    }
}

/* Under lz->lock: the entry with key (or the first >= key) from the catalog. */
static int find_in_catalog(const dcp_checkpoint *ck, const char *key, int seek, size_t *idx, dcp_error *err)
{
    struct dcpi_lazy *lz = ck->lazy;
    if (seek && seek_in_rows(ck, key, idx))
        return 0;
    sqlite3_stmt *st = seek ? lz->seek : lz->exact;
    sqlite3_reset(st);
    sqlite3_bind_int64(st, 1, lz->model);
    sqlite3_bind_blob(st, 2, key, (int)strlen(key), SQLITE_STATIC);
    int rc = 0, src = sqlite3_step(st);
    if (src == SQLITE_ROW) {
        uint64_t i = (uint64_t)sqlite3_column_int64(st, 0);
        const void *k = sqlite3_column_blob(st, 1);
        size_t kl = (size_t)sqlite3_column_bytes(st, 1);
        rc = fill_entry(ck, i, k, kl, sqlite3_column_blob(st, 2), (size_t)sqlite3_column_bytes(st, 2), err);
        if (rc == 0)
            *idx = (size_t)i;
        if (rc == 0 && seek)
            keep_seek_rows(ck, st, key, (size_t)i);
    } else if (src == SQLITE_DONE) {
        rc = gone(ck, err);   /* "no such key", unless the model itself went */
    } else {
        rc = sqlfail(ck, src, "looking up a key", err);
    }
    sqlite3_reset(st);
    return rc;
}

static int lazy_find(const dcp_checkpoint *ck, const char *key, int seek, size_t *idx, dcp_error *err)
{
    struct dcpi_lazy *lz = ck->lazy;
    *idx = SIZE_MAX;
    pthread_mutex_lock(&lz->lock);
    int rc = 0;
    if (!lz->parsed && find_in_catalog(ck, key, seek, idx, err) < 0) {
        *idx = SIZE_MAX;
        rc = err->code == ENOMEM ? -1 : fall_back(ck, err);
    }
    if (rc == 0 && lz->parsed) {
        const dcp_entry *pe = NULL;
        if (seek)
            rc = dcp_seek(lz->parsed, key, &pe, err);
        else
            pe = dcp_find(lz->parsed, key);
        if (pe) {
            *idx = (size_t)(pe - lz->parsed->entries);
            fill_parsed(ck, *idx);
        }
    }
    pthread_mutex_unlock(&lz->lock);
    return rc;
}

/* Decode a chunk list into a new set (*out); every box must lie inside the
 * shape. -1: the row is damaged (a checksum or a bound failed); -2: out of
 * memory, which says nothing about the row. */
static int decode_chunks(dcp_checkpoint *ck, const dcp_entry *e, size_t idx, const void *data, size_t len,
                         dcpi_chunkset **out)
{
    dcpi_rbuf r;
    *out = NULL;
    if (!dcpi_sum_ok(data, len, SEED_CHUNKS ^ (uint64_t)idx, &r))
        return -1;
    size_t n = e->nchunks, nd = (size_t)e->ndim;
    /* each chunk takes at least 6 bytes: bounds the allocation */
    if (n > len / 6 + 1)
        return -1;
    dcpi_chunkset *s = dcpi_chunkset_new(idx, n, nd);
    if (!s)
        return -2;
    int64_t *dims = (int64_t *)(s->records + n);
    for (size_t c = 0; c < n; c++) {
        int64_t *off = dims + 2 * c * nd, *sz = off + nd;
        if (get_dims(&r, off, (int)nd) < 0 || get_dims(&r, sz, (int)nd) < 0)
            break;
        for (size_t d = 0; d < nd; d++) {
            uint64_t end;
            if (!dcpi_add_u64((uint64_t)off[d], (uint64_t)sz[d], &end) || end > (uint64_t)e->shape[d])
                r.bad = 1;
        }
        dcp_chunk *ch = &s->chunks[c];
        ch->offsets = off;
        ch->sizes = sz;
        uint64_t hb = dcpi_get_u64(&r);
        ch->has_blob = (int)(hb & 1);
        get_blob(&r, &ch->blob, ck->nfiles);
        if (hb > 1)
            r.bad = 1;
    }
    if (r.bad || r.p != r.end) {
        free(s);
        return -1;
    }
    *out = s;
    return 0;
}

/* A set holding a copy of the parse's chunks of entry idx. */
static dcpi_chunkset *copy_parsed(dcp_checkpoint *ck, size_t idx)
{
    const dcp_entry *e = &ck->entries[idx];
    const dcp_chunk *src = ck->lazy->parsed->priv[idx].chunks;
    size_t n = e->nchunks, nd = (size_t)e->ndim;
    dcpi_chunkset *s = dcpi_chunkset_new(idx, n, nd);
    if (!s)
        return NULL;
    int64_t *dims = (int64_t *)(s->records + n);
    for (size_t c = 0; c < n; c++) {
        int64_t *off = dims + 2 * c * nd, *sz = off + nd;
        if (nd) {
            memcpy(off, src[c].offsets, nd * sizeof *off);
            memcpy(sz, src[c].sizes, nd * sizeof *sz);
        }
        s->chunks[c] = src[c];
        s->chunks[c].offsets = off;
        s->chunks[c].sizes = sz;
    }
    return s;
}

/* Under lz->lock: the chunk list of entry idx from the catalog. Out of
 * memory is an error like any other (err->code ENOMEM): neither the row nor
 * the model is at fault, and parsing the metadata instead would need more. */
static int chunks_from_catalog(dcp_checkpoint *ck, size_t idx, dcpi_chunkset **out, dcp_error *err)
{
    struct dcpi_lazy *lz = ck->lazy;
    const dcp_entry *e = &ck->entries[idx];
    sqlite3_reset(lz->chunks);
    sqlite3_bind_int64(lz->chunks, 1, lz->model);
    sqlite3_bind_int64(lz->chunks, 2, (sqlite3_int64)idx);
    int rc = 0, src = sqlite3_step(lz->chunks);
    if (src == SQLITE_ROW) {
        const void *data = sqlite3_column_blob(lz->chunks, 0);
        int dc = decode_chunks(ck, e, idx, data, (size_t)sqlite3_column_bytes(lz->chunks, 0), out);
        if (dc == -2)
            rc = dcpi_err(err, ENOMEM, "%s: %s: out of memory", ck->path, e->key);
        else if (dc < 0)
            rc = damaged(ck, e->key, err);
        else
            dcpi_records_load(ck, *out);
    } else if (src == SQLITE_DONE) {
        rc = gone(ck, err) < 0 ? -1 : damaged(ck, e->key, err);
    } else {
        rc = sqlfail(ck, src, "reading chunks", err);
    }
    sqlite3_reset(lz->chunks);
    return rc;
}

static int lazy_chunks(dcp_checkpoint *ck, size_t idx, dcpi_chunkset **out, dcp_error *err)
{
    struct dcpi_lazy *lz = ck->lazy;
    *out = NULL;
    pthread_mutex_lock(&lz->lock);
    int rc = 0;
    if (!lz->parsed && chunks_from_catalog(ck, idx, out, err) < 0)
        rc = err->code == ENOMEM ? -1 : fall_back(ck, err);
    if (rc == 0 && lz->parsed && !(*out = copy_parsed(ck, idx)))
        rc = dcpi_err(err, ENOMEM, "%s: %s: out of memory", ck->path, ck->entries[idx].key);
    pthread_mutex_unlock(&lz->lock);
    return rc;
}

static void lazy_free(struct dcpi_lazy *lz)
{
    if (!lz)
        return;
    sqlite3_finalize(lz->all);
    sqlite3_finalize(lz->exact);
    sqlite3_finalize(lz->seek);
    sqlite3_finalize(lz->chunks);
    sqlite3_finalize(lz->alive);
    dcpi_records_free(lz);
    dcp_catalog_close(lz->cat);
    dcp_close(lz->parsed);
    dcpi_arena_free(&lz->arena);
    free(lz->seek_from);
    pthread_mutex_destroy(&lz->lock);
    free(lz);
}

/* dcp_close: store the records located since the model was opened, then
 * free the store. */
static void lazy_close(dcp_checkpoint *ck)
{
    if (ck->lazy && ck->priv) {
        for (size_t i = 0; i < ck->nentries; i++)
            if (ck->priv[i].set)
                dcpi_records_keep(ck, ck->priv[i].set);
        dcpi_records_flush(ck);
    }
    lazy_free(ck->lazy);
    ck->lazy = NULL;
}

/* The model's store (store.h) while the catalog serves it. */
static const dcpi_store dcpi_store_catalog = {
    .name = "catalog",
    .all = lazy_all,
    .find = lazy_find,
    .chunks = lazy_chunks,
    .drop = dcpi_records_keep,
    .close = lazy_close,
};

/* ------------------------------------------------------------ the tables */

static int prepare(sqlite3 *db, const char *sql, sqlite3_stmt **st)
{
    return sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL) == SQLITE_OK ? 0 : -1;
}

int dcpi_catalog_load(dcp_checkpoint *ck, const char *catalog, dcpi_parse_fn parse)
{
    char key[33];
    dcp_catalog *cat;
    dcp_error err;
    char realbuf[PATH_MAX];
    const char *real = realpath(ck->path, realbuf);
    if (dcp_catalog_check_location(catalog, ck, &err) < 0 || dcp_catalog_open(catalog, &cat, &err) < 0)
        return -1;
    struct dcpi_lazy *lz = calloc(1, sizeof *lz);
    if (!lz) {
        dcp_catalog_close(cat);
        return -1;
    }
    lz->cat = cat;
    pthread_mutex_init(&lz->lock, NULL);
    dcpi_arena_init(&lz->arena);
    lz->parse = parse;
    ck->lazy = lz;   /* dcp_close frees it */
    ck->store = &dcpi_store_catalog;
    sqlite3 *db = dcpi_catalog_db(cat);
    sqlite3_stmt *st;
    int rc = -1, src = SQLITE_OK;
    uint64_t db_bytes = 0;
    sqlite3_int64 pages = 0, psize = 0;
    if (sqlite3_prepare_v2(db, "SELECT * FROM pragma_page_count(), pragma_page_size()", -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW) {
            pages = sqlite3_column_int64(st, 0);
            psize = sqlite3_column_int64(st, 1);
        }
        sqlite3_finalize(st);
    }
    if (pages > 0 && psize > 0)
        db_bytes = (uint64_t)pages * (uint64_t)psize;
    /* By the .metadata's stamp (no read of it), else by its content key. */
    metadata_stamp(ck);
    /* A row found by stamp is the row the content key would find (the same
     * file): when it does not serve, the caller parses; no second lookup. */
    int stamp_hit = 0;
    for (int by_key = !stamp_usable(ck) || !real; by_key < 2 && rc < 0 && !stamp_hit; by_key++) {
        if (by_key && metadata_key(ck, key) < 0)
            break;
        src = sqlite3_prepare_v2(db, by_key ? "SELECT id, xxh3, head, metadata_key FROM models WHERE metadata_key=?1"
                                            : "SELECT id, xxh3, head, metadata_key FROM models WHERE path=?1 AND stamp=?2",
                                 -1, &st, NULL);
        if (src != SQLITE_OK)
            break;
        sqlite3_bind_text(st, 1, by_key ? key : real, -1, SQLITE_STATIC);
        if (!by_key)
            sqlite3_bind_text(st, 2, ck->meta.stamp, -1, SQLITE_STATIC);
        if ((src = sqlite3_step(st)) == SQLITE_ROW) {
            stamp_hit = !by_key;
            const unsigned char *data = sqlite3_column_blob(st, 2), *mkey = sqlite3_column_text(st, 3);
            size_t len = (size_t)sqlite3_column_bytes(st, 2);
            lz->model = sqlite3_column_int64(st, 0);
            /* SQLite checks its pages, not what is in them: the record's checksum does. */
            if (data && mkey && strlen((const char *)mkey) == 32 &&
                XXH3_64bits(data, len) == (uint64_t)sqlite3_column_int64(st, 1)) {
                memcpy(ck->meta.key, mkey, 33);
                rc = get_head(ck, data, len, db_bytes, &lz->nchunks);
            }
        }
        sqlite3_finalize(st);
    }
    if (src != SQLITE_OK && src != SQLITE_ROW && src != SQLITE_DONE)
        dcpi_catalog_fail(cat, src, &err, "reading a model");
    if (rc == 0) {
        char pragma[64];
        snprintf(pragma, sizeof pragma, "PRAGMA cache_size=-%d", LAZY_CACHE_KIB);
        sqlite3_exec(db, pragma, NULL, NULL, NULL);
        if (prepare(db, "SELECT idx, key, head FROM model_entries WHERE model=? ORDER BY idx", &lz->all) < 0 ||
            prepare(db, "SELECT idx, key, head FROM model_entries WHERE model=?1 AND key=?2", &lz->exact) < 0 ||
            prepare(db, "SELECT idx, key, head FROM model_entries INDEXED BY model_entries_by_key"
                        " WHERE model=?1 AND key>=?2 ORDER BY key LIMIT " DCPI_STR(DCPI_SEEK_ROWS), &lz->seek) < 0 ||
            prepare(db, "SELECT chunks FROM model_entries WHERE model=? AND idx=?", &lz->chunks) < 0 ||
            prepare(db, "SELECT 1 FROM models WHERE id=?", &lz->alive) < 0 || dcpi_records_prepare(ck) < 0)
            rc = -1;
    }
    return rc;
}

/* Every entry's header and chunks into model_entries (under a transaction). */
static int store_entries(dcp_checkpoint *ck, sqlite3 *db, sqlite3_int64 model)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(db, "INSERT INTO model_entries VALUES(?,?,?,?,?)", -1, &st, NULL);
    dcpi_wbuf h = {0}, c = {0};
    for (size_t i = 0; rc == SQLITE_OK && i < ck->nentries; i++) {
        const dcp_entry *e = &ck->entries[i];
        const dcp_chunk *chunks;   /* in memory, or a set read back (a spilled model) */
        dcp_error err;
        if (dcp_entry_chunks(ck, e, &chunks, &err) < 0) {
            rc = SQLITE_ERROR;
            break;
        }
        put_entry(&h, e, i);
        put_chunks(&c, e, chunks, i);
        dcp_release_chunks(ck, e);
        if (h.oom || c.oom) {
            rc = SQLITE_NOMEM;
            break;
        }
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, model);
        sqlite3_bind_int64(st, 2, (sqlite3_int64)i);
        sqlite3_bind_blob(st, 3, e->key, (int)strlen(e->key), SQLITE_STATIC);
        sqlite3_bind_blob64(st, 4, h.p, h.n, SQLITE_STATIC);
        sqlite3_bind_blob64(st, 5, c.p, c.n, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_DONE)
            rc = sqlite3_errcode(db);
    }
    sqlite3_finalize(st);
    free(h.p);
    free(c.p);
    return rc;
}

/* Run one statement binding text a1 (and a2 when not NULL). */
static int exec2(sqlite3 *db, const char *sql, const char *a1, const char *a2)
{
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    sqlite3_bind_text(st, 1, a1, -1, SQLITE_STATIC);
    if (a2)
        sqlite3_bind_text(st, 2, a2, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        ;
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

int dcpi_catalog_store(dcp_checkpoint *ck, const char *catalog)
{
    char key[33], real[PATH_MAX];
    dcpi_wbuf w = {0};
    dcp_catalog *cat = NULL;
    dcp_error err;
    uint64_t nchunks = 0;
    for (size_t i = 0; i < ck->nentries; i++)
        nchunks += ck->entries[i].nchunks;
    metadata_stamp(ck);   /* (a parse set both from its read) before the key: a change in between makes the stamp stale, never the key */
    if (dcp_catalog_check_location(catalog, ck, &err) < 0 || metadata_key(ck, key) < 0 ||
        put_head(ck, &w, nchunks) < 0 || !realpath(ck->path, real) || dcp_catalog_open(catalog, &cat, &err) < 0) {
        dcp_catalog_close(cat);
        free(w.p);
        return -1;
    }
    sqlite3 *db = dcpi_catalog_db(cat);
    sqlite3_stmt *st;
    int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), have = 0;
    if (rc == SQLITE_OK && (rc = sqlite3_prepare_v2(db, "SELECT head FROM models WHERE metadata_key=?", -1, &st, NULL)) ==
                               SQLITE_OK) {
        /* The same model stored meanwhile by another process (or for a copy
         * of this folder) stays: others may be serving from it. One with
         * other shard sizes is stale. */
        sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        have = rc == SQLITE_ROW && (size_t)sqlite3_column_bytes(st, 0) == w.n &&
               !memcmp(sqlite3_column_blob(st, 0), w.p, w.n);
        rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
        sqlite3_finalize(st);
    }
    if (rc == SQLITE_OK && !have) {
        /* One model per folder: an older one of the same path is stale. */
        const char *stale = "SELECT id FROM models WHERE path=?1 OR metadata_key=?2";
        char sql[160];
        snprintf(sql, sizeof sql, "DELETE FROM model_entries WHERE model IN (%s)", stale);
        rc = exec2(db, sql, real, key);
        snprintf(sql, sizeof sql, "DELETE FROM model_records WHERE model IN (%s)", stale);
        if (rc == SQLITE_OK)
            rc = exec2(db, sql, real, key);
        if (rc == SQLITE_OK)
            rc = exec2(db, "DELETE FROM models WHERE path=?1 OR metadata_key=?2", real, key);
        if (rc == SQLITE_OK &&
            (rc = sqlite3_prepare_v2(db, "INSERT INTO models(metadata_key, path, stamp, xxh3, head) VALUES(?,?,?,?,?)",
                                     -1, &st, NULL)) == SQLITE_OK) {
            sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 2, real, -1, SQLITE_STATIC);
            if (stamp_usable(ck))
                sqlite3_bind_text(st, 3, ck->meta.stamp, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 4, (sqlite3_int64)XXH3_64bits(w.p, w.n));
            sqlite3_bind_blob64(st, 5, w.p, w.n, SQLITE_STATIC);
            rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(db);
            sqlite3_finalize(st);
        }
        if (rc == SQLITE_OK)
            rc = store_entries(ck, db, sqlite3_last_insert_rowid(db));
    }
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        dcpi_catalog_fail(cat, rc, &err, "storing a model");
    }
    dcp_catalog_close(cat);
    free(w.p);
    return rc == SQLITE_OK ? 0 : -1;
}
