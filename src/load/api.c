/* The public entry points of libdcpload: dcp_load_open, dcp_load and the
 * CUDA device query. Each step that can fail on some ranks is followed by a
 * collective agreement, so every rank leaves with the same result. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dcp_file.h"   /* dcp_open_file, dcp_format_guess */
#include "load.h"
#include "sized_opts.h"

/* The format of a single file: by its suffix, else by its first bytes (a
 * zip archive is torch.save; an 8-byte header length then '{' is safetensors). */
static dcp_format file_format(const char *path, uint64_t size)
{
    dcp_format f = dcp_format_guess(path);
    if (f == DCP_FORMAT_TORCH_SAVE || f == DCP_FORMAT_SAFETENSORS)
        return f;
    unsigned char head[9];
    FILE *fp = fopen(path, "rb");
    size_t got = fp ? fread(head, 1, sizeof head, fp) : 0;
    if (fp)
        fclose(fp);
    if (got >= 4 && !memcmp(head, "PK\3\4", 4))
        return DCP_FORMAT_TORCH_SAVE;
    if (got == sizeof head && head[8] == '{') {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--)
            n = n << 8 | head[i];
        if (n <= size - 8)
            return DCP_FORMAT_SAFETENSORS;
    }
    return DCP_FORMAT_AUTO;
}

/* A checkpoint folder, or one torch.save / safetensors file (dcp_open_file
 * models it as a checkpoint of one data file: each tensor a chunk over its
 * storage record, strides and shared storages included). */
static int open_any(const char *path, unsigned flags, dcp_checkpoint **ck, dcp_error *err)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        dcp_format f = file_format(path, (uint64_t)st.st_size);
        if (f == DCP_FORMAT_AUTO)
            return ldi_err(err, EINVAL, "%s: a file, but neither a torch.save nor a safetensors file (a DCP checkpoint is "
                          "the folder that holds .metadata or __R.metadata files)", path);
        return dcp_open_file(path, f, ck, NULL, err);
    }
    return dcp_open(path, flags, ck, err);
}

/* A private duplicate of comm on which MPI errors are fatal: our messages
 * never match the caller's, and a failed MPI call aborts the job instead of
 * leaving its peers waiting (see dcp_load(3): no agreement over the same
 * communicator could repair a half-done collective). The duplication itself
 * runs under comm's own handler. */
static MPI_Comm private_comm(MPI_Comm comm)
{
    MPI_Comm c;
    ldi_comm_dup(comm, &c);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_ARE_FATAL);
    return c;
}

int dcp_load_open(MPI_Comm comm, const char *path, unsigned flags, dcp_checkpoint **out,
                  dcp_error *err)
{
    MPI_Comm c = private_comm(comm);
    dcp_checkpoint *ck = NULL;
    int rc = path ? open_any(path, flags, &ck, err) : ldi_err(err, EINVAL, "dcp_load_open: no path");
    rc = ldi_agree(c, rc, err);
    MPI_Comm_free(&c);
    if (rc < 0) {
        dcp_close(ck);
        *out = NULL;
        return -1;
    }
    *out = ck;
    return 0;
}

int dcp_load_cuda_device(MPI_Comm comm, int *device, dcp_error *err)
{
    char msg[256];
    ldi_nodes nd;
    MPI_Comm c = private_comm(comm);
    int rc = ldi_nodes_get(c, &nd, err);
    MPI_Comm_free(&c);
    if (rc < 0)
        return -1;
    rc = ldi_cuda_pick(nd.local, device, msg, sizeof msg);
    ldi_nodes_free(&nd);
    return rc < 0 ? ldi_err(err, ENODEV, "dcp_load: %s", msg) : 0;
}

/* The caller's options (NULL: the defaults) with the defaults filled in.
 * 0, or -1 with err for a size outside the rules of dcp.h (options). */
static int set_defaults(const dcp_load_options *opts, dcp_load_options *o, dcp_error *err)
{
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    /* At least the first sized layout (0.2), which ends at the field named. */
    if (opts && dcpi_sized_opts(o, sizeof *o, DCPI_OPTS_MIN(dcp_load_options, nstaging), opts, "dcp_load",
                                "DCP_LOAD_OPTIONS_INIT", err) < 0)
        return -1;
    if (!o->staging_bytes)
        o->staging_bytes = LDI_STAGING_DEFAULT;
    if (o->staging_bytes < 4096)
        o->staging_bytes = 4096;
    if (o->staging_bytes > LDI_MSG_MAX)   /* a unit is one message */
        o->staging_bytes = LDI_MSG_MAX;
    if (!o->nstaging)
        o->nstaging = LDI_NSTAGING_DEFAULT;
    if (o->nstaging > 64)
        o->nstaging = 64;
    return 0;
}

/* Does the MPI library take device buffers (CUDA-aware)? MPICH 4 answers
 * MPIX_Query_cuda_support; other libraries: unknown (-1). */
static int mpi_cuda_aware(void)
{
#if defined(MPICH_NUMVERSION) && MPICH_NUMVERSION >= 40000000
    return MPIX_Query_cuda_support() ? 1 : 0;
#else
    return -1;
#endif
}

/* The device path's plan (every destination CUDA memory, node peers): set
 * up the IPC pools; when that cannot run on some rank, plan again without
 * node-local shm deliveries (unless DCP_LOAD_SHM asked for them: its host
 * window then serves them) and say why in the stats. Collective; returns 0,
 * or LDI_AGREED when the new plan fails. */
static int device_delivery(MPI_Comm c, dcp_checkpoint *ck, const dcp_greqs *reqs, int n, int me, int device,
                           MPI_Comm node, const dcp_load_options *o, dcp_gplan_opts *po, dcp_gplan *g, ldi_ipc *ipc,
                           dcp_load_stats *st, dcp_error *err)
{
    dcp_error why = {0};
    int ok = ldi_ipc_plan_ok(g, why.msg, sizeof why.msg);   /* the same plan everywhere: the same answer */
    if (ok && g->has_shm && ldi_ipc_setup(c, node, device, g, o->nstaging, o->staging_bytes, ipc, &why) != 0)
        ok = 0;
    if (ok) {
        st->delivery = DCP_LOAD_DELIVERY_IPC;
        return 0;
    }
    st->delivery = DCP_LOAD_DELIVERY_FALLBACK;
    size_t len = strnlen(why.msg, sizeof why.msg);   /* cut to the field */
    if (len > sizeof st->fallback - 1)
        len = sizeof st->fallback - 1;
    memcpy(st->fallback, why.msg, len);
    st->fallback[len] = '\0';
    if (po->shm == ((o->flags & DCP_LOAD_SHM) != 0))
        return 0;
    po->shm = (o->flags & DCP_LOAD_SHM) != 0;
    dcp_gplan_free(g);
    int lrc = dcp_gplan_build(ck, reqs, n, me, po, g, err);
    return ldi_agree(c, lrc, err);
}

/* dcp_load (DCP_LOAD_0.2): the stats end with the device fields. */
int ldi_load_0_2(MPI_Comm comm, dcp_checkpoint *ck, const dcp_load_region *regions, size_t nregions,
                 const dcp_load_options *opts, dcp_load_stats *stats, dcp_error *err)
{
    double t0 = ldi_now();
    dcp_load_stats st;
    memset(&st, 0, sizeof st);
    dcp_error scratch;
    if (!err)
        err = &scratch;
    memset(err, 0, sizeof *err);
    dcp_load_options o;
    int bad_opts = set_defaults(opts, &o, err);   /* agreed below */

    MPI_Comm c = private_comm(comm);
    int me, n;
    MPI_Comm_rank(c, &me);
    MPI_Comm_size(c, &n);
    dcp_greqs reqs = {0};
    dcp_gplan g = {0};
    MPI_Comm groups[DCP_GPLAN_MAX_GROUPS];   /* the plan's broadcast groups (ldi_groups_create) */
    for (size_t i = 0; i < DCP_GPLAN_MAX_GROUPS; i++)
        groups[i] = MPI_COMM_NULL;
    ldi_nodes nd = {.comm = MPI_COMM_NULL};
    ldi_ipc ipc;
    memset(&ipc, 0, sizeof ipc);
    int rc = -1;

    /* which ranks share a node: by name for the plan; the node communicator
     * only for shared staging or the CUDA device of a rank. Whether any rank
     * needs it is agreed (options are compared only later, in the exchange). */
    int mine = 0, any = 0, all = 0, device = -1, cuda_ok = 0, cuda = 0, all_cuda = regions && nregions;
    for (size_t i = 0; regions && i < nregions; i++) {
        cuda |= regions[i].mem == DCP_LOAD_CUDA;
        all_cuda &= regions[i].mem == DCP_LOAD_CUDA;
    }
    st.mpi_cuda_aware = cuda ? mpi_cuda_aware() : -1;   /* asked of ranks with CUDA destinations only */
    /* bit 1: this rank needs the node communicator; bit 2: all its
     * destinations are CUDA memory (the device path needs it of every rank) */
    mine = (cuda || (o.flags & DCP_LOAD_SHM) ? 1 : 0) | (all_cuda ? 2 : 0);
    /* options outside the rules on some rank: every rank fails, before the
     * collectives whose arguments depend on them */
    if ((rc = ldi_agree(c, bad_opts, err)) < 0)
        goto out;
    int lrc = ldi_nodes_by_name(c, mine, &any, &all, &nd, err);
    if (lrc == 0 && (any & 1)) {
        ldi_nodes_free(&nd);
        lrc = ldi_nodes_get(c, &nd, err);
    }
    if ((rc = ldi_agree(c, lrc, err)) < 0)
        goto out;

    /* CUDA: the runtime is only touched on ranks asking for it */
    char cuda_msg[256] = "no CUDA destination";
    if (cuda)
        cuda_ok = ldi_cuda_pick(nd.local, &device, cuda_msg, sizeof cuda_msg) == 0;

    ldi_call call = {.flags = o.flags, .nstaging = o.nstaging, .staging = o.staging_bytes};
    lrc = ldi_identity(ck, &call.identity, err);
    if (lrc == 0)
        lrc = ldi_check_regions(ck, regions, nregions, cuda_ok, device, cuda_msg, err);
    if ((rc = ldi_agree(c, lrc, err)) < 0)
        goto out;
    lrc = ldi_exchange(c, ck, &call, regions, nregions, &reqs, err);
    if ((rc = ldi_agree(c, lrc, err)) < 0)
        goto out;
    double t1 = ldi_now();
    st.seconds_exchange = t1 - t0;
    for (size_t i = reqs.first[me]; i < reqs.first[me + 1]; i++)
        st.bytes_loaded += reqs.v[i].nbytes;

    if (o.flags & DCP_LOAD_INDEPENDENT) {
        lrc = ldi_independent(ck, &reqs, me, &st, err);
        MPI_Request breq;   /* the job ends when the slowest rank ends */
        MPI_Ibarrier(c, &breq);
        ldi_wait(1, &breq, MPI_STATUSES_IGNORE);
        st.seconds_transfer = ldi_now() - t1;
        rc = ldi_agree(c, lrc, err);
        goto out;
    }

    dcp_gplan_opts po = {.size = sizeof po,
                         .unit_max = o.staging_bytes,
                         .no_bcast = (o.flags & DCP_LOAD_NO_BCAST) != 0,
                         .node = nd.node,
                         .shm = (o.flags & DCP_LOAD_SHM) != 0,
                         .bcast_local = (o.flags & DCP_LOAD_BCAST_LOCAL) != 0};
    /* CUDA destinations on every rank: node peers take their bytes device to
     * device (ipc.c) unless host messages are asked for. Measured on an H100
     * (4 GiB replicated on 4 ranks: 0.29 s against 0.87 s by host messages). */
    int want_dev = (all & 2) && !(o.flags & DCP_LOAD_HOST_DELIVERY);
    if (want_dev)
        po.shm = 1;
    lrc = dcp_gplan_build(ck, &reqs, n, me, &po, &g, err);
    if ((rc = ldi_agree(c, lrc, err)) < 0)
        goto out;
    if (want_dev && (rc = device_delivery(c, ck, &reqs, n, me, device, nd.comm, &o, &po, &g, &ipc, &st, err)) < 0)
        goto out;
    ldi_groups_create(c, &g, groups);
    double t2 = ldi_now();
    st.seconds_plan = t2 - t1;
    st.bytes_unique = g.unique_bytes;

    ldi_exec_opts eo = {.staging_bytes = o.staging_bytes, .nstaging = o.nstaging, .device = device,
                        .node = nd.comm, .node_rank = nd.node_rank, .groups = groups,
                        .ipc = ipc.active ? &ipc : NULL, .direct = (o.flags & DCP_LOAD_DIRECT) != 0,
                        .map = (o.flags & DCP_LOAD_MAP) != 0};
    lrc = ldi_execute(c, ck, &reqs, &g, &eo, &st, err);
    rc = ldi_agree(c, lrc, err);
    st.seconds_transfer = ldi_now() - t2;
out:
    ldi_ipc_free(&ipc);   /* collective on the node; set up only where every rank reaches here */
    ldi_groups_free(&g, groups);   /* those created (all MPI_COMM_NULL until then) */
    dcp_gplan_free(&g);   /* zeroed, or freed and zeroed on a failed build */
    dcp_greqs_free(&reqs);
    ldi_nodes_free(&nd);
    MPI_Comm_free(&c);
    st.seconds_total = ldi_now() - t0;
    if (stats)
        *stats = st;
    return rc < 0 ? -1 : 0;
}

/* 0.1's dcp_load_options, before the size field. */
typedef struct load_options_0_1 {
    unsigned flags;
    size_t staging_bytes;
    unsigned nstaging;
} load_options_0_1;

/* dcp_load (DCP_LOAD_0.1): programs built against the first header pass
 * the stats without the device fields (the layout's prefix) and options
 * without a size. */
int ldi_load_0_1(MPI_Comm comm, dcp_checkpoint *ck, const dcp_load_region *regions, size_t nregions,
                 const void *opts_0_1, void *stats, dcp_error *err)
{
    const load_options_0_1 *opts = opts_0_1;
    dcp_load_stats st;
    dcp_load_options o = DCP_LOAD_OPTIONS_INIT;
    if (opts) {
        o.flags = opts->flags;
        o.staging_bytes = opts->staging_bytes;
        o.nstaging = opts->nstaging;
    }
    int rc = ldi_load_0_2(comm, ck, regions, nregions, opts ? &o : NULL, stats ? &st : NULL, err);
    if (stats)
        memcpy(stats, &st, offsetof(dcp_load_stats, bytes_ipc));
    return rc;
}

/* Both versions of dcp_load (src/load/libdcpload.map): the default, 0.2,
 * for programs linked now; 0.1 for those linked before the stats grew. */
__asm__(".symver ldi_load_0_1, dcp_load@DCP_LOAD_0.1");
__asm__(".symver ldi_load_0_2, dcp_load@@DCP_LOAD_0.2");
