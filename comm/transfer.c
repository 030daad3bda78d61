/* Point-to-point transfers over StarPU-MPI: detached sends and receives of StarPU data,
 * tagged so that every message of every step has its own tag. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <starpu_mpi.h>

#include "comm/comm.h"

/* A tag is (step << 32) | msg. The step keeps messages of consecutive steps apart even
 * when a fast rank posts step k+1 while a slow one still drains step k; the msg is the
 * plan's per-step message number. StarPU-MPI carries the tag in its own envelope (the
 * MPI messages use fixed internal tags), so the bound is STARPU_MPI_TAG_UB, not
 * MPI_TAG_UB; steps wrap after 2^31, far beyond any run. */
#define SP_COMM_STEP_BITS 31

int64_t sp_comm_tag(uint64_t step, uint32_t msg)
{
    uint64_t s = step & ((UINT64_C(1) << SP_COMM_STEP_BITS) - 1);
    return (int64_t)((s << 32) | msg);
}

sp_status sp_comm_check_tag_space(void)
{
    int64_t *ub = NULL;
    int flag = 0;
    int rc = starpu_mpi_comm_get_attr(MPI_COMM_WORLD, STARPU_MPI_TAG_UB, &ub, &flag);
    if (rc < 0)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: starpu_mpi_comm_get_attr failed: %s",
                            __FILE__, __LINE__, strerror(-rc));
    int64_t need = sp_comm_tag((UINT64_C(1) << SP_COMM_STEP_BITS) - 1, UINT32_MAX);
    if (!flag || !ub || *ub < need)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: StarPU-MPI tag bound %" PRId64
                            " is below the %" PRId64 " starpipe needs", __FILE__, __LINE__,
                            flag && ub ? *ub : (int64_t)-1, need);
    return SP_OK;
}

/* The callback is what keeps StarPU-MPI's "cooperative sends" off: with a NULL callback,
 * detached sends of one buffer to several ranks are merged and rerouted through a
 * broadcast tree in which receivers forward the data. That would add messages the plan
 * does not know about, breaking its single global message order. */
sp_status sp_comm_post(starpu_data_handle_t h, int peer, int64_t tag, int is_send,
                       void (*done)(void *), void *arg)
{
    if (!done)
        return sp_set_error(SP_ERR_ARG, "sp_comm_post: a completion callback is required");
    int rc = is_send ? starpu_mpi_isend_detached(h, peer, tag, MPI_COMM_WORLD, done, arg)
                     : starpu_mpi_irecv_detached(h, peer, tag, MPI_COMM_WORLD, done, arg);
    if (rc < 0)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: starpu_mpi_%s_detached with rank %d failed: "
                            "%s", __FILE__, __LINE__, is_send ? "isend" : "irecv", peer,
                            strerror(-rc));
    return SP_OK;
}
