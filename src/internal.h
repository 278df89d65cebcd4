/* libdcp internals shared by the core's source files. Not installed. */
#ifndef DCP_INTERNAL_H
#define DCP_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

#define DCPI_MAX_NDIM 64          /* torch's own limit on tensor dimensions */

/* ---------------------------------------------------------------- errors */

/* Fill err (may be NULL) and return -1. */
int dcpi_err(dcp_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prefix an existing message: "<prefix>: <old message>". Returns -1. */
int dcpi_err_prefix(dcp_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* 1 when the file at path (existing or not) would be inside ck's folder (for a
 * single-file checkpoint: is that file), which nothing may write into
 * (model.c); the same for a folder's path (util.c). */
int dcpi_path_inside(const char *path, dcp_checkpoint *ck);
int dcpi_path_inside_folder(const char *path, const char *folder);
/* 1 when a folder's entry is a regular file or a link to one (util.c): what
 * names a checkpoint's files by their endings is never a folder, a FIFO or a
 * dangling link ("old.safetensors/" beside a run's checkpoints). */
struct dirent;
int dcpi_dirent_regular(int dirfd, const struct dirent *de);
/* A JSON file of ck's folder (rel, relative to it; what: its name in
 * messages) into *root, with duplicate keys refused: the size is checked
 * against max (a hostile file; "larger than <bound> (N MiB at most)" in the
 * message) before anything is read, the file must be regular (a FIFO is
 * never waited on). 0 with *root NULL when there is no such file (util.c). */
struct json_t;
int dcpi_read_json(dcp_checkpoint *ck, const char *rel, const char *what, uint64_t max, const char *bound,
                   struct json_t **root, dcp_error *err);
/* The same, relative to a folder's descriptor (a folder not opened as a checkpoint). */
int dcpi_read_json_at(int dirfd, const char *rel, const char *what, uint64_t max, const char *bound,
                      struct json_t **root, dcp_error *err);

/* ------------------------------------------------------- checked arithmetic */

static inline bool dcpi_add_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_add_overflow(a, b, r); }
static inline bool dcpi_mul_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }

/* Order two chunk offsets (nd values) lexicographically: <0, 0, >0. */
static inline int dcpi_box_cmp(const int64_t *a, const int64_t *b, int nd)
{
    for (int d = 0; d < nd; d++)
        if (a[d] != b[d])
            return a[d] < b[d] ? -1 : 1;
    return 0;
}

/* ---------------------------------------------------------------- arena */

/* Bump allocator for data that lives as long as its owner. Not thread-safe. */
typedef struct dcpi_arena {
    struct dcpi_arena_block *head;
    size_t total;
} dcpi_arena;

void dcpi_arena_init(dcpi_arena *a);
void dcpi_arena_free(dcpi_arena *a);
void *dcpi_arena_alloc(dcpi_arena *a, size_t n);             /* zeroed, 16-aligned; NULL on OOM */
char *dcpi_arena_strndup(dcpi_arena *a, const char *s, size_t n);
void *dcpi_arena_memdup(dcpi_arena *a, const void *p, size_t n);
/* A point in an arena's life: dcpi_arena_rewind frees everything allocated
 * since dcpi_arena_mark (the streaming pickle parse drops each consumed
 * entry's nodes so). Marks must be rewound in reverse order, or not at all. */
typedef struct dcpi_arena_mark {
    struct dcpi_arena_block *head, *next;
    size_t used, total;
} dcpi_arena_mark;
dcpi_arena_mark dcpi_arena_here(const dcpi_arena *a);
void dcpi_arena_rewind(dcpi_arena *a, const dcpi_arena_mark *mk);

/* ------------------------------------------------------ string hash index */

/* Open-addressing map from a byte string to a uint64 value. */
typedef struct dcpi_strmap {
    struct dcpi_strmap_slot *slots;
    size_t cap, count;
} dcpi_strmap;

void dcpi_strmap_init(dcpi_strmap *m);
void dcpi_strmap_free(dcpi_strmap *m);
/* Insert or overwrite. The key bytes must outlive the map (arena-owned). */
int dcpi_strmap_put(dcpi_strmap *m, const char *key, size_t len, uint64_t value);
bool dcpi_strmap_get(const dcpi_strmap *m, const char *key, size_t len, uint64_t *value);
uint64_t dcpi_hash_bytes(const void *p, size_t n);

/* ------------------------------------------------------------ checkpoint */

/* Lazily resolved record of one chunk. */
typedef struct dcpi_record_slot {
    int state;                 /* 0 unresolved, 1 resolved */
    dcp_record rec;
} dcpi_record_slot;

/* The chunks of one entry of a model served by the catalog, read from it on
 * demand (model.c keeps them; integrity/modelcache.c reads them): one
 * allocation holding the chunks, their boxes and their record slots. Kept
 * while pinned (dcp_entry_chunks), then in a least-recently-used list
 * within ck->chunk_budget bytes. */
typedef struct dcpi_chunkset {
    struct dcpi_chunkset *prev, *next;   /* the LRU list, when unpinned */
    size_t idx;                          /* the entry */
    size_t bytes;                        /* of the allocation */
    unsigned pins;
    int dirty;                           /* records located since it was read (to store) */
    dcp_chunk *chunks;                   /* nchunks */
    dcpi_record_slot *records;           /* nchunks */
    int64_t *strides;                    /* nchunks * ndim, for the records */
} dcpi_chunkset;

struct dcpi_entry_priv {
    dcp_chunk *chunks;         /* a parsed model's chunks (nchunks, writable) */
    size_t chunk_cap;
    dcpi_record_slot *records;  /* a parsed model's: nchunks slots, allocated on first use */
    dcpi_chunkset *set;        /* a served model's, while cached (under ck->lock) */
    const struct dcpi_fold *fold;   /* megatron_fold.c: the entry shown in its original shape */
    int tiling;                /* planner.c, atomically: 0 not known yet, 1 no two chunks
                                  overlap, 2 some do */
    int replicated;            /* metadata.c: several __R.metadata files list the item or a box */
};

/* A Megatron-Core tensor stored reformulated, as the .metadata's mcore_data
 * names it (metadata.c; megatron_fold.c folds it back on request). */
typedef struct dcpi_reform {
    const char *key;           /* arena-owned, NUL-terminated */
    size_t keylen;
    int ndim;
    const int64_t *shape;      /* nd_reformulated_orig_global_shape */
} dcpi_reform;

/* Internal blob flag (beside the public DCP_TRANSFORM_*): the blob is the raw
 * C-contiguous bytes of exactly its chunk (safetensors data). */
#define DCPI_BLOB_RAW (1u << 31)
/* The transforms a blob's bytes go through before use (blob.c decodes them). */
#define DCPI_BLOB_ENCODED (DCP_TRANSFORM_ZSTD | DCP_TRANSFORM_LATIN1)

typedef struct dcpi_store dcpi_store;   /* store.h */

/* The .metadata a model was parsed from (identity.c computes it; the
 * catalog files and finds models by it): the content key (XXH3-128 of its
 * size, mtime and bytes) and its stat stamp. Not the checkpoint's digest
 * identity (integrity/digest.c, dcp_checkpoint_identity): that one hashes
 * every metadata file (the __R.metadata of a rank-local save too) and every
 * data file's size, because recorded digests of shard bytes hold only while
 * the shards keep their sizes, whereas a parsed model holds as long as its
 * .metadata is the same. Two digests of two things, so two names. */
typedef struct dcpi_metadata_id {
    char key[33];              /* "" until known */
    char stamp[112];           /* "" until known, "-" when racy (identity.c) */
} dcpi_metadata_id;

/* dcp_checkpoint is the model's (model.c): the entry and file tables, the
 * arena, the lock and the chunk-set cache. The layers above it keep their
 * state in their own structures, one pointer each, made and freed by their
 * own file: model.c knows none of them, and frees what needs freeing
 * through the closers they register (dcpi_ck_on_close), so it calls no
 * layer above it. */
#define DCPI_MAX_CLOSERS 4

struct dcp_checkpoint {
    char *path;                /* the folder as given */
    const dcpi_store *store;   /* where entries and chunks come from (store.h) */
    int dirfd;                 /* O_PATH|O_DIRECTORY of the folder */
    dcpi_arena arena;           /* keys, shapes, chunk boxes, strings */

    /* A parsed model fills these while opening. A model served by the
     * catalog allocates entries[] and priv[] for every entry at open and
     * fills them as entries are asked for (an entry is there once its key
     * is set, stored last with release order): a cache behind the pointers,
     * which is why the const lookups may fill it. */
    dcp_entry *entries;
    struct dcpi_entry_priv *priv;   /* parallel to entries */
    size_t nentries, entry_cap;
    dcpi_strmap keys;               /* key -> entry index */

    char **files;                  /* relative paths, arena-owned */
    size_t nfiles, file_cap;
    dcpi_strmap file_index;         /* relative path -> file index */

    dcp_info info;
    int from_catalog;              /* the model was rebuilt from the catalog (open.c) */
    long rank_view;                /* DCP_OPEN_RANK: the rank whose __R.metadata alone is read; -1 */
    dcpi_reform *reform;           /* a parsed model's Megatron-Core mcore_data shapes (arena) */
    size_t nreform;
    dcpi_metadata_id meta;         /* identity.c, integrity/modelcache.c */

    /* Guards the arena after open, the chunk-set cache below, priv[].set and
     * priv[].records, and the layers' state (each file says which). */
    pthread_mutex_t lock;
    struct dcpi_keyorder *order;   /* store_mem.c: a parsed model's key order (dcp_seek),
                                      made with ck, filled on first use behind a const ck */
    dcpi_chunkset *lru_head, *lru_tail;   /* unpinned chunk sets, most recent first (under lock) */
    size_t chunk_bytes;            /* bytes of every cached chunk set */
    size_t chunk_budget;           /* evict unpinned sets beyond this */

    /* The layers' state, each opaque here. */
    struct dcpi_files *io;         /* files.c: fds, sizes, the fd cache (dcpi_ck_files_ready) */
    struct dcpi_blobcache *blobs;  /* blob.c: decoded (zstd) blobs, on first use */
    struct dcpi_st_index *st_index; /* torchsave.c: parsed safetensors headers, arena-owned */
    struct dcpi_digest_state *digest; /* integrity/digest.c: the digest identity, arena-owned */
    struct dcpi_lazy *lazy;        /* integrity/modelcache.c: a served model's (its store's close frees it) */
    struct dcpi_spill *spill;      /* store_spill.c: a spilled model's scratch files (its store's close frees them) */
    struct {
        void (*fn)(void *state);
        void *state;
    } closers[DCPI_MAX_CLOSERS];
    unsigned nclosers;
};

/* Have fn(state) called by dcp_close, before the model is freed, latest
 * first. The caller holds ck->lock, or has ck to itself (opening). 0, or -1
 * with err (EOVERFLOW) when DCPI_MAX_CLOSERS are taken. */
int dcpi_ck_on_close(dcp_checkpoint *ck, void (*fn)(void *), void *state, dcp_error *err);

#define DCPI_CHUNK_BUDGET (16u << 20)

/* An empty model over a folder (model.c; dcp_open starts the same way). */
dcp_checkpoint *dcpi_ck_new(const char *folder, dcp_error *err);
/* The data files' state (files.c: fds, sizes, the fd cache), made once
 * every file is declared; reads fail with EINVAL before it. */
int dcpi_ck_files_ready(dcp_checkpoint *ck, dcp_error *err);

/* The .metadata's identity (identity.c): its content key (XXH3-128 of its
 * size, mtime and bytes, fed as they are read) and its stat stamp, which
 * the catalog files a model under. dcpi_identity_begin returns NULL on OOM
 * (the others accept it); dcpi_identity_finish fills ck->meta and frees. */
struct stat;
typedef struct dcpi_identity dcpi_identity;
dcpi_identity *dcpi_identity_begin(const struct stat *sb);
void dcpi_identity_update(dcpi_identity *id, const void *p, size_t n);
void dcpi_identity_key(dcpi_identity *id, char key[33]);
void dcpi_identity_finish(dcpi_identity *id, dcp_checkpoint *ck);
void dcpi_identity_free(dcpi_identity *id);
void dcpi_identity_stamp(dcp_checkpoint *ck, const struct stat *sb);

/* The element count of a shape whose sizes are >= 0: 0 when any size is 0,
 * whatever the others (torch saves and loads torch.empty(2**62, 0): nothing
 * multiplies them), else the product, which must fit (*numel unchanged and
 * false when it does not). */
static inline bool dcpi_shape_numel(int ndim, const int64_t *shape, uint64_t *numel)
{
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 0) {
            *numel = 0;
            return true;
        }
    for (int d = 0; d < ndim; d++)
        if (!dcpi_mul_u64(n, (uint64_t)shape[d], &n))
            return false;
    *numel = n;
    return true;
}
/* A tensor shape the model holds: every size >= 0 and an element count at
 * most UINT64_MAX >> 5 (its bytes fit for every dtype); a 0 anywhere makes
 * it 0 elements. The format loaders and the catalog follow this rule. */
static inline bool dcpi_shape_ok(int ndim, const int64_t *shape)
{
    uint64_t n;
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0)
            return false;
    return dcpi_shape_numel(ndim, shape, &n) && n <= (UINT64_MAX >> 5);
}

/* Model building, used by the format loaders while opening. */
int dcpi_model_file(dcp_checkpoint *ck, const char *rel, size_t len, uint32_t *idx, dcp_error *err);
/* Returns the entry index of key, creating it with `kind` if absent. A key
 * that exists with another kind is an error. */
int dcpi_model_entry(dcp_checkpoint *ck, const char *key, size_t len, dcp_kind kind,
                    size_t *idx, dcp_error *err);
int dcpi_model_set_tensor(dcp_checkpoint *ck, size_t idx, dcp_dtype dt, int ndim,
                         const int64_t *shape, dcp_error *err);
/* Room for `more` chunks of entry idx, exactly (a loader that knows how
 * many are coming; dcpi_model_add_chunk grows by doubling). */
int dcpi_model_reserve_chunks(dcp_checkpoint *ck, size_t idx, size_t more, dcp_error *err);
/* Append a chunk box (ndim must match the entry's). Returns its index in *ci. */
int dcpi_model_add_chunk(dcp_checkpoint *ck, size_t idx, const int64_t *offsets,
                        const int64_t *sizes, size_t *ci, dcp_error *err);
/* Where chunk ci of entry idx lies (a parsed model's, while loading). */
void dcpi_model_chunk_blob(dcp_checkpoint *ck, size_t idx, size_t ci, const dcp_blob *b);
/* Chunk ci's record when the loader already knows it (a single torch.save
 * file's tensors): the planner then never locates it. The stride is copied.
 * After the entry's last chunk is added (one record slot per chunk). */
int dcpi_model_chunk_record(dcp_checkpoint *ck, size_t idx, size_t ci, const dcp_record *rec, dcp_error *err);
/* Check a relative path from metadata: not empty, not absolute, no "..". */
int dcpi_check_relpath(const char *rel, size_t len, dcp_error *err);
const char *dcpi_model_strdup(dcp_checkpoint *ck, const char *s);
/* The index of e in ck's entries, or SIZE_MAX when it is not one of them. */
size_t dcpi_entry_index(const dcp_checkpoint *ck, const dcp_entry *e);
/* cast.c: whether dcpi_cast reads dtype dt (float64/32/16, bfloat16,
 * float8 e4m3fn and e5m2), and n elements of src (dtype from) written to dst
 * (float64/32/16 or bfloat16) as torch's CPU .to() writes them. */
int dcpi_castable(dcp_dtype dt);
void dcpi_cast(const void *src, dcp_dtype from, void *dst, dcp_dtype to, size_t n);
/* tiling.c: 1 when chunks[idx[0..m)] (none of them empty) tile e exactly
 * once, 0 when not (or past 6 cut dimensions), -1 out of memory. */
int dcpi_chunks_tile(const dcp_entry *e, const dcp_chunk *chunks, const size_t *idx, size_t m);
/* tiling.c: fn(ctx, a, b) for each pair of chunks[idx[0..m)] that overlap (a
 * nonzero return stops); the number found. idx is reordered. */
int64_t dcpi_chunk_overlaps(const dcp_entry *e, const dcp_chunk *chunks, size_t *idx, size_t m,
                            int (*fn)(void *ctx, size_t a, size_t b), void *ctx);
/* An empty chunk set of entry idx for n chunks of nd dimensions, in one
 * allocation (model.c): the chunks, their record slots, then offsets and
 * sizes (2*nd a chunk, offsets first) and strides (nd a chunk). NULL on
 * ENOMEM. */
dcpi_chunkset *dcpi_chunkset_new(size_t idx, size_t n, size_t nd);

/* The spill store (store_spill.c): chunks kept in scratch files in folder
 * dir while .metadata is parsed, for a model too large to hold. begin makes
 * ck's store the spill store; a loader (metadata.c) hands each tensor entry
 * over once complete (spill_entry: its chunks are then freed, the boxes'
 * arena memory is the caller's to rewind) and each storage item's blob
 * (spill_blob: found by offsets; 0 when no chunk has them); finish after
 * the parse. Errors name the checkpoint and key. */
int dcpi_spill_begin(dcp_checkpoint *ck, const char *dir, dcp_error *err);
int dcpi_spill_entry(dcp_checkpoint *ck, size_t idx, dcp_error *err);
int dcpi_spill_blob(dcp_checkpoint *ck, size_t idx, const int64_t *off, int nd, const dcp_blob *b, dcp_error *err);
int dcpi_spill_finish(dcp_checkpoint *ck, dcp_error *err);
/* The parse failed for a reason of the spill's own (refuse: the loader
 * met what only the in-memory parse takes, a key listed twice or a pickle
 * referring back to a released object): dcp_open parses again in memory.
 * Other failures are the checkpoint's, reported as they are. */
void dcpi_spill_refuse(dcp_checkpoint *ck);
int dcpi_spill_refused(const dcp_checkpoint *ck);

/* Forget every entry and file a loader added (to load again). */
int dcpi_model_reset(dcp_checkpoint *ck, dcp_error *err);
/* The checkpoint's name in messages: its folder, or its file when it is a
 * single torch.save or safetensors file (libdcpload's ldi_name alike). */
const char *dcpi_ck_name(const dcp_checkpoint *ck);
/* Whether ck is one torch.save or safetensors file (ck->path its folder). */
bool dcpi_ck_is_file(const dcp_checkpoint *ck);

/* The model cache (integrity/modelcache.c), used by dcp_open (open.c).
 * Serve an empty ck from the catalog (0: ck->store is dcpi_store_catalog)
 * or fail (-1, ck partly filled: discard it); store a parsed one (0 when
 * stored, or already there). `parse` opens the folder without the catalog:
 * a served model falls back to it when the catalog fails later. */
typedef int (*dcpi_parse_fn)(const char *path, dcp_checkpoint **out, dcp_error *err);
int dcpi_catalog_load(dcp_checkpoint *ck, const char *catalog, dcpi_parse_fn parse);
int dcpi_catalog_store(dcp_checkpoint *ck, const char *catalog);
/* The folder of the catalog file (NULL: the default), made if missing, for
 * the spill store's scratch files: 0, or -1 for an in-memory catalog, one
 * inside ck's folder or one that cannot be made (integrity/catalog.c). */
int dcpi_catalog_folder(const char *catalog, dcp_checkpoint *ck, char out[4096]);

/* Format loaders, each fills an empty ck from the folder. */
int dcpi_load_metadata(dcp_checkpoint *ck, const char *relname, dcp_error *err);      /* metadata.c */
int dcpi_load_rank_local(dcp_checkpoint *ck, dcp_error *err);                         /* metadata.c */
int dcpi_load_rank_view(dcp_checkpoint *ck, unsigned rank, dcp_error *err);            /* metadata.c */
int dcpi_load_huggingface(dcp_checkpoint *ck, dcp_error *err);                        /* safetensors.c */
/* One safetensors file rel of ck's folder, alone (name: in messages; safetensors.c). */
int dcpi_load_safetensors_file(dcp_checkpoint *ck, const char *rel, const char *name, dcp_error *err);
int dcpi_hf_index_check(dcp_checkpoint *ck, const char *sub, char *const *files, size_t nfiles,
                        dcp_error *err);                                           /* hf_index.c */
int dcpi_megatron_config(dcp_checkpoint *ck, dcp_error *err);                         /* megatron_config.c */
/* Per-rank torch.save files of DTensors (torch-checkpointing <item>_<R>.pt,
 * verl <item>_world_size_<W>_rank_<R>.pt; dcp_is_rank_file tells their names). */
int dcpi_load_rank_files(dcp_checkpoint *ck, dcp_error *err);                         /* rankfiles.c */

/* Data-file access (reader.c). Files are opened lazily and cached; idle
 * cached fds may be closed to stay under RLIMIT_NOFILE. dcpi_ck_fd (like
 * dcp_file_fd) pins the fd: it stays open until dcp_close, so prefer
 * dcpi_pread_full, which holds the fd only for the duration of the read. */
int dcpi_ck_fd(dcp_checkpoint *ck, uint32_t file, int *fd, dcp_error *err);
int dcpi_ck_file_size(dcp_checkpoint *ck, uint32_t file, uint64_t *size, dcp_error *err);
/* pread exactly len bytes at off or fail naming the file (short read = EIO). */
int dcpi_pread_full(dcp_checkpoint *ck, uint32_t file, void *buf, size_t len, uint64_t off,
                   const char *key, dcp_error *err);

/* Blobs (blob.c). Hold len bytes of data (malloc'd; ck owns them from now,
 * freed even on failure) as a DCP_TRANSFORM_MEMORY blob, *out. */
int dcpi_blob_hold(dcp_checkpoint *ck, void *data, uint64_t len, dcp_blob *out, dcp_error *err);
/* Read [off, off+len) of a blob, decoding transforms. */
int dcpi_blob_read(dcp_checkpoint *ck, const dcp_blob *b, void *buf, size_t len, uint64_t off,
                  const char *key, dcp_error *err);
/* Decoded size of a blob (its length when it has no transform). */
int dcpi_blob_size(dcp_checkpoint *ck, const dcp_blob *b, uint64_t *size, const char *key,
                  dcp_error *err);
/* How many decoded blobs ck holds now (at most DCPI_DECODED_CACHE; tests). */
int dcpi_blob_cached(dcp_checkpoint *ck);
#define DCPI_DECODED_CACHE 4

/* The arguments of the _rebuild_tensor_v2/v3 call a torch.save data.pkl
 * makes for one tensor (torchsave.c), behind the wrappers torch.save may use
 * (_rebuild_parameter, _rebuild_parameter_with_state, _rebuild_from_type_v2
 * of a plain Tensor or Parameter). Shared by the record locator and the
 * torch.save source of convert. */
typedef struct dcpi_rebuild {
    dcp_dtype dtype;
    const char *storage_type;      /* the storage class name (FloatStorage, UntypedStorage...) */
    const char *storage_key;       /* the record is data/<storage_key> */
    size_t storage_key_len;
    uint64_t storage_bytes;        /* the record's size data.pkl implies */
    int64_t storage_offset;        /* in elements */
    int ndim;
    int64_t size[DCPI_MAX_NDIM], stride[DCPI_MAX_NDIM];
    uint32_t flags;                /* DCP_RECORD_CONJ, DCP_RECORD_NEG from the metadata dict */
} dcpi_rebuild;

struct pk_node;
/* 1 when n is a tensor torch.save may have written (a rebuild call, maybe
 * wrapped), 0 otherwise. */
int dcpi_torch_is_tensor(const struct pk_node *n);
/* Parse the rebuild call behind n (dtype, storage size and key, sizes,
 * strides, conj/neg). 0, or -1 with a reason in why; -2 when n is a
 * well-formed rebuild libdcp does not read (an NF4 weight, a quantized
 * tensor: intact, not damage). */
int dcpi_torch_rebuild_parse(const struct pk_node *n, dcpi_rebuild *r, char *why, size_t whylen);
/* Check the view: sizes and strides non-negative, every element it
 * addresses inside the storage. 0, or -1 with a reason in why. */
int dcpi_torch_rebuild_check_view(const dcpi_rebuild *r, char *why, size_t whylen);

/* Megatron-Core's reformulated tensors in their original shapes
 * (megatron_fold.c, DCP_OPEN_MEGATRON_FOLD): every entry ck->reform names
 * and whose chunks allow it is given the original shape and chunks in it,
 * each a box of the original whose elements are one run of a stored
 * chunk's. A parsed, in-memory model only, before any record is located. */
int dcpi_megatron_fold(dcp_checkpoint *ck, dcp_error *err);
/* ck->info.megatron_reformulated: the entries ck->reform names whose stored
 * shape is a reformulation of the original (chunks not looked at). */
void dcpi_megatron_count(dcp_checkpoint *ck);
/* The record of chunk i of a folded entry (dcp_chunk_record): the stored
 * chunk's, moved to the run and strided as the box. */
int dcpi_fold_record(dcp_checkpoint *ck, const dcp_entry *e, const struct dcpi_fold *f, const dcp_chunk *c,
                     size_t i, dcp_record *rec, int64_t *stride, dcp_error *err);

/* Record locator (torchsave.c): parse the torch.save zip of chunk c (chunk
 * index `chunk` of e). rec->stride points at stride (room for e->ndim values). */
int dcpi_locate_record(dcp_checkpoint *ck, const dcp_entry *e, const dcp_chunk *c, size_t chunk,
                      dcp_record *rec, int64_t *stride, dcp_error *err);

#endif
