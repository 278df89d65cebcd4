/* The sub-communicators of a global plan's broadcast groups (libdcp plans
 * the groups, dcp_gplan.h; only libdcpload knows MPI). */
#include "load.h"

void ldi_groups_create(MPI_Comm comm, const dcp_gplan *g, MPI_Comm comms[DCP_GPLAN_MAX_GROUPS])
{
    for (size_t i = 0; i < DCP_GPLAN_MAX_GROUPS; i++)
        comms[i] = MPI_COMM_NULL;
    MPI_Group world;
    MPI_Comm_group(comm, &world);
    /* in group order on every rank, so overlapping creations cannot deadlock */
    for (size_t i = 0; i < g->ngroups && i < DCP_GPLAN_MAX_GROUPS; i++) {
        const dcp_ggroup *gr = &g->groups[i];
        const int *ranks = g->group_ranks + gr->rank0;
        int member = 0;
        for (size_t k = 0; k < gr->n; k++)
            member |= ranks[k] == g->me;
        if (!member)
            continue;
        if (gr->n == (size_t)g->nranks) {
            comms[i] = comm;   /* everyone: the loader's own communicator */
            continue;
        }
        MPI_Group sub;
        MPI_Group_incl(world, (int)gr->n, ranks, &sub);
        MPI_Comm_create_group(comm, sub, (int)i, &comms[i]);
        MPI_Group_free(&sub);
    }
    MPI_Group_free(&world);
}

void ldi_groups_free(const dcp_gplan *g, MPI_Comm comms[DCP_GPLAN_MAX_GROUPS])
{
    for (size_t i = 0; i < g->ngroups && i < DCP_GPLAN_MAX_GROUPS; i++)
        if (comms[i] != MPI_COMM_NULL && g->groups[i].n != (size_t)g->nranks)
            MPI_Comm_free(&comms[i]);
}
