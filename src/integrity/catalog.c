/* The catalog: a SQLite file of per-checkpoint records (content digests),
 * tied to each checkpoint's identity and kept outside checkpoint folders. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "integrity.h"

#define CATALOG_FORMAT "dcpfs-catalog-3"
#define CATALOG_FORMAT_2 "dcpfs-catalog-2"   /* one model blob per checkpoint: upgraded in place */
#define SIDECAR_MAGIC "dcpfs-digests 1"

struct dcp_catalog {
    sqlite3 *db;
    pthread_mutex_t lock;     /* guards get (one prepared lookup shared by threads) */
    sqlite3_stmt *get;
    char path[PATH_MAX];
};

/* checkpoints: one row per identity; digests refer to it by number, so the
 * (large) digest table does not repeat the identity. models and
 * model_entries: modelcache.c; model_records: recordcache.c. */
#define MODEL_TABLES \
    "CREATE TABLE IF NOT EXISTS models(id INTEGER PRIMARY KEY AUTOINCREMENT, metadata_key TEXT UNIQUE NOT NULL," \
    " path TEXT NOT NULL, stamp TEXT, xxh3 INTEGER NOT NULL, head BLOB NOT NULL);" \
    "CREATE INDEX IF NOT EXISTS models_by_path ON models(path);" \
    "CREATE TABLE IF NOT EXISTS model_entries(model INTEGER NOT NULL, idx INTEGER NOT NULL, key BLOB NOT NULL," \
    " head BLOB NOT NULL, chunks BLOB NOT NULL, PRIMARY KEY(model, idx)) WITHOUT ROWID;" \
    "CREATE INDEX IF NOT EXISTS model_entries_by_key ON model_entries(model, key, head);" \
    "CREATE TABLE IF NOT EXISTS model_records(model INTEGER NOT NULL, idx INTEGER NOT NULL, data BLOB NOT NULL," \
    " PRIMARY KEY(model, idx)) WITHOUT ROWID;"
static const char schema[] =
    "CREATE TABLE IF NOT EXISTS catalog_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS checkpoints(id INTEGER PRIMARY KEY, identity TEXT UNIQUE NOT NULL);"
    "CREATE TABLE IF NOT EXISTS digests(ck INTEGER NOT NULL, file TEXT NOT NULL, offset INTEGER NOT NULL,"
    " length INTEGER NOT NULL, xxh3 INTEGER NOT NULL, PRIMARY KEY(ck, file, offset)) WITHOUT ROWID;"
    MODEL_TABLES
    "INSERT OR IGNORE INTO catalog_meta VALUES('format', '" CATALOG_FORMAT "');";
/* Format 2 to 3: the models change shape (they are a cache: dropped), the
 * recorded digests stay. */
static const char upgrade_2[] =
    "DROP TABLE IF EXISTS models;"
    "DROP TABLE IF EXISTS model_entries;"
    "DROP TABLE IF EXISTS model_records;"
    MODEL_TABLES
    "UPDATE catalog_meta SET value='" CATALOG_FORMAT "' WHERE key='format';";

/* Upgrade a format-2 catalog, unless another process did meanwhile. A
 * failure (busy past the timeout, a read-only file) leaves the file as it
 * is: it is ours, and holds recorded digests. */
static int upgrade(sqlite3 *db)
{
    sqlite3_stmt *st;
    int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), old = 0;
    if (rc == SQLITE_OK &&
        (rc = sqlite3_prepare_v2(db, "SELECT value FROM catalog_meta WHERE key='format'", -1, &st, NULL)) == SQLITE_OK) {
        const char *v = sqlite3_step(st) == SQLITE_ROW ? (const char *)sqlite3_column_text(st, 0) : NULL;
        old = v && !strcmp(v, CATALOG_FORMAT_2);
        sqlite3_finalize(st);
    }
    if (rc == SQLITE_OK && old)
        rc = sqlite3_exec(db, upgrade_2, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK && !sqlite3_get_autocommit(db))
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);   /* (only then: sqlite3_errmsg keeps the cause) */
    return rc == SQLITE_OK ? 0 : -2;
}

static int sqlerr(dcp_catalog *cat, dcp_error *err, const char *what)
{
    return dcpi_err(err, EIO, "%s: %s: %s", cat->path, what, cat->db ? sqlite3_errmsg(cat->db) : "cannot open");
}

static int mkdirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        int rc = mkdir(path, 0755);
        *p = '/';
        if (rc < 0 && errno != EEXIST)
            return -1;
    }
    return 0;
}

/* Corrupt or foreign: keep the file aside for inspection; the next open
 * starts afresh. */
static void quarantine(const char *path)
{
    char aside[PATH_MAX + 16], side[PATH_MAX + 16];
    snprintf(aside, sizeof aside, "%s.corrupt", path);
    rename(path, aside);
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);
}

int dcpi_catalog_fail(dcp_catalog *cat, int rc, dcp_error *err, const char *what)
{
    int primary = rc & 0xff;
    sqlerr(cat, err, what);
    if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB)
        quarantine(cat->path);
    return -1;
}

sqlite3 *dcpi_catalog_db(dcp_catalog *cat) { return cat->db; }

/* A catalog of ours? Empty (new), or carrying our format row (2 when it is
 * an older one to upgrade). This is cheap on purpose (no integrity_check over
 * a large file at every open): SQLite reports damage it meets as
 * SQLITE_CORRUPT, which moves the file aside, and every model record carries
 * its own checksum. */
static int healthy(sqlite3 *db)
{
    sqlite3_stmt *st;
    int tables = -1, ours = 0, rc;
    if ((rc = sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master", -1, &st, NULL)) == SQLITE_OK) {
        if ((rc = sqlite3_step(st)) == SQLITE_ROW)
            tables = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    if (tables < 0)
        return (rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT ? 0 : -1;
    if (tables == 0)
        return 1;   /* new and empty */
    if (sqlite3_prepare_v2(db, "SELECT value FROM catalog_meta WHERE key='format'", -1, &st, NULL) == SQLITE_OK) {
        const char *v = sqlite3_step(st) == SQLITE_ROW ? (const char *)sqlite3_column_text(st, 0) : NULL;
        ours = v && !strcmp(v, CATALOG_FORMAT) ? 1 : v && !strcmp(v, CATALOG_FORMAT_2) ? 2 : 0;
        sqlite3_finalize(st);
    }
    return ours;
}

/* 0: open; -1: not a catalog of ours (quarantined and started afresh by
 * the caller); -2: ours or unknown, but it cannot be used now (busy,
 * read-only, an I/O error): an error, and the file is left alone. */
static int try_open(dcp_catalog *cat)
{
    if (sqlite3_open_v2(cat->path, &cat->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                        NULL) != SQLITE_OK)
        return -2;
    sqlite3_busy_timeout(cat->db, DCPI_CATALOG_BUSY_MS);
    int h = healthy(cat->db);
    if (h <= 0)
        return h == 0 ? -1 : -2;
    /* WAL lets readers proceed while another process writes; NORMAL sync is
     * enough for a cache that is rebuilt whenever in doubt. */
    if (sqlite3_exec(cat->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL", NULL, NULL, NULL) != SQLITE_OK &&
        sqlite3_db_readonly(cat->db, "main") != 1)
        return -2;   /* (a read-only catalog is read in the mode it has) */
    if (h == 2)
        return upgrade(cat->db);
    /* Only a writer creates the schema; a reader of an existing catalog does not take the write lock. */
    sqlite3_stmt *st;
    int have = 0;
    if (sqlite3_prepare_v2(cat->db, "SELECT 1 FROM sqlite_master WHERE name='model_records'", -1, &st, NULL) == SQLITE_OK) {
        have = sqlite3_step(st) == SQLITE_ROW;
        sqlite3_finalize(st);
    }
    if (!have && sqlite3_exec(cat->db, schema, NULL, NULL, NULL) != SQLITE_OK)
        return -2;
    return 0;
}

/* The catalog file path: path, or the default under the user's cache. */
static int resolve(const char *path, char out[PATH_MAX], dcp_error *err)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (path)
        n = snprintf(out, PATH_MAX, "%s", path);
    else if (xdg && *xdg)
        n = snprintf(out, PATH_MAX, "%s/dcpfs/catalog.sqlite", xdg);
    else if (home && *home)
        n = snprintf(out, PATH_MAX, "%s/.cache/dcpfs/catalog.sqlite", home);
    else
        return dcpi_err(err, ENOENT, "catalog: neither XDG_CACHE_HOME nor HOME is set; give a catalog path");
    if (n < 0 || n >= PATH_MAX)
        return dcpi_err(err, ENAMETOOLONG, "%.200s...: the catalog's path is longer than PATH_MAX (%d bytes)",
                        path ? path : xdg && *xdg ? xdg : home, PATH_MAX);
    return 0;
}

int dcp_catalog_check_location(const char *path, dcp_checkpoint *ck, dcp_error *err)
{
    char file[PATH_MAX];
    if (resolve(path, file, err) < 0)
        return -1;
    if (dcpi_path_inside(file, ck))
        return dcpi_err(err, EPERM, "%s: the catalog may not live inside the checkpoint folder %s, which is never written to",
                        file, ck->path);
    return 0;
}

int dcp_catalog_check_folder(const char *path, const char *folder, dcp_error *err)
{
    char file[PATH_MAX];
    if (resolve(path, file, err) < 0)
        return -1;
    if (dcpi_path_inside_folder(file, folder))
        return dcpi_err(err, EPERM, "%s: the catalog may not live inside %s, which is never written to", file, folder);
    return 0;
}

int dcpi_catalog_folder(const char *path, dcp_checkpoint *ck, char out[PATH_MAX])
{
    dcp_error err;
    if (dcp_catalog_check_location(path, ck, &err) < 0 || resolve(path, out, &err) < 0 || !strcmp(out, ":memory:") ||
        mkdirs(out) < 0)
        return -1;
    char *slash = strrchr(out, '/');
    if (!slash)
        snprintf(out, PATH_MAX, ".");
    else if (slash == out)
        out[1] = 0;
    else
        *slash = 0;
    return 0;
}

int dcp_catalog_open(const char *path, dcp_catalog **out, dcp_error *err)
{
    *out = NULL;
    dcp_catalog *cat = calloc(1, sizeof *cat);
    if (!cat)
        return dcpi_err(err, ENOMEM, "catalog %s: out of memory", path ? path : "(default)");
    if (resolve(path, cat->path, err) < 0) {
        free(cat);
        return -1;
    }
    if (strcmp(cat->path, ":memory:") && mkdirs(cat->path) < 0) {
        int e = errno;
        free(cat);
        return dcpi_err(err, e, "catalog: cannot create the folder of %s: %s", path ? path : "the catalog", strerror(e));
    }
    pthread_mutex_init(&cat->lock, NULL);
    int rc = try_open(cat);
    if (rc == -1) {
        sqlite3_close(cat->db);
        cat->db = NULL;
        quarantine(cat->path);
        rc = try_open(cat);
    }
    if (rc < 0) {
        sqlerr(cat, err, "cannot open the catalog (left as it is)");
        dcp_catalog_close(cat);
        return -1;
    }
    *out = cat;
    return 0;
}

void dcp_catalog_close(dcp_catalog *cat)
{
    if (!cat)
        return;
    sqlite3_finalize(cat->get);
    sqlite3_close(cat->db);
    pthread_mutex_destroy(&cat->lock);
    free(cat);
}

const char *dcp_catalog_path(const dcp_catalog *cat) { return cat->path; }


/* What dcp_catalog_record saw of each data file before hashing it: size,
 * mtime, ctime and inode ("" for one it could not stat). A file that still
 * has all four is taken to hold the bytes that were hashed (dcp diff
 * --content's shortcut, dcp_catalog_unchanged); the table is added to older
 * catalogs by the first record. */
#define STAMPS_TABLE \
    "CREATE TABLE IF NOT EXISTS recorded_stamps(ck INTEGER NOT NULL, file TEXT NOT NULL, stamp TEXT NOT NULL," \
    " PRIMARY KEY(ck, file)) WITHOUT ROWID;"

static void file_stamp(dcp_checkpoint *ck, size_t f, char out[96])
{
    struct stat st;
    out[0] = 0;
    if (fstatat(ck->dirfd, ck->files[f], &st, 0) == 0 && S_ISREG(st.st_mode))
        snprintf(out, 96, "%lld %lld.%09ld %lld.%09ld %llu", (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                 st.st_mtim.tv_nsec, (long long)st.st_ctim.tv_sec, st.st_ctim.tv_nsec, (unsigned long long)st.st_ino);
}

/* Entry i's key for a message. dcpi_collect_blobs has read every entry, so
 * dcp_entry_at cannot fail here; the check costs nothing. */
static const char *key_of(dcp_checkpoint *ck, size_t i)
{
    const dcp_entry *e = dcp_entry_at(ck, i);
    return e ? e->key : "(unknown entry)";
}

/* The row number of ck's identity; created when create is set, else 0 when
 * nothing was ever recorded for it. */
static int ck_row(dcp_catalog *cat, dcp_checkpoint *ck, int create, sqlite3_int64 *row, dcp_error *err)
{
    char id[33];
    sqlite3_stmt *st;
    int rc;
    *row = 0;
    if (dcp_checkpoint_identity(ck, id, err) < 0)
        return -1;
    if (create) {
        if ((rc = sqlite3_prepare_v2(cat->db, "INSERT OR IGNORE INTO checkpoints(identity) VALUES(?)", -1, &st,
                                     NULL)) != SQLITE_OK)
            return dcpi_catalog_fail(cat, rc, err, "preparing");
        sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
        rc = sqlite3_step(st);
        sqlite3_finalize(st);
        if (rc != SQLITE_DONE)
            return dcpi_catalog_fail(cat, rc, err, "adding a checkpoint");
    }
    if ((rc = sqlite3_prepare_v2(cat->db, "SELECT id FROM checkpoints WHERE identity=?", -1, &st, NULL)) != SQLITE_OK)
        return dcpi_catalog_fail(cat, rc, err, "preparing");
    sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *row = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : dcpi_catalog_fail(cat, rc, err, "looking up a checkpoint");
}

int dcp_catalog_record(dcp_catalog *cat, dcp_checkpoint *ck, dcp_progress_fn progress, void *pctx,
                       uint64_t *nblobs, dcp_error *err)
{
    dcpi_blobref *r;
    size_t n;
    *nblobs = 0;
    if (dcpi_path_inside(cat->path, ck))
        return dcpi_err(err, EPERM, "%s: the catalog may not live inside the checkpoint folder %s", cat->path, ck->path);
    if (dcpi_collect_blobs(ck, &r, &n, err) < 0)
        return -1;
    /* The files' stamps before their bytes are read: a change while hashing leaves them stale. */
    char (*stamps)[96] = calloc(ck->nfiles ? ck->nfiles : 1, sizeof *stamps);
    if (!stamps) {
        free(r);
        return dcpi_err(err, ENOMEM, "%s: out of memory", ck->path);
    }
    for (size_t f = 0; f < ck->nfiles; f++)
        file_stamp(ck, f, stamps[f]);
    /* Hash first, outside any transaction: other processes keep using the catalog meanwhile. */
    if (dcpi_hash_blobs(ck, r, n, progress, pctx, err) < 0) {
        free(stamps);
        free(r);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (r[i].rerr) {
            int e = r[i].rerr;
            dcpi_err(err, e == DCPI_PAST_END ? EIO : e, "%s/%s: %s: cannot hash the blob at offset %" PRIu64 " length %" PRIu64 ": %s",
                     ck->path, ck->files[r[i].file], key_of(ck, r[i].entry), r[i].offset, r[i].length,
                     e == DCPI_PAST_END ? "it ends past the end of the file" : strerror(e));
            free(stamps);
            free(r);
            return -1;
        }
    sqlite3_int64 row;
    sqlite3_stmt *st = NULL;
    int rc;
    if ((rc = sqlite3_exec(cat->db, "BEGIN IMMEDIATE", NULL, NULL, NULL)) != SQLITE_OK) {
        free(stamps);
        free(r);
        return dcpi_catalog_fail(cat, rc, err, "starting a transaction");
    }
    int ok = ck_row(cat, ck, 1, &row, err) == 0;
    if (ok && (rc = sqlite3_prepare_v2(cat->db, "INSERT OR REPLACE INTO digests VALUES(?,?,?,?,?)", -1, &st, NULL)) !=
                  SQLITE_OK)
        ok = dcpi_catalog_fail(cat, rc, err, "preparing") == 0;
    for (size_t i = 0; ok && i < n; i++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, row);
        sqlite3_bind_text(st, 2, ck->files[r[i].file], -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)r[i].offset);
        sqlite3_bind_int64(st, 4, (sqlite3_int64)r[i].length);
        sqlite3_bind_int64(st, 5, (sqlite3_int64)r[i].xxh3);
        if ((rc = sqlite3_step(st)) != SQLITE_DONE)
            ok = dcpi_catalog_fail(cat, rc, err, "recording a digest") == 0;
    }
    sqlite3_finalize(st);
    st = NULL;
    if (ok && (rc = sqlite3_exec(cat->db, STAMPS_TABLE, NULL, NULL, NULL)) != SQLITE_OK)
        ok = dcpi_catalog_fail(cat, rc, err, "adding the stamps table") == 0;
    if (ok && (rc = sqlite3_prepare_v2(cat->db, "INSERT OR REPLACE INTO recorded_stamps VALUES(?,?,?)", -1, &st,
                                       NULL)) != SQLITE_OK)
        ok = dcpi_catalog_fail(cat, rc, err, "preparing") == 0;
    for (size_t f = 0; ok && f < ck->nfiles; f++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, row);
        sqlite3_bind_text(st, 2, ck->files[f], -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, stamps[f], -1, SQLITE_STATIC);
        if ((rc = sqlite3_step(st)) != SQLITE_DONE)
            ok = dcpi_catalog_fail(cat, rc, err, "recording a file's stamp") == 0;
    }
    sqlite3_finalize(st);
    if (ok && (rc = sqlite3_exec(cat->db, "COMMIT", NULL, NULL, NULL)) != SQLITE_OK)
        ok = dcpi_catalog_fail(cat, rc, err, "committing") == 0;
    if (!ok)
        sqlite3_exec(cat->db, "ROLLBACK", NULL, NULL, NULL);
    *nblobs = ok ? n : 0;
    free(stamps);
    free(r);
    return ok ? 0 : -1;
}

int dcp_catalog_unchanged(dcp_catalog *cat, dcp_checkpoint *ck, int *unchanged, dcp_error *err)
{
    sqlite3_int64 row;
    *unchanged = 0;
    if (ck_row(cat, ck, 0, &row, err) < 0)
        return -1;
    if (!row)
        return 0;
    sqlite3_stmt *st;
    /* No such table (a catalog no record has written to since): nothing vouches. */
    if (sqlite3_prepare_v2(cat->db, "SELECT stamp FROM recorded_stamps WHERE ck=? AND file=?", -1, &st, NULL) !=
        SQLITE_OK)
        return 0;
    int same = 1, rc = SQLITE_OK;
    for (size_t f = 0; same && f < ck->nfiles; f++) {
        char now[96];
        file_stamp(ck, f, now);
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, row);
        sqlite3_bind_text(st, 2, ck->files[f], -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        same = rc == SQLITE_ROW && now[0] && !strcmp((const char *)sqlite3_column_text(st, 0), now);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return dcpi_catalog_fail(cat, rc, err, "reading the recorded stamps");
    *unchanged = same;
    return 0;
}

int dcp_catalog_digest(dcp_catalog *cat, dcp_checkpoint *ck, const dcp_blob *b, uint64_t *xxh3, int *found,
                       dcp_error *err)
{
    char id[33];
    *found = 0;
    if (b->transforms & DCP_TRANSFORM_MEMORY)   /* no stored bytes: nothing recorded */
        return 0;
    if (dcp_checkpoint_identity(ck, id, err) < 0)
        return -1;
    pthread_mutex_lock(&cat->lock);
    int rc = SQLITE_OK;
    if (!cat->get)
        rc = sqlite3_prepare_v2(cat->db,
                                "SELECT d.xxh3, d.length FROM digests d JOIN checkpoints c ON c.id = d.ck"
                                " WHERE c.identity=? AND d.file=? AND d.offset=?",
                                -1, &cat->get, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_reset(cat->get);
        sqlite3_bind_text(cat->get, 1, id, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(cat->get, 2, ck->files[b->file], -1, SQLITE_STATIC);
        sqlite3_bind_int64(cat->get, 3, (sqlite3_int64)b->offset);
        rc = sqlite3_step(cat->get);
        if (rc == SQLITE_ROW && (uint64_t)sqlite3_column_int64(cat->get, 1) == b->length) {
            *xxh3 = (uint64_t)sqlite3_column_int64(cat->get, 0);
            *found = 1;
        }
        sqlite3_reset(cat->get);
    }
    int ret = rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : dcpi_catalog_fail(cat, rc, err, "looking up a digest");
    pthread_mutex_unlock(&cat->lock);
    return ret;
}

int dcp_check_blob(dcp_catalog *cat, dcp_checkpoint *ck, const char *key, const dcp_blob *b, dcp_error *err)
{
    uint64_t want, got;
    int found;
    const char *k = key ? key : "(blob)";
    if (b->file >= ck->nfiles)
        return dcpi_err(err, EINVAL, "%s: %s: data file index %u out of range (%zu files)", ck->path, k,
                        (unsigned)b->file, ck->nfiles);
    if (dcp_catalog_digest(cat, ck, b, &want, &found, err) < 0)
        return -1;
    if (!found)
        return dcpi_err(err, DCP_ENOTFOUND, "%s/%s: %s: no digest recorded in %s for the blob at offset %" PRIu64
                        " (length %" PRIu64 ")", ck->path, ck->files[b->file], k, cat->path, b->offset, b->length);
    if (dcp_blob_digest(ck, b, &got, err) < 0)
        return dcpi_err_prefix(err, "%s", k);
    if (got != want)
        return dcpi_err(err, EIO, "%s/%s: %s: bytes at offset %" PRIu64 " (length %" PRIu64 ") do not match the recorded digest"
                        " (xxh3 %016" PRIx64 ", recorded %016" PRIx64 ")",
                        ck->path, ck->files[b->file], k, b->offset, b->length, got, want);
    return 0;
}

/* The call of 0.1: 1 matches, 0 nothing recorded, -1 failure or mismatch. */
int dcp_verify_blob(dcp_catalog *cat, dcp_checkpoint *ck, const char *key, const dcp_blob *b, dcp_error *err)
{
    if (dcp_check_blob(cat, ck, key, b, err) == 0)
        return 1;
    return err && err->code == DCP_ENOTFOUND ? 0 : -1;
}

int dcp_digests_export(dcp_catalog *cat, dcp_checkpoint *ck, const char *path, dcp_error *err)
{
    char tmp[PATH_MAX + 32];
    sqlite3_int64 row;
    if (ck_row(cat, ck, 0, &row, err) < 0)
        return -1;
    if (dcpi_path_inside(path, ck))
        return dcpi_err(err, EPERM, "%s: will not write into the checkpoint folder %s (keep the sidecar next to it)",
                        path, ck->path);
    /* An empty list would replace a good sidecar (the one made where the
     * digests were recorded) with nothing. */
    if (!row)
        return dcpi_err(err, ENOENT, "%s: no digests recorded for %s in this catalog (dcp verify --record first); "
                        "%s left as it is", path, ck->path, path);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return dcpi_err(err, errno, "%s: %s", tmp, strerror(errno));
    sqlite3_stmt *st;
    int rc = 0, src;
    fprintf(f, "%s\n# xxh3-64 offset length file\n", SIDECAR_MAGIC);
    if ((src = sqlite3_prepare_v2(cat->db, "SELECT xxh3, offset, length, file FROM digests WHERE ck=? ORDER BY file, offset",
                                  -1, &st, NULL)) != SQLITE_OK) {
        rc = dcpi_catalog_fail(cat, src, err, "preparing");
    } else {
        sqlite3_bind_int64(st, 1, row);
        while ((src = sqlite3_step(st)) == SQLITE_ROW)
            fprintf(f, "%016" PRIx64 " %" PRIu64 " %" PRIu64 " %s\n", (uint64_t)sqlite3_column_int64(st, 0),
                    (uint64_t)sqlite3_column_int64(st, 1), (uint64_t)sqlite3_column_int64(st, 2),
                    (const char *)sqlite3_column_text(st, 3));
        sqlite3_finalize(st);
        if (src != SQLITE_DONE)
            rc = dcpi_catalog_fail(cat, src, err, "reading digests");
    }
    if (fclose(f) != 0 && rc == 0)
        rc = dcpi_err(err, errno, "%s: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) < 0)
        rc = dcpi_err(err, errno, "%s: %s", path, strerror(errno));
    if (rc < 0)
        unlink(tmp);
    return rc;
}

int dcp_catalog_import(dcp_catalog *cat, dcp_checkpoint *ck, const char *sidecar, uint64_t *n, dcp_error *err)
{
    char line[4352];
    *n = 0;
    if (dcpi_path_inside(cat->path, ck))
        return dcpi_err(err, EPERM, "%s: the catalog may not live inside the checkpoint folder %s", cat->path, ck->path);
    FILE *f = fopen(sidecar, "r");
    if (!f)
        return dcpi_err(err, errno, "%s: %s", sidecar, strerror(errno));
    if (!fgets(line, sizeof line, f) || strcmp(line, SIDECAR_MAGIC "\n")) {
        fclose(f);
        return dcpi_err(err, EINVAL, "%s: not a dcpfs digest file", sidecar);
    }
    sqlite3_stmt *st = NULL;
    sqlite3_int64 row;
    int src;
    if ((src = sqlite3_exec(cat->db, "BEGIN IMMEDIATE", NULL, NULL, NULL)) != SQLITE_OK) {
        fclose(f);
        return dcpi_catalog_fail(cat, src, err, "importing");
    }
    int rc = ck_row(cat, ck, 1, &row, err);
    /* Digests from elsewhere: what this machine's files looked like when it
     * recorded no longer vouches for them (dcp_catalog_unchanged). */
    if (rc == 0 && (src = sqlite3_exec(cat->db, STAMPS_TABLE, NULL, NULL, NULL)) != SQLITE_OK)
        rc = dcpi_catalog_fail(cat, src, err, "importing");
    if (rc == 0) {
        sqlite3_stmt *del;
        if ((src = sqlite3_prepare_v2(cat->db, "DELETE FROM recorded_stamps WHERE ck=?", -1, &del, NULL)) == SQLITE_OK) {
            sqlite3_bind_int64(del, 1, row);
            src = sqlite3_step(del);
            sqlite3_finalize(del);
        }
        if (src != SQLITE_DONE)
            rc = dcpi_catalog_fail(cat, src, err, "importing");
    }
    if (rc == 0 && (src = sqlite3_prepare_v2(cat->db, "INSERT OR REPLACE INTO digests VALUES(?,?,?,?,?)", -1, &st,
                                             NULL)) != SQLITE_OK)
        rc = dcpi_catalog_fail(cat, src, err, "importing");
    unsigned lineno = 1;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        uint64_t h, off, len;
        char file[4097];
        if (!strchr(line, '\n') && !feof(f)) {
            rc = dcpi_err(err, EINVAL, "%s:%u: line too long", sidecar, lineno);
            break;
        }
        /* exactly what export writes: 16 hex digits, two decimals, a relative path, nothing after */
        int end = 0;
        if (strspn(line, "0123456789abcdef") != 16 || line[16] != ' ' ||
            sscanf(line, "%16" SCNx64 " %" SCNu64 " %" SCNu64 " %4096s%n", &h, &off, &len, file, &end) != 4 ||
            strcmp(line + end, "\n") || line[17] < '0' || line[17] > '9' || off > INT64_MAX || len > INT64_MAX ||
            dcpi_check_relpath(file, strlen(file), err) < 0) {
            rc = dcpi_err(err, EINVAL, "%s:%u: malformed line", sidecar, lineno);
            break;
        }
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, row);
        sqlite3_bind_text(st, 2, file, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)off);
        sqlite3_bind_int64(st, 4, (sqlite3_int64)len);
        sqlite3_bind_int64(st, 5, (sqlite3_int64)h);
        if ((src = sqlite3_step(st)) != SQLITE_DONE)
            rc = dcpi_catalog_fail(cat, src, err, "importing");
        else
            (*n)++;
    }
    fclose(f);
    sqlite3_finalize(st);
    sqlite3_exec(cat->db, rc == 0 ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
    if (rc < 0)
        *n = 0;
    return rc;
}

/* The recorded digests of ck, merged into refs (sorted by file and offset):
 * want is set on each ref with a record of the same length. */
static int load_records(dcp_catalog *cat, dcp_checkpoint *ck, dcpi_blobref *r, size_t n, dcp_error *err)
{
    sqlite3_int64 row;
    if (ck_row(cat, ck, 0, &row, err) < 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        r[i].want = 0;
    if (!row)
        return 0;
    sqlite3_stmt *st;
    int rc = sqlite3_prepare_v2(cat->db, "SELECT file, offset, length, xxh3 FROM digests WHERE ck=? ORDER BY file, offset",
                                -1, &st, NULL);
    if (rc != SQLITE_OK)
        return dcpi_catalog_fail(cat, rc, err, "preparing");
    sqlite3_bind_int64(st, 1, row);
    /* Rows come in file-name order, refs in file-index order: look each row
     * up by binary search within its file's run of refs. */
    const char *name = NULL;
    size_t lo = 0, hi = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *file = (const char *)sqlite3_column_text(st, 0);
        uint64_t off = (uint64_t)sqlite3_column_int64(st, 1), len = (uint64_t)sqlite3_column_int64(st, 2);
        uint64_t fi;
        if (!file)
            continue;
        if (!name || strcmp(name, file)) {
            lo = hi = 0;
            name = NULL;
            if (!dcpi_strmap_get(&ck->file_index, file, strlen(file), &fi))
                continue;   /* a file this checkpoint does not use */
            name = ck->files[fi];
            size_t a = 0, b = n;
            while (a < b) {
                size_t m = a + (b - a) / 2;
                if (r[m].file < fi) a = m + 1; else b = m;
            }
            lo = hi = a;
            while (hi < n && r[hi].file == fi)
                hi++;
        }
        size_t a = lo, b = hi;
        while (a < b) {
            size_t m = a + (b - a) / 2;
            if (r[m].offset < off) a = m + 1; else b = m;
        }
        for (; a < hi && r[a].offset == off; a++)
            if (r[a].length == len) {
                r[a].want = 1;
                r[a].recorded = (uint64_t)sqlite3_column_int64(st, 3);
            }
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : dcpi_catalog_fail(cat, rc, err, "reading digests");
}

int dcp_verify_digests(dcp_catalog *cat, dcp_checkpoint *ck, dcp_problem_fn fn, void *ctx, dcp_progress_fn progress,
                       void *pctx, uint64_t *checked, uint64_t *missing, uint64_t *nproblems, dcp_error *err)
{
    dcpi_blobref *r;
    size_t n;
    *checked = *missing = *nproblems = 0;
    if (dcpi_collect_blobs(ck, &r, &n, err) < 0)
        return -1;
    if (load_records(cat, ck, r, n, err) < 0 || dcpi_hash_blobs(ck, r, n, progress, pctx, err) < 0) {
        free(r);
        return -1;
    }
    char msg[1400];
    for (size_t i = 0; i < n; i++) {
        const dcpi_blobref *b = &r[i];
        const char *key = key_of(ck, b->entry), *file = ck->files[b->file];
        if (!b->want) {
            (*missing)++;
            continue;
        }
        (*checked)++;
        /* a file that cannot be read (permissions, a read error) fails each of its blobs
         * alike: one line names the first and counts the others */
        size_t more = 0;
        while (b->rerr > 0 && i + 1 < n && r[i + 1].want && r[i + 1].file == b->file && r[i + 1].rerr == b->rerr) {
            i++;
            more++;
            (*checked)++;
        }
        char others[96] = "";
        if (more)
            snprintf(others, sizeof others, " (and %zu more blob%s of the file alike)", more, more == 1 ? "" : "s");
        if (b->rerr)
            snprintf(msg, sizeof msg, "%s/%s: %s: cannot re-hash the bytes at offset %" PRIu64 " (length %" PRIu64 "): %s%s",
                     ck->path, file, key, b->offset, b->length,
                     b->rerr == DCPI_PAST_END ? "they end past the end of the file" : strerror(b->rerr), others);
        else if (b->xxh3 != b->recorded)
            snprintf(msg, sizeof msg, "%s/%s: %s: bytes at offset %" PRIu64 " (length %" PRIu64 ") changed: recorded xxh3 %016" PRIx64 ", now %016" PRIx64,
                     ck->path, file, key, b->offset, b->length, b->recorded, b->xxh3);
        else
            continue;
        (*nproblems)++;
        if (fn)
            fn(ctx, msg);
    }
    free(r);
    return 0;
}
