/* Direct transfers: the pipeline's messages as plain MPI_Isend / MPI_Irecv, posted by the
 * thread that makes the buffer ready and completed by the rank's idle workers, with no
 * StarPU-MPI progress thread on the path (docs/runtime.md, "Transfers").
 *
 * A send acquires its buffer for reading on the host (StarPU's sequential consistency
 * puts the acquire after the producing task). The task that wrote the data usually posts
 * the send itself as its function returns (send_from, called by the
 * executor's wrapper); otherwise StarPU's acquire callback does, once it has ended the
 * producer. A receive acquires its buffer for writing (after its earlier readers) and
 * posts MPI_Irecv in the callback. Every send goes from a private copy, so its buffer
 * goes back to StarPU as soon as granted; a receive holds its buffer until MPI completes
 * it, so later tasks wait as they would for a task. Above the eager limit a transfer to a
 * rank of the same node goes as eager pieces (below). Completion is tested by
 * direct_progress(), which StarPU's drivers call on every turn of their loop (a
 * progression hook), i.e. after each task and continuously while a worker has nothing to
 * run; the scheduling policy keeps idle workers polling rather than parked while a
 * request is in flight (sp_policy_set_idle_poll). Releasing a completed receive's buffer
 * makes its consumer ready on the same thread. */
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/stage.h"
#include "comm/transport.h"

struct sp_xfer_req {
    starpu_data_handle_t h;
    size_t count, elemsize;
    int peer, is_send;
    uint32_t msg;
    sp_xfer_done done;
    void *arg;
    sp_stage *stage;         /* a send's private copy, or NULL (out of memory) */
    int released;            /* h went back to StarPU already (a staged send) */
    int nparts, left;        /* MPI messages it is cut into; those not yet complete */
    atomic_int holds;        /* what must end before it finishes: the buffer's acquire, the
                                MPI requests, and a caller's hold (post) */
    atomic_int early;        /* posted by its producer already (send_from) */
    struct sp_xfer_req *next; /* completed, waiting to be finished */
    const char *err;         /* the first error, in why */
    char why[MPI_MAX_ERROR_STRING + 160];
    MPI_Request q[];         /* its pieces' requests while post_all posts them */
};
typedef struct sp_xfer_req direct_req;

/* What direct_counts() reports. */
enum { COUNT_SENDS, COUNT_RECVS, COUNT_PIECED, COUNT_EARLY, COUNT_BYTES_SENT, COUNT_BYTES_RECV,
       NCOUNTS };

static struct {
    int up;
    MPI_Comm comm;       /* ours: its own matching space, errors returned, not fatal */
    int tag_ub;
    int hook;            /* StarPU progression hook id */
    pthread_mutex_t lock;
    int size;            /* ranks of comm */
    unsigned char *local; /* per rank of comm: on this node (shared memory) */
    int pieces;          /* cut transfers between ranks of a node (init) */
    /* In-flight MPI requests and their records, in parallel arrays for MPI_Testsome. */
    MPI_Request *mpi;
    direct_req **reqs;
    int *part;           /* which piece of its transfer each request carries */
    int n, cap;
    int *idx;            /* MPI_Testsome's outputs, cap of each */
    MPI_Status *st;
    atomic_int open;     /* transfers posted to us and not yet finished */
    atomic_ullong count[NCOUNTS];
    atomic_int inflight; /* MPI requests posted and not yet seen complete */
    void (*poke)(void);  /* wakes parked workers: a request is now in flight */
    sp_stage_pool stage; /* copies of sends */
} D = { .lock = PTHREAD_MUTEX_INITIALIZER, .stage = SP_STAGE_POOL_INIT };

/* ---- large transfers within a node: eager pieces ----
 * Above OpenMPI's shared-memory eager limit a message is pulled by its receiver (CMA:
 * process_vm_readv, pinning each page), and only when the receiver next polls, which a
 * busy receiver does after its task: 100-300 us for 512 KB in a step's MPI_Testsome on
 * the 2-core VM, three to eight times a memcpy of it. Cut into pieces of at most
 * SP_COMM_EAGER_BYTES, each one eager, the sender copies the data into shared memory at
 * once and the receiver only copies it out. Pieces of one transfer share its tag and
 * match in order (MPI never overtakes within a tag). The last piece is always shorter
 * than the others (maybe empty), so ranks that registered different sizes always meet a
 * piece of the wrong size, never wait for one that no one sends. */
static int nparts_of(size_t bytes, int peer)
{
    return D.pieces && D.local[peer] && bytes >= SP_COMM_EAGER_BYTES
               ? (int)(bytes / SP_COMM_EAGER_BYTES) + 1 : 1;
}

static size_t part_bytes(const direct_req *r, int i)
{
    size_t bytes = r->count * r->elemsize;
    return r->nparts == 1 ? bytes
           : i < r->nparts - 1 ? SP_COMM_EAGER_BYTES
                               : bytes - (size_t)(r->nparts - 1) * SP_COMM_EAGER_BYTES;
}

/* ---- private copies of sends (stage.h) ----
 * Measured here: interleaved 1F1B with 256 KB messages, tasks waited 10-20 ms for their
 * buffer; with eager pieces sent from the buffers, 1.06-1.09x the replay for interleaved,
 * zb-v, dualpipe-v. The copy (20-40 us for 512 KB) is made as the send is posted, while
 * the data is still in cache. */

static size_t direct_staging_bytes(void) { return sp_stage_bytes(&D.stage); }

/* Ends a transfer: the buffer goes back to StarPU (its next task may start), then the
 * owner hears of it. err is NULL on success. */
static void finish(direct_req *r, const char *err)
{
    if (!r->released)
        starpu_data_release_on_node(r->h, STARPU_MAIN_RAM);
    if (r->stage)
        sp_stage_put(&D.stage, r->stage);
    r->done(r->arg, err);
    free(r);
    atomic_fetch_sub(&D.open, 1); /* last: the executor's step waits for this */
}

/* Drops one of r's holds; the last one finishes it. */
static void drop(direct_req *r)
{
    if (atomic_fetch_sub(&r->holds, 1) == 1)
        finish(r, r->err);
}

/* Keeps the first error of a transfer in r->why (later ones follow from it). */
static void set_error(direct_req *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_error(direct_req *r, const char *fmt, ...)
{
    if (r->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
    r->err = r->why;
}

static void set_mpi_error(direct_req *r, const char *call, int rc)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    set_error(r, "%s of message #%" PRIu32 " %s rank %d (%zu bytes) failed: %s", call, r->msg,
              r->is_send ? "to" : "from", r->peer, r->count * r->elemsize, text);
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
    int *pt = o ? realloc(D.part, (size_t)cap * sizeof *pt) : NULL;
    if (pt)
        D.part = pt;
    int *x = pt ? realloc(D.idx, (size_t)cap * sizeof *x) : NULL;
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

/* Posts piece i of r (n bytes at ptr) as one MPI request. */
static int post_piece(direct_req *r, void *ptr, size_t n, MPI_Request *q)
{
    MPI_Datatype type = MPI_BYTE;
    int count = (int)n, rc = MPI_SUCCESS;
    if (n > INT_MAX) /* counts are ints: elements of elemsize bytes (count <= INT_MAX) */
        rc = MPI_Type_contiguous((int)r->elemsize, MPI_BYTE, &type);
    if (rc == MPI_SUCCESS && type != MPI_BYTE) {
        rc = MPI_Type_commit(&type);
        count = (int)r->count;
    }
    if (rc == MPI_SUCCESS)
        rc = r->is_send ? MPI_Isend(ptr, count, type, r->peer, (int)r->msg, D.comm, q)
                        : MPI_Irecv(ptr, count, type, r->peer, (int)r->msg, D.comm, q);
    if (type != MPI_BYTE)
        MPI_Type_free(&type); /* freed once the request no longer needs it */
    return rc;
}

/* Hands r to MPI from ptr, the buffer's host memory (a send from a private copy: the
 * buffer is not needed after it), and drops r's MPI hold once every piece is complete:
 * here if complete at once, else in direct_progress(). */
static void post_all(direct_req *r, unsigned char *ptr)
{
    size_t bytes = r->count * r->elemsize;
    if (r->is_send && (r->stage = sp_stage_get(&D.stage, bytes))) {
        memcpy(r->stage->data, ptr, bytes);
        ptr = r->stage->data;
    }
    int posted = 0;
    for (; posted < r->nparts; posted++) {
        int rc = post_piece(r, ptr + (size_t)posted * SP_COMM_EAGER_BYTES,
                            part_bytes(r, posted), &r->q[posted]);
        if (rc != MPI_SUCCESS) {
            set_mpi_error(r, r->is_send ? "MPI_Isend" : "MPI_Irecv", rc);
            break;
        }
    }
    /* Eager sends may be complete already (MPI_Test nulls them). A failed transfer's
     * receives already posted are cancelled; they still complete. */
    int left = 0;
    for (int i = 0; i < posted; i++) {
        int flag = 0;
        if (r->is_send)
            MPI_Test(&r->q[i], &flag, MPI_STATUS_IGNORE);
        else if (r->err)
            MPI_Cancel(&r->q[i]);
        left += r->q[i] != MPI_REQUEST_NULL;
    }
    if (!left) {
        drop(r);
        return;
    }
    r->left = left;
    pthread_mutex_lock(&D.lock);
    int room = 1;
    while (room && D.n + left > D.cap)
        room = grow_table();
    if (room) {
        for (int i = 0; i < posted; i++)
            if (r->q[i] != MPI_REQUEST_NULL) {
                D.mpi[D.n] = r->q[i];
                D.part[D.n] = i;
                D.reqs[D.n++] = r;
            }
    }
    int first = room && atomic_fetch_add(&D.inflight, left) == 0;
    pthread_mutex_unlock(&D.lock);
    if (!room) { /* the requests are posted and cannot be tracked: wait for them here */
        MPI_Waitall(posted, r->q, MPI_STATUSES_IGNORE);
        set_error(r, "out of memory for the table of MPI requests");
        drop(r);
        return;
    }
    /* A worker parks only after seeing no request in flight, so only the first one in
     * flight needs to wake it. */
    if (first && D.poke)
        D.poke();
}

/* The StarPU acquire callback: the buffer is ready in host memory, and ours until
 * released. Runs on whichever thread made it ready (the worker that ran the producer,
 * or the poster). A send its producer posted already only had to wait for this to
 * keep the buffer from its next writer until MPI is done with it. */
static void start(void *arg)
{
    direct_req *r = arg;
    if (!atomic_load(&r->early))
        post_all(r, starpu_data_handle_to_pointer(r->h, STARPU_MAIN_RAM));
    if (r->stage) { /* sent from a copy: the buffer is free */
        starpu_data_release_on_node(r->h, STARPU_MAIN_RAM);
        r->released = 1;
    }
    drop(r);
}

static void direct_send_from(sp_xfer_req *r, void *ptr)
{
    atomic_store(&r->early, 1);
    atomic_fetch_add(&D.count[COUNT_EARLY], 1);
    post_all(r, ptr);
}

static void direct_counts(sp_xfer_counts *out)
{
    *out = (sp_xfer_counts){ atomic_load(&D.count[COUNT_SENDS]), atomic_load(&D.count[COUNT_RECVS]),
                             atomic_load(&D.count[COUNT_PIECED]), atomic_load(&D.count[COUNT_EARLY]),
                             atomic_load(&D.count[COUNT_BYTES_SENT]),
                             atomic_load(&D.count[COUNT_BYTES_RECV]) };
}

/* Records the outcome of piece i of r from its status: an MPI error, or a piece of a
 * receive of another size than expected (the ranks registered different sizes). */
static void check_status(direct_req *r, int i, const MPI_Status *s)
{
    int cancelled = 0;
    MPI_Test_cancelled(s, &cancelled);
    if (cancelled) /* only after an error, which is kept */
        return;
    if (s->MPI_ERROR != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING] = "";
        int len = 0;
        MPI_Error_string(s->MPI_ERROR, text, &len);
        set_error(r, "message #%" PRIu32 " %s rank %d: %s", r->msg,
                  r->is_send ? "to" : "from", r->peer, text);
        return;
    }
    if (r->is_send)
        return;
    MPI_Count got = 0;
    MPI_Get_elements_x(s, MPI_BYTE, &got);
    size_t want = part_bytes(r, i);
    if ((size_t)got == want)
        return;
    if (r->nparts == 1)
        set_error(r, "message #%" PRIu32 " from rank %d: %lld bytes arrived, %zu expected "
                  "(the two ranks registered different sizes)", r->msg, r->peer,
                  (long long)got, want);
    else
        set_error(r, "message #%" PRIu32 " from rank %d: %lld bytes arrived in piece %d of "
                  "%d, %zu expected (the two ranks registered different sizes; %zu bytes "
                  "here)", r->msg, r->peer, (long long)got, i + 1, r->nparts, want,
                  r->count * r->elemsize);
}

static int direct_progress(void)
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
        int j = D.idx[i];
        direct_req *r = D.reqs[j];
        if (rc != MPI_ERR_IN_STATUS)
            D.st[i].MPI_ERROR = MPI_SUCCESS; /* only then is the field set */
        int failed = r->err != NULL;
        check_status(r, D.part[j], &D.st[i]);
        if (!failed && r->err && !r->is_send) /* its other pieces will not come right */
            for (int k = 0; k < D.n; k++)
                if (k != j && D.reqs[k] == r && D.mpi[k] != MPI_REQUEST_NULL)
                    MPI_Cancel(&D.mpi[k]);
        D.reqs[j] = NULL;
        if (--r->left == 0) {
            r->next = NULL;
            *tail = r;
            tail = &r->next;
            ndone++;
        }
    }
    if (nout) { /* compact, keeping the others in posting order */
        int k = 0;
        for (int i = 0; i < D.n; i++)
            if (D.reqs[i]) {
                D.mpi[k] = D.mpi[i];
                D.part[k] = D.part[i];
                D.reqs[k++] = D.reqs[i];
            }
        D.n = k;
        atomic_fetch_sub(&D.inflight, nout);
    }
    pthread_mutex_unlock(&D.lock);
    /* Outside the lock: a release may make a task ready and grant another request's
     * acquire, whose callback posts (and locks) at once. */
    while (first) {
        direct_req *r = first;
        first = r->next;
        drop(r);
    }
    return ndone;
}

/* StarPU calls this on every turn of every driver loop; 0 keeps the driver from
 * blocking (StarPU's blocking drivers only) while requests are in flight. */
static unsigned progress_hook(void *arg)
{
    (void)arg;
    direct_progress();
    return atomic_load_explicit(&D.inflight, memory_order_relaxed) == 0;
}

static int direct_inflight(void) { return atomic_load(&D.inflight); }

static int direct_pending(void) { return atomic_load(&D.open); }

/* Marks the ranks of D.comm that share this rank's node (memory). Collective. */
static int find_local_ranks(void)
{
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Group all = MPI_GROUP_NULL, here = MPI_GROUP_NULL;
    int n = 0, *mine = NULL, *theirs = NULL;
    int rc = MPI_Comm_size(D.comm, &D.size);
    if (rc == MPI_SUCCESS && !(D.local = calloc((size_t)D.size, 1)))
        rc = MPI_ERR_NO_MEM;
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_split_type(D.comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(node, &n);
    if (rc == MPI_SUCCESS && (!(mine = malloc((size_t)n * sizeof *mine)) ||
                              !(theirs = malloc((size_t)n * sizeof *theirs))))
        rc = MPI_ERR_NO_MEM;
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_group(node, &here);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_group(D.comm, &all);
    for (int i = 0; i < n; i++)
        mine[i] = i;
    if (rc == MPI_SUCCESS)
        rc = MPI_Group_translate_ranks(here, n, mine, all, theirs);
    for (int i = 0; rc == MPI_SUCCESS && i < n; i++)
        if (theirs[i] >= 0 && theirs[i] < D.size)
            D.local[theirs[i]] = 1;
    if (here != MPI_GROUP_NULL)
        MPI_Group_free(&here);
    if (all != MPI_GROUP_NULL)
        MPI_Group_free(&all);
    if (node != MPI_COMM_NULL)
        MPI_Comm_free(&node);
    free(mine);
    free(theirs);
    return rc;
}

/* *out = a duplicate of from (its own matching space) whose errors return, not abort. */
static sp_status dup_comm(MPI_Comm from, MPI_Comm *out)
{
    int rc = MPI_Comm_dup(from, out);
    if (rc != MPI_SUCCESS)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: MPI_Comm_dup failed (%d)", __FILE__,
                            __LINE__, rc);
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return SP_OK;
}

static sp_status direct_init(const sp_transport_config *c, int *active, char *notice, size_t len)
{
    *active = 0;
    if (len) notice[0] = '\0';
    if (D.up)
        return sp_set_error(SP_ERR_ARG, "direct transport: already started");
    sp_status st = dup_comm(c->world, &D.comm);
    if (st)
        return st;
    int rc = find_local_ranks();
    if (rc != MPI_SUCCESS) {
        free(D.local);
        D.local = NULL;
        MPI_Comm_free(&D.comm);
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: finding the ranks of this node failed "
                            "(%d)", __FILE__, __LINE__, rc);
    }
    D.pieces = c->pieces;
    int *ub = NULL, flag = 0;
    MPI_Comm_get_attr(D.comm, MPI_TAG_UB, &ub, &flag);
    D.tag_ub = flag && ub ? *ub : 32767; /* the least the standard allows */
    D.hook = starpu_progression_hook_register(progress_hook, NULL);
    if (D.hook < 0) {
        MPI_Comm_free(&D.comm);
        free(D.local);
        D.local = NULL;
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: no free StarPU progression hook",
                            __FILE__, __LINE__);
    }
    D.poke = c->poke;
    D.up = 1;
    *active = 1;
    return SP_OK;
}

static sp_status direct_renew(void)
{
    MPI_Comm fresh;
    sp_status st = dup_comm(D.comm, &fresh);
    if (st)
        return st;
    MPI_Comm_free(&D.comm);
    D.comm = fresh;
    return SP_OK;
}

static void direct_shutdown(void)
{
    if (!D.up)
        return;
    sp_stage_clear(&D.stage, NULL);
    starpu_progression_hook_deregister(D.hook);
    MPI_Comm_free(&D.comm);
    free(D.mpi);
    free(D.reqs);
    free(D.part);
    free(D.idx);
    free(D.st);
    free(D.local);
    D.mpi = NULL;
    D.reqs = NULL;
    D.part = NULL;
    D.idx = NULL;
    D.st = NULL;
    D.local = NULL;
    D.n = D.cap = 0;
    D.up = 0;
}

static sp_status direct_post(const sp_xfer *x, sp_xfer_done done, void *arg, sp_xfer_req **held)
{
    const char *what = x->is_send ? "send" : "recv";
    if (!D.up)
        return sp_set_error(SP_ERR_ARG, "direct transport: not started");
    if (!done)
        return sp_set_error(SP_ERR_ARG, "direct transport: a completion callback is required");
    if (x->msg > (uint32_t)D.tag_ub)
        return sp_set_error(SP_ERR_ARG, "%s of message #%" PRIu32 ": the MPI library's tag "
                            "bound is %d; a step may number at most that many messages",
                            what, x->msg, D.tag_ub);
    if (x->count > INT_MAX)
        return sp_set_error(SP_ERR_ARG, "%s of message #%" PRIu32 ": %zu elements exceed "
                            "what one MPI message can count", what, x->msg, x->count);
    if (x->peer < 0 || x->peer >= D.size)
        return sp_set_error(SP_ERR_ARG, "%s of message #%" PRIu32 ": no rank %d", what, x->msg,
                            x->peer);
    size_t bytes = x->count * x->elemsize;
    int nparts = nparts_of(bytes, x->peer);
    direct_req *r = malloc(sizeof *r + (size_t)nparts * sizeof(MPI_Request));
    if (!r)
        return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
    *r = (direct_req){ .h = x->h, .count = x->count, .elemsize = x->elemsize, .peer = x->peer,
                       .is_send = x->is_send, .msg = x->msg, .done = done, .arg = arg,
                       .nparts = nparts };
    for (int i = 0; i < nparts; i++)
        r->q[i] = MPI_REQUEST_NULL;
    atomic_init(&r->holds, held ? 3 : 2);
    atomic_init(&r->early, 0);
    atomic_fetch_add(&D.open, 1);
    atomic_fetch_add(&D.count[x->is_send ? COUNT_SENDS : COUNT_RECVS], 1);
    atomic_fetch_add(&D.count[x->is_send ? COUNT_BYTES_SENT : COUNT_BYTES_RECV], bytes);
    if (nparts > 1)
        atomic_fetch_add(&D.count[COUNT_PIECED], 1);
    int rc = starpu_data_acquire_on_node_cb_sequential_consistency(
        x->h, STARPU_MAIN_RAM, x->is_send ? STARPU_R : STARPU_W, start, r, 1);
    if (rc < 0) {
        atomic_fetch_sub(&D.open, 1);
        free(r);
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: acquiring the buffer of message #%" PRIu32
                            " failed: %s", __FILE__, __LINE__, x->msg, strerror(-rc));
    }
    if (held)
        *held = r;
    return SP_OK;
}

/* Once a step's tasks are done, its last sends may still be in flight: the calling
 * thread tests them too, as the idle workers do. */
static sp_status direct_drain(void)
{
    while (direct_pending() > 0)
        if (!direct_progress())
            sched_yield();
    return SP_OK;
}

static void direct_begin_step(uint64_t step) { (void)step; /* tags are message numbers */ }

static int64_t direct_tag(uint32_t msg) { return (int)msg; } /* as posted above */

const sp_transport sp_transport_direct = {
    .name = "direct",
    .init = direct_init,
    .shutdown = direct_shutdown,
    .begin_step = direct_begin_step,
    .post = direct_post,
    .send_from = direct_send_from,
    .drop = drop,
    .progress = direct_progress,
    .inflight = direct_inflight,
    .pending = direct_pending,
    .drain = direct_drain,
    .renew = direct_renew,
    .counts = direct_counts,
    .tag = direct_tag,
    .staging_bytes = direct_staging_bytes,
};
