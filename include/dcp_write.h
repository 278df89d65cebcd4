/* libdcp writers: DCP checkpoints PyTorch can load, torch.save files,
 * safetensors files, conversions between the three, synthetic checkpoints,
 * and the layout of a checkpoint seen as one virtual safetensors file.
 *
 * Everything streams: tensor bytes pass through buffers of a few MiB, so
 * memory stays bounded by the number of keys and chunks, never by their
 * bytes. Outputs are complete or absent: DCP's .metadata is written last
 * (.metadata.tmp, then rename), converted files and folders are written under
 * a temporary name and renamed at the end. Errors as in dcp.h. */
#ifndef DCP_WRITE_H
#define DCP_WRITE_H

#include <signal.h>   /* sig_atomic_t */
#include <stddef.h>
#include <stdint.h>

#include "dcp.h"
#include "dcp_file.h"   /* dcp_format, dcp_open_file, dcp_st_view_*: read side, once declared here */

#ifdef __cplusplus
extern "C" {
#endif


/* Supplies bytes [off, off+len) of an item's byte image (a tensor chunk's
 * elements in C order, or a bytes item's stored torch.save blob). `tag` is
 * the caller's, passed through. Returns 0, or -1 with err filled. */
typedef int (*dcp_fill_fn)(void *ctx, uint64_t tag, uint64_t off, void *buf, size_t len, dcp_error *err);

/* A run of an item's bytes stored as is in an open file. */
typedef struct dcp_run {
    int fd;
    uint64_t offset;            /* in the file */
    uint64_t length;
    int has_crc;                /* the run is a whole zip record of the source, whose */
    uint32_t crc;               /* recorded CRC-32 is this */
} dcp_run;

/* Where bytes come from: fill, and optionally range, which answers 1 when
 * the first run->length bytes (1 <= length <= len) of [off, off+len) of item
 * `tag` lie as is in a file (the writer then copies them in the kernel with
 * copy_file_range when it needs no CRC, or the run's recorded CRC serves), 0
 * when not, -1 on error. */
typedef struct dcp_source {
    dcp_fill_fn fill;
    int (*range)(void *ctx, uint64_t tag, uint64_t off, uint64_t len, dcp_run *run, dcp_error *err);
    void *ctx;
} dcp_source;

/* ---------------------------------------------------------------- DCP writer */

/* Writes a checkpoint folder as torch 2.13's FileSystemWriter does
 * (single_file_per_rank=True, SerializationFormat.TORCH_SAVE): data of rank R
 * in __R_0.distcp, each tensor chunk and bytes item a standalone torch.save
 * archive, then a protocol-4 pickled .metadata (Metadata with
 * state_dict_metadata, planner_data, storage_data, storage_meta, version
 * "1.0.0"). torch.distributed.checkpoint.load reads the result. */
typedef struct dcp_ckpt_writer dcp_ckpt_writer;

/* One flag family for every writer (dcp_ckpt_options.flags,
 * dcp_write_torch_save, dcp_write_safetensors, dcp_convert_options.flags).
 * Each writer ignores the flags that mean nothing to it. */
enum {
    /* torch.save: split keys on '.' into nested dicts ("a.b" -> {"a": {"b": t}};
     * dcp_convert_files nests by the source's own paths instead, where known);
     * otherwise one flat dict, like torch.save(model.state_dict()). */
    DCP_WRITE_NESTED = 1u << 0,
    DCP_WRITE_NO_CRC = 1u << 1,     /* zip CRC-32s written as 0 (torch's save.compute_crc32 =
                                       False); torch.load does not check them */
    DCP_WRITE_NO_SYNC = 1u << 2,    /* no fsync: of the data files and .metadata (DCP,
                                       sync_files=False), before the final rename, nor of the folder */
    DCP_WRITE_NO_REPLACE = 1u << 3, /* single-file writers: fail with EEXIST rather than replace path */
    DCP_WRITE_MEGATRON_FOLD = 1u << 4, /* dcp_convert_files: a checkpoint folder is read with
                                       DCP_OPEN_MEGATRON_FOLD (Megatron-Core's reformulated
                                       tensors written in their original shapes) */
    DCP_WRITE_RANK = 1u << 5        /* dcp_convert_files (since 0.2): a rank-local checkpoint
                                       folder is read as rank dcp_convert_options.rank's view,
                                       its __R.metadata alone (DCP_OPEN_RANK) */
};

/* The DCP writer's flags of 0.1, kept as aliases of the one family. With
 * 0.1's headers DCP_CKPT_NO_SYNC was 1u << 0; programs built so call
 * dcp_ckpt_create@DCP_0.1, which still reads bit 0 as DCP_WRITE_NO_SYNC. */
#define DCP_CKPT_NO_SYNC DCP_WRITE_NO_SYNC
#define DCP_CKPT_NO_CRC DCP_WRITE_NO_CRC

typedef struct dcp_ckpt_options {
    size_t size;                   /* sizeof(dcp_ckpt_options): DCP_CKPT_OPTIONS_INIT (dcp.h, options) */
    unsigned flags;                /* DCP_WRITE_NO_SYNC, DCP_WRITE_NO_CRC (others ignored) */
    const char *checkpoint_id;     /* StorageMeta.checkpoint_id; NULL: the folder as given */
} dcp_ckpt_options;
#define DCP_CKPT_OPTIONS_INIT {.size = sizeof(dcp_ckpt_options)}

/* Create the folder. An existing folder must be empty (never a .metadata, a
 * rank-local checkpoint or any other file): data files are created with
 * O_EXCL, nothing is overwritten. opts may be NULL. */
int dcp_ckpt_create(const char *dir, const dcp_ckpt_options *opts, dcp_ckpt_writer **out, dcp_error *err);
/* Declare a tensor (before its chunks). */
int dcp_ckpt_add_tensor(dcp_ckpt_writer *w, const char *key, dcp_dtype dt, int ndim, const int64_t *shape,
                          dcp_error *err);
/* Write one chunk held by `rank`: sizes[d] elements from offsets[d] (ndim
 * values each; NULL for 0-d), its bytes from src (tag passed through). A chunk
 * whose (key, offsets) was written before is a replica: it is not written
 * again (*written = 0 when given), like PyTorch's save-plan deduplication. */
int dcp_ckpt_add_chunk(dcp_ckpt_writer *w, const char *key, int rank, const int64_t *offsets, const int64_t *sizes,
                         const dcp_source *src, uint64_t tag, int *written, dcp_error *err);
/* Write a bytes item: len bytes of a torch.save blob, copied verbatim. */
int dcp_ckpt_add_bytes(dcp_ckpt_writer *w, const char *key, int rank, uint64_t len, const dcp_source *src,
                       uint64_t tag, dcp_error *err);
/* One element of a key's path in the state dict before it was flattened:
 * a dict key (str, len bytes) or, when str is NULL, a list index or int
 * dict key (index). */
typedef struct dcp_path_part {
    const char *str;
    size_t len;
    int64_t index;
} dcp_path_part;
/* Record a declared key's path for Metadata.planner_data, which torch's
 * dcp_to_torch_save and _load_state_dict_from_keys use to rebuild the
 * nesting ({"a": {"b": [t]}} for ("a", "b", 0)). The parts joined with '.'
 * (ints in decimal) must give the key. A key without a path gets (key,): a
 * flat top-level key, as torch.save(model.state_dict()) holds it. */
int dcp_ckpt_set_path(dcp_ckpt_writer *w, const char *key, const dcp_path_part *parts, size_t n, dcp_error *err);
/* The paths a DCP folder's .metadata records (Metadata.planner_data, what
 * dcp_ckpt_set_path writes), read back from dir/.metadata without running
 * its pickle: what torch's _EmptyStateDictLoadPlanner rebuilds the nested
 * state dict from. Best effort: a folder without .metadata or planner_data
 * (rank-local __R.metadata files, a single file) gives an empty table, and a
 * key whose path holds other than str and int parts has none. -1 only on
 * out of memory. dcp_key_paths_get: key's path (*n parts, valid until
 * dcp_key_paths_free), or NULL when it has none. */
typedef struct dcp_key_paths dcp_key_paths;
int dcp_key_paths_read(const char *dir, dcp_key_paths **out, dcp_error *err);
const dcp_path_part *dcp_key_paths_get(const dcp_key_paths *kp, const char *key, size_t *n);
void dcp_key_paths_free(dcp_key_paths *kp);
/* Check that every tensor's chunks cover it (volumes add up, boxes inside),
 * fsync the data files, write .metadata.tmp and rename it to .metadata. */
int dcp_ckpt_finish(dcp_ckpt_writer *w, dcp_error *err);
/* Free (after finish, or to abandon: the folder is left without .metadata). */
void dcp_ckpt_free(dcp_ckpt_writer *w);
/* Bytes of tensor and bytes-item data written so far. */
uint64_t dcp_ckpt_bytes(const dcp_ckpt_writer *w);

/* ------------------------------------------------- single-file writers */

/* One item of a torch.save or safetensors file. */
typedef struct dcp_item {
    const char *key;
    dcp_kind kind;
    dcp_dtype dtype;            /* tensors */
    int ndim;
    const int64_t *shape;
    uint64_t nbytes;            /* tensor: numel * size; bytes item: blob length */
    uint64_t tag;               /* passed to fill */
} dcp_item;

#define DCP_WRITE_BYTES_MAX (1ull << 30)

/* A torch.save file torch.load(weights_only=True) accepts: a dict of tensors
 * (_rebuild_tensor_v2, or v3 for the dtypes that need UntypedStorage), one
 * storage per tensor, records as torch 2.13 writes them. A bytes item is
 * stored as a Python bytes object holding its torch.save blob (load it with
 * torch.load(io.BytesIO(value))); converting back to DCP restores it as the
 * same bytes item. Bytes items are pickled whole into data.pkl, which is
 * built in memory before any tensor data is written: their lengths may total
 * at most DCP_WRITE_BYTES_MAX (EFBIG naming the key that passes it, before
 * anything is read), and memory peaks near three times that total (the
 * blobs, their protocol-2 latin-1 text, up to twice as long). Written under a temporary name beside path
 * (".NAME.tmp-PID-N"), fsynced, renamed onto path and the folder fsynced
 * (no fsyncs with DCP_WRITE_NO_SYNC); on failure the temporary is removed
 * and path is untouched. archive_name is the zip's root folder (NULL: the
 * file name without its suffix, as torch.save names it). */
int dcp_write_torch_save(const char *path, const char *archive_name, const dcp_item *items, size_t n,
                         unsigned flags, const dcp_source *src, dcp_progress_fn progress, void *pctx,
                         dcp_error *err);

/* A safetensors file of the tensor items (bytes items are an error here:
 * callers filter them). Header {"__metadata__": {"format": "pt"}, ...},
 * padded with spaces to a multiple of 8, data in item order. Written
 * through a temporary name and renamed, as dcp_write_torch_save. */
int dcp_write_safetensors(const char *path, const dcp_item *items, size_t n, unsigned flags, const dcp_source *src,
                          dcp_progress_fn progress, void *pctx, dcp_error *err);

/* ---------------------------------------------------------------- convert */

/* Called once per item not converted, with its key: bytes items into
 * safetensors, dtypes safetensors lacks, values of a torch.save source that
 * are neither tensors nor plain data. */
typedef void (*dcp_skip_fn)(void *ctx, const char *key, const char *why);

typedef struct dcp_convert_options {
    size_t size;                /* sizeof(dcp_convert_options): DCP_CONVERT_OPTIONS_INIT */
    dcp_format from, to;        /* AUTO: from the path (dcp_format_guess) */
    const char *keys;           /* fnmatch pattern (or dotted prefix) selecting keys; NULL: all */
    uint64_t max_shard_size;    /* safetensors: split into shards past this many bytes; 0: one file */
    unsigned flags;             /* DCP_WRITE_* */
    dcp_progress_fn progress;
    void *progress_ctx;
    dcp_skip_fn skipped;
    void *skipped_ctx;
    /* Since 0.2 (appended). When set and *cancel becomes nonzero (a signal
     * handler sets it), the conversion stops at its next piece, removes what
     * it wrote and fails with ECANCELED. */
    volatile sig_atomic_t *cancel;
    unsigned rank;              /* since 0.2 (appended): with DCP_WRITE_RANK, the R of __R.metadata */
} dcp_convert_options;
#define DCP_CONVERT_OPTIONS_INIT {.size = sizeof(dcp_convert_options)}

/* Convert src to dst (which must not exist). dst appears only when complete. */
int dcp_convert_files(const char *src, const char *dst, const dcp_convert_options *opt, dcp_error *err);

/* ---------------------------------------------------------------- synth */

typedef enum dcp_shard {
    DCP_SHARD_ROWS = 0,         /* split dimension 0 over the ranks (torch.chunk) */
    DCP_SHARD_COLS,             /* split dimension 1 (dimension 0 for 1-d) */
    DCP_SHARD_BLOCKS,           /* a pr x pc grid over dimensions 0 and 1, pr*pc = ranks */
    DCP_SHARD_REPLICATED        /* every rank holds everything; written once */
} dcp_shard;

typedef struct dcp_synth_options {
    size_t size;                /* sizeof(dcp_synth_options): DCP_SYNTH_OPTIONS_INIT */
    uint64_t nkeys;
    int ndim;
    int64_t shape[8];
    dcp_dtype dtype;
    int ranks;
    dcp_shard shard;
    uint64_t seed;
    int chunks_per_key;         /* each rank's part split further along dim 0 (>= 1) */
    uint64_t bytes_items;       /* also write this many small bytes items */
    int crc;                    /* compute zip CRC-32s (default off: speed; torch.load ignores them) */
    dcp_progress_fn progress;
    void *progress_ctx;
    /* Since 0.2 (appended): as dcp_convert_options' cancel; the checkpoint
     * stops at its next key or piece, is removed and fails with ECANCELED. */
    volatile sig_atomic_t *cancel;
} dcp_synth_options;
#define DCP_SYNTH_OPTIONS_INIT {.size = sizeof(dcp_synth_options)}

/* The most chunks and bytes items a synthetic checkpoint may hold in all
 * (nkeys x the chunks of one key + bytes_items): the writer keeps a record
 * of each in memory until .metadata is written (some 250 to 500 bytes), and
 * each is a torch.save archive of some 1.5 KB in its data file, however
 * small the tensor. 2^24: past the 10 million chunks dcp is measured at. */
#define DCP_SYNTH_CHUNKS_MAX (1ull << 24)

/* Key i is "model.layers.<i>.weight"; its C-order bytes are what
 * dcp_synth_fill(seed, i, dtype, ...) gives (see dcp-synth(1) for the formula).
 * Bad options, and more than DCP_SYNTH_CHUNKS_MAX chunks, are EINVAL before
 * anything is written. On failure what it wrote is removed: dir itself when
 * it made the folder, else the files it created in it. */
int dcp_synth_checkpoint(const char *dir, const dcp_synth_options *opt, dcp_error *err);
/* Fill buf with bytes [off, off+len) of key i's global C-order image. */
void dcp_synth_fill(uint64_t seed, uint64_t key, dcp_dtype dt, uint64_t off, void *buf, size_t len);

/* "1048576", "64K", "256MiB", "2G" (binary), "5GB" (decimal, as Hugging
 * Face's max_shard_size). 0 with *out the size; -1 with err: EINVAL for a
 * malformed size or an unknown unit, ERANGE for one past 2^64 - 1, the
 * message naming the text (what, e.g. "--max-shard-size", prefixes it when
 * not NULL). Since 0.2. */
int dcp_parse_size_ex(const char *s, const char *what, uint64_t *out, dcp_error *err);
/* The same without the reason (0.1): 0, or -1 for a malformed size. */
int dcp_parse_size(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif /* DCP_WRITE_H */
