/* libdcpload: load a PyTorch Distributed Checkpoint collectively over MPI.
 *
 * Every rank of a communicator passes the regions of the tensors it owns (in
 * any sharding, not necessarily the one the checkpoint was saved with) and
 * memory it has already allocated, host or CUDA; one collective call fills it
 * in place. All ranks build the same global plan from everyone's requests:
 * each needed byte range of storage is read once, by one rank, and delivered
 * to every rank that needs it (a local copy, a point-to-point message, or a
 * broadcast on a sub-communicator when several ranks on other nodes need
 * the same bytes; optionally, ranks on the reader's node copy them straight
 * out of its staging buffer in node shared memory). When every rank's
 * destinations are CUDA memory, ranks on the reader's node take their bytes
 * device to device out of its device staging buffer (CUDA IPC), falling
 * back to host messages where IPC cannot run (dcp_load_stats.delivery).
 *
 * Errors are collective: an unknown key, a region outside its tensor, a dtype
 * mismatch, a failed read, an unusable CUDA destination, other options or
 * another checkpoint on any rank makes the call return -1 on every rank with
 * the same message ("rank R: ...").
 *
 * Link with -ldcpload -ldcp and MPI (MPICH). The library starts one I/O
 * thread per call that never calls MPI: initialise MPI with at least
 * MPI_THREAD_FUNNELED (with MPI_THREAD_SINGLE reads are not overlapped).
 */
#ifndef DCP_LOAD_H
#define DCP_LOAD_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a region's destination buffer lives. */
typedef enum dcp_load_mem {
    DCP_LOAD_HOST = 0,
    DCP_LOAD_CUDA = 1       /* device memory of the device the loader picks (dcp_load_cuda_device) */
} dcp_load_mem;

/* One box of one tensor for this rank: [offsets, offsets+lengths) of the
 * global tensor `key`, written in C order to dest (prod(lengths) elements of
 * dtype). A bytes item is requested with ndim 0 and dtype DCP_UINT8 (or
 * DCP_DTYPE_INVALID); dest then receives its whole stored bytes (size them
 * with dcp_entry_nbytes). */
typedef struct dcp_load_region {
    const char *key;
    dcp_dtype dtype;          /* must equal the stored dtype; DCP_DTYPE_INVALID accepts it */
    int ndim;                 /* must equal the tensor's ndim (0 for 0-d tensors) */
    const int64_t *offsets;   /* ndim values (may be NULL when ndim is 0) */
    const int64_t *lengths;   /* ndim values */
    void *dest;               /* may be NULL for an empty region */
    dcp_load_mem mem;
} dcp_load_region;

/* Per-rank statistics of one call. Sums over ranks: bytes_sent equals
 * bytes_received; bytes_read equals bytes_unique (each byte read once).
 * Phases: exchange and plan run one after the other; then reading, delivery
 * and placement overlap, so seconds_read, seconds_deliver and seconds_place
 * are busy times inside seconds_transfer, not a partition of it. */
typedef struct dcp_load_stats {
    uint64_t bytes_read;        /* data bytes this rank fetched from storage (decoded size; with
                                   DCP_LOAD_INDEPENDENT whole plain records, and the decoded bytes
                                   each op needs of a zstd record) */
    uint64_t bytes_sent;        /* payload delivered to other ranks: by message, broadcast (once per
                                   receiving rank) or through node shared memory */
    uint64_t bytes_received;
    uint64_t bytes_local;       /* bytes placed from this rank's own reads */
    uint64_t bytes_loaded;      /* bytes of this rank's regions */
    uint64_t bytes_unique;      /* unique storage bytes all ranks need (same on every rank) */
    uint64_t bytes_shm;         /* of bytes_received: copied from a node peer's shared staging buffer
                                   (DCP_LOAD_SHM) */
    uint64_t reads;             /* storage reads issued by this rank */
    uint64_t messages;          /* point-to-point sends and broadcast roots of this rank */
    uint64_t broadcasts;        /* of messages: broadcast roots */
    double seconds_exchange;    /* validating and exchanging requests */
    double seconds_plan;        /* building the global plan and sub-communicators */
    double seconds_read;        /* the I/O thread's time in storage reads */
    double seconds_deliver;     /* the main thread's time posting and completing transfers (MPI) */
    double seconds_place;       /* time in the final copies into the destinations (host or CUDA) */
    double seconds_transfer;    /* reading, delivering and placing, until all ranks finish */
    double seconds_total;       /* the whole call */
    /* Since DCP_LOAD_0.2 (a program built against the 0.1 header gets the
     * fields above only): CUDA destinations of ranks on one node. */
    uint64_t bytes_ipc;         /* of bytes_received: copied device to device out of a node peer's
                                   device staging buffer, mapped by CUDA IPC */
    uint64_t bytes_staged;      /* copied host to device into this rank's device staging buffer: the
                                   units node peers take by IPC, once each */
    int delivery;               /* DCP_LOAD_DELIVERY_*: how node peers got their bytes (same on every rank) */
    int mpi_cuda_aware;         /* the MPI library says it moves device buffers itself: 1 yes, 0 no,
                                   -1 cannot tell. Informational: messages (across nodes, and within
                                   one on the host path) are always sent from host staging buffers */
    char fallback[256];         /* with DCP_LOAD_DELIVERY_FALLBACK: why ("rank R: reason"), else "" */
} dcp_load_stats;

/* How bytes reached ranks on the reader's node (dcp_load_stats.delivery). */
enum {
    DCP_LOAD_DELIVERY_HOST = 0,      /* host messages (or DCP_LOAD_SHM): no device path was asked */
    DCP_LOAD_DELIVERY_IPC = 1,       /* every destination CUDA memory: device staging shared by IPC */
    DCP_LOAD_DELIVERY_FALLBACK = 2   /* the device path was asked but could not run: host messages */
};

/* Option flags. */
enum {
    /* Deliver with point-to-point messages only (no broadcasts). */
    DCP_LOAD_NO_BCAST = 1u << 0,
    /* Do not read collectively: every rank reads what it needs itself, whole
     * records, one after another, as torch.distributed.checkpoint's default
     * reader does. For comparisons; errors are still agreed collectively. */
    DCP_LOAD_INDEPENDENT = 1u << 1,
    /* Ranks on the reader's node copy the bytes they need straight out of
     * its staging buffer, in node shared memory (fewer copies; measured
     * slower than messages on an oversubscribed node, so not the default). */
    DCP_LOAD_SHM = 1u << 2,
    /* Broadcast groups also among ranks of one node (by default ranks on
     * the reader's node get messages: MPICH's broadcast measured slower on
     * one node). For comparisons and tests. */
    DCP_LOAD_BCAST_LOCAL = 1u << 3,
    /* CUDA destinations of node peers by host messages, as for host memory
     * (it wins over DCP_LOAD_DEVICE_DELIVERY when both are set). */
    DCP_LOAD_HOST_DELIVERY = 1u << 4,
    /* When every rank's destinations are CUDA memory, ranks on the reader's
     * node take their bytes device to device out of its device staging
     * buffer (CUDA IPC). The default since it was verified and measured on
     * an H100 (issue 16); the flag only says so explicitly. */
    DCP_LOAD_DEVICE_DELIVERY = 1u << 5,
    /* Storage reads bypass the page cache (O_DIRECT) for units not in it:
     * for files read once from a device. A unit that lands whole in one
     * host destination agreeing with its file offset modulo
     * DCP_DIRECT_ALIGN is read straight into it (dcp_gunit_read_direct_at),
     * its pages faulted in ahead of the readers; others go through staging
     * (one more copy, also when cached). On the development VM one rank
     * loaded evicted files into destinations placed to agree (dcpload) as
     * fast as parallel cats. Not with DCP_LOAD_SHM's host window; files
     * that refuse O_DIRECT are read as usual. */
    DCP_LOAD_DIRECT = 1u << 6,
    /* CUDA destinations: a unit this rank reads whose every page is in the
     * page cache is mapped from its shard file, page-locked read-only for
     * the device (cudaHostRegisterReadOnly) and copied to the GPU straight
     * from there, with no CPU copy into staging; other units as usual. Not
     * yet measured on a GPU, so not the default (issue 16); host
     * destinations and DCP_LOAD_SHM's host window ignore it. */
    DCP_LOAD_MAP = 1u << 7
};

typedef struct dcp_load_options {
    size_t size;                /* sizeof(dcp_load_options): DCP_LOAD_OPTIONS_INIT (dcp.h, options) */
    unsigned flags;             /* DCP_LOAD_* */
    size_t staging_bytes;       /* size of each staging buffer; 0: 16 MiB; at most 1 GiB */
    unsigned nstaging;          /* buffers for reads and as many for receives; 0: 4 */
} dcp_load_options;
#define DCP_LOAD_OPTIONS_INIT {.size = sizeof(dcp_load_options)}

/* Open a checkpoint on every rank of comm. Collective: if any rank fails,
 * every rank returns -1 with that rank's message and no checkpoint. */
int dcp_load_open(MPI_Comm comm, const char *path, unsigned flags, dcp_checkpoint **out,
                  dcp_error *err);

/* Fill this rank's regions. Collective over comm; every rank passes the same
 * checkpoint (opened on its own) and its own regions (any number, also 0).
 * opts and stats may be NULL; opts must be the same on every rank (checked,
 * as is the checkpoint: a rank passing others fails the call everywhere).
 * MPI errors are fatal: the call runs on a duplicate of comm with
 * MPI_ERRORS_ARE_FATAL, whatever comm's handler is. */
int dcp_load(MPI_Comm comm, dcp_checkpoint *ck, const dcp_load_region *regions, size_t nregions,
             const dcp_load_options *opts, dcp_load_stats *stats, dcp_error *err);

/* The CUDA device this rank uses for DCP_LOAD_CUDA destinations: its rank
 * among the ranks of its node, modulo the number of devices. Collective
 * (splits comm by node). Returns -1 with a message when the library was
 * built without CUDA or no device is usable; the result may differ between
 * ranks, so it is not agreed. */
int dcp_load_cuda_device(MPI_Comm comm, int *device, dcp_error *err);

/* Whether this library was built with the CUDA path. */
int dcp_load_have_cuda(void);

#ifdef __cplusplus
}
#endif
#endif /* DCP_LOAD_H */
