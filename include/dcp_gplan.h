/* libdcp's global load plan: N ranks each ask for regions of one checkpoint;
 * every rank builds the same plan from everyone's requests, so no plan is
 * ever sent. A transport executes it: libdcpload over MPI (dcp_load.h), the
 * Python package over torch.distributed. No MPI or CUDA here.
 *
 * The model:
 *  - Requests. Each rank encodes its regions (dcp_greqs_encode); the blocks
 *    of all ranks are exchanged (an allgather) and every rank decodes and
 *    checks all of them (dcp_greqs_decode) into one table, dcp_greqs, the
 *    same on every rank. Each rank then sets dest (and mem) of its own
 *    requests only.
 *  - Units. Every request is planned with the core planner (dcp_plan_*);
 *    the source byte ranges of all ops are merged per stream (a data file,
 *    or one decoded zstd blob: dcp_gspace) and cut into units of at most
 *    unit_max bytes. Each unit is read once, by its reader rank
 *    (dcp_gunit_read), balanced by bytes.
 *  - Fragments. The part of one op of one rank's request that lies in a
 *    unit: src/len in the source, and img, where those bytes are in the
 *    buffer that rank holds for the unit. For the reader that buffer is the
 *    unit itself (img = offset in the unit); for a p2p or broadcast
 *    receiver it is the packed image of its delivery (dcp_gdlv_pack: the
 *    delivery's spans, concatenated); for a shm peer it is the reader's
 *    unit buffer again (img = offset in the unit). dcp_gfrag_place copies
 *    fragments from such a buffer into host destinations.
 *  - Deliveries. Per unit, how each other rank needing bytes of it gets
 *    them: DCP_GDLV_P2P (the packed spans to one rank), DCP_GDLV_BCAST (the
 *    same packed spans to a group of ranks, the reader among them) or
 *    DCP_GDLV_SHM (a rank on the reader's node copies its fragments out of
 *    the reader's buffer: no spans, no image).
 *  - Order. Units are sorted in a global order (seq) interleaving the
 *    readers round-robin; every rank posts its transfers in that order, so
 *    waiting for the oldest transfer never deadlocks.
 *
 * Functions return 0, or -1 with err filled (as in dcp.h). */
#ifndef DCP_GPLAN_H
#define DCP_GPLAN_H

#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DCP_GREQ_MAX_NDIM 64      /* the most dimensions of a request */
#define DCP_GPLAN_MAX_GROUPS 64   /* distinct broadcast groups of a plan; more go p2p */

/* ---------------------------------------------------------------- requests */

/* One rank's request before the exchange: the box [offsets, offsets+lengths)
 * of tensor key (ndim values each; NULL allowed when ndim is 0). A bytes item
 * is requested whole with ndim 0 and dtype DCP_UINT8 or DCP_DTYPE_INVALID;
 * for tensors dtype must be the stored one (DCP_DTYPE_INVALID accepts it). */
typedef struct dcp_gregion {
    const char *key;
    dcp_dtype dtype;
    int ndim;
    const int64_t *offsets;
    const int64_t *lengths;
} dcp_gregion;

/* One request of one rank, the same on every rank after decoding. */
typedef struct dcp_greq {
    int rank;
    const dcp_entry *e;
    dcp_dtype dtype;         /* the plan's dtype (stored; DCP_UINT8 for bytes items) */
    int ndim;
    int64_t *off, *len;      /* into dcp_greqs.dims */
    uint64_t nbytes;         /* the destination's size */
    /* set by the caller after decoding, on the owning rank only (NULL and 0
     * elsewhere): the destination buffer and the transport's kind of memory
     * for it (libdcpload: dcp_load_mem; 0 is host memory) */
    void *dest;
    int mem;
} dcp_greq;

typedef struct dcp_greqs {
    dcp_greq *v;
    size_t n;
    int64_t *dims;           /* 2*ndim values per request */
    size_t *first;           /* first[r]: index of rank r's first request; nranks+1 values */
} dcp_greqs;

/* Encode one rank's n regions into a malloc'd block (*buf, *len; free() it).
 * The wire format, all little-endian: u32 count, then per region u32 key
 * length, the key's bytes (no NUL), i32 dtype, i32 ndim, and ndim pairs of
 * i64 (offset, length), one pair per dimension. EINVAL for a region without
 * a key, with an ndim outside [0, DCP_GREQ_MAX_NDIM] or without offsets or
 * lengths; nothing is checked against a checkpoint here. */
int dcp_greqs_encode(const dcp_gregion *regions, size_t n, unsigned char **buf, size_t *len,
                     dcp_error *err);

/* Decode every rank's block (rank r's: counts[r] bytes at all + displs[r])
 * and check each request against ck (dcp_greq_check) into *out, in rank
 * order. Blocks are untrusted: a truncated or malformed block, or one with
 * trailing bytes, is EPROTO. On failure *out is empty. dest and mem are
 * left NULL and 0. */
int dcp_greqs_decode(dcp_checkpoint *ck, const unsigned char *all, const size_t *counts,
                     const size_t *displs, int nranks, dcp_greqs *out, dcp_error *err);

/* Check one request against ck: an unknown key (ENOENT), a wrong ndim, a
 * box outside the shape, a dtype mismatch (EINVAL), a size overflow
 * (EOVERFLOW). Sets *e and *nbytes (the destination's size). */
int dcp_greq_check(dcp_checkpoint *ck, const char *key, dcp_dtype dt, int ndim, const int64_t *off,
                   const int64_t *len, const dcp_entry **e, uint64_t *nbytes, dcp_error *err);

void dcp_greqs_free(dcp_greqs *r);

/* ---------------------------------------------------------------- the plan */

/* A source stream: a data file, or one decoded (zstd) blob of it. */
typedef struct dcp_gspace {
    uint32_t file;
    int decoded;
    dcp_blob blob;           /* decoded spaces: the blob */
    const dcp_entry *e;      /* an entry reading it, for messages */
} dcp_gspace;

/* One op of one rank's request. */
typedef struct dcp_gop {
    dcp_op op;
    uint32_t req;            /* index into dcp_greqs.v */
    uint32_t space;
    int rank;
    dcp_dtype dtype;         /* the plan's element type, for dcp_op_place */
} dcp_gop;

/* The part [src, src+len) of op gop that rank needs from a unit; img is
 * where those bytes are in the buffer that rank holds for the unit (the
 * reader and shm peers: the unit, at offset 0; a p2p or broadcast receiver:
 * the packed image of its delivery). */
typedef struct dcp_gfrag {
    uint32_t gop;
    int rank;
    uint64_t src, len;
    uint64_t img;
} dcp_gfrag;

/* Bytes [a, b) of a unit, relative to its start. */
typedef struct dcp_gspan {
    uint64_t a, b;
} dcp_gspan;

enum { DCP_GDLV_P2P = 1, DCP_GDLV_BCAST = 2, DCP_GDLV_SHM = 3 };

/* One delivery of a unit from its reader: the packed spans go to one rank
 * (p2p) or to a group (a broadcast among the group's ranks); or a rank on
 * the reader's node copies its fragments straight out of the reader's unit
 * buffer (shm: no spans; bytes is then the sum of the rank's fragments). */
typedef struct dcp_gdlv {
    int kind;                /* DCP_GDLV_* */
    int peer;                /* p2p, shm: the receiving rank; -1 for bcast */
    int group;               /* bcast: index into dcp_gplan.groups; -1 otherwise */
    uint64_t bytes;          /* image size: sum of spans */
    size_t cov0, ncov;       /* into dcp_gplan.spans */
} dcp_gdlv;

typedef struct dcp_gunit {
    uint32_t space;
    uint64_t off, len;       /* source range */
    int reader;
    uint64_t seq;            /* position in the global order */
    size_t frag0, nfrag;     /* into dcp_gplan.frags, sorted by (rank, src) */
    size_t dlv0, ndlv;       /* into dcp_gplan.dlvs */
} dcp_gunit;

/* A broadcast group: n sorted ranks at group_ranks + rank0, the reader among
 * them. The transport creates one communicator per group, in group order on
 * every rank, so overlapping creations cannot deadlock. */
typedef struct dcp_ggroup {
    size_t rank0, n;         /* into dcp_gplan.group_ranks */
} dcp_ggroup;

typedef struct dcp_gplan {
    int nranks, me;
    dcp_gspace *spaces;
    size_t nspaces;
    dcp_gop *gops;
    size_t ngops;
    unsigned char *zero;     /* per request: parts are covered by no chunk, zero it first */
    dcp_gunit *units;        /* in global order (seq) */
    size_t nunits;
    dcp_gfrag *frags;
    size_t nfrags;
    dcp_gdlv *dlvs;
    size_t ndlvs;
    dcp_gspan *spans;
    size_t nspans;
    dcp_ggroup *groups;
    size_t ngroups;
    int *group_ranks;
    size_t ngroup_ranks;
    uint64_t unique_bytes;
    uint64_t *load;          /* bytes each rank reads */
    int has_shm;             /* some delivery is DCP_GDLV_SHM */
} dcp_gplan;

typedef struct dcp_gplan_opts {
    size_t size;             /* sizeof(dcp_gplan_opts): DCP_GPLAN_OPTS_INIT (dcp.h, options) */
    uint64_t unit_max;       /* largest unit: the staging buffer size (> 0) */
    int no_bcast;            /* p2p only */
    const int *node;         /* per rank: its node (any id shared by the ranks sharing memory); may be NULL */
    int shm;                 /* ranks on the reader's node copy out of its buffer (DCP_GDLV_SHM) */
    int bcast_local;         /* broadcast groups also on the reader's node */
} dcp_gplan_opts;
#define DCP_GPLAN_OPTS_INIT {.size = sizeof(dcp_gplan_opts)}

/* Build the global plan of the decoded requests for rank `me` of nranks.
 * Deterministic: every rank computes the same plan (me only sets g->me).
 * On failure *g is empty. */
int dcp_gplan_build(dcp_checkpoint *ck, const dcp_greqs *reqs, int nranks, int me,
                    const dcp_gplan_opts *o, dcp_gplan *g, dcp_error *err);
void dcp_gplan_free(dcp_gplan *g);

/* ---------------------------------------------------------------- executing it */

/* Rank's fragments of unit u (*n of them, sorted by src). */
const dcp_gfrag *dcp_gunit_frags(const dcp_gplan *g, const dcp_gunit *u, int rank, size_t *n);

/* The read of unit u: its source range as an op (elem_size 1). */
dcp_op dcp_gunit_op(const dcp_gplan *g, const dcp_gunit *u);

/* Read unit u (u->len bytes) into buf: the bytes in the page cache first
 * (dcp_op_fetch_cached); only when some are missing is `next` (the reader's
 * next unit; may be NULL) advised to the kernel (dcp_op_prefetch) before the
 * rest is read (dcp_op_fetch). */
int dcp_gunit_read(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, const dcp_gunit *next,
                   void *buf, dcp_error *err);

/* The same bypassing the page cache when the unit is not in it (its first
 * block is not): then the unit is read with O_DIRECT (dcp_op_fetch_direct;
 * nothing is advised, which would read it twice), else through the page
 * cache as dcp_gunit_read does. buf: aligned to
 * DCP_DIRECT_ALIGN, cap bytes (u->len + 2 * DCP_DIRECT_ALIGN suffice); the
 * unit's first byte lands at buf + *lead. */
int dcp_gunit_read_direct(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, void *buf, size_t cap,
                          size_t *lead, dcp_error *err);

/* The same straight into dest (u->len bytes, the caller's memory) when it
 * agrees with the unit's file offset modulo DCP_DIRECT_ALIGN
 * (dcp_op_fetch_direct_at): no staging and no copy out of the page cache
 * for an evicted unit. A dest that does not agree, and a cached unit, are
 * read as dcp_gunit_read does. */
int dcp_gunit_read_direct_at(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, void *dest,
                             dcp_error *err);

/* Read unit u through scratch (len > 0 bytes, reused piece by piece),
 * keeping nothing: the unit is then in the page cache for its node's ranks
 * to take with dcp_gfrag_read, and read errors surface at its reader. The
 * reader's own fragments follow with dcp_gfrag_read too, so a unit nobody
 * takes whole needs no buffer of its size. `next` as for dcp_gunit_read. */
int dcp_gunit_cache(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, const dcp_gunit *next,
                    void *scratch, size_t len, dcp_error *err);

/* Copy delivery d's spans of the unit buffer into out, packed (d->bytes
 * bytes): the image a p2p or broadcast receiver gets. Nothing for shm. */
void dcp_gdlv_pack(const dcp_gplan *g, const dcp_gdlv *d, const void *unit, void *out);

/* Place n fragments from buf (fragment i's bytes at buf + f[i].img) into
 * their requests' destinations r->v[req].dest, host memory, with
 * dcp_op_place. */
void dcp_gfrag_place(const dcp_gplan *g, const dcp_greqs *r, const dcp_gfrag *f, size_t n,
                     const void *buf);

/* Read n fragments straight from the source into their requests' host
 * destinations (dcp_plan_execute of the fragments' ops): how a rank on the
 * reader's node takes a DCP_GDLV_SHM delivery when the node shares the page
 * cache rather than a staging buffer. Called after the reader's own read of
 * the unit, the bytes come from the page cache: storage is still read once,
 * and each byte is copied once, straight into the destination. */
int dcp_gfrag_read(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_greqs *r, const dcp_gfrag *f, size_t n,
                   dcp_error *err);

/* Where fragment f lands in its request's buffer (bytes from its start). */
static inline uint64_t dcp_gfrag_dest(const dcp_gplan *g, const dcp_gfrag *f)
{
    const dcp_op *op = &g->gops[f->gop].op;
    return op->dest_offset + (f->src - op->src_offset) / op->elem_size * op->dest_stride;
}

/* The op of f restricted to f's bytes. */
static inline dcp_op dcp_gfrag_op(const dcp_gplan *g, const dcp_gfrag *f)
{
    dcp_op sub = g->gops[f->gop].op;
    sub.dest_offset = dcp_gfrag_dest(g, f);
    sub.src_offset = f->src;
    sub.length = f->len;
    return sub;
}

#ifdef __cplusplus
}
#endif
#endif /* DCP_GPLAN_H */
