/* libdcp integrity: structural verification, content digests (XXH3-64 of each
 * blob's stored bytes) kept in a SQLite catalog, and checkpoint diffs. */
#ifndef DCP_INTEGRITY_H
#define DCP_INTEGRITY_H

#include <stdint.h>

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Called once per problem found; msg names the key, file and offset. */
typedef void (*dcp_problem_fn)(void *ctx, const char *msg);
/* Progress as bytes are hashed: dcp_progress_fn, from dcp.h; may be NULL. */

/* Structure: every tensor's chunks cover its global shape exactly once (no
 * gaps, no overlaps), every chunk's record lies inside its blob and shard
 * file, every shard file exists and is long enough. Problems go to fn; the
 * count to *nproblems. Returns -1 only when verification itself failed. */
int dcp_verify_structure(dcp_checkpoint *ck, dcp_problem_fn fn, void *ctx, uint64_t *nproblems,
                         dcp_error *err);

/* XXH3-64 of a blob's stored bytes, read in large sequential pieces. */
int dcp_blob_digest(dcp_checkpoint *ck, const dcp_blob *b, uint64_t *xxh3, dcp_error *err);

/* XXH3-128 of entry e's value, independent of how it is stored: a tensor's
 * global bytes in C order (as dcp cat writes them), a bytes item's bytes.
 * digest: the canonical (big-endian) 16 bytes, as XXH128_canonicalFromHash
 * gives and `dcp digest` prints in hex. Bounded memory (16 MiB pieces). */
int dcp_value_digest(dcp_checkpoint *ck, const dcp_entry *e, unsigned char digest[16], dcp_error *err);

/* dcp_value_digest of the value cast to dtype `as` first, as torch's
 * .to(as) does on the CPU, so that a bfloat16 export can be compared with a
 * float32 training checkpoint: each element of a floating tensor (float64,
 * float32, float16, bfloat16, float8_e4m3fn, float8_e5m2) is converted
 * through float32 and rounded to nearest even, subnormals kept (no flush),
 * overflow to infinity; NaN as PyTorch's x86 CPU kernels write it (bfloat16
 * 0xFFFF, float16 the sign, quiet bit and top payload bits), which a build
 * without AVX2 or a GPU may write otherwise. `as` is DCP_BFLOAT16,
 * DCP_FLOAT16, DCP_FLOAT32 or DCP_FLOAT64; DCP_DTYPE_INVALID, a tensor
 * already of dtype `as`, and tensors that are not floating (integers, bool,
 * complex, quantized) and bytes items hash their bytes unchanged
 * (*cast is then 0, else 1; cast may be NULL). Other floating dtypes
 * (float8 fnuz, e8m0, float4) fail with EINVAL. Bounded memory: pieces of
 * at most 16 MiB are read and cast. Since 0.2. */
int dcp_value_digest_as(dcp_checkpoint *ck, const dcp_entry *e, dcp_dtype as, unsigned char digest[16],
                        int *cast, dcp_error *err);

/* The catalog: a SQLite file outside every checkpoint folder, by default
 * $XDG_CACHE_HOME/dcpfs/catalog.sqlite (or ~/.cache/dcpfs/catalog.sqlite).
 * Records are tied to a checkpoint's identity: its metadata files' sizes,
 * mtimes and XXH3, and its shard files' sizes. A corrupt or foreign file is
 * moved aside and rebuilt, never trusted: opening checks the file's format
 * row (not a full integrity scan), SQLite reports damaged pages it meets
 * (SQLITE_CORRUPT moves the file aside), and stored models carry their own
 * checksum. Shared safely by processes (WAL, a 30 s busy timeout). */
typedef struct dcp_catalog dcp_catalog;

int dcp_catalog_open(const char *path, dcp_catalog **out, dcp_error *err);   /* path NULL: default */
/* -1 (EPERM) when the catalog file at path (NULL: default) would lie inside
 * ck's folder, which is never written to. Call before dcp_catalog_open when
 * a catalog is used for a given checkpoint; record and import refuse too. */
int dcp_catalog_check_location(const char *path, dcp_checkpoint *ck, dcp_error *err);
/* The same for a folder not opened yet (each checkpoint a command names before
 * it opens any with the catalog: opening B must not create the catalog inside
 * A; a dcpfs SOURCE folder of checkpoints). */
int dcp_catalog_check_folder(const char *path, const char *folder, dcp_error *err);
void dcp_catalog_close(dcp_catalog *cat);
const char *dcp_catalog_path(const dcp_catalog *cat);

/* The identity of an open checkpoint (32 hex digits), computed once. */
int dcp_checkpoint_identity(dcp_checkpoint *ck, char id[33], dcp_error *err);

/* Record the digest of every blob (chunks and bytes items). */
int dcp_catalog_record(dcp_catalog *cat, dcp_checkpoint *ck, dcp_progress_fn progress, void *ctx,
                       uint64_t *nblobs, dcp_error *err);
/* *unchanged 1 when every data file of ck has the size, mtime, ctime and
 * inode it had when dcp_catalog_record last recorded ck here, so its recorded
 * digests stand for its bytes now; 0 when any differs, nothing was recorded,
 * or the digests were imported since (dcp diff --content takes digests only
 * then). */
int dcp_catalog_unchanged(dcp_catalog *cat, dcp_checkpoint *ck, int *unchanged, dcp_error *err);
/* Look up a recorded digest: *found 0 when none is recorded for this identity. */
int dcp_catalog_digest(dcp_catalog *cat, dcp_checkpoint *ck, const dcp_blob *b, uint64_t *xxh3,
                       int *found, dcp_error *err);
/* Verify-on-read (dcpfs -o verify): re-hash blob b (of entry key) and compare
 * it with its recorded digest. Returns 1 when it matches, 0 when nothing is
 * recorded for it, -1 with err (EIO, naming file, key and offset) when its
 * bytes changed or cannot be read. Callers cache the answer per blob. */
int dcp_verify_blob(dcp_catalog *cat, dcp_checkpoint *ck, const char *key, const dcp_blob *b, dcp_error *err);
/* dcp_verify_blob under the error contract (since 0.2): 0 when the blob
 * matches its recorded digest; -1 with err: code DCP_ENOTFOUND when no
 * digest is recorded for it (nothing to compare: not a failure of the
 * bytes), EIO when its bytes changed, or the failure that kept it from being
 * compared. The message names the file, the key and the offset. */
int dcp_check_blob(dcp_catalog *cat, dcp_checkpoint *ck, const char *key, const dcp_blob *b, dcp_error *err);
/* Import digests from a sidecar file written by dcp_digests_export. */
int dcp_catalog_import(dcp_catalog *cat, dcp_checkpoint *ck, const char *sidecar, uint64_t *n,
                       dcp_error *err);
/* Write every recorded digest of ck as a sidecar text file (atomically). */
int dcp_digests_export(dcp_catalog *cat, dcp_checkpoint *ck, const char *path, dcp_error *err);

/* Re-hash every blob that has a recorded digest and report each mismatch to
 * fn. *checked counts blobs compared; *missing those with no record. */
int dcp_verify_digests(dcp_catalog *cat, dcp_checkpoint *ck, dcp_problem_fn fn, void *ctx,
                       dcp_progress_fn progress, void *pctx, uint64_t *checked, uint64_t *missing,
                       uint64_t *nproblems, dcp_error *err);

/* The CRC-32 of every record of every torch.save archive a chunk or bytes
 * item is stored as (torch's save.compute_crc32, on by default), checked
 * against its bytes, reading all of them; each that differs or cannot be
 * read is reported to fn. *checked: records compared; *nocrc: records
 * saved without a CRC-32 (0); *nproblems: reported. Blobs that are not
 * torch.save archives (safetensors; one that does not parse, which
 * dcp_verify_structure reports) are skipped. Reads only. Since DCP_0.2. */
int dcp_verify_crc(dcp_checkpoint *ck, dcp_problem_fn fn, void *ctx, dcp_progress_fn progress, void *pctx,
                   uint64_t *checked, uint64_t *nocrc, uint64_t *nproblems, dcp_error *err);

/* Megatron-Core's integrity.json (dist_checkpointing.save(...,
 * verify_integrity=True), 0.18 and later): {"algorithm": "sha256", "files":
 * {NAME: HEX, ...}}, the SHA-256 of every regular file of the folder but
 * itself. Re-hashes every listed file (several at once, dcp_read_threads())
 * and reports to problem each that differs, is missing or cannot be read;
 * to note (may be NULL) each regular file of the folder it does not list.
 * A data file of ck that cannot be opened (missing, unreadable, not a
 * regular file) is dcp_verify_structure's to name, with the reason: it is
 * counted here but not reported again (one line per damaged file).
 * *nfiles: the files it lists; *nproblems: the files that differ, are
 * missing or cannot be read.
 * Returns 1 when checked, 0 when the folder has no integrity.json (or ck is
 * a single file), -1 with err naming the manifest and why when it cannot be
 * used (not JSON, another algorithm, a name that is not a plain file name of
 * the folder, a digest that is not 64 lowercase hex digits, larger than
 * 1 KiB for each file of the folder) or hashing could not run. Reads only. Since DCP_0.2. */
int dcp_verify_manifest(dcp_checkpoint *ck, dcp_problem_fn problem, dcp_problem_fn note, void *ctx,
                        dcp_progress_fn progress, void *pctx, uint64_t *nfiles, uint64_t *nproblems,
                        dcp_error *err);
/* The same for a folder that is not opened as a checkpoint: one whose
 * .metadata is missing or cannot be parsed, where the manifest can still
 * name every damaged file (.metadata itself included), each reported to
 * problem (there is no structure check to name any). -1 with err also
 * when the folder cannot be opened. Reads only. Since DCP_0.2. */
int dcp_verify_manifest_folder(const char *folder, dcp_problem_fn problem, dcp_problem_fn note, void *ctx,
                               dcp_progress_fn progress, void *pctx, uint64_t *nfiles, uint64_t *nproblems,
                               dcp_error *err);

#ifdef __cplusplus
}
#endif
#endif
