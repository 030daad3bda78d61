/* Direct transfers: the pipeline's messages as plain MPI_Isend / MPI_Irecv, posted by the
 * thread that makes the buffer ready and completed by the rank's idle workers, with no
 * StarPU-MPI progress thread on the path (runtime/README.md, "Transfers").
 *
 * A send acquires its buffer for reading on the host (StarPU's sequential consistency
 * puts the acquire after the producing task); StarPU calls back when the producer ends,
 * on the worker that ran it, and the callback posts MPI_Isend there and then. A receive
 * acquires its buffer for writing (after its earlier readers) and posts MPI_Irecv. Each
 * request holds its buffer until MPI completes it, so later tasks wait as they would for
 * a task; a send above the eager limit goes from a private copy instead (below). Completion is tested by sp_comm_direct_progress, which StarPU's drivers call on
 * every turn of their loop (a progression hook), i.e. after each task and continuously
 * while a worker has nothing to run; the scheduling policy keeps idle workers polling
 * rather than parked while a request is in flight (sp_policy_set_idle_poll). Releasing a
 * completed receive's buffer makes its consumer ready on the same thread. */
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

typedef struct direct_req {
    starpu_data_handle_t h;
    size_t count, elemsize;
    int peer, is_send;
    uint32_t msg;
    sp_comm_done done;
    void *arg;
    void *stage;             /* a send's private copy (large sends), or NULL */
    int released;            /* h went back to StarPU already (a staged send) */
    struct direct_req *next; /* completed, waiting to be finished */
    const char *err;
    char why[MPI_MAX_ERROR_STRING + 96];
} direct_req;

static struct {
    int up;
    MPI_Comm comm;       /* ours: its own matching space, errors returned, not fatal */
    int tag_ub;
    int hook;            /* StarPU progression hook id */
    pthread_mutex_t lock;
    /* In-flight MPI requests and their records, in parallel arrays for MPI_Testsome. */
    MPI_Request *mpi;
    direct_req **reqs;
    int n, cap;
    int *idx;            /* MPI_Testsome's outputs, cap of each */
    MPI_Status *st;
    atomic_int waiting;  /* posted to us, buffer not yet acquired */
    atomic_int inflight; /* posted to MPI, not yet completed */
    void (*poke)(void);  /* wakes parked workers: a request is now in flight */
    /* Copies of large sends in flight (stage_get): free blocks, and all bytes held. */
    pthread_mutex_t stage_lock;
    struct stage_block *free_blocks;
    size_t stage_bytes;
} D = { .lock = PTHREAD_MUTEX_INITIALIZER, .stage_lock = PTHREAD_MUTEX_INITIALIZER };

/* ---- private copies of large sends ----
 * Above the eager limit a send completes only once the receiver has posted its receive
 * and pulled the data, and the receiver posts it only when its own buffer is free, maybe
 * after a task of tens of milliseconds. Held that long, the sender's buffer would stall
 * the sender's next task whenever the plan's pool hands that buffer out again (measured:
 * interleaved 1F1B, 256 KB messages, tasks waiting 10-20 ms). So a large send goes from a
 * copy and gives its buffer back at once, as an eager send does; the copies are reused by
 * size, and what they hold is sp_comm_direct_staging_bytes(). */
typedef struct stage_block {
    size_t bytes;
    struct stage_block *next;
    _Alignas(64) unsigned char data[];
} stage_block;

static void *stage_get(size_t bytes)
{
    pthread_mutex_lock(&D.stage_lock);
    stage_block **p = &D.free_blocks;
    while (*p && (*p)->bytes != bytes)
        p = &(*p)->next;
    stage_block *b = *p;
    if (b)
        *p = b->next;
    pthread_mutex_unlock(&D.stage_lock);
    if (!b && (b = malloc(sizeof *b + bytes))) {
        b->bytes = bytes;
        pthread_mutex_lock(&D.stage_lock);
        D.stage_bytes += bytes;
        pthread_mutex_unlock(&D.stage_lock);
    }
    return b ? b->data : NULL;
}

static void stage_put(void *data)
{
    stage_block *b = (stage_block *)((unsigned char *)data - offsetof(stage_block, data));
    pthread_mutex_lock(&D.stage_lock);
    b->next = D.free_blocks;
    D.free_blocks = b;
    pthread_mutex_unlock(&D.stage_lock);
}

size_t sp_comm_direct_staging_bytes(void)
{
    pthread_mutex_lock(&D.stage_lock);
    size_t n = D.stage_bytes;
    pthread_mutex_unlock(&D.stage_lock);
    return n;
}

/* Ends a request: the buffer goes back to StarPU (its next task may start), then the
 * owner hears of it. err is NULL on success. */
static void finish(direct_req *r, const char *err)
{
    if (!r->released)
        starpu_data_release_on_node(r->h, STARPU_MAIN_RAM);
    if (r->stage)
        stage_put(r->stage);
    r->done(r->arg, err);
    free(r);
}

static void fail_mpi(direct_req *r, const char *call, int rc)
{
    char text[MPI_MAX_ERROR_STRING] = "", msg[MPI_MAX_ERROR_STRING + 160];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    snprintf(msg, sizeof msg, "%s of message #%" PRIu32 " %s rank %d (%zu bytes) failed: %s",
             call, r->msg, r->is_send ? "to" : "from", r->peer, r->count * r->elemsize, text);
    finish(r, msg);
}

/* Doubles the table of requests in flight (and MPI_Testsome's outputs). Called with
 * D.lock held; 0 when out of memory. */
static int grow_table(void)
{
    int cap = D.cap ? 2 * D.cap : 64;
    MPI_Request *m = realloc(D.mpi, (size_t)cap * sizeof *m);
    if (m)
        D.mpi = m;
    direct_req **o = m ? realloc(D.reqs, (size_t)cap * sizeof *o) : NULL;
    if (o)
        D.reqs = o;
    int *x = o ? realloc(D.idx, (size_t)cap * sizeof *x) : NULL;
    if (x)
        D.idx = x;
    MPI_Status *t = x ? realloc(D.st, (size_t)cap * sizeof *t) : NULL;
    if (t)
        D.st = t;
    if (!t)
        return 0;
    D.cap = cap;
    return 1;
}

/* The StarPU acquire callback: the buffer is ready in host memory. Runs on whichever
 * thread made it ready (the worker that ran the producer, or the poster). */
static void start(void *arg)
{
    direct_req *r = arg;
    void *ptr = starpu_data_handle_to_pointer(r->h, STARPU_MAIN_RAM);
    size_t bytes = r->count * r->elemsize;
    if (r->is_send && bytes > SP_COMM_EAGER_BYTES && (r->stage = stage_get(bytes))) {
        memcpy(r->stage, ptr, bytes);
        starpu_data_release_on_node(r->h, STARPU_MAIN_RAM);
        r->released = 1;
        ptr = r->stage;
    }
    MPI_Datatype type = MPI_BYTE;
    int count = (int)bytes, rc = MPI_SUCCESS;
    if (bytes > INT_MAX) /* counts are ints: elements of elemsize bytes (count <= INT_MAX) */
        rc = MPI_Type_contiguous((int)r->elemsize, MPI_BYTE, &type);
    if (rc == MPI_SUCCESS && type != MPI_BYTE) {
        rc = MPI_Type_commit(&type);
        count = (int)r->count;
    }
    MPI_Request q = MPI_REQUEST_NULL;
    if (rc == MPI_SUCCESS)
        rc = r->is_send ? MPI_Isend(ptr, count, type, r->peer, (int)r->msg, D.comm, &q)
                        : MPI_Irecv(ptr, count, type, r->peer, (int)r->msg, D.comm, &q);
    if (type != MPI_BYTE)
        MPI_Type_free(&type); /* freed once the request no longer needs it */
    atomic_fetch_sub(&D.waiting, 1);
    if (rc != MPI_SUCCESS) {
        fail_mpi(r, r->is_send ? "MPI_Isend" : "MPI_Irecv", rc);
        return;
    }
    /* An eager send is complete already: give its buffer back now rather than at the
     * next test, which may come only after the worker's next task. */
    int flag = 0;
    if (r->is_send && MPI_Test(&q, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
        finish(r, NULL);
        return;
    }
    pthread_mutex_lock(&D.lock);
    int room = D.n < D.cap || grow_table(), first = 0;
    if (room) {
        D.mpi[D.n] = q;
        D.reqs[D.n++] = r;
        first = atomic_fetch_add(&D.inflight, 1) == 0;
    }
    pthread_mutex_unlock(&D.lock);
    if (!room) { /* the request is posted and cannot be tracked: wait for it here */
        MPI_Wait(&q, MPI_STATUS_IGNORE);
        finish(r, "out of memory for the table of MPI requests");
        return;
    }
    /* A worker parks only after seeing no request in flight, so only the first one in
     * flight needs to wake it. */
    if (first && D.poke)
        D.poke();
}

/* A completed request's status: NULL if the transfer is whole, else why not. */
static const char *check_status(direct_req *r, const MPI_Status *s, char *msg, size_t n)
{
    if (s->MPI_ERROR != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING] = "";
        int len = 0;
        MPI_Error_string(s->MPI_ERROR, text, &len);
        snprintf(msg, n, "message #%" PRIu32 " %s rank %d: %s", r->msg,
                 r->is_send ? "to" : "from", r->peer, text);
        return msg;
    }
    if (r->is_send)
        return NULL;
    MPI_Count got = 0;
    MPI_Get_elements_x(s, MPI_BYTE, &got);
    if ((size_t)got != r->count * r->elemsize) {
        snprintf(msg, n, "message #%" PRIu32 " from rank %d: %lld bytes arrived, %zu expected "
                 "(the two ranks registered different sizes)", r->msg, r->peer,
                 (long long)got, r->count * r->elemsize);
        return msg;
    }
    return NULL;
}

int sp_comm_direct_progress(void)
{
    if (atomic_load_explicit(&D.inflight, memory_order_relaxed) == 0)
        return 0;
    if (pthread_mutex_trylock(&D.lock) != 0)
        return 0; /* another thread is testing them */
    int nout = 0, ndone = 0;
    int rc = D.n ? MPI_Testsome(D.n, D.mpi, &nout, D.idx, D.st) : MPI_SUCCESS;
    if ((rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) || nout == MPI_UNDEFINED)
        nout = 0; /* nothing is known of these requests; the watchdog covers a hang */
    direct_req *first = NULL, **tail = &first;
    for (int i = 0; i < nout; i++) {
        direct_req *r = D.reqs[D.idx[i]];
        if (rc != MPI_ERR_IN_STATUS)
            D.st[i].MPI_ERROR = MPI_SUCCESS; /* only then is the field set */
        r->err = check_status(r, &D.st[i], r->why, sizeof r->why);
        r->next = NULL;
        *tail = r;
        tail = &r->next;
        D.reqs[D.idx[i]] = NULL;
        ndone++;
    }
    if (ndone) { /* compact, keeping the others in posting order */
        int k = 0;
        for (int i = 0; i < D.n; i++)
            if (D.reqs[i]) {
                D.mpi[k] = D.mpi[i];
                D.reqs[k++] = D.reqs[i];
            }
        D.n = k;
        atomic_fetch_sub(&D.inflight, ndone);
    }
    pthread_mutex_unlock(&D.lock);
    /* Outside the lock: a release may make a task ready and grant another request's
     * acquire, whose callback posts (and locks) at once. */
    while (first) {
        direct_req *r = first;
        first = r->next;
        finish(r, r->err);
    }
    return ndone;
}

/* StarPU calls this on every turn of every driver loop; 0 keeps the driver from
 * blocking (StarPU's blocking drivers only) while requests are in flight. */
static unsigned progress_hook(void *arg)
{
    (void)arg;
    sp_comm_direct_progress();
    return atomic_load_explicit(&D.inflight, memory_order_relaxed) == 0;
}

int sp_comm_direct_inflight(void) { return atomic_load(&D.inflight); }

int sp_comm_direct_pending(void) { return atomic_load(&D.waiting) + atomic_load(&D.inflight); }

sp_status sp_comm_direct_init(MPI_Comm world, void (*poke)(void))
{
    if (D.up)
        return sp_set_error(SP_ERR_ARG, "sp_comm_direct_init: already started");
    int rc = MPI_Comm_dup(world, &D.comm);
    if (rc != MPI_SUCCESS)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: MPI_Comm_dup failed (%d)", __FILE__,
                            __LINE__, rc);
    MPI_Comm_set_errhandler(D.comm, MPI_ERRORS_RETURN);
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(D.comm, MPI_TAG_UB, &ub, &flag);
    D.tag_ub = flag && ub ? *ub : 32767; /* the least the standard allows */
    D.hook = starpu_progression_hook_register(progress_hook, NULL);
    if (D.hook < 0) {
        MPI_Comm_free(&D.comm);
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: no free StarPU progression hook",
                            __FILE__, __LINE__);
    }
    D.poke = poke;
    D.up = 1;
    return SP_OK;
}

void sp_comm_direct_shutdown(void)
{
    if (!D.up)
        return;
    while (D.free_blocks) {
        stage_block *b = D.free_blocks;
        D.free_blocks = b->next;
        free(b);
    }
    D.stage_bytes = 0;
    starpu_progression_hook_deregister(D.hook);
    MPI_Comm_free(&D.comm);
    free(D.mpi);
    free(D.reqs);
    free(D.idx);
    free(D.st);
    D.mpi = NULL;
    D.reqs = NULL;
    D.idx = NULL;
    D.st = NULL;
    D.n = D.cap = 0;
    D.up = 0;
}

sp_status sp_comm_direct_post(starpu_data_handle_t h, size_t count, size_t elemsize, int peer,
                              uint32_t msg, int is_send, sp_comm_done done, void *arg)
{
    const char *what = is_send ? "send" : "recv";
    if (!D.up)
        return sp_set_error(SP_ERR_ARG, "sp_comm_direct_post: not started");
    if (!done)
        return sp_set_error(SP_ERR_ARG, "sp_comm_direct_post: a completion callback is "
                            "required");
    if (msg > (uint32_t)D.tag_ub)
        return sp_set_error(SP_ERR_ARG, "%s of message #%" PRIu32 ": the MPI library's tag "
                            "bound is %d; a step may number at most that many messages",
                            what, msg, D.tag_ub);
    if (count > INT_MAX)
        return sp_set_error(SP_ERR_ARG, "%s of message #%" PRIu32 ": %zu elements exceed "
                            "what one MPI message can count", what, msg, count);
    direct_req *r = malloc(sizeof *r);
    if (!r)
        return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
    *r = (direct_req){ .h = h, .count = count, .elemsize = elemsize, .peer = peer,
                       .is_send = is_send, .msg = msg, .done = done, .arg = arg };
    atomic_fetch_add(&D.waiting, 1);
    int rc = starpu_data_acquire_on_node_cb_sequential_consistency(
        h, STARPU_MAIN_RAM, is_send ? STARPU_R : STARPU_W, start, r, 1);
    if (rc < 0) {
        atomic_fetch_sub(&D.waiting, 1);
        free(r);
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: acquiring the buffer of message #%" PRIu32
                            " failed: %s", __FILE__, __LINE__, msg, strerror(-rc));
    }
    return SP_OK;
}
