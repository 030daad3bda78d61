/* Point-to-point transfers over StarPU-MPI: detached sends and receives of a registered
 * buffer, tagged so that every message of every step has its own tag. */
#include <inttypes.h>
#include <stdlib.h>

#include <starpu_mpi.h>

#include "runtime/exec_impl.h"

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
    SP_STARPU_CHECK(starpu_mpi_comm_get_attr(MPI_COMM_WORLD, STARPU_MPI_TAG_UB, &ub, &flag));
    int64_t need = sp_comm_tag((UINT64_C(1) << SP_COMM_STEP_BITS) - 1, UINT32_MAX);
    if (!flag || !ub || *ub < need)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: StarPU-MPI tag bound %" PRId64
                            " is below the %" PRId64 " starpipe needs", __FILE__, __LINE__,
                            flag && ub ? *ub : (int64_t)-1, need);
    return SP_OK;
}

static sp_status check_peer(const char *what, const sp_exec_buf *b, int peer)
{
    if (!b)
        return sp_set_error(SP_ERR_ARG, "%s: NULL buffer", what);
    if (peer < 0 || peer >= sp_exec_size_ || peer == sp_exec_rank_)
        return sp_set_error(SP_ERR_ARG, "%s: rank %d cannot exchange with rank %d of %d",
                            what, sp_exec_rank_, peer, sp_exec_size_);
    return SP_OK;
}

/* The completion callback is what keeps StarPU-MPI's "cooperative sends" off: with a
 * NULL callback, detached sends of one buffer to several ranks are merged and rerouted
 * through a broadcast tree in which receivers forward the data. That would add messages
 * the plan does not know about, breaking its single global message order. */
/* With tracing on, the callback also records the transfer, from posting to completion. */
typedef struct {
    int is_send, peer;
    uint32_t msg;
    double posted;
} transfer_info;

static void transfer_done(void *arg)
{
    transfer_info *t = arg;
    if (!t)
        return;
    sp_exec_trace_transfer(t->is_send, t->msg, t->peer, t->posted, starpu_timing_now());
    free(t);
}

static transfer_info *traced(int is_send, int peer, uint32_t msg)
{
    if (!sp_exec_tracing())
        return NULL;
    transfer_info *t = malloc(sizeof *t);
    if (t)
        *t = (transfer_info){ is_send, peer, msg, starpu_timing_now() };
    return t;
}

/* A detached send or receive of b's handle, tagged for this step and message. */
static sp_status post(sp_exec_buf *b, int peer, uint32_t msg, int is_send)
{
    sp_status st = check_peer(is_send ? "sp_exec_send" : "sp_exec_recv", b, peer);
    if (st)
        return st;
    int64_t tag = sp_comm_tag(sp_exec_step_, msg);
    transfer_info *info = traced(is_send, peer, msg);
    int rc = is_send ? starpu_mpi_isend_detached(b->handle, peer, tag, MPI_COMM_WORLD,
                                                 transfer_done, info)
                     : starpu_mpi_irecv_detached(b->handle, peer, tag, MPI_COMM_WORLD,
                                                 transfer_done, info);
    if (rc < 0) {
        free(info);
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: starpu_mpi_%s_detached to rank %d failed: "
                            "%s", __FILE__, __LINE__, is_send ? "isend" : "irecv", peer,
                            strerror(-rc));
    }
    return SP_OK;
}

sp_status sp_exec_send(sp_exec_buf *b, int dst, uint32_t msg) { return post(b, dst, msg, 1); }

sp_status sp_exec_recv(sp_exec_buf *b, int src, uint32_t msg) { return post(b, src, msg, 0); }
