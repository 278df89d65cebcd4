/* MPI transfers of any size. MPI counts are int, so a transfer over
 * LDI_MSG_MAX (1 GiB) bytes becomes several messages; both sides split the
 * same way, and messages between two ranks on one communicator do not
 * overtake each other, so the pieces match in order. */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "load.h"

size_t ldi_msg_count(uint64_t n)
{
    return n == 0 ? 1 : (size_t)((n + LDI_MSG_MAX - 1) / LDI_MSG_MAX);
}

const char *ldi_mpi_errstr(int rc, char *buf, size_t cap)
{
    int len = 0;
    char s[MPI_MAX_ERROR_STRING];
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS)
        snprintf(buf, cap, "MPI error %d", rc);
    else
        snprintf(buf, cap, "%s", s);
    return buf;
}

int ldi_wait(int n, MPI_Request *reqs, MPI_Status *stat)
{
    int done = 0;
    for (unsigned polls = 0;; polls++) {
        int rc = MPI_Testall(n, reqs, &done, stat);
        if (rc != MPI_SUCCESS || done)
            return rc;
        if (polls >= 16)
            sched_yield();
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

enum { OP_SEND, OP_RECV, OP_BCAST };

static int split(int what, void *buf, uint64_t n, int peer, MPI_Comm comm, MPI_Request *reqs,
                 size_t *nreq)
{
    unsigned char *p = buf;
    uint64_t done = 0;
    do {
        uint64_t piece = n - done < LDI_MSG_MAX ? n - done : LDI_MSG_MAX;
        int rc;
        MPI_Request *r = &reqs[(*nreq)++];
        if (what == OP_SEND)
            rc = MPI_Isend(p + done, (int)piece, MPI_BYTE, peer, 0, comm, r);
        else if (what == OP_RECV)
            rc = MPI_Irecv(p + done, (int)piece, MPI_BYTE, peer, 0, comm, r);
        else
            rc = MPI_Ibcast(p + done, (int)piece, MPI_BYTE, peer, comm, r);
        if (rc != MPI_SUCCESS) {
            (*nreq)--;
            return rc;
        }
        done += piece;
    } while (done < n);
    return MPI_SUCCESS;
}

int ldi_isend(const void *buf, uint64_t n, int peer, MPI_Comm comm, MPI_Request *reqs, size_t *nreq)
{
    return split(OP_SEND, (void *)buf, n, peer, comm, reqs, nreq);
}

int ldi_irecv(void *buf, uint64_t n, int peer, MPI_Comm comm, MPI_Request *reqs, size_t *nreq)
{
    return split(OP_RECV, buf, n, peer, comm, reqs, nreq);
}

int ldi_ibcast(void *buf, uint64_t n, int root, MPI_Comm comm, MPI_Request *reqs, size_t *nreq)
{
    return split(OP_BCAST, buf, n, root, comm, reqs, nreq);
}

/* An hindexed datatype over the spans; a span never exceeds a unit, and
 * units are at most LDI_MSG_MAX bytes, so lengths fit in int. */
static int span_type(const ldi_span *s, size_t ns, MPI_Datatype *t)
{
    if (ns > INT_MAX)
        return MPI_ERR_COUNT;
    int *len = malloc(ns * sizeof *len);
    MPI_Aint *disp = malloc(ns * sizeof *disp);
    int rc = MPI_ERR_NO_MEM;
    if (len && disp) {
        for (size_t i = 0; i < ns; i++) {
            len[i] = (int)(s[i].b - s[i].a);
            disp[i] = (MPI_Aint)s[i].a;
        }
        rc = MPI_Type_create_hindexed((int)ns, len, disp, MPI_BYTE, t);
        if (rc == MPI_SUCCESS && (rc = MPI_Type_commit(t)) != MPI_SUCCESS)
            MPI_Type_free(t);
    }
    free(len);
    free(disp);
    return rc;
}

/* One span: a plain contiguous transfer (split when large). Several: a
 * datatype, freed at once (MPI keeps it until the transfer completes). */
int ldi_isend_spans(const unsigned char *buf, const ldi_span *s, size_t ns, int peer, MPI_Comm comm,
                    MPI_Request *reqs, size_t *nreq)
{
    if (ns == 1)
        return ldi_isend(buf + s[0].a, s[0].b - s[0].a, peer, comm, reqs, nreq);
    MPI_Datatype t;
    int rc = span_type(s, ns, &t);
    if (rc != MPI_SUCCESS)
        return rc;
    rc = MPI_Isend(buf, 1, t, peer, 0, comm, &reqs[*nreq]);
    if (rc == MPI_SUCCESS)
        (*nreq)++;
    MPI_Type_free(&t);
    return rc;
}

int ldi_ibcast_spans(unsigned char *buf, const ldi_span *s, size_t ns, int root, MPI_Comm comm,
                     MPI_Request *reqs, size_t *nreq)
{
    if (ns == 1)
        return ldi_ibcast(buf + s[0].a, s[0].b - s[0].a, root, comm, reqs, nreq);
    MPI_Datatype t;
    int rc = span_type(s, ns, &t);
    if (rc != MPI_SUCCESS)
        return rc;
    rc = MPI_Ibcast(buf, 1, t, root, comm, &reqs[*nreq]);
    if (rc == MPI_SUCCESS)
        (*nreq)++;
    MPI_Type_free(&t);
    return rc;
}
