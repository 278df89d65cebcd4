/* Models served by the catalog (issue 5): entries and chunk lists read on
 * demand must give exactly what parsing gives. Every fixture is read
 * byte for byte through a served model whose chunk cache keeps nothing
 * (every chunk list read again at each use), from several threads at once;
 * keys are walked in order with dcp_seek; a model removed from the catalog
 * under an open checkpoint falls back to parsing; a changed checkpoint is
 * catalogued afresh, one model per folder. */
#include "check_quiet.h"
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"
#include "integrity/integrity.h"
#include "store.h"

static const char *fixtures[] = {"01_single_plain", "02_rowwise_4ranks", "03_colwise_4ranks", "04_block_4ranks",
                                 "05_mixed_2ranks", "08_single_file_per_rank", "09_megatron_torch_dist"};
#define NFIX (sizeof fixtures / sizeof *fixtures)

static char tmpdir[4096], catpath[4200];

static void make_tmpdir(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/dcp-served-XXXXXX", t && *t ? t : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(catpath, sizeof catpath, "%s/catalog.sqlite", tmpdir);
}

static void rm_tmpdir(void)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

static void fixture_path(const char *name, char *out, size_t n)
{
    const char *top = getenv("top_srcdir");
    snprintf(out, n, "%s/tests/fixtures/%s/ckpt", top ? top : "..", name);
}

static dcp_checkpoint *open_parsed(const char *path)
{
    dcp_checkpoint *ck;
    dcp_error err;
    ck_assert_msg(dcp_open(path, 0, &ck, &err) == 0, "%s", err.msg);
    return ck;
}

static dcp_checkpoint *open_catalog(const char *path)
{
    dcp_checkpoint *ck;
    dcp_error err;
    dcp_open_options o = DCP_OPEN_OPTIONS_INIT;
    o.flags = DCP_OPEN_CATALOG;
    o.catalog = catpath;
    ck_assert_msg(dcp_open_ex(path, &o, &ck, &err) == 0, "%s", err.msg);
    return ck;
}

/* A served model (opened twice: the second open finds it stored) whose
 * chunk cache keeps nothing unpinned. */
static dcp_checkpoint *open_served(const char *path)
{
    dcp_close(open_catalog(path));
    dcp_checkpoint *ck = open_catalog(path);
    ck_assert_msg(dcp_from_catalog(ck) == 1, "%s: not served from the catalog", path);
    ck_assert_ptr_nonnull(ck->lazy);
    ck->chunk_budget = 0;
    return ck;
}

/* Entry e's bytes (tensor image or bytes item), or NULL when it has none
 * to read (a bytes item without storage); *len gets the size. */
static void *bytes_of(dcp_checkpoint *ck, const dcp_entry *e, uint64_t *len)
{
    void *buf = NULL;
    dcp_error err;
    if (e->kind == DCP_KIND_BYTES && !e->has_blob)
        return NULL;
    ck_assert_msg(dcp_read_entry(ck, e, &buf, len, &err) == 0, "%s", err.msg);
    return buf;
}

/* The same header and chunks in both models. */
static void same_entry(dcp_checkpoint *a, const dcp_entry *x, dcp_checkpoint *b, const dcp_entry *y)
{
    dcp_error err;
    ck_assert_str_eq(x->key, y->key);
    ck_assert_int_eq(x->kind, y->kind);
    ck_assert_int_eq(x->dtype, y->dtype);
    ck_assert_int_eq(x->ndim, y->ndim);
    ck_assert_uint_eq(x->nchunks, y->nchunks);
    ck_assert(!x->ndim || !memcmp(x->shape, y->shape, (size_t)x->ndim * 8));
    ck_assert(!memcmp(&x->blob, &y->blob, sizeof x->blob));
    ck_assert_int_eq(x->has_blob, y->has_blob);
    const dcp_chunk *cx, *cy;
    ck_assert_msg(dcp_entry_chunks(a, x, &cx, &err) == 0, "%s", err.msg);
    ck_assert_msg(dcp_entry_chunks(b, y, &cy, &err) == 0, "%s", err.msg);
    for (size_t c = 0; c < x->nchunks; c++) {
        ck_assert(!memcmp(&cx[c].blob, &cy[c].blob, sizeof cx[c].blob));
        ck_assert_int_eq(cx[c].has_blob, cy[c].has_blob);
        ck_assert(!x->ndim || !memcmp(cx[c].offsets, cy[c].offsets, (size_t)x->ndim * 8));
        ck_assert(!x->ndim || !memcmp(cx[c].sizes, cy[c].sizes, (size_t)x->ndim * 8));
        const dcp_record *rx, *ry;
        int ok = dcp_chunk_record(a, x, c, &rx, &err) == 0;
        ck_assert_int_eq(dcp_chunk_record(b, y, c, &ry, &err) == 0, ok);
        if (ok) {
            ck_assert_uint_eq(rx->data_offset, ry->data_offset);
            ck_assert_uint_eq(rx->data_length, ry->data_length);
            ck_assert_int_eq(rx->storage_offset, ry->storage_offset);
            ck_assert(!x->ndim || !memcmp(rx->stride, ry->stride, (size_t)x->ndim * 8));
        }
    }
    dcp_release_chunks(a, x);
    dcp_release_chunks(b, y);
}

/* Every entry of the parsed model p, found by key in the served model s,
 * holds the same header, chunks, records and bytes. */
static void same_reads(dcp_checkpoint *p, dcp_checkpoint *s)
{
    ck_assert_uint_eq(dcp_num_entries(p), dcp_num_entries(s));
    for (size_t i = 0; i < dcp_num_entries(p); i++) {
        const dcp_entry *x = dcp_entry_at(p, i), *y = dcp_find(s, x->key);
        ck_assert_msg(y != NULL, "%s: not found in the served model", x->key);
        same_entry(p, x, s, y);
        uint64_t lx = 0, ly = 0;
        void *bx = bytes_of(p, x, &lx), *by = bytes_of(s, y, &ly);
        ck_assert_uint_eq(lx, ly);
        ck_assert_msg(!bx || !memcmp(bx, by, (size_t)lx), "%s: bytes differ", x->key);
        free(bx);
        free(by);
    }
}

/* same_reads, and the same entries in metadata order. */
static void same_model(dcp_checkpoint *p, dcp_checkpoint *s)
{
    same_reads(p, s);
    for (size_t i = 0; i < dcp_num_entries(p); i++)
        same_entry(p, dcp_entry_at(p, i), s, dcp_entry_at(s, i));
}

START_TEST(served_reads_every_fixture_byte_exact)
{
    make_tmpdir();
    for (size_t f = 0; f < NFIX; f++) {
        char path[4200];
        fixture_path(fixtures[f], path, sizeof path);
        dcp_checkpoint *p = open_parsed(path);
        /* the first open parses, stores and is served from the catalog too */
        dcp_checkpoint *first = open_catalog(path);
        ck_assert_int_eq(dcp_from_catalog(first), 0);
        ck_assert_ptr_nonnull(first->lazy);
        first->chunk_budget = 0;
        same_reads(p, first);
        dcp_close(first);
        dcp_checkpoint *s = open_served(path);
        same_reads(p, s);
        /* in metadata order too, and the info */
        for (size_t i = 0; i < dcp_num_entries(p); i++)
            same_entry(p, dcp_entry_at(p, i), s, dcp_entry_at(s, i));
        ck_assert_str_eq(dcp_get_info(p)->layout, dcp_get_info(s)->layout);
        ck_assert_int_eq(dcp_get_info(p)->megatron, dcp_get_info(s)->megatron);
        ck_assert_ptr_null(dcp_find(s, "no.such.key"));
        dcp_close(s);
        dcp_close(p);
    }
    rm_tmpdir();
}
END_TEST

/* A .metadata parsed with its chunks spilled to scratch files (the first
 * open of a large checkpoint, forced here by DCP_SPILL_BYTES=0): the spill
 * store alone (chunks read back from the scratch files, the cache keeping
 * nothing), the catalog storing from it, and the model served afterwards
 * all give exactly what the in-memory parse gives. */
START_TEST(spilled_parse_reads_every_fixture_byte_exact)
{
    make_tmpdir();
    for (size_t f = 0; f < NFIX; f++) {
        char path[4200];
        dcp_error err;
        fixture_path(fixtures[f], path, sizeof path);
        dcp_checkpoint *p = open_parsed(path);
        dcp_checkpoint *sp = dcpi_ck_new(path, &err);
        ck_assert_ptr_nonnull(sp);
        ck_assert_msg(dcpi_spill_begin(sp, tmpdir, &err) == 0, "%s", err.msg);
        ck_assert_msg(dcpi_megatron_config(sp, &err) == 0 && dcpi_load_metadata(sp, ".metadata", &err) == 0 &&
                          dcpi_ck_files_ready(sp, &err) == 0,
                      "%s: %s", path, err.msg);
        ck_assert_str_eq(sp->store->name, "spill");
        sp->chunk_budget = 0;
        same_model(p, sp);
        dcp_close(sp);

        setenv("DCP_SPILL_BYTES", "0", 1);
        dcp_checkpoint *first = open_catalog(path);
        unsetenv("DCP_SPILL_BYTES");
        ck_assert_int_eq(dcp_from_catalog(first), 0);
        ck_assert_ptr_nonnull(first->lazy);   /* stored, then served */
        first->chunk_budget = 0;
        same_reads(p, first);
        dcp_close(first);
        dcp_checkpoint *s = open_served(path);
        same_model(p, s);
        dcp_close(s);
        dcp_close(p);
    }
    /* the scratch files were never linked (or unlinked at once) */
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -q dcp-spill", tmpdir);
    ck_assert_int_ne(system(cmd), 0);
    rm_tmpdir();
}
END_TEST

static int by_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* dcp_seek walks the keys in byte order, in both kinds of model, and
 * lands where a binary search over the sorted keys lands. */
START_TEST(seek_walks_keys_in_order)
{
    make_tmpdir();
    for (size_t f = 0; f < NFIX; f++) {
        char path[4200];
        fixture_path(fixtures[f], path, sizeof path);
        dcp_checkpoint *p = open_parsed(path), *s = open_served(path);
        size_t n = dcp_num_entries(p);
        const char **keys = malloc(n * sizeof *keys);
        for (size_t i = 0; i < n; i++)
            keys[i] = dcp_entry_at(p, i)->key;
        qsort(keys, n, sizeof *keys, by_str);
        dcp_checkpoint *both[2] = {p, s};
        for (int m = 0; m < 2; m++) {
            char from[4096] = "";
            dcp_error err;
            size_t seen = 0;
            for (;;) {
                const dcp_entry *e;
                ck_assert_msg(dcp_seek(both[m], from, &e, &err) == 0, "%s", err.msg);
                if (!e)
                    break;
                ck_assert_uint_lt(seen, n);
                ck_assert_str_eq(e->key, keys[seen]);
                seen++;
                snprintf(from, sizeof from, "%s\x01", e->key);   /* the key right after */
            }
            ck_assert_uint_eq(seen, n);
            /* probes between keys: the first key >= the probe */
            static const char *probes[] = {"", "a", "model.", "model.layers.1.", "z", "\x7f", "dtypes.f"};
            for (size_t q = 0; q < sizeof probes / sizeof *probes; q++) {
                const dcp_entry *e;
                ck_assert_int_eq(dcp_seek(both[m], probes[q], &e, &err), 0);
                size_t lo = 0;
                while (lo < n && strcmp(keys[lo], probes[q]) < 0)
                    lo++;
                if (lo == n)
                    ck_assert_ptr_null(e);
                else
                    ck_assert_str_eq(e->key, keys[lo]);
            }
            /* each key and the point right after it, forwards, backwards and
             * in strides: a served model answers seeks inside the rows its
             * last statement read without another (modelcache.c) */
            for (int order = 0; order < 3; order++)
                for (size_t t = 0; t < 2 * n; t++) {
                    size_t q = order == 0 ? t : order == 1 ? 2 * n - 1 - t : (t * 7) % (2 * n);
                    snprintf(from, sizeof from, "%s%s", keys[q / 2], q % 2 ? "\x01" : "");
                    const dcp_entry *e;
                    ck_assert_int_eq(dcp_seek(both[m], from, &e, &err), 0);
                    size_t want = q / 2 + q % 2;
                    if (want == n)
                        ck_assert_ptr_null(e);
                    else
                        ck_assert_str_eq(e->key, keys[want]);
                }
        }
        free(keys);
        dcp_close(s);
        dcp_close(p);
    }
    rm_tmpdir();
}
END_TEST

/* ------------------------------------------------------------ threads */

struct worker {
    dcp_checkpoint *s;
    dcp_checkpoint *p;
    size_t start;
    int ok;
};

static void *reader(void *arg)
{
    struct worker *w = arg;
    size_t n = dcp_num_entries(w->p);
    w->ok = 1;
    for (int round = 0; round < 3; round++)
        for (size_t k = 0; k < n; k++) {
            size_t i = (w->start + k * 7) % n;
            const dcp_entry *x = dcp_entry_at(w->p, i), *y = dcp_find(w->s, x->key);
            void *bx = NULL, *by = NULL;
            uint64_t lx = 0, ly = 0;
            dcp_error err;
            if (!y) {
                w->ok = 0;
                continue;
            }
            if (x->kind == DCP_KIND_BYTES && !x->has_blob)
                continue;
            if (dcp_read_entry(w->p, x, &bx, &lx, &err) < 0 || dcp_read_entry(w->s, y, &by, &ly, &err) < 0 ||
                lx != ly || memcmp(bx, by, (size_t)lx))
                w->ok = 0;
            free(bx);
            free(by);
        }
    return NULL;
}

/* Four threads read every entry of a served model at once, each in its own
 * order, while chunk lists are read, pinned, dropped and read again. */
START_TEST(threads_share_a_served_model)
{
    make_tmpdir();
    for (size_t f = 0; f < NFIX; f++) {
        char path[4200];
        fixture_path(fixtures[f], path, sizeof path);
        dcp_checkpoint *p = open_parsed(path), *s = open_served(path);
        pthread_t th[4];
        struct worker w[4];
        for (int t = 0; t < 4; t++) {
            w[t] = (struct worker){s, p, (size_t)t * 5, 0};
            ck_assert_int_eq(pthread_create(&th[t], NULL, reader, &w[t]), 0);
        }
        for (int t = 0; t < 4; t++) {
            pthread_join(th[t], NULL);
            ck_assert_msg(w[t].ok, "%s: thread %d read other bytes than the parsed model", fixtures[f], t);
        }
        ck_assert_uint_eq(s->chunk_bytes, 0);   /* nothing pinned is left behind */
        dcp_close(s);
        dcp_close(p);
    }
    rm_tmpdir();
}
END_TEST

/* ------------------------------------------------------------ the catalog changes */

static int sql(const char *stmt)
{
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(catpath, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    int rc = sqlite3_exec(db, stmt, NULL, NULL, NULL);
    sqlite3_close(db);
    return rc;
}

static long count(const char *query)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    long n = -1;
    ck_assert_int_eq(sqlite3_open(catpath, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(db, query, -1, &st, NULL), SQLITE_OK);
    if (sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* Another process drops the model while a served checkpoint is open and
 * has given out nothing yet, or half of it: the rest comes from a parse. */
START_TEST(model_dropped_under_an_open_checkpoint)
{
    make_tmpdir();
    char path[4200];
    fixture_path("05_mixed_2ranks", path, sizeof path);
    for (int touched = 0; touched < 2; touched++) {
        dcp_checkpoint *p = open_parsed(path), *s = open_served(path);
        const dcp_entry *early = touched ? dcp_find(s, dcp_entry_at(p, 1)->key) : NULL;
        ck_assert_int_eq(sql("DELETE FROM model_entries; DELETE FROM models"), SQLITE_OK);
        same_reads(p, s);
        for (size_t i = 0; i < dcp_num_entries(p); i++)
            same_entry(p, dcp_entry_at(p, i), s, dcp_entry_at(s, i));
        if (early)
            ck_assert_ptr_eq(early, dcp_find(s, early->key));   /* pointers given out stay */
        dcp_close(s);
        dcp_close(p);
    }
    rm_tmpdir();
}
END_TEST

static void run(const char *fmt, const char *a, const char *b)
{
    char cmd[9000];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    ck_assert_msg(system(cmd) == 0, "%s", cmd);
}

/* A changed shard or .metadata is catalogued afresh, replacing the folder's
 * old model; a copy of the folder is served by the .metadata's content. */
START_TEST(changed_checkpoint_catalogued_afresh)
{
    make_tmpdir();
    char src[4200], ck[4300], copy[4300], q[4600], real[4300];
    fixture_path("02_rowwise_4ranks", src, sizeof src);
    snprintf(ck, sizeof ck, "%s/ck", tmpdir);
    snprintf(copy, sizeof copy, "%s/copy", tmpdir);
    run("cp -r '%s' '%s'", src, ck);
    run("chmod -R u+w '%s' %s", ck, "");
    run("touch -d '2001-01-01' '%s/.metadata' %s", ck, "");
    ck_assert_ptr_nonnull(realpath(ck, real));
    snprintf(q, sizeof q, "SELECT count(*) FROM models WHERE path='%s'", real);
    dcp_close(open_served(ck));
    ck_assert_int_eq(count(q), 1);

    /* a shard one byte longer */
    run("truncate -s +1 '%s/__0_0.distcp' %s", ck, "");
    dcp_checkpoint *c = open_catalog(ck);
    ck_assert_int_eq(dcp_from_catalog(c), 0);
    dcp_close(c);
    ck_assert_int_eq(count(q), 1);
    dcp_checkpoint *p = open_parsed(ck), *s = open_served(ck);
    same_reads(p, s);
    dcp_close(s);
    dcp_close(p);

    /* the same .metadata bytes, another mtime */
    run("touch -d '2002-02-02' '%s/.metadata' %s", ck, "");
    c = open_catalog(ck);
    ck_assert_int_eq(dcp_from_catalog(c), 0);
    dcp_close(c);
    ck_assert_int_eq(count(q), 1);
    ck_assert_int_eq(count("SELECT count(*) FROM models"), 1);
    s = open_served(ck);
    dcp_close(s);

    /* a copy with the same .metadata (cp -p keeps its mtime): served by content */
    run("cp -rp '%s' '%s'", ck, copy);
    c = open_catalog(copy);
    ck_assert_int_eq(dcp_from_catalog(c), 1);
    p = open_parsed(copy);
    c->chunk_budget = 0;
    same_reads(p, c);
    dcp_close(p);
    dcp_close(c);
    ck_assert_int_eq(count("SELECT count(*) FROM models"), 1);
    /* no orphan entry rows */
    ck_assert_int_eq(count("SELECT count(*) FROM model_entries WHERE model NOT IN (SELECT id FROM models)"), 0);
    rm_tmpdir();
}
END_TEST

/* When a read of the file with inode swap_ino reaches its end, that file's
 * content is replaced (in place) by swap_from's: this definition of read
 * takes the place of the C library's in this program. */
static ino_t swap_ino;
static char swap_from[4300];

ssize_t read(int fd, void *buf, size_t n)
{
    ssize_t r = (ssize_t)syscall(SYS_read, fd, buf, n);
    struct stat sb;
    if (r == 0 && swap_ino && fstat(fd, &sb) == 0 && sb.st_ino == swap_ino) {
        swap_ino = 0;
        char data[65536];
        int in = open(swap_from, O_RDONLY), out;
        ssize_t len = in < 0 ? -1 : (ssize_t)syscall(SYS_read, in, data, sizeof data);
        if (in >= 0)
            close(in);
        char self[64];
        snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
        out = open(self, O_WRONLY | O_TRUNC);
        if (len > 0 && out >= 0 && write(out, data, (size_t)len) != len)
            len = -1;
        if (out >= 0)
            close(out);
    }
    return r;
}

/* The .metadata is rewritten between the first open's content-key read and
 * its parse: the model stored is filed under what was parsed, so a copy of
 * the folder as it was (same .metadata bytes and mtime) is not served the
 * new model. */
START_TEST(metadata_rewritten_during_first_open)
{
    make_tmpdir();
    char src[4200], other[4200], ck[4300], copy[4300], meta[4400];
    fixture_path("02_rowwise_4ranks", src, sizeof src);
    fixture_path("03_colwise_4ranks", other, sizeof other);
    snprintf(ck, sizeof ck, "%s/ck", tmpdir);
    snprintf(copy, sizeof copy, "%s/copy", tmpdir);
    snprintf(meta, sizeof meta, "%s/.metadata", ck);
    snprintf(swap_from, sizeof swap_from, "%s/.metadata", other);
    run("cp -rp '%s' '%s'", src, ck);
    run("cp -rp '%s' '%s'", src, copy);
    run("chmod -R u+w '%s' '%s'", ck, copy);
    struct stat sb;
    ck_assert_int_eq(stat(meta, &sb), 0);
    swap_ino = sb.st_ino;
    dcp_checkpoint *c = open_catalog(ck);   /* key read (then the swap), parse */
    ck_assert_int_eq(swap_ino, 0);          /* the swap happened */
    dcp_close(c);
    /* the copy still holds the old .metadata: whatever serves it gives its own parse */
    dcp_checkpoint *p = open_parsed(copy), *s = open_catalog(copy);
    s->chunk_budget = 0;
    same_reads(p, s);
    for (size_t i = 0; i < dcp_num_entries(p); i++)
        same_entry(p, dcp_entry_at(p, i), s, dcp_entry_at(s, i));
    dcp_close(s);
    dcp_close(p);
    /* and the rewritten folder is served its new model (headers and chunks:
     * its shards are not the ones this .metadata was written with) */
    p = open_parsed(ck);
    s = open_served(ck);
    ck_assert_uint_eq(dcp_num_entries(p), dcp_num_entries(s));
    for (size_t i = 0; i < dcp_num_entries(p); i++)
        same_entry(p, dcp_entry_at(p, i), s, dcp_entry_at(s, i));
    dcp_close(s);
    dcp_close(p);
    rm_tmpdir();
}
END_TEST

/* How many of the tensor chunks of s have a record before any is located
 * (those read back from the catalog), and how many chunks with a blob. */
static void preloaded(dcp_checkpoint *s, const char *file, size_t *have, size_t *all)
{
    dcp_error err;
    *have = *all = 0;
    for (size_t i = 0; i < dcp_num_entries(s); i++) {
        const dcp_entry *e = dcp_entry_at(s, i);
        const dcp_chunk *c;
        if (e->kind != DCP_KIND_TENSOR)
            continue;
        ck_assert_msg(dcp_entry_chunks(s, e, &c, &err) == 0, "%s", err.msg);
        const dcpi_chunkset *set = s->priv[i].set;
        for (size_t k = 0; k < e->nchunks; k++) {
            if (!c[k].has_blob || (file && strcmp(dcp_file_name(s, c[k].blob.file), file)))
                continue;
            (*all)++;
            *have += set->records[k].state == 1;
        }
        dcp_release_chunks(s, e);
    }
}

START_TEST(records_stored_and_used_while_shards_unchanged)
{
    make_tmpdir();
    char src[4200], ck[4300];
    fixture_path("01_single_plain", src, sizeof src);
    snprintf(ck, sizeof ck, "%s/ck", tmpdir);
    run("cp -rp '%s' '%s'", src, ck);
    run("chmod -R u+w '%s' %s", ck, "");
    dcp_checkpoint *p = open_parsed(ck);
    /* located through a served model (its chunk sets dropped at once), stored */
    dcp_checkpoint *s = open_served(ck);
    same_reads(p, s);
    dcp_close(s);
    ck_assert_int_gt(count("SELECT count(*) FROM model_records"), 0);
    /* the next open has them all before locating any, and they are the parsed ones */
    dcp_checkpoint *c = open_catalog(ck);
    ck_assert_int_eq(dcp_from_catalog(c), 1);
    size_t have, all;
    preloaded(c, NULL, &have, &all);
    ck_assert_uint_gt(all, 0);
    ck_assert_uint_eq(have, all);
    same_reads(p, c);
    for (size_t i = 0; i < dcp_num_entries(p); i++)
        same_entry(p, dcp_entry_at(p, i), c, dcp_entry_at(c, i));
    dcp_close(c);
    /* a shard touched (new mtime and ctime): its records are located again
     * (p, opened before, would fail its reads now: opened again) */
    run("touch '%s/__0_3.distcp' %s", ck, "");
    dcp_close(p);
    p = open_parsed(ck);
    c = open_catalog(ck);
    ck_assert_int_eq(dcp_from_catalog(c), 1);
    preloaded(c, "__0_3.distcp", &have, &all);
    ck_assert_uint_gt(all, 0);
    ck_assert_uint_eq(have, 0);
    preloaded(c, NULL, &have, &all);
    ck_assert_uint_gt(have, 0);   /* the other files' records still serve */
    c->chunk_budget = 0;
    same_reads(p, c);
    dcp_close(c);
    /* a damaged records row is ignored, never used */
    ck_assert_int_eq(sql("UPDATE model_records SET data = CAST(zeroblob(length(data)) AS BLOB)"), SQLITE_OK);
    c = open_catalog(ck);
    preloaded(c, NULL, &have, &all);
    ck_assert_uint_eq(have, 0);
    same_reads(p, c);
    dcp_close(c);
    dcp_close(p);
    rm_tmpdir();
}
END_TEST

#ifndef __SANITIZE_ADDRESS__
/* The next calloc fails once armed: this definition takes the place of the
 * C library's in this program (the sanitizers bring their own). */
extern void *__libc_calloc(size_t n, size_t size);
static volatile int calloc_fails;

void *calloc(size_t n, size_t size)
{
    if (calloc_fails) {
        calloc_fails = 0;
        errno = ENOMEM;
        return NULL;
    }
    return __libc_calloc(n, size);
}

/* Memory running out while a chunk list is read is an error of that call:
 * the model is not damaged (it stays in the catalog), nothing is parsed
 * instead, and the next call succeeds. */
START_TEST(chunk_list_out_of_memory_is_no_damage)
{
    make_tmpdir();
    char path[4200];
    fixture_path("05_mixed_2ranks", path, sizeof path);
    dcp_checkpoint *p = open_parsed(path), *s = open_served(path);
    const dcp_entry *e = NULL;
    for (size_t i = 0; i < dcp_num_entries(s) && !e; i++)
        if (dcp_entry_at(s, i)->kind == DCP_KIND_TENSOR && dcp_entry_at(s, i)->nchunks)
            e = dcp_entry_at(s, i);
    ck_assert_ptr_nonnull(e);
    const dcp_chunk *c;
    dcp_error err;
    calloc_fails = 1;
    int rc = dcp_entry_chunks(s, e, &c, &err);
    calloc_fails = 0;
    ck_assert_int_eq(rc, -1);
    ck_assert_int_eq(err.code, ENOMEM);
    ck_assert_msg(strstr(err.msg, "out of memory") && !strstr(err.msg, "damaged"), "%s", err.msg);
    ck_assert_int_eq(count("SELECT count(*) FROM models"), 1);
    ck_assert_ptr_null(s->lazy->parsed);
    same_reads(p, s);
    ck_assert_ptr_null(s->lazy->parsed);
    dcp_close(s);
    dcp_close(p);
    rm_tmpdir();
}
END_TEST
#endif

/* A damaged chunk list row (its checksum fails): the open checkpoint serves
 * the same bytes from a parse, and the model is dropped from the catalog. */
START_TEST(damaged_chunk_row_falls_back_and_drops_the_model)
{
    make_tmpdir();
    char path[4200];
    fixture_path("05_mixed_2ranks", path, sizeof path);
    dcp_close(open_served(path));
    ck_assert_int_eq(count("SELECT count(*) FROM models"), 1);
    ck_assert_int_eq(sql("UPDATE model_entries SET chunks = CAST(zeroblob(length(chunks)) AS BLOB)"), SQLITE_OK);
    dcp_checkpoint *p = open_parsed(path), *s = open_catalog(path);
    ck_assert_int_eq(dcp_from_catalog(s), 1);   /* the model row itself is sound */
    s->chunk_budget = 0;
    same_reads(p, s);
    ck_assert_ptr_nonnull(s->lazy->parsed);
    ck_assert_int_eq(count("SELECT count(*) FROM models"), 0);
    ck_assert_int_eq(count("SELECT count(*) FROM model_entries"), 0);
    dcp_close(s);
    /* the next open parses and stores afresh */
    s = open_served(path);
    same_reads(p, s);
    ck_assert_ptr_null(s->lazy->parsed);
    dcp_close(s);
    dcp_close(p);
    rm_tmpdir();
}
END_TEST

/* The folder's .metadata replaced by other content and its model dropped
 * (as another open storing the new one does) under an open checkpoint: the
 * next lookup fails with ESTALE, naming the folder, rather than serving
 * the new model's entries as the old one's. */
START_TEST(changed_under_an_open_checkpoint_is_estale)
{
    make_tmpdir();
    char src[4200], other[4200], ck[4300];
    fixture_path("02_rowwise_4ranks", src, sizeof src);
    fixture_path("03_colwise_4ranks", other, sizeof other);
    snprintf(ck, sizeof ck, "%s/ck", tmpdir);
    run("cp -rp '%s' '%s'", src, ck);
    run("chmod -R u+w '%s' %s", ck, "");
    dcp_checkpoint *s = open_served(ck);
    run("cp '%s/.metadata' '%s/.metadata'", other, ck);
    ck_assert_int_eq(sql("DELETE FROM model_entries; DELETE FROM models"), SQLITE_OK);
    const dcp_entry *e = NULL;
    dcp_error err;
    ck_assert_int_eq(dcp_seek(s, "", &e, &err), -1);
    ck_assert_int_eq(err.code, ESTALE);
    ck_assert_msg(strstr(err.msg, ck) && strstr(err.msg, "changed since it was opened"), "%s", err.msg);
    ck_assert_ptr_null(dcp_entry_at(s, 0));
    /* the lookups of the error contract tell this failure from "no such key" */
    ck_assert_int_eq(dcp_get_entry(s, 0, &e, &err), -1);
    ck_assert_int_eq(err.code, ESTALE);
    ck_assert_msg(strstr(err.msg, ck) && strstr(err.msg, ": entry 0: ") &&
                  strstr(err.msg, "changed since it was opened"), "%s", err.msg);
    ck_assert_int_eq(dcp_find_entry(s, "model.tiny", &e, &err), -1);
    ck_assert_ptr_null(e);
    ck_assert_int_eq(err.code, ESTALE);
    ck_assert_msg(strstr(err.msg, ck) && strstr(err.msg, ": model.tiny: "), "%s", err.msg);
    dcp_close(s);
    rm_tmpdir();
}
END_TEST

/* A served model whose entry rows are damaged and whose .metadata is gone:
 * the catalog cannot answer and the parse it falls back to fails, so a
 * lookup of a key that is there fails (ENOENT for the missing .metadata,
 * naming the folder and the key), which dcp_find_entry tells apart from a
 * key that is not (DCP_ENOTFOUND); dcp_find gives NULL for both. */
START_TEST(damaged_row_failure_is_not_not_found)
{
    make_tmpdir();
    char src[4200], ck[4300], md[4400];
    fixture_path("02_rowwise_4ranks", src, sizeof src);
    snprintf(ck, sizeof ck, "%s/ck", tmpdir);
    run("cp -rp '%s' '%s'", src, ck);
    run("chmod -R u+w '%s' %s", ck, "");
    dcp_checkpoint *p = open_parsed(ck), *s = open_served(ck);
    const dcp_entry *pe = dcp_entry_at(p, 0), *e = NULL;
    dcp_error err;
    /* a sound served model: found, and not found */
    ck_assert_msg(dcp_find_entry(s, pe->key, &e, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(e->key, pe->key);
    ck_assert_int_eq(dcp_find_entry(s, "no.such.key", &e, &err), -1);
    ck_assert_int_eq(err.code, DCP_ENOTFOUND);
    ck_assert_msg(strstr(err.msg, ck) && strstr(err.msg, ": no.such.key: no such key"), "%s", err.msg);
    dcp_close(s);

    s = open_catalog(ck);
    ck_assert_int_eq(dcp_from_catalog(s), 1);
    ck_assert_int_eq(sql("UPDATE model_entries SET head = CAST(zeroblob(length(head)) AS BLOB)"), SQLITE_OK);
    snprintf(md, sizeof md, "%s/.metadata", ck);
    ck_assert_int_eq(unlink(md), 0);
    memset(&err, 0, sizeof err);
    ck_assert_int_eq(dcp_find_entry(s, pe->key, &e, &err), -1);
    ck_assert_ptr_null(e);
    ck_assert_int_ne(err.code, DCP_ENOTFOUND);
    ck_assert_int_eq(err.code, ENOENT);
    ck_assert_msg(strstr(err.msg, ck) && strstr(err.msg, pe->key) && strstr(err.msg, "no .metadata"), "%s", err.msg);
    ck_assert_ptr_null(dcp_find(s, pe->key));
    ck_assert_int_eq(dcp_get_entry(s, 0, &e, &err), -1);
    ck_assert_int_eq(err.code, ENOENT);
    dcp_close(s);
    dcp_close(p);
    rm_tmpdir();
}
END_TEST

/* Records kept as chunk sets are dropped are stored in batches in the
 * background (never by the thread that reads), while the checkpoint is
 * open; the rest at dcp_close. */
START_TEST(records_stored_in_the_background)
{
    make_tmpdir();
    char ck[4300];
    snprintf(ck, sizeof ck, "%s/ck", tmpdir);
    const char *top = getenv("top_builddir");
    run("%s/dcp synth '%s' --keys 200 --shape 8,4 --ranks 2 >/dev/null", top ? top : ".", ck);
    dcp_checkpoint *p = open_parsed(ck), *s = open_served(ck);   /* nothing kept: every set dropped at once */
    same_reads(p, s);
    long stored = 0;
    for (int i = 0; i < 1000 && (stored = count("SELECT count(*) FROM model_records")) < 128; i++)
        usleep(10000);   /* the background thread's second batch */
    ck_assert_int_ge(stored, 128);
    dcp_close(s);
    ck_assert_int_eq(count("SELECT count(*) FROM model_records"), 200);
    dcp_close(p);
    rm_tmpdir();
}
END_TEST

/* Format 2 catalogs (one model blob per checkpoint) are upgraded in place:
 * the models go, recorded digests stay. */
START_TEST(format_2_catalog_upgraded)
{
    make_tmpdir();
    ck_assert_int_eq(sql("CREATE TABLE catalog_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                         "CREATE TABLE checkpoints(id INTEGER PRIMARY KEY, identity TEXT UNIQUE NOT NULL);"
                         "CREATE TABLE digests(ck INTEGER NOT NULL, file TEXT NOT NULL, offset INTEGER NOT NULL,"
                         " length INTEGER NOT NULL, xxh3 INTEGER NOT NULL, PRIMARY KEY(ck, file, offset)) WITHOUT ROWID;"
                         "CREATE TABLE models(metadata_key TEXT PRIMARY KEY, path TEXT NOT NULL,"
                         " xxh3 INTEGER NOT NULL, data BLOB NOT NULL);"
                         "INSERT INTO catalog_meta VALUES('format', 'dcpfs-catalog-2');"
                         "INSERT INTO checkpoints VALUES(1, 'x');"
                         "INSERT INTO digests VALUES(1, 'a.distcp', 0, 10, 42);"
                         "INSERT INTO models VALUES('k', '/p', 1, x'00');"),
                     SQLITE_OK);
    char path[4200];
    fixture_path("01_single_plain", path, sizeof path);
    dcp_checkpoint *s = open_served(path);
    dcp_close(s);
    ck_assert_int_eq(count("SELECT count(*) FROM digests"), 1);
    ck_assert_int_eq(count("SELECT count(*) FROM catalog_meta WHERE value='dcpfs-catalog-3'"), 1);
    ck_assert_int_eq(count("SELECT count(*) FROM models"), 1);
    char aside[4300];
    snprintf(aside, sizeof aside, "%s.corrupt", catpath);
    ck_assert_int_eq(access(aside, F_OK), -1);   /* upgraded, not moved aside */
    rm_tmpdir();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("catalog-served");
    TCase *tc = tcase_create("all");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, served_reads_every_fixture_byte_exact);
    tcase_add_test(tc, seek_walks_keys_in_order);
    tcase_add_test(tc, spilled_parse_reads_every_fixture_byte_exact);
    tcase_add_test(tc, threads_share_a_served_model);
    tcase_add_test(tc, model_dropped_under_an_open_checkpoint);
    tcase_add_test(tc, changed_checkpoint_catalogued_afresh);
    tcase_add_test(tc, records_stored_and_used_while_shards_unchanged);
    tcase_add_test(tc, format_2_catalog_upgraded);
    tcase_add_test(tc, records_stored_in_the_background);
    tcase_add_test(tc, damaged_chunk_row_falls_back_and_drops_the_model);
    tcase_add_test(tc, changed_under_an_open_checkpoint_is_estale);
    tcase_add_test(tc, damaged_row_failure_is_not_not_found);
    tcase_add_test(tc, metadata_rewritten_during_first_open);
#ifndef __SANITIZE_ADDRESS__
    tcase_add_test(tc, chunk_list_out_of_memory_is_no_damage);
#endif
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
