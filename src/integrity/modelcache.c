/* The model cache: what parsing .metadata produced (keys, dtypes, shapes,
 * chunks, blob locations, files and their sizes, info) stored in the catalog
 * as one record per checkpoint, so that a later open of an unchanged
 * checkpoint skips the pickle entirely. The record is keyed by the .metadata
 * file's size, mtime and XXH3 and checked against the shard files' sizes on
 * load; it is parsed as hostile input, and any doubt means "parse again". */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "dcp_integrity.h"
#include "internal.h"

#define MAGIC "DCPMODL1"

/* ------------------------------------------------------------ metadata key */

static int metadata_key(dcp_checkpoint *ck, char key[33])
{
    int fd = openat(ck->dirfd, ".metadata", O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return -1;
    if (fstat(fd, &sb) < 0) {
        close(fd);
        return -1;
    }
    XXH3_state_t *st = XXH3_createState();
    char *buf = malloc(8u << 20);
    ssize_t r = -1;
    if (st && buf) {
        XXH3_128bits_reset(st);
        uint64_t v[3] = {(uint64_t)sb.st_size, (uint64_t)sb.st_mtim.tv_sec, (uint64_t)sb.st_mtim.tv_nsec};
        XXH3_128bits_update(st, v, sizeof v);
        while ((r = read(fd, buf, 8u << 20)) > 0)
            XXH3_128bits_update(st, buf, (size_t)r);
        XXH128_hash_t h = XXH3_128bits_digest(st);
        snprintf(key, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
    }
    free(buf);
    XXH3_freeState(st);
    close(fd);
    return r == 0 ? 0 : -1;
}

/* ------------------------------------------------------------ serialising */

typedef struct wbuf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} wbuf;

static void put(wbuf *w, const void *src, size_t n)
{
    if (w->oom || n == 0)   /* n == 0: src may be NULL (a 0-d shape) */
        return;
    if (w->n + n > w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 1 << 16;
        while (nc < w->n + n)
            nc *= 2;
        unsigned char *np = realloc(w->p, nc);
        if (!np) {
            w->oom = 1;
            return;
        }
        w->p = np;
        w->cap = nc;
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
}
static void put_u64(wbuf *w, uint64_t v) { put(w, &v, 8); }
static void put_str(wbuf *w, const char *s)
{
    put_u64(w, s ? strlen(s) : UINT64_MAX);
    if (s)
        put(w, s, strlen(s));
}
static void put_blob(wbuf *w, const dcp_blob *b)
{
    put_u64(w, b->file);
    put_u64(w, b->transforms);
    put_u64(w, b->offset);
    put_u64(w, b->length);
}

static int serialise(dcp_checkpoint *ck, wbuf *w)
{
    put(w, MAGIC, 8);
    put_u64(w, ck->nfiles);
    for (size_t f = 0; f < ck->nfiles; f++) {
        uint64_t size;
        dcp_error err;
        if (dcpi_ck_file_size(ck, (uint32_t)f, &size, &err) < 0)
            return -1;   /* a missing shard: not worth caching */
        put_str(w, ck->files[f]);
        put_u64(w, size);
    }
    const dcp_info *in = &ck->info;
    put_str(w, in->generation);
    put_str(w, in->serialization);
    put_str(w, in->layout);
    put_str(w, in->version);
    put_str(w, in->checkpoint_id);
    put_str(w, in->save_id);
    put_u64(w, (uint64_t)in->has_planner_data | (uint64_t)in->megatron << 1);
    put_u64(w, in->metadata_bytes);
    put_u64(w, ck->nentries);
    for (size_t i = 0; i < ck->nentries; i++) {
        const dcp_entry *e = &ck->entries[i];
        put_str(w, e->key);
        put_u64(w, (uint64_t)e->kind | (uint64_t)e->dtype << 8 | (uint64_t)e->ndim << 16 | (uint64_t)e->has_blob << 32);
        put(w, e->shape, (size_t)e->ndim * sizeof(int64_t));
        put_blob(w, &e->blob);
        put_u64(w, e->nchunks);
        for (size_t c = 0; c < e->nchunks; c++) {
            put(w, e->chunks[c].offsets, (size_t)e->ndim * sizeof(int64_t));
            put(w, e->chunks[c].sizes, (size_t)e->ndim * sizeof(int64_t));
            put_u64(w, (uint64_t)e->chunks[c].has_blob);
            put_blob(w, &e->chunks[c].blob);
        }
    }
    return w->oom ? -1 : 0;
}

/* ------------------------------------------------------------ loading */

typedef struct rbuf {
    const unsigned char *p, *end;
    int bad;
} rbuf;

static const void *take(rbuf *r, size_t n)
{
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = 1;
        return NULL;
    }
    const void *p = r->p;
    r->p += n;
    return p;
}
static uint64_t get_u64(rbuf *r)
{
    uint64_t v = 0;
    const void *p = take(r, 8);
    if (p)
        memcpy(&v, p, 8);
    return v;
}
/* A string copied into the arena (NULL stays NULL). */
static const char *get_str(rbuf *r, dcp_checkpoint *ck, size_t *len)
{
    uint64_t n = get_u64(r);
    if (n == UINT64_MAX)
        return NULL;
    const char *p = take(r, n);
    if (!p)
        return NULL;
    if (len)
        *len = n;
    char *s = dcpi_arena_strndup(&ck->arena, p, n);
    if (!s)
        r->bad = 1;
    return s;
}
static void get_blob(rbuf *r, dcp_blob *b, size_t nfiles)
{
    uint64_t f = get_u64(r), t = get_u64(r);
    b->offset = get_u64(r);
    b->length = get_u64(r);
    if (f >= nfiles || t > UINT32_MAX || b->offset > UINT64_MAX - b->length)
        r->bad = 1;
    b->file = (uint32_t)f;
    b->transforms = (uint32_t)t;
}

static int deserialise(dcp_checkpoint *ck, const unsigned char *data, size_t len)
{
    rbuf r = {data, data + len, 0};
    dcp_error err;
    const char *magic = take(&r, 8);
    if (!magic || memcmp(magic, MAGIC, 8))
        return -1;
    uint64_t nfiles = get_u64(&r);
    if (nfiles > len / 16)
        return -1;
    for (uint64_t f = 0; f < nfiles && !r.bad; f++) {
        size_t n = 0;
        const char *name = get_str(&r, ck, &n);
        uint64_t size = get_u64(&r), now;
        uint32_t idx;
        if (!name || dcpi_model_file(ck, name, n, &idx, &err) < 0 || idx != f)
            return -1;
        /* A shard whose size changed makes the record stale. */
        struct stat sb;
        if (fstatat(ck->dirfd, name, &sb, 0) < 0 || !S_ISREG(sb.st_mode) || (now = (uint64_t)sb.st_size) != size)
            return -1;
    }
    dcp_info *in = &ck->info;
    in->generation = get_str(&r, ck, NULL);
    in->serialization = get_str(&r, ck, NULL);
    in->layout = get_str(&r, ck, NULL);
    in->version = get_str(&r, ck, NULL);
    in->checkpoint_id = get_str(&r, ck, NULL);
    in->save_id = get_str(&r, ck, NULL);
    uint64_t flags = get_u64(&r);
    in->has_planner_data = (int)(flags & 1);
    in->megatron = (int)((flags >> 1) & 1);
    in->metadata_bytes = get_u64(&r);
    uint64_t nentries = get_u64(&r);
    if (nentries > len / 16)
        return -1;
    int64_t shape[DCPI_MAX_NDIM];
    for (uint64_t i = 0; i < nentries && !r.bad; i++) {
        size_t klen = 0, idx;
        const char *key = get_str(&r, ck, &klen);
        uint64_t bits = get_u64(&r);
        dcp_kind kind = (dcp_kind)(bits & 0xff);
        int ndim = (int)((bits >> 16) & 0xffff);
        if (!key || (kind != DCP_KIND_TENSOR && kind != DCP_KIND_BYTES) || ndim > DCPI_MAX_NDIM)
            return -1;
        const void *sp = take(&r, (size_t)ndim * sizeof(int64_t));
        if (!sp)
            return -1;
        memcpy(shape, sp, (size_t)ndim * sizeof(int64_t));
        if (dcpi_model_entry(ck, key, klen, kind, &idx, &err) < 0)
            return -1;
        if (kind == DCP_KIND_TENSOR &&
            dcpi_model_set_tensor(ck, idx, (dcp_dtype)((bits >> 8) & 0xff), ndim, shape, &err) < 0)
            return -1;
        dcp_entry *e = &ck->entries[idx];
        get_blob(&r, &e->blob, ck->nfiles);
        e->has_blob = (int)((bits >> 32) & 1);
        uint64_t nchunks = get_u64(&r);
        if (nchunks > len / 16 || (kind == DCP_KIND_BYTES && nchunks))
            return -1;
        for (uint64_t c = 0; c < nchunks && !r.bad; c++) {
            const void *o = take(&r, (size_t)ndim * sizeof(int64_t));
            const void *s = take(&r, (size_t)ndim * sizeof(int64_t));
            int64_t off[DCPI_MAX_NDIM], sz[DCPI_MAX_NDIM];
            size_t ci;
            if (!o || !s)
                return -1;
            memcpy(off, o, (size_t)ndim * sizeof(int64_t));
            memcpy(sz, s, (size_t)ndim * sizeof(int64_t));
            if (dcpi_model_add_chunk(ck, idx, off, sz, &ci, &err) < 0)   /* re-checks the box */
                return -1;
            ck->priv[idx].chunks[ci].has_blob = (int)(get_u64(&r) & 1);
            get_blob(&r, &ck->priv[idx].chunks[ci].blob, ck->nfiles);
        }
    }
    return r.bad || r.p != r.end ? -1 : 0;
}

/* ------------------------------------------------------------ the table */

static sqlite3 *open_db(const char *path)
{
    dcp_catalog *cat;
    dcp_error err;
    /* dcp_catalog_open creates, checks and repairs the file; we then talk
     * to SQLite directly through our own connection. */
    if (dcp_catalog_open(path, &cat, &err) < 0)
        return NULL;
    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s", dcp_catalog_path(cat));
    dcp_catalog_close(cat);
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(file, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, 30000);
    if (sqlite3_exec(db,
                     "CREATE TABLE IF NOT EXISTS models(metadata_key TEXT PRIMARY KEY, path TEXT NOT NULL,"
                     " data BLOB NOT NULL);"
                     "CREATE INDEX IF NOT EXISTS models_by_path ON models(path);",
                     NULL, NULL, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return NULL;
    }
    return db;
}

int dcpi_catalog_load(dcp_checkpoint *ck, const char *catalog)
{
    char key[33];
    if (metadata_key(ck, key) < 0)
        return -1;
    sqlite3 *db = open_db(catalog);
    if (!db)
        return -1;
    sqlite3_stmt *st;
    int rc = -1;
    if (sqlite3_prepare_v2(db, "SELECT data FROM models WHERE metadata_key=?", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
        if (sqlite3_step(st) == SQLITE_ROW) {
            const unsigned char *data = sqlite3_column_blob(st, 0);
            size_t len = (size_t)sqlite3_column_bytes(st, 0);
            rc = data ? deserialise(ck, data, len) : -1;
        }
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return rc;
}

void dcpi_catalog_store(dcp_checkpoint *ck, const char *catalog)
{
    char key[33], real[PATH_MAX];
    wbuf w = {0};
    if (metadata_key(ck, key) < 0 || serialise(ck, &w) < 0 || !realpath(ck->path, real)) {
        free(w.p);
        return;
    }
    sqlite3 *db = open_db(catalog);
    sqlite3_stmt *st;
    if (db && sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK) {
        /* One record per folder: an older one of the same path is stale. */
        if (sqlite3_prepare_v2(db, "DELETE FROM models WHERE path=?", -1, &st, NULL) == SQLITE_OK) {
            sqlite3_bind_text(st, 1, real, -1, SQLITE_STATIC);
            sqlite3_step(st);
            sqlite3_finalize(st);
        }
        if (sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO models VALUES(?,?,?)", -1, &st, NULL) == SQLITE_OK) {
            sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 2, real, -1, SQLITE_STATIC);
            sqlite3_bind_blob64(st, 3, w.p, w.n, SQLITE_STATIC);
            sqlite3_step(st);
            sqlite3_finalize(st);
        }
        sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    }
    sqlite3_close(db);
    free(w.p);
}
