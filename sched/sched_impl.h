/* Internals shared by the planner's files: the dense task index of an unrolled step, its
 * dependency rules (the one place they are written), and a small hash set of buffers. */
#ifndef STARPIPE_SCHED_IMPL_H
#define STARPIPE_SCHED_IMPL_H

#include <stdint.h>
#include <stdlib.h>

#include "starpipe/plan.h"

/* Task slot of (kind, mb, stage): four slots per (mb, stage), one per kind. Dense so that
 * every per-task table is a plain array. */
static inline int sp_slot(int kind, int mb, int stage, int nstages)
{
    return ((mb * nstages + stage) << 2) | kind;
}
static inline sp_task sp_slot_task(int slot, int nstages)
{
    int ms = slot >> 2;
    return (sp_task){ .kind = slot & 3, .mb = ms / nstages, .stage = ms % nstages };
}

/* Why one task waits for another; words for cycle messages. */
typedef enum {
    SP_DEP_ORDER = 0,  /* earlier on the same actor */
    SP_DEP_FWD,        /* forward input over a stage edge */
    SP_DEP_SAVED,      /* F before B/BW of the same (mb, stage): saved tensors */
    SP_DEP_GRAD,       /* output gradient from the consumer stage's backward */
    SP_DEP_BW,         /* B before W */
    SP_DEP_ACCUM       /* gradient accumulation order: W(mb-1) before W(mb) */
} sp_dep_reason;

/* The unrolled step of one (model, schedule): who holds which task, where, and the
 * stage edges as adjacency lists. Built by sp_graph_index, which also checks "every
 * task exactly once, on its stage's actor" and fails with a message otherwise. */
typedef struct {
    int p, S, m, E;
    const sp_stage_model *model;
    const sp_schedule *sched;
    int nslots;          /* 4 m S */
    int *pos;            /* [nslots] position in its actor's list, -1 if absent */
    unsigned char *bk;   /* [m S] backward form of (mb, stage): SP_TASK_B or SP_TASK_BW */
    int *in_off, *in_e;  /* CSR of incoming edges per stage */
    int *out_off, *out_e;
    int maxdeg;          /* bound on preds or succs of one task (dataflow only) */
    int ntasks;
    int fwd;             /* a forward-only schedule: F tasks only, no backward edges */
} sp_tgraph;

sp_status sp_tgraph_build(sp_tgraph *g, const sp_stage_model *model, const sp_schedule *s);
void sp_tgraph_release(sp_tgraph *g);

/* Dataflow predecessors / successors of a present slot (actor order not included).
 * Writes up to g->maxdeg slots to out (and reasons to why, if not NULL); returns count. */
int sp_tgraph_preds(const sp_tgraph *g, int slot, int *out, unsigned char *why);
int sp_tgraph_succs(const sp_tgraph *g, int slot, int *out);

/* Kahn's algorithm over dataflow + actor order. Returns SP_OK, or SP_ERR_SCHEDULE with a
 * message naming one concrete cycle (copied to cycle[] when given). */
sp_status sp_tgraph_acyclic(const sp_tgraph *g, sp_task *cycle, int cap, int *cycle_len);

/* Packs a buffer name into one integer: class+1 4 bits, idx 20, mb+1 20, stage+1 20. */
static inline uint64_t sp_buf_key(sp_buf b)
{
    return ((uint64_t)(b.cls + 1) << 60) | ((uint64_t)(unsigned)b.idx << 40)
         | ((uint64_t)(unsigned)(b.mb + 1) << 20) | (uint64_t)(unsigned)(b.stage + 1);
}
_Static_assert(SP_NUM_BUF_CLASSES < 15, "sp_buf_key keeps the class in 4 bits");
#define SP_MAX_INDEX ((1 << 20) - 2)

/* Open-addressing set of buffer keys (with one value each), for live-buffer tracking. */
typedef struct {
    uint64_t *key; /* 0 = empty slot (no real key is 0: class+1 is set) */
    int64_t *val;
    size_t cap, n;
} sp_bufset;

int sp_bufset_init(sp_bufset *h, size_t expect);
void sp_bufset_release(sp_bufset *h);
int64_t *sp_bufset_find(const sp_bufset *h, uint64_t key);
int sp_bufset_put(sp_bufset *h, uint64_t key, int64_t val); /* 0 ok, -1 no memory */
int sp_bufset_del(sp_bufset *h, uint64_t key);              /* 1 if it was there */

/* Persistent buffers live across steps and are never freed in a plan. */
static inline int sp_buf_persistent(sp_buf b)
{
    switch (b.cls) {
    case SP_BUF_PARAMS: case SP_BUF_GRADS: case SP_BUF_OPT: case SP_BUF_SHARED_PARAM:
    case SP_BUF_LOSS:
        return 1;
    case SP_BUF_SHARED_GRAD:
        return b.mb < 0;
    default:
        return 0;
    }
}

/* Memory category of a buffer: 0 params, 1 grads, 2 opt, 3 acts, 4 boundary. */
static inline int sp_buf_category(sp_buf b)
{
    switch (b.cls) {
    case SP_BUF_PARAMS: case SP_BUF_SHARED_PARAM: return 0;
    case SP_BUF_GRADS: case SP_BUF_SHARED_GRAD: return 1;
    case SP_BUF_OPT: return 2;
    case SP_BUF_ACT: case SP_BUF_BGRAD: return 3;
    default: return 4;
    }
}
size_t sp_buf_bytes(const sp_stage_model *model, sp_buf b);

/* An instruction's buffers, as the pool and the caches see them: a SEND, RECV or FREE
 * its one buffer, a RUN, COMBINE or OPTIMIZER its accesses. */
static inline int sp_instr_naccess(const sp_instr *in)
{
    return in->op == SP_OP_SEND || in->op == SP_OP_RECV || in->op == SP_OP_FREE ? 1
                                                                                : (int)in->nacc;
}
static inline sp_buf sp_instr_buf(const sp_plan *plan, const sp_instr *in, int q)
{
    return in->op == SP_OP_SEND || in->op == SP_OP_RECV || in->op == SP_OP_FREE
               ? in->buf : plan->access[in->acc + q].buf;
}

/* The actor's pool (sp_plan_pool_bytes) slot by slot, and at[k]: the slot of the k-th
 * access of its instructions in order (sp_instr_buf), -1 outside the pool. */
sp_status sp_plan_pool_map(const sp_plan *plan, const sp_stage_model *model, int actor,
                           sp_pool_slot **slots, int *nslots, int **at);
void sp_mem_add(sp_mem_peak *peak, size_t cur[5], int *act_count, sp_buf b, size_t bytes,
                int sign);

/* Built-in `name`, or "NAME+split" of a built-in (sp_schedule_split_backward), for these
 * sizes, without the environment or files: the planner's own picks (auto's seeds, the
 * layout search). */
sp_status sp_schedule_builtin_split(const char *name, int p, int m, int v, sp_schedule **out);

/* SP_ERR_SCHEDULE "<headline> actor A waits at <instr>; ..." for every actor whose
 * program counter pc[a] stopped short of its end (plan_check.c, sim.c). */
sp_status sp_plan_stuck_error(const sp_plan *plan, const int *pc, const char *headline);

#endif
