/* Shared by the integrity sources (catalog, digests, model cache). Not installed. */
#ifndef DCP_INTEGRITY_INTERNAL_H
#define DCP_INTEGRITY_INTERNAL_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "dcp_integrity.h"
#include "internal.h"

/* XXH3 through xxhash's runtime dispatch where the library has it (x86:
 * AVX2 or AVX-512 when the CPU has them, about 3x the SSE2 default): the
 * same hashes, faster. */
#include <xxhash.h>
#if (defined(__x86_64__) || defined(__i386__)) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif
#endif

#define DCPI_PAST_END (-1)   /* a blobref's rerr: not an errno, so a read error (EIO) is told apart */
#define DCPI_CATALOG_BUSY_MS 30000   /* how long a catalog call waits for another process */

/* The catalog's connection, and what to do with a failed SQLite call: a
 * corrupt or foreign file (SQLITE_CORRUPT, SQLITE_NOTADB) is moved aside so
 * that the next open starts afresh. Returns -1 with err filled. */
sqlite3 *dcpi_catalog_db(dcp_catalog *cat);
int dcpi_catalog_fail(dcp_catalog *cat, int rc, dcp_error *err, const char *what);

/* ------------------------------------------------------------ stored rows */

/* The catalog's rows are LEB128 varints (most numbers of a model take 1-3
 * bytes) closed by an XXH3 of the payload (rowcodec.c). Writers grow a
 * buffer (oom latches); readers latch bad on any overrun. */
typedef struct dcpi_wbuf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} dcpi_wbuf;

typedef struct dcpi_rbuf {
    const unsigned char *p, *end;
    int bad;
} dcpi_rbuf;

void dcpi_put(dcpi_wbuf *w, const void *src, size_t n);
void dcpi_put_u64(dcpi_wbuf *w, uint64_t v);
void dcpi_put_sum(dcpi_wbuf *w, uint64_t seed);   /* the XXH3 of everything so far */
const void *dcpi_take(dcpi_rbuf *r, size_t n);
uint64_t dcpi_get_u64(dcpi_rbuf *r);
/* A checksummed payload: 1 when the sum matches, with r set over the payload. */
int dcpi_sum_ok(const void *data, size_t len, uint64_t seed, dcpi_rbuf *r);

/* ------------------------------------------------------------ served models */

/* The catalog rows behind a model served lazily (modelcache.c), and the
 * chunk records cached with them (recordcache.c). */
#define DCPI_SEEK_ROWS 16
struct dcpi_lazy {
    dcp_catalog *cat;
    sqlite3_int64 model;       /* models.id (AUTOINCREMENT: never reused) */
    uint64_t nchunks;          /* every entry's, from the model row: bounds each one's */
    pthread_mutex_t lock;      /* the statements, the arena, filling entries */
    sqlite3_stmt *all, *exact, *seek, *chunks, *alive;
    dcpi_arena arena;          /* keys and shapes of the entries filled so far */
    /* The rows the last seek statement read (DCPI_SEEK_ROWS, consecutive in
     * key order from seek_from on): a later seek inside them needs no
     * statement (a listing seeks child after child; each statement costs
     * SQLite's locking and checks, most of a lookup's time). */
    size_t seek_rows[DCPI_SEEK_ROWS];
    size_t nseek_rows;
    char *seek_from;
    int all_done;
    dcp_checkpoint *parsed;    /* the catalog failed: the rest comes from a parse */
    dcpi_parse_fn parse;       /* how to parse (dcp_open without the catalog) */
    /* recordcache.c */
    sqlite3_stmt *records;     /* an entry's cached records */
    struct dcpi_file_stamp *stamps;   /* nfiles, each taken once (under lock) */
    pthread_mutex_t pending_lock;     /* a leaf lock */
    pthread_cond_t pending_cond;      /* a batch is ready, or the flusher is to stop */
    struct dcpi_pending *pending;     /* records to store, newest first */
    size_t npending;
    pthread_t flusher;                /* stores full batches on a connection of its own */
    int flusher_state;                /* 0: not started, 1: running, 2: stopping */
};

/* recordcache.c (keeping and storing: internal.h): a set read from the
 * catalog gets the records stored for it when its shard files are unchanged
 * (under lz->lock). */
void dcpi_records_load(dcp_checkpoint *ck, dcpi_chunkset *s);
int dcpi_records_prepare(dcp_checkpoint *ck);
void dcpi_records_free(struct dcpi_lazy *lz);
/* Records of a served model: keep those a set located (when the set is
 * dropped, outside ck->lock: a full batch is stored by a background
 * thread); store all that is kept (dcp_close). */
void dcpi_records_keep(dcp_checkpoint *ck, const dcpi_chunkset *s);
void dcpi_records_flush(dcp_checkpoint *ck);

/* One distinct stored byte range of a checkpoint (a chunk's or a bytes
 * item's blob) and what hashing it gave. */
typedef struct dcpi_blobref {
    uint32_t file;
    uint64_t offset, length;
    size_t entry;          /* the first entry whose blob this is (for messages) */
    int want;              /* hash it */
    int rerr;              /* errno when it could not be read, DCPI_PAST_END when it ends past
                            * the end of its file (0: xxh3 is valid) */
    uint64_t xxh3;
    uint64_t recorded;     /* verify: the recorded digest */
} dcpi_blobref;

/* Every blob of ck, one per (file, offset), sorted by file and offset. */
int dcpi_collect_blobs(dcp_checkpoint *ck, dcpi_blobref **out, size_t *n, dcp_error *err);
/* Hash every ref with want set, file by file in offset order with large
 * sequential reads overlapped with the hashing (hashing.c). A blob that
 * cannot be read gets rerr, not a failure; -1 only when hashing itself
 * cannot proceed (memory). */
int dcpi_hash_blobs(dcp_checkpoint *ck, dcpi_blobref *refs, size_t n, dcp_progress_fn progress, void *pctx,
                    dcp_error *err);

/* ------------------------------------------------------------ SHA-256 (sha256.c) */

#define DCPI_SHA256_LEN 32
/* The SHA-256 of len bytes: 0, or -1 when the library fails. */
int dcpi_sha256_mem(const void *data, size_t len, unsigned char out[DCPI_SHA256_LEN]);
/* The SHA-256 of fd's bytes from offset 0 to its end, read cap bytes at a
 * time into buf (dcpi_pread_exact); step(ctx, n), when given, after each
 * read. *bytes: how many were hashed. Returns 0 or an errno. */
int dcpi_sha256_fd(int fd, void *buf, size_t cap, unsigned char out[DCPI_SHA256_LEN], uint64_t *bytes,
                   void (*step)(void *ctx, size_t n), void *ctx);

#endif
