/* Chunk records in the catalog: where each chunk's elements are in its shard
 * file (data offset and length, storage offset, strides, stored dtype), as
 * the record locator found them by parsing the chunk's torch.save zip. A
 * served model stores the records it located, so that a later open reads
 * them back instead of parsing every zip again.
 *
 *   model_records  one row per entry: the stamp (size, mtime, ctime, inode)
 *                  of each shard file its chunks use, then each chunk's
 *                  record or "not located", closed by an XXH3.
 *
 * Records come from the shard files, not from .metadata, so they are used
 * only while every file they came from has the stamp it had when they were
 * stored; otherwise they are ignored and located again. Like everything
 * read from the catalog they are hostile input: bounds-checked here, and
 * every record is checked against its chunk again when a read is planned.
 * Writing is best effort and never waits: records located since a chunk
 * set was read are kept when the set is dropped (outside ck->lock), and
 * stored in batches by a background thread on a connection of its own (so
 * neither ck->lock nor lz->lock is held while SQLite writes, and no read
 * waits for it), the rest at dcp_close; a busy or read-only catalog only
 * costs locating them again later.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "integrity.h"

#define SEED_RECORDS 0x72656373u   /* "recs" */
#define BATCH 64                   /* entries' records stored per transaction */
#define WRITE_WAIT_MS 50           /* a busy catalog is skipped, not waited for */

struct dcpi_file_stamp {
    int taken, ok;
    uint64_t size, mtime, ctime, ino;
};

struct dcpi_pending {
    struct dcpi_pending *next;
    size_t idx, len;
    unsigned char data[];
};

int dcpi_records_prepare(dcp_checkpoint *ck)
{
    struct dcpi_lazy *lz = ck->lazy;
    pthread_mutex_init(&lz->pending_lock, NULL);
    pthread_cond_init(&lz->pending_cond, NULL);
    lz->stamps = calloc(ck->nfiles ? ck->nfiles : 1, sizeof *lz->stamps);
    if (!lz->stamps)
        return -1;
    return sqlite3_prepare_v3(dcpi_catalog_db(lz->cat), "SELECT data FROM model_records WHERE model=? AND idx=?", -1,
                              SQLITE_PREPARE_PERSISTENT, &lz->records, NULL) == SQLITE_OK ? 0 : -1;
}

static void free_list(struct dcpi_pending *p)
{
    for (struct dcpi_pending *n; p; p = n) {
        n = p->next;
        free(p);
    }
}

/* The background flusher ends (the batches it took are stored). */
static void stop_flusher(struct dcpi_lazy *lz)
{
    pthread_mutex_lock(&lz->pending_lock);
    int running = lz->flusher_state == 1;
    if (running)
        lz->flusher_state = 2;
    pthread_cond_broadcast(&lz->pending_cond);
    pthread_mutex_unlock(&lz->pending_lock);
    if (running)
        pthread_join(lz->flusher, NULL);
}

void dcpi_records_free(struct dcpi_lazy *lz)
{
    if (!lz->stamps)
        return;   /* never prepared */
    stop_flusher(lz);
    free_list(lz->pending);
    sqlite3_finalize(lz->records);
    free(lz->stamps);
    pthread_cond_destroy(&lz->pending_cond);
    pthread_mutex_destroy(&lz->pending_lock);
}

/* Under lz->lock: file f's stamp, taken once per open. */
static const struct dcpi_file_stamp *stamp_of(dcp_checkpoint *ck, uint32_t f)
{
    struct dcpi_file_stamp *s = &ck->lazy->stamps[f];
    if (!s->taken) {
        struct stat sb;
        s->ok = fstatat(ck->dirfd, ck->files[f], &sb, 0) == 0;
        if (s->ok) {
            s->size = (uint64_t)sb.st_size;
            s->mtime = (uint64_t)sb.st_mtim.tv_sec * 1000000000u + (uint64_t)sb.st_mtim.tv_nsec;
            s->ctime = (uint64_t)sb.st_ctim.tv_sec * 1000000000u + (uint64_t)sb.st_ctim.tv_nsec;
            s->ino = (uint64_t)sb.st_ino;
        }
        s->taken = 1;
    }
    return s;
}

/* Decode a records row into s (all or nothing). */
static int decode(dcp_checkpoint *ck, dcpi_chunkset *s, const void *data, size_t len)
{
    const dcp_entry *e = &ck->entries[s->idx];
    size_t nd = (size_t)e->ndim;
    dcpi_rbuf r;
    if (!dcpi_sum_ok(data, len, SEED_RECORDS ^ (uint64_t)s->idx, &r))
        return -1;
    uint64_t nused = dcpi_get_u64(&r);
    if (nused > ck->nfiles)
        return -1;
    for (uint64_t i = 0; i < nused && !r.bad; i++) {
        uint64_t f = dcpi_get_u64(&r), v[4];
        for (int k = 0; k < 4; k++)
            v[k] = dcpi_get_u64(&r);
        if (r.bad || f >= ck->nfiles)
            return -1;
        const struct dcpi_file_stamp *st = stamp_of(ck, (uint32_t)f);
        if (!st->ok || st->size != v[0] || st->mtime != v[1] || st->ctime != v[2] || st->ino != v[3])
            return -1;   /* the file changed since: locate again */
    }
    for (size_t c = 0; c < e->nchunks && !r.bad; c++) {
        uint64_t state = dcpi_get_u64(&r);
        if (state == 0)
            continue;
        dcp_record *rec = &s->records[c].rec;
        int64_t *stride = s->strides + c * nd;
        rec->data_offset = dcpi_get_u64(&r);
        rec->data_length = dcpi_get_u64(&r);
        uint64_t so = dcpi_get_u64(&r), dt = dcpi_get_u64(&r), flags = dcpi_get_u64(&r);
        for (size_t d = 0; d < nd; d++) {
            uint64_t v = dcpi_get_u64(&r);
            stride[d] = (int64_t)v;
            if (v > INT64_MAX)
                r.bad = 1;
        }
        if (state != 1 || so > INT64_MAX || dt >= DCP_DTYPE_COUNT || !dcp_dtype_size((dcp_dtype)dt) || flags > 0xf ||
            rec->data_offset > UINT64_MAX - rec->data_length)
            r.bad = 1;
        rec->storage_offset = (int64_t)so;
        rec->dtype = (dcp_dtype)dt;
        rec->flags = (uint32_t)flags;
        rec->stride = stride;
        s->records[c].state = 1;
    }
    return r.bad || r.p != r.end ? -1 : 0;
}

void dcpi_records_load(dcp_checkpoint *ck, dcpi_chunkset *s)
{
    struct dcpi_lazy *lz = ck->lazy;
    const dcp_entry *e = &ck->entries[s->idx];
    /* The stamps of the set's files, taken now: records located from them
     * later are stored with these (a change in between only makes them stale). */
    for (size_t c = 0; c < e->nchunks; c++)
        if (s->chunks[c].has_blob)
            stamp_of(ck, s->chunks[c].blob.file);
    sqlite3_reset(lz->records);
    sqlite3_bind_int64(lz->records, 1, lz->model);
    sqlite3_bind_int64(lz->records, 2, (sqlite3_int64)s->idx);
    if (sqlite3_step(lz->records) == SQLITE_ROW &&
        decode(ck, s, sqlite3_column_blob(lz->records, 0), (size_t)sqlite3_column_bytes(lz->records, 0)) < 0)
        for (size_t c = 0; c < e->nchunks; c++)
            s->records[c].state = 0;   /* all or nothing */
    sqlite3_reset(lz->records);
}

static int by_file(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static void *flusher(void *arg);

void dcpi_records_keep(dcp_checkpoint *ck, const dcpi_chunkset *s)
{
    struct dcpi_lazy *lz = ck->lazy;
    if (!s->dirty || __atomic_load_n(&lz->parsed, __ATOMIC_ACQUIRE) || !lz->stamps)
        return;   /* nothing new; or the catalog failed and is not written */
    const dcp_entry *e = &ck->entries[s->idx];
    size_t nd = (size_t)e->ndim;
    dcpi_wbuf w = {0};
    /* the files used, each once (a chunk's stamp was taken when the set was read) */
    uint32_t *used = malloc((e->nchunks ? e->nchunks : 1) * sizeof *used);
    size_t nused = 0;
    if (!used)
        return;
    for (size_t c = 0; c < e->nchunks; c++)
        if (s->chunks[c].has_blob)
            used[nused++] = s->chunks[c].blob.file;
    qsort(used, nused, sizeof *used, by_file);
    size_t u = 0;
    for (size_t k = 0; k < nused; k++)
        if (!u || used[u - 1] != used[k])
            used[u++] = used[k];
    nused = u;
    dcpi_put_u64(&w, nused);
    for (size_t k = 0; k < nused; k++) {
        const struct dcpi_file_stamp *st = &lz->stamps[used[k]];
        if (!st->taken || !st->ok) {
            free(used);
            free(w.p);
            return;
        }
        dcpi_put_u64(&w, used[k]);
        dcpi_put_u64(&w, st->size);
        dcpi_put_u64(&w, st->mtime);
        dcpi_put_u64(&w, st->ctime);
        dcpi_put_u64(&w, st->ino);
    }
    free(used);
    for (size_t c = 0; c < e->nchunks; c++) {
        const dcpi_record_slot *slot = &s->records[c];
        dcpi_put_u64(&w, slot->state == 1);
        if (slot->state != 1)
            continue;
        dcpi_put_u64(&w, slot->rec.data_offset);
        dcpi_put_u64(&w, slot->rec.data_length);
        dcpi_put_u64(&w, (uint64_t)slot->rec.storage_offset);
        dcpi_put_u64(&w, (uint64_t)slot->rec.dtype);
        dcpi_put_u64(&w, slot->rec.flags);
        for (size_t d = 0; d < nd; d++)
            dcpi_put_u64(&w, (uint64_t)slot->rec.stride[d]);
    }
    dcpi_put_sum(&w, SEED_RECORDS ^ (uint64_t)s->idx);
    struct dcpi_pending *p = w.oom ? NULL : malloc(sizeof *p + w.n);
    if (p) {
        p->idx = s->idx;
        p->len = w.n;
        memcpy(p->data, w.p, w.n);
        pthread_mutex_lock(&lz->pending_lock);
        p->next = lz->pending;
        lz->pending = p;
        lz->npending++;
        if (lz->npending >= BATCH) {
            /* an in-memory catalog has no second connection: all at dcp_close */
            if (lz->flusher_state == 0 && strcmp(dcp_catalog_path(lz->cat), ":memory:") &&
                pthread_create(&lz->flusher, NULL, flusher, lz) == 0)
                lz->flusher_state = 1;
            pthread_cond_signal(&lz->pending_cond);
        }
        pthread_mutex_unlock(&lz->pending_lock);
    }
    free(w.p);
}

/* Store a list of kept records in one transaction on db (best effort: a
 * busy catalog is not waited for). */
static void store(sqlite3 *db, sqlite3_int64 model, struct dcpi_pending *list)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    /* not for a model dropped meanwhile (its id is never reused) */
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO model_records(model, idx, data) SELECT ?1, ?2, ?3"
                                    " WHERE EXISTS (SELECT 1 FROM models WHERE id=?1)", -1, &st, NULL);
    for (struct dcpi_pending *p = list; rc == SQLITE_OK && p; p = p->next) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, model);
        sqlite3_bind_int64(st, 2, (sqlite3_int64)p->idx);
        sqlite3_bind_blob64(st, 3, p->data, p->len, SQLITE_STATIC);
        rc = sqlite3_step(st) == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(db);
    }
    sqlite3_finalize(st);
    if (!sqlite3_get_autocommit(db))
        sqlite3_exec(db, rc == SQLITE_OK ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
}

/* The background thread: each full batch, stored on its own connection. */
static void *flusher(void *arg)
{
    struct dcpi_lazy *lz = arg;
    sqlite3 *db = NULL;
    int opened = 0;
    pthread_mutex_lock(&lz->pending_lock);
    for (;;) {
        while (lz->flusher_state == 1 && lz->npending < BATCH)
            pthread_cond_wait(&lz->pending_cond, &lz->pending_lock);
        if (lz->flusher_state != 1)
            break;   /* dcp_close stores the rest */
        struct dcpi_pending *list = lz->pending;
        lz->pending = NULL;
        lz->npending = 0;
        pthread_mutex_unlock(&lz->pending_lock);
        if (!opened) {
            opened = 1;
            /* the file the main connection has open (an absolute path, whatever the cwd is now) */
            const char *file = sqlite3_db_filename(dcpi_catalog_db(lz->cat), "main");
            if (file && *file &&
                sqlite3_open_v2(file, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, NULL) == SQLITE_OK)
                sqlite3_busy_timeout(db, WRITE_WAIT_MS);
            else {
                sqlite3_close(db);
                db = NULL;
            }
        }
        if (db)
            store(db, lz->model, list);
        free_list(list);
        pthread_mutex_lock(&lz->pending_lock);
    }
    pthread_mutex_unlock(&lz->pending_lock);
    sqlite3_close(db);
    return NULL;
}

void dcpi_records_flush(dcp_checkpoint *ck)
{
    struct dcpi_lazy *lz = ck->lazy;
    if (!lz || !lz->stamps)
        return;   /* not served, or an open that failed early */
    stop_flusher(lz);
    pthread_mutex_lock(&lz->pending_lock);
    struct dcpi_pending *list = lz->pending;
    lz->pending = NULL;
    lz->npending = 0;
    pthread_mutex_unlock(&lz->pending_lock);
    if (!list)
        return;
    pthread_mutex_lock(&lz->lock);
    sqlite3 *db = dcpi_catalog_db(lz->cat);
    sqlite3_busy_timeout(db, WRITE_WAIT_MS);
    store(db, lz->model, list);
    sqlite3_busy_timeout(db, DCPI_CATALOG_BUSY_MS);
    pthread_mutex_unlock(&lz->lock);
    free_list(list);
}
