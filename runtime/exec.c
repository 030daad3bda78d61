/* The executor: MPI + StarPU + StarPU-MPI start-up, steps, the generic task wrapper,
 * failure agreement and traces. Transfers are in comm/, the order in sched/policy.c. */
#define _GNU_SOURCE /* cpu_set_t (runtime/gpumap.h) */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <starpu_mpi.h>
#ifdef STARPU_USE_CUDA
#include <starpu_cublas_v2.h>
#endif
#ifdef STARPIPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "base/env.h"
#include "codelets/cpu/kernels.h"
#include "codelets/cuda/backend.h"
#ifdef STARPIPE_HAVE_CUDA
#include "codelets/cuda/kernels_cuda.h" /* sp_cuda_set_tf32 */
#endif
#include "comm/transport.h"
#include "runtime/binding_impl.h"
#include "runtime/exec_impl.h"
#include "runtime/group.h"
#include "runtime/gpumap.h"
#include "runtime/launch.h"
#include "sched/policy.h"

int sp_exec_rank_ = 0, sp_exec_size_ = 1;
uint64_t sp_exec_step_ = 0;

static struct {
    int started;          /* sp_exec_init succeeded, no shutdown yet */
    int mpi_ours;         /* we called MPI_Init_thread, so we finalize */
    MPI_Comm comm;        /* our own duplicate of MPI_COMM_WORLD for agreement */
    sp_exec_opts opts;
    int in_step;
    int broken;           /* a step was given up (watchdog, local error): StarPU still holds
                             its tasks, so every later call fails at once instead of waiting */
    char broken_why[384]; /* the watchdog's message, repeated by every later call's error */
    long step_label;      /* the caller's number of its step (sp_exec_label_step), or 0 */
    double step_t0;       /* starpu_timing_now() at begin_step */
    double epoch;         /* starpu_timing_now() right after a barrier at init: the
                             origin of the clock all ranks share (sp_exec_step_origin_us) */
    /* Sequence numbers submitted in this step: seen[s] for duplicates, gaps at end. */
    unsigned char *seen;
    size_t seen_cap, nsubmitted;
    uint32_t max_seq;
    const sp_transport *host;  /* every message posted one by one (starpu-mpi, direct) */
    const sp_transport *group; /* groups between GPU ranks (NCCL), or NULL */
    size_t group_threshold;    /* bytes from which messages go in groups */
    /* This step's task arguments: kept until the step ends, since a send posted after its
     * producer may still reach the producer's (send_early). */
    struct task_args **args;
    size_t nargs, args_cap;
    unsigned long posted; /* tasks and messages submitted since init (their order) */
    int pieces;           /* large transfers within a node as eager pieces (direct):
                             1 always, 0 never, -1 where ranks have cores of their own */
} X;

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* ---- failure of a task: first one wins, later tasks of the step skip their work ---- */
static atomic_int step_failed;
static atomic_ulong tasks_done; /* tasks and transfers finished since init: the watchdog's
                                   progress */
static atomic_uint last_done;   /* seq + 1 of the step's task that finished last, or 0 */
static starpu_pthread_mutex_t fail_lock = STARPU_PTHREAD_MUTEX_INITIALIZER;
static char fail_msg[512];

static void fail_step(const char *fmt, ...)
{
    STARPU_PTHREAD_MUTEX_LOCK(&fail_lock);
    if (!atomic_load(&step_failed)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(fail_msg, sizeof fail_msg, fmt, ap);
        va_end(ap);
        atomic_store(&step_failed, 1);
    }
    STARPU_PTHREAD_MUTEX_UNLOCK(&fail_lock);
}

/* ---- traces ---- */
static starpu_pthread_mutex_t trace_lock = STARPU_PTHREAD_MUTEX_INITIALIZER;
static sp_exec_record *trace_recs;
static size_t trace_n, trace_cap, trace_dropped;

static void trace_add(const char *name, uint32_t seq, double t0, double t1, int transfer,
                      int peer)
{
    STARPU_PTHREAD_MUTEX_LOCK(&trace_lock);
    if (trace_n == trace_cap) {
        size_t cap = trace_cap ? 2 * trace_cap : 256;
        sp_exec_record *r = realloc(trace_recs, cap * sizeof *r);
        if (r) {
            trace_recs = r;
            trace_cap = cap;
        }
    }
    if (trace_n < trace_cap) {
        sp_exec_record *r = &trace_recs[trace_n++];
        snprintf(r->name, sizeof r->name, "%s", name);
        r->seq = seq;
        r->worker = transfer ? -1 : starpu_worker_get_id();
        r->transfer = transfer;
        r->peer = peer;
        r->start_us = t0 - X.step_t0;
        r->end_us = t1 - X.step_t0;
    } else {
        trace_dropped++;
    }
    STARPU_PTHREAD_MUTEX_UNLOCK(&trace_lock);
}

int sp_exec_tracing(void) { return X.opts.trace; }

double sp_exec_step_origin_us(void) { return X.step_t0 - X.epoch; }


static int by_start(const void *a, const void *b)
{
    double x = ((const sp_exec_record *)a)->start_us, y = ((const sp_exec_record *)b)->start_us;
    return (x > y) - (x < y);
}

sp_status sp_exec_trace(const sp_exec_record **records, size_t *n)
{
    if (!records || !n)
        return sp_set_error(SP_ERR_ARG, "sp_exec_trace: NULL argument");
    STARPU_PTHREAD_MUTEX_LOCK(&trace_lock);
    qsort(trace_recs, trace_n, sizeof *trace_recs, by_start);
    *records = trace_recs;
    *n = trace_n;
    size_t dropped = trace_dropped;
    STARPU_PTHREAD_MUTEX_UNLOCK(&trace_lock);
    if (dropped)
        return sp_set_error(SP_ERR_NOMEM, "sp_exec_trace: %zu records lost (out of memory)",
                            dropped);
    return SP_OK;
}

/* The error of every call after a step was given up (sp_exec_cancel_step, watchdog). */
static sp_status broken_error(const char *what)
{
    return sp_set_error(SP_ERR_RUNTIME, "%s: the executor gave up a step%s%s%s and cannot go "
                        "on; end the process (sp_exec_abort)", what,
                        X.broken_why[0] ? " (" : "", X.broken_why, X.broken_why[0] ? ")" : "");
}

/* Gives up: the executor is unusable from now on, and later calls repeat why (the error
 * st just set) */
static sp_status give_up(sp_status st)
{
    X.broken = 1;
    snprintf(X.broken_why, sizeof X.broken_why, "%s", sp_last_error());
    return st;
}

/* ---- the generic codelet ---- */

/* cl_arg of every task: what to call, and a copy of the caller's argument struct. */
struct task_args {
    sp_task_fn fn;
    unsigned where; /* SP_EXEC_ON_CPU | SP_EXEC_ON_CUDA */
    char name[32];
    uint32_t seq;
    uint32_t footprint;
    int on_cuda;  /* ran on a CUDA worker: traced from start to the completion callback */
    int unrun;    /* failed, or drained after a failure: its time is not the stage's */
    double t0;
    atomic_int state;      /* TASK_QUEUED, TASK_RUNNING, TASK_DONE: for a stall report */
    double started;        /* seconds_now() when it began running */
    int nbufs;
    starpu_data_handle_t *handles; /* its buffers, in the same block after the payload */
    unsigned char *writes;         /* per buffer: 1 if the task writes it */
    unsigned long order;           /* submitted after this many tasks and messages */
    sp_exec_tensor_group *group;          /* tensor parallelism: the group its program meets */
    _Atomic(struct early_send *) early; /* sends of its outputs, or EARLY_CLOSED */
    _Alignas(max_align_t) unsigned char payload[];
};

enum { TASK_QUEUED, TASK_RUNNING, TASK_DONE };

/* Up to this many buffers the wrapper keeps its pointer arrays on the stack. */
#define SP_STACK_BUFS 32


/* ---- sends posted by their producer ----
 * StarPU grants a send's buffer (the transport's acquire callback) only once it has
 * ended the producing task: 50-150 us after the task's function returned on the 2-core
 * VM, and more when the worker's caches are cold after a long task. The data is final
 * when the function returns, so the wrapper posts the sends of the task's outputs then
 * and there; StarPU's grant only keeps the buffer from its next writer until MPI is done.
 * A send submitted after its producer reaches the producer's arguments through the
 * buffer (writer); whichever comes second of the send's attach and the wrapper's close
 * decides: attached in time, the wrapper posts it; too late, the grant does. */
struct early_send {
    sp_xfer_req *r;
    starpu_data_handle_t h;
    struct early_send *next;
};
#define EARLY_CLOSED ((struct early_send *)1)

static void attach_early(struct task_args *a, sp_xfer_req *r, starpu_data_handle_t h)
{
    struct early_send *e = malloc(sizeof *e);
    if (!e)
        return; /* posted when StarPU grants the buffer, as without */
    e->r = r;
    e->h = h;
    struct early_send *old = atomic_load(&a->early);
    do {
        if (old == EARLY_CLOSED) {
            free(e);
            return;
        }
        e->next = old;
    } while (!atomic_compare_exchange_weak(&a->early, &old, e));
}

/* Closes a's list; posts its sends from the task's buffers when ptrs hold the data in
 * host memory (a CPU task that ran), else leaves them to StarPU's grant. */
static void send_early(struct starpu_task *task, struct task_args *a, void *const *ptrs,
                       int n)
{
    struct early_send *e = atomic_exchange(&a->early, EARLY_CLOSED);
    while (e) {
        struct early_send *next = e->next;
        for (int i = 0; ptrs && i < n; i++)
            if (STARPU_TASK_GET_HANDLE(task, i) == e->h &&
                (STARPU_TASK_GET_MODE(task, i) & STARPU_W)) {
                X.host->send_from(e->r, ptrs[i]);
                break;
            }
        free(e);
        e = next;
    }
}

/* The worker's device (starpipe/backend.h): the one case per kind of worker. */
static sp_device worker_device(sp_cuda_ctx *c)
{
#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
    if (starpu_worker_get_type(starpu_worker_get_id()) == STARPU_CUDA_WORKER)
        return sp_device_cuda(c, (void *)starpu_cuda_get_local_stream(),
                              starpu_cublas_get_local_handle());
#endif
    (void)c;
    return sp_device_cpu();
}

static void run_task(void *descr[], struct task_args *a)
{
    struct starpu_task *task = starpu_task_get_current();
    /* the step is lost already: drain quickly, keep transfers flowing; a task of a group
     * still meets its group's all-reduces (its peers would wait for it forever) */
    const int lost = atomic_load(&step_failed);
    if (lost && !a->group) {
        send_early(task, a, NULL, 0); /* left to StarPU's grant */
        a->unrun = 1;
        atomic_store(&a->state, TASK_DONE);
        return;
    }
    a->started = seconds_now();
    atomic_store(&a->state, TASK_RUNNING);
    int n = (int)STARPU_TASK_GET_NBUFFERS(task);
    void *ptr_stack[SP_STACK_BUFS], **ptrs = ptr_stack;
    size_t count_stack[SP_STACK_BUFS], *counts = count_stack;
    if (n > SP_STACK_BUFS) {
        ptrs = malloc((size_t)n * sizeof *ptrs);
        counts = malloc((size_t)n * sizeof *counts);
        if (!ptrs || !counts) {
            free(ptrs);
            free(counts);
            fail_step("task '%s' (seq %u): out of memory for %d buffers", a->name, a->seq, n);
            a->unrun = 1;
            send_early(task, a, NULL, 0);
            atomic_store(&a->state, TASK_DONE);
            return;
        }
    }
    for (int i = 0; i < n; i++) {
        ptrs[i] = (void *)STARPU_VECTOR_GET_PTR(descr[i]);
        counts[i] = STARPU_VECTOR_GET_NX(descr[i]);
    }
    double t0 = X.opts.trace ? starpu_timing_now() : 0;
    sp_cuda_ctx cuda;
    sp_device dev = worker_device(&cuda);
    sp_exec_task_group tg;
    dev.group = a->group ? sp_exec_tensor_group_of_task(a->group, a->seq, &dev, &tg) : NULL;
    dev.meet_only = lost;
    int rc = a->fn(&dev, ptrs, counts, n, a->payload);
    if (lost) rc = 0, a->unrun = 1; /* met its group; the step's failure is reported */
    /* A CUDA function only enqueues its kernels (STARPU_CUDA_ASYNC): its end is when
     * StarPU sees the stream done and calls the task's callback (cuda_task_done). */
    if (dev.type == SP_DEVICE_CUDA) {
        a->on_cuda = 1;
        a->t0 = t0;
        send_early(task, a, NULL, 0); /* the data is on the device */
    } else {
        if (X.opts.trace)
            trace_add(a->name, a->seq, t0, starpu_timing_now(), 0, -1);
        send_early(task, a, ptrs, n);
    }
    if (rc) {
        a->unrun = 1;
        fail_step("rank %d: task '%s' (seq %u) failed with code %d", sp_exec_rank_, a->name,
                  a->seq, rc);
    }
    atomic_store(&a->state, TASK_DONE);
    atomic_store(&last_done, a->seq + 1);
    atomic_fetch_add(&tasks_done, 1);
    if (ptrs != ptr_stack) {
        free(ptrs);
        free(counts);
    }
}

/* The codelets' implementations: one wrapper, whatever the worker (the task's function
 * takes the worker's device). Named, so that StarPU's tools find them by name
 * (cpu_funcs_name, cuda_funcs_name). */
void sp_exec_run_cpu(void *descr[], void *cl_arg);
void sp_exec_run_cpu(void *descr[], void *cl_arg) { run_task(descr, cl_arg); }
#ifdef STARPU_USE_CUDA
void sp_exec_run_cuda(void *descr[], void *cl_arg);
void sp_exec_run_cuda(void *descr[], void *cl_arg) { run_task(descr, cl_arg); }
#endif

/* Per task, not per codelet: one codelet serves tasks held to one kind of worker and
 * tasks that may run on any. */
static int can_execute(unsigned worker, struct starpu_task *task, unsigned nimpl)
{
    const struct task_args *a = task->cl_arg;
    switch (starpu_worker_get_type((int)worker)) {
    case STARPU_CPU_WORKER: return (a->where & SP_EXEC_ON_CPU) != 0;
    case STARPU_CUDA_WORKER: return (a->where & SP_EXEC_ON_CUDA) != 0;
    default: return 0;
    }
}

/* One codelet per task class (sp_exec_task.codelet: "F", "B", "W", "BW", "AdamW", ...),
 * all with the same generic wrapper, so StarPU's own tools (statistics, FxT traces)
 * count and time the classes apart. Created on first use, at most SP_MAX_CODELETS. */
#define SP_MAX_CODELETS 16
static struct starpu_codelet codelets[SP_MAX_CODELETS];
static char codelet_names[SP_MAX_CODELETS][16];
static int ncodelets;
/* A history-based performance model per class and rank, named "starpipe_<class>_r<rank>"
 * (what starpu_perfmodel_display -s takes), its entries keyed by the task's footprint:
 * the trainer's stage, so a run leaves each stage's measured F, B, W, BW times behind. */
static struct starpu_perfmodel models[SP_MAX_CODELETS];
static char model_symbols[SP_MAX_CODELETS][32];

/* StarPU asks for the key when it records the task's time, after the task ran (our policy
 * never asks for predictions). A task that failed or was drained after a failure took
 * microseconds: under the stage's key the next run would deviate by orders of magnitude,
 * and StarPU would flush the history and say so on stderr. Such tasks get a key of their
 * own. */
#define SP_FOOTPRINT_UNRUN 0x0badf00du
static uint32_t task_footprint(struct starpu_task *task)
{
    const struct task_args *a = task->cl_arg;
    if (a->unrun)
        return SP_FOOTPRINT_UNRUN;
    return a->footprint ? a->footprint : starpu_task_data_footprint(task);
}

static struct starpu_codelet *codelet_for(const char *cls)
{
    if (!cls || !cls[0])
        cls = "starpipe";
    for (int i = 0; i < ncodelets; i++)
        if (!strcmp(codelet_names[i], cls))
            return &codelets[i];
    int i = ncodelets < SP_MAX_CODELETS ? ncodelets++ : SP_MAX_CODELETS - 1; /* last: shared */
    if (codelets[i].name)
        return &codelets[i];
    snprintf(codelet_names[i], sizeof codelet_names[i], "%s", cls);
    /* one file per rank: ranks of one host would overwrite each other's */
    snprintf(model_symbols[i], sizeof model_symbols[i], "starpipe_%s_r%d", cls, sp_exec_rank_);
    for (char *c = model_symbols[i]; *c; c++) /* a file name: "local add" -> "local_add" */
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
            *c = '_';
    models[i] = (struct starpu_perfmodel){ .type = STARPU_HISTORY_BASED,
                                           .symbol = model_symbols[i],
                                           .footprint = task_footprint };
    codelets[i] = (struct starpu_codelet){
        .model = &models[i],
        .can_execute = can_execute,
        .cpu_funcs = {sp_exec_run_cpu},
        .cpu_funcs_name = {"sp_exec_run_cpu"},
#ifdef STARPU_USE_CUDA
        .cuda_funcs = {sp_exec_run_cuda},
        .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
        .nbuffers = STARPU_VARIABLE_NBUFFERS,
        .name = codelet_names[i],
    };
    return &codelets[i];
}

static enum starpu_data_access_mode starpu_mode(sp_access_mode m)
{
    switch (m) {
    case SP_ACCESS_R: return STARPU_R;
    case SP_ACCESS_W: return STARPU_W;
    case SP_ACCESS_RW: return STARPU_RW;
    case SP_ACCESS_SCRATCH: return STARPU_SCRATCH;
    }
    return STARPU_NONE;
}

static sp_status check_task(const sp_exec_task *t)
{
    const char *name = t->name ? t->name : "(unnamed)";
    if (!t->fn)
        return sp_set_error(SP_ERR_ARG, "task '%s': no function", name);
    if (t->where & ~(SP_EXEC_ON_CPU | SP_EXEC_ON_CUDA))
        return sp_set_error(SP_ERR_ARG, "task '%s': where = %#x names no kind of worker", name,
                            t->where);
#ifndef STARPU_USE_CUDA
    if (t->where == SP_EXEC_ON_CUDA)
        return sp_set_error(SP_ERR_ARG, "task '%s': CUDA only, but StarPU has no CUDA", name);
#endif
    if (t->nbufs < 0 || (t->nbufs > 0 && (!t->bufs || !t->modes)))
        return sp_set_error(SP_ERR_ARG, "task '%s': bad buffer list (%d)", name, t->nbufs);
    if (t->args_size && !t->args)
        return sp_set_error(SP_ERR_ARG, "task '%s': args_size %zu but no args", name,
                            t->args_size);
    for (int i = 0; i < t->nbufs; i++) {
        if (!t->bufs[i] || starpu_mode(t->modes[i]) == STARPU_NONE)
            return sp_set_error(SP_ERR_ARG, "task '%s': buffer %d is NULL or has mode %d",
                                name, i, (int)t->modes[i]);
        for (int j = 0; j < i; j++)
            if (t->bufs[j] == t->bufs[i])
                return sp_set_error(SP_ERR_ARG, "task '%s': buffers %d and %d are the same",
                                    name, j, i);
    }
    return SP_OK;
}

/* Records seq as submitted in this step; refuses a duplicate. */
static sp_status claim_seq(uint32_t seq, const char *name)
{
    if (seq >= X.seen_cap) {
        size_t cap = X.seen_cap ? X.seen_cap : 1024;
        while (cap <= seq)
            cap *= 2;
        unsigned char *s = realloc(X.seen, cap);
        if (!s)
            return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
        memset(s + X.seen_cap, 0, cap - X.seen_cap);
        X.seen = s;
        X.seen_cap = cap;
    }
    if (X.seen[seq])
        return sp_set_error(SP_ERR_ARG, "task '%s': seq %u used twice in step %llu", name, seq,
                            (unsigned long long)sp_exec_step_);
    X.seen[seq] = 1;
    X.nsubmitted++;
    if (seq > X.max_seq || X.nsubmitted == 1)
        X.max_seq = seq;
    return SP_OK;
}

/* Doubles the capacity of the array *a of *cap elements; 0 when out of memory. */
static int grow_array(void **a, size_t *cap, size_t elem)
{
    size_t n = *cap ? 2 * *cap : 256;
    void *g = realloc(*a, n * elem);
    if (!g)
        return 0;
    *a = g;
    *cap = n;
    return 1;
}

/* The end of a step whose tasks are all done: their arguments go. */
static void free_args(void)
{
    for (size_t i = 0; i < X.nargs; i++)
        free(X.args[i]);
    X.nargs = 0;
}

/* Completion of a task that may have run on a CUDA worker: the end of its trace record. */
static void cuda_task_done(void *arg)
{
    struct task_args *a = arg;
    if (a->on_cuda && X.opts.trace)
        trace_add(a->name, a->seq, a->t0, starpu_timing_now(), 0, -1);
}

/* StarPU refuses to destroy a never-submitted task still marked destroy-on-completion. */
static void discard_task(struct starpu_task *task)
{
    task->destroy = 0;
    starpu_task_destroy(task);
}

sp_status sp_exec_submit(const sp_exec_task *t)
{
    if (!X.started || !X.in_step)
        return sp_set_error(SP_ERR_ARG, "sp_exec_submit: not inside a step");
    if (!t)
        return sp_set_error(SP_ERR_ARG, "sp_exec_submit: NULL task");
    sp_status st = check_task(t);
    if (st)
        return st;

    /* the payload, then the task's handles and what it writes (for a stall report) */
    size_t hoff = (t->args_size + sizeof(void *) - 1) / sizeof(void *) * sizeof(void *);
    size_t tail = hoff + (size_t)t->nbufs * (sizeof(starpu_data_handle_t) + 1);
    struct task_args *a = malloc(sizeof *a + tail);
    struct starpu_task *task = starpu_task_create();
    if (!a || !task) {
        free(a);
        if (task)
            discard_task(task);
        return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
    }
    a->fn = t->fn;
    a->where = t->where ? t->where : SP_EXEC_ON_CPU | SP_EXEC_ON_CUDA;
    a->group = t->group;
    a->seq = t->seq;
    a->footprint = t->footprint;
    snprintf(a->name, sizeof a->name, "%s", t->name ? t->name : "task");
    if (t->args_size)
        memcpy(a->payload, t->args, t->args_size);

    task->cl = codelet_for(t->codelet);
    task->cl_arg = a;
    a->on_cuda = 0;
    a->unrun = 0;
    atomic_init(&a->state, TASK_QUEUED);
    a->started = 0;
    a->nbufs = t->nbufs;
    a->handles = (starpu_data_handle_t *)(void *)(a->payload + hoff);
    a->writes = (unsigned char *)(a->handles + t->nbufs);
    for (int i = 0; i < t->nbufs; i++) {
        a->handles[i] = t->bufs[i]->handle;
        a->writes[i] = t->modes[i] != SP_ACCESS_R;
    }
    a->order = X.posted++;
    atomic_init(&a->early, NULL);
    if (a->where & SP_EXEC_ON_CUDA) {
        task->callback_func = cuda_task_done;
        task->callback_arg = a;
    }
    task->cl_arg_size = sizeof *a + tail;
    task->cl_arg_free = 1;
    task->name = a->name;
    task->nbuffers = t->nbufs;
    if (t->nbufs > STARPU_NMAXBUFS) {
        /* StarPU frees these with the task. */
        task->dyn_handles = malloc((size_t)t->nbufs * sizeof *task->dyn_handles);
        task->dyn_modes = malloc((size_t)t->nbufs * sizeof *task->dyn_modes);
        if (!task->dyn_handles || !task->dyn_modes) {
            discard_task(task);
            return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
        }
    }
    for (int i = 0; i < t->nbufs; i++) {
        STARPU_TASK_SET_HANDLE(task, t->bufs[i]->handle, i);
        STARPU_TASK_SET_MODE(task, starpu_mode(t->modes[i]), i);
    }

    st = claim_seq(t->seq, a->name);
    if (st) {
        discard_task(task);
        return st;
    }
    sp_policy_set_seq(task, t->seq);
    /* Ours to free at the end of the step (send_early); StarPU's if the list is full. */
    int keep = X.nargs < X.args_cap || grow_array((void **)&X.args, &X.args_cap, sizeof *X.args);
    task->cl_arg_free = !keep;
    int rc = starpu_task_submit(task);
    if (rc < 0) {
        X.seen[t->seq] = 0;
        X.nsubmitted--;
        task->cl_arg_free = 1;
        discard_task(task);
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: starpu_task_submit of '%s' failed: %s",
                            __FILE__, __LINE__, t->name ? t->name : "task", strerror(-rc));
    }
    if (keep)
        X.args[X.nargs++] = a;
    /* the task's outputs' sends may be posted by it; not kept (out of memory), by none:
     * an earlier writer must not post data this task has yet to write */
    for (int i = 0; i < t->nbufs; i++)
        if (t->modes[i] == SP_ACCESS_W || t->modes[i] == SP_ACCESS_RW) {
            t->bufs[i]->writer = keep ? a : NULL;
            t->bufs[i]->writer_step = sp_exec_step_;
        }
    return SP_OK;
}

/* ---- transfers (comm/ moves the data; the executor tags and traces them) ---- */

/* Every message of the step: its completion for a stall report, and its trace record.
 * Held by the step's list (until the next step begins) and by the message's completion,
 * which a transport may run after its drain has returned: the last of the two frees it. */
typedef struct {
    int is_send, peer;
    uint32_t msg;
    double posted;
    starpu_data_handle_t h;
    unsigned long order; /* posted after this many tasks and messages */
    atomic_int done;
    atomic_int refs;     /* the list's and the completion's */
} transfer_info;
static transfer_info **xfers;
static size_t nxfers, xfers_cap;

static void release_transfer(transfer_info *t)
{
    if (atomic_fetch_sub(&t->refs, 1) == 1)
        free(t);
}

static void free_transfers(void)
{
    for (size_t i = 0; i < nxfers; i++)
        release_transfer(xfers[i]);
    nxfers = 0;
}

/* Completion of a transfer: a failed one fails the step (StarPU-MPI has no error path:
 * the direct transport's failures); with tracing on, its record from posting to
 * completion. */
static void transfer_finish(void *arg, const char *err)
{
    transfer_info *t = arg;
    if (err)
        fail_step("rank %d: %s", sp_exec_rank_, err);
    atomic_fetch_add(&tasks_done, 1); /* progress, for the watchdog */
    if (!t)
        return;
    atomic_store(&t->done, 1);
    if (X.opts.trace) {
        char name[32];
        snprintf(name, sizeof name, "%s #%u %s %d", t->is_send ? "send" : "recv", t->msg,
                 t->is_send ? "to" : "from", t->peer);
        trace_add(name, t->msg, t->posted, starpu_timing_now(), t->is_send ? 1 : 2, t->peer);
    }
    release_transfer(t);
}

static sp_status post(sp_exec_buf *b, int peer, uint32_t msg, int is_send)
{
    const char *what = is_send ? "sp_exec_send" : "sp_exec_recv";
    if (!X.started || !X.in_step)
        return sp_set_error(SP_ERR_ARG, "%s: not inside a step", what);
    if (!b)
        return sp_set_error(SP_ERR_ARG, "%s: NULL buffer", what);
    if (peer < 0 || peer >= sp_exec_size_ || peer == sp_exec_rank_)
        return sp_set_error(SP_ERR_ARG, "%s: rank %d cannot exchange with rank %d of %d",
                            what, sp_exec_rank_, peer, sp_exec_size_);
    /* not kept (out of memory): the message goes untraced and unreported */
    transfer_info *info = NULL;
    if (nxfers < xfers_cap || grow_array((void **)&xfers, &xfers_cap, sizeof *xfers)) {
        if ((info = malloc(sizeof *info))) {
            *info = (transfer_info){ is_send, peer, msg, X.opts.trace ? starpu_timing_now() : 0,
                                     b->handle, X.posted++, 0, 2 };
            xfers[nxfers++] = info;
        }
    }
    /* a send of data a task of this step writes: that task may post it (send_early) */
    struct task_args *producer = is_send && b->writer_step == sp_exec_step_ ? b->writer : NULL;
    sp_xfer_req *held = NULL;
    sp_xfer x = { b->handle, b->count, b->elemsize, peer, is_send, msg };
    sp_status st = X.host->post(&x, transfer_finish, info,
                                producer && X.host->send_from ? &held : NULL);
    if (st && info)
        free(xfers[--nxfers]);
    if (held) {
        attach_early(producer, held, b->handle);
        X.host->drop(held);
    }
    if (!is_send)
        b->writer = NULL; /* written by the message now, not by a task */
    return st;
}

sp_status sp_exec_send(sp_exec_buf *b, int dst, uint32_t msg) { return post(b, dst, msg, 1); }

sp_status sp_exec_recv(sp_exec_buf *b, int src, uint32_t msg) { return post(b, src, msg, 0); }

sp_exec_transfers sp_exec_transfer_counts(void)
{
    sp_xfer_counts c = { 0 }, g = { 0 };
    if (X.started) X.host->counts(&c);
    if (X.started && X.group) X.group->counts(&g);
    return (sp_exec_transfers){ X.started ? X.host->name : "none", c.sends, c.recvs, c.pieced,
                                c.by_producer, c.bytes_sent, c.bytes_received, g.sends,
                                g.recvs };
}

size_t sp_exec_staging_bytes(void)
{
    return X.started && X.host->staging_bytes ? X.host->staging_bytes() : 0;
}

/* ---- buffers ---- */

static sp_status wrap_handle(sp_exec_buf **out, int node, void *ptr, size_t count,
                             size_t elemsize)
{
    sp_exec_buf *b = malloc(sizeof *b);
    if (!b)
        return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
    *b = (sp_exec_buf){ .count = count, .elemsize = elemsize, .node = STARPU_MAIN_RAM };
    /* home node -1: no copy anywhere until someone needs one */
    starpu_vector_data_register(&b->handle, ptr ? node : -1, (uintptr_t)ptr, (uint32_t)count,
                                elemsize);
    *out = b;
    return SP_OK;
}

static sp_status check_buf_args(const char *who, sp_exec_buf **out, size_t count, size_t elemsize)
{
    if (!X.started)
        return sp_set_error(SP_ERR_ARG, "%s: sp_exec_init first", who);
    if (!out || count == 0 || elemsize == 0 || count > UINT32_MAX)
        return sp_set_error(SP_ERR_ARG, "%s: bad arguments (count %zu, elemsize %zu)", who,
                            count, elemsize);
    return SP_OK;
}

sp_status sp_exec_buf_register(sp_exec_buf **out, void *ptr, size_t count, size_t elemsize)
{
    sp_status st = check_buf_args("sp_exec_buf_register", out, count, elemsize);
    return st ? st : wrap_handle(out, STARPU_MAIN_RAM, ptr, count, elemsize);
}

void *sp_exec_host_alloc(size_t bytes)
{
    void *p = NULL;
    if (starpu_malloc_flags(&p, bytes ? bytes : 1, STARPU_MALLOC_PINNED) != 0 || !p) return NULL;
    memset(p, 0, bytes);
    return p;
}

void sp_exec_host_free(void *ptr, size_t bytes)
{
    if (ptr) starpu_free_flags(ptr, bytes ? bytes : 1, STARPU_MALLOC_PINNED);
}

/* Device memory on the main thread: zeroing and the host's bounded copies go on a
 * stream of their own (non-blocking: it never waits for the workers' kernels, nor they
 * for it), synchronised before the call returns. */
#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
static cudaStream_t host_stream;
static int host_stream_dev = -1;

/* The CUDA worker's memory node, -1 on a rank without one. */
static int device_node(int *devid)
{
    if (starpu_cuda_worker_get_count() == 0)
        return -1;
    int w = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
    *devid = starpu_worker_get_devid(w);
    return (int)starpu_worker_get_memory_node((unsigned)w);
}

static sp_status device_stream(int devid)
{
    if (cudaSetDevice(devid) != cudaSuccess)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: cudaSetDevice(%d) failed", __FILE__, __LINE__,
                            devid);
    if (host_stream_dev == devid)
        return SP_OK;
    if (cudaStreamCreateWithFlags(&host_stream, cudaStreamNonBlocking) != cudaSuccess)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: no CUDA stream for host copies", __FILE__,
                            __LINE__);
    host_stream_dev = devid;
    return SP_OK;
}

static sp_status device_done(const char *what, cudaError_t e)
{
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(host_stream);
    return e == cudaSuccess ? SP_OK
                            : sp_set_error(SP_ERR_RUNTIME, "%s on the rank's GPU failed: %s", what,
                                           cudaGetErrorString(e));
}

static void device_shutdown(void)
{
    if (host_stream_dev >= 0) cudaStreamDestroy(host_stream);
    host_stream_dev = -1;
}
#else
static int device_node(int *devid) { *devid = -1; return -1; }
static void device_shutdown(void) {}
#endif

/* Pieces of host copies of device buffers: a checkpoint of a large stage never needs
 * the whole slab on the host (the copy functions stage nothing themselves; the caller's
 * destination is the only host memory). */
#define SP_EXEC_COPY_PIECE ((size_t)64 << 20)

sp_status sp_exec_buf_create(sp_exec_buf **out, size_t count, size_t elemsize)
{
    sp_status st = check_buf_args("sp_exec_buf_create", out, count, elemsize);
    if (st)
        return st;
    size_t bytes = count * elemsize;
    int devid, node = device_node(&devid);
    void *mem = NULL;
    if (node < 0) {
        if (!(mem = sp_exec_host_alloc(bytes)))
            return sp_set_error(SP_ERR_NOMEM, "out of host memory (a buffer of %zu bytes)", bytes);
        node = STARPU_MAIN_RAM;
    } else {
#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
        if ((st = device_stream(devid)))
            return st;
        mem = (void *)starpu_malloc_on_node((unsigned)node, bytes);
        if (!mem)
            return sp_set_error(SP_ERR_NOMEM, "out of GPU memory on device %d (a buffer of %zu "
                                "bytes)", devid, bytes);
        if ((st = device_done("zeroing a buffer", cudaMemsetAsync(mem, 0, bytes, host_stream)))) {
            starpu_free_on_node((unsigned)node, (uintptr_t)mem, bytes);
            return st;
        }
#endif
    }
    if ((st = wrap_handle(out, node, mem, count, elemsize))) {
        if (node == STARPU_MAIN_RAM) sp_exec_host_free(mem, bytes);
#ifdef STARPU_USE_CUDA
        else starpu_free_on_node((unsigned)node, (uintptr_t)mem, bytes);
#endif
        return st;
    }
    (*out)->node = node;
    (*out)->mem = mem;
    return SP_OK;
}

int sp_exec_buf_on_device(const sp_exec_buf *b) { return b && b->node != STARPU_MAIN_RAM; }

/* Bytes [off, off + len) between the buffer's home memory and the host, after the
 * tasks submitted before (sequential consistency); to_host: which way. */
static sp_status buf_copy(const char *who, sp_exec_buf *b, size_t off, size_t len, void *host,
                          int to_host)
{
    if (!b || !host || off > b->count * b->elemsize || len > b->count * b->elemsize - off)
        return sp_set_error(SP_ERR_ARG, "%s: bad arguments (bytes %zu..%zu)", who, off, off + len);
    if (X.broken)
        return broken_error(who);
    int node = b->node;
    SP_STARPU_CHECK(starpu_data_acquire_on_node(b->handle, node, to_host ? STARPU_R : STARPU_RW));
    char *home = (char *)starpu_data_handle_to_pointer(b->handle, (unsigned)node);
    sp_status st = SP_OK;
    if (node == STARPU_MAIN_RAM) {
        if (to_host) memcpy(host, home + off, len);
        else memcpy(home + off, host, len);
    }
#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
    else if (!(st = device_stream(starpu_memory_node_get_devid((unsigned)node)))) {
        for (size_t done = 0; done < len && !st; done += SP_EXEC_COPY_PIECE) {
            size_t n = len - done < SP_EXEC_COPY_PIECE ? len - done : SP_EXEC_COPY_PIECE;
            char *h = (char *)host + done, *d = home + off + done;
            st = device_done(to_host ? "a copy to the host" : "a copy from the host",
                             cudaMemcpyAsync(to_host ? h : d, to_host ? d : h, n,
                                             to_host ? cudaMemcpyDeviceToHost
                                                     : cudaMemcpyHostToDevice, host_stream));
        }
    }
#endif
    starpu_data_release_on_node(b->handle, node);
    if (!to_host) b->writer = NULL; /* the caller wrote it: a send of it waits for the release */
    return st;
}

sp_status sp_exec_buf_read(sp_exec_buf *b, size_t off, size_t len, void *dst)
{
    return buf_copy("sp_exec_buf_read", b, off, len, dst, 1);
}

sp_status sp_exec_buf_write(sp_exec_buf *b, size_t off, size_t len, const void *src)
{
    return buf_copy("sp_exec_buf_write", b, off, len, (void *)src, 0);
}

sp_status sp_exec_buf_unregister(sp_exec_buf *b)
{
    if (!b)
        return SP_OK;
    if (X.broken) { /* tasks of the lost step may still hold it: leave it to the exit */
        free(b);
        return broken_error("sp_exec_buf_unregister");
    }
    starpu_data_unregister(b->handle);
    if (b->mem && b->node == STARPU_MAIN_RAM)
        sp_exec_host_free(b->mem, b->count * b->elemsize);
#ifdef STARPU_USE_CUDA
    else if (b->mem)
        starpu_free_on_node((unsigned)b->node, (uintptr_t)b->mem, b->count * b->elemsize);
#endif
    free(b);
    return SP_OK;
}

size_t sp_exec_buf_count(const sp_exec_buf *b) { return b ? b->count : 0; }

sp_status sp_exec_buf_acquire(sp_exec_buf *b, sp_access_mode mode, void **ptr)
{
    if (!b || !ptr || (mode != SP_ACCESS_R && mode != SP_ACCESS_W && mode != SP_ACCESS_RW))
        return sp_set_error(SP_ERR_ARG, "sp_exec_buf_acquire: bad arguments");
    if (X.broken)
        return broken_error("sp_exec_buf_acquire");
    SP_STARPU_CHECK(starpu_data_acquire(b->handle, starpu_mode(mode)));
    *ptr = (void *)starpu_vector_get_local_ptr(b->handle);
    if (mode != SP_ACCESS_R)
        b->writer = NULL; /* the caller writes it: a send of it waits for the release */
    return SP_OK;
}

sp_status sp_exec_buf_release(sp_exec_buf *b)
{
    if (!b)
        return sp_set_error(SP_ERR_ARG, "sp_exec_buf_release: NULL buffer");
    starpu_data_release(b->handle);
    return SP_OK;
}

/* ---- steps ---- */

int sp_exec_usable(void) { return X.started && !X.broken; }

sp_status sp_exec_tensor_group_create(int color, int key, int size, sp_exec_tensor_group **out)
{
    *out = NULL;
    if (!sp_exec_usable())
        return sp_set_error(SP_ERR_ARG, "sp_exec_tensor_group_create: the executor is not usable");
    MPI_Comm c;
    SP_MPI_CHECK(MPI_Comm_split(X.comm, color, key, &c));
    int devid = -1;
    if (device_node(&devid) < 0) devid = -1; /* a CPU rank: MPI between its members */
    return sp_exec_tensor_group_wrap(c, size, devid, sp_exec_collective, out); /* group.c */
}

void sp_exec_cancel_step(void)
{
    if (X.started && X.in_step) {
        X.in_step = 0;
        X.broken = 1;
    }
}

/* Messages posted and not yet done, of every transport. */
static int transfers_pending(void)
{
    return X.host->pending() + (X.group ? X.group->pending() : 0);
}

/* ---- a stalled step: what each rank last did and waits for (STARPIPE_STEP_TIMEOUT) ----
 * The rank whose watchdog fires first prints its line and asks every other rank for
 * theirs (a message on X.comm; point-to-point, it never meets the agreement
 * collectives there), then waits a little for their answers before it gives up the
 * step: the process is about to end, and the launcher takes the others with it. A rank
 * asked prints its line, answers everyone, and gives up too. */
enum { TAG_STALLED = 0x57a1, TAG_REPORTED = 0x57a2 };

static struct task_args *args_of(uint32_t seq)
{
    for (size_t i = 0; i < X.nargs; i++)
        if (X.args[i]->seq == seq)
            return X.args[i];
    return NULL;
}

static void put(char *b, size_t len, size_t *k, const char *fmt, ...)
{
    if (*k >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b + *k, len - *k, fmt, ap);
    va_end(ap);
    *k = n < 0 ? len : *k + (size_t)n;
}

/* "receive #7 from rank 1 (tag 0x200000007)" */
static void put_message(char *b, size_t len, size_t *k, const transfer_info *t)
{
    put(b, len, k, "%s #%u %s rank %d", t->is_send ? "send" : "receive", t->msg,
        t->is_send ? "to" : "from", t->peer);
    if (X.host->tag)
        put(b, len, k, " (tag %#" PRIx64 ")", (uint64_t)X.host->tag(t->msg));
}

/* One line: the step, the last task done, the tasks running, the next task of the order
 * and the message it waits for, then the messages pending. Tasks are named with their
 * place in the rank's order (#seq) and messages with the plan's number. */
static void report_stall(void)
{
    char b[1024];
    size_t k = 0, len = sizeof b;
    double now = seconds_now();
    /* (no step number: callers number their steps themselves) */
    put(b, len, &k, "starpipe: rank %d: stalled: ", sp_exec_rank_);
    unsigned last = atomic_load(&last_done);
    struct task_args *a = last ? args_of(last - 1) : NULL;
    if (a)
        put(b, len, &k, "last task done '%s' (#%u)", a->name, a->seq);
    else
        put(b, len, &k, "no task of the step done");
    int running = 0;
    for (size_t i = 0; i < X.nargs; i++) {
        a = X.args[i];
        if (atomic_load(&a->state) == TASK_RUNNING)
            put(b, len, &k, "; running '%s' (#%u) for %.1f s", a->name, a->seq,
                now - a->started), running++;
    }
    uint32_t next;
    int ready;
    sp_policy_position(&next, &ready);
    a = args_of(next);
    if (!a) {
        put(b, len, &k, "; next in order #%u %s", next,
            next >= X.nsubmitted ? "(none: all submitted ran)" : "not submitted");
    } else if (atomic_load(&a->state) == TASK_QUEUED) {
        put(b, len, &k, "; next in order '%s' (#%u) ", a->name, a->seq);
        /* per buffer, the last message on it submitted before the task, if not done: a
         * receive it reads or overwrites, or a send of what it overwrites (StarPU's
         * sequential consistency orders them by submission) */
        int waits = 0;
        for (int j = 0; j < a->nbufs; j++) {
            const transfer_info *last = NULL;
            for (size_t i = 0; i < nxfers; i++)
                if (xfers[i]->h == a->handles[j] && xfers[i]->order < a->order)
                    last = xfers[i];
            if (last && !atomic_load(&last->done) && (!last->is_send || a->writes[j])) {
                put(b, len, &k, waits++ ? ", " : "waits for ");
                put_message(b, len, &k, last);
            }
        }
        if (!waits)
            put(b, len, &k, ready ? "is ready, no worker free" : "waits for its inputs");
    }
    int pending = 0;
    for (size_t i = 0; i < nxfers; i++) {
        const transfer_info *t = xfers[i];
        if (atomic_load(&t->done))
            continue;
        if (pending++ < 4) {
            put(b, len, &k, pending == 1 ? "; pending: " : ", ");
            put_message(b, len, &k, t);
        }
    }
    if (pending > 4)
        put(b, len, &k, " and %d more", pending - 4);
    else if (!pending)
        put(b, len, &k, "; no message pending");
    if (k >= len) /* cut: end it visibly */
        memcpy(b + len - 5, "...", 4);
    fprintf(stderr, "%s\n", b);
    fflush(stderr);
}

/* What a rank asking for reports waited on (the request's payload). */
enum { STALLED_TASKS = 0, STALLED_COLLECTIVE = 1 };
static const int stalled_on[2] = { STALLED_TASKS, STALLED_COLLECTIVE };

/* " saw no task finished": what the asker saw, for the asked rank's message */
static const char *asker_saw(int on)
{
    return on == STALLED_COLLECTIVE ? "waited in a collective" : "saw no task finished";
}

/* Sends tag, with *what, to every other rank (not waited for: the sends are eager, and
 * the process ends soon; what must outlive them). */
static void tell_all(int tag, const int *what)
{
    for (int r = 0; r < sp_exec_size_; r++) {
        if (r == sp_exec_rank_)
            continue;
        MPI_Request q;
        if (MPI_Isend(what, 1, MPI_INT, r, tag, X.comm, &q) == MPI_SUCCESS)
            MPI_Request_free(&q);
    }
}

/* The rank that asked for reports, if one has, and what it waited on (*on); -1 if none. */
static int report_asked(int *on)
{
    int flag = 0;
    MPI_Status stat;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_STALLED, X.comm, &flag, &stat) != MPI_SUCCESS || !flag)
        return -1;
    MPI_Recv(on, 1, MPI_INT, stat.MPI_SOURCE, TAG_STALLED, X.comm, MPI_STATUS_IGNORE);
    return stat.MPI_SOURCE;
}

/* Waits up to grace seconds for every other rank's report (its answer, or its own
 * request: it reported first), asker's excepted (its request was taken already, or -1);
 * writes the ranks that did not answer to missing, if given. */
static void await_reports(double grace, int asker, char *missing, size_t len)
{
    unsigned char *seen = calloc((size_t)sp_exec_size_, 1);
    if (!seen) {
        if (missing)
            snprintf(missing, len, "(out of memory)");
        return;
    }
    int left = sp_exec_size_ - 1;
    if (asker >= 0 && asker < sp_exec_size_ && asker != sp_exec_rank_) {
        seen[asker] = 1;
        left--;
    }
    double until = seconds_now() + grace;
    while (left > 0 && seconds_now() < until) {
        int flag = 0, who;
        MPI_Status stat;
        if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, X.comm, &flag, &stat) != MPI_SUCCESS)
            break;
        if (!flag) {
            nanosleep(&(struct timespec){ 0, 2000000 }, NULL);
            continue;
        }
        if (stat.MPI_TAG != TAG_STALLED && stat.MPI_TAG != TAG_REPORTED)
            continue; /* not ours: cannot be, between agreement collectives */
        MPI_Recv(&who, 1, MPI_INT, stat.MPI_SOURCE, stat.MPI_TAG, X.comm, MPI_STATUS_IGNORE);
        if (!seen[stat.MPI_SOURCE]) {
            seen[stat.MPI_SOURCE] = 1;
            left--;
        }
    }
    if (missing) {
        size_t k = 0;
        missing[0] = '\0';
        for (int r = 0; r < sp_exec_size_ && left > 0; r++)
            if (r != sp_exec_rank_ && !seen[r])
                put(missing, len, &k, "%s%d", k ? ", " : "", r);
    }
    free(seen);
}

/* How long a stalled step waits for the other ranks' reports. */
static double watchdog_grace(void) { return X.opts.watchdog_s < 5 ? X.opts.watchdog_s : 5; }

/* Whether this MPI lets the main thread call it beside StarPU-MPI's thread. */
static int mpi_multiple(void)
{
    int level = 0;
    return MPI_Query_thread(&level) == MPI_SUCCESS && level >= MPI_THREAD_MULTIPLE;
}

/* Waits for this rank's tasks of the step. With a watchdog, gives up when tasks are
 * pending and none has finished for watchdog_s seconds: a hung task or a message that
 * never comes cannot be recalled, so the step is lost and the executor with it. */
static sp_status wait_tasks(void)
{
    /* A group transport may fail asynchronously (NCCL: a dead or unreachable peer, seen
     * by its completion thread): with one, the wait polls for that too */
    int async = X.group && X.group->error;
    if (X.opts.watchdog_s <= 0 && !async) {
        SP_STARPU_CHECK(starpu_task_wait_for_all());
        return SP_OK;
    }
    unsigned long seen = atomic_load(&tasks_done);
    double quiet_since = seconds_now();
    /* with a watchdog: a stalled rank may ask this one for its report */
    int asking = X.opts.watchdog_s > 0 && sp_exec_size_ > 1 && mpi_multiple(), asker, on;
    int pending;
    while ((pending = starpu_task_nsubmitted() + transfers_pending()) > 0) {
        /* once the tasks are done, the last messages may still be in flight: the main
         * thread, which has nothing else to do, tests them as the idle workers do */
        if (X.host->progress && starpu_task_nsubmitted() == 0) {
            if (!X.host->progress()) sched_yield();
        } else {
            nanosleep(&(struct timespec){ 0, 2000000 }, NULL); /* the main thread only watches */
        }
        const char *gerr = async ? X.group->error() : NULL;
        if (gerr) { /* the transport is dead: this step and the executor are lost */
            return give_up(sp_set_error(SP_ERR_RUNTIME, "rank %d: %s", sp_exec_rank_, gerr));
        }
        unsigned long done = atomic_load(&tasks_done);
        if (X.opts.watchdog_s <= 0) {
            seen = done;
        } else if (done != seen) {
            seen = done;
            quiet_since = seconds_now();
        } else if (asking && (asker = report_asked(&on)) >= 0) {
            report_stall();
            tell_all(TAG_REPORTED, &sp_exec_rank_);
            X.broken = 1;
            /* the first rank to end aborts the others (the apps' MPI_Abort): not before
             * each has reported, or the grace is over (a rank whose main thread got no core
             * in time lost its line: app_hang_report at 3 ranks under load) */
            await_reports(watchdog_grace(), asker, NULL, 0);
            return give_up(sp_set_error(SP_ERR_TIMEOUT, "rank %d: rank %d %s for %.1f s "
                                        "(STARPIPE_STEP_TIMEOUT) and asked for each rank's "
                                        "state (above): the step is lost", sp_exec_rank_,
                                        asker, asker_saw(on), X.opts.watchdog_s));
        } else if (seconds_now() - quiet_since > X.opts.watchdog_s) {
            X.broken = 1;
            report_stall();
            char missing[256] = "";
            if (asking) {
                tell_all(TAG_STALLED, &stalled_on[STALLED_TASKS]);
                await_reports(watchdog_grace(), -1, missing, sizeof missing);
            }
            return give_up(sp_set_error(SP_ERR_TIMEOUT, "rank %d: no task finished for %.1f s "
                                        "while %d are pending: a message that never arrives, a "
                                        "hung task, or a peer that died (each rank's state is "
                                        "above%s%s%s)", sp_exec_rank_, X.opts.watchdog_s,
                                        pending, missing[0] ? "; no report from rank " : "",
                                        missing, missing[0] ? ", gone, stuck, or busy outside the "
                                        "executor" : ""));
        }
    }
    SP_STARPU_CHECK(starpu_task_wait_for_all());
    return SP_OK;
}

sp_status sp_exec_begin_step(void)
{
    if (!X.started)
        return sp_set_error(SP_ERR_ARG, "sp_exec_begin_step: sp_exec_init first");
    if (X.broken)
        return broken_error("sp_exec_begin_step");
    if (X.in_step)
        return sp_set_error(SP_ERR_ARG, "sp_exec_begin_step: step %llu has not ended",
                            (unsigned long long)sp_exec_step_);
    sp_status st = sp_policy_begin_step();
    if (st)
        return st;
    sp_exec_step_++;
    X.host->begin_step(sp_exec_step_);
    if (X.group) X.group->begin_step(sp_exec_step_);
    if (X.seen)
        memset(X.seen, 0, X.seen_cap);
    X.nsubmitted = 0;
    X.max_seq = 0;
    free_transfers(); /* the last step's, all done: it drained */
    atomic_store(&last_done, 0);
    STARPU_PTHREAD_MUTEX_LOCK(&trace_lock);
    trace_n = 0;
    trace_dropped = 0;
    STARPU_PTHREAD_MUTEX_UNLOCK(&trace_lock);
    atomic_store(&step_failed, 0);
    fail_msg[0] = '\0';
    X.step_t0 = starpu_timing_now();
    X.in_step = 1;
    return SP_OK;
}

sp_status sp_exec_end_step(void)
{
    if (!X.started || !X.in_step)
        return sp_set_error(SP_ERR_ARG, "sp_exec_end_step: not inside a step");
    X.in_step = 0;

    /* Seqs with a gap would be held forever: let them drain and report it. */
    if (X.nsubmitted && (size_t)X.max_seq + 1 != X.nsubmitted) {
        uint32_t hole = 0;
        while (X.seen[hole])
            hole++;
        sp_policy_drain();
        fail_step("rank %d: step %llu: %zu tasks submitted but the largest seq is %u "
                  "(seq %u is missing)", sp_exec_rank_, (unsigned long long)sp_exec_step_,
                  X.nsubmitted, X.max_seq, hole);
    }

    /* All tasks here, then the rest of the step's messages (StarPU-MPI: all its requests,
     * a barrier too in StarPU 1.3, this rank's only in 1.4, mpi/src/starpu_mpi.c; direct:
     * this rank's), and the agreement below is the barrier. A rank whose watchdog fired
     * returns at once: its peers' barrier then waits for a process that is about to end,
     * and the launcher ends them with it. */
    sp_status st = wait_tasks();
    if (st)
        return st; /* tasks may still hold their arguments: kept, the executor is broken */
    free_args();
    /* StarPU-MPI's drain ends in its thread's MPI_Barrier, which no watchdog can leave: with
     * one, every rank first meets here, where a dead peer is seen */
    if (X.opts.watchdog_s > 0 && X.host == &sp_transport_starpu_mpi &&
        (st = sp_exec_collective(&(sp_exec_coll){
             .kind = SP_COLL_BARRIER, .comm = X.comm,
             .what = "the step's end (the barrier before StarPU-MPI's drain)" })))
        return st;
    if ((st = X.host->drain()))
        return st;

    /* Agreement: every rank returns the error of the lowest failing rank. */
    int failed = atomic_load(&step_failed);
    int mine = failed ? sp_exec_rank_ : sp_exec_size_, lowest;
    if ((st = sp_exec_collective(&(sp_exec_coll){
             .kind = SP_COLL_ALLREDUCE, .send = &mine, .recv = &lowest, .count = 1,
             .type = MPI_INT, .op = MPI_MIN, .comm = X.comm,
             .what = "the step's agreement on its outcome" })))
        return st;
    if (lowest == sp_exec_size_)
        return SP_OK;
    if (X.host->renew && (st = X.host->renew()))
        return st;
    char msg[sizeof fail_msg];
    if (failed)
        memcpy(msg, fail_msg, sizeof msg);
    if ((st = sp_exec_collective(&(sp_exec_coll){
             .kind = SP_COLL_BCAST, .recv = msg, .count = (int)sizeof msg, .type = MPI_CHAR,
             .root = lowest, .comm = X.comm,
             .what = "the step's agreement (the failing rank's message)" })))
        return st;
    msg[sizeof msg - 1] = '\0';
    /* the message is the failing rank's own ("rank 1: task 'F mb0 s1' ..."): callers
     * number their steps themselves (the trainer runs two executor steps per step) */
    return sp_set_error(SP_ERR_RUNTIME, "%s", msg);
}

/* ---- collectives outside tasks, under the watchdog ----
 * The main thread's collectives (the step's agreement, the loss and norm reductions, a
 * checkpoint's broadcasts, the apps' own) wait for every rank: a peer that died or is
 * stuck would hold them forever, where no task watchdog looks. With a watchdog they are
 * posted nonblocking and tested until done, and given up when watchdog_s pass without
 * their end, as a step's tasks are. Without one, the blocking calls of before (the same
 * bits and speed). The main thread may test beside StarPU-MPI's thread only under
 * MPI_THREAD_MULTIPLE; under less the blocking calls stay. */

void sp_exec_label_step(long step) { X.step_label = step; }

/* "step 3" (the caller's numbering), else the executor's own */
static void step_name(char *b, size_t len)
{
    if (X.step_label > 0)
        snprintf(b, len, "step %ld", X.step_label);
    else
        snprintf(b, len, "executor step %llu", (unsigned long long)sp_exec_step_);
}

static int post_collective(const sp_exec_coll *c, MPI_Request *q)
{
    int n = c->count;
    switch (c->kind) {
    case SP_COLL_ALLREDUCE:
        return q ? MPI_Iallreduce(c->send, c->recv, n, c->type, c->op, c->comm, q)
                 : MPI_Allreduce(c->send, c->recv, n, c->type, c->op, c->comm);
    case SP_COLL_BCAST:
        return q ? MPI_Ibcast(c->recv, n, c->type, c->root, c->comm, q)
                 : MPI_Bcast(c->recv, n, c->type, c->root, c->comm);
    case SP_COLL_GATHER:
        return q ? MPI_Igather(c->send, n, c->type, c->recv, n, c->type, c->root, c->comm, q)
                 : MPI_Gather(c->send, n, c->type, c->recv, n, c->type, c->root, c->comm);
    case SP_COLL_ALLGATHER:
        return q ? MPI_Iallgather(c->send, n, c->type, c->recv, n, c->type, c->comm, q)
                 : MPI_Allgather(c->send, n, c->type, c->recv, n, c->type, c->comm);
    case SP_COLL_BARRIER:
        return q ? MPI_Ibarrier(c->comm, q) : MPI_Barrier(c->comm);
    }
    return MPI_ERR_ARG;
}

static const char *const coll_call[] = { "MPI_Allreduce", "MPI_Bcast", "MPI_Gather",
                                         "MPI_Allgather", "MPI_Barrier" };

/* How long a collective waits before it gives up: a second more than a step's tasks, so
 * that where a task hangs or a message is lost, the rank that sees it (whose line says
 * which task and which message) speaks first and asks the others, a rank in a collective
 * knowing only that somebody did not come. */
static double collective_limit(void) { return X.opts.watchdog_s + 1.0; }

sp_status sp_exec_collective(const sp_exec_coll *c)
{
    const char *call = coll_call[c->kind];
    if (X.opts.watchdog_s <= 0 || !mpi_multiple()) {
        int rc = post_collective(c, NULL);
        return rc == MPI_SUCCESS ? SP_OK : sp_comm_mpi_error(__FILE__, __LINE__, call, rc);
    }
    MPI_Request q;
    int rc = post_collective(c, &q), done = 0, asker = -1, on = 0;
    if (rc != MPI_SUCCESS)
        return sp_comm_mpi_error(__FILE__, __LINE__, call, rc);
    double t0 = seconds_now(), now = t0, limit = collective_limit();
    for (;;) {
        if ((rc = MPI_Test(&q, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
            return sp_comm_mpi_error(__FILE__, __LINE__, call, rc);
        if (done)
            return SP_OK;
        /* Polled as the blocking call would for the first milliseconds (a collective
         * between busy ranks ends in microseconds); then a look every millisecond, as a
         * peer may be writing a checkpoint (each test also moves the collective on) */
        now = seconds_now();
        if (now - t0 < 0.02) {
            sched_yield();
            continue;
        }
        if (now - t0 > limit)
            break;
        if (sp_exec_size_ > 1 && (asker = report_asked(&on)) >= 0)
            break;
        nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
    }
    /* The request cannot be recalled (MPI has no cancel for collectives): it stays
     * posted, as a lost step's tasks stay with StarPU, and the executor is given up. */
    char step[48];
    step_name(step, sizeof step);
    X.broken = 1;
    fprintf(stderr, "starpipe: rank %d: stalled: %s: in %s (%s) for %.1f s, which every rank "
            "must join\n", sp_exec_rank_, step, c->what, call, now - t0);
    fflush(stderr);
    if (asker >= 0) { /* a rank whose own wait ran out asked: it ends the run */
        tell_all(TAG_REPORTED, &sp_exec_rank_);
        await_reports(watchdog_grace(), asker, NULL, 0);
        return give_up(sp_set_error(SP_ERR_TIMEOUT, "rank %d: %s: in %s when rank %d %s for "
                                    "%.1f s (STARPIPE_STEP_TIMEOUT) and asked for each rank's "
                                    "state (above)", sp_exec_rank_, step, c->what, asker,
                                    asker_saw(on), X.opts.watchdog_s));
    }
    char missing[256] = "";
    if (sp_exec_size_ > 1) {
        tell_all(TAG_STALLED, &stalled_on[STALLED_COLLECTIVE]);
        await_reports(watchdog_grace(), -1, missing, sizeof missing);
    }
    return give_up(sp_set_error(SP_ERR_TIMEOUT, "rank %d: %s: %s did not end in %.1f s "
                                "(STARPIPE_STEP_TIMEOUT + 1 s): a peer that died or is stuck "
                                "(each rank's state is above%s%s%s)", sp_exec_rank_, step,
                                c->what, limit,
                                missing[0] ? "; no report from rank " : "", missing,
                                missing[0] ? ", gone, stuck, or busy outside the executor"
                                           : ""));
}

/* MPI counts are ints: large buffers go in chunks. */
#define SP_MPI_CHUNK ((size_t)1 << 28)

static sp_status between_steps(const char *what)
{
    if (!X.started)
        return sp_set_error(SP_ERR_ARG, "%s: sp_exec_init has not been called", what);
    if (X.broken)
        return broken_error(what);
    if (X.in_step)
        return sp_set_error(SP_ERR_ARG, "%s: only between steps", what);
    return SP_OK;
}

sp_status sp_exec_allreduce_sum_named(void *buf, size_t count, int is_double, const char *what)
{
    sp_status st = between_steps("sp_exec_allreduce_sum");
    if (st)
        return st;
    size_t elem = is_double ? sizeof(double) : sizeof(float);
    for (size_t off = 0; off < count && !st; off += SP_MPI_CHUNK) {
        size_t n = count - off < SP_MPI_CHUNK ? count - off : SP_MPI_CHUNK;
        st = sp_exec_collective(&(sp_exec_coll){
            .kind = SP_COLL_ALLREDUCE, .send = MPI_IN_PLACE, .recv = (char *)buf + off * elem,
            .count = (int)n, .type = is_double ? MPI_DOUBLE : MPI_FLOAT, .op = MPI_SUM,
            .comm = X.comm, .what = what });
    }
    return st;
}

sp_status sp_exec_allreduce_sum(void *buf, size_t count, int is_double)
{
    return sp_exec_allreduce_sum_named(buf, count, is_double,
                                       "an all-reduce between steps (sp_exec_allreduce_sum)");
}

sp_status sp_exec_bcast_named(void *buf, size_t bytes, int root, const char *what)
{
    sp_status st = between_steps("sp_exec_bcast");
    if (st)
        return st;
    for (size_t off = 0; off < bytes && !st; off += SP_MPI_CHUNK) {
        size_t n = bytes - off < SP_MPI_CHUNK ? bytes - off : SP_MPI_CHUNK;
        st = sp_exec_collective(&(sp_exec_coll){
            .kind = SP_COLL_BCAST, .recv = (char *)buf + off, .count = (int)n,
            .type = MPI_BYTE, .root = root, .comm = X.comm, .what = what });
    }
    return st;
}

sp_status sp_exec_bcast(void *buf, size_t bytes, int root)
{
    return sp_exec_bcast_named(buf, bytes, root, "a broadcast between steps (sp_exec_bcast)");
}

sp_status sp_exec_gather(const void *send, size_t bytes, void *recv, int root)
{
    sp_status st = between_steps("sp_exec_gather");
    if (st)
        return st;
    if (bytes > (size_t)INT32_MAX)
        return sp_set_error(SP_ERR_ARG, "sp_exec_gather: %zu bytes is more than one message",
                            bytes);
    return sp_exec_collective(&(sp_exec_coll){
        .kind = SP_COLL_GATHER, .send = send, .recv = recv, .count = (int)bytes,
        .type = MPI_BYTE, .root = root, .comm = X.comm,
        .what = "a gather between steps (sp_exec_gather)" });
}

/* ---- groups (the group transport: NCCL) ---- */

sp_status sp_exec_groups_init(char *notice, size_t len)
{
    sp_status st = between_steps("sp_exec_groups_init");
    if (st)
        return st;
    sp_transport_config c = { .world = X.comm, .ncuda = sp_exec_num_cuda(), .host = X.host->name };
    int active = 0;
    if ((st = sp_transport_nccl.init(&c, &active, notice, len)))
        return st;
    X.group = active ? &sp_transport_nccl : NULL;
    return SP_OK;
}

int sp_exec_groups_active(void) { return X.started && X.group != NULL; }

size_t sp_exec_group_threshold(void) { return X.group_threshold; }

sp_status sp_exec_groups_connect(const int *peers, int n)
{
    sp_status st = between_steps("sp_exec_groups_connect");
    if (st)
        return st;
    return X.group && X.group->connect ? X.group->connect(peers, n) : SP_OK;
}

sp_status sp_exec_group(const sp_exec_xfer *x, int n, const char *name, uint32_t seq)
{
    if (!X.started || !X.in_step)
        return sp_set_error(SP_ERR_ARG, "sp_exec_group: not inside a step");
    if (!X.group)
        return sp_set_error(SP_ERR_ARG, "sp_exec_group: no group transport (sp_exec_groups_init)");
    if (!x || n <= 0)
        return sp_set_error(SP_ERR_ARG, "sp_exec_group: no messages");
    sp_xfer *m = malloc((size_t)n * sizeof *m);
    if (!m)
        return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
    sp_status st = SP_OK;
    for (int k = 0; k < n && st == SP_OK; k++) {
        if (!x[k].buf || x[k].peer < 0 || x[k].peer >= sp_exec_size_ || x[k].peer == sp_exec_rank_)
            st = sp_set_error(SP_ERR_ARG, "sp_exec_group '%s': message %d has no buffer or "
                              "a bad peer (%d)", name ? name : "", k, x[k].peer);
        else
            m[k] = (sp_xfer){ x[k].buf->handle, x[k].buf->count, x[k].buf->elemsize, x[k].peer,
                              x[k].is_send, 0 };
    }
    sp_xfer_group g = { 0 };
    if (st == SP_OK)
        st = X.group->group(m, n, &g);
    if (st == SP_OK) {
        sp_exec_buf **bufs = malloc((size_t)g.nbufs * sizeof *bufs);
        if (!bufs)
            st = sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
        for (int j = 0; bufs && j < g.nbufs; j++)
            bufs[j] = x[g.xfer[j]].buf;
        if (st == SP_OK)
            st = sp_exec_submit(&(sp_exec_task){ .name = name, .fn = g.fn,
                                                 .where = SP_EXEC_ON_CUDA, .nbufs = g.nbufs,
                                                 .bufs = bufs, .modes = g.mode, .args = g.args,
                                                 .args_size = g.args_size, .seq = seq,
                                                 .codelet = X.group->name });
        free(bufs);
    }
    free(g.args), free(g.xfer), free(g.mode);
    free(m);
    return st;
}

/* ---- start-up, shutdown, abort ---- */

int sp_exec_rank(void) { return sp_exec_rank_; }

int sp_exec_num_cuda(void)
{
#ifdef STARPU_USE_CUDA
    return X.started ? (int)starpu_cuda_worker_get_count() : 0;
#else
    return 0;
#endif
}

int sp_exec_size(void) { return sp_exec_size_; }

_Noreturn void sp_exec_abort(int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "starpipe: rank %d: %s\n", sp_exec_rank_, msg);
    fflush(stderr);
    if (code == 0)
        code = 1;
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down)
        MPI_Abort(MPI_COMM_WORLD, code); /* the launcher then kills every rank */
    exit(code);
}

/* STARPU_SCHED naming a built-in policy would silently replace ours: StarPU prefers the
 * variable to starpu_conf.sched_policy. Our order is a correctness property (the
 * schedule's memory bound and message order rest on it), so refuse rather than run. */
static sp_status check_sched_env(void)
{
    const char *s = getenv("STARPU_SCHED");
    if (!s)
        return SP_OK;
    if (strcmp(s, sp_policy.policy_name) == 0) {
        unsetenv("STARPU_SCHED"); /* StarPU does not know the name and would warn */
        return SP_OK;
    }
    return sp_set_error(SP_ERR_ARG, "STARPU_SCHED=%s would replace starpipe's ordered "
                        "scheduling policy; unset it or set it to \"starpipe\"", s);
}

/* The transport when STARPIPE_TRANSPORT says nothing (comm/README.md). */
#define SP_DEFAULT_TRANSPORT "starpu-mpi"

/* STARPIPE_TRANSPORT: how messages travel (comm/README.md), decided before MPI starts. */
static sp_env env;
static sp_status check_transport_env(void)
{
    sp_status st = sp_env_read(&env);
    if (st) return st;
    X.host = sp_transport_by_name(env.transport ? env.transport : SP_DEFAULT_TRANSPORT);
    X.group_threshold = env.nccl_threshold >= 0 ? (size_t)env.nccl_threshold : 65536;
    /* Large transfers between ranks of one node: eager pieces (1), or one message from a
     * copy as between nodes (0, what tests use to reach that path on one machine); unset,
     * pieces unless ranks share cores: a sender preempted half-way through its pieces
     * would hold the rest back for a time slice (runtime/README.md, "Transfers"). */
    X.pieces = env.shm_pieces;
    return SP_OK;
}

/* ---- StarPU's bus model: measured by one process at a time ----
 * starpu_init measures the bus and writes its files (<home>/.starpu/sampling/bus/<host>.*)
 * when they are missing or describe other hardware, and processes sharing a StarPU home
 * do it at once, truncating and reading each other's files: in a fresh home, a rank read
 * an affinity file another rank was rewriting and aborted (CI; 4 runs in 15 with 8 ranks
 * here, tests/runtime/fresh_home.sh). So each process holds an exclusive lock next to
 * those files from before starpu_init until StarPU has loaded them; StarPU creates the
 * scheduling context right after that (core/workers.c), and our policy then calls the
 * context's sched_policy_init callback, bus_unlock. The lock covers separate jobs on the
 * host too, and the kernel drops it if the process dies. Start-up is serialised only
 * over StarPU's topology discovery and the bus files, before any worker or MPI thread. */
static int bus_lock_fd = -1;

static void bus_unlock(unsigned ctx)
{
    (void)ctx;
    if (bus_lock_fd >= 0) {
        close(bus_lock_fd); /* releases the flock */
        bus_lock_fd = -1;
    }
}

/* Creates the folders of path (not its last component), as StarPU would: mode 0700. */
static void make_dirs(char *path)
{
    for (char *c = path + 1; *c; c++)
        if (*c == '/') {
            *c = 0;
            mkdir(path, 0700); /* EEXIST and the rest: open() below tells */
            *c = '/';
        }
}

/* The bus files' folder as StarPU itself names it (its path rules: STARPU_PERF_MODEL_DIR,
 * XDG_CACHE_HOME, STARPU_HOME, HOME, STARPU_HOSTNAME); "" when it cannot be read.
 * StarPU 1.4 names a folder only once some model folder holds a bus config: before that
 * (a fresh home) it prints "INVALID_LOCATION/<host>.affinity", and measures the bus into
 * its first model folder (perfmodel_bus.c, _starpu_bus_force_sampling: location 0), the
 * first that starpu_perfmodel_directory prints ("<folder>codelets/<n>/"); the lock is then
 * made there, where the later processes of the home find it once the config is written. */
static void bus_lock_path(char *path, size_t n)
{
    static const char invalid[] = "INVALID_LOCATION/";
    char *text = NULL, *dirs = NULL;
    size_t len = 0;
    path[0] = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return;
    starpu_bus_print_filenames(f); /* " affinity: <DIR/HOST.affinity>" among its lines */
    fclose(f);
    const char *a = text ? strstr(text, "affinity: <") : NULL;
    const char *e = a ? strstr(a, ".affinity>") : NULL;
    if (e) {
        a += strlen("affinity: <");
        if (strncmp(a, invalid, strlen(invalid)) != 0) {
            snprintf(path, n, "%.*s.starpipe-lock", (int)(e - a), a);
        } else if ((f = open_memstream(&dirs, &len))) {
            a += strlen(invalid); /* the host */
            starpu_perfmodel_directory(f);
            fclose(f);
            const char *d = dirs ? strstr(dirs, "directory: <") : NULL;
            const char *end = d ? strstr(d, "/>\n") : NULL, *c = NULL;
            if (end) { /* the last "codelets/" before the line's end */
                d += strlen("directory: <");
                for (const char *p = d; (p = strstr(p, "codelets/")) && p < end; p++)
                    c = p;
            }
            if (c) {
                snprintf(path, n, "%.*sbus/%.*s.starpipe-lock", (int)(c - d), d,
                         (int)(e - a), a);
                make_dirs(path);
            }
            free(dirs);
        }
    }
    free(text);
}

static void bus_lock(void)
{
    char path[4096];
    bus_lock_path(path, sizeof path);
    if (!path[0])
        return;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return; /* a read-only home: StarPU cannot write its files either, nothing races */
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {}
    bus_lock_fd = fd;
}

/* This rank's GPU (runtime/gpumap.c) from what the CUDA runtime sees, and the CPUs near
 * it (hwloc, by the device's PCI address; empty when unknown). */
/* The GPU of local rank lrank of lsize (runtime/gpumap.c), from what the CUDA runtime
 * sees: sp_exec_init's choice and sp_exec_expect_cuda's forecast of it. */
static sp_status pick_gpu(int lrank, int lsize, sp_gpu_choice *gpu)
{
    int ngpus = 0;
#ifdef STARPIPE_HAVE_CUDA
    if (cudaGetDeviceCount(&ngpus) != cudaSuccess) ngpus = 0;
#endif
    return sp_gpu_choose(lrank, lsize, ngpus, env.gpu, getenv("CUDA_VISIBLE_DEVICES"), gpu);
}

static sp_status choose_gpu(MPI_Comm node, sp_gpu_choice *gpu, cpu_set_t *near)
{
    int lrank, lsize;
    CPU_ZERO(near);
    SP_MPI_CHECK(MPI_Comm_rank(node, &lrank));
    SP_MPI_CHECK(MPI_Comm_size(node, &lsize));
    sp_status st = pick_gpu(lrank, lsize, gpu);
#ifdef STARPIPE_HAVE_CUDA
    char bus[64], where[64];
    if (st == SP_OK && gpu->device >= 0 &&
        cudaDeviceGetPCIBusId(bus, sizeof bus, gpu->device) == cudaSuccess) {
        sp_binding_near(bus, near, where, sizeof where); /* empty: unknown, the plain split */
        size_t k = strlen(gpu->line);
        snprintf(gpu->line + k, sizeof gpu->line - k, ", PCI %s under %s", bus,
                 where[0] ? where : "an unknown node (hwloc does not list it)");
    }
#endif
    return st;
}

int sp_exec_expect_cuda(int local_rank, int local_size)
{
#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
    const char *ncuda = getenv("STARPU_NCUDA");
    if ((ncuda && !strcmp(ncuda, "0")) || sp_env_read(&env) != SP_OK) return 0;
    sp_gpu_choice gpu;
    return pick_gpu(local_rank, local_size, &gpu) == SP_OK && gpu.device >= 0 &&
           strcmp(gpu.ncuda, "0") != 0;
#else
    (void)local_rank, (void)local_size;
    return 0;
#endif
}

#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
static void set_tf32(void *on)
{
    sp_cuda_set_tf32(starpu_cublas_get_local_handle(), *(const int *)on);
}
#endif

sp_status sp_exec_init(int *argc, char ***argv, const sp_exec_opts *opts)
{
    if (X.started)
        return sp_set_error(SP_ERR_ARG, "sp_exec_init: already initialized");
    memset(&X, 0, sizeof X);
    if (opts)
        X.opts = *opts;
    sp_status st = check_sched_env();
    if (!st)
        st = check_transport_env();
    if (st)
        return st;

    int up = 0, level = 0;
    SP_MPI_CHECK(MPI_Initialized(&up));
    /* The library found at run time, not the headers' (Open MPI 4 and 5 share
     * libmpi.so.40): its parameters' names differ (runtime/launch.c), and another MPI,
     * or an Open MPI whose names we do not know, is left as it is. */
    sp_mpi_library mpi;
    sp_ompi_tuning tune;
    sp_launch_mpi_library(&mpi);
    int tuned = !up && sp_launch_ompi_tuning(&mpi, &tune);
    char mpi_line[160];
    if (tuned) {
        /* OpenMPI's polling never yields the core unless the node is oversubscribed, and
         * StarPU-MPI's progress thread polls while any request is pending: on a rank with
         * one core it took half of it from the worker (runtime/README.md). Yielding costs
         * a system call per idle poll where the thread has a core of its own, and gives
         * the worker the core where it has not. A transport the rank's workers drive
         * (direct) has no such thread: only an idle worker polls, and it yields between
         * polls by itself. Only ours to set before MPI starts; a user's own choice
         * (mpirun --mca, the environment) wins. */
        if (!X.host->progress)
            setenv(tune.yield_when_idle, "1", 0);
        /* A pipeline message is written by the task just before its send, and its
         * receiver is often busy when it arrives. Above OpenMPI's 4 KB shared-memory eager
         * limit the receiver pulls it when it next polls (CMA, a system call pinning
         * every page: 25-45 us for 64 KB on the 2-core VM); eager, the sender copies it
         * into shared memory at once and the receiver only copies it out. Up to 128 KB
         * (the default GPT's 64 KB activations), halving their wait (runtime/README.md);
         * larger transfers go as pieces of that size with direct (comm/direct.c). The
         * limit counts OpenMPI's header: SP_COMM_EAGER_LIMIT leaves it room beside 128 KB
         * of data. */
        char eager[32];
        snprintf(eager, sizeof eager, "%d", SP_COMM_EAGER_LIMIT);
        if (!tune.eager_alias || !getenv(tune.eager_alias))
            setenv(tune.eager_limit, eager, 0);
        if (!tune.max_send_alias || !getenv(tune.max_send_alias))
            setenv(tune.max_send_size, eager, 0);
        const char *lim = getenv(tune.eager_limit);
        if (!lim && tune.eager_alias) lim = getenv(tune.eager_alias);
        snprintf(mpi_line, sizeof mpi_line, "%s tuned (%s eager limit %s B)", mpi.name,
                 tune.btl, lim ? lim : "?");
    } else {
        snprintf(mpi_line, sizeof mpi_line, "%s left as it is (%s)", mpi.name,
                 up ? "started before starpipe" : "not Open MPI 4 or 5");
    }
    if (!up) {
        /* srun without PMIx: Open MPI would abort in MPI_Init with its own text */
        if ((st = sp_launch_before_mpi()))
            return st;
        /* StarPU-MPI needs SERIALIZED (its progress thread and ours call MPI); MULTIPLE
         * also covers our agreement collectives while its thread is parked. */
        SP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &level));
        X.mpi_ours = 1;
    } else {
        SP_MPI_CHECK(MPI_Query_thread(&level));
    }
    if (level < MPI_THREAD_SERIALIZED)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: MPI gives thread level %d, StarPU-MPI "
                            "needs MPI_THREAD_SERIALIZED", __FILE__, __LINE__, level);
    /* A transport the workers drive calls MPI from every worker and the main thread at
     * once. */
    if (X.host->progress && level < MPI_THREAD_MULTIPLE) {
        if (env.transport)
            return sp_set_error(SP_ERR_RUNTIME, "STARPIPE_TRANSPORT=%s needs "
                                "MPI_THREAD_MULTIPLE; this MPI gives level %d", X.host->name,
                                level);
        X.host = &sp_transport_starpu_mpi;
    }
    SP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &sp_exec_rank_));
    SP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &sp_exec_size_));
    if ((st = sp_launch_after_mpi(sp_exec_size_))) /* P tasks, fewer ranks: say why */
        return st;
    SP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &X.comm));

    MPI_Comm node;
    SP_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL,
                                     &node));
    /* One GPU per rank: chosen from the rank's place on its host, before StarPU opens
     * any device; every rank agrees on the outcome (a bad STARPIPE_GPU seen by one rank
     * must not leave the others in StarPU's start-up collectives). */
    cpu_set_t near;
    sp_gpu_choice gpu;
    st = choose_gpu(node, &gpu, &near);
    int bad = st != SP_OK, any = 0;
    SP_MPI_CHECK(MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (any) {
        MPI_Comm_free(&node);
        return st ? st : sp_set_error(SP_ERR_ARG, "another rank could not choose its GPU "
                                      "(STARPIPE_GPU)");
    }
    setenv("STARPU_NCUDA", gpu.ncuda, 0); /* a user's own StarPU settings win */
    if (gpu.device >= 0) setenv("STARPU_WORKERS_CUDAID", gpu.cudaid, 0);
    sp_binding b;
    st = sp_binding_plan(node, X.opts.ncpus, CPU_COUNT(&near) ? &near : NULL,
                         gpu.device >= 0 && strcmp(getenv("STARPU_NCUDA"), "0") != 0, &b);
    MPI_Comm_free(&node);
    if (st)
        return st;
    sp_binding_apply(&b);
    if (X.pieces < 0)
        X.pieces = !b.nobind; /* the same on every rank of the node */
    if (X.opts.verbose) {
        const char *y = getenv("OMPI_MCA_mpi_yield_when_idle");
        fprintf(stderr, "starpipe: rank %d (local %d of %d): %s; %d CPU worker(s), %s; "
                "messages %s; StarPU-MPI thread %s%s; MPI: %s\n", sp_exec_rank_,
                b.local_rank, b.local_size, gpu.line, b.nworkers, b.desc,
                X.host == &sp_transport_starpu_mpi
                    ? "over StarPU-MPI (detached transfers, its progress thread)"
                : X.pieces ? "direct (MPI requests tested by idle workers; large ones within "
                             "the node in eager pieces)"
                           : "direct (MPI requests tested by idle workers)",
                getenv("STARPU_MPI_NOBIND") ? "unbound" : "on its own core",
                y && strcmp(y, "0") ? ", yields when idle" : "", mpi_line);
    }


    /* Our policy never asks the performance models for predictions, so StarPU would
     * never record into them: record always (the user's STARPU_CALIBRATE wins). */
    setenv("STARPU_CALIBRATE", "1", 0);
    /* and keep them when a task's time moves by more than StarPU's default 50% (ranks
     * sharing cores, a noisy machine, a tensor-parallel task waiting for its group's
     * slowest member: 30x measured): StarPU would flush the history and say so on stderr
     * on every run */
    setenv("STARPU_HISTORY_MAX_ERROR", "100000", 0);
    /* A StarPU built with FxT (scripts/test-fxt builds one) traces every run in 1.3 unless
     * STARPU_FXT_TRACE=0 (src/common/fxt.c), each rank writing its trace at shutdown: a
     * trace only when the user asks for one (STARPU_FXT_TRACE=1). */
    setenv("STARPU_FXT_TRACE", "0", 0);
    struct starpu_conf conf;
    SP_STARPU_CHECK(starpu_conf_init(&conf));
    conf.sched_policy = &sp_policy;
#if STARPU_MAJOR_VERSION > 1 || STARPU_MINOR_VERSION >= 4
    conf.sched_policy_callback = bus_unlock; /* 1.4's name of sched_policy_init */
#else
    conf.sched_policy_init = bus_unlock;
#endif
    bus_lock();
    int rc = starpu_mpi_init_conf(argc, argv, 0, MPI_COMM_WORLD, &conf);
    bus_unlock(0); /* in case starpu_init failed before creating the context */
    if (rc < 0)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: starpu_mpi_init_conf failed: %s",
                            __FILE__, __LINE__, strerror(-rc));
    /* The cache only serves starpu_mpi_task_insert's implicit transfers, which starpipe
     * never uses; with it off a stray use cannot serve stale data (tests/runtime). */
    SP_STARPU_CHECK(starpu_mpi_cache_set(0));
    sp_transport_config tc = { .world = MPI_COMM_WORLD, .pieces = X.pieces,
                               .poke = sp_policy_poke };
    int active = 0;
    char notice[256];
    if ((st = X.host->init(&tc, &active, notice, sizeof notice)))
        return st;
    if (!active)
        return sp_set_error(SP_ERR_RUNTIME, "transport %s cannot run: %s", X.host->name, notice);
    if (X.host->inflight) /* idle workers drive its requests while there are some */
        sp_policy_set_idle_poll(X.host->inflight);
#ifdef STARPU_USE_CUDA
    starpu_cublas_init(); /* one handle per CUDA worker, bound to its stream */
#ifdef STARPIPE_HAVE_CUDA
    /* exact fp32 products unless STARPIPE_TF32=1 asks for TF32 tensor cores */
    starpu_execute_on_each_worker(set_tf32, &env.tf32, STARPU_CUDA);
#endif
#endif
    /* The CPU kernels' bits and speed must not depend on how the rank was launched:
     * OpenBLAS would otherwise run its own thread pool inside our tasks whenever the
     * launcher leaves the rank more than one core (--bind-to none, -np > 2). */
    sp_kernels_init();
    /* A clock origin shared by every rank, for traces and message latencies: one host's
     * ranks read the same monotonic clock, so the skew is the barrier's exit skew. */
    SP_MPI_CHECK(MPI_Barrier(X.comm));
    X.epoch = starpu_timing_now();
    X.started = 1;
    return SP_OK;
}

sp_status sp_exec_shutdown(void)
{
    if (!X.started)
        return sp_set_error(SP_ERR_ARG, "sp_exec_shutdown: not initialized");
    if (X.broken) /* StarPU would wait forever for the lost step's tasks */
        return broken_error("sp_exec_shutdown");
    /* a peer gone since the last step would hold StarPU-MPI's shutdown and MPI_Finalize */
    sp_status st;
    if (X.opts.watchdog_s > 0 &&
        (st = sp_exec_collective(&(sp_exec_coll){ .kind = SP_COLL_BARRIER, .comm = X.comm,
                                                   .what = "the shutdown's barrier" })))
        return st;
    X.started = 0;
    starpu_task_wait_for_all();
    if (X.group)
        X.group->shutdown();
    X.group = NULL;
#ifdef STARPU_USE_CUDA
    starpu_cublas_shutdown();
#endif
    device_shutdown();
    /* every request ended with its step */
    sp_policy_set_idle_poll(NULL);
    X.host->shutdown();
    /* Waits for all tasks and MPI requests, then stops StarPU too (it started it). */
    SP_STARPU_CHECK(starpu_mpi_shutdown());
    free(X.seen);
    X.seen = NULL;
    free_args(); /* a step ended without sp_exec_end_step */
    free(X.args);
    X.args = NULL;
    X.args_cap = 0;
    free_transfers();
    free(xfers);
    xfers = NULL;
    xfers_cap = 0;
    free(trace_recs);
    trace_recs = NULL;
    trace_n = trace_cap = 0;
    SP_MPI_CHECK(MPI_Comm_free(&X.comm));
    if (X.mpi_ours)
        SP_MPI_CHECK(MPI_Finalize());
    return SP_OK;
}
