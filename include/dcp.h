/* libdcp: read PyTorch Distributed Checkpoints (DCP) without Python.
 *
 * The public API. Every function that can fail returns 0 on success and -1 on
 * failure (or a pointer, NULL on failure), filling a caller-provided
 * dcp_error with an errno-like code and a message that names the file, the
 * key and the reason. A lookup that finds nothing (dcp_find_entry,
 * dcp_get_entry, dcp_check_blob) is -1 with code DCP_ENOTFOUND, which no
 * failure has. Nothing in libdcp calls exit() or abort(), and nothing here
 * knows of FUSE, MPI or CUDA. man libdcp(3), RETURN VALUE and ERRORS.
 *
 * Thread safety: a dcp_checkpoint may be shared by any number of threads once
 * opened; planning and reading are thread-safe. Plans are owned by one thread.
 */
#ifndef DCP_H
#define DCP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- version */

/* The version of these headers (configure.ac's AC_INIT version; the test
 * tests/abi-symbols.sh checks that they agree). DCP_VERSION_NUMBER orders
 * versions: 10000 * major + 100 * minor + patch (0.1.0 is 100). */
#define DCP_VERSION_MAJOR 0
#define DCP_VERSION_MINOR 2
#define DCP_VERSION_PATCH 0
#define DCP_VERSION_NUMBER (DCP_VERSION_MAJOR * 10000 + DCP_VERSION_MINOR * 100 + DCP_VERSION_PATCH)
#define DCP_VERSION_STR_(x) #x
#define DCP_VERSION_XSTR_(x) DCP_VERSION_STR_(x)
/* "0.2.0", made from the three numbers. */
#define DCP_VERSION_STRING \
    DCP_VERSION_XSTR_(DCP_VERSION_MAJOR) "." DCP_VERSION_XSTR_(DCP_VERSION_MINOR) "." \
    DCP_VERSION_XSTR_(DCP_VERSION_PATCH)

/* DCP_VERSION_NUMBER of the libdcp this program runs with, which may be newer
 * than the headers it was compiled with: a program that needs a call added
 * in 0.2.0 checks dcp_version_number() >= 200. Never fails. */
unsigned dcp_version_number(void);
/* The same as a string, "0.2.0": DCP_VERSION_STRING of the running libdcp (for
 * messages and bug reports). Never fails. Since DCP_0.2. */
const char *dcp_version(void);

/* ---------------------------------------------------------------- errors */

#define DCP_ERRMSG_MAX 1024

typedef struct dcp_error {
    int code;                   /* errno value: ENOENT, EIO, EINVAL, ENOMEM, ...; or DCP_ENOTFOUND */
    char msg[DCP_ERRMSG_MAX];   /* "<file>: <key>: <reason>" */
} dcp_error;

/* err->code of a lookup that found nothing: no such key, no entry at that
 * index, no digest recorded. Outside errno's range (Linux's end below 200),
 * so that "not there" never reads as a failure such as ENOENT for a missing
 * data file, nor the other way round. Since 0.2 (DCP_0.2 calls). */
#define DCP_ENOTFOUND 0x10000

/* ---------------------------------------------------------------- options */

/* Options structs that can grow. Each one (dcp_open_options here,
 * dcp_ckpt_options, dcp_convert_options and dcp_synth_options in
 * dcp_write.h, dcp_export_options, dcp_gplan_opts, dcp_load_options) starts
 * with `size_t size`, the sizeof the caller was compiled with, which its
 * initialiser macro sets:
 *
 *     dcp_open_options o = DCP_OPEN_OPTIONS_INIT;
 *     o.flags = DCP_OPEN_CATALOG;
 *
 * Fields are only ever added at the end. The library reads the caller's
 * first `size` bytes and gives each field past them its default (zero), so
 * a program built against older headers works with a newer library. A size
 * past the end the library knows (a program built against newer headers) is
 * accepted when the bytes it does not know are all zero, else E2BIG (a field
 * it would ignore was set); a size below the first sized layout (0: the
 * struct was not made by its initialiser) is EINVAL. Since 0.2: programs
 * built against 0.1's headers, whose structs had no size, are bound to the
 * DCP_0.1 versions of the calls (symbol versioning), which take the old
 * layouts and old flag values. man libdcp(3), OPTIONS. */

/* Called as bytes are processed (for progress bars); may be NULL. Used by
 * dcp_write.h and dcp_integrity.h. */
typedef void (*dcp_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* The key selection of dcp ls/convert --keys and dcpload --keys: 1 when key
 * matches the fnmatch(3) pattern (flags 0: '*' crosses dots), or, for a
 * pattern without wildcards ('*', '?', '[', '\\'), equals it or lies under it
 * as a dotted prefix ("model" selects "model.layer.weight", not
 * "modelx.w"). A NULL pattern matches every key. */
int dcp_key_matches(const char *pattern, const char *key);

/* Keys are the bytes the checkpoint's pickle holds, UTF-8 as Python writes
 * it, but a lone surrogate (U+D800..DFFF, pickled as three bytes) and, in a
 * hostile checkpoint, bytes that are no UTF-8 at all can occur.
 * dcp_key_utf8: 1 when key is strict UTF-8 (what JSON text, safetensors and
 * Hugging Face names need), else 0. dcp_key_json: key as a quoted JSON
 * string (malloc'd; NULL when out of memory): a lone surrogate as its \uXXXX
 * escape, as Python's json.dumps writes the str torch loads; a byte that
 * starts no UTF-8 sequence as \udc80..\udcff, Python's "surrogateescape"
 * form. Since DCP_0.2. */
int dcp_key_utf8(const char *key);
char *dcp_key_json(const char *key);
/* key for a line of text output or a log: control characters and bytes that
 * are not strict UTF-8 written as \n, \t, \r or \xHH (a newline cannot forge
 * a line, an ESC cannot reach a terminal), the rest as is. As snprintf: at
 * most cap bytes with the NUL into out, and the length the whole text needs
 * is returned. Since DCP_0.2. */
size_t dcp_key_text(const char *key, char *out, size_t cap);

/* ---------------------------------------------------------------- dtypes */

typedef enum dcp_dtype {
    DCP_DTYPE_INVALID = 0,
    DCP_FLOAT64, DCP_FLOAT32, DCP_FLOAT16, DCP_BFLOAT16,
    DCP_COMPLEX128, DCP_COMPLEX64, DCP_COMPLEX32,
    DCP_INT64, DCP_INT32, DCP_INT16, DCP_INT8,
    DCP_UINT64, DCP_UINT32, DCP_UINT16, DCP_UINT8,
    DCP_BOOL,
    DCP_FLOAT8_E4M3FN, DCP_FLOAT8_E5M2, DCP_FLOAT8_E4M3FNUZ, DCP_FLOAT8_E5M2FNUZ,
    DCP_FLOAT8_E8M0FNU, DCP_FLOAT4_E2M1FN_X2,
    DCP_QINT8, DCP_QUINT8, DCP_QINT32, DCP_QUINT4X2, DCP_QUINT2X4,
    DCP_BITS8, DCP_BITS16, DCP_BITS1X8, DCP_BITS2X4, DCP_BITS4X2,
    DCP_DTYPE_COUNT
} dcp_dtype;

/* The torch name ("float32", "bfloat16"), or NULL for an invalid dtype. */
const char *dcp_dtype_name(dcp_dtype dt);
/* Bytes per element (container bytes for packed types); 0 if invalid. */
size_t dcp_dtype_size(dcp_dtype dt);
/* Parse a torch name ("float32"; a leading "torch." is accepted). */
dcp_dtype dcp_dtype_from_name(const char *name);
/* torch.<X>Storage class name ("FloatStorage") to dtype, as torch.save writes it. */
dcp_dtype dcp_dtype_from_storage(const char *storage_class);
/* The typed storage class torch.save uses for dt, or NULL when dt needs
 * UntypedStorage and _rebuild_tensor_v3 (float8, uint16/32/64, ...). */
const char *dcp_dtype_storage(dcp_dtype dt);
/* safetensors dtype string ("F32", "BF16"), or NULL when safetensors has none. */
const char *dcp_dtype_safetensors(dcp_dtype dt);
dcp_dtype dcp_dtype_from_safetensors(const char *name);
/* numpy array-protocol descr ("<f4", "|b1"), or NULL when numpy has none
 * (bfloat16, float8, complex32, quantized and bit types). */
const char *dcp_dtype_numpy(dcp_dtype dt);
/* Size of one real component for byte swapping (8 for complex128, 4 for float32). */
size_t dcp_dtype_swap_unit(dcp_dtype dt);

/* ---------------------------------------------------------------- model */

typedef enum dcp_kind { DCP_KIND_TENSOR = 1, DCP_KIND_BYTES = 2 } dcp_kind;

/* Stream transforms a blob may carry: zstd (_StorageInfo.transform_descriptors);
 * latin-1 text, as torch.save (pickle protocol 2) holds a bytes value.
 * DCP_TRANSFORM_MEMORY (since DCP_0.2): the bytes lie in no file; the open
 * checkpoint holds them (a plain value of a torch.save file, pickled as a
 * DCP bytes item stores one), offset is no file offset, and they are read
 * only through the plan (dcp_op_fetch, dcp_plan_execute, dcp_read_*). */
enum { DCP_TRANSFORM_ZSTD = 1u << 0, DCP_TRANSFORM_LATIN1 = 1u << 1, DCP_TRANSFORM_MEMORY = 1u << 2 };

/* One _StorageInfo: a byte range of a data file. */
typedef struct dcp_blob {
    uint32_t file;         /* index into the checkpoint's file table */
    uint32_t transforms;   /* DCP_TRANSFORM_* */
    uint64_t offset;       /* absolute offset in the file */
    uint64_t length;       /* bytes */
} dcp_blob;

/* One stored box of a global tensor. */
typedef struct dcp_chunk {
    const int64_t *offsets;    /* ndim values */
    const int64_t *sizes;      /* ndim values */
    dcp_blob blob;
    int has_blob;              /* 0 when storage_data has no entry for it */
} dcp_chunk;

/* An entry's header. Its chunks are not part of it: a model served by the
 * catalog keeps them there, so they are fetched with dcp_entry_chunks. */
typedef struct dcp_entry {
    const char *key;           /* the flattened state-dict key (non-str keys in decimal) */
    dcp_kind kind;
    dcp_dtype dtype;           /* tensors */
    int ndim;                  /* tensors; 0 for a 0-d tensor */
    const int64_t *shape;      /* ndim values */
    size_t nchunks;            /* tensors: how many chunks dcp_entry_chunks gives */
    dcp_blob blob;             /* bytes items */
    int has_blob;
} dcp_entry;

/* Where a tensor chunk's elements are, found by the record locator. */
enum {
    DCP_RECORD_BIG_ENDIAN = 1u << 0,   /* archive/byteorder says "big" */
    DCP_RECORD_CONJ = 1u << 1,         /* conj bit set: conjugate on read */
    DCP_RECORD_NEG = 1u << 2,          /* neg bit set: negate on read */
    DCP_RECORD_DECODED = 1u << 3       /* data_offset is inside the decoded (zstd) blob */
};

typedef struct dcp_record {
    uint64_t data_offset;      /* absolute file offset of storage element 0
                                  (offset in the decoded blob with DCP_RECORD_DECODED) */
    uint64_t data_length;      /* bytes of the storage record */
    int64_t storage_offset;    /* elements */
    const int64_t *stride;     /* ndim values, in elements */
    dcp_dtype dtype;           /* the stored dtype (trusted over metadata) */
    uint32_t flags;            /* DCP_RECORD_* */
} dcp_record;

/* What kind of checkpoint was recognised, from its content. */
typedef struct dcp_info {
    const char *generation;     /* e.g. "torch 1.13 (torch.distributed._shard.checkpoint)" */
    const char *serialization;  /* "torch_save", "safetensors", "hf_safetensors" */
    const char *layout;         /* "global .metadata", "rank-local __R.metadata", "huggingface",
                                   "per-rank torch.save files" (torch-checkpointing, verl) */
    const char *version;        /* Metadata.version, or NULL */
    const char *checkpoint_id;  /* StorageMeta.checkpoint_id, or NULL */
    const char *save_id;        /* StorageMeta.save_id, or NULL */
    int has_planner_data;
    int megatron;               /* metadata.json names a Megatron-Core backend */
    uint64_t metadata_bytes;    /* size of the metadata file(s) */
    /* Since 0.2 (appended: the struct is the library's): Megatron-Core
     * tensors stored reformulated, i.e. the keys whose original shape the
     * .metadata's mcore_data names and whose stored shape is its
     * [F_0..F_{n-1}, P] form; and of those, how many this open shows in the
     * original shape (DCP_OPEN_MEGATRON_FOLD; 0 without it, and fewer where
     * an entry's chunks are not one block's range each). */
    size_t megatron_reformulated;
    size_t megatron_folded;
} dcp_info;

typedef struct dcp_checkpoint dcp_checkpoint;

/* Open flags. */
enum {
    DCP_OPEN_DEFAULT = 0,
    /* Use the catalog (dcp_integrity.h): a checkpoint whose .metadata was
     * parsed before is served from the catalog instead of re-parsed: the
     * open reads one small record, and entries and chunks are read as they
     * are used. A first open parses, stores what it parsed, and is then
     * served from the catalog too (the parse's memory is freed). Trouble at
     * open falls back to parsing; the catalog is never trusted over the
     * checkpoint (a changed .metadata or shard size means parse again). */
    DCP_OPEN_CATALOG = 1u << 0,
    /* Show Megatron-Core's reformulated tensors in their original shapes.
     * Its distributed optimizer's states (flattened ranges of tensor-parallel
     * blocks) are stored as [X/x, Y/y, x*y] for a tensor [X, Y] split into
     * [x, y] blocks, with [X, Y] in the .metadata's mcore_data; PyTorch's
     * own load, and dcp_open without this flag, give the stored shape. With
     * it those entries have the original shape and chunks in it (boxes of
     * the original, each one run of a stored chunk's elements), so every
     * reader gives Megatron-Core's own view. The .metadata is parsed: the
     * catalog neither serves nor stores such a model (DCP_OPEN_CATALOG is
     * ignored). An entry whose stored chunks are not what Megatron-Core
     * writes keeps its stored shape; other checkpoints are not changed. */
    DCP_OPEN_MEGATRON_FOLD = 1u << 1,
    /* One rank's view of a rank-local checkpoint (a save with
     * use_collectives=False: one __R.metadata per rank, no .metadata): only
     * the folder's __R.metadata for R = dcp_open_options.rank (decimal, as
     * torch names it) is read, so the model holds that rank's items and
     * names only the shard files it lists. This is what torch's dcp.load
     * reads on rank R (FileSystemReader.read_metadata(rank=R)), where ranks
     * that saved other values under one key each get their own. Without the
     * flag dcp_open merges every rank's file (see dcp_entry_replicated). The
     * file is read whether or not the folder also holds a .metadata; no
     * __R.metadata is ENOENT naming it. The catalog is not used
     * (DCP_OPEN_CATALOG is ignored). Since DCP_0.2 (dcp_open_ex only). */
    DCP_OPEN_RANK = 1u << 2
};

typedef struct dcp_open_options {
    size_t size;               /* sizeof(dcp_open_options): set by DCP_OPEN_OPTIONS_INIT */
    unsigned flags;            /* DCP_OPEN_* */
    const char *catalog;       /* catalog file; NULL: $XDG_CACHE_HOME/dcpfs/catalog.sqlite */
    /* Appended in 0.2 (a struct of the first sized layout, without it, reads as 0): */
    unsigned rank;             /* with DCP_OPEN_RANK: the rank whose __R.metadata is read */
} dcp_open_options;
#define DCP_OPEN_OPTIONS_INIT {.size = sizeof(dcp_open_options)}

/* Open the checkpoint folder at path: a global .metadata, rank-local
 * __R.metadata files, a Hugging Face safetensors layout, or per-rank
 * torch.save files of DTensors (torch-checkpointing, verl). The folder is
 * never written to. */
int dcp_open(const char *path, unsigned flags, dcp_checkpoint **out, dcp_error *err);
int dcp_open_ex(const char *path, const dcp_open_options *opts, dcp_checkpoint **out, dcp_error *err);
/* 1 when name (a file name, without folder) is one of the per-rank
 * torch.save files dcp_open reads a folder of as one checkpoint:
 * torch-checkpointing's <item>_<rank>.pt, verl's
 * <item>_world_size_<W>_rank_<R>.pt (rank and W decimal, no leading zeros);
 * 0 otherwise. For front ends that tell a checkpoint folder by its names.
 * Since DCP_0.2. */
int dcp_is_rank_file(const char *name);
/* 1 when path names a file of a checkpoint folder given instead of the
 * folder: its last component is .metadata, .metadata.tmp, __R.metadata, a
 * .distcp shard, Megatron-Core's metadata.json or
 * model.safetensors.index.json; 0 otherwise (names only: nothing is
 * opened). The folder is the first *folder_len bytes of *folder ("." for a
 * bare name, "/" for "/.metadata"), set either way where the pointers are
 * given, for a message "open the folder %.*s". For front ends that name the
 * folder to a user who gave one of its files. Since DCP_0.2. */
int dcp_is_part_of_checkpoint(const char *path, const char **folder, int *folder_len);
/* What a folder holds, told from its file names alone (nothing is opened
 * but the folder): a checkpoint, a save that did not finish, or neither.
 * dcp_open judges by content: on a folder with shard files or in-flight
 * names but no .metadata (nor __R.metadata) it fails with ENOENT and
 * "PATH: a partial checkpoint: REASON", the code it gives a folder that is
 * not a checkpoint; dcp_probe_folder is the documented way to tell the two
 * apart, and to find the partial kinds dcp_open would read (a Megatron folder
 * without metadata.json, a staging folder). The dcp command refuses every
 * partial kind (exit 3); dcpfs lists them under .partial/. Since 0.2. */
typedef enum dcp_folder_kind {
    DCP_FOLDER_NOT_CHECKPOINT = 0,   /* no checkpoint files at all */
    DCP_FOLDER_CHECKPOINT = 1,       /* complete, as far as its names tell */
    DCP_FOLDER_PARTIAL = 2           /* a save that did not finish: shard files
                                      * without .metadata; a .metadata.tmp or
                                      * __R.metadata.tmp (torch's in-flight
                                      * names); a Megatron-Core torch_dist
                                      * folder (common.pt) without
                                      * metadata.json;
                                      * model-I-of-N.safetensors shards without
                                      * model.safetensors.index.json (written
                                      * last) or fewer than N of them;
                                      * checkpoint files in a folder named
                                      * tmp-*, tmp_* or *.tmp (a staged save
                                      * not renamed yet) */
} dcp_folder_kind;

typedef struct dcp_folder_probe {
    dcp_folder_kind kind;
    unsigned nshards;                /* .distcp and .safetensors files in the folder */
    char reason[256];                /* PARTIAL, NOT_CHECKPOINT: why, e.g. "4 shard files,
                                      * no .metadata (the save did not finish)"; "" else */
} dcp_folder_probe;

/* Probe the folder at path. 0 with *out filled; -1 with err (ENOENT,
 * ENOTDIR, EACCES, ...) when it cannot be listed. */
int dcp_probe_folder(const char *path, dcp_folder_probe *out, dcp_error *err);

/* Where the model came from: 1 when this open was served by the catalog. */
int dcp_from_catalog(const dcp_checkpoint *ck);
void dcp_close(dcp_checkpoint *ck);

const char *dcp_path(const dcp_checkpoint *ck);
const dcp_info *dcp_get_info(const dcp_checkpoint *ck);
size_t dcp_num_entries(const dcp_checkpoint *ck);

/* Entries. A model served by the catalog (dcp_from_catalog) holds only the
 * entries asked for: they are read from the catalog on first use and kept
 * until dcp_close, as a parsed model's are, so every dcp_entry pointer stays
 * valid until dcp_close. dcp_entry_at(ck, i) (metadata order) reads every
 * entry's header at its first call; dcp_find and dcp_seek read one. If the
 * catalog fails meanwhile (a damaged row, a model removed by another
 * process), the metadata is parsed and the rest served from the parse. They
 * return NULL when there is no such entry, and also when neither can answer
 * (the checkpoint changed since it was opened: dcp_seek tells the two apart). */
const dcp_entry *dcp_entry_at(const dcp_checkpoint *ck, size_t i);
const dcp_entry *dcp_find(const dcp_checkpoint *ck, const char *key);
/* The same lookups under the error contract (since 0.2): 0 with *out the
 * entry; -1 with *out NULL and err, whose code is DCP_ENOTFOUND when there is
 * no such key (no entry i: i >= dcp_num_entries), else the failure's (ESTALE:
 * the checkpoint changed since it was opened; EIO, ENOMEM, ...). Either way
 * the message names the checkpoint and the key (or index). */
int dcp_find_entry(const dcp_checkpoint *ck, const char *key, const dcp_entry **out, dcp_error *err);
int dcp_get_entry(const dcp_checkpoint *ck, size_t i, const dcp_entry **out, dcp_error *err);
/* A rank-local checkpoint opened whole (its __R.metadata files merged, the
 * default): 1 when e's item (a bytes item) or one of its boxes is listed by
 * more than one rank's file. The merged view reads such a box from the
 * lowest rank's shard, whereas torch's dcp.load gives each rank its own
 * file's, which may hold other values (ranks that saved a per-rank value
 * under one key): DCP_OPEN_RANK opens one rank's view. 0 for every other
 * entry, for a rank's view and for every other kind of checkpoint. Since
 * DCP_0.2. */
int dcp_entry_replicated(const dcp_checkpoint *ck, const dcp_entry *e);
/* Keys in byte (strcmp) order, for listings by key prefix that need not hold
 * every key: *out is the entry with the smallest key >= from, or NULL when
 * there is none. The key right after k is the one >= k followed by "\x01". A
 * parsed model sorts its keys once, at the first call. -1 with err when
 * neither the catalog nor a parse can answer (ESTALE: the checkpoint changed). */
int dcp_seek(dcp_checkpoint *ck, const char *from, const dcp_entry **out, dcp_error *err);

/* The chunks of tensor e: e->nchunks boxes in metadata order in *out (NULL
 * for none). A model served by the catalog reads them from it on demand and
 * keeps the chunks of recently used entries within a memory budget; *out,
 * and the records dcp_chunk_record gives for e, stay valid until the
 * matching dcp_release_chunks(ck, e). Calls pair up, may nest and may come
 * from any thread. A parsed model's chunks live until dcp_close. -1 with err
 * as for dcp_seek. */
int dcp_entry_chunks(dcp_checkpoint *ck, const dcp_entry *e, const dcp_chunk **out, dcp_error *err);
void dcp_release_chunks(dcp_checkpoint *ck, const dcp_entry *e);

size_t dcp_num_files(const dcp_checkpoint *ck);
const char *dcp_file_name(const dcp_checkpoint *ck, uint32_t file);  /* relative path */

/* numel of a tensor (1 for 0-d); 0 for bytes items. */
uint64_t dcp_entry_numel(const dcp_entry *e);
/* Bytes a reader returns for the entry: numel*size for tensors, the stored
 * (decoded) byte count for bytes items. -1 with err for a zstd bytes item
 * whose decoded size cannot be known without reading it. */
int dcp_entry_nbytes(dcp_checkpoint *ck, const dcp_entry *e, uint64_t *out, dcp_error *err);

/* Locate chunk i of tensor e: parse the blob's zip and data.pkl (once; the
 * result is cached with the entry's chunks and thread-safe). The caller holds
 * e's chunks (dcp_entry_chunks); *out stays valid as long as it does. */
int dcp_chunk_record(dcp_checkpoint *ck, const dcp_entry *e, size_t i,
                     const dcp_record **out, dcp_error *err);

/* ---------------------------------------------------------------- planner */

/* One read: a contiguous byte range of a data file, placed in the region
 * buffer either contiguously (dest_stride == elem_size) or one element every
 * dest_stride bytes (a stored chunk whose strides differ from C order). */
enum {
    DCP_OP_DECODED = 1u << 0,    /* source is the decoded (zstd) blob of `blob` */
    DCP_OP_BSWAP = 1u << 1,      /* swap each element's bytes by dcp_dtype_swap_unit */
    DCP_OP_CONJ = 1u << 2,       /* negate the imaginary part */
    DCP_OP_NEG = 1u << 3         /* negate every element */
};

typedef struct dcp_op {
    uint32_t file;          /* index into the file table */
    uint32_t flags;         /* DCP_OP_* */
    uint64_t src_offset;    /* absolute file offset (or offset in the decoded blob) */
    uint64_t length;        /* bytes read, a multiple of elem_size */
    uint64_t dest_offset;   /* bytes from the start of the region buffer */
    uint64_t dest_stride;   /* bytes between consecutive elements in the destination */
    uint32_t elem_size;     /* bytes per element (1 for bytes items) */
    uint32_t chunk;         /* chunk index within the entry (bytes items: 0) */
    dcp_blob blob;          /* the blob the bytes come from (for decoding and errors) */
} dcp_op;

typedef struct dcp_plan {
    const dcp_entry *entry;
    dcp_op *ops;
    size_t nops, cap;
    uint64_t nbytes;        /* size of the region buffer */
    int zero_fill;          /* some of the region is covered by no chunk: zero it first */
    dcp_dtype dtype;        /* element type of the region: the stored dtype (same size as
                               the metadata's); DCP_UINT8 for a bytes item */
} dcp_plan;

void dcp_plan_init(dcp_plan *plan);
void dcp_plan_reset(dcp_plan *plan);      /* keep the allocation, drop the ops */
void dcp_plan_free(dcp_plan *plan);

/* Plan the box [offsets, offsets+lengths) of tensor e (ndim values each; both
 * may be NULL for a 0-d tensor) into a C-order region buffer. Resolves chunk
 * records as needed. Replaces the plan's content (the ops array is reused);
 * on failure the plan is left empty. A box outside the shape is EINVAL. */
int dcp_plan_region(dcp_checkpoint *ck, const dcp_entry *e,
                    const int64_t *offsets, const int64_t *lengths,
                    dcp_plan *plan, dcp_error *err);

/* Plan bytes [offset, offset+length) of the entry's flat byte image (the
 * global tensor in C order, or the bytes item's stored (decoded) bytes). For
 * tensors, offset and length must be multiples of the element size, except
 * that the range may end at the end of the tensor. A range past the end is
 * clamped to it, as read(2) does: plan->nbytes is the clamped length (0 at or
 * past the end). Replaces the plan's content; on failure the plan is empty.
 * Allocates nothing beyond the plan's reused ops array (FUSE read path). */
int dcp_plan_bytes(dcp_checkpoint *ck, const dcp_entry *e,
                   uint64_t offset, uint64_t length,
                   dcp_plan *plan, dcp_error *err);

/* ---------------------------------------------------------------- reader */

/* Reads of at least 2 MiB (plan execution, dcp_op_fetch, dcp_op_fetch_cached)
 * go in pieces of at least 1 MiB on up to this many threads at once, so that
 * one process keeps a device busy and copies out of the page cache on
 * several cores. Process-wide. dcp_read_threads(n) sets it (n >= 1, at most
 * 64) and returns the previous value; dcp_read_threads(0) only returns it.
 * Default: $DCP_READ_THREADS, else 8. 1 reads on the calling thread only. */
unsigned dcp_read_threads(unsigned n);

/* Execute a plan made by dcp_plan_* into dest (plan->nbytes bytes): ops in
 * file and offset order, pread/preadv straight into dest where possible,
 * otherwise through a per-thread buffer of at most 4 MiB. Errors name the
 * file and the key (EIO for a short file, ENOENT for a missing one). Any
 * number of threads may execute plans on one checkpoint at once. */
int dcp_plan_execute(dcp_checkpoint *ck, const dcp_plan *plan, void *dest, dcp_error *err);

/* The building blocks of dcp_plan_execute, for callers that move bytes
 * themselves (the MPI loader): fetch an op's source bytes (op->length bytes,
 * decoded and checked) into buf, and place fetched bytes into a region buffer
 * applying dest_stride and flags. */
int dcp_op_fetch(dcp_checkpoint *ck, const dcp_entry *e, const dcp_op *op, void *buf, dcp_error *err);
/* For callers that read ahead (the MPI loader): dcp_op_fetch_cached reads
 * the part of an op's source bytes already in the page cache, from its
 * start, without waiting for storage (preadv2 RWF_NOWAIT), and returns how
 * many bytes it placed in buf (0 for decoded ops, on kernels or file systems
 * without RWF_NOWAIT, and on any error: dcp_op_fetch then reads the rest and
 * reports). dcp_op_prefetch advises the kernel to start reading an op's
 * source from storage (POSIX_FADV_WILLNEED); decoded ops are left alone. */
uint64_t dcp_op_fetch_cached(dcp_checkpoint *ck, const dcp_op *op, void *buf);
/* Map op's stored bytes read-only when every page of them is in the page
 * cache (mincore), for a caller that lets a device copy them out without a
 * CPU copy first (the MPI loader's DCP_LOAD_MAP). 1: *at is the first byte,
 * *base and *len the mapping for dcp_op_unmap; 0: not mapped (not all
 * cached, decoded, past the end of its file, or the file cannot be mapped):
 * read it as usual, which reports any error. The file is the one dcp_open
 * saw (same device and inode). A caller must not let the CPU read a mapping
 * whose file may shrink meanwhile (SIGBUS); pages pinned by a device
 * registration stay readable by the device. */
int dcp_op_map_cached(dcp_checkpoint *ck, const dcp_op *op, const void **at, void **base, size_t *len);
void dcp_op_unmap(void *base, size_t len);
void dcp_op_prefetch(dcp_checkpoint *ck, const dcp_op *op);
/* Storage reads that bypass the page cache (O_DIRECT), for a caller that
 * reads evicted files into its own staging (the MPI loader's --direct): on
 * a virtual disk they measured 2x the buffered reads of the same bytes. An
 * op's source bytes are read in whole blocks of DCP_DIRECT_ALIGN, so buf
 * must be aligned to it and hold the op's first byte at buf + *lead
 * (src_offset mod DCP_DIRECT_ALIGN) and its last before buf + cap. Returns 0
 * when the bytes are there, 1 when they could not be read this way (a
 * decoded op, buf or cap unfit, a file system without O_DIRECT, a file not
 * seen before or replaced, a failed or short read): the caller then reads
 * them with dcp_op_fetch, which reports any error. */
#define DCP_DIRECT_ALIGN 4096u
int dcp_op_fetch_direct(dcp_checkpoint *ck, const dcp_op *op, void *buf, size_t cap, size_t *lead);
/* The same straight into the caller's memory: dest holds the op's bytes
 * (op->length of them) and agrees with the file modulo the block size,
 * (dest - src_offset) % DCP_DIRECT_ALIGN == 0. Whole blocks are read into
 * dest with O_DIRECT, the partial ones at either end through a bounce
 * block, so no byte outside dest is written. Returns 0 or 1 as above (1
 * also for a dest that does not agree). */
int dcp_op_fetch_direct_at(dcp_checkpoint *ck, const dcp_op *op, void *dest);
/* dtype (plan->dtype) gives BSWAP's unit (dcp_dtype_swap_unit) and what NEG
 * and CONJ mean: NEG negates float16/bfloat16/float32/float64, complex (both
 * halves) and integer elements, CONJ negates complex imaginary halves; other
 * dtypes are copied unchanged. Assumes a little-endian host for BSWAP. */
void dcp_op_place(const dcp_op *op, const void *src, void *region, dcp_dtype dtype);

/* A read-only file descriptor of data file `file`, valid until dcp_close (ck
 * owns it; do not close it). For zero-copy paths such as FUSE splice. Other
 * data files' fds are cached and closed when idle to stay under
 * RLIMIT_NOFILE; fds handed out here are never closed early. Fails with
 * EIO when the file is no longer the one the checkpoint was opened with
 * (replaced, or written to in place: saved again), so that bytes read
 * right after are the model's. */
int dcp_file_fd(dcp_checkpoint *ck, uint32_t file, int *fd, dcp_error *err);

/* Read a whole entry (tensor or bytes item) into a malloc'd buffer.
 * Convenience for small entries; callers of large ones should plan. An entry
 * larger than physical memory is refused with EFBIG. */
int dcp_read_entry(dcp_checkpoint *ck, const dcp_entry *e, void **buf, uint64_t *len, dcp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* DCP_H */
