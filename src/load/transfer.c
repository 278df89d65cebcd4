/* MPI helpers of the loader. Every transfer is one message: a unit is at
 * most the staging size, which is at most LDI_MSG_MAX (1 GiB), so its byte
 * count fits MPI's int. */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "load.h"

int ldi_wait(int n, MPI_Request *reqs, MPI_Status *stat)
{
    /* Spin a little, yield for a while, then sleep in short naps: a wait
     * for a unit a peer is still reading or copying lasts milliseconds, and
     * ranks yielding through it still took CPU time from the ranks doing
     * the work (a replicated 2 GiB load on 4 ranks and 2 CPUs: 1.9 CPU
     * seconds and 0.92-1.02 s with yields alone, 1.45 and 0.75-0.97 s with
     * naps). A nap ends with a poll, so a transfer completing during it
     * costs at most one nap. */
    double yielding = 0;
    for (unsigned polls = 0;; polls++) {
        int done = 0;
        int rc = MPI_Testall(n, reqs, &done, stat);
        if (rc != MPI_SUCCESS || done)
            return rc;
        if (polls < 16)
            continue;
        if (polls == 16)
            yielding = ldi_now();
        if (ldi_now() - yielding < LDI_NAP_AFTER) {
            sched_yield();
        } else {
            struct timespec nap = {0, LDI_NAP_NS};
            nanosleep(&nap, NULL);
        }
    }
}

int ldi_allreduce_int(const int *in, int *out, MPI_Op op, MPI_Comm comm)
{
    MPI_Request r;
    MPI_Status s;
    int rc = MPI_Iallreduce(in, out, 1, MPI_INT, op, comm, &r);
    return rc == MPI_SUCCESS ? ldi_wait(1, &r, &s) : rc;
}

int ldi_allgather(const void *in, int count, MPI_Datatype t, void *out, MPI_Comm comm)
{
    MPI_Request r;
    MPI_Status s;
    int rc = MPI_Iallgather(in, count, t, out, count, t, comm, &r);
    return rc == MPI_SUCCESS ? ldi_wait(1, &r, &s) : rc;
}

int ldi_allgatherv(const void *in, int count, void *out, const int *counts, const int *displs, MPI_Comm comm)
{
    MPI_Request r;
    MPI_Status s;
    int rc = MPI_Iallgatherv(in, count, MPI_BYTE, out, counts, displs, MPI_BYTE, comm, &r);
    return rc == MPI_SUCCESS ? ldi_wait(1, &r, &s) : rc;
}

int ldi_bcast(void *buf, int count, int root, MPI_Comm comm)
{
    MPI_Request r;
    MPI_Status s;
    int rc = MPI_Ibcast(buf, count, MPI_BYTE, root, comm, &r);
    return rc == MPI_SUCCESS ? ldi_wait(1, &r, &s) : rc;
}

int ldi_comm_dup(MPI_Comm comm, MPI_Comm *out)
{
    MPI_Request r;
    MPI_Status s;
    int rc = MPI_Comm_idup(comm, out, &r);
    return rc == MPI_SUCCESS ? ldi_wait(1, &r, &s) : rc;
}

/* The spans of buf as one hindexed datatype; len and disp have room for ns
 * (allocated up front by the caller: a transfer must never fail to be
 * posted, or its peer would wait forever). A span never exceeds a unit and
 * units are at most LDI_MSG_MAX bytes, so lengths fit in int. */
static void span_type(const dcp_gspan *s, size_t ns, int *len, MPI_Aint *disp, MPI_Datatype *t)
{
    for (size_t i = 0; i < ns; i++) {
        len[i] = (int)(s[i].b - s[i].a);
        disp[i] = (MPI_Aint)s[i].a;
    }
    MPI_Type_create_hindexed((int)ns, len, disp, MPI_BYTE, t);
    MPI_Type_commit(t);
}

/* One span: a plain contiguous message. Several: a datatype, freed at once
 * (MPI keeps it until the transfer completes). */
void ldi_isend_spans(const unsigned char *buf, const dcp_gspan *s, size_t ns, int peer, MPI_Comm comm,
                     int *len, MPI_Aint *disp, MPI_Request *req)
{
    if (ns == 1) {
        MPI_Isend(buf + s[0].a, (int)(s[0].b - s[0].a), MPI_BYTE, peer, 0, comm, req);
        return;
    }
    MPI_Datatype t;
    span_type(s, ns, len, disp, &t);
    MPI_Isend(buf, 1, t, peer, 0, comm, req);
    MPI_Type_free(&t);
}

void ldi_ibcast_spans(unsigned char *buf, const dcp_gspan *s, size_t ns, int root, MPI_Comm comm,
                      int *len, MPI_Aint *disp, MPI_Request *req)
{
    if (ns == 1) {
        MPI_Ibcast(buf + s[0].a, (int)(s[0].b - s[0].a), MPI_BYTE, root, comm, req);
        return;
    }
    MPI_Datatype t;
    span_type(s, ns, len, disp, &t);
    MPI_Ibcast(buf, 1, t, root, comm, req);
    MPI_Type_free(&t);
}
