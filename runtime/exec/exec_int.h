/* What the files of runtime/exec/ share, and nothing outside the folder includes (the
 * rest of runtime/ has runtime/exec_impl.h): the executor's state X, the step's counters,
 * a task's arguments, a message's record, and what one file of the stack gives the files
 * above it, by file, bottom first (README.md). CUDA is runtime/exec/device.h's. */
#ifndef STARPIPE_RUNTIME_EXEC_INT_H
#define STARPIPE_RUNTIME_EXEC_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include <mpi.h>
#include <starpu.h>

#include "comm/transport.h"
#include "runtime/exec_impl.h"
#include "starpipe/exec.h"

/* ---- state.c: the executor's state, the step's counters, failure agreement ---- */
struct sp_exec_state {
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
     * producer may still reach the producer's (sp_exec_send_early). */
    struct task_args **args;
    size_t nargs, args_cap;
    unsigned long posted; /* tasks and messages submitted since init (their order) */
    int pieces;           /* large transfers within a node as eager pieces (direct):
                             1 always, 0 never, -1 where ranks have cores of their own */
    char (*hosts)[64];    /* [size]: each rank's hostname, for the reports of a stall */
    /* [size]: bytes of the messages this rank posted to each rank since init (the
     * per-link counters of sp_exec_bytes_sent_to) */
    unsigned long long *sent_to;
};
extern struct sp_exec_state sp_exec_state_;
/* X in every file of the folder: the one name of the state, short (the reason this
 * header is the last one a file includes). */
#define X sp_exec_state_

/* The waits nothing else can leave (MPI's start-up, StarPU-MPI's drain): unless disarmed
 * within `seconds` (> 0; else nothing), a thread prints the line (printf's fmt, and what
 * `more` appends to it, if given) and ends the process, exit status 1. One at a time. */
void sp_exec_deadline_arm(double seconds, void (*more)(char *, size_t), const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void sp_exec_deadline_disarm(void);

/* Rank r's hostname ("?" before start-up or out of range): the reports of a stall say
 * which host a silent rank is on. */
static inline const char *sp_exec_host_of(int r)
{
    return X.hosts && r >= 0 && r < sp_exec_size_ ? X.hosts[r] : "?";
}

/* The step is lost (sp_exec_fail_msg_ says why); tasks and transfers finished since init
 * (the watchdog's progress); seq + 1 of the step's task that finished last, or 0. */
extern atomic_int sp_exec_step_failed_;
extern atomic_ulong sp_exec_tasks_done_;
extern atomic_uint sp_exec_last_done_;
extern char sp_exec_fail_msg_[512];
/* A task's failure: the first one wins, later tasks of the step skip their work. */
void sp_exec_fail_step(const char *fmt, ...);
/* A task or message of the step completed: wakes the main thread's wait. */
void sp_exec_progress(void);
/* Waits until the count of completions differs from seen, at most timeout seconds (0:
 * not at all); returns the count. */
unsigned long sp_exec_progress_wait(unsigned long seen, double timeout);
/* The error of every call after a step was given up (sp_exec_cancel_step, watchdog). */
sp_status sp_exec_broken_error(const char *what);
/* Gives up: the executor is unusable from now on, and later calls repeat why (the error
 * st just set) */
sp_status sp_exec_give_up(sp_status st);

static inline double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Doubles the capacity of the array *a of *cap elements; 0 when out of memory. */
static inline int grow_array(void **a, size_t *cap, size_t elem)
{
    size_t n = *cap ? 2 * *cap : 256;
    void *g = realloc(*a, n * elem);
    if (!g)
        return 0;
    *a = g;
    *cap = n;
    return 1;
}

/* ---- a task's arguments: tasks.c makes them, codelet.c runs the task ---- */

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

/* ---- trace.c ---- */
void sp_exec_trace_add(const char *name, uint32_t seq, double t0, double t1, int transfer,
                       int peer);
void sp_exec_trace_clear(void);    /* a new step's (sp_exec_begin_step) */
void sp_exec_trace_shutdown(void); /* the records' memory */

/* ---- sends.c: sends posted by their producer ---- */
/* A send of a's output h, posted by a's wrapper if a has not run yet (else by StarPU's
 * grant of the buffer). */
void sp_exec_attach_early(struct task_args *a, sp_xfer_req *r, starpu_data_handle_t h);
/* The wrapper's end: posts the sends attached to a, from ptrs (a CPU task's buffers). */
void sp_exec_send_early(struct starpu_task *task, struct task_args *a, void *const *ptrs,
                        int n);

/* ---- codelet.c: the generic codelet ---- */
/* The codelet of a task class (sp_exec_task.codelet), made on first use. */
struct starpu_codelet *sp_exec_codelet_for(const char *cls);

/* ---- tasks.c: submission ---- */
enum starpu_data_access_mode sp_exec_starpu_mode(sp_access_mode m);
/* The end of a step whose tasks are all done: their arguments go. */
void sp_exec_free_args(void);

/* ---- transfers.c ---- */

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
extern transfer_info **sp_exec_xfers_;
extern size_t sp_exec_nxfers_;
void sp_exec_free_transfers(void);     /* the last step's, all done */
void sp_exec_transfers_shutdown(void); /* and the list's memory */
/* Messages posted and not yet done, of every transport. */
int sp_exec_transfers_pending(void);

/* ---- stall.c: a stalled step's reports ---- */
/* The tags on X.comm of a request for reports and of an answer. */
enum { TAG_STALLED = 0x57a1, TAG_REPORTED = 0x57a2 };
/* This rank's line on stderr: the last task done, those running, the next in order and
 * the messages it waits for, the messages pending. */
void sp_exec_report_stall(void);
/* Sends tag, with *what, to every other rank (what must outlive the sends). */
void sp_exec_tell_all(int tag, const int *what);
/* The rank that asked for reports and what it waited on (*on), or -1. */
int sp_exec_report_asked(int *on);
/* Waits up to grace seconds for every other rank's report but asker's; the ranks that
 * did not answer into missing, if given. */
void sp_exec_await_reports(double grace, int asker, char *missing, size_t len);

/* ---- watchdog.c: the main thread's waits (sp_exec_collective: exec_impl.h) ---- */
sp_status sp_exec_wait_tasks(void);

/* ---- collectives.c ---- */
sp_status sp_exec_between_steps(const char *what);

/* ---- buslock.c: StarPU's bus model, measured by one process at a time ---- */
void sp_exec_bus_lock(void);
void sp_exec_bus_unlock(unsigned ctx);

#endif
