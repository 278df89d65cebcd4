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

#include "integrity.h"

#define MAGIC "DCPMODL3"   /* little-endian varints; see serialise(). Bump when
                              * parsing changes what a model holds (3: generation
                              * strings, rank-local file names) */

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
    char *buf = malloc(1u << 20);   /* stays in cache while it is hashed */
    ssize_t r = -1;
    if (st && buf) {
        XXH3_128bits_reset(st);
        uint64_t v[3] = {(uint64_t)sb.st_size, (uint64_t)sb.st_mtim.tv_sec, (uint64_t)sb.st_mtim.tv_nsec};
        XXH3_128bits_update(st, v, sizeof v);
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        while ((r = read(fd, buf, 1u << 20)) > 0)
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
/* LEB128: most numbers of a model (dims, file indexes, lengths) take 1-3 bytes. */
static void put_u64(wbuf *w, uint64_t v)
{
    unsigned char b[10];
    size_t n = 0;
    do {
        b[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        b[n++] |= v ? 0x80 : 0;
    } while (v);
    put(w, b, n);
}
static void put_dims(wbuf *w, const int64_t *d, int ndim)
{
    for (int i = 0; i < ndim; i++)
        put_u64(w, (uint64_t)d[i]);
}
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
        put_dims(w, e->shape, e->ndim);
        put_blob(w, &e->blob);
        put_u64(w, e->nchunks);
        for (size_t c = 0; c < e->nchunks; c++) {
            put_dims(w, e->chunks[c].offsets, e->ndim);
            put_dims(w, e->chunks[c].sizes, e->ndim);
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
    for (unsigned shift = 0; !r->bad; shift += 7) {
        if (r->p == r->end || shift > 63 || (shift == 63 && (*r->p & 0x7e))) {
            r->bad = 1;
            break;
        }
        unsigned char b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    return 0;
}
/* ndim dimensions; each must fit int64 (the builder checks the rest). */
static int get_dims(rbuf *r, int64_t *d, int ndim)
{
    for (int i = 0; i < ndim; i++) {
        uint64_t v = get_u64(r);
        if (v > INT64_MAX)
            r->bad = 1;
        d[i] = (int64_t)v;
    }
    return r->bad ? -1 : 0;
}
/* A string copied into the arena (NULL stays NULL). */
static const char *get_str(rbuf *r, dcp_checkpoint *ck, size_t *len)
{
    uint64_t n = get_u64(r);
    if (n == UINT64_MAX)
        return NULL;
    const char *p = n <= (size_t)(r->end - r->p) ? take(r, (size_t)n) : (r->bad = 1, NULL);
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

/* The chunks of entry idx, built in place rather than one by one through
 * dcpi_model_add_chunk (a million chunks: a third of the memory and time):
 * one exactly sized array, all offsets in one arena block, and a sizes
 * vector shared with the previous chunk when equal (most chunks of a key
 * have the same box size). Checks each box as the builder does. */
static int add_chunks(dcp_checkpoint *ck, size_t idx, rbuf *r, uint64_t nchunks)
{
    dcp_entry *e = &ck->entries[idx];
    struct dcpi_entry_priv *p = &ck->priv[idx];
    int ndim = e->ndim;
    size_t per = (size_t)ndim * sizeof(int64_t);
    int64_t *offs = dcpi_arena_alloc(&ck->arena, nchunks * per > 16 ? nchunks * per : 16);
    if (!offs || !(p->chunks = malloc(nchunks * sizeof *p->chunks)))
        return -1;
    p->chunk_cap = nchunks;
    e->chunks = p->chunks;
    const int64_t *prev = offs;   /* any valid pointer for ndim 0 */
    for (uint64_t c = 0; c < nchunks; c++) {
        int64_t *off = offs + c * (size_t)ndim, sz[DCPI_MAX_NDIM];
        if (get_dims(r, off, ndim) < 0 || get_dims(r, sz, ndim) < 0)
            return -1;
        for (int d = 0; d < ndim; d++) {
            uint64_t end;
            if (!dcpi_add_u64((uint64_t)off[d], (uint64_t)sz[d], &end) || end > (uint64_t)e->shape[d])
                return -1;
        }
        if (c == 0 || memcmp(prev, sz, per)) {
            int64_t *copy = dcpi_arena_memdup(&ck->arena, sz, per ? per : 1);
            if (!copy)
                return -1;
            prev = copy;
        }
        dcp_chunk *ch = &p->chunks[c];
        ch->offsets = off;
        ch->sizes = prev;
        ch->has_blob = (int)(get_u64(r) & 1);
        get_blob(r, &ch->blob, ck->nfiles);
        e->nchunks = c + 1;
    }
    return r->bad ? -1 : 0;
}

static int deserialise(dcp_checkpoint *ck, const unsigned char *data, size_t len)
{
    rbuf r = {data, data + len, 0};
    dcp_error err;
    const char *magic = take(&r, 8);
    if (!magic || memcmp(magic, MAGIC, 8))
        return -1;
    uint64_t nfiles = get_u64(&r);
    if (nfiles > len / 2)
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
    if (nentries > len / 4)
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
        if (get_dims(&r, shape, ndim) < 0)
            return -1;
        /* A key seen twice would add chunks to the first: not a record we wrote. */
        if (dcpi_model_entry(ck, key, klen, kind, &idx, &err) < 0 || idx != i)
            return -1;
        if (kind == DCP_KIND_TENSOR &&
            dcpi_model_set_tensor(ck, idx, (dcp_dtype)((bits >> 8) & 0xff), ndim, shape, &err) < 0)
            return -1;
        dcp_entry *e = &ck->entries[idx];
        get_blob(&r, &e->blob, ck->nfiles);
        e->has_blob = (int)((bits >> 32) & 1);
        uint64_t nchunks = get_u64(&r);
        /* each chunk takes at least 6 bytes: bounds the allocation below */
        if (nchunks > (size_t)(r.end - r.p) / 6 || (kind == DCP_KIND_BYTES && nchunks))
            return -1;
        if (nchunks && add_chunks(ck, idx, &r, nchunks) < 0)
            return -1;
    }
    return r.bad || r.p != r.end ? -1 : 0;
}

/* ------------------------------------------------------------ the table */

int dcpi_catalog_load(dcp_checkpoint *ck, const char *catalog)
{
    char key[33];
    dcp_catalog *cat;
    dcp_error err;
    if (dcp_catalog_check_location(catalog, ck, &err) < 0 || metadata_key(ck, key) < 0 ||
        dcp_catalog_open(catalog, &cat, &err) < 0)
        return -1;
    sqlite3 *db = dcpi_catalog_db(cat);
    sqlite3_stmt *st;
    int rc = -1, src;
    if ((src = sqlite3_prepare_v2(db, "SELECT xxh3, data FROM models WHERE metadata_key=?", -1, &st, NULL)) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
        if ((src = sqlite3_step(st)) == SQLITE_ROW) {
            const unsigned char *data = sqlite3_column_blob(st, 1);
            size_t len = (size_t)sqlite3_column_bytes(st, 1);
            /* SQLite checks its pages, not what is in them: the record's checksum does. */
            if (data && XXH3_64bits(data, len) == (uint64_t)sqlite3_column_int64(st, 0))
                rc = deserialise(ck, data, len);
        }
        sqlite3_finalize(st);
    }
    if (src != SQLITE_OK && src != SQLITE_ROW && src != SQLITE_DONE)
        dcpi_catalog_fail(cat, src, &err, "reading a model");
    dcp_catalog_close(cat);
    return rc;
}

void dcpi_catalog_store(dcp_checkpoint *ck, const char *catalog)
{
    char key[33], real[PATH_MAX];
    wbuf w = {0};
    dcp_catalog *cat = NULL;
    dcp_error err;
    if (dcp_catalog_check_location(catalog, ck, &err) < 0 || metadata_key(ck, key) < 0 || serialise(ck, &w) < 0 ||
        !realpath(ck->path, real) || dcp_catalog_open(catalog, &cat, &err) < 0) {
        dcp_catalog_close(cat);
        free(w.p);
        return;
    }
    sqlite3 *db = dcpi_catalog_db(cat);
    sqlite3_stmt *st;
    int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc == SQLITE_OK) {
        /* One record per folder: an older one of the same path is stale. */
        if ((rc = sqlite3_prepare_v2(db, "DELETE FROM models WHERE path=?", -1, &st, NULL)) == SQLITE_OK) {
            sqlite3_bind_text(st, 1, real, -1, SQLITE_STATIC);
            rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(db);
            sqlite3_finalize(st);
        }
        if (rc == SQLITE_OK &&
            (rc = sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO models VALUES(?,?,?,?)", -1, &st, NULL)) == SQLITE_OK) {
            sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 2, real, -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 3, (sqlite3_int64)XXH3_64bits(w.p, w.n));
            sqlite3_bind_blob64(st, 4, w.p, w.n, SQLITE_STATIC);
            rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(db);
            sqlite3_finalize(st);
        }
        sqlite3_exec(db, rc == SQLITE_OK ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
    }
    if (rc != SQLITE_OK)
        dcpi_catalog_fail(cat, rc, &err, "storing a model");
    dcp_catalog_close(cat);
    free(w.p);
}
