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

/* The catalog's connection, and what to do with a failed SQLite call: a
 * corrupt or foreign file (SQLITE_CORRUPT, SQLITE_NOTADB) is moved aside so
 * that the next open starts afresh. Returns -1 with err filled. */
sqlite3 *dcpi_catalog_db(dcp_catalog *cat);
int dcpi_catalog_fail(dcp_catalog *cat, int rc, dcp_error *err, const char *what);

/* 1 when the file at path (existing or not) would be inside ck's folder,
 * which nothing may write into. */
int dcpi_path_inside(const char *path, dcp_checkpoint *ck);

/* One distinct stored byte range of a checkpoint (a chunk's or a bytes
 * item's blob) and what hashing it gave. */
typedef struct dcpi_blobref {
    uint32_t file;
    uint64_t offset, length;
    size_t entry;          /* the first entry whose blob this is (for messages) */
    int want;              /* hash it */
    int rerr;              /* errno when it could not be read (0: xxh3 is valid) */
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

#endif
