/* Device staging shared within a node by IPC (issue 16): the delivery of
 * units to CUDA destinations of node peers without host messages.
 *
 * When every rank's destinations are device memory, the plan is built with
 * node-local deliveries of kind DCP_GDLV_SHM (fragments keep their offsets
 * in the unit). A rank that reads such units holds a device staging pool of
 * nstaging slots of the staging size, one allocation exported by an IPC
 * handle (cudaIpcGetMemHandle); the handles are allgathered on the node
 * communicator and every peer maps the others' pools once per call
 * (cudaIpcOpenMemHandle). exec.c then runs, per unit: the reader copies the
 * unit from its pinned host slot into the device slot of the same index
 * (cudaMemcpyAsync, overlapping the I/O thread's next reads), waits for it,
 * and sends each node peer a token naming the slot; the peer copies its
 * fragments device to device out of the mapped slot into its destination,
 * waits for its copies and answers; the reader reuses the slot when every
 * answer is in. Ranks on other nodes get their bytes as before (MPI, from
 * the host slot).
 *
 * Set-up failures (no memory, IPC refused: another container, a driver
 * without IPC, the fake device told to fail) are agreed on the whole
 * communicator, because every rank must run the same plan: then everything
 * is undone and the caller plans again with host messages, recording why.
 * The pools are unmapped, then (after a node barrier) freed by
 * ldi_ipc_free after the transfers. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "load.h"

/* Does this rank read a unit that node peers take out of its staging? */
static int reads_shared(const dcp_gplan *g)
{
    for (size_t i = 0; i < g->nunits; i++) {
        const dcp_gunit *u = &g->units[i];
        if (u->reader != g->me)
            continue;
        for (size_t k = 0; k < u->ndlv; k++)
            if (g->dlvs[u->dlv0 + k].kind == DCP_GDLV_SHM)
                return 1;
    }
    return 0;
}

int ldi_ipc_plan_ok(const dcp_gplan *g, char *why, size_t cap)
{
    /* a fix-up (byte swap, conj, neg) is done on the host: such plans keep
     * the host path (never a silent slow path through device fetches) */
    for (size_t i = 0; i < g->ngops; i++)
        if (g->gops[i].op.flags & (DCP_OP_BSWAP | DCP_OP_CONJ | DCP_OP_NEG)) {
            snprintf(why, cap, "records need a byte swap or sign fix-up on the host");
            return 0;
        }
    return 1;
}

void ldi_ipc_free(ldi_ipc *ipc)
{
    if (!ipc->active)
        return;
    /* every node rank is here (also one whose set-up failed early): the
     * barrier orders every unmapping of a pool before its owner frees it */
    const ldi_devops *ops = ipc->ops;
    dcp_error e;
    int prev = -1;
    int bound = ops && ops->get_device(&prev, &e) == 0 && (prev == ipc->device || ops->set_device(ipc->device, &e) == 0);
    for (int i = 0; ops && ipc->peer && i < ipc->nlocal; i++)
        if (ipc->peer[i])
            ops->ipc_close(ipc->peer[i], &e);
    MPI_Request r;
    MPI_Ibarrier(ipc->node, &r);
    ldi_wait(1, &r, MPI_STATUSES_IGNORE);
    if (ops)
        ops->dev_free(ipc->pool);
    if (bound && prev >= 0 && prev != ipc->device)
        ops->set_device(prev, &e);
    free(ipc->peer);
    memset(ipc, 0, sizeof *ipc);
}

struct exported {
    int has;
    int pad;
    ldi_ipc_handle h;
};

int ldi_ipc_setup(MPI_Comm comm, MPI_Comm node, int device, const dcp_gplan *g, unsigned nslots, size_t slot_bytes,
                  ldi_ipc *ipc, dcp_error *why)
{
    memset(ipc, 0, sizeof *ipc);
    const ldi_devops *ops = ldi_devops_get();
    dcp_error e = {0};
    int rc = 0, nlocal = 1, local = 0;
    MPI_Comm_size(node, &nlocal);
    MPI_Comm_rank(node, &local);
    ipc->active = 1;   /* from here on ldi_ipc_free undoes, collectively */
    ipc->device = device;
    ipc->node = node;
    ipc->nlocal = nlocal;
    ipc->nslots = nslots;
    ipc->slot_bytes = slot_bytes;
    struct exported mine, *all = calloc((size_t)nlocal, sizeof *all);
    memset(&mine, 0, sizeof mine);
    ipc->peer = calloc((size_t)nlocal, sizeof *ipc->peer);
    int prev = -1;
    if (!ops)
        rc = ldi_err(&e, ENOTSUP, "dcp_load: this libdcpload was built without CUDA support");
    else if (!all || !ipc->peer)
        rc = ldi_err(&e, ENOMEM, "dcp_load: out of memory");
    else if (ops->get_device(&prev, &e) < 0 || (prev != device && ops->set_device(device, &e) < 0))
        rc = -1;
    else
        ipc->ops = ops;
    if (rc == 0 && reads_shared(g)) {
        void *p = NULL;
        if (slot_bytes && nslots > SIZE_MAX / slot_bytes)
            rc = ldi_err(&e, EOVERFLOW, "dcp_load: device staging of %u x %zu bytes", nslots, slot_bytes);
        else if (ops->dev_alloc(&p, (size_t)nslots * slot_bytes, &e) < 0)
            rc = -1;
        else {
            ipc->pool = p;
            if (ops->ipc_get(p, &mine.h, &e) < 0)
                rc = -1;
            else
                mine.has = 1;
        }
    }
    /* every node rank takes part, also one that failed (it exports
     * nothing), unless one has no room for the handles: agreed first */
    int room = all != NULL, all_room = 0;
    ldi_allreduce_int(&room, &all_room, MPI_MIN, node);
    if (all_room)
        ldi_allgather(&mine, (int)sizeof mine, MPI_BYTE, all, node);
    else if (rc == 0)
        rc = ldi_err(&e, ENOMEM, "dcp_load: out of memory on a node peer");
    for (int i = 0; rc == 0 && i < nlocal; i++) {
        void *p = NULL;
        if (i == local || !all[i].has)
            continue;
        if (ops->ipc_open(&all[i].h, &p, &e) < 0)
            rc = -1;
        else
            ipc->peer[i] = p;
    }
    if (ipc->ops && prev >= 0 && prev != device) {
        dcp_error ignored;
        ops->set_device(prev, &ignored);
    }
    free(all);
    /* every rank runs the same plan: the device path on all, or on none */
    if (ldi_agree(comm, rc, &e) < 0) {
        *why = e;
        ldi_ipc_free(ipc);
        return 1;
    }
    return 0;
}
