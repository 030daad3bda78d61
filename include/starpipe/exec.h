/* The low-level executor: one MPI rank = one pipeline actor, running its tasks on
 * StarPU in the order the plan gives, with a transport moving buffers between ranks
 * (StarPU-MPI by default; comm/transport.h).
 *
 *   sp_exec_init(&argc, &argv, NULL);
 *   sp_exec_buf *x; sp_exec_buf_register(&x, host, n, sizeof(float));
 *   for (each step) {
 *       sp_exec_begin_step();
 *       if (rank > 0) sp_exec_recv(x, rank - 1, msg);          // before its reader
 *       sp_exec_submit(&(sp_exec_task){ .name = "F0", .fn = fwd, .nbufs = 1,
 *                      .bufs = &x, .modes = &rw, .seq = 0 });
 *       if (rank + 1 < size) sp_exec_send(x, rank + 1, msg);
 *       st = sp_exec_end_step();                               // same status on all ranks
 *   }
 *   sp_exec_buf_unregister(x); sp_exec_shutdown();
 *
 * Ordering: within a step, the tasks of a rank are handed to its workers strictly in
 * increasing `seq` (0, 1, 2, ... without gaps), whatever order they were submitted or
 * became ready in. Data dependencies follow submission order (StarPU's sequential
 * consistency), so submit a recv before the tasks that read its buffer, and a send
 * after the task that produces it. Functions are called from the main thread only. */
#ifndef STARPIPE_EXEC_H
#define STARPIPE_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "starpipe/backend.h" /* sp_device */
#include "starpipe/stages.h"  /* sp_access_mode */
#include "starpipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sp_exec_opts {
    int ncpus;          /* CPU workers per rank; <= 0: 1 (an actor runs its tasks in order) */
    int trace;          /* 1: record every task that runs, read with sp_exec_trace */
    double watchdog_s;  /* > 0: sp_exec_end_step gives up (SP_ERR_TIMEOUT) when tasks are
                           pending and none has finished for this long (a hung task, a lost
                           message, a dead peer); every collective outside tasks (a step's
                           end and agreement, the small collectives below, the shutdown's
                           barrier) gives up when it has not ended a second after that
                           (a dead or stuck peer). Either way the executor is unusable */
    int verbose;        /* 1: each rank prints its core set and progress-thread setup */
} sp_exec_opts;

/* Starts MPI (MPI_THREAD_MULTIPLE if available, SERIALIZED at least), StarPU with the
 * "starpipe" ordered policy, and StarPU-MPI. Gives each rank on a host its own cores.
 * Refuses (SP_ERR_ARG) when STARPU_SCHED names another policy. opts may be NULL. */
sp_status sp_exec_init(int *argc, char ***argv, const sp_exec_opts *opts);
/* Waits for everything, stops StarPU-MPI, StarPU and MPI. Collective. */
sp_status sp_exec_shutdown(void);
int sp_exec_rank(void);
int sp_exec_size(void);
/* The rank's device (include/starpipe/device.h: STARPIPE_DEVICE, else the first kind
 * this build registers), NULL on a rank that runs on CPUs only; and how many of StarPU's
 * workers are its. */
const struct sp_device_kind *sp_exec_device(void);
int sp_exec_num_devices(void);
/* CUDA workers of this rank (0 without a GPU, with STARPU_NCUDA=0, or a CPU-only StarPU). */
int sp_exec_num_cuda(void);
/* Before sp_exec_init (before MPI): whether rank local_rank of local_size on this host
 * will run a CUDA worker, by the choice sp_exec_init makes (the devices the CUDA runtime
 * sees, STARPIPE_GPU, a user's STARPU_NCUDA=0). 0 on a build without CUDA. So that a
 * check of the host's memory before MPI counts only what a GPU rank keeps on the host. */
int sp_exec_expect_cuda(int local_rank, int local_size);

/* The memory of this rank's GPU (runtime/devmem.c), for a check before the first step. */
typedef struct {
    int device;         /* the CUDA device of the rank's CUDA worker; -1: no GPU (nothing
                           else is filled) */
    size_t free;        /* bytes StarPU can still place there, counting those it holds:
                           cudaMemGetInfo's free, at most StarPU's cap */
    size_t total;       /* the device's size */
    size_t cuda_free;   /* cudaMemGetInfo's free (other processes' use taken out) */
    size_t starpu_cap;  /* StarPU's cap of the node (90% of total unless STARPU_LIMIT_CUDA_MEM
                           says otherwise); 0: none */
    uint64_t host;      /* the host as NCCL tells hosts apart (a hash of its host string:
                           hostname and boot id, or NCCL_HOSTID) */
    int64_t bus;        /* the GPU's PCI bus id as a number: ranks with the same host and
                           bus share the GPU (as NCCL decides it, comm/nccl_peers.c) */
} sp_exec_devmem;
/* After sp_exec_init; local (not collective). */
sp_status sp_exec_device_memory(sp_exec_devmem *out);

/* Prints "starpipe: rank R: message" on stderr and makes every rank exit with a non-zero
 * code promptly (MPI_Abort). For the application, never called by the library: for an
 * error one rank cannot recover from (bad input seen by one rank only, an executor that
 * is no longer usable), where the other ranks would otherwise wait for it forever. */
#ifdef __cplusplus
[[noreturn]]
#else
_Noreturn
#endif
void sp_exec_abort(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- buffers: a vector of count elements of elemsize bytes ---- */
typedef struct sp_exec_buf sp_exec_buf;

/* ptr: host memory that stays owned by the caller and valid until unregister; NULL lets
 * StarPU allocate it on first use (a receive buffer, a scratch). */
sp_status sp_exec_buf_register(sp_exec_buf **out, void *ptr, size_t count, size_t elemsize);
/* Zeroed host memory for buffers: page-locked when StarPU drives a GPU, so that copies
 * between host and device are asynchronous DMA rather than staged through a bounce
 * buffer; otherwise, from 4 MB on, starting on a 2 MB boundary on transparent huge pages.
 * Free with sp_exec_host_free and the same size. Call after sp_exec_init. */
void *sp_exec_host_alloc(size_t bytes);
void sp_exec_host_free(void *ptr, size_t bytes);

/* A zeroed buffer where the rank's tasks run: in its GPU's memory when it has a CUDA
 * worker (allocated by StarPU there, with no host copy: the host reaches it through
 * sp_exec_buf_read and _write, or StarPU makes one for a host transfer), else in host
 * memory. The executor owns the memory; unregister frees it. */
sp_status sp_exec_buf_create(sp_exec_buf **out, size_t count, size_t elemsize);
/* 1 when b lives in device memory (sp_exec_buf_create on a GPU rank). */
int sp_exec_buf_on_device(const sp_exec_buf *b);
/* Copies bytes [off, off + len) of b to dst, or from src into b, once the tasks and
 * transfers submitted before have ended, straight between the buffer's own memory and
 * the caller's (no whole host copy of a device buffer; pieces of 64 MiB). */
sp_status sp_exec_buf_read(sp_exec_buf *b, size_t off, size_t len, void *dst);
sp_status sp_exec_buf_write(sp_exec_buf *b, size_t off, size_t len, const void *src);

/* Waits for the tasks and transfers using the buffer, brings the data back into ptr
 * (frees what sp_exec_buf_create allocated). */
sp_status sp_exec_buf_unregister(sp_exec_buf *b);
size_t sp_exec_buf_count(const sp_exec_buf *b);


/* Host access between steps (or to inputs before the tasks that read them): waits for
 * the pending tasks and transfers on b, gives a valid host pointer until release. */
sp_status sp_exec_buf_acquire(sp_exec_buf *b, sp_access_mode mode, void **ptr);
sp_status sp_exec_buf_release(sp_exec_buf *b);

/* ---- steps ---- */

/* Starts a step: sequence numbers restart at 0, message tags move to a fresh range, the
 * trace clock restarts. The previous step must have ended. */
sp_status sp_exec_begin_step(void);
/* Waits for all tasks and transfers of the step on every rank (collective), then agrees
 * on the outcome: SP_OK on all ranks, or on all ranks the error of the lowest failing
 * rank with its message. A failed task does not stop the step: later tasks on its rank
 * skip their function, transfers still complete, so no peer waits forever.
 * With opts.watchdog_s, a rank whose tasks stop finishing returns SP_ERR_TIMEOUT at once,
 * without agreement (its peers may be waiting for it), and the executor is unusable. */
sp_status sp_exec_end_step(void);

/* Gives up the current step after a local error the peers cannot know of (a submission
 * that failed half-way): its tasks and messages cannot be recalled. Afterwards, as after a
 * watchdog timeout, sp_exec_usable() is 0 and every call fails at once instead of waiting
 * (unregister, acquire, shutdown included): the process must end, and sp_exec_abort ends
 * its peers with it. The library never ends the process itself. */
void sp_exec_cancel_step(void);
int sp_exec_usable(void);

/* ---- transfers (comm/: the transports behind one table) ----
 * A rank's messages go through its host transport, chosen by STARPIPE_TRANSPORT:
 * StarPU-MPI's detached transfers (starpu-mpi, the default) or plain MPI requests driven
 * by the rank's own workers (direct); the same bits either way. Between GPU ranks, large
 * messages can go instead through the group transport (NCCL), in groups that each run as
 * a task of the rank's order.
 *
 * msg: the plan's message number, unique within a step for this (src, dst) pair or
 * globally; both sides pass the same number (at most MPI_TAG_UB with direct). Sends and
 * receives are detached: they start when the buffer's earlier tasks are done and hold
 * the buffer until complete, so a later writer cannot overwrite data in flight. Both ends
 * register the same count and element size: a mismatch fails the step on every rank. */
sp_status sp_exec_send(sp_exec_buf *b, int dst, uint32_t msg);
sp_status sp_exec_recv(sp_exec_buf *b, int src, uint32_t msg);

/* What this rank's host transport did since init: its name ("starpu-mpi", "direct"),
 * sends and receives posted and their bytes; with direct, those cut into eager pieces
 * (large, within a node) and the sends posted by the task that wrote their data as it
 * returned, rather than when StarPU ended it. And what groups carried. */
typedef struct {
    const char *transport;
    unsigned long long sends, recvs, pieced, by_producer, bytes_sent, bytes_received;
    unsigned long long group_sends, group_recvs; /* messages in groups (NCCL) */
} sp_exec_transfers;
sp_exec_transfers sp_exec_transfer_counts(void);
/* Per-link counters: the bytes of the messages this rank posted to `rank` since init, and
 * a rank's hostname ("?" before start-up), so that what crosses hosts is measured against
 * the plan. */
unsigned long long sp_exec_bytes_sent_to(int rank);
const char *sp_exec_hostname(int rank);
/* Host memory held for messages in flight (copies of sends), at its peak. */
size_t sp_exec_staging_bytes(void);

/* ---- groups (the group transport: NCCL between GPU ranks, comm/nccl.c) ----
 * Large GPU-to-GPU messages go through NCCL instead of MPI (which stages them through host
 * memory), on a stream of their own beside the compute stream; an asynchronous NCCL error
 * fails sp_exec_end_step on that rank at once and leaves the executor unusable. */

/* Collective, after init. Starts the group transport when every rank has one CUDA worker
 * on its own GPU and NCCL starts; else leaves it off and writes the reason into notice
 * (one line, the same on every rank). */
sp_status sp_exec_groups_init(char *notice, size_t len);
int sp_exec_groups_active(void);
/* Messages of this many bytes or more between GPU ranks go in groups
 * (STARPIPE_NCCL_THRESHOLD, 65536 by default). */
size_t sp_exec_group_threshold(void);
/* Collective among the peers listed (ranks this rank exchanges grouped messages with; the
 * lists must be symmetric): connects now rather than inside the first transfer. */
sp_status sp_exec_groups_connect(const int *peers, int n);
/* One message of a group: buf to (is_send) or from world rank peer. */
typedef struct {
    sp_exec_buf *buf;
    int is_send, peer;
} sp_exec_xfer;
/* The n messages as one task at position seq of this rank's order (as sp_exec_submit:
 * every rank submits its groups in one global order, so NCCL's ordered channels pair
 * them); a buffer may be sent to several peers in one group. */
sp_status sp_exec_group(const sp_exec_xfer *x, int n, const char *name, uint32_t seq);

/* ---- tasks ---- */

/* A task's work: an sp_task_fn (starpipe/backend.h), written once for every device; the
 * executor hands it the worker's device (the CPU's, or a CUDA worker's stream and cuBLAS
 * handle). A non-zero return fails the step (the message names the task and the code). */

/* Where a task may run (sp_exec_task.where): */
#define SP_EXEC_ON_CPU 1u
#define SP_EXEC_ON_DEVICE 2u /* the workers of the rank's device (sp_exec_device) */
#define SP_EXEC_ON_CUDA SP_EXEC_ON_DEVICE

typedef struct sp_exec_task {
    const char *name;           /* copied (first 31 bytes); in traces and errors */
    sp_task_fn fn;
    unsigned where;             /* SP_EXEC_ON_CPU | SP_EXEC_ON_DEVICE: the workers that may
                                   run it; 0: any */
    int nbufs;                  /* any number; the same buffer may appear once */
    sp_exec_buf *const *bufs;
    const sp_access_mode *modes;
    const void *args;           /* copied (args_size bytes) */
    size_t args_size;
    uint32_t seq;               /* position in this rank's order within the step */
    const char *codelet;        /* the task's class, one StarPU codelet each ("F", "BW",
                                   "AdamW"; NULL: "starpipe"); at most 16 classes */
    struct sp_exec_tensor_group *group; /* tensor parallelism: the group whose all-reduces its
                                   program meets (sp_exec_tensor_group_create); NULL: none */
    uint32_t footprint;         /* > 0: keys the task's timings within its class in
                                   StarPU's history performance model (the trainer
                                   hashes the stage and its program's sizes: its buffers
                                   may be larger); 0: the buffers' sizes */
} sp_exec_task;

sp_status sp_exec_submit(const sp_exec_task *t);

/* ---- tensor parallelism: a group of ranks that meets inside tasks ----
 * Collective over all ranks: the ranks passing the same color form a group of `size`,
 * ordered by key. Its all-reduces (program.h, sp_tp_group) run inside the tasks given it
 * (sp_exec_task.group): point to point on a communicator of the group's own, tagged by
 * the task's seq and the all-reduce's place in the task, so that tasks running at once
 * on several workers never cross, and summed in the group's order; on GPU ranks over an
 * NCCL communicator of the group's own, through a room on the device made now for
 * all-reduces of up to max_floats floats (larger ones take several rounds), so that no
 * member allocates between two exchanges. sp_exec_tensor_group_host: the same group for
 * the main thread between steps (the gradient norm's terms). */
typedef struct sp_exec_tensor_group sp_exec_tensor_group;
sp_status sp_exec_tensor_group_create(int color, int key, int size, int64_t max_floats,
                                      sp_exec_tensor_group **out);
void sp_exec_tensor_group_free(sp_exec_tensor_group *g);
/* The bytes a GPU member of a group of `size` keeps on its device per worker for
 * all-reduces of up to max_floats (what a memory plan counts beside the buffers). */
size_t sp_exec_tensor_group_room_bytes(int size, int64_t max_floats);
struct sp_tp_group *sp_exec_tensor_group_host(sp_exec_tensor_group *g);

/* ---- small collectives, between steps (after end_step, before begin_step) ----
 * For what the plan does not move: the gradient norm of clipping, the loss for rank 0,
 * the parameters for a checkpoint. All ranks call them in the same order. With
 * opts.watchdog_s, each returns SP_ERR_TIMEOUT (a line on stderr names it) when it has not
 * ended after watchdog_s + 1 s, a peer being dead or stuck; the executor is then unusable,
 * and the caller ends the process (sp_exec_abort). */

/* Element-wise sum over ranks, in place: count floats (is_double 0) or doubles. Ranks
 * that contribute zeros leave the others' values exact (x + 0 = x). */
sp_status sp_exec_allreduce_sum(void *buf, size_t count, int is_double);
/* Copies bytes from root's buf to every rank's buf. */
sp_status sp_exec_bcast(void *buf, size_t bytes, int root);
/* Root receives every rank's `bytes` bytes, in rank order, into recv (size x bytes). */
sp_status sp_exec_gather(const void *send, size_t bytes, void *recv, int root);

/* ---- what ran ---- */
typedef struct sp_exec_record {
    char name[32];
    uint32_t seq;               /* tasks: seq; transfers: the message number */
    int worker;                 /* StarPU worker id; -1 for transfers */
    int transfer;               /* 0 a task; 1 a send, 2 a receive (posted -> completed) */
    int peer;                   /* transfers: the other rank */
    double start_us, end_us;    /* since sp_exec_begin_step */
} sp_exec_record;

/* When the current (or last) step began on this rank, in microseconds of a clock all
 * ranks share (its origin is a barrier in sp_exec_init; ranks of one host read the same
 * monotonic clock). Add it to a record's times to compare them across ranks. */
double sp_exec_step_origin_us(void);

/* Records of the tasks that ran in the current (or last ended) step, and of its
 * transfers (from posting to completion), in the order they started; valid until the
 * next sp_exec_begin_step. Empty unless opts.trace was set. */
sp_status sp_exec_trace(const sp_exec_record **records, size_t *n);

#ifdef __cplusplus
}
#endif
#endif
