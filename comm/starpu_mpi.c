/* The StarPU-MPI transport: the pipeline's messages as StarPU-MPI's detached sends and
 * receives of StarPU data, progressed by StarPU-MPI's own thread, tagged so that every
 * message of every step has its own tag. StarPU-MPI's statistics (STARPU_MPI_STATS) and
 * traces see every message. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <starpu_mpi.h>

#include "comm/transport.h"

/* A tag is (step << 32) | msg. The step keeps messages of consecutive steps apart even
 * when a fast rank posts step k+1 while a slow one still drains step k; the msg is the
 * plan's per-step message number. StarPU-MPI carries the tag in its own envelope (the
 * MPI messages use fixed internal tags), so the bound is STARPU_MPI_TAG_UB, not
 * MPI_TAG_UB; steps wrap after 2^31, far beyond any run. */
#define STEP_BITS 31

static struct {
    MPI_Comm comm;
    uint64_t step;
    atomic_int open; /* posted, done not yet returned */
    atomic_ullong sends, recvs, bytes_sent, bytes_received;
} M;

static int64_t tag_of(uint64_t step, uint32_t msg)
{
    uint64_t s = step & ((UINT64_C(1) << STEP_BITS) - 1);
    return (int64_t)((s << 32) | msg);
}

static sp_status smpi_init(const sp_transport_config *c, int *active, char *notice, size_t len)
{
    *active = 0;
    if (len) notice[0] = '\0';
    /* StarPU-MPI's own communicator: the one starpu_mpi_init_conf was given */
    M.comm = c->world;
    int64_t *ub = NULL;
    int flag = 0;
    int rc = starpu_mpi_comm_get_attr(M.comm, STARPU_MPI_TAG_UB, &ub, &flag);
    if (rc < 0)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: starpu_mpi_comm_get_attr failed: %s",
                            __FILE__, __LINE__, strerror(-rc));
    int64_t need = tag_of((UINT64_C(1) << STEP_BITS) - 1, UINT32_MAX);
    if (!flag || !ub || *ub < need)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: StarPU-MPI tag bound %" PRId64
                            " is below the %" PRId64 " starpipe needs", __FILE__, __LINE__,
                            flag && ub ? *ub : (int64_t)-1, need);
    *active = 1;
    return SP_OK;
}

static void smpi_shutdown(void) {}

static void smpi_begin_step(uint64_t step) { M.step = step; }

typedef struct {
    sp_xfer_done done;
    void *arg;
} completion;

static void finished(void *p)
{
    completion c = *(completion *)p;
    free(p);
    c.done(c.arg, NULL); /* StarPU-MPI has no error path: a failure aborts inside it */
    atomic_fetch_sub(&M.open, 1);
}

/* The callback is also what keeps StarPU-MPI's "cooperative sends" off: with a NULL
 * callback, detached sends of one buffer to several ranks are merged and rerouted through
 * a broadcast tree in which receivers forward the data. That would add messages the plan
 * does not know about, breaking its single global message order. */
static sp_status smpi_post(const sp_xfer *x, sp_xfer_done done, void *arg, sp_xfer_req **held)
{
    (void)held; /* StarPU-MPI posts once it has acquired the buffer */
    completion *c = malloc(sizeof *c);
    if (!done || !c) {
        free(c);
        return done ? sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__)
                    : sp_set_error(SP_ERR_ARG, "starpu-mpi transport: a completion callback "
                                   "is required");
    }
    *c = (completion){ done, arg };
    int64_t tag = tag_of(M.step, x->msg);
    atomic_fetch_add(&M.open, 1);
    int rc = x->is_send ? starpu_mpi_isend_detached(x->h, x->peer, tag, M.comm, finished, c)
                        : starpu_mpi_irecv_detached(x->h, x->peer, tag, M.comm, finished, c);
    if (rc < 0) {
        atomic_fetch_sub(&M.open, 1);
        free(c);
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: starpu_mpi_%s_detached of message #%" PRIu32
                            " with rank %d failed: %s", __FILE__, __LINE__,
                            x->is_send ? "isend" : "irecv", x->msg, x->peer, strerror(-rc));
    }
    size_t bytes = x->count * x->elemsize;
    atomic_fetch_add(x->is_send ? &M.sends : &M.recvs, 1);
    atomic_fetch_add(x->is_send ? &M.bytes_sent : &M.bytes_received, bytes);
    return SP_OK;
}

static int smpi_pending(void) { return atomic_load(&M.open); }

/* Every request of StarPU-MPI on every rank (collective). */
static sp_status smpi_drain(void)
{
    int rc = starpu_mpi_wait_for_all(M.comm);
    if (rc < 0)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: starpu_mpi_wait_for_all failed: %s",
                            __FILE__, __LINE__, strerror(-rc));
    return SP_OK;
}

static void smpi_counts(sp_xfer_counts *out)
{
    *out = (sp_xfer_counts){ .sends = atomic_load(&M.sends), .recvs = atomic_load(&M.recvs),
                             .bytes_sent = atomic_load(&M.bytes_sent),
                             .bytes_received = atomic_load(&M.bytes_received) };
}

static int64_t smpi_tag(uint32_t msg) { return tag_of(M.step, msg); }

const sp_transport sp_transport_starpu_mpi = {
    .name = "starpu-mpi",
    .init = smpi_init,
    .shutdown = smpi_shutdown,
    .begin_step = smpi_begin_step,
    .post = smpi_post,
    .pending = smpi_pending,
    .drain = smpi_drain,
    .counts = smpi_counts,
    .tag = smpi_tag,
};
