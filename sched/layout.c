/* Replicas of the pipeline: which world rank runs (replica, actor) (include/starpipe/plan.h). */
#include <string.h>

#include "base/env.h"
#include "starpipe/plan.h"

int sp_layout_rank(const sp_layout *l, int replica, int actor)
{
    return l->order == SP_RANK_ORDER_REPLICA ? actor * l->replicas + replica
                                             : replica * l->actors + actor;
}

void sp_layout_place(const sp_layout *l, int rank, int *replica, int *actor)
{
    if (l->order == SP_RANK_ORDER_REPLICA) {
        *replica = rank % l->replicas;
        *actor = rank / l->replicas;
    } else {
        *replica = rank / l->actors;
        *actor = rank % l->actors;
    }
}

const char *sp_rank_order_name(sp_rank_order o)
{
    return o == SP_RANK_ORDER_REPLICA ? "replica" : "pipeline";
}

sp_status sp_layout_from_env(int nranks, int replicas, int actors, const char *order,
                             sp_layout *out)
{
    sp_env env; /* STARPIPE_REPLICAS, STARPIPE_RANK_ORDER */
    sp_status st = sp_env_read(&env);
    if (st) return st;
    if (replicas <= 0) replicas = env.replicas > 0 ? env.replicas : 1;
    if (!order) order = env.rank_order;
    sp_rank_order o = SP_RANK_ORDER_PIPELINE;
    if (order && !strcmp(order, "replica")) o = SP_RANK_ORDER_REPLICA;
    else if (order && strcmp(order, "pipeline"))
        return sp_set_error(SP_ERR_ARG, "rank order '%s': use 'pipeline' (the ranks of a "
                            "pipeline consecutive) or 'replica' (the replicas of a stage "
                            "consecutive)", order);
    if (nranks < 1 || nranks % replicas)
        return sp_set_error(SP_ERR_ARG, "%d replicas need a multiple of %d MPI ranks, but %d "
                            "are running", replicas, replicas, nranks);
    if (actors > 0 && replicas == 1 && actors != nranks)
        return sp_set_error(SP_ERR_ARG, "--actors %d but %d MPI ranks are running (mpirun -np "
                            "%d)", actors, nranks, actors);
    if (actors > 0 && actors * replicas != nranks)
        return sp_set_error(SP_ERR_ARG, "%d replicas of %d actors need %d MPI ranks, but %d are "
                            "running: use mpirun -np %d", replicas, actors, replicas * actors,
                            nranks, replicas * actors);
    *out = (sp_layout){ .replicas = replicas, .actors = nranks / replicas, .order = o };
    return SP_OK;
}
