/* The pipeline planner: schedules as data, their validation, and the per-actor plan the
 * runtime executes, plus a simulator that runs a plan on a cost model. Pure C: no StarPU,
 * no MPI. Works on real stage models (sp_program_describe) and synthetic ones
 * (sp_stage_model_chain) alike.
 *
 *   sp_stage_model *model = sp_stage_model_chain(8, 1.0, 1.0, 1.0, 4096);
 *   sp_schedule *sch;
 *   if (sp_schedule_builtin("interleaved-1f1b", 4, 16, 2, &sch)) die(sp_last_error());
 *   sp_plan *plan;
 *   if (sp_plan_build(model, sch, &plan)) die(sp_last_error());   // invalid -> message
 *   for (int i = 0; i < plan->ninstr[actor]; i++) execute(&plan->instr[actor][i]);
 *   sp_plan_free(plan); sp_schedule_free(sch); sp_stage_model_free(model);
 *
 * Words (shared/DESIGN.md): p actors, S stages, m microbatches, v chunks (stages) per
 * actor. Task (kind, mb, stage) with kind F, B, W or BW (B and W fused). The text format,
 * the validity rule and the deadlock-freedom argument are written in docs/planner.md. */
#ifndef STARPIPE_PLAN_H
#define STARPIPE_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "starpipe/stages.h"
#include "starpipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ schedules */

typedef struct {
    int kind;  /* sp_task_kind */
    int mb;    /* microbatch, 0..m-1 */
    int stage; /* 0..S-1 */
} sp_task;

/* For every actor an ordered task list, plus the stage -> actor placement. Plain data:
 * build one with sp_schedule_create + sp_schedule_append, a built-in, or a text file. */
typedef struct {
    char name[64];
    int nactors, nstages, nmicro;
    int *stage_actor; /* [nstages] */
    int *ntasks;      /* [nactors] */
    sp_task **tasks;  /* [nactors][ntasks[a]] */
    int *cap;         /* [nactors] allocated length of tasks[a] (internal) */
    /* 1: an evaluation schedule of F tasks only (sp_schedule_forward). Validity then asks
     * for every F once and nothing else; its plan has no backward, gradient, combine or
     * optimizer instruction, so a forward-only pass never touches gradient buffers. */
    int forward_only;
} sp_schedule;

/* The largest actor, stage or microbatch count a schedule takes (SP_MAX_INDEX of the
 * planner); the apps' flags and variables stop there too. */
#define SP_SCHEDULE_MAX_COUNT ((1 << 20) - 2)

/* Empty schedule; stage s placed on actor s % nactors until sp_schedule_place says
 * otherwise. NULL (and a message) on bad sizes or no memory. */
sp_schedule *sp_schedule_create(int nactors, int nstages, int nmicro);
void sp_schedule_free(sp_schedule *s);
sp_schedule *sp_schedule_clone(const sp_schedule *s);
sp_status sp_schedule_place(sp_schedule *s, int stage, int actor);
/* Appends (kind, mb, stage) to actor's list. Only range checks here: whether the whole
 * is a valid schedule is sp_schedule_validate's job. */
sp_status sp_schedule_append(sp_schedule *s, int actor, sp_task_kind kind, int mb, int stage);
int sp_schedule_total_tasks(const sp_schedule *s);

/* Built-in schedules. nchunks (v) matters to interleaved-1f1b (stage s on actor s % p,
 * S = v p) and must be 2 for the V-shaped zb-v and dualpipe-v (stages s and S-1-s on one
 * actor, S = 2p); the others have S = p and take v = 1 (or 0). */
typedef struct {
    const char *name;
    const char *summary;    /* one line */
    const char *constraint; /* e.g. "m >= 2p"; checked with a clear error */
} sp_schedule_info;

int sp_schedule_builtin_count(void);
const sp_schedule_info *sp_schedule_builtin_info(int i);
sp_status sp_schedule_builtin(const char *name, int nactors, int nmicro, int nchunks,
                              sp_schedule **out);
/* The forward-only schedule that evaluates nmicro microbatches on the placement of
 * `like` (a training schedule): each actor runs F of its stages in ascending stage
 * order, all microbatches of one stage in order before the next (GPipe's forward), which
 * is a topological order for any placement. */
sp_status sp_schedule_forward(const sp_schedule *like, int nmicro, sp_schedule **out);
/* Stages a built-in needs for (p, v); -1 (and a message) if the name is unknown. */
int sp_schedule_builtin_stages(const char *name, int nactors, int nchunks);
/* One line per built-in, plus file:PATH; what STARPIPE_SCHEDULE=help prints. */
const char *sp_schedule_help(void);

/* The schedule `auto` (docs/planner.md, section 1): synthesized for the model's stage
 * costs (a chain of p stages, stage s on actor s), the message time latency + bytes /
 * bandwidth, and a cap on each actor's live activation units (sp_mem_peak.act_units: one
 * stage's saved activations of one microbatch). A greedy event-by-event pass (Zero
 * Bubble's heuristic, Qi et al. 2024) is run with a few in-flight limits and W policies;
 * the candidate with the shortest simulated step is kept. Valid by construction and
 * checked: its plan never holds more than the cap. A cap below 1 is SP_ERR_ARG. */
typedef struct {
    double latency;      /* per message, as sp_sim_config */
    double bandwidth;    /* bytes per time unit; 0: infinite */
    int mem_cap;         /* activation units per actor; 0: 1F1B's peak, min(p, m) */
    const int *mem_caps; /* [p] one cap per actor; overrides mem_cap when given */
} sp_auto_config;
sp_status sp_schedule_auto(const sp_stage_model *model, int nactors, int nmicro,
                           const sp_auto_config *cfg, sp_schedule **out);
/* The default cap: 1F1B's largest peak, min(p, m) units (stage 0's). */
int sp_schedule_auto_default_cap(int nactors, int nmicro);

/* Rewrites each fused BW(i, s) whose stage receives its input from the stage before it
 * on another actor as B(i, s) W(i, s): the input gradient is then sent when B ends, and
 * the weight gradients are computed while it travels and the actor before works on it.
 * The same order on every actor, the same bits (W accumulates as BW did); the tail of
 * 1F1B and GPipe then waits on B alone (docs/planner.md, "Split backwards"). The
 * schedule's name gains "+split". */
sp_status sp_schedule_split_backward(sp_schedule *s);

/* The schedule used when neither a name nor STARPIPE_SCHEDULE gives one: 1F1B with its
 * sending backwards split, the same bits and planned memory as "1f1b" and a shorter
 * cool-down (bench/README.md, "Split backwards"). "1f1b" is the published fused form. */
#define SP_SCHEDULE_DEFAULT "1f1b+split"

/* The schedule the user asked for. Explicit arguments win (a flag overrides the
 * environment): name (NULL: STARPIPE_SCHEDULE, default SP_SCHEDULE_DEFAULT; "file:PATH"
 * reads a text file; a built-in or file name ending in "+split" is then rewritten by
 * sp_schedule_split_backward), nmicro (<= 0: STARPIPE_MICROBATCHES, default 2p), nchunks
 * (<= 0: STARPIPE_CHUNKS, default 2 for interleaved and V-shaped, else 1). Errors name
 * the offending value: an unknown name lists the valid ones, "help" returns SP_ERR_ARG
 * with the list as its message. */
sp_status sp_schedule_from_env(const char *name, int nactors, int nmicro, int nchunks,
                               sp_schedule **out);

/* ---- replicas: R copies of a P-actor pipeline on R x P ranks ----
 * Which world rank runs actor a of replica r. Pipeline-major (the default): the ranks of
 * one pipeline are consecutive, rank = r * P + a, so on nodes of 4 or 8 GPUs a pipeline
 * of up to that many actors stays inside a node and only the gradient all-reduce crosses
 * nodes. Replica-major: rank = a * R + r, the replicas of a stage are consecutive (the
 * all-reduce stays inside a node, the pipeline's messages cross). */
typedef enum { SP_RANK_ORDER_PIPELINE = 0, SP_RANK_ORDER_REPLICA = 1 } sp_rank_order;
/* Tensor parallelism (tensor = T > 1): each actor is a group of T consecutive ranks, the
 * group innermost (so that it sits inside a node, where its all-reduces stay on NVLink):
 * rank = (the rank above of (replica, actor)) x T + t, for tensor rank t. */
typedef struct {
    int replicas, actors;
    sp_rank_order order;
    int tensor; /* ranks per actor; 0 or 1: one */
} sp_layout;
/* The rank of tensor rank t of (replica, actor), and the converse. */
int sp_layout_rank_t(const sp_layout *l, int replica, int actor, int t);
void sp_layout_place_t(const sp_layout *l, int rank, int *replica, int *actor, int *t);
/* The same for tensor rank 0 (the first rank of the actor's group); place ignores t. */
int sp_layout_rank(const sp_layout *l, int replica, int actor);
void sp_layout_place(const sp_layout *l, int rank, int *replica, int *actor);
int sp_layout_tensor(const sp_layout *l); /* T, >= 1 */
const char *sp_rank_order_name(sp_rank_order o);
/* The layout of nranks ranks: replicas (<= 0: STARPIPE_REPLICAS, default 1), tensor
 * (<= 0: STARPIPE_TENSOR, default 1), actors (<= 0: nranks / (replicas x tensor)), order
 * (NULL: STARPIPE_RANK_ORDER, "pipeline" or "replica"). A rank count that replicas x
 * actors x tensor does not match is SP_ERR_ARG with one message. */
sp_status sp_layout_from_env(int nranks, int replicas, int actors, int tensor, const char *order,
                             sp_layout *out);

/* A random valid schedule for `model`: stages dealt to actors in a random order (every
 * actor gets one when S >= p), each backward fused (BW) or split (B, W) at random, and
 * every actor's list cut from one random topological order of the task graph. The same
 * seed gives the same schedule on every rank. For stress tests. */
sp_status sp_schedule_random(const sp_stage_model *model, int nactors, int nmicro,
                             uint64_t seed, sp_schedule **out);

/* Text format (docs/planner.md). Errors are SP_ERR_FORMAT with "file:line: ... 'token'". */
sp_status sp_schedule_parse(const char *text, const char *source, sp_schedule **out);
sp_status sp_schedule_load(const char *path, sp_schedule **out);
sp_status sp_schedule_write(const sp_schedule *s, FILE *f);
sp_status sp_schedule_save(const sp_schedule *s, const char *path);

/* "F(3,1)", "BW(0,7)": the notation of messages and of the text format. */
char *sp_task_format(sp_task t, char *buf, size_t n);

/* Validity (docs/planner.md): every task of the unrolled step exactly once, on the
 * actor of its stage, each (mb, stage) either BW or B and W; dataflow edges plus each
 * actor's order acyclic. SP_OK or SP_ERR_SCHEDULE with a message naming the problem;
 * for a cycle, the chain of "task on actor a waits for task on actor b". */
sp_status sp_schedule_validate(const sp_schedule *s, const sp_stage_model *model);
/* The cycle behind an SP_ERR_SCHEDULE "cycle" failure, as tasks t0..t(n-1) where each
 * waits for the next and t(n-1) waits for t0. Returns its length (copies up to cap), 0
 * when the combined graph is acyclic, -1 when the schedule fails earlier checks. */
int sp_schedule_find_cycle(const sp_schedule *s, const sp_stage_model *model,
                           sp_task *cycle, int cap);

/* ------------------------------------------------------------------ plans */

/* Buffers are named structurally (sp_buf_class, stages.h) so the runtime can map them
 * to data handles. */

typedef struct {
    int cls;   /* sp_buf_class */
    int idx;   /* stage, edge or shared-parameter index, per class */
    int mb;    /* microbatch; -1 for per-step buffers */
    int stage; /* SHARED_GRAD: the contributing stage; else -1 */
} sp_buf;

typedef struct {
    sp_buf buf;
    int mode; /* sp_access_mode; accumulators (GRAD, SHARED_GRAD) are RW */
} sp_access;

typedef enum {
    SP_OP_RUN = 0,      /* run task */
    SP_OP_SEND = 1,     /* send buf to peer; right after the instruction that made buf
                           (only FREEs and messages of lower seq in between) */
    SP_OP_RECV = 2,     /* receive buf from peer; it exists on this actor afterwards */
    SP_OP_FREE = 3,     /* buf is dead on this actor */
    SP_OP_COMBINE = 4,  /* shared parameter k = buf.idx into the owner's accumulator
                           buf = SHARED_GRAD(k, owner): per step (task.mb = -1) adds the
                           other stages' accumulators; per microbatch (task.mb = i) adds
                           every stage's partial of microbatch i. Ascending stage order,
                           as its accesses list them (docs/planner.md, section 6) */
    SP_OP_OPTIMIZER = 5 /* update stage `stage`'s parameters (and shared ones it owns) */
} sp_op;
#define SP_NUM_OPS 6

/* One instruction of an actor's program, executed strictly in order. */
typedef struct {
    int op;         /* sp_op */
    int peer;       /* SEND/RECV: the other actor; else -1 */
    sp_task task;   /* RUN */
    int stage;      /* RUN, OPTIMIZER: the stage; COMBINE: the owner stage; else -1 */
    sp_buf buf;     /* SEND/RECV/FREE: the buffer; COMBINE: the owner's accumulator */
    int64_t seq;    /* SEND/RECV: global message number, unique in a step (an MPI tag);
                       both ends see all their messages in increasing seq; else -1 */
    size_t bytes;   /* SEND/RECV/FREE: size of buf */
    uint32_t acc;   /* RUN/COMBINE/OPTIMIZER: first entry in plan->access */
    uint32_t nacc;  /* number of entries (reads and writes of the instruction) */
} sp_instr;

typedef struct {
    size_t params, grads, opt, acts, boundary; /* each category's own peak */
    size_t total;                              /* peak of the sum */
    size_t transient; /* peak of acts + boundary together: the least memory any pool of the
                         per-microbatch buffers can hold them in (at most acts + boundary) */
    int act_units; /* peak count of live ACT buffers: one stage's activations for one
                      microbatch, the unit of the closed forms */
} sp_mem_peak;

typedef struct {
    int nactors, nstages, nmicro;
    int *stage_actor;  /* [nstages] */
    int *ninstr;       /* [nactors] */
    sp_instr **instr;  /* [nactors][ninstr[a]] */
    sp_access *access; /* shared pool indexed by sp_instr.acc */
    size_t naccess;
    int64_t nmessages; /* point-to-point messages per step: seq runs 0..nmessages-1 */
    int ntasks;        /* RUN instructions in all */
    int nshared;
    int *shared_deferred; /* [nshared]: 1 if combined once per step, 0 per microbatch */
    sp_mem_peak *peak;    /* [nactors], from the instruction order */
} sp_plan;

/* Validates the schedule against the model, then lowers it: RUNs in the schedule's
 * order, SEND right after each producer, RECVs in one global message order, shared-weight
 * combines, OPTIMIZER after each stage's last W, FREE after every transient buffer's last
 * use, and per-actor memory peaks. SP_ERR_SCHEDULE on an invalid schedule.
 * Stage param_bytes are taken to exclude shared parameters; each shared parameter adds
 * its bytes once per actor using it. O(T log T) in the number of tasks T. */
sp_status sp_plan_build(const sp_stage_model *model, const sp_schedule *sched,
                        sp_plan **out);
void sp_plan_free(sp_plan *plan);

/* Well-formedness, independent of how the plan was built: every SEND matched by one
 * RECV (same seq, buffer, bytes, peers); per pair of actors the same message order on
 * both ends; the program runs to completion with blocking rendezvous send AND receive
 * (so no ordered channel can deadlock); every read buffer present on its actor, every
 * FREE of a live buffer, no transient buffer left at the end. SP_ERR_SCHEDULE if not. */
sp_status sp_plan_check(const sp_plan *plan);

const char *sp_op_name(sp_op op);
char *sp_buf_format(sp_buf b, char *buf, size_t n);    /* "EDGE_FWD(e=2,mb=3)" */
char *sp_instr_format(const sp_instr *in, char *buf, size_t n);
/* Writes the plan as readable text, one instruction per line. */
sp_status sp_plan_write(const sp_plan *plan, FILE *f);

/* ------------------------------------------------------------------ NCCL order */

/* One ncclSend/ncclRecv an actor issues: the plan's boundary-tensor messages (EDGE_FWD,
 * EDGE_GRAD) of at least a threshold of bytes, in the plan's order. Calls with the same group number sit between one
 * ncclGroupStart/ncclGroupEnd (consecutive transfers with no task between them, such as
 * 1F1B's send-forward/receive-backward pair). */
typedef struct {
    int op;       /* SP_OP_SEND or SP_OP_RECV */
    int peer;
    size_t bytes;
    int64_t seq;  /* the plan's message number */
    int group;    /* 0, 1, ... per actor */
    int instr;    /* index of the SEND/RECV in the actor's program */
} sp_nccl_call;

/* The calls of `actor`, newly allocated (free with free()). */
sp_status sp_nccl_calls(const sp_plan *plan, int actor, size_t threshold, sp_nccl_call **out,
                        int *n);

/* ------------------------------------------------------------------ simulator */

/* The gradient all-reduce of R replicas of a stage, alpha-beta cost (the runtime's
 * reduce-scatter then all-gather moves the same bytes as a ring):
 *   flat ring over R ranks:  2 alpha + 2 (R-1)/R x bytes / bw, where bw is the
 *     inter-node bandwidth when the R replicas span nodes, else the intra-node one;
 *   hierarchical (g = replicas_per_node ranks of the stage per node, n = R/g nodes):
 *     reduce-scatter in the node, all-reduce of bytes/g across the n nodes, all-gather
 *     in the node: 2 (g-1) alpha + 2 (g-1)/g bytes / bw_intra
 *                  + 2 (n-1) alpha + 2 (n-1)/n (bytes/g) / bw_inter. */
typedef struct {
    int replicas;          /* R; <= 1: no all-reduce */
    double alpha;          /* per message step (seconds, or the cost unit) */
    double bw_intra;       /* bytes per unit of time per rank, inside a node (NVLink) */
    double bw_inter;       /* the same between nodes (the network, per rank) */
    int replicas_per_node; /* how many of a stage's R replicas share a node (1..R) */
    int hierarchical;      /* 0: one flat ring; 1: the three-phase form above */
} sp_allreduce_model;
double sp_allreduce_time(const sp_allreduce_model *m, double bytes);

/* Tensor parallelism: the all-reduces inside a stage task among the T ranks of its actor's
 * group (sp_stage_info.tp_allreduces, .tp_bytes), on the group's link, which the layout
 * keeps inside a node (NVLink): one ring each, alpha-beta, so `count` of them with
 * `bytes` in all take
 *   count x 2 (T-1) alpha + 2 (T-1)/T x bytes / bw,
 * which the simulator adds to the task's time (exposed: the runtime runs them inside the
 * task, between its products). */
typedef struct {
    int tensor;   /* T; <= 1: no group, no time */
    double alpha; /* per message step (seconds, or the cost unit) */
    double bw;    /* bytes per unit of time per rank on the group's link; 0: infinite */
} sp_tensor_link;
double sp_tensor_allreduce_time(const sp_tensor_link *l, int count, double bytes);

typedef struct {
    /* Task time: flops[s * SP_NUM_TASK_KINDS + kind] / device_flops when both are given,
     * else sp_stage_info.cost[kind]. */
    const double *flops;
    double device_flops;
    double latency;     /* per message */
    double bandwidth;   /* bytes per time unit; 0 = infinite */
    double combine_time;   /* per COMBINE instruction */
    double optimizer_time; /* per OPTIMIZER instruction */
    /* [actor][instruction]: when given, each RUN, COMBINE and OPTIMIZER takes its own
     * time from here (a replay of measured durations) instead of the above */
    const double *const *instr_time;
    int rendezvous;     /* 1: a SEND also blocks until its RECV is posted (NCCL-like) */
    /* Replicas: each stage's gradients (param_bytes x grad_bytes_per_param / 4) are
     * all-reduced once the actor's last instruction touching them has run (as the
     * runtime does), on the network beside compute (one collective at a time per actor),
     * and the actor's OPTIMIZER waits for its collectives. NULL: no replicas. */
    const sp_allreduce_model *allreduce;
    double grad_bytes_per_param; /* bytes per gradient element in the all-reduce; 0: 4 */
    /* Tensor parallelism: each RUN's group all-reduces (its stage's tp_allreduces and
     * tp_bytes for its kind; a recomputing stage's first backward task also F's again)
     * on this link, added to its time. NULL: none. Not applied to instr_time replays. */
    const sp_tensor_link *tensor;
    /* 1 with tensor (T > 1): boundary messages go scatter-gathered, as the runtime sends
     * them between hosts: each member puts 1/T of the bytes on the link (bandwidth), then
     * the receiving group all-gathers them on the tensor link, beside the link */
    int scatter_gather;
    int skip_exposed; /* 1: leave sp_sim_result.exposed_comm at 0 (spares a second run) */
} sp_sim_config;
/* A boundary message of `bytes` under cfg: the time it holds its link (bytes / bandwidth,
 * or 1/T of it scatter-gathered), and in *gather the receiving group's all-gather after
 * it ((T - 1) steps of 1/T of the bytes on the tensor link; 0 without). The message
 * arrives latency + both after it starts. */
double sp_sim_msg_time(const sp_sim_config *cfg, double bytes, double *gather);

typedef struct {
    int nactors;
    double step_time;
    double bubble_fraction; /* idle / (p * step_time) */
    double *busy, *idle;    /* [nactors] */
    sp_mem_peak *peak;      /* [nactors], recomputed while running */
    double **start, **end;  /* [nactors][ninstr]: when each instruction ran */
    int64_t nmessages;
    int async_transfers;    /* 1: SEND/RECV times are measured asynchronous transfers (from
                               posting to completion); the trace shows them on a row of
                               their own per actor. 0: simulated blocking waits. */
    /* With cfg->allreduce: each stage's all-reduce [start, end) on its actor (the trace
     * shows them on a row of their own per actor), the sum of their durations, and the
     * time the step waits for them after its last compute ("exposed"). */
    int nstages;
    double *ar_start, *ar_end; /* [stage] */
    double comm_time, exposed_comm;
    /* With cfg->tensor: each actor's time in its group's all-reduces over the step (part
     * of busy), and the largest of them. */
    double *tp_busy; /* [nactors] */
    double tp_time;
} sp_sim_result;

/* Runs the plan with blocking, ordered (FIFO per pair of actors) channels. Fails with
 * SP_ERR_SCHEDULE, naming the stuck actors, on a deadlock or a message out of order. */
sp_status sp_simulate(const sp_plan *plan, const sp_stage_model *model,
                      const sp_sim_config *cfg, sp_sim_result **out);
void sp_sim_result_free(sp_sim_result *r);

/* Chrome trace-event JSON (Perfetto, chrome://tracing): one thread per actor; times are
 * read as seconds. And an SVG timeline like the figures of pipeline papers: a row per
 * actor, a box per task coloured by kind, labelled with its microbatch. */
sp_status sp_sim_write_trace(const sp_plan *plan, const sp_sim_result *r, const char *path);
sp_status sp_sim_write_svg(const sp_plan *plan, const sp_sim_result *r, const char *path);

/* ------------------------------------------------------------------ measured runs */

/* A measured run of a plan next to what the schedule allows with the same tasks. */
typedef struct {
    double span;          /* first measured start to last measured end, all actors */
    double busy;          /* sum of the measured RUN and COMBINE durations */
    double bubble;        /* 1 - busy / (p * span) */
    double replay_span;   /* the plan simulated with each instruction's measured duration
                             and free, instant messages: the schedule's bound for this run */
    double replay_bubble;
    /* Message waits: for each received buffer, its consumer's start minus the later of
     * its producer's end (on the sender) and the consumer actor's previous task end, i.e.
     * how long a task that could have run waited for communication and the runtime. */
    int nwaits;
    double wait_median, wait_p90, wait_max;
    /* The runtime's share of a wait: the consumer's start minus the later of the
     * message's arrival (the RECV's measured end) and the consumer actor's previous task
     * end; only for RECVs that were measured. */
    int ndispatch;
    double dispatch_median, dispatch_p90;
} sp_run_measure;

/* start/end: [actor][instruction] times on a clock all actors share; a negative start
 * marks an instruction that was not measured (it takes no time in the replay). Only RUN
 * and COMBINE instructions count as work. */
sp_status sp_plan_measure(const sp_plan *plan, const sp_stage_model *model,
                          const double *const *start, const double *const *end,
                          sp_run_measure *out);

/* ---- the runtime's buffer pool (pool.c) ----
 * Buffers with known lifetimes [from, to) on one clock (takes and gives of a dry walk of
 * a step), packed into slots: each buffer goes to one slot at least its size (exactly
 * its size when exact: a buffer that travels has the size its peer registered), and the
 * buffers of a slot are never alive at once. The smallest of four packings: first-fit
 * and best-fit decreasing, the same first fit with sizes within 1/8 of each other taken
 * as one (in the order taken, into slots of the largest), and a best-fit linear scan in
 * the order taken that may grow a slot (as few slots as buffers alive at once). Slots
 * already in *slots (from another walk) are reused at their sizes; new ones are appended.
 * slot_of[i]: buffer i's slot. */
typedef struct {
    size_t size;
    int exact;
    int64_t from, to;
} sp_lifetime;
typedef struct {
    size_t size;
    int fixed; /* holds an exact buffer, or came from another walk: keeps its size */
} sp_pool_slot;
sp_status sp_pool_pack(const sp_lifetime *x, int n, sp_pool_slot **slots, int *nslots,
                       int *slot_of);
/* The bytes of that pool for one actor of a plan, from the plan's own lifetimes of its
 * per-microbatch buffers (ACT, BGRAD, EDGE_FWD, EDGE_GRAD: taken at the first instruction
 * touching one, given at its FREE): what the runtime registers, where the plan's peak
 * (sp_mem_peak) is the live-bytes lower bound. */
sp_status sp_plan_pool_bytes(const sp_plan *plan, const sp_stage_model *model, int actor,
                             size_t *bytes);

#ifdef __cplusplus
}
#endif
#endif
