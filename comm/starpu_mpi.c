/* The StarPU-MPI transport: the pipeline's messages as StarPU-MPI's detached sends and
 * receives of StarPU data, progressed by StarPU-MPI's own thread, tagged so that every
 * message of every step has its own tag. StarPU-MPI's statistics (STARPU_MPI_STATS) and
 * traces see every message. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <starpu_mpi.h>

#include "comm/stage.h"
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
    atomic_int open;     /* posted, done not yet returned */
    atomic_int unhanded; /* sends not yet handed to StarPU-MPI (copy not made) */
    atomic_ullong sends, recvs, by_producer, bytes_sent, bytes_received;
    sp_stage_pool stage; /* copies of sends */
} M = { .stage = SP_STAGE_POOL_INIT };

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

static void stage_unregister(sp_stage *b);
static void smpi_shutdown(void) { sp_stage_clear(&M.stage, stage_unregister); }

static void smpi_begin_step(uint64_t step) { M.step = step; }

typedef struct {
    sp_xfer_done done;
    void *arg;
} completion;

/* StarPU-MPI's progress thread asks the kernel for its shortest time slice, once, from
 * the first completion callback it runs (StarPU-MPI runs them on that thread, named
 * "MPI"). Where it shares the worker's core (a rank with no core to spare: it is then
 * left unbound, runtime/binding.c) it polls all through a step, yielding the core at each
 * idle poll, and under Linux's EEVDF scheduler each such yield moves its deadline a whole
 * slice on (0.7 ms x (1 + log2 cores) by default): when a send is handed to it or an
 * envelope arrives, the worker's yield after its task often does not give it the core,
 * and it waits for the worker's next block or the tick. With a 100 us slice (sched_attr's
 * sched_runtime for a SCHED_OTHER thread, Linux 6.12+; older kernels ignore it) its
 * deadline stays near and the worker's yield hands it over: 2-7% off the step time of
 * every schedule on one core per rank (bench/README.md). Its nice value is kept; another
 * policy, or a thread that is not StarPU-MPI's, is left alone. */
static void progress_slice(void)
{
#if defined(__linux__) && defined(SYS_sched_setattr)
    static _Thread_local int asked;
    if (asked)
        return;
    asked = 1;
    char name[17] = "";
    if (prctl(PR_GET_NAME, name) != 0 || strcmp(name, "MPI") != 0 ||
        sched_getscheduler(0) != SCHED_OTHER)
        return;
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    if (nice == -1 && errno)
        return;
    struct { /* the kernel's struct sched_attr, first version (48 bytes) */
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t priority;
        uint64_t runtime, deadline, period;
    } a = { .size = sizeof a, .policy = SCHED_OTHER, .nice = nice, .runtime = 100000 };
    (void)syscall(SYS_sched_setattr, 0, &a, 0); /* a refusal leaves the default slice */
#endif
}

static void finished(void *p)
{
    progress_slice();
    completion c = *(completion *)p;
    free(p);
    c.done(c.arg, NULL); /* StarPU-MPI has no error path: a failure aborts inside it */
    atomic_fetch_sub(&M.open, 1);
}

/* ---- sends, from private copies (stage.h) ----
 * A detached send of the pipeline's own buffer would hold it until MPI completes, and
 * the plan's pool hands that buffer to the sender's next task long before a busy receiver
 * takes the data (measured: 150 and 59 of 30 steps' interleaved-1F1B sends held up the
 * task writing their buffer, after 25-58 ms of idle worker). So a send acquires its buffer
 * for reading on the host (StarPU's sequential consistency puts that after the producing
 * task and before the next writer), copies it into a block of the stage pool, gives it
 * back, and StarPU-MPI sends the block through the block's own handle. The producing task
 * usually makes the copy and posts the send itself as its function returns (send_from,
 * from the executor's wrapper), 50-150 us before StarPU would grant the acquire; the
 * acquire then only keeps the buffer from its next writer until the copy is made. A
 * block's handle is accessed by nothing but its sends: it is written (by memcpy) only
 * while free, i.e. after its last send's completion, which StarPU-MPI reports after
 * releasing it. */
struct sp_xfer_req {
    starpu_data_handle_t h;
    size_t count, elemsize;
    int peer;
    uint32_t msg;
    int64_t tag;
    sp_xfer_done done;
    void *arg;
    sp_stage *stage;
    atomic_int holds; /* the acquire's, the send's, and a caller's (post's held) */
    atomic_int early; /* sent by its producer (send_from) */
};

static void unhold(struct sp_xfer_req *r)
{
    if (atomic_fetch_sub(&r->holds, 1) == 1)
        free(r);
}

static void sent(void *p)
{
    progress_slice();
    struct sp_xfer_req *r = p;
    sp_stage_put(&M.stage, r->stage);
    r->done(r->arg, NULL);
    atomic_fetch_sub(&M.open, 1); /* after done: the executor's step waits for this */
    unhold(r);
}

static void stage_unregister(sp_stage *b)
{
    if (b->user)
        starpu_data_unregister_no_coherency(b->user);
}

/* A free block of bytes with its handle (registered on first use), or NULL. The handle
 * keeps its first send's count and element size; a later send of the same bytes may
 * reuse it, since StarPU-MPI sends a vector as nx * elemsize contiguous bytes
 * (mpi/src/starpu_mpi_datatype.c), which is all the receiver's handle is matched on. */
static sp_stage *stage_block(size_t bytes, size_t count, size_t elemsize)
{
    sp_stage *b = sp_stage_get(&M.stage, bytes);
    if (b && !b->user) {
        starpu_data_handle_t sh;
        starpu_vector_data_register(&sh, STARPU_MAIN_RAM, (uintptr_t)b->data, (uint32_t)count,
                                    elemsize);
        b->user = sh;
    }
    return b;
}

/* Copies the data at ptr into a block and sends the block. On failure the transfer ends
 * at once with the step failed (the receiver's watchdog then reports the missing
 * message). */
static void send_copy(struct sp_xfer_req *r, const void *ptr)
{
    size_t bytes = r->count * r->elemsize;
    char why[200];
    r->stage = stage_block(bytes, r->count, r->elemsize);
    int rc = -ENOMEM;
    if (r->stage) {
        memcpy(r->stage->data, ptr, bytes);
        rc = starpu_mpi_isend_detached(r->stage->user, r->peer, r->tag, M.comm, sent, r);
    }
    atomic_fetch_sub(&M.unhanded, 1); /* in StarPU-MPI's hands, or failed */
    if (rc >= 0)
        return;
    if (r->stage)
        sp_stage_put(&M.stage, r->stage);
    snprintf(why, sizeof why, "%s:%d: starpu_mpi_isend_detached of message #%" PRIu32
             " to rank %d failed: %s", __FILE__, __LINE__, r->msg, r->peer,
             r->stage ? strerror(-rc) : "out of memory for its copy");
    r->done(r->arg, why);
    atomic_fetch_sub(&M.open, 1);
    unhold(r);
}

/* StarPU's acquire callback: the buffer is ready in host memory, and ours until
 * released. A send its producer posted already only waited for this to keep the buffer
 * from its next writer until the copy was made. */
static void granted(void *p)
{
    struct sp_xfer_req *r = p;
    if (!atomic_load(&r->early))
        send_copy(r, starpu_data_handle_to_pointer(r->h, STARPU_MAIN_RAM));
    starpu_data_release_on_node(r->h, STARPU_MAIN_RAM);
    unhold(r);
}

static void smpi_send_from(sp_xfer_req *r, void *ptr)
{
    atomic_store(&r->early, 1);
    atomic_fetch_add(&M.by_producer, 1);
    send_copy(r, ptr);
}

static void smpi_drop(sp_xfer_req *r) { unhold(r); }

static size_t smpi_staging_bytes(void) { return sp_stage_bytes(&M.stage); }

/* The callback is also what keeps StarPU-MPI's "cooperative sends" off: with a NULL
 * callback, detached sends of one buffer to several ranks are merged and rerouted through
 * a broadcast tree in which receivers forward the data. That would add messages the plan
 * does not know about, breaking its single global message order. */
static sp_status smpi_post(const sp_xfer *x, sp_xfer_done done, void *arg, sp_xfer_req **held)
{
    if (!done)
        return sp_set_error(SP_ERR_ARG, "starpu-mpi transport: a completion callback is "
                            "required");
    int64_t tag = tag_of(M.step, x->msg);
    size_t bytes = x->count * x->elemsize;
    int rc;
    if (x->is_send) {
        struct sp_xfer_req *r = malloc(sizeof *r);
        if (!r)
            return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
        *r = (struct sp_xfer_req){ .h = x->h, .count = x->count, .elemsize = x->elemsize,
                                   .peer = x->peer, .msg = x->msg, .tag = tag, .done = done,
                                   .arg = arg };
        atomic_init(&r->holds, held ? 3 : 2);
        atomic_init(&r->early, 0);
        atomic_fetch_add(&M.open, 1);
        atomic_fetch_add(&M.unhanded, 1);
        rc = starpu_data_acquire_on_node_cb_sequential_consistency(x->h, STARPU_MAIN_RAM,
                                                                   STARPU_R, granted, r, 1);
        if (rc < 0) {
            atomic_fetch_sub(&M.open, 1);
            atomic_fetch_sub(&M.unhanded, 1);
            free(r);
        } else if (held) {
            *held = r;
        }
    } else {
        completion *c = malloc(sizeof *c);
        if (!c)
            return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
        *c = (completion){ done, arg };
        atomic_fetch_add(&M.open, 1);
        rc = starpu_mpi_irecv_detached(x->h, x->peer, tag, M.comm, finished, c);
        if (rc < 0) {
            atomic_fetch_sub(&M.open, 1);
            free(c);
        }
    }
    if (rc < 0)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: %s of message #%" PRIu32 " with rank %d "
                            "failed: %s", __FILE__, __LINE__,
                            x->is_send ? "acquiring the buffer" : "starpu_mpi_irecv_detached",
                            x->msg, x->peer, strerror(-rc));
    atomic_fetch_add(x->is_send ? &M.sends : &M.recvs, 1);
    atomic_fetch_add(x->is_send ? &M.bytes_sent : &M.bytes_received, bytes);
    return SP_OK;
}

static int smpi_pending(void) { return atomic_load(&M.open); }

static void wait_zero(atomic_int *n)
{
    while (atomic_load(n) > 0)
        nanosleep(&(struct timespec){ 0, 20000 }, NULL);
}

/* Every request of StarPU-MPI on every rank (collective). */
static sp_status smpi_drain(void)
{
    /* First every send into StarPU-MPI's hands: its barrier below runs MPI_Barrier on its
     * progress thread, which then serves no request until every rank arrives, so a send
     * handed over later (its buffer granted after the rank's last task, as a GPU
     * buffer's copy to the host can be) would never leave, and its receiver never arrive
     * (seen on GPU ranks). What that waits for is local: the rank's tasks are done, and
     * only the copies of their buffers to the host remain. */
    wait_zero(&M.unhanded);
    int rc = starpu_mpi_wait_for_all(M.comm);
    if (rc < 0)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: starpu_mpi_wait_for_all failed: %s",
                            __FILE__, __LINE__, strerror(-rc));
    wait_zero(&M.open); /* StarPU-MPI's requests are done; their callbacks may be returning */
    return SP_OK;
}

static void smpi_counts(sp_xfer_counts *out)
{
    *out = (sp_xfer_counts){ .sends = atomic_load(&M.sends), .recvs = atomic_load(&M.recvs),
                             .by_producer = atomic_load(&M.by_producer),
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
    .send_from = smpi_send_from,
    .drop = smpi_drop,
    .pending = smpi_pending,
    .drain = smpi_drain,
    .counts = smpi_counts,
    .tag = smpi_tag,
    .staging_bytes = smpi_staging_bytes,
};
