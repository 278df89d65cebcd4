/* Which ranks share a node: for every rank of comm its node and its rank
 * there, the same on every rank, so that the global plan can tell which
 * deliveries stay on a node; and, when asked, the node communicator (shared
 * staging windows, the CUDA device of a rank by its rank on the node).
 * MPI_Comm_split_type costs several collective rounds, so without need of
 * the communicator the nodes are told apart by processor name, in one
 * allgather. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "load.h"

static uint64_t name_hash(void)
{
    char name[MPI_MAX_PROCESSOR_NAME + 1];
    int len = 0;
    memset(name, 0, sizeof name);
    if (MPI_Get_processor_name(name, &len) != MPI_SUCCESS)
        len = 0;
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (int i = 0; i < len; i++)
        h = (h ^ (unsigned char)name[i]) * 1099511628211ull;
    return h;
}

int ldi_nodes_by_name(MPI_Comm comm, int flags, int *any_flags, int *all_flags, ldi_nodes *nd, dcp_error *err)
{
    nd->comm = MPI_COMM_NULL;
    nd->local = 0;
    nd->nlocal = 1;
    int me, n;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &n);
    uint64_t mine[2] = {name_hash(), (uint64_t)(unsigned)flags};
    uint64_t *all = malloc(2 * (size_t)n * sizeof *all);
    nd->node = malloc((size_t)n * sizeof *nd->node);
    nd->node_rank = malloc((size_t)n * sizeof *nd->node_rank);
    int lrc = all && nd->node && nd->node_rank ? 0 : ldi_err(err, ENOMEM, "dcp_load: out of memory");
    int rc = ldi_agree(comm, lrc, err);   /* all gather, or none */
    if (rc < 0) {
        free(all);
        ldi_nodes_free(nd);
        return rc;
    }
    ldi_allgather(mine, 2, MPI_UINT64_T, all, comm);
    *any_flags = 0;
    *all_flags = -1;
    for (int r = 0; r < n; r++) {
        *any_flags |= (int)all[2 * r + 1];
        *all_flags &= (int)all[2 * r + 1];
        int first = r, below = 0;
        for (int q = 0; q < r; q++)
            if (all[2 * q] == all[2 * r]) {
                if (first == r)
                    first = q;
                below++;
            }
        nd->node[r] = first;
        nd->node_rank[r] = below;
    }
    nd->local = nd->node_rank[me];
    free(all);
    return 0;
}

int ldi_nodes_get(MPI_Comm comm, ldi_nodes *nd, dcp_error *err)
{
    nd->comm = MPI_COMM_NULL;
    nd->node = nd->node_rank = NULL;
    nd->local = 0;
    nd->nlocal = 1;
    int me, n;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &n);
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &nd->comm);
    MPI_Comm_set_errhandler(nd->comm, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_rank(nd->comm, &nd->local);
    MPI_Comm_size(nd->comm, &nd->nlocal);
    int leader = me;
    ldi_allreduce_int(&me, &leader, MPI_MIN, nd->comm);
    int *pairs = malloc(2 * (size_t)n * sizeof *pairs);
    nd->node = malloc((size_t)n * sizeof *nd->node);
    nd->node_rank = malloc((size_t)n * sizeof *nd->node_rank);
    /* agreed first, so that either every rank gathers or none does */
    int lrc = pairs && nd->node && nd->node_rank ? 0 : ldi_err(err, ENOMEM, "dcp_load: out of memory");
    int rc = ldi_agree(comm, lrc, err);
    if (rc < 0) {
        free(pairs);
        ldi_nodes_free(nd);
        return rc;
    }
    int mine[2] = {leader, nd->local};
    ldi_allgather(mine, 2, MPI_INT, pairs, comm);
    for (int r = 0; r < n; r++) {
        nd->node[r] = pairs[2 * r];
        nd->node_rank[r] = pairs[2 * r + 1];
    }
    free(pairs);
    return 0;
}

void ldi_nodes_free(ldi_nodes *nd)
{
    if (nd->comm != MPI_COMM_NULL)
        MPI_Comm_free(&nd->comm);
    free(nd->node);
    free(nd->node_rank);
    nd->node = nd->node_rank = NULL;
}
