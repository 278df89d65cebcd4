"""The C declarations of libdcp that dcpfs._native binds (cffi, API mode).

Read at build time by _build.py (by path: the package is not importable then).
cffi's API mode compiles a C module that includes the real headers, so the C
compiler checks every declaration below against them: a struct ending in
"...;" has its layout (field offsets, size) taken from the header, an enum
ending in "..." its values, and "[...]" an array length.

HEADERS: the #include lines given to set_source.
CDEF: the declarations given to cdef.
"""

HEADERS = """
#include <stdlib.h>
#include <dcp.h>
#include <dcp_file.h>
#include <dcp_gplan.h>
#include <dcp_write.h>
"""

CDEF = """
/* ---------------------------------------------------------------- libc */
void free(void *ptr);

/* ---------------------------------------------------------------- errors */
#define DCP_ERRMSG_MAX ...
#define DCP_ENOTFOUND ...

typedef struct dcp_error {
    int code;
    char msg[...];
    ...;
} dcp_error;

int dcp_key_matches(const char *pattern, const char *key);

/* ---------------------------------------------------------------- dtypes */
typedef enum dcp_dtype {
    DCP_DTYPE_INVALID,
    DCP_FLOAT64, DCP_FLOAT32, DCP_FLOAT16, DCP_BFLOAT16,
    DCP_COMPLEX128, DCP_COMPLEX64, DCP_COMPLEX32,
    DCP_INT64, DCP_INT32, DCP_INT16, DCP_INT8,
    DCP_UINT64, DCP_UINT32, DCP_UINT16, DCP_UINT8,
    DCP_BOOL,
    DCP_FLOAT8_E4M3FN, DCP_FLOAT8_E5M2, DCP_FLOAT8_E4M3FNUZ, DCP_FLOAT8_E5M2FNUZ,
    DCP_FLOAT8_E8M0FNU, DCP_FLOAT4_E2M1FN_X2,
    DCP_QINT8, DCP_QUINT8, DCP_QINT32, DCP_QUINT4X2, DCP_QUINT2X4,
    DCP_BITS8, DCP_BITS16, DCP_BITS1X8, DCP_BITS2X4, DCP_BITS4X2,
    DCP_DTYPE_COUNT,
    ...
} dcp_dtype;

const char *dcp_dtype_name(dcp_dtype dt);
size_t dcp_dtype_size(dcp_dtype dt);
dcp_dtype dcp_dtype_from_name(const char *name);
const char *dcp_dtype_numpy(dcp_dtype dt);

/* ---------------------------------------------------------------- model */
typedef enum dcp_kind { DCP_KIND_TENSOR, DCP_KIND_BYTES, ... } dcp_kind;

typedef struct dcp_blob {
    uint32_t file;
    uint32_t transforms;
    uint64_t offset;
    uint64_t length;
    ...;
} dcp_blob;

typedef struct dcp_chunk {
    const int64_t *offsets;
    const int64_t *sizes;
    dcp_blob blob;
    int has_blob;
    ...;
} dcp_chunk;

typedef struct dcp_entry {
    const char *key;
    dcp_kind kind;
    dcp_dtype dtype;
    int ndim;
    const int64_t *shape;
    size_t nchunks;
    dcp_blob blob;
    int has_blob;
    ...;
} dcp_entry;

typedef struct dcp_info {
    const char *generation;
    const char *serialization;
    const char *layout;
    const char *version;
    const char *checkpoint_id;
    const char *save_id;
    int has_planner_data;
    int megatron;
    uint64_t metadata_bytes;
    size_t megatron_reformulated;
    size_t megatron_folded;
    ...;
} dcp_info;

typedef struct dcp_checkpoint dcp_checkpoint;

#define DCP_OPEN_DEFAULT ...
#define DCP_OPEN_CATALOG ...
#define DCP_OPEN_MEGATRON_FOLD ...
#define DCP_OPEN_RANK ...

typedef struct dcp_open_options {
    size_t size;
    unsigned flags;
    const char *catalog;
    unsigned rank;
    ...;
} dcp_open_options;

int dcp_open_ex(const char *path, const dcp_open_options *opts, dcp_checkpoint **out, dcp_error *err);
int dcp_from_catalog(const dcp_checkpoint *ck);
void dcp_close(dcp_checkpoint *ck);

const char *dcp_path(const dcp_checkpoint *ck);
const dcp_info *dcp_get_info(const dcp_checkpoint *ck);
size_t dcp_num_entries(const dcp_checkpoint *ck);

const dcp_entry *dcp_entry_at(const dcp_checkpoint *ck, size_t i);
const dcp_entry *dcp_find(const dcp_checkpoint *ck, const char *key);
int dcp_find_entry(const dcp_checkpoint *ck, const char *key, const dcp_entry **out, dcp_error *err);
int dcp_get_entry(const dcp_checkpoint *ck, size_t i, const dcp_entry **out, dcp_error *err);
int dcp_entry_replicated(const dcp_checkpoint *ck, const dcp_entry *e);
int dcp_seek(dcp_checkpoint *ck, const char *from, const dcp_entry **out, dcp_error *err);

int dcp_entry_chunks(dcp_checkpoint *ck, const dcp_entry *e, const dcp_chunk **out, dcp_error *err);
void dcp_release_chunks(dcp_checkpoint *ck, const dcp_entry *e);

size_t dcp_num_files(const dcp_checkpoint *ck);
const char *dcp_file_name(const dcp_checkpoint *ck, uint32_t file);

uint64_t dcp_entry_numel(const dcp_entry *e);
int dcp_entry_nbytes(dcp_checkpoint *ck, const dcp_entry *e, uint64_t *out, dcp_error *err);

/* ---------------------------------------------------------------- planner */
typedef struct dcp_op {
    uint32_t file;
    uint32_t flags;
    uint64_t src_offset;
    uint64_t length;
    uint64_t dest_offset;
    uint64_t dest_stride;
    uint32_t elem_size;
    uint32_t chunk;
    dcp_blob blob;
    ...;
} dcp_op;

typedef struct dcp_plan {
    const dcp_entry *entry;
    dcp_op *ops;
    size_t nops;
    size_t cap;
    uint64_t nbytes;
    int zero_fill;
    dcp_dtype dtype;
    ...;
} dcp_plan;

void dcp_plan_init(dcp_plan *plan);
void dcp_plan_reset(dcp_plan *plan);
void dcp_plan_free(dcp_plan *plan);

int dcp_plan_region(dcp_checkpoint *ck, const dcp_entry *e,
                    const int64_t *offsets, const int64_t *lengths,
                    dcp_plan *plan, dcp_error *err);
int dcp_plan_bytes(dcp_checkpoint *ck, const dcp_entry *e,
                   uint64_t offset, uint64_t length,
                   dcp_plan *plan, dcp_error *err);

/* ---------------------------------------------------------------- reader */
int dcp_plan_execute(dcp_checkpoint *ck, const dcp_plan *plan, void *dest, dcp_error *err);
int dcp_read_entry(dcp_checkpoint *ck, const dcp_entry *e, void **buf, uint64_t *len, dcp_error *err);

/* ---------------------------------------------------------------- single files (dcp_file.h) */
typedef enum dcp_format {
    DCP_FORMAT_AUTO, DCP_FORMAT_DCP, DCP_FORMAT_TORCH_SAVE, DCP_FORMAT_SAFETENSORS, ...
} dcp_format;

int dcp_open_file(const char *path, dcp_format fmt, dcp_checkpoint **out, size_t *nskipped, dcp_error *err);

/* ---------------------------------------------------------------- key paths (dcp_write.h) */
typedef struct dcp_path_part {
    const char *str;
    size_t len;
    int64_t index;
    ...;
} dcp_path_part;
typedef struct dcp_key_paths dcp_key_paths;
int dcp_key_paths_read(const char *dir, dcp_key_paths **out, dcp_error *err);
const dcp_path_part *dcp_key_paths_get(const dcp_key_paths *kp, const char *key, size_t *n);
void dcp_key_paths_free(dcp_key_paths *kp);

/* ---------------------------------------------------------------- the global plan (dcp_gplan.h) */
/* Used by dcpfs.torch.load: the plan libdcpload runs over MPI, run over torch.distributed. */
void *memset(void *s, int c, size_t n);

#define DCP_OP_DECODED ...
#define DCP_OP_BSWAP ...
#define DCP_OP_CONJ ...
#define DCP_OP_NEG ...
void dcp_op_place(const dcp_op *op, const void *src, void *region, dcp_dtype dtype);

typedef struct dcp_gregion {
    const char *key;
    dcp_dtype dtype;
    int ndim;
    const int64_t *offsets;
    const int64_t *lengths;
    ...;
} dcp_gregion;

typedef struct dcp_greq {
    int rank;
    const dcp_entry *e;
    dcp_dtype dtype;
    int ndim;
    int64_t *off;
    int64_t *len;
    uint64_t nbytes;
    void *dest;
    int mem;
    ...;
} dcp_greq;

typedef struct dcp_greqs {
    dcp_greq *v;
    size_t n;
    int64_t *dims;
    size_t *first;
    ...;
} dcp_greqs;

int dcp_greqs_encode(const dcp_gregion *regions, size_t n, unsigned char **buf, size_t *len,
                     dcp_error *err);
int dcp_greqs_decode(dcp_checkpoint *ck, const unsigned char *all, const size_t *counts,
                     const size_t *displs, int nranks, dcp_greqs *out, dcp_error *err);
int dcp_greq_check(dcp_checkpoint *ck, const char *key, dcp_dtype dt, int ndim, const int64_t *off,
                   const int64_t *len, const dcp_entry **e, uint64_t *nbytes, dcp_error *err);
void dcp_greqs_free(dcp_greqs *r);

typedef struct dcp_gop {
    dcp_op op;
    uint32_t req;
    uint32_t space;
    int rank;
    dcp_dtype dtype;
    ...;
} dcp_gop;

typedef struct dcp_gfrag {
    uint32_t gop;
    int rank;
    uint64_t src;
    uint64_t len;
    uint64_t img;
    ...;
} dcp_gfrag;

#define DCP_GDLV_P2P ...
#define DCP_GDLV_BCAST ...
#define DCP_GDLV_SHM ...

typedef struct dcp_gdlv {
    int kind;
    int peer;
    int group;
    uint64_t bytes;
    size_t cov0;
    size_t ncov;
    ...;
} dcp_gdlv;

typedef struct dcp_gunit {
    uint32_t space;
    uint64_t off;
    uint64_t len;
    int reader;
    uint64_t seq;
    size_t frag0;
    size_t nfrag;
    size_t dlv0;
    size_t ndlv;
    ...;
} dcp_gunit;

typedef struct dcp_gplan {
    int nranks;
    int me;
    dcp_gop *gops;
    size_t ngops;
    unsigned char *zero;
    dcp_gunit *units;
    size_t nunits;
    dcp_gfrag *frags;
    size_t nfrags;
    dcp_gdlv *dlvs;
    size_t ndlvs;
    uint64_t unique_bytes;
    uint64_t *load;
    int has_shm;
    ...;
} dcp_gplan;

typedef struct dcp_gplan_opts {
    size_t size;
    uint64_t unit_max;
    int no_bcast;
    const int *node;
    int shm;
    int bcast_local;
    ...;
} dcp_gplan_opts;

int dcp_gplan_build(dcp_checkpoint *ck, const dcp_greqs *reqs, int nranks, int me,
                    const dcp_gplan_opts *o, dcp_gplan *g, dcp_error *err);
void dcp_gplan_free(dcp_gplan *g);
const dcp_gfrag *dcp_gunit_frags(const dcp_gplan *g, const dcp_gunit *u, int rank, size_t *n);
int dcp_gunit_read(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, const dcp_gunit *next,
                   void *buf, dcp_error *err);
int dcp_gunit_cache(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, const dcp_gunit *next,
                    void *scratch, size_t len, dcp_error *err);
#define DCP_DIRECT_ALIGN ...
int dcp_gunit_read_direct(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, void *buf, size_t cap,
                          size_t *lead, dcp_error *err);
void dcp_gdlv_pack(const dcp_gplan *g, const dcp_gdlv *d, const void *unit, void *out);
void dcp_gfrag_place(const dcp_gplan *g, const dcp_greqs *r, const dcp_gfrag *f, size_t n,
                     const void *buf);
int dcp_gfrag_read(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_greqs *r, const dcp_gfrag *f, size_t n,
                   dcp_error *err);
uint64_t dcp_gfrag_dest(const dcp_gplan *g, const dcp_gfrag *f);
dcp_op dcp_gfrag_op(const dcp_gplan *g, const dcp_gfrag *f);
"""
