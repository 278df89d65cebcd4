/* libdcpload internals, shared by the loader's source files. Not installed.
 *
 * The global plan itself is libdcp's (dcp_gplan.h: requests, units,
 * fragments, deliveries, the global order), shared with other transports;
 * this library executes it over MPI. The flow of dcp_load (api.c):
 *   request.c   validate this rank's regions, agree on errors, allgather every
 *               rank's call header and encoded requests (dcp_greqs_encode),
 *               compare the headers and decode the requests
 *               (dcp_greqs_decode);
 *   api.c       every rank builds the same plan (dcp_gplan_build);
 *   groups.c    the broadcast groups' sub-communicators (ldi_groups_create);
 *   exec.c      run it: an I/O thread reads this rank's units into staging
 *               buffers (or straight into the destination) with
 *               dcp_gunit_read, the main thread posts sends, broadcasts and
 *               receives in the global order;
 *   ipc.c       for CUDA destinations on one node: device staging pools
 *               shared by IPC handles (issue 16), else host messages;
 *   dest.c      the final copy: host dcp_gfrag_place, or device copies
 *               through the device layer (device.h: CUDA, or the fake);
 *   mapped.c    with DCP_LOAD_MAP, cached units for CUDA destinations
 *               copied by the device straight out of the page cache.
 */
#ifndef DCP_LOAD_INTERNAL_H
#define DCP_LOAD_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <mpi.h>

#include "dcp.h"
#include "dcp_gplan.h"
#include "dcp_load.h"

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

/* What every rank of a call must pass alike: the options after defaults and
 * the checkpoint's identity (ldi_identity). Sent ahead of the requests. */
typedef struct ldi_call {
    uint64_t flags, nstaging, staging;
    uint64_t identity;
} ldi_call;
/* Local: a cheap identity of ck (its data files' names and sizes, entry
 * count, .metadata size). */
int ldi_identity(dcp_checkpoint *ck, uint64_t *out, dcp_error *err);
/* Collective, once every rank saw that rank rk's identity is not rank 0's:
 * "dcp_load: rank RK passes another checkpoint than rank 0: ITS NAME (rank
 * 0: NAME): HOW" in err on every rank, HOW the first data file whose size
 * differs or that one of them lacks, else .metadata's size or the entry
 * counts (a node-local copy cut short is named, not only "another"). Rank 0
 * sends its names and sizes to rank rk alone (at most 1 MiB of them; past
 * that HOW may be missing); never fails (MPI errors are fatal). */
void ldi_identity_diff(MPI_Comm comm, dcp_checkpoint *ck, int rk, dcp_error *err);

/* Check this rank's regions against the checkpoint (unknown key, ndim, box,
 * dtype, dest) and CUDA availability. Local; the caller agrees. */
int ldi_check_regions(dcp_checkpoint *ck, const dcp_load_region *regions, size_t n, int cuda_ok,
                      int device, const char *cuda_msg, dcp_error *err);
/* Collective: allgather every rank's call header and regions; fail on every
 * rank (LDI_AGREED) when a rank passes other options or another checkpoint
 * than rank 0; resolve the requests against ck. Local failures (a peer's key
 * unknown here) are returned as -1, not agreed. */
int ldi_exchange(MPI_Comm comm, dcp_checkpoint *ck, const ldi_call *call, const dcp_load_region *regions,
                 size_t n, dcp_greqs *out, dcp_error *err);

/* ---------------------------------------------------------------- global plan */

/* Collective: create the sub-communicators of the plan's broadcast groups
 * this rank is in (comms[i] for group i; MPI_COMM_NULL where this rank is no
 * member; a group of every rank is comm itself). A plan has at most
 * DCP_GPLAN_MAX_GROUPS groups, so comms needs no allocation and this cannot
 * fail locally; MPI errors are fatal on comm, so the creations cannot fail
 * half-way either. */
void ldi_groups_create(MPI_Comm comm, const dcp_gplan *g, MPI_Comm comms[DCP_GPLAN_MAX_GROUPS]);
/* Free them (before the plan: g tells which are comm itself). */
void ldi_groups_free(const dcp_gplan *g, MPI_Comm comms[DCP_GPLAN_MAX_GROUPS]);

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
 * requests' destinations. buf is host memory, or with src_dev device
 * memory (a device staging slot, this rank's or a node peer's mapped by
 * IPC; only CUDA destinations then). For CUDA, copies from buf run on a
 * stream and ldi_dest_fence(slot) waits until buf may be reused; slot -1
 * waits at once. */
int ldi_dest_place(ldi_dest *d, const dcp_gplan *g, const dcp_greqs *r, const dcp_gfrag *f, size_t n,
                   const unsigned char *buf, int src_dev, int slot, dcp_error *err);
/* Copy n bytes of a host staging slot to device memory dev (its device
 * twin), asynchronously; ldi_dest_fence(slot) waits for it. */
int ldi_dest_stage(ldi_dest *d, void *dev, const void *host, size_t n, int slot, dcp_error *err);
int ldi_dest_fence(ldi_dest *d, int slot, dcp_error *err);
/* Zero a request's buffer (plans with uncovered parts). */
int ldi_dest_zero(ldi_dest *d, const dcp_greq *q, dcp_error *err);
/* Wait for every outstanding copy. */
int ldi_dest_finish(ldi_dest *d, dcp_error *err);
/* CUDA at run time, local: the device of node-local rank `local` (modulo the
 * device count). Returns 0, or -1 with the reason in msg. */
int ldi_cuda_pick(int local, int *device, char *msg, size_t cap);
/* Local: is p memory of `device` (or managed)? 0 or -1 with the reason in
 * msg. Queried with `device` current; the thread's device is restored. */
int ldi_cuda_check_ptr(const void *p, int device, char *msg, size_t cap);

/* ---------------------------------------------------------------- mapped units (mapped.c) */

struct ldi_devops;
/* A unit's stored bytes mapped from its shard file and registered with the
 * device layer; base NULL when none. */
typedef struct ldi_map {
    void *base;
    size_t len;
} ldi_map;
/* Local: map unit u read-only when all of it is in the page cache and
 * register it for device copies (ops: the device layer). 1 with *at the
 * unit's first byte; 0 when not (read it as usual), never an error. */
int ldi_map_unit(dcp_checkpoint *ck, const dcp_gplan *g, const dcp_gunit *u, const struct ldi_devops *ops,
                 ldi_map *m, const unsigned char **at);
/* Unregister and unmap, once no copy reads it any more. */
void ldi_map_release(const struct ldi_devops *ops, ldi_map *m);
/* The device layer of d's CUDA path, NULL for host destinations. */
const struct ldi_devops *ldi_dest_ops(const ldi_dest *d);

/* ---------------------------------------------------------------- device IPC (ipc.c) */

struct ldi_devops;
/* A node's device staging pools, shared by IPC for one call. */
typedef struct ldi_ipc {
    int active;                     /* ldi_ipc_setup ran: ldi_ipc_free is collective on node */
    const struct ldi_devops *ops;   /* the device layer, once the rank's device is bound */
    MPI_Comm node;
    int device, nlocal;
    unsigned nslots;                /* slots of slot_bytes in every pool (the staging options) */
    size_t slot_bytes;
    unsigned char *pool;            /* this rank's pool; NULL when it reads no unit peers share */
    unsigned char **peer;           /* per node rank: its pool mapped here (NULL: none, or this rank) */
} ldi_ipc;
/* Local: can the plan's node-local deliveries run device to device? 0 with
 * the reason in why when not. */
int ldi_ipc_plan_ok(const dcp_gplan *g, char *why, size_t cap);
/* Collective over comm and node: allocate this rank's device pool when it
 * reads units its node peers take (DCP_GDLV_SHM), export it, gather the
 * node's handles and map the peers' pools, with `device` current (restored
 * after). Returns 0 when every rank of comm succeeded; 1 when one failed:
 * then everything is undone on every rank and *why holds the agreed reason
 * ("rank R: ..."). Never an error: the caller falls back to host messages. */
int ldi_ipc_setup(MPI_Comm comm, MPI_Comm node, int device, const dcp_gplan *g, unsigned nslots,
                  size_t slot_bytes, ldi_ipc *ipc, dcp_error *why);
/* Unmap the peers' pools, then (a barrier on the node) free this rank's.
 * Collective over the node once set up; nothing on a zeroed ldi_ipc. */
void ldi_ipc_free(ldi_ipc *ipc);

/* ---------------------------------------------------------------- execution */

typedef struct ldi_exec_opts {
    size_t staging_bytes;
    unsigned nstaging;
    int device;              /* CUDA device for this rank's CUDA regions */
    MPI_Comm node;           /* the ranks sharing this rank's memory (plans with shm deliveries) */
    const MPI_Comm *groups;  /* per broadcast group of the plan: ldi_groups_create */
    const int *node_rank;    /* per rank of comm: its rank in its node communicator */
    const ldi_ipc *ipc;      /* set up: the plan's shm deliveries run device to device */
    int direct;              /* DCP_LOAD_DIRECT: storage reads bypass the page cache */
    int map;                 /* DCP_LOAD_MAP: cached units for CUDA destinations mapped (mapped.c) */
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
 * by processor name; also ORs every rank's flags (bits) into *any_flags and
 * ANDs them into *all_flags. */
int ldi_nodes_by_name(MPI_Comm comm, int flags, int *any_flags, int *all_flags, ldi_nodes *nd, dcp_error *err);
void ldi_nodes_free(ldi_nodes *nd);

int ldi_execute(MPI_Comm comm, dcp_checkpoint *ck, const dcp_greqs *reqs, const dcp_gplan *g,
                const ldi_exec_opts *o, dcp_load_stats *st, dcp_error *err);

/* dcp_load's two symbol versions (api.c). */
int ldi_load_0_2(MPI_Comm comm, dcp_checkpoint *ck, const dcp_load_region *regions, size_t nregions,
                 const dcp_load_options *opts, dcp_load_stats *stats, dcp_error *err);
int ldi_load_0_1(MPI_Comm comm, dcp_checkpoint *ck, const dcp_load_region *regions, size_t nregions,
                 const void *opts, void *stats, dcp_error *err);

/* Every rank reads its own needs, whole records (DCP_LOAD_INDEPENDENT). */
int ldi_independent(dcp_checkpoint *ck, const dcp_greqs *reqs, int me, dcp_load_stats *st,
                    dcp_error *err);

/* ---------------------------------------------------------------- MPI helpers */

/* Send (broadcast) the spans of buf as one message: contiguous, or an
 * hindexed datatype built in len and disp (room for ns values each). Every
 * span is at most LDI_MSG_MAX bytes (a unit's size). */
void ldi_isend_spans(const unsigned char *buf, const dcp_gspan *s, size_t ns, int peer, MPI_Comm comm,
                     int *len, MPI_Aint *disp, MPI_Request *req);
void ldi_ibcast_spans(unsigned char *buf, const dcp_gspan *s, size_t ns, int root, MPI_Comm comm,
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
