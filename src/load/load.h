/* libdcpload internals, shared by the loader's source files. Not installed.
 *
 * The flow of dcp_load (api.c):
 *   request.c   validate this rank's regions, agree on errors, allgather every
 *               rank's requests (key, box, dtype) and resolve them;
 *   gplan.c     every rank plans every request with the core planner and builds
 *               the same global plan: units (source byte ranges read by one
 *               reader rank), fragments (which part of which op each rank needs
 *               from a unit) and deliveries (p2p or broadcast);
 *   exec.c      run it: an I/O thread reads this rank's units into staging
 *               buffers (or straight into the destination), the main thread
 *               posts sends, broadcasts and receives in the global order;
 *   dest.c      the final copy: host memcpy/dcp_op_place, or CUDA copies.
 */
#ifndef DCP_LOAD_INTERNAL_H
#define DCP_LOAD_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "dcp.h"
#include "dcp_load.h"

#define LDI_MAX_NDIM 64
#define LDI_MAX_SUBCOMMS 64                  /* distinct broadcast groups; more go p2p */
#define LDI_MSG_MAX ((uint64_t)1 << 30)      /* the largest staging size: a unit is one MPI message */
#define LDI_STAGING_DEFAULT ((size_t)16 << 20)
#define LDI_NSTAGING_DEFAULT 4u

/* ---------------------------------------------------------------- errors */

int ldi_err(dcp_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The return value of an error that every rank already has, with the same
 * message (an agreed one): agreeing on it again must not name a rank again. */
#define LDI_AGREED (-2)
/* Collective: every rank passes its status (0; -1 with err filled, a local
 * error; or LDI_AGREED). Returns 0 when all succeeded; otherwise LDI_AGREED
 * on every rank with the message of the lowest failing rank, prefixed
 * "rank R: " when comm has >1 rank and that rank's error was local. */
int ldi_agree(MPI_Comm comm, int rc, dcp_error *err);

double ldi_now(void);
/* The checkpoint's name in messages: its folder, or its file when it is a
 * single torch.save or safetensors file. */
const char *ldi_name(const dcp_checkpoint *ck);

/* ---------------------------------------------------------------- requests */

/* One region request of one rank, the same on every rank after the exchange. */
typedef struct ldi_req {
    int rank;
    const dcp_entry *e;
    dcp_dtype dtype;         /* the plan's dtype (stored) */
    int ndim;
    int64_t *off, *len;      /* into the request table's storage */
    uint64_t nbytes;
    /* filled on the owning rank only */
    void *dest;
    int mem;                 /* dcp_load_mem */
} ldi_req;

typedef struct ldi_reqs {
    ldi_req *v;
    size_t n;
    int64_t *dims;           /* 2*ndim values per request */
    size_t *first;           /* first[r]: index of rank r's first request; size nranks+1 */
} ldi_reqs;

/* What every rank of a call must pass alike: the options after defaults and
 * the checkpoint's identity (ldi_identity). Sent ahead of the requests. */
typedef struct ldi_call {
    uint64_t flags, nstaging, staging;
    uint64_t identity;
} ldi_call;
/* Local: a cheap identity of ck (its data files' names and sizes, entry
 * count, .metadata size). */
int ldi_identity(dcp_checkpoint *ck, uint64_t *out, dcp_error *err);

/* Check this rank's regions against the checkpoint (unknown key, ndim, box,
 * dtype, dest) and CUDA availability. Local; the caller agrees. */
int ldi_check_regions(dcp_checkpoint *ck, const dcp_load_region *regions, size_t n, int cuda_ok,
                      int device, const char *cuda_msg, dcp_error *err);
/* Collective: allgather every rank's call header and regions; fail on every
 * rank (LDI_AGREED) when a rank passes other options or another checkpoint
 * than rank 0; resolve the requests against ck. Local failures (a peer's key
 * unknown here) are returned as -1, not agreed. */
int ldi_exchange(MPI_Comm comm, dcp_checkpoint *ck, const ldi_call *call, const dcp_load_region *regions,
                 size_t n, ldi_reqs *out, dcp_error *err);
void ldi_reqs_free(ldi_reqs *r);

/* ---------------------------------------------------------------- global plan */

/* A source stream: a data file, or one decoded (zstd) blob of it. */
typedef struct ldi_space {
    uint32_t file;
    int decoded;
    dcp_blob blob;           /* decoded spaces: the blob */
    const dcp_entry *e;      /* an entry reading it, for messages */
} ldi_space;

/* One op of one rank's request. */
typedef struct ldi_gop {
    dcp_op op;
    uint32_t req;            /* index into ldi_reqs.v */
    uint32_t space;
    int rank;
    dcp_dtype dtype;         /* the plan's element type, for dcp_op_place */
} ldi_gop;

/* The part [src, src+len) of op gop a rank needs from a unit; img is where
 * those bytes are in the buffer that rank holds for the unit (the reader: the
 * unit read at offset 0; a receiver: the packed image of its delivery). */
typedef struct ldi_frag {
    uint32_t gop;
    int rank;
    uint64_t src, len;
    uint64_t img;
} ldi_frag;

/* Bytes [a, b) of a unit, relative to its start. */
typedef struct ldi_span {
    uint64_t a, b;
} ldi_span;

enum { LDI_P2P = 1, LDI_BCAST = 2, LDI_SHM = 3 };

/* One delivery of a unit from its reader: the packed spans (cov) go to one
 * rank (p2p) or to a group (a broadcast on sub-communicator `group`); or a
 * rank on the reader's node copies its fragments straight out of the
 * reader's staging buffer in node shared memory (shm: no spans; the rank's
 * fragments keep their offsets in the unit). */
typedef struct ldi_dlv {
    int kind;
    int peer;                /* p2p, shm: the receiving rank */
    int group;               /* bcast: index into ldi_gplan.groups */
    uint64_t bytes;          /* image size: sum of spans */
    size_t cov0, ncov;       /* into ldi_gplan.spans */
} ldi_dlv;

typedef struct ldi_unit {
    uint32_t space;
    uint64_t off, len;       /* source range */
    int reader;
    uint64_t seq;            /* position in the global order */
    size_t frag0, nfrag;     /* fragments sorted by (rank, src) */
    size_t dlv0, ndlv;
} ldi_unit;

/* A broadcast group: sorted ranks of comm, the reader among them. */
typedef struct ldi_group {
    size_t rank0, n;         /* into ldi_gplan.group_ranks */
    MPI_Comm comm;           /* created for members, MPI_COMM_NULL elsewhere */
} ldi_group;

typedef struct ldi_gplan {
    int nranks, me;
    ldi_space *spaces;
    size_t nspaces;
    ldi_gop *gops;
    size_t ngops;
    unsigned char *zero;     /* per request: parts are covered by no chunk, zero it first */
    ldi_unit *units;         /* in global order (seq) */
    size_t nunits;
    ldi_frag *frags;
    size_t nfrags;
    ldi_dlv *dlvs;
    size_t ndlvs;
    ldi_span *spans;
    size_t nspans;
    ldi_group *groups;
    size_t ngroups;
    int *group_ranks;
    size_t ngroup_ranks;
    uint64_t unique_bytes;
    uint64_t *load;          /* bytes each rank reads */
    int has_shm;             /* some delivery is through shared memory */
} ldi_gplan;

typedef struct ldi_plan_opts {
    uint64_t unit_max;       /* largest unit: the staging buffer size */
    int no_bcast;
    const int *node;         /* per rank: its node (the ranks sharing memory) */
    int shm;                 /* ranks on the reader's node copy out of its shared staging */
    int bcast_local;         /* broadcast groups also on the reader's node */
} ldi_plan_opts;

/* Build the global plan from the exchanged requests. Deterministic: every
 * rank computes the same plan. Local (no MPI). */
int ldi_gplan_build(dcp_checkpoint *ck, const ldi_reqs *reqs, int nranks, int me,
                    const ldi_plan_opts *o, ldi_gplan *g, dcp_error *err);
/* Collective: create the sub-communicators of the groups this rank is in
 * (MPI errors are fatal on comm, so this cannot fail half-way). */
void ldi_gplan_groups(MPI_Comm comm, ldi_gplan *g);
void ldi_gplan_free(ldi_gplan *g);

/* Where fragment f lands in its request's buffer (bytes from its start). */
static inline uint64_t ldi_frag_dest(const ldi_gplan *g, const ldi_frag *f)
{
    const dcp_op *op = &g->gops[f->gop].op;
    return op->dest_offset + (f->src - op->src_offset) / op->elem_size * op->dest_stride;
}

/* The op of f restricted to f's bytes. */
static inline dcp_op ldi_frag_op(const ldi_gplan *g, const ldi_frag *f)
{
    dcp_op sub = g->gops[f->gop].op;
    sub.dest_offset = ldi_frag_dest(g, f);
    sub.src_offset = f->src;
    sub.length = f->len;
    return sub;
}

/* ---------------------------------------------------------------- destinations */

typedef struct ldi_dest ldi_dest;

/* Set up the copy engine: with need_cuda, bind this thread to `device`
 * (until ldi_dest_close, which gives it back its device) and create streams
 * and one event per staging slot (nslots). Local. */
int ldi_dest_open(int need_cuda, int device, int nslots, ldi_dest **out, dcp_error *err);
void ldi_dest_close(ldi_dest *d);
/* Staging buffers: pinned host memory when CUDA copies read them. */
void *ldi_staging_alloc(ldi_dest *d, size_t n);
void ldi_staging_free(ldi_dest *d, void *p);
/* Make a shared staging buffer pinned for CUDA copies (best effort: an
 * unregistered buffer is copied from correctly, only more slowly). */
void ldi_staging_register(ldi_dest *d, void *p, size_t n);
void ldi_staging_unregister(ldi_dest *d, void *p);
/* Place fragments from buf (f->img is the offset of each) into their
 * requests' destinations. For CUDA, copies from buf run on a stream and
 * ldi_dest_fence(slot) waits until buf may be reused; slot -1 waits at once. */
int ldi_dest_place(ldi_dest *d, const ldi_gplan *g, const ldi_reqs *r, const ldi_frag *f, size_t n,
                   const unsigned char *buf, int slot, dcp_error *err);
int ldi_dest_fence(ldi_dest *d, int slot, dcp_error *err);
/* Zero a request's buffer (plans with uncovered parts). */
int ldi_dest_zero(ldi_dest *d, const ldi_req *q, dcp_error *err);
/* Wait for every outstanding copy. */
int ldi_dest_finish(ldi_dest *d, dcp_error *err);
/* CUDA at run time, local: the device of node-local rank `local` (modulo the
 * device count). Returns 0, or -1 with the reason in msg. */
int ldi_cuda_pick(int local, int *device, char *msg, size_t cap);
/* Local: is p memory of `device` (or managed)? 0 or -1 with the reason in
 * msg. Queried with `device` current; the thread's device is restored. */
int ldi_cuda_check_ptr(const void *p, int device, char *msg, size_t cap);

/* ---------------------------------------------------------------- execution */

typedef struct ldi_exec_opts {
    size_t staging_bytes;
    unsigned nstaging;
    int device;              /* CUDA device for this rank's CUDA regions */
    MPI_Comm node;           /* the ranks sharing this rank's memory (plans with shm deliveries) */
    const int *node_rank;    /* per rank of comm: its rank in its node communicator */
} ldi_exec_opts;

/* The ranks sharing memory with this one: a node communicator, and per rank
 * of comm its node (the lowest rank of comm on it) and its rank on it.
 * Collective. */
typedef struct ldi_nodes {
    MPI_Comm comm;
    int *node, *node_rank;
    int local, nlocal;       /* this rank's rank on its node, and the node's size */
} ldi_nodes;
int ldi_nodes_get(MPI_Comm comm, ldi_nodes *nd, dcp_error *err);
/* The same without the communicator (comm stays MPI_COMM_NULL, nlocal 1),
 * by processor name; also ORs every rank's flag into *any_flag. */
int ldi_nodes_by_name(MPI_Comm comm, int flag, int *any_flag, ldi_nodes *nd, dcp_error *err);
void ldi_nodes_free(ldi_nodes *nd);

int ldi_execute(MPI_Comm comm, dcp_checkpoint *ck, const ldi_reqs *reqs, const ldi_gplan *g,
                const ldi_exec_opts *o, dcp_load_stats *st, dcp_error *err);

/* Every rank reads its own needs, whole records (DCP_LOAD_INDEPENDENT). */
int ldi_independent(dcp_checkpoint *ck, const ldi_reqs *reqs, int me, dcp_load_stats *st,
                    dcp_error *err);

/* ---------------------------------------------------------------- MPI helpers */

/* Send (broadcast) the spans of buf as one message: contiguous, or an
 * hindexed datatype built in len and disp (room for ns values each). Every
 * span is at most LDI_MSG_MAX bytes (a unit's size). */
void ldi_isend_spans(const unsigned char *buf, const ldi_span *s, size_t ns, int peer, MPI_Comm comm,
                     int *len, MPI_Aint *disp, MPI_Request *req);
void ldi_ibcast_spans(unsigned char *buf, const ldi_span *s, size_t ns, int root, MPI_Comm comm,
                      int *len, MPI_Aint *disp, MPI_Request *req);
/* MPI_Waitall, but giving the CPU away between polls: MPICH's waits spin,
 * and with more ranks and I/O threads than cores (or other jobs on them) a
 * spinning rank takes the time the ranks it waits for need to read or copy. */
int ldi_wait(int n, MPI_Request *reqs, MPI_Status *stat);
#define LDI_NAP_AFTER 200e-6   /* seconds of yielding before ldi_wait naps */
#define LDI_NAP_NS 50000L      /* one nap */
/* The collectives of a call, nonblocking and completed with ldi_wait (with
 * 4 ranks on 2 cores a blocking allgather measured 15 ms, this 3 ms). */
int ldi_allreduce_int(const int *in, int *out, MPI_Op op, MPI_Comm comm);
int ldi_allgather(const void *in, int count, MPI_Datatype t, void *out, MPI_Comm comm);
int ldi_allgatherv(const void *in, int count, void *out, const int *counts, const int *displs, MPI_Comm comm);
int ldi_bcast(void *buf, int count, int root, MPI_Comm comm);
int ldi_comm_dup(MPI_Comm comm, MPI_Comm *out);

#endif
