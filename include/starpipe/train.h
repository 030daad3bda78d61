/* The pipelined trainer: a graph's stage programs, a schedule and an optimizer, run by
 * StarPU on MPI ranks (one rank = one actor). Every rank creates the trainer with the
 * same arguments and calls sp_trainer_step with the same batch; each runs only its own
 * part of the plan. A step's loss, gradients and updated parameters are bitwise those of
 * the reference interpreter (reference.h), whatever the schedule.
 *
 *   sp_exec_init(&argc, &argv, NULL);
 *   sp_schedule *sch;  sp_schedule_from_env(NULL, sp_exec_size(), 0, 0, &sch);
 *   graph = model with sch->nstages stages;  prog = sp_program_build(graph, &st);
 *   sp_trainer *t = sp_trainer_create(prog, sch, &opts, &st);
 *   for (step...) sp_trainer_step(t, inputs, &stats);
 *   sp_trainer_free(t);  sp_exec_shutdown();
 */
#ifndef STARPIPE_TRAIN_H
#define STARPIPE_TRAIN_H

#include <stdint.h>

#include "starpipe/optim.h"
#include "starpipe/plan.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    sp_adamw_config opt;
    uint64_t seed;      /* parameter initialisation */
    int trace;          /* record what ran (sp_trainer_trace) */
    /* Data parallelism: R replicas of the schedule's P actors on R x P ranks (0 or 1:
     * one pipeline), placed by rank_order (plan.h, sp_layout). Each replica trains on its
     * own slice of the step's R x m microbatches; each stage's gradients are then summed
     * over the replicas in replica order, so a step equals the reference interpreter's
     * with the same replicas (sp_reference_set_replicas) bit for bit. */
    int replicas;
    sp_rank_order rank_order;
    /* Tensor parallelism (graph.h): each actor is a group of T ranks (0 or 1: one), the
     * group innermost in the layout (plan.h); p must be this rank's member's program
     * (built with sp_graph_set_tensor(g, T, its tensor rank)). Its all-reduces run inside
     * the stage tasks over MPI, in the group's sum order: a run is bitwise the reference
     * of T (sp_tp_local). CPU ranks only for now. */
    int tensor;
    /* ZeRO-1: each of the R ranks of a stage keeps the AdamW moments of one shard of its
     * parameters (sp_optim_shards), updates that shard and sends it to the others.
     * Bitwise the same parameters as without it. */
    int shard_optimizer;
    /* Evaluation (sp_trainer_eval): K microbatches over all replicas, a multiple of the
     * replicas; 0: none. Its forward-only plan is built and checked here, with the
     * training plan. */
    int eval_microbatches;
    /* Keep what the steps after the first measured, for sp_trainer_profile: every
     * instruction's time of every actor, each stage program's per-op times (CPU ranks),
     * the AdamW updates. Needs trace. */
    int profile;
} sp_train_opts;

typedef struct {
    float loss;         /* mean over the microbatches, as the reference computes it */
    double step_s;      /* wall time of the step, all phases */
    double grad_norm;   /* global gradient norm before clipping */
    /* The pipelined phase, from the executed tasks of every rank (only when opts.trace;
     * else 0): its span (first task start to last task end) and bubble, 1 - busy /
     * (actors x span); the same for the plan replayed with this step's own task durations
     * and instant messages (sp_plan_measure), i.e. what the schedule allows with these
     * tasks; and how long tasks that could have run waited for a message (median, p90). */
    double bubble, span_s;
    double plan_bubble, plan_span_s;
    double wait_median_s, wait_p90_s;
    double dispatch_median_s; /* the runtime's share: from the message's arrival */
    int skipped;        /* the update was skipped: non-finite loss or gradient, and
                           opts.opt.skip_nonfinite */
    size_t host_bytes;  /* bytes of the trainer's buffers the host wrote or read this step:
                           the inputs, the losses and the norm's per-parameter terms; on a GPU
                           all that crosses PCIe besides the plan's own messages (gradients
                           are zeroed, normed and applied where they live) */
} sp_step_stats;

typedef struct sp_trainer sp_trainer;

/* Collective. The schedule must have as many stages as the program, and its actors times
 * opts.replicas must be the number of ranks. The plan is built and checked here: an invalid schedule fails on
 * every rank with the planner's message before anything runs. */
sp_trainer *sp_trainer_create(const sp_program *p, const sp_schedule *sched,
                              const sp_train_opts *opts, sp_status *status);
void sp_trainer_free(sp_trainer *t);
const sp_plan *sp_trainer_plan(const sp_trainer *t);

/* One step. inputs[i * ninputs + k]: microbatch i of graph input k, for the R x m
 * microbatches of the step (every rank passes the whole batch; replica r reads
 * microbatches r * m .. r * m + m - 1, and each rank what its stages use). Collective; the same status and
 * stats on every rank. A non-finite loss or gradient fails with SP_ERR_NUMERIC naming
 * the step and the first stage affected, or skips the update (opts.opt.skip_nonfinite).
 * A failed task fails the step on every rank (SP_ERR_RUNTIME, naming rank and task); the
 * trainer stays usable. Some failures lose the step on one rank only (the watchdog's
 * SP_ERR_TIMEOUT, a submission error): then sp_exec_usable() is 0, and the caller should
 * end every rank (sp_exec_abort). Nothing here ends the process. */
sp_status sp_trainer_step(sp_trainer *t, const void *const *inputs, sp_step_stats *stats);

/* Evaluation: the mean loss of the opts.eval_microbatches (K) microbatches of inputs
 * (inputs[i * ninputs + k], i < K, the whole batch on every rank, as for a step), forward
 * only: the plan of sp_schedule_forward on the schedule's placement runs F of every
 * stage, each boundary tensor sent as in a step, and no backward: no gradient buffer is
 * touched, parameters and optimizer state stay as they are. With R replicas, replica r
 * evaluates microbatches r K/R .. (r+1) K/R - 1 and the K losses are averaged in
 * microbatch order, so the result is bitwise sp_reference_eval's on the same K
 * microbatches, whatever R (within a tolerance on a GPU). Collective; the same status and
 * loss on every rank; failures as for sp_trainer_step. */
sp_status sp_trainer_eval(sp_trainer *t, const void *const *inputs, float *loss);

/* Host copies of this rank's stage slabs, for checks and checkpoints: PARAMS, GRADS
 * (gradients of the last step, the owner's combined, summed over replicas), and the AdamW
 * moments m, v. NULL when the stage is not on this rank. Valid until the next step. With
 * shard_optimizer, the gradients are summed only in this rank's shard [lo, hi)
 * (sp_trainer_shard), and the moments hold only that shard (hi - lo floats). */
const float *sp_trainer_slab(sp_trainer *t, sp_buf_class cls, int stage);
const float *sp_trainer_moment(sp_trainer *t, int which, int stage);
int sp_trainer_owns_stage(const sp_trainer *t, int stage);
/* This rank's shard of a stage it holds: [*lo, *hi) of its PARAMS slab (all of it
 * without replicas). */
void sp_trainer_shard(const sp_trainer *t, int stage, int64_t *lo, int64_t *hi);
/* This rank's replica and actor, and the layout of the ranks. */
sp_layout sp_trainer_layout(const sp_trainer *t);
int sp_trainer_replica(const sp_trainer *t);
/* The bytes of the messages the last step (both phases) sent to `rank`: the per-link
 * counters STARPIPE_VERBOSE sets beside the plan's; 0 before the first step. */
unsigned long long sp_trainer_bytes_sent_to(const sp_trainer *t, int rank);
/* Adds to to[r] (one entry per rank) the bytes the replicas' collectives of a step send
 * to rank r (their messages walked, not posted): flat or hierarchical
 * (STARPIPE_ALLREDUCE), with or without ZeRO-1; nothing without replicas. Between steps. */
sp_status sp_trainer_replica_bytes(sp_trainer *t, unsigned long long *to);
/* The bytes a SEND of this rank's plan puts on the wire: the plan's, or under
 * scatter-gather (T > 1, boundary tensors between hosts: STARPIPE_SCATTER_GATHER) this
 * member's 1/T of them; and how many actors this rank exchanges chunks with. */
size_t sp_trainer_send_bytes(const sp_trainer *t, const sp_instr *in);
int sp_trainer_scatter_gather_peers(const sp_trainer *t);
int sp_trainer_steps_done(const sp_trainer *t);

/* This rank's stages against a reference interpreter that ran the same steps: the count
 * of floats of the parameters, combined gradients and AdamW moments that differ. tol 0
 * asks for identical bits (what every CPU run gives); else a float differs when
 * |a - b| > tol (1 + |b|) (a GPU's kernels sum in other orders). where (may be NULL) gets
 * the first difference, "gradients of stage 1 (3 of 4096 floats)". Not collective. */
double sp_trainer_compare(sp_trainer *t, sp_reference *r, double tol, char *where, size_t len);

/* Gathers parameter `param`'s value (or its combined gradient of the last step, or an
 * AdamW moment) onto every rank. Collective. what: 0 value, 1 gradient, 2 m, 3 v.
 * Whole tensors (sp_param_whole_numel floats): with tensor parallelism a split
 * parameter's parts are gathered from its group, and store keeps this rank's part. */
sp_status sp_trainer_fetch(sp_trainer *t, sp_tensor param, int what, float *dst);
/* Sets parameter values, moments and the step count on every rank (checkpoint load).
 * Collective; call between steps. */
sp_status sp_trainer_store(sp_trainer *t, sp_tensor param, int what, const float *src);
void sp_trainer_set_steps_done(sp_trainer *t, int steps);
/* The learning rate of the next steps (opts.opt.lr until set): a schedule (optim.h,
 * sp_lr_at) sets it before each step. Call it with the same value on every rank. */
void sp_trainer_set_lr(sp_trainer *t, float lr);

/* Memory of this rank: bytes of per-microbatch buffers (activations, boundary tensors,
 * their gradients) at their high-water mark, which the pool keeps to what the plan's
 * liveness allows, and bytes of the persistent buffers the trainer allocated (parameters,
 * gradients, AdamW moments, of its shard when sharded; inputs; the replicas' send and
 * receive buffers; made on first use: each stage's task scratch, a tied parameter's
 * transfer buffers). */
typedef struct {
    size_t transient, persistent;
    size_t optimizer; /* of persistent: the AdamW moments (1/R of them when sharded) */
    size_t staging;   /* outside the plan: copies of sends still in flight (with the
                         default transport), at their high-water mark */
    size_t host;      /* of transient + persistent, what is in host memory: all of it on
                         a CPU rank; on a GPU rank only what the host reads or writes
                         (inputs, losses, the norm's terms), the rest is device memory */
} sp_train_memory;
sp_train_memory sp_trainer_memory(const sp_trainer *t);

/* What a run measured, for a cost model of the machine (docs/planner.md, calibration):
 * over the steps after the first (which pays first touches and lazy loading) and over
 * microbatches, means of what a step adds up (tasks, messages, gaps: a step's time
 * follows their mean), medians of the rest. Seconds. Task and message times come from
 * every actor (replica 0, tensor rank 0 speaking for its actor); op times from the rank
 * that ran them. */
typedef struct {
    int steps;          /* steps measured */
    int nstages;
    int64_t nmessages;  /* the plan's */
    double *task_s;     /* [S * SP_NUM_TASK_KINDS]: a task of (stage, kind), its mean; 0:
                           none ran */
    int64_t *op_at;     /* [S * SP_NUM_TASK_KINDS + 1]: program k = s * 4 + kind's first op */
    double *op_s;       /* [op_at[last]]: each instruction's time (sp_program_op): its
                           mean's share of the task's mean; 0 on a GPU, whose kernels
                           return at launch */
    double *opt_s;      /* [S]: the stage's AdamW update (0 where none ran) */
    double *msg_s;      /* [nmessages]: from the end of the task that made the data to the
                           start of the one that reads it, where the receiver was idle
                           by then (what a message adds to a path); -1: never idle */
    double gap_s;       /* between two tasks of an actor with no message between them */
    double send_gap_s;  /* the same where the first task's output was sent (its SENDs
                           between them): what posting a send costs the actor; 0: none */
    double *ar_s;       /* [S]: the replicas' all-reduce of the stage's gradients, first
                           task to last message (0 without replicas) */
} sp_train_profile;
/* Collective (every rank, between steps); needs opts.profile and two steps. */
sp_status sp_trainer_profile(sp_trainer *t, sp_train_profile *out);
void sp_train_profile_free(sp_train_profile *p);

/* How transfers between GPU actors travel (NCCL, or why not), one line. Large boundary
 * tensors use NCCL when every rank has its own GPU; STARPIPE_NCCL_THRESHOLD (bytes,
 * default 65536) sets "large". */
const char *sp_trainer_notice(const sp_trainer *t);

/* What ran in the last step on this rank (empty unless opts.trace): tasks named
 * "F mb3 s2", with start/end times in microseconds since the step began. */
typedef struct {
    char name[32];
    int kind, mb, stage;  /* kind -1 for helper tasks (copies, combine, optimizer), -2 for
                             the replicas' collectives (their stage set) */
    int instr;            /* index in this rank's plan program; -1 for helper tasks */
    int transfer;         /* 0 a task; 1 a send, 2 a receive (from posting to completion) */
    double start_us, end_us;
} sp_train_event;
sp_status sp_trainer_trace(sp_trainer *t, const sp_train_event **events, int *n);

/* Writes, on rank 0, a Chrome trace-event JSON (Perfetto) and an SVG timeline (a row per
 * actor, a box per task) of what really ran in the last step on every rank (opts.trace;
 * the step gathered the times). Either path may be NULL. Call it on every rank. */
sp_status sp_trainer_write_timeline(sp_trainer *t, const char *json_path, const char *svg_path);

#ifdef __cplusplus
}
#endif
#endif
