/* Collective error agreement: no rank returns before every rank knows the
 * outcome, and all return the same message, so nothing hangs and no rank is
 * left in a different state. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "load.h"

int ldi_agree(MPI_Comm comm, int rc, dcp_error *err)
{
    int me, n;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &n);
    /* the lowest failing rank speaks for all (MPI errors are fatal: see api.c) */
    int mine = rc < 0 ? me : n, first = n;
    ldi_allreduce_int(&mine, &first, MPI_MIN, comm);   /* early ranks yield to late ones */
    if (first == n)
        return 0;
    struct {
        int code;
        char msg[DCP_ERRMSG_MAX];
    } m;
    memset(&m, 0, sizeof m);
    if (me == first) {
        m.code = err && err->code ? err->code : EIO;
        size_t k = n > 1 && rc != LDI_AGREED ? (size_t)snprintf(m.msg, sizeof m.msg, "rank %d: ", me) : 0;
        const char *why = err ? err->msg : "failed";
        size_t len = strnlen(why, sizeof err->msg);
        if (len > sizeof m.msg - 1 - k)
            len = sizeof m.msg - 1 - k;   /* the prefix may cut the tail */
        memcpy(m.msg + k, why, len);
    }
    ldi_bcast(&m, (int)sizeof m, first, comm);
    m.msg[sizeof m.msg - 1] = '\0';
    if (err) {
        err->code = m.code;
        memcpy(err->msg, m.msg, sizeof err->msg);
    }
    return LDI_AGREED;
}
