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

#include "dcp_integrity.h"
#include "internal.h"

#define CATALOG_FORMAT "dcpfs-catalog-1"
#define SIDECAR_MAGIC "dcpfs-digests 1"

struct dcp_catalog {
    sqlite3 *db;
    char path[PATH_MAX];
};

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS catalog_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS digests(identity TEXT NOT NULL, file TEXT NOT NULL, offset INTEGER NOT NULL,"
    " length INTEGER NOT NULL, xxh3 INTEGER NOT NULL, PRIMARY KEY(identity, file, offset));"
    "CREATE INDEX IF NOT EXISTS digests_by_file ON digests(identity, file);"
    "INSERT OR IGNORE INTO catalog_meta VALUES('format', '" CATALOG_FORMAT "');";

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

/* A usable catalog of ours? (quick_check passes and the format row matches) */
static int healthy(sqlite3 *db)
{
    sqlite3_stmt *st;
    int ok = 0;
    if (sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &st, NULL) == SQLITE_OK) {
        ok = sqlite3_step(st) == SQLITE_ROW && !strcmp((const char *)sqlite3_column_text(st, 0), "ok");
        sqlite3_finalize(st);
    }
    if (!ok)
        return 0;
    int tables = 0, ours = 0;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master", -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW)
            tables = sqlite3_column_int(st, 0);
        sqlite3_finalize(st);
    }
    if (tables == 0)
        return 1;   /* new and empty */
    if (sqlite3_prepare_v2(db, "SELECT value FROM catalog_meta WHERE key='format'", -1, &st, NULL) == SQLITE_OK) {
        ours = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) &&
               !strcmp((const char *)sqlite3_column_text(st, 0), CATALOG_FORMAT);
        sqlite3_finalize(st);
    }
    return ours;
}

static int try_open(dcp_catalog *cat)
{
    if (sqlite3_open_v2(cat->path, &cat->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                        NULL) != SQLITE_OK)
        return -1;
    sqlite3_busy_timeout(cat->db, 30000);
    if (!healthy(cat->db))
        return -1;
    if (sqlite3_exec(cat->db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(cat->db, schema, NULL, NULL, NULL) != SQLITE_OK)
        return -1;
    return 0;
}

int dcp_catalog_open(const char *path, dcp_catalog **out, dcp_error *err)
{
    *out = NULL;
    dcp_catalog *cat = calloc(1, sizeof *cat);
    if (!cat)
        return dcpi_err(err, ENOMEM, "catalog: out of memory");
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (path)
        n = snprintf(cat->path, sizeof cat->path, "%s", path);
    else if (xdg && *xdg)
        n = snprintf(cat->path, sizeof cat->path, "%s/dcpfs/catalog.sqlite", xdg);
    else if (home && *home)
        n = snprintf(cat->path, sizeof cat->path, "%s/.cache/dcpfs/catalog.sqlite", home);
    else {
        free(cat);
        return dcpi_err(err, ENOENT, "catalog: neither XDG_CACHE_HOME nor HOME is set; give a catalog path");
    }
    if (n < 0 || (size_t)n >= sizeof cat->path) {
        free(cat);
        return dcpi_err(err, ENAMETOOLONG, "catalog: path too long");
    }
    if (!path && mkdirs(cat->path) < 0) {
        int e = errno;
        free(cat);
        return dcpi_err(err, e, "catalog: cannot create the folder of %s: %s", path ? path : "the catalog", strerror(e));
    }
    if (try_open(cat) < 0) {
        /* Corrupt or foreign: keep it aside for inspection, start afresh. */
        sqlite3_close(cat->db);
        cat->db = NULL;
        char aside[PATH_MAX + 16];
        snprintf(aside, sizeof aside, "%s.corrupt", cat->path);
        if (rename(cat->path, aside) < 0 && errno != ENOENT) {
            int e = errno;
            free(cat);
            return dcpi_err(err, e, "catalog: %s is unusable and cannot be moved aside: %s", path, strerror(e));
        }
        char side[PATH_MAX + 16];
        snprintf(side, sizeof side, "%s-wal", cat->path);
        unlink(side);
        snprintf(side, sizeof side, "%s-shm", cat->path);
        unlink(side);
        if (try_open(cat) < 0) {
            sqlerr(cat, err, "cannot create the catalog");
            dcp_catalog_close(cat);
            return -1;
        }
    }
    *out = cat;
    return 0;
}

void dcp_catalog_close(dcp_catalog *cat)
{
    if (!cat)
        return;
    sqlite3_close(cat->db);
    free(cat);
}

const char *dcp_catalog_path(const dcp_catalog *cat) { return cat->path; }

/* Every blob of the checkpoint, with the key it belongs to. */
typedef int (*blob_fn)(void *ctx, const dcp_entry *e, const dcp_blob *b);

static int each_blob(dcp_checkpoint *ck, blob_fn fn, void *ctx)
{
    for (size_t i = 0; i < ck->nentries; i++) {
        const dcp_entry *e = &ck->entries[i];
        if (e->kind == DCP_KIND_BYTES) {
            if (e->has_blob && fn(ctx, e, &e->blob) < 0)
                return -1;
            continue;
        }
        for (size_t c = 0; c < e->nchunks; c++) {
            const dcp_blob *b = &e->chunks[c].blob;
            if (!e->chunks[c].has_blob)
                continue;
            /* SAFETENSORS shards share one blob offset per file: hash each range once */
            int seen = 0;
            for (size_t p = 0; p < c && !seen; p++)
                seen = e->chunks[p].has_blob && e->chunks[p].blob.file == b->file && e->chunks[p].blob.offset == b->offset;
            if (!seen && fn(ctx, e, b) < 0)
                return -1;
        }
    }
    return 0;
}

static uint64_t total_bytes(dcp_checkpoint *ck)
{
    uint64_t t = 0;
    for (size_t i = 0; i < ck->nentries; i++) {
        const dcp_entry *e = &ck->entries[i];
        if (e->kind == DCP_KIND_BYTES)
            t += e->has_blob ? e->blob.length : 0;
        for (size_t c = 0; c < e->nchunks; c++)
            t += e->chunks[c].has_blob ? e->chunks[c].blob.length : 0;
    }
    return t;
}

struct rec_ctx {
    dcp_catalog *cat;
    dcp_checkpoint *ck;
    sqlite3_stmt *st;
    const char *id;
    dcp_error *err;
    dcp_progress_fn progress;
    void *pctx;
    uint64_t done, total, n;
};

static int record_one(void *vc, const dcp_entry *e, const dcp_blob *b)
{
    struct rec_ctx *c = vc;
    uint64_t h;
    (void)e;
    if (dcp_blob_digest(c->ck, b, &h, c->err) < 0)
        return -1;
    sqlite3_reset(c->st);
    sqlite3_bind_text(c->st, 1, c->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(c->st, 2, c->ck->files[b->file], -1, SQLITE_STATIC);
    sqlite3_bind_int64(c->st, 3, (sqlite3_int64)b->offset);
    sqlite3_bind_int64(c->st, 4, (sqlite3_int64)b->length);
    sqlite3_bind_int64(c->st, 5, (sqlite3_int64)h);
    if (sqlite3_step(c->st) != SQLITE_DONE)
        return sqlerr(c->cat, c->err, "recording a digest");
    c->n++;
    c->done += b->length;
    if (c->progress)
        c->progress(c->pctx, c->done, c->total);
    return 0;
}

int dcp_catalog_record(dcp_catalog *cat, dcp_checkpoint *ck, dcp_progress_fn progress, void *pctx,
                       uint64_t *nblobs, dcp_error *err)
{
    char id[33];
    if (dcp_checkpoint_identity(ck, id, err) < 0)
        return -1;
    struct rec_ctx c = {cat, ck, NULL, id, err, progress, pctx, 0, total_bytes(ck), 0};
    if (sqlite3_exec(cat->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return sqlerr(cat, err, "starting a transaction");
    int rc = sqlite3_prepare_v2(cat->db, "INSERT OR REPLACE INTO digests VALUES(?,?,?,?,?)", -1, &c.st, NULL) == SQLITE_OK
                 ? each_blob(ck, record_one, &c)
                 : sqlerr(cat, err, "preparing");
    sqlite3_finalize(c.st);
    if (sqlite3_exec(cat->db, rc == 0 ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL) != SQLITE_OK && rc == 0)
        rc = sqlerr(cat, err, "committing");
    *nblobs = c.n;
    return rc;
}

static int lookup(dcp_catalog *cat, const char *id, const char *file, uint64_t offset, uint64_t length,
                  uint64_t *xxh3, int *found, dcp_error *err)
{
    sqlite3_stmt *st;
    *found = 0;
    if (sqlite3_prepare_v2(cat->db, "SELECT xxh3, length FROM digests WHERE identity=? AND file=? AND offset=?", -1,
                           &st, NULL) != SQLITE_OK)
        return sqlerr(cat, err, "preparing");
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, file, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)offset);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW && (uint64_t)sqlite3_column_int64(st, 1) == length) {
        *xxh3 = (uint64_t)sqlite3_column_int64(st, 0);
        *found = 1;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : sqlerr(cat, err, "looking up a digest");
}

int dcp_catalog_digest(dcp_catalog *cat, dcp_checkpoint *ck, const dcp_blob *b, uint64_t *xxh3, int *found,
                       dcp_error *err)
{
    char id[33];
    if (dcp_checkpoint_identity(ck, id, err) < 0)
        return -1;
    return lookup(cat, id, ck->files[b->file], b->offset, b->length, xxh3, found, err);
}

int dcp_digests_export(dcp_catalog *cat, dcp_checkpoint *ck, const char *path, dcp_error *err)
{
    char id[33], tmp[PATH_MAX + 32];
    if (dcp_checkpoint_identity(ck, id, err) < 0)
        return -1;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return dcpi_err(err, errno, "%s: %s", tmp, strerror(errno));
    sqlite3_stmt *st;
    int rc = 0;
    fprintf(f, "%s\n# xxh3-64 offset length file\n", SIDECAR_MAGIC);
    if (sqlite3_prepare_v2(cat->db, "SELECT xxh3, offset, length, file FROM digests WHERE identity=? ORDER BY file, offset",
                           -1, &st, NULL) != SQLITE_OK) {
        rc = sqlerr(cat, err, "preparing");
    } else {
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        while (sqlite3_step(st) == SQLITE_ROW)
            fprintf(f, "%016" PRIx64 " %" PRIu64 " %" PRIu64 " %s\n", (uint64_t)sqlite3_column_int64(st, 0),
                    (uint64_t)sqlite3_column_int64(st, 1), (uint64_t)sqlite3_column_int64(st, 2),
                    (const char *)sqlite3_column_text(st, 3));
        sqlite3_finalize(st);
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
    char id[33], line[4352];
    *n = 0;
    if (dcp_checkpoint_identity(ck, id, err) < 0)
        return -1;
    FILE *f = fopen(sidecar, "r");
    if (!f)
        return dcpi_err(err, errno, "%s: %s", sidecar, strerror(errno));
    if (!fgets(line, sizeof line, f) || strncmp(line, SIDECAR_MAGIC, strlen(SIDECAR_MAGIC))) {
        fclose(f);
        return dcpi_err(err, EINVAL, "%s: not a dcpfs digest file", sidecar);
    }
    sqlite3_stmt *st;
    int rc = 0;
    if (sqlite3_exec(cat->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(cat->db, "INSERT OR REPLACE INTO digests VALUES(?,?,?,?,?)", -1, &st, NULL) != SQLITE_OK) {
        fclose(f);
        return sqlerr(cat, err, "importing");
    }
    unsigned lineno = 1;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        uint64_t h, off, len;
        char file[4097];
        if (sscanf(line, "%" SCNx64 " %" SCNu64 " %" SCNu64 " %4096s", &h, &off, &len, file) != 4 ||
            dcpi_check_relpath(file, strlen(file), err) < 0) {
            rc = dcpi_err(err, EINVAL, "%s:%u: malformed line", sidecar, lineno);
            break;
        }
        sqlite3_reset(st);
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, file, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 3, (sqlite3_int64)off);
        sqlite3_bind_int64(st, 4, (sqlite3_int64)len);
        sqlite3_bind_int64(st, 5, (sqlite3_int64)h);
        if (sqlite3_step(st) != SQLITE_DONE)
            rc = sqlerr(cat, err, "importing");
        else
            (*n)++;
    }
    fclose(f);
    sqlite3_finalize(st);
    sqlite3_exec(cat->db, rc == 0 ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

struct ver_ctx {
    dcp_catalog *cat;
    dcp_checkpoint *ck;
    const char *id;
    dcp_error *err;
    dcp_problem_fn fn;
    void *ctx;
    dcp_progress_fn progress;
    void *pctx;
    uint64_t done, total, checked, missing, problems;
};

static int verify_one(void *vc, const dcp_entry *e, const dcp_blob *b)
{
    struct ver_ctx *c = vc;
    uint64_t want, got;
    int found;
    if (lookup(c->cat, c->id, c->ck->files[b->file], b->offset, b->length, &want, &found, c->err) < 0)
        return -1;
    if (!found) {
        c->missing++;
        return 0;
    }
    dcp_error re;
    char msg[1400];
    if (dcp_blob_digest(c->ck, b, &got, &re) < 0) {
        snprintf(msg, sizeof msg, "%s: %s: cannot re-hash: %s", c->ck->path, e->key, re.msg);
        c->problems++;
        if (c->fn)
            c->fn(c->ctx, msg);
    } else if (got != want) {
        snprintf(msg, sizeof msg, "%s/%s: %s: bytes at offset %" PRIu64 " (length %" PRIu64 ") changed: recorded xxh3 %016" PRIx64 ", now %016" PRIx64,
                 c->ck->path, c->ck->files[b->file], e->key, b->offset, b->length, want, got);
        c->problems++;
        if (c->fn)
            c->fn(c->ctx, msg);
    }
    c->checked++;
    c->done += b->length;
    if (c->progress)
        c->progress(c->pctx, c->done, c->total);
    return 0;
}

int dcp_verify_digests(dcp_catalog *cat, dcp_checkpoint *ck, dcp_problem_fn fn, void *ctx, dcp_progress_fn progress,
                       void *pctx, uint64_t *checked, uint64_t *missing, uint64_t *nproblems, dcp_error *err)
{
    char id[33];
    if (dcp_checkpoint_identity(ck, id, err) < 0)
        return -1;
    struct ver_ctx c = {cat, ck, id, err, fn, ctx, progress, pctx, 0, total_bytes(ck), 0, 0, 0};
    int rc = each_blob(ck, verify_one, &c);
    *checked = c.checked;
    *missing = c.missing;
    *nproblems = c.problems;
    return rc;
}
