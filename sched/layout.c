/* Replicas of the pipeline: which world rank runs (replica, actor) (include/starpipe/plan.h). */
#include <string.h>

#include "base/env.h"
#include "starpipe/plan.h"

int sp_layout_tensor(const sp_layout *l) { return l->tensor > 1 ? l->tensor : 1; }

int sp_layout_rank_t(const sp_layout *l, int replica, int actor, int t)
{
    int base = l->order == SP_RANK_ORDER_REPLICA ? actor * l->replicas + replica
                                                 : replica * l->actors + actor;
    return base * sp_layout_tensor(l) + t;
}

void sp_layout_place_t(const sp_layout *l, int rank, int *replica, int *actor, int *t)
{
    int T = sp_layout_tensor(l), base = rank / T;
    if (t) *t = rank % T;
    if (l->order == SP_RANK_ORDER_REPLICA) {
        *replica = base % l->replicas;
        *actor = base / l->replicas;
    } else {
        *replica = base / l->actors;
        *actor = base % l->actors;
    }
}

int sp_layout_rank(const sp_layout *l, int replica, int actor)
{
    return sp_layout_rank_t(l, replica, actor, 0);
}

void sp_layout_place(const sp_layout *l, int rank, int *replica, int *actor)
{
    sp_layout_place_t(l, rank, replica, actor, NULL);
}

const char *sp_rank_order_name(sp_rank_order o)
{
    return o == SP_RANK_ORDER_REPLICA ? "replica" : "pipeline";
}

sp_status sp_layout_from_env(int nranks, int replicas, int actors, int tensor, const char *order,
                             sp_layout *out)
{
    sp_env env; /* STARPIPE_REPLICAS, STARPIPE_TENSOR, STARPIPE_RANK_ORDER */
    sp_status st = sp_env_read(&env);
    if (st) return st;
    if (replicas <= 0) replicas = env.replicas > 0 ? env.replicas : 1;
    if (tensor <= 0) tensor = env.tensor > 0 ? env.tensor : 1;
    if (tensor > 1) { /* the layout of the groups, then each group's T ranks */
        if (nranks < 1 || nranks % tensor)
            return sp_set_error(SP_ERR_ARG, "tensor parallelism of %d needs a multiple of %d MPI "
                                "ranks (replicas x actors x %d), but %d are running", tensor,
                                tensor, tensor, nranks);
        if (actors > 0 && actors * replicas * tensor != nranks)
            return sp_set_error(SP_ERR_ARG, "%d replica%s of %d actors of %d ranks (--tensor) "
                                "need %d MPI ranks, but %d are running: use mpirun -np %d",
                                replicas, replicas == 1 ? "" : "s", actors, tensor,
                                replicas * actors * tensor, nranks, replicas * actors * tensor);
        st = sp_layout_from_env(nranks / tensor, replicas, actors, 1, order, out);
        if (st == SP_OK) out->tensor = tensor;
        return st;
    }
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
    *out = (sp_layout){ .replicas = replicas, .actors = nranks / replicas, .order = o, .tensor = 1 };
    return SP_OK;
}
