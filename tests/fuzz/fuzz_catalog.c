/* libFuzzer harness for what the catalog reads back: the rows of a stored
 * model (src/integrity/modelcache.c, recordcache.c, decoded with rowcodec.c)
 * and the digest sidecars of `dcp verify --import`. The target (FUZZ_TARGET,
 * or replay.c's first argument):
 *
 *   rows     byte 0 picks a column (0 models.head, 1 model_entries.head,
 *            2 model_entries.chunks, 3 model_records.data), byte 1 an entry
 *            index; the rest is the row's body. The harness appends the
 *            row's XXH3 so that mutations reach the decoders behind it (a
 *            row that fails its checksum is never decoded), stores it in a
 *            fresh copy of a catalog that serves fixture 05, then opens the
 *            checkpoint from the catalog and reads every entry.
 *   sidecar  a digest file imported into a catalog for fixture 01, then
 *            every blob verified against it.
 *
 * A records row begins with the stamps (size, mtime, ctime, inode) of the
 * shard files its records came from, which differ in every run's copy of the
 * fixture: the harness writes this run's stamps over them, so that mutations
 * reach the records behind (a row whose stamps differ is never decoded).
 *
 * The seeds of checksums repeat SEED_HEAD, SEED_CHUNKS and SEED_RECORDS of
 * modelcache.c and recordcache.c: if those change, rows stops getting past
 * the checksums (its seeds, dumped with FUZZ_DUMP=DIR, then fail to open
 * from the catalog). SRCDIR names the source tree. */
#include <fcntl.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "dcp.h"
#include "dcp_integrity.h"

#define SEED_HEAD 0x68656164u
#define SEED_CHUNKS 0x63686b73u
#define SEED_RECORDS 0x72656373u

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static int rows;                     /* the target: rows (1) or sidecar (0) */
static char dir[256], catpath[300], sidepath[300];
static unsigned char *pristine;      /* the catalog file as stored by the first open */
static size_t npristine;

static void die(const char *what)
{
    fprintf(stderr, "fuzz_catalog: %s\n", what);
    exit(2);
}

static void cleanup(void)
{
    char cmd[2048];
    if ((size_t)snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'-wal '%s'-shm '%s'", dir, catpath, catpath, catpath,
                         sidepath) >= sizeof cmd || system(cmd) != 0)
        fprintf(stderr, "fuzz_catalog: cannot remove %s\n", dir);
}

static void walk(dcp_checkpoint *ck)
{
    static unsigned char buf[65536];
    dcp_error err;
    dcp_plan plan;
    dcp_plan_init(&plan);
    /* the keys in order by seeks, then back to the first (a served model
     * answers seeks inside the rows its last statement read) */
    char from[512] = "";
    const dcp_entry *s;
    for (int i = 0; i < 64 && dcp_seek(ck, from, &s, &err) == 0 && s; i++)
        snprintf(from, sizeof from, "%s\x01", s->key);
    (void)dcp_seek(ck, "", &s, &err);
    for (size_t i = 0; i < dcp_num_entries(ck); i++) {
        const dcp_entry *e = dcp_entry_at(ck, i);
        const dcp_chunk *chunks;
        if (!e || dcp_entry_chunks(ck, e, &chunks, &err) < 0)
            continue;
        for (size_t c = 0; c < e->nchunks; c++) {
            const dcp_record *rec;
            (void)dcp_chunk_record(ck, e, c, &rec, &err);
        }
        dcp_release_chunks(ck, e);
        dcp_plan_reset(&plan);
        if (dcp_plan_bytes(ck, e, 0, sizeof buf, &plan, &err) == 0 && plan.nbytes <= sizeof buf)
            (void)dcp_plan_execute(ck, &plan, buf, &err);
    }
    (void)dcp_find(ck, "model.weight");
    dcp_plan_free(&plan);
}

/* The shard files' stamps in this run's copy, as recordcache.c takes them. */
#define MAX_FILES 64
#define RESTAMP_GROWTH (10 + MAX_FILES * 50)   /* a stamp's 5 varints: from 5 bytes to 50 */
static uint64_t stamps[MAX_FILES][4];
static size_t nstamps;

static void take_stamps(void)
{
    dcp_checkpoint *ck;
    dcp_error err;
    if (dcp_open(dir, 0, &ck, &err) < 0)
        die(err.msg);
    for (size_t f = 0; f < dcp_num_files(ck) && f < MAX_FILES; f++) {
        char p[1024];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, dcp_file_name(ck, (uint32_t)f));
        if (stat(p, &sb) < 0)
            die("cannot stat a shard file");
        stamps[f][0] = (uint64_t)sb.st_size;
        stamps[f][1] = (uint64_t)sb.st_mtim.tv_sec * 1000000000u + (uint64_t)sb.st_mtim.tv_nsec;
        stamps[f][2] = (uint64_t)sb.st_ctim.tv_sec * 1000000000u + (uint64_t)sb.st_ctim.tv_nsec;
        stamps[f][3] = (uint64_t)sb.st_ino;
        nstamps = f + 1;
    }
    dcp_close(ck);
}

/* rowcodec.c's varints (LEB128) */
static int get_varint(const unsigned char **p, const unsigned char *end, uint64_t *v)
{
    *v = 0;
    for (unsigned shift = 0; *p < end && shift < 64; shift += 7) {
        unsigned char b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return 0;
    }
    return -1;
}
static size_t put_varint(unsigned char *out, uint64_t v)
{
    size_t n = 0;
    do {
        out[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        out[n++] |= v ? 0x80 : 0;
    } while (v);
    return n;
}

/* A records row (body, no checksum) with this run's stamps in place of the
 * stored ones, for each file index it names that the fixture has; as it
 * was where its head does not parse. Returns the new length (row has room
 * for body + 8 + RESTAMP_GROWTH bytes). */
static size_t restamp(unsigned char *row, size_t body)
{
    const unsigned char *p = row, *end = row + body;
    unsigned char head[RESTAMP_GROWTH];
    size_t h = 0;
    uint64_t nused;
    if (get_varint(&p, end, &nused) < 0 || nused > MAX_FILES)
        return body;
    h += put_varint(head + h, nused);
    for (uint64_t i = 0; i < nused; i++) {
        uint64_t f, v;
        if (get_varint(&p, end, &f) < 0)
            return body;
        h += put_varint(head + h, f);
        for (int k = 0; k < 4; k++) {
            if (get_varint(&p, end, &v) < 0)
                return body;
            h += put_varint(head + h, f < nstamps ? stamps[f][k] : v);
        }
    }
    size_t rest = (size_t)(end - p);
    memmove(row + h, p, rest);
    memcpy(row, head, h);
    return h + rest;
}

static void write_file(const char *p, const void *data, size_t n)
{
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, data, n) != (ssize_t)n)
        abort();
    close(fd);
}

/* Opens the checkpoint from the catalog and reads every entry: 1 when the
 * open was served by the catalog. */
static int open_served(void)
{
    dcp_open_options o = DCP_OPEN_OPTIONS_INIT;
    o.flags = DCP_OPEN_CATALOG;
    o.catalog = catpath;
    dcp_checkpoint *ck;
    dcp_error err;
    int served = 0;
    if (dcp_open_ex(dir, &o, &ck, &err) == 0) {
        served = dcp_from_catalog(ck);
        walk(ck);
        dcp_close(ck);
    }
    return served;
}

/* The catalog back to the state the first opens left. */
static void restore(void)
{
    char p[320];
    snprintf(p, sizeof p, "%s-wal", catpath);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", catpath);
    unlink(p);
    write_file(catpath, pristine, npristine);
}

static const char *const columns[4][2] = {
    {"models", "head"}, {"model_entries", "head"}, {"model_entries", "chunks"}, {"model_records", "data"}};

/* FUZZ_DUMP=DIR: write each stored row as a seed (selector, index, body). */
static void dump_seeds(sqlite3 *db, const char *out)
{
    for (int c = 0; c < 4; c++) {
        char q[160];
        snprintf(q, sizeof q, "SELECT %s, %s FROM %s ORDER BY 1 LIMIT 6", c ? "idx" : "0", columns[c][1],
                 columns[c][0]);
        sqlite3_stmt *st;
        if (sqlite3_prepare_v2(db, q, -1, &st, NULL) != SQLITE_OK)
            die(sqlite3_errmsg(db));
        while (sqlite3_step(st) == SQLITE_ROW) {
            int idx = sqlite3_column_int(st, 0), n = sqlite3_column_bytes(st, 1);
            const unsigned char *b = sqlite3_column_blob(st, 1);
            if (c && n < 8)
                continue;
            size_t body = (size_t)n - (c ? 8 : 0);
            unsigned char *seed = malloc(body + 2);
            seed[0] = (unsigned char)c;
            seed[1] = (unsigned char)idx;
            if (body)
                memcpy(seed + 2, b, body);
            char p[512];
            snprintf(p, sizeof p, "%s/%s.%s.%d", out, columns[c][0], columns[c][1], idx);
            write_file(p, seed, body + 2);
            free(seed);
        }
        sqlite3_finalize(st);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *name = getenv("FUZZ_TARGET"), *src = getenv("SRCDIR");
    if (!src || !name || (strcmp(name, "rows") && strcmp(name, "sidecar")))
        die("set SRCDIR and FUZZ_TARGET to rows or sidecar");
    rows = !strcmp(name, "rows");
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/dcpfuzz.%s.%d", tmp, name, (int)getpid());
    snprintf(catpath, sizeof catpath, "%s.sqlite", dir);
    snprintf(sidepath, sizeof sidepath, "%s.digests", dir);
    char cmd[4096];
    if ((size_t)snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'* && mkdir -p '%s' && cp -r '%s/tests/fixtures/%s/ckpt/.' '%s/'",
                         dir, catpath, dir, src, rows ? "05_mixed_2ranks" : "01_single_plain", dir) >= sizeof cmd ||
        system(cmd) != 0)
        die("cannot lay out the checkpoint");
    atexit(cleanup);
    if (!rows)
        return 0;
    take_stamps();
    /* Parse and store, then open from the catalog and locate every record,
     * which stores the records rows at close. */
    open_served();
    open_served();
    struct stat sb;
    int fd = open(catpath, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &sb) < 0 || !(pristine = malloc((size_t)sb.st_size)) ||
        read(fd, pristine, (size_t)sb.st_size) != sb.st_size)
        die("cannot read the catalog back");
    close(fd);
    npristine = (size_t)sb.st_size;
    const char *out = getenv("FUZZ_DUMP");
    if (out) {
        sqlite3 *db;
        if (sqlite3_open_v2(catpath, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK)
            die("cannot open the catalog");
        dump_seeds(db, out);
        sqlite3_close(db);
    }
    return 0;
}

/* PRAGMA data_version: changes when another connection commits. */
static int64_t data_version(sqlite3 *db)
{
    sqlite3_stmt *st;
    int64_t v = -1;
    if (sqlite3_prepare_v2(db, "PRAGMA data_version", -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW)
            v = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    return v;
}

static void fuzz_row(const unsigned char *data, size_t size)
{
    if (size < 2)
        return;
    int c = data[0] & 3;
    int idx = data[1];
    restore();
    sqlite3 *db;
    if (sqlite3_open_v2(catpath, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK)
        abort();
    size_t body = size - 2;
    unsigned char *row = malloc(body + 8 + 1 + RESTAMP_GROWTH);
    if (!row)
        abort();
    memcpy(row, data + 2, body);
    if (c == 3)
        body = restamp(row, body);
    size_t n = body;
    if (c) {
        uint64_t seed;
        if (c == 1) {
            /* the entry's key is part of its header's checksum */
            sqlite3_stmt *st;
            seed = SEED_HEAD ^ (uint64_t)idx;
            if (sqlite3_prepare_v2(db, "SELECT key FROM model_entries WHERE idx=?", -1, &st, NULL) != SQLITE_OK)
                abort();
            sqlite3_bind_int(st, 1, idx);
            if (sqlite3_step(st) == SQLITE_ROW)
                seed = XXH3_64bits_withSeed(sqlite3_column_blob(st, 0), (size_t)sqlite3_column_bytes(st, 0), seed);
            sqlite3_finalize(st);
        } else {
            seed = (c == 2 ? SEED_CHUNKS : SEED_RECORDS) ^ (uint64_t)idx;
        }
        uint64_t h = XXH3_64bits_withSeed(row, body, seed);
        for (int i = 0; i < 8; i++)
            row[n++] = (unsigned char)(h >> (8 * i));
    }
    char q[160];
    snprintf(q, sizeof q, "UPDATE %s SET %s=?1%s", columns[c][0], columns[c][1], c ? " WHERE idx=?2" : "");
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, q, -1, &st, NULL) != SQLITE_OK)
        abort();
    sqlite3_bind_blob(st, 1, n ? (const void *)row : (const void *)"", (int)n, SQLITE_TRANSIENT);
    if (c)
        sqlite3_bind_int(st, 2, idx);
    (void)sqlite3_step(st);
    sqlite3_finalize(st);
    int64_t version = data_version(db);
    int served = open_served();
    if (getenv("FUZZ_VERBOSE"))
        /* fuzz-regress.sh: a stored row's seed must be served as it is: a row
         * the catalog cannot use makes it parse or locate again and store
         * what it found (another connection's commit: data_version moves) */
        fprintf(stderr, "fuzz_catalog: %s\n", !served ? "parsed" : data_version(db) != version ? "stored again"
                                                                                           : "served by the catalog");
    sqlite3_close(db);
    free(row);
}

static void fuzz_sidecar(const unsigned char *data, size_t size)
{
    write_file(sidepath, data, size);
    dcp_checkpoint *ck;
    dcp_catalog *cat;
    dcp_error err;
    if (dcp_open(dir, 0, &ck, &err) < 0)
        abort();
    if (dcp_catalog_open(":memory:", &cat, &err) < 0)
        abort();
    uint64_t n, checked, missing, nproblems;
    if (dcp_catalog_import(cat, ck, sidepath, &n, &err) == 0 && n)
        (void)dcp_verify_digests(cat, ck, NULL, NULL, NULL, NULL, &checked, &missing, &nproblems, &err);
    dcp_catalog_close(cat);
    dcp_close(ck);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (rows)
        fuzz_row(data, size);
    else
        fuzz_sidecar(data, size);
    return 0;
}
