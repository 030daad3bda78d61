/* The trainer's state and the helpers its files share (runtime/train.c: the step;
 * train_instr.c: one plan instruction into tasks; train_eval.c: evaluation; train_trace.c:
 * the step's trace and timeline; train_create.c: creation and destruction; submit.c:
 * tasks, groups and messages into the executor; buffers.c: the per-microbatch pool and
 * the slabs; host.c: host access, checkpoints' fetch and store; replicas.c: the replicas'
 * reductions). Private to runtime/. */
#ifndef STARPIPE_TRAINER_IMPL_H
#define STARPIPE_TRAINER_IMPL_H

#include <stdint.h>

#include "starpipe/exec.h"
#include "starpipe/train.h"

typedef struct {
    int kind, mb, stage; /* kind: a stage program's, -1 a helper, SP_TR_COLLECTIVE */
    int instr; /* index in this rank's plan program; -1 for helper tasks */
} task_id;
#define SP_TR_COLLECTIVE (-2) /* the replicas' reductions and gathers (replicas.c) */
#define SP_TR_HELPER ((task_id){ -1, -1, -1, -1 })

/* What a stage's replicas exchange (runtime/replicas.c), on each rank holding it: the
 * shard bounds, a buffer per other replica's shard (this rank's copy out, the sum or the
 * parameters in), the inputs of the shards this rank leads in its run (each member's
 * copy, the previous run's partial sum), this rank's reduced shard. */
typedef struct {
    int64_t *bounds;      /* [R + 1] (sp_optim_shards) */
    sp_exec_buf **shard;  /* [R], NULL at this rank's own replica */
    sp_exec_buf **in;     /* [R * (R + 1)]: shard c's from replica q at c (R + 1) + q, the
                             partial at c (R + 1) + R; NULL where not led here */
    sp_exec_buf *mine;
    int pending;          /* the reduce of this step is still to be submitted */
} sp_tr_stage_replicas;

/* The pool's plan (buffers.c): each take of a walk, its lifetime and slot. */
typedef struct {
    size_t floats;
    int exact;         /* the size must match (a buffer that travels) */
    int64_t from, to;  /* the dry walk's clock at the take and at the give */
    int slot;
} sp_tr_pool_take;
typedef struct {
    sp_tr_pool_take *take;
    int n, cap;
} sp_tr_pool_walk;

struct sp_trainer {
    const sp_program *p;
    const sp_graph *g;
    sp_plan *plan;
    sp_train_opts o;
    int rank, S, E, m, nin, nshared, steps;
    /* What a step would otherwise ask the program again and again, looked up once at
     * creation (train_create.c); the program is fixed once planned (program.h). The
     * stage model (recompute, tied parameters) is the program's own. */
    const sp_stage_model *model;
    size_t *bytes[SP_BUF_SCRATCH + 1]; /* [class][index]: sp_program_buf_bytes (not LOSS) */
    int nbytes[SP_BUF_SCRATCH + 1];    /* the indexes of each class */
    sp_slab_ref *progbuf; /* each stage program's buffers, (s, kind)'s from progbuf_at[k] */
    int *progbuf_at;      /* [S * SP_NUM_TASK_KINDS + 1], k = s * SP_NUM_TASK_KINDS + kind */
    int *nlocal;          /* [S]: sp_program_local_adds */
    int64_t *shared_off;  /* [nshared * S]: tied parameter k's offset in stage s's slab */
    int64_t *shared_numel; /* [nshared] */
    int nparams;          /* sp_graph_num_params */
    /* evaluation (sp_trainer_eval): the forward-only plan of eval_m microbatches per
     * replica, or NULL; per-microbatch slots exist for mcap = max(m, eval_m) */
    sp_plan *eval_plan;
    int eval_m, mcap, evaluating;
    /* replicas: this rank is actor `actor` of replica `replica` (layout) */
    sp_layout layout;
    int actor, replica, R;
    /* the world ranks of the actors of this replica, and of this rank's actor in each
     * replica, at this tensor rank: [actors], [R] (sp_layout_rank_t, once) */
    int *peer, *replica_peer;
    /* tensor parallelism: this rank is member trank of its actor's group of T */
    int T, trank;
    sp_exec_tensor_group *tgroup; /* NULL when T = 1 */
    /* scatter-gather (sp_tr_scatter_gather): per edge, sp_program_edge_replicated's bits;
     * per actor, 1 when boundary buffers to and from it go as 1/T per member. NULL: off */
    uint8_t *sg_edge, *sg_actor;
    sp_tr_stage_replicas *rep; /* [S], for stages this rank holds; NULL without replicas */
    /* the replicas' runs (replicas.c): run_of[R], run_first[nruns + 1]; counting the
     * bytes of the collectives instead of posting them: replica_count[world size] */
    int *run_of, *run_first, nruns;
    unsigned long long *replica_count;
    int *grads_last;           /* [S]: the last instruction of phase 1 writing GRADS[s] */
    uint32_t *footprint;       /* [S * SP_NUM_TASK_KINDS]: stage programs' perfmodel keys */
    int *unpack;               /* deferred unpacks of the step: (stage, replica) pairs */
    int nunpack;
    size_t persistent_bytes;   /* every slab sp_tr_register_host and _create_slab made */
    sp_exec_buf **h_sumsq;     /* [S]: the norm's per-parameter terms of each owned stage */
    size_t host_bytes;         /* this step's host reads and writes of trainer buffers */
    /* [world size], made at the first step: the exec's per-link counters as the step
     * began, and what the last step sent to each rank (sp_trainer_bytes_sent_to) */
    unsigned long long *link_base, *link_step;
    size_t host_mem;           /* of all the trainer's buffers, the bytes in host memory */
    size_t optimizer_bytes;    /* of which the AdamW moments */
    /* persistent per-stage slabs (owned stages only), where the tasks run; host copies
     * made on request (sp_trainer_slab: [4 * S], parameters, gradients, m, v) */
    float **view;
    sp_exec_buf **h_params, **h_grads, **h_m, **h_v, **h_scratch;
    /* per-microbatch buffers, created on first use: [mb * count + index], mb < mcap */
    sp_exec_buf **h_act, **h_bgrad, **h_efwd, **h_egrad, **h_input, **h_loss;
    void **input_host;
    /* tied parameters: graph tensor of shared k; transfer buffers per (k, stage) */
    sp_tensor *shared_param;
    sp_exec_buf **h_sgrad, **h_sparam;
    /* this step */
    uint32_t seq;
    task_id *seq_task;
    size_t seq_cap;
    sp_train_event *events;
    int nevents, cap_events;
    struct { int kind, step, stage; } fault; /* STARPIPE_FAULT: fail@STEP:STAGE, hang@... */
    int *msg_instr; /* [nmessages]: this rank's SEND/RECV instruction of each message */
    /* NCCL: per instruction of this rank, -1 (not NCCL), or the index in ncalls of its
     * call; a group is submitted at its first call */
    int *nccl_of;
    sp_nccl_call *ncalls;
    int nncalls;
    char notice[256];
    struct sp_tr_alloc { void *p; size_t bytes; } *host; /* memory behind every buffer */
    size_t nhost, caphost;
    struct { /* per-microbatch buffers (buffers.c) */
        sp_tr_pool_walk walk[2]; /* the takes of a training step [0] and an evaluation [1] */
        sp_pool_slot *slot;  /* sizes in floats (sched/pool.c) */
        sp_exec_buf **buf;   /* [nslots], registered on first use */
        int nslots, running, next, dry;
        int64_t clock;
        size_t bytes; /* of the slots registered so far */
    } pool;
    /* the last step's instruction times of every actor, seconds on the ranks' common
     * clock, -1 where nothing was measured: [actor][instr] rows of one allocation */
    double **tstart, **tend, *tbuf;
    int tmax; /* longest actor program */
    struct sp_tr_profile *prof; /* opts.profile: what the steps measured (train_profile.c) */
};

static inline int owns(const sp_trainer *t, int stage)
{
    return t->plan->stage_actor[stage] == t->actor;
}

/* sp_program_buf_bytes(t->p, c, index), from the trainer's table. */
static inline size_t sp_tr_bytes(const sp_trainer *t, sp_buf_class c, int index)
{
    if (c == SP_BUF_LOSS) return 4;
    return (int)c >= 0 && c <= SP_BUF_SCRATCH && index >= 0 && index < t->nbytes[c]
               ? t->bytes[c][index] : 0;
}

/* sp_program_num_bufs and sp_program_buf of stage s's program `kind`, from the table. */
static inline int sp_tr_num_bufs(const sp_trainer *t, int s, sp_task_kind kind)
{
    int k = s * SP_NUM_TASK_KINDS + (int)kind;
    return t->progbuf_at[k + 1] - t->progbuf_at[k];
}
static inline sp_slab_ref sp_tr_prog_buf(const sp_trainer *t, int s, sp_task_kind kind, int j)
{
    return t->progbuf[t->progbuf_at[s * SP_NUM_TASK_KINDS + (int)kind] + j];
}

/* The world rank of actor a in this rank's replica (plans name actors). */
static inline int peer_rank(const sp_trainer *t, int actor)
{
    return t->peer[actor];
}

/* Instructions of the update phase (phase 2 of a step): OPTIMIZER, and the tied
 * parameters' sends and receives that follow it. */
static inline int sp_tr_is_update_phase(const sp_instr *in)
{
    return in->op == SP_OP_OPTIMIZER ||
           ((in->op == SP_OP_SEND || in->op == SP_OP_RECV) && in->buf.cls == SP_BUF_SHARED_PARAM);
}

/* ---- train_instr.c: one instruction of the plan into tasks ---- */
/* RUN of task (instruction instr): the stage program, with its recomputed forward and
 * the stage's local adds after its last weight gradient. */
sp_status sp_tr_do_run(sp_trainer *t, const sp_task *task, int instr);
/* SEND or RECV, with a tied parameter's or gradient's packing and unpacking. */
sp_status sp_tr_do_transfer(sp_trainer *t, const sp_instr *in);
/* COMBINE of tied parameter k's gradients into its owner stage's. */
sp_status sp_tr_do_combine(sp_trainer *t, int k, int instr);
/* The NCCL group of the plan whose call is `call` (t->ncalls), at its first call. */
sp_status sp_tr_do_nccl(sp_trainer *t, int call);
/* OPTIMIZER of stage s with the clipping scale, then its shards' gather (ZeRO-1) and its
 * tied parameters' local copies. */
sp_status sp_tr_do_optimizer(sp_trainer *t, int s, float scale);

/* ---- train.c, train_eval.c: the walks (also walked dry to plan the pool) ---- */
sp_status sp_tr_walk_pipeline(sp_trainer *t);
sp_status sp_tr_walk_eval(sp_trainer *t);

/* ---- train_trace.c: the step's trace (opts.trace) ---- */
/* This rank's executed tasks and messages as events, named by plan instruction. */
sp_status sp_tr_record_events(sp_trainer *t);
/* Every actor's instruction times (t->tstart, t->tend), gathered on every rank. */
sp_status sp_tr_gather_times(sp_trainer *t);

/* ---- train_profile.c: what the steps measured (opts.profile), for sp_trainer_profile */
typedef struct sp_tr_profile sp_tr_profile;
sp_status sp_tr_profile_init(sp_trainer *t);
void sp_tr_profile_free(sp_trainer *t);
/* Where the CPU run of a stage program adds its op times; NULL: not profiled. */
struct sp_op_clock *sp_tr_profile_clock(sp_trainer *t, int stage, int kind);
/* After the pipelined phase's gather, and after the update phase. */
sp_status sp_tr_profile_step(sp_trainer *t);
void sp_tr_profile_update(sp_trainer *t);

/* ---- submit.c: the walks' way to the executor ---- */
/* Submits a task as the next of this rank's order (id: what the trace calls it), on the
 * rank's device: every task on its GPU when it has one (the data stays there), else on
 * its CPU. */
sp_status sp_tr_submit(sp_trainer *t, const char *name, sp_task_fn fn, int nbufs,
                       sp_exec_buf *const *bufs, const sp_access_mode *modes, const void *args,
                       size_t args_size, task_id id);
/* dst[dst_off..+n) = src[src_off..+n) as a task. */
sp_status sp_tr_submit_copy(sp_trainer *t, sp_exec_buf *dst, int64_t dst_off, sp_exec_buf *src,
                            int64_t src_off, int64_t n, const char *name, task_id id);

/* The n transfers as one group task (the group transport, NCCL), the next of this rank's
 * order: every rank must submit its groups in one global order. */
sp_status sp_tr_submit_group(sp_trainer *t, const char *name, const sp_exec_xfer *x, int n,
                             task_id id);
/* A send or receive of the plan or the replicas (none in a dry walk). */
sp_status sp_tr_send(sp_trainer *t, sp_exec_buf *x, int peer, uint32_t msg);
sp_status sp_tr_recv(sp_trainer *t, sp_exec_buf *x, int peer, uint32_t msg);

/* ---- replicas.c: the gradient all-reduce over replicas and the sharded optimizer ----
 * Messages use numbers past the plan's (nmessages + (3 s + phase) R + shard), so they
 * never share a tag with the pipeline's. */
sp_status sp_tr_replicas_create(sp_trainer *t);
void sp_tr_replicas_free(sp_trainer *t);
/* Phase 1, after the last instruction writing GRADS[s]: this replica's shards go to their
 * reducers, the others' shards of this rank's own are received. */
sp_status sp_tr_reduce_begin(sp_trainer *t, int s);
/* Later in phase 1 (one task on, so the messages have time to arrive): the sum of this
 * rank's shard in replica order, and (without shard_optimizer) its copies to the others,
 * whose unpacks wait for sp_tr_reduce_end at the end of phase 1. */
sp_status sp_tr_reduce_pending(sp_trainer *t);
sp_status sp_tr_reduce_end(sp_trainer *t);
/* Phase 2, after the optimizer of stage s updated this rank's shard: the shards of the
 * parameters gathered from every replica (shard_optimizer only). */
sp_status sp_tr_gather_params(sp_trainer *t, int s);

/* ---- buffers.c ---- */
/* Scatter-gather (train_create.c decides where): the chunk of boundary buffer b that this member sends to, or receives
 * from, actor `peer` (floats [*lo, *lo + return)), or -1 when the buffer goes whole. */
int64_t sp_tr_scatter_gather(const sp_trainer *t, const sp_buf *b, int peer, int64_t *lo);

/* The executor buffer of slab (class, index) for microbatch mb: persistent slabs, and
 * per-microbatch buffers taken from the pool on first use in a step. NULL on failure. */
sp_exec_buf *sp_tr_slab_buf(sp_trainer *t, sp_buf_class c, int idx, int mb);
/* The slot of a per-microbatch buffer (ACT, BGRAD, EDGE_FWD, EDGE_GRAD). */
sp_exec_buf **sp_tr_mb_slot(sp_trainer *t, sp_buf_class c, int idx, int mb);
/* A pool buffer of floats for *slot, to give back with sp_tr_pool_give once submitted
 * (a recomputed forward's boundary outputs). */
sp_exec_buf *sp_tr_pool_scratch(sp_trainer *t, sp_exec_buf **slot, size_t floats);
/* Gives a per-microbatch buffer back to the pool (the plan's FREE). */
void sp_tr_pool_give(sp_trainer *t, sp_exec_buf **slot);
/* Before a walk of the plan (0: a training step's phase 1, 1: an evaluation): its takes
 * start again from the first. */
void sp_tr_pool_begin(sp_trainer *t, int walk);
/* Plans the pool: runs walk(t, w) dry (t->pool.dry: no task, message or buffer is made;
 * takes hand out tokens) for w < nwalks, then packs the takes into slots. */
sp_status sp_tr_pool_plan(sp_trainer *t, sp_status (*walk)(sp_trainer *, int), int nwalks);
void sp_tr_pool_free(sp_trainer *t);
void sp_tr_free_buf(sp_trainer *t, const sp_buf *b);
/* The buffer a SEND or RECV of the plan moves (boundary tensors, tied parameters). */
sp_exec_buf *sp_tr_transfer_buf(sp_trainer *t, const sp_buf *b);
/* A registered buffer of count elements of elemsize bytes on zeroed host memory
 * (sp_exec_host_alloc: pinned on a GPU rank), which the trainer frees at the end. */
sp_status sp_tr_register_mem(sp_trainer *t, sp_exec_buf **h, void **host, size_t count,
                             size_t elemsize);
/* A persistent float slab of bytes (at least one float), counted in t->persistent_bytes:
 * on zeroed host memory the host writes (_register_host: the inputs), or where the
 * tasks run (_create_slab: device memory on a GPU rank, sp_exec_buf_create). */
sp_status sp_tr_register_host(sp_trainer *t, sp_exec_buf **h, float **host, size_t bytes);
sp_status sp_tr_create_slab(sp_trainer *t, sp_exec_buf **h, size_t bytes);
/* Tied parameter k: its offset in stage's slab, its size, its owner stage. */
int64_t sp_tr_shared_off(const sp_trainer *t, int k, int stage);
int64_t sp_tr_shared_numel(const sp_trainer *t, int k);
int sp_tr_shared_owner(const sp_trainer *t, int k);

#endif
