/* The NCCL transport (comm/transport.h) between GPU actors. One communicator over all
 * ranks, bootstrapped with an MPI broadcast of the unique id. A group of the plan's
 * messages (sp_nccl_calls) is one ordered task on the rank's CUDA worker (the group
 * entry builds it): ncclGroupStart, ncclSend/ncclRecv, End.
 * NCCL's point-to-point calls block on the device and channels are ordered, so each rank
 * must issue them in the plan's global message order: the ordered policy runs the tasks in
 * that order (tests/sched/test_nccl_order.c checks that the calls pair up).
 *
 * Beside compute: the calls go on a stream of their own, never the worker's compute
 * stream, so a posted receive does not hold back the kernels of later tasks. The task
 * returns at once with one StarPU end dependency (starpu_task_end_dep_add); a completion
 * thread waits for the group's event and releases it, so the task (and what depends on
 * its buffers) ends when the transfer has, while the worker goes on. Inputs need no event
 * on the compute stream: StarPU starts a task only after the tasks it depends on ended.
 * The completion thread also polls ncclCommGetAsyncError; an error aborts the
 * communicator, releases the waiting tasks and is reported by the error entry, which
 * the executor's wait loop turns into a failed, unusable executor within milliseconds.
 * Connections are made at start-up (the connect entry), not inside the first group.
 * Without NCCL, a GPU, or with two ranks on one GPU of one host (NCCL refuses that; ranks
 * on two hosts are told apart as NCCL tells them, nccl_peers.c), every message stays on
 * the host transport and init says why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <starpu_mpi.h>

#include "comm/transport.h"

/* what the groups carried (main thread only: groups are built at submission) */
static sp_xfer_counts carried;

#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_NCCL)
#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "comm/nccl_chain.h"
#include "comm/nccl_peers.h"

static ncclComm_t comm;
static int active, tried, my_rank, device;
static char why[256]; /* the notice of the first call: later calls return it again */
static cudaStream_t comm_stream; /* NCCL's own, beside the worker's compute stream */

/* ---- the completion thread: a queue of (event, task) to release in order ---- */
typedef struct {
    cudaEvent_t ev;
    struct starpu_task *task;
} pending;
static struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pending *q;
    int head, n, cap, stop, running;
} done_q = { .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER };
static atomic_int failed;
static char fail_msg[256];

static const char *nccl_error(void) { return atomic_load(&failed) ? fail_msg : NULL; }

static void nccl_failed(const char *what, ncclResult_t r)
{
    if (atomic_exchange(&failed, 1)) return;
    snprintf(fail_msg, sizeof fail_msg, "%s: %s", what, ncclGetErrorString(r));
    ncclCommAbort(comm); /* pending operations end, with an error */
}

/* Waits for each group's event in order (polling, so that NCCL's asynchronous errors are
 * seen while a receive waits for a peer that is gone) and releases its task. */
static void *completion_thread(void *arg)
{
    (void)arg;
    cudaSetDevice(device);
    pthread_mutex_lock(&done_q.lock);
    for (;;) {
        while (!done_q.n && !done_q.stop) pthread_cond_wait(&done_q.wake, &done_q.lock);
        if (!done_q.n && done_q.stop) break;
        pending p = done_q.q[done_q.head];
        pthread_mutex_unlock(&done_q.lock);
        for (int polls = 0;; polls++) {
            cudaError_t e = atomic_load(&failed) ? cudaSuccess : cudaEventQuery(p.ev);
            if (e != cudaErrorNotReady) break;
            ncclResult_t async = ncclSuccess;
            if (polls % 64 == 0 && ncclCommGetAsyncError(comm, &async) == ncclSuccess &&
                async != ncclSuccess && async != ncclInProgress)
                nccl_failed("NCCL reported an asynchronous error", async);
            nanosleep(&(struct timespec){ 0, 20000 }, NULL);
        }
        cudaEventDestroy(p.ev);
        starpu_task_end_dep_release(p.task); /* the task may end now */
        pthread_mutex_lock(&done_q.lock);
        done_q.head = (done_q.head + 1) % done_q.cap;
        done_q.n--;
    }
    pthread_mutex_unlock(&done_q.lock);
    return NULL;
}

static int enqueue(cudaEvent_t ev, struct starpu_task *task)
{
    pthread_mutex_lock(&done_q.lock);
    if (done_q.n == done_q.cap) { /* grow the ring, keeping its order */
        int cap = done_q.cap ? 2 * done_q.cap : 64;
        pending *q = malloc((size_t)cap * sizeof *q);
        if (!q) {
            pthread_mutex_unlock(&done_q.lock);
            return -1;
        }
        for (int i = 0; i < done_q.n; i++) q[i] = done_q.q[(done_q.head + i) % done_q.cap];
        free(done_q.q);
        done_q.q = q, done_q.head = 0, done_q.cap = cap;
    }
    done_q.q[(done_q.head + done_q.n) % done_q.cap] = (pending){ ev, task };
    done_q.n++;
    pthread_cond_signal(&done_q.wake);
    pthread_mutex_unlock(&done_q.lock);
    return 0;
}

static MPI_Comm mpi; /* the communicator of the bootstrap */

/* Collective: 1 on every rank if bad is set on any (also when MPI itself fails). */
static int anyone(int bad)
{
    int v = bad, any = 1;
    if (MPI_Allreduce(&v, &any, 1, MPI_INT, MPI_MAX, mpi) != MPI_SUCCESS)
        return 1;
    return any;
}

static sp_status mpi_failed(const char *call)
{
    return sp_set_error(SP_ERR_RUNTIME, "%s:%d: %s failed during the NCCL bootstrap", __FILE__,
                        __LINE__, call);
}

static sp_status nccl_start(int ncuda, char *notice, size_t len);

/* Once per process: every trainer of a run shares the communicator. */
static sp_status nccl_init(const sp_transport_config *c, int *on, char *notice, size_t len)
{
    sp_status st = SP_OK;
    mpi = c->world;
    if (!tried) {
        st = nccl_start(c->ncuda, why, sizeof why);
        tried = st == SP_OK;
    }
    snprintf(notice, len, "%s%s%s%s", why, !active && c->host ? " (" : "",
             !active && c->host ? c->host : "", !active && c->host ? ")" : "");
    *on = active;
    return st;
}

static sp_status nccl_start(int ncuda, char *notice, size_t len)
{
    notice[0] = '\0';
    active = 0;
    int P, me;
    if (MPI_Comm_size(mpi, &P) != MPI_SUCCESS || MPI_Comm_rank(mpi, &me) != MPI_SUCCESS)
        return mpi_failed("MPI_Comm_size");
    my_rank = me;
    if (anyone(ncuda != 1)) {
        snprintf(notice, len, "NCCL needs one CUDA worker on every rank: GPU transfers go "
                 "through host memory");
        return SP_OK;
    }
    int worker = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
    int dev = starpu_worker_get_devid(worker);
    /* each rank's (host, bus id) as NCCL keys them (comm/nccl_peers.c): only two ranks of
     * one host on one GPU are refused, never two nodes whose GPUs share bus ids */
    char bus[32] = "";
    int bad = cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess;
    sp_nccl_peer *mine = malloc(sizeof *mine);
    sp_nccl_peer *all = me == 0 ? calloc((size_t)P, sizeof *all) : NULL;
    if (mine)
        sp_nccl_peer_local(bus, mine);
    bad |= !mine || (me == 0 && !all);
    if (anyone(bad)) {
        free(mine), free(all);
        snprintf(notice, len, "cannot identify the GPUs: GPU transfers go through host memory");
        return SP_OK;
    }
    int rc = MPI_Gather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, 0,
                        mpi);
    free(mine);
    if (rc != MPI_SUCCESS) {
        free(all);
        return mpi_failed("MPI_Gather");
    }
    struct {
        int shared, a, b;
        char host[sizeof all->host], bus[sizeof all->bus];
    } dup = { 0 };
    if (me == 0 && (dup.shared = sp_nccl_duplicate(all, P, &dup.a, &dup.b))) {
        snprintf(dup.host, sizeof dup.host, "%s", all[dup.a].host);
        snprintf(dup.bus, sizeof dup.bus, "%s", all[dup.a].bus);
    }
    free(all);
    if (MPI_Bcast(&dup, (int)sizeof dup, MPI_BYTE, 0, mpi) != MPI_SUCCESS)
        return mpi_failed("MPI_Bcast");
    if (dup.shared) {
        for (char *c = dup.bus; *c; c++) *c = (char)tolower((unsigned char)*c);
        snprintf(notice, len, "ranks %d and %d share GPU %s on host %s (NCCL refuses that): "
                 "GPU transfers go through host memory", dup.a, dup.b, dup.bus, dup.host);
        return SP_OK;
    }
    ncclUniqueId id;
    bad = me == 0 && ncclGetUniqueId(&id) != ncclSuccess;
    if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, mpi) != MPI_SUCCESS)
        return mpi_failed("MPI_Bcast");
    ncclResult_t r = ncclInternalError;
    if (!anyone(bad) && cudaSetDevice(dev) == cudaSuccess)
        r = ncclCommInitRank(&comm, P, id, me);
    /* the stream of the transfers, at the device's highest priority: a receive that
     * completes should feed its consumer before more compute is queued */
    int lo = 0, hi = 0, stream_bad = r != ncclSuccess;
    if (!stream_bad) {
        cudaDeviceGetStreamPriorityRange(&lo, &hi);
        stream_bad = cudaStreamCreateWithPriority(&comm_stream, cudaStreamNonBlocking, hi) !=
                     cudaSuccess;
    }
    device = dev;
    atomic_store(&failed, 0);
    done_q.stop = 0;
    if (!stream_bad)
        stream_bad = pthread_create(&done_q.thread, NULL, completion_thread, NULL) != 0;
    else
        comm_stream = NULL;
    done_q.running = !stream_bad;
    if (anyone(r != ncclSuccess || stream_bad)) {
        if (r == ncclSuccess)
            ncclCommDestroy(comm);
        snprintf(notice, len, "NCCL initialisation failed (%s on rank %d): GPU transfers go "
                 "through host memory", r != ncclSuccess ? ncclGetErrorString(r)
                                                 : "no stream or completion thread", me);
        return SP_OK;
    }
    active = 1;
    return SP_OK;
}

static sp_status nccl_connect(const int *peers, int n)
{
    if (!active || n <= 0) return SP_OK;
    float *d = NULL;
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaMalloc((void **)&d, sizeof(float) * 2 * (size_t)n) != cudaSuccess)
        return sp_set_error(SP_ERR_RUNTIME, "NCCL connections: no device memory on rank %d",
                            my_rank);
    cudaMemsetAsync(d, 0, sizeof(float) * 2 * (size_t)n, comm_stream);
    /* one float each way with every peer: NCCL sets up those connections now, in the
     * main thread, rather than inside the first group of the first step */
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; r == ncclSuccess && i < n; i++) {
        r = ncclSend(d + 2 * i, 1, ncclFloat32, peers[i], comm, comm_stream);
        if (r == ncclSuccess) r = ncclRecv(d + 2 * i + 1, 1, ncclFloat32, peers[i], comm, comm_stream);
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess) r = e;
    cudaError_t c = r == ncclSuccess ? cudaStreamSynchronize(comm_stream) : cudaSuccess;
    cudaFree(d);
    if (r != ncclSuccess || c != cudaSuccess)
        return sp_set_error(SP_ERR_RUNTIME, "NCCL connections from rank %d failed: %s", my_rank,
                            r != ncclSuccess ? ncclGetErrorString(r) : cudaGetErrorString(c));
    return SP_OK;
}

static void nccl_shutdown(void)
{
    if (done_q.running) { /* after the last task: nothing is pending */
        pthread_mutex_lock(&done_q.lock);
        done_q.stop = 1;
        pthread_cond_signal(&done_q.wake);
        pthread_mutex_unlock(&done_q.lock);
        pthread_join(done_q.thread, NULL);
        done_q.running = 0;
    }
    if (comm_stream) cudaStreamDestroy(comm_stream);
    comm_stream = NULL;
    if (active && !atomic_load(&failed))
        ncclCommDestroy(comm);
    active = tried = 0;
}

/* The arguments of a group's task: call i sends task buffer buf to peer, or receives it. */
typedef struct {
    int is_send, peer, buf;
} nccl_call;
typedef struct {
    int n;
    nccl_call call[];
} group_args;

/* A group's task: its calls between ncclGroupStart and ncclGroupEnd on NCCL's own
 * stream; the task ends when the group has (the completion thread releases it). */
static int run_group(const sp_device *dev, void *const *bufs, const size_t *counts, int nbufs,
                     const void *args)
{
    (void)dev; /* the worker's compute stream: the transfers go on their own */
    const group_args *a = args;
    for (int i = 0; i < a->n; i++)
        if (a->call[i].buf < 0 || a->call[i].buf >= nbufs)
            return -1;
    if (atomic_load(&failed)) {
        fprintf(stderr, "starpipe: rank %d: %s\n", my_rank, fail_msg);
        return 1;
    }
    /* after the rank's previous NCCL operation, the tensor group's too (comm/nccl_chain.h) */
    cudaError_t ce = (cudaError_t)sp_nccl_chain_enter(comm_stream);
    if (ce != cudaSuccess) {
        fprintf(stderr, "starpipe: rank %d: NCCL transfer failed: %s\n", my_rank,
                cudaGetErrorString(ce));
        return (int)ce;
    }
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; r == ncclSuccess && i < a->n; i++) {
        const nccl_call *c = &a->call[i];
        r = c->is_send ? ncclSend(bufs[c->buf], counts[c->buf], ncclFloat32, c->peer, comm,
                                  comm_stream)
                       : ncclRecv(bufs[c->buf], counts[c->buf], ncclFloat32, c->peer, comm,
                                  comm_stream);
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess)
        r = e;
    cudaEvent_t ev = NULL;
    cudaError_t c = (cudaError_t)sp_nccl_chain_leave(comm_stream);
    if (r == ncclSuccess && c == cudaSuccess &&
        (c = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) == cudaSuccess)
        c = cudaEventRecord(ev, comm_stream);
    if (r != ncclSuccess || c != cudaSuccess) {
        if (ev) cudaEventDestroy(ev);
        fprintf(stderr, "starpipe: rank %d: NCCL transfer failed: %s\n", my_rank,
                r != ncclSuccess ? ncclGetErrorString(r) : cudaGetErrorString(c));
        return r != ncclSuccess ? (int)r : (int)c;
    }
    /* the task ends when the transfer has: the completion thread releases it */
    struct starpu_task *task = starpu_task_get_current();
    starpu_task_end_dep_add(task, 1);
    if (enqueue(ev, task)) { /* no memory for the queue: wait here instead */
        cudaEventSynchronize(ev);
        cudaEventDestroy(ev);
        starpu_task_end_dep_release(task);
    }
    return 0;
}

/* The n messages as one group task: each buffer once (a send may go to several peers),
 * R for sends, W for receives; the calls in the given order. */
static sp_status build_group(const sp_xfer *x, int n, sp_xfer_group *g)
{
    *g = (sp_xfer_group){ .fn = run_group, .args_size = sizeof(group_args) +
                                                        (size_t)n * sizeof(nccl_call) };
    group_args *a = calloc(1, g->args_size);
    g->xfer = malloc(sizeof(int) * (size_t)(n + 1));
    g->mode = malloc(sizeof(sp_access_mode) * (size_t)(n + 1));
    sp_status st = SP_OK;
    if (!a || !g->xfer || !g->mode) st = sp_set_error(SP_ERR_NOMEM, "NCCL group: out of memory");
    for (int k = 0; k < n && st == SP_OK; k++) {
        int b = 0;
        while (b < g->nbufs && x[g->xfer[b]].h != x[k].h) b++;
        sp_access_mode m = x[k].is_send ? SP_ACCESS_R : SP_ACCESS_W;
        if (b < g->nbufs && g->mode[b] != m)
            st = sp_set_error(SP_ERR_RUNTIME, "NCCL group: one buffer both sent and received");
        else if (b == g->nbufs)
            g->xfer[g->nbufs] = k, g->mode[g->nbufs++] = m;
        a->call[a->n++] = (nccl_call){ x[k].is_send, x[k].peer, b };
        size_t bytes = x[k].count * x[k].elemsize;
        if (x[k].is_send) carried.sends++, carried.bytes_sent += bytes;
        else carried.recvs++, carried.bytes_received += bytes;
    }
    if (st) {
        free(a), free(g->xfer), free(g->mode);
        *g = (sp_xfer_group){ 0 };
        return st;
    }
    g->args = a;
    return SP_OK;
}

#else /* no NCCL in this build: never active */

static sp_status nccl_init(const sp_transport_config *c, int *on, char *notice, size_t len)
{
    *on = 0;
    snprintf(notice, len, "built without NCCL: GPU transfers are staged through host memory%s%s%s",
             c->host ? " (" : "", c->host ? c->host : "", c->host ? ")" : "");
    return SP_OK;
}

static void nccl_shutdown(void) {}

static sp_status build_group(const sp_xfer *x, int n, sp_xfer_group *g)
{
    (void)x, (void)n, (void)g;
    return sp_set_error(SP_ERR_RUNTIME, "built without NCCL");
}

static sp_status nccl_connect(const int *peers, int n)
{
    (void)peers, (void)n;
    return SP_OK;
}

static const char *nccl_error(void) { return NULL; }

#endif

static void nccl_begin_step(uint64_t step) { (void)step; }
static int nccl_pending(void) { return 0; /* a group is a task: the executor waits for it */ }
static sp_status nccl_drain(void) { return SP_OK; }
static void nccl_counts(sp_xfer_counts *out) { *out = carried; }

const sp_transport sp_transport_nccl = {
    .name = "nccl",
    .init = nccl_init,
    .shutdown = nccl_shutdown,
    .begin_step = nccl_begin_step,
    .group = build_group,
    .connect = nccl_connect,
    .error = nccl_error,
    .pending = nccl_pending,
    .drain = nccl_drain,
    .counts = nccl_counts,
};
