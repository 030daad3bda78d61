/* The pipelined trainer: walks this rank's part of the plan and turns each instruction
 * into executor calls (include/starpipe/exec.h). A step has two phases:
 *   1. the pipeline: every RUN, SEND, RECV and COMBINE of the plan, in plan order;
 *   2. the update: the global gradient norm (one allreduce), then OPTIMIZER and the
 *      tied parameters' copies, in plan order.
 * Clipping needs the norm over all stages before any update, hence the split; the same
 * float operations as the reference interpreter run in the same order. */
#include "starpipe/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codelets/stage.h"
#include "comm/comm.h"
#include "starpipe/env.h"
#include "starpipe/exec.h"

typedef struct {
    int kind, mb, stage;
    int instr; /* index in this rank's plan program; -1 for helper tasks */
} task_id;

struct sp_trainer {
    const sp_program *p;
    const sp_graph *g;
    sp_plan *plan;
    sp_train_opts o;
    int rank, S, E, m, nin, nshared, steps;
    /* persistent per-stage slabs (owned stages only) */
    float **params, **grads, **mom_m, **mom_v;
    sp_exec_buf **h_params, **h_grads, **h_m, **h_v, **h_scratch;
    /* per-microbatch buffers, created on first use: [mb * count + index] */
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
    void **host; /* memory behind the lazily registered buffers */
    size_t nhost, caphost;
    sp_exec_buf **pool_free; /* per-microbatch buffers not in use */
    size_t nfree, capfree, npooled, pool_bytes;
    /* the last step's instruction times of every actor, seconds on the ranks' common
     * clock, -1 where nothing was measured: [actor][instr] rows of one allocation */
    double **tstart, **tend, *tbuf;
    int tmax; /* longest actor program */
};

static int owns(const sp_trainer *t, int stage) { return t->plan->stage_actor[stage] == t->rank; }
int sp_trainer_owns_stage(const sp_trainer *t, int stage)
{
    return t && stage >= 0 && stage < t->S && owns(t, stage);
}
int sp_trainer_steps_done(const sp_trainer *t) { return t ? t->steps : 0; }
void sp_trainer_set_steps_done(sp_trainer *t, int steps) { t->steps = steps; }
const sp_plan *sp_trainer_plan(const sp_trainer *t) { return t ? t->plan : NULL; }

static size_t floats_of(const sp_trainer *t, sp_slab_class c, int idx)
{
    size_t b = sp_program_buf_bytes(t->p, c, idx) / 4;
    return b ? b : 1; /* StarPU wants non-empty buffers */
}

/* A per-microbatch buffer, registered on first use. It gets zeroed host memory rather
 * than StarPU's lazy allocation: StarPU refuses to read a never-written buffer, and a
 * program may accumulate (read) into a buffer whose first writer it is. */
static sp_exec_buf *lazy(sp_trainer *t, sp_exec_buf **slot, size_t floats)
{
    if (*slot) return *slot;
    if (t->nhost == t->caphost) {
        size_t cap = t->caphost ? 2 * t->caphost : 64;
        void **h = realloc(t->host, cap * sizeof *h);
        if (!h) return NULL;
        t->host = h;
        t->caphost = cap;
    }
    float *mem = calloc(floats, sizeof(float));
    if (!mem) return NULL;
    if (sp_exec_buf_register(slot, mem, floats, sizeof(float)) != SP_OK) {
        free(mem);
        return NULL;
    }
    t->host[t->nhost++] = mem;
    return *slot;
}

/* Per-microbatch buffers (activations, boundary tensors and their gradients) come from
 * a pool: a slot takes a buffer of its size when first used in a step and gives it back
 * at the plan's FREE, so memory follows the planner's liveness. Reusing a buffer is safe
 * without any wait here: StarPU orders the new writer after the old readers and sends. */
static sp_exec_buf *pool_take(sp_trainer *t, sp_exec_buf **slot, size_t floats, int exact)
{
    if (*slot) return *slot;
    /* Buffers that travel must have the size the peer registered; those that stay on the
     * rank (activations and their gradients) may take the smallest larger free one. */
    size_t best = t->nfree;
    for (size_t i = 0; i < t->nfree; i++) {
        size_t c = sp_exec_buf_count(t->pool_free[i]);
        if (c == floats || (!exact && c > floats &&
                            (best == t->nfree || c < sp_exec_buf_count(t->pool_free[best]))))
            best = i;
        if (c == floats) break;
    }
    if (best < t->nfree) {
        *slot = t->pool_free[best];
        t->pool_free[best] = t->pool_free[--t->nfree];
        return *slot;
    }
    if (t->nfree == t->capfree || t->npooled == t->capfree) {
        size_t cap = t->capfree ? 2 * t->capfree : 64;
        sp_exec_buf **f = realloc(t->pool_free, cap * sizeof *f);
        if (!f) return NULL;
        t->pool_free = f;
        t->capfree = cap;
    }
    sp_exec_buf *b = NULL;
    if (!lazy(t, &b, floats)) return NULL;
    t->npooled++;
    t->pool_bytes += floats * sizeof(float);
    return *slot = b;
}

static void pool_give(sp_trainer *t, sp_exec_buf **slot)
{
    if (!*slot) return;
    t->pool_free[t->nfree++] = *slot; /* capacity >= npooled >= nfree + 1 */
    *slot = NULL;
}

static sp_exec_buf **mb_slot(sp_trainer *t, sp_slab_class c, int idx, int mb)
{
    switch (c) {
    case SP_SLAB_ACT: return &t->h_act[mb * t->S + idx];
    case SP_SLAB_BGRAD: return &t->h_bgrad[mb * t->S + idx];
    case SP_SLAB_EDGE_FWD: return &t->h_efwd[mb * t->E + idx];
    case SP_SLAB_EDGE_GRAD: return &t->h_egrad[mb * t->E + idx];
    default: return NULL;
    }
}

static sp_exec_buf *slab_buf(sp_trainer *t, sp_slab_class c, int idx, int mb)
{
    switch (c) {
    case SP_SLAB_PARAMS: return t->h_params[idx];
    case SP_SLAB_GRADS: return t->h_grads[idx];
    case SP_SLAB_SCRATCH:
        return lazy(t, &t->h_scratch[idx], floats_of(t, c, idx));
    case SP_SLAB_ACT:
    case SP_SLAB_BGRAD: return pool_take(t, mb_slot(t, c, idx, mb), floats_of(t, c, idx), 0);
    case SP_SLAB_EDGE_FWD:
    case SP_SLAB_EDGE_GRAD: return pool_take(t, mb_slot(t, c, idx, mb), floats_of(t, c, idx), 1);
    case SP_SLAB_INPUT: return t->h_input[mb * t->nin + idx];
    case SP_SLAB_LOSS: return lazy(t, &t->h_loss[mb], 1);
    default: return NULL;
    }
}

/* The plan's FREE: the buffer goes back to the pool. */
static void do_free(sp_trainer *t, const sp_buf *b)
{
    sp_exec_buf **slot = NULL;
    switch (b->cls) {
    case SP_BUF_ACT: slot = mb_slot(t, SP_SLAB_ACT, b->idx, b->mb); break;
    case SP_BUF_BGRAD: slot = mb_slot(t, SP_SLAB_BGRAD, b->idx, b->mb); break;
    case SP_BUF_EDGE_FWD: slot = mb_slot(t, SP_SLAB_EDGE_FWD, b->idx, b->mb); break;
    case SP_BUF_EDGE_GRAD: slot = mb_slot(t, SP_SLAB_EDGE_GRAD, b->idx, b->mb); break;
    default: return; /* persistent buffers and tied-weight transfers stay */
    }
    pool_give(t, slot);
}

static sp_exec_mode exec_mode(sp_slab_class c, sp_slab_mode m)
{
    if (c == SP_SLAB_SCRATCH) return SP_EXEC_SCRATCH;
    return m == SP_SLAB_R ? SP_EXEC_R : m == SP_SLAB_W ? SP_EXEC_W : SP_EXEC_RW;
}

/* Index of the tied parameter behind the plan's shared k, and its slab offsets. */
static int64_t shared_off(const sp_trainer *t, int k, int stage)
{
    return sp_program_param_offset(t->p, stage, t->shared_param[k]);
}
static int64_t shared_numel(const sp_trainer *t, int k)
{
    return sp_tensor_numel(t->g, t->shared_param[k]);
}
static int shared_owner(const sp_trainer *t, int k)
{
    return sp_program_stage_model(t->p)->shared[k].stages[0];
}

/* A task function for each place a task can run: on a rank with CUDA workers every task
 * runs there (one device, data stays on it); else on the CPU. */
typedef struct {
    sp_exec_cpu_fn cpu;
    sp_exec_cuda_fn cuda;
} task_fn;

#ifdef STARPIPE_HAVE_CUDA
#define TASK_FN(name) ((task_fn){ name##_cpu, name##_cuda })
#else
#define TASK_FN(name) ((task_fn){ name##_cpu, NULL })
#endif

static sp_status submit(sp_trainer *t, const char *name, task_fn fn, int nbufs,
                        sp_exec_buf *const *bufs, const sp_exec_mode *modes, const void *args,
                        size_t args_size, task_id id)
{
    /* the StarPU codelet of the task: a stage program's kind, else the helper's name */
    const char *cls = id.kind >= 0 ? sp_task_kind_name((sp_task_kind)id.kind)
                    : !strncmp(name, "AdamW", 5) ? "AdamW"
                    : !strncmp(name, "nccl", 4) ? "nccl" : name;
    if (t->seq == t->seq_cap) {
        size_t cap = t->seq_cap ? 2 * t->seq_cap : 256;
        task_id *n = realloc(t->seq_task, cap * sizeof *n);
        if (!n) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        t->seq_task = n;
        t->seq_cap = cap;
    }
    t->seq_task[t->seq] = id;
    int gpu = fn.cuda && sp_exec_num_cuda() > 0;
    sp_exec_task task = { .name = name, .cpu = gpu ? NULL : fn.cpu, .cuda = gpu ? fn.cuda : NULL,
                          .nbufs = nbufs, .bufs = bufs,
                          .modes = modes, .args = args, .args_size = args_size,
                          .codelet = cls,
                          .footprint = id.stage >= 0 ? (uint32_t)id.stage + 1 : 0,
                          .seq = t->seq++ };
    return sp_exec_submit(&task);
}

static sp_status submit_copy(sp_trainer *t, sp_exec_buf *dst, int64_t dst_off,
                             sp_exec_buf *src, int64_t src_off, int64_t n, const char *name)
{
    sp_exec_buf *bufs[2] = { dst, src };
    sp_exec_mode modes[2] = { dst_off == 0 && (size_t)n == sp_exec_buf_count(dst) ? SP_EXEC_W
                                                                                 : SP_EXEC_RW,
                              SP_EXEC_R };
    sp_copy_task_args a = { .dst_off = dst_off, .src_off = src_off, .n = n };
    return submit(t, name, TASK_FN(sp_copy_task), 2, bufs, modes, &a, sizeof a,
                  (task_id){ -1, -1, -1, -1 });
}

static sp_status do_run(sp_trainer *t, const sp_task *task, int instr)
{
    int s = task->stage, mb = task->mb;
    sp_task_kind kind = (sp_task_kind)task->kind;
    int nb = sp_program_num_bufs(t->p, s, kind);
    sp_exec_buf *stack_bufs[32];
    sp_exec_mode stack_modes[32];
    sp_exec_buf **bufs = nb <= 32 ? stack_bufs : malloc((size_t)nb * sizeof *bufs);
    sp_exec_mode *modes = nb <= 32 ? stack_modes : malloc((size_t)nb * sizeof *modes);
    sp_status st = SP_OK;
    if (!bufs || !modes) st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int j = 0; st == SP_OK && j < nb; j++) {
        sp_slab_ref r = sp_program_buf(t->p, s, kind, j);
        bufs[j] = slab_buf(t, r.cls, r.index, mb);
        modes[j] = exec_mode(r.cls, r.mode);
        if (!bufs[j]) st = sp_set_error(SP_ERR_RUNTIME, "trainer: no buffer %s[%d] for %s mb%d "
                                        "s%d: %s", sp_slab_class_name(r.cls), r.index,
                                        sp_task_kind_name(kind), mb, s, sp_last_error());
    }
    if (st == SP_OK) {
        char name[32];
        snprintf(name, sizeof name, "%s mb%d s%d", sp_task_kind_name(kind), mb, s);
        sp_stage_task_args a = { .prog = t->p, .stage = s, .kind = kind,
                                 .dloss = 1.0f / (float)t->m };
        if (t->fault.kind && t->fault.step == t->steps + 1 && t->fault.stage == s &&
            kind == SP_TASK_F && mb == 0)
            a.fault = t->fault.kind;
        st = submit(t, name, TASK_FN(sp_stage_task), nb, bufs, modes, &a, sizeof a,
                    (task_id){ kind, mb, s, instr });
        /* BW's activation gradients live and die inside the task (the plan does not
         * track them): the buffer can serve the next user at once */
        if (kind == SP_TASK_BW) pool_give(t, mb_slot(t, SP_SLAB_BGRAD, s, mb));
        /* after the stage's last weight gradient: repeated uses of a parameter in the
         * stage are added into its first accumulator (program.h) */
        if (st == SP_OK && (kind == SP_TASK_W || kind == SP_TASK_BW) && mb == t->m - 1 &&
            sp_program_local_adds(t->p, s, NULL) > 0) {
            sp_exec_buf *g = t->h_grads[s];
            sp_exec_mode rw = SP_EXEC_RW;
            sp_local_add_task_args la = { .prog = t->p, .stage = s };
            st = submit(t, "local add", TASK_FN(sp_local_add_task), 1, &g, &rw, &la, sizeof la,
                        (task_id){ -1, -1, s, -1 });
        }
    }
    if (bufs != stack_bufs) free(bufs);
    if (modes != stack_modes) free(modes);
    return st;
}

/* The buffer a SEND or RECV of the plan moves. */
static sp_exec_buf *transfer_buf(sp_trainer *t, const sp_buf *b)
{
    switch (b->cls) {
    case SP_BUF_EDGE_FWD: return slab_buf(t, SP_SLAB_EDGE_FWD, b->idx, b->mb);
    case SP_BUF_EDGE_GRAD: return slab_buf(t, SP_SLAB_EDGE_GRAD, b->idx, b->mb);
    case SP_BUF_SHARED_GRAD:
        return lazy(t, &t->h_sgrad[b->idx * t->S + b->stage], (size_t)shared_numel(t, b->idx));
    case SP_BUF_SHARED_PARAM:
        return lazy(t, &t->h_sparam[b->idx], (size_t)shared_numel(t, b->idx));
    default: return NULL;
    }
}

static sp_status do_transfer(sp_trainer *t, const sp_instr *in)
{
    const sp_buf *b = &in->buf;
    sp_exec_buf *x = transfer_buf(t, b);
    if (!x)
        return sp_set_error(SP_ERR_RUNTIME, "trainer: the plan moves %s, which has no buffer",
                            sp_buf_class_name((sp_buf_class)b->cls));
    if (b->cls == SP_BUF_SHARED_GRAD && b->mb >= 0)
        return sp_set_error(SP_ERR_RUNTIME, "trainer: per-microbatch tied-gradient transfers "
                            "are not supported (the graph never needs them)");
    sp_status st;
    if (in->op == SP_OP_SEND) {
        /* tied parameters travel out of their stage slab through a transfer buffer */
        if (b->cls == SP_BUF_SHARED_GRAD &&
            (st = submit_copy(t, x, 0, t->h_grads[b->stage], shared_off(t, b->idx, b->stage),
                              shared_numel(t, b->idx), "pack grad")))
            return st;
        if (b->cls == SP_BUF_SHARED_PARAM) {
            int o = shared_owner(t, b->idx);
            if ((st = submit_copy(t, x, 0, t->h_params[o], shared_off(t, b->idx, o),
                                  shared_numel(t, b->idx), "pack param")))
                return st;
        }
        return sp_exec_send(x, in->peer, (uint32_t)in->seq);
    }
    if ((st = sp_exec_recv(x, in->peer, (uint32_t)in->seq))) return st;
    if (b->cls == SP_BUF_SHARED_PARAM) /* the owner's new values into every local copy */
        for (int s = 0; s < t->S; s++) {
            int64_t off = owns(t, s) ? shared_off(t, b->idx, s) : -1;
            if (off >= 0 && s != shared_owner(t, b->idx) &&
                (st = submit_copy(t, t->h_params[s], off, x, 0, shared_numel(t, b->idx),
                                  "unpack param")))
                return st;
        }
    return SP_OK;
}

static sp_status do_combine(sp_trainer *t, int k, int instr)
{
    const sp_stage_shared *sh = &sp_program_stage_model(t->p)->shared[k];
    int o = sh->stages[0];
    sp_exec_buf *bufs[SP_COMBINE_MAX];
    sp_exec_mode modes[SP_COMBINE_MAX];
    sp_combine_task_args a = { .dst_off = shared_off(t, k, o), .n = shared_numel(t, k) };
    bufs[0] = t->h_grads[o];
    modes[0] = SP_EXEC_RW;
    int nb = 1;
    for (int q = 1; q < sh->nstages; q++) {
        int s = sh->stages[q];
        if (owns(t, s)) {
            bufs[nb] = t->h_grads[s];
            a.src_off[nb] = shared_off(t, k, s);
        } else {
            bufs[nb] = transfer_buf(t, &(sp_buf){ .cls = SP_BUF_SHARED_GRAD, .idx = k,
                                                  .mb = -1, .stage = s });
            a.src_off[nb] = 0;
        }
        modes[nb++] = SP_EXEC_R;
    }
    return submit(t, "combine", TASK_FN(sp_combine_task), nb, bufs, modes, &a, sizeof a,
                  (task_id){ -1, -1, o, instr });
}

/* One task for a whole NCCL group (comm/nccl.c), at the group's first call. */
static sp_status do_nccl(sp_trainer *t, int call)
{
    const sp_nccl_call *c = &t->ncalls[call];
    if (call > 0 && t->ncalls[call - 1].group == c->group) return SP_OK; /* already issued */
    sp_exec_buf *bufs[SP_COMM_NCCL_MAX_GROUP];
    sp_exec_mode modes[SP_COMM_NCCL_MAX_GROUP];
    sp_comm_nccl_group_args a = { 0 };
    for (int k = call; k < t->nncalls && t->ncalls[k].group == c->group; k++) {
        if (a.n == SP_COMM_NCCL_MAX_GROUP)
            return sp_set_error(SP_ERR_RUNTIME, "trainer: an NCCL group of more than %d calls",
                                SP_COMM_NCCL_MAX_GROUP);
        const sp_instr *in = &t->plan->instr[t->rank][t->ncalls[k].instr];
        bufs[a.n] = transfer_buf(t, &in->buf);
        modes[a.n] = in->op == SP_OP_SEND ? SP_EXEC_R : SP_EXEC_W;
        a.is_send[a.n] = in->op == SP_OP_SEND;
        a.peer[a.n] = in->peer;
        if (!bufs[a.n]) return sp_set_error(SP_ERR_RUNTIME, "trainer: no buffer for NCCL");
        a.n++;
    }
    char name[32];
    snprintf(name, sizeof name, "nccl group %d", c->group);
    return submit(t, name, (task_fn){ NULL, sp_comm_nccl_group }, a.n, bufs, modes, &a,
                  sizeof a, (task_id){ -1, -1, -1, c->instr });
}

static int is_update_phase(const sp_instr *in)
{
    return in->op == SP_OP_OPTIMIZER ||
           ((in->op == SP_OP_SEND || in->op == SP_OP_RECV) && in->buf.cls == SP_BUF_SHARED_PARAM);
}

static sp_status do_optimizer(sp_trainer *t, int s, float scale)
{
    sp_exec_buf *bufs[4] = { t->h_params[s], t->h_grads[s], t->h_m[s], t->h_v[s] };
    sp_exec_mode modes[4] = { SP_EXEC_RW, SP_EXEC_R, SP_EXEC_RW, SP_EXEC_RW };
    sp_optim_task_args a = { .prog = t->p, .stage = s, .opt = t->o.opt, .grad_scale = scale,
                             .t = t->steps + 1 };
    char name[32];
    snprintf(name, sizeof name, "AdamW s%d", s);
    sp_status st = submit(t, name, TASK_FN(sp_optim_task), 4, bufs, modes, &a, sizeof a,
                          (task_id){ -1, -1, s, -1 });
    /* tied parameters with a copy in another stage of this rank: no message, a copy */
    for (int k = 0; st == SP_OK && k < t->nshared; k++) {
        const sp_stage_shared *sh = &sp_program_stage_model(t->p)->shared[k];
        if (sh->stages[0] != s) continue;
        for (int q = 1; st == SP_OK && q < sh->nstages; q++)
            if (owns(t, sh->stages[q]))
                st = submit_copy(t, t->h_params[sh->stages[q]], shared_off(t, k, sh->stages[q]),
                                 t->h_params[s], shared_off(t, k, s), shared_numel(t, k),
                                 "copy param");
    }
    return st;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}


static sp_status record_events(sp_trainer *t)
{
    const sp_exec_record *rec;
    size_t n;
    sp_status st = sp_exec_trace(&rec, &n);
    if (st) return st;
    if ((int)n > t->cap_events) {
        sp_train_event *e = realloc(t->events, n * sizeof *e);
        if (!e) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        t->events = e;
        t->cap_events = (int)n;
    }
    t->nevents = (int)n;
    for (size_t i = 0; i < n; i++) {
        sp_train_event *e = &t->events[i];
        snprintf(e->name, sizeof e->name, "%s", rec[i].name);
        e->transfer = rec[i].transfer;
        task_id id = rec[i].seq < t->seq ? t->seq_task[rec[i].seq] : (task_id){ -1, -1, -1, -1 };
        if (rec[i].transfer) /* a message: its plan instruction on this rank */
            id = (task_id){ -1, -1, -1,
                            (int64_t)rec[i].seq < t->plan->nmessages ? t->msg_instr[rec[i].seq]
                                                                     : -1 };
        e->instr = id.instr;
        e->kind = id.kind;
        e->mb = id.mb;
        e->stage = id.stage;
        e->start_us = rec[i].start_us;
        e->end_us = rec[i].end_us;
    }
    return SP_OK;
}

/* Every actor's instruction times of the step, on every rank: each rank fills its own
 * row, the others add zeros (exact), so one allreduce gathers them all. */
static sp_status gather_times(sp_trainer *t)
{
    const sp_plan *pl = t->plan;
    size_t cells = (size_t)pl->nactors * (size_t)t->tmax;
    if (!t->tbuf) {
        t->tbuf = malloc(2 * cells * sizeof *t->tbuf + 1);
        t->tstart = malloc((size_t)pl->nactors * sizeof *t->tstart);
        t->tend = malloc((size_t)pl->nactors * sizeof *t->tend);
        if (!t->tbuf || !t->tstart || !t->tend) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        for (int a = 0; a < pl->nactors; a++) {
            t->tstart[a] = t->tbuf + (size_t)a * t->tmax;
            t->tend[a] = t->tbuf + cells + (size_t)a * t->tmax;
        }
    }
    memset(t->tbuf, 0, 2 * cells * sizeof *t->tbuf);
    double *mine = t->tstart[t->rank], *mine_end = t->tend[t->rank];
    for (int i = 0; i < pl->ninstr[t->rank]; i++) mine[i] = mine_end[i] = -1;
    double origin = sp_exec_step_origin_us();
    for (int e = 0; e < t->nevents; e++) {
        const sp_train_event *ev = &t->events[e];
        if (ev->instr < 0) continue;
        mine[ev->instr] = 1e-6 * (origin + ev->start_us);
        mine_end[ev->instr] = 1e-6 * (origin + ev->end_us);
    }
    return sp_exec_allreduce_sum(t->tbuf, 2 * cells, 1);
}

sp_status sp_trainer_step(sp_trainer *t, const void *const *inputs, sp_step_stats *stats)
{
    if (!t || !inputs) return sp_set_error(SP_ERR_ARG, "sp_trainer_step: NULL argument");
    double t0 = now();
    sp_status st = sp_program_check_inputs(t->p, inputs, t->m);
    void *ptr;
    /* inputs in, gradient accumulators to zero */
    for (int i = 0; i < t->m * t->nin && st == SP_OK; i++)
        if (!(st = sp_exec_buf_acquire(t->h_input[i], SP_EXEC_W, &ptr))) {
            memcpy(ptr, inputs[i], sp_program_buf_bytes(t->p, SP_SLAB_INPUT, i % t->nin));
            st = sp_exec_buf_release(t->h_input[i]);
        }
    for (int s = 0; s < t->S && st == SP_OK; s++)
        if (owns(t, s) && !(st = sp_exec_buf_acquire(t->h_grads[s], SP_EXEC_W, &ptr))) {
            memset(ptr, 0, sp_program_buf_bytes(t->p, SP_SLAB_GRADS, s));
            st = sp_exec_buf_release(t->h_grads[s]);
        }
    if (st) return st;

    /* phase 1: the pipeline */
    const sp_plan *pl = t->plan;
    const sp_instr *prog = pl->instr[t->rank];
    int n = pl->ninstr[t->rank];
    if ((st = sp_exec_begin_step())) return st;
    t->seq = 0;
    for (int i = 0; i < n && st == SP_OK; i++) {
        const sp_instr *in = &prog[i];
        if (is_update_phase(in)) continue;
        switch (in->op) {
        case SP_OP_RUN: st = do_run(t, &in->task, i); break;
        case SP_OP_SEND:
        case SP_OP_RECV:
            st = t->nccl_of && t->nccl_of[i] >= 0 ? do_nccl(t, t->nccl_of[i]) : do_transfer(t, in);
            break;
        case SP_OP_COMBINE: st = do_combine(t, in->buf.idx, i); break;
        case SP_OP_FREE: do_free(t, &in->buf); break;
        default: break;
        }
    }
    /* whatever the plan left alive (nothing, for a well-formed plan) returns too */
    for (int i = 0; i < t->m * t->S; i++) {
        pool_give(t, &t->h_act[i]);
        pool_give(t, &t->h_bgrad[i]);
    }
    for (int i = 0; i < t->m * t->E; i++) {
        pool_give(t, &t->h_efwd[i]);
        pool_give(t, &t->h_egrad[i]);
    }
    if (st) { /* a local submission error the peers cannot know of: the step is lost */
        sp_exec_cancel_step();
        return st;
    }
    sp_status end = sp_exec_end_step();
    if (end) return end;
    sp_run_measure run = { 0 };
    if (t->o.trace && ((st = record_events(t)) || (st = gather_times(t)) ||
                       (st = sp_plan_measure(pl, sp_program_stage_model(t->p),
                                             (const double *const *)t->tstart,
                                             (const double *const *)t->tend, &run))))
        return st;

    /* the loss, from the last stage's rank to all */
    int last = pl->stage_actor[t->S - 1];
    float loss = 0.0f;
    if (t->rank == last) {
        double total = 0.0;
        for (int i = 0; i < t->m && st == SP_OK; i++)
            if (!(st = sp_exec_buf_acquire(t->h_loss[i], SP_EXEC_R, &ptr))) {
                total += *(float *)ptr;
                st = sp_exec_buf_release(t->h_loss[i]);
            }
        loss = (float)(total / t->m);
    }
    if (st || (st = sp_exec_bcast(&loss, sizeof loss, last))) return st;

    /* phase 2: norm, clip, update */
    double *v = calloc((size_t)t->S, sizeof(double));
    if (!v) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int s = 0; s < t->S && st == SP_OK; s++)
        if (owns(t, s) && !(st = sp_exec_buf_acquire(t->h_grads[s], SP_EXEC_R, &ptr))) {
            v[s] = sp_optim_sumsq(t->p, s, ptr);
            st = sp_exec_buf_release(t->h_grads[s]);
        }
    if (st == SP_OK) st = sp_exec_allreduce_sum(v, (size_t)t->S, 1);
    double norm = 0.0;
    float scale = st == SP_OK ? sp_optim_clip_scale(&t->o.opt, v, t->S, &norm) : 1.0f;
    int bad = sp_optim_nonfinite_stage(v, t->S, loss);
    int bad_is_loss = bad >= 0 && isfinite(v[bad]);
    free(v);
    if (st) return st;
    if (stats) {
        *stats = (sp_step_stats){ .loss = loss, .grad_norm = norm, .skipped = bad >= 0 };
        if (t->o.trace) {
            stats->bubble = run.bubble;
            stats->span_s = run.span;
            stats->plan_bubble = run.replay_bubble;
            stats->plan_span_s = run.replay_span;
            stats->wait_median_s = run.wait_median;
            stats->wait_p90_s = run.wait_p90;
        }
    }
    if (bad >= 0) { /* the same decision on every rank: v was allreduced */
        if (stats) stats->step_s = now() - t0;
        if (t->o.opt.skip_nonfinite) return SP_OK;
        return sp_set_error(SP_ERR_NUMERIC, "non-finite %s in stage %d (use --skip-nonfinite "
                            "to skip such steps)", bad_is_loss ? "loss" : "gradients", bad);
    }

    if ((st = sp_exec_begin_step())) return st;
    t->seq = 0;
    for (int i = 0; i < n && st == SP_OK; i++) {
        const sp_instr *in = &prog[i];
        if (!is_update_phase(in)) continue;
        st = in->op == SP_OP_OPTIMIZER ? do_optimizer(t, in->stage, scale) : do_transfer(t, in);
    }
    if (st) {
        sp_exec_cancel_step();
        return st;
    }
    end = sp_exec_end_step();
    if (end) return end;
    t->steps++;
    if (stats) stats->step_s = now() - t0;
    return SP_OK;
}

/* ---- creation ---------------------------------------------------------------------- */

static sp_status alloc_arrays(sp_trainer *t)
{
    int S = t->S, E = t->E, m = t->m;
#define ALLOC(field, count)                                                              \
    if (!(t->field = calloc((size_t)(count) + 1, sizeof *t->field)))                      \
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    ALLOC(params, S) ALLOC(grads, S) ALLOC(mom_m, S) ALLOC(mom_v, S)
    ALLOC(h_params, S) ALLOC(h_grads, S) ALLOC(h_m, S) ALLOC(h_v, S) ALLOC(h_scratch, S)
    ALLOC(h_act, m * S) ALLOC(h_bgrad, m * S) ALLOC(h_efwd, m * E) ALLOC(h_egrad, m * E)
    ALLOC(h_input, m * t->nin) ALLOC(input_host, m * t->nin) ALLOC(h_loss, m)
    ALLOC(shared_param, t->nshared) ALLOC(h_sgrad, t->nshared * S)
    ALLOC(h_sparam, t->nshared)
#undef ALLOC
    return SP_OK;
}

static sp_status register_host(sp_exec_buf **h, float **host, size_t bytes)
{
    size_t n = bytes / 4 ? bytes / 4 : 1;
    if (!(*host = calloc(n, sizeof(float))))
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    return sp_exec_buf_register(h, *host, n, sizeof(float));
}

sp_trainer *sp_trainer_create(const sp_program *p, const sp_schedule *sched,
                              const sp_train_opts *opts, sp_status *status)
{
    sp_status st = SP_OK;
    sp_trainer *t = NULL;
    if (!p || !sched || !opts) {
        st = sp_set_error(SP_ERR_ARG, "sp_trainer_create: NULL argument");
        goto out;
    }
    if (sched->nstages != sp_program_num_stages(p)) {
        st = sp_set_error(SP_ERR_ARG, "schedule '%s' has %d stages but the model has %d",
                          sched->name, sched->nstages, sp_program_num_stages(p));
        goto out;
    }
    if (sched->nactors != sp_exec_size()) {
        st = sp_set_error(SP_ERR_ARG, "schedule '%s' needs %d actors (MPI ranks), but %d "
                          "ranks are running: use mpirun -np %d", sched->name, sched->nactors,
                          sp_exec_size(), sched->nactors);
        goto out;
    }
    if (!(t = calloc(1, sizeof *t))) {
        st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        goto out;
    }
    t->p = p;
    t->g = sp_program_graph(p);
    t->o = *opts;
    t->rank = sp_exec_rank();
    t->S = sp_program_num_stages(p);
    const sp_stage_model *model = sp_program_stage_model(p);
    t->E = model->nedges;
    t->m = sched->nmicro;
    t->nin = sp_program_num_inputs(p);
    t->nshared = model->nshared;
    sp_fault fault; /* STARPIPE_FAULT, parsed strictly (starpipe/env.h) */
    if ((st = sp_env_fault(&fault))) goto out;
    if (fault.kind == SP_FAULT_FAIL || fault.kind == SP_FAULT_HANG)
        t->fault.kind = fault.kind, t->fault.step = fault.step, t->fault.stage = fault.stage;
    if ((st = sp_plan_build(model, sched, &t->plan))) goto out;
    if ((st = sp_plan_check(t->plan))) goto out;
    if (!(t->msg_instr = malloc(sizeof(int) * (size_t)(t->plan->nmessages + 1)))) {
        st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        goto out;
    }
    for (int64_t q = 0; q < t->plan->nmessages; q++) t->msg_instr[q] = -1;
    /* large boundary tensors between GPU actors go through NCCL when it can start */
    if ((st = sp_exec_nccl_init(t->notice, sizeof t->notice))) goto out;
    if (sp_exec_nccl_active()) {
        int64_t th = 65536; /* STARPIPE_NCCL_THRESHOLD, parsed strictly */
        if ((st = sp_env_int("STARPIPE_NCCL_THRESHOLD", 0, SP_NCCL_THRESHOLD_MAX, &th))) goto out;
        size_t threshold = (size_t)th;
        if ((st = sp_nccl_calls(t->plan, t->rank, threshold, &t->ncalls, &t->nncalls)))
            goto out;
        if (!(t->nccl_of = malloc(sizeof(int) * (size_t)(t->plan->ninstr[t->rank] + 1)))) {
            st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
            goto out;
        }
        for (int i = 0; i < t->plan->ninstr[t->rank]; i++) t->nccl_of[i] = -1;
        for (int k = 0; k < t->nncalls; k++) t->nccl_of[t->ncalls[k].instr] = k;
        snprintf(t->notice, sizeof t->notice, "NCCL carries boundary tensors of %zu bytes "
                 "and more", threshold);
    }
    for (int i = 0; i < t->plan->ninstr[t->rank]; i++) {
        const sp_instr *in = &t->plan->instr[t->rank][i];
        if (in->op == SP_OP_SEND || in->op == SP_OP_RECV) t->msg_instr[in->seq] = i;
    }
    for (int a = 0; a < t->plan->nactors; a++)
        if (t->plan->ninstr[a] > t->tmax) t->tmax = t->plan->ninstr[a];
    if ((st = alloc_arrays(t))) goto out;
    for (int i = 0, k = 0; i < sp_graph_num_params(t->g); i++) {
        sp_tensor x = sp_graph_param(t->g, i);
        int users = 0;
        for (int s = 0; s < t->S; s++) users += sp_program_param_offset(p, s, x) >= 0;
        if (users > 1) t->shared_param[k++] = x;
    }
    for (int s = 0; s < t->S; s++) {
        if (!owns(t, s)) continue;
        size_t pb = sp_program_buf_bytes(p, SP_SLAB_PARAMS, s);
        if ((st = register_host(&t->h_params[s], &t->params[s], pb)) ||
            (st = register_host(&t->h_grads[s], &t->grads[s],
                                sp_program_buf_bytes(p, SP_SLAB_GRADS, s))) ||
            (st = register_host(&t->h_m[s], &t->mom_m[s], pb)) ||
            (st = register_host(&t->h_v[s], &t->mom_v[s], pb)))
            goto out;
        for (int i = 0; i < sp_graph_num_params(t->g); i++) {
            sp_tensor x = sp_graph_param(t->g, i);
            int64_t off = sp_program_param_offset(p, s, x);
            if (off >= 0 && (st = sp_param_init_values(t->g, x, opts->seed, t->params[s] + off)))
                goto out;
        }
    }
    for (int i = 0; i < t->m * t->nin; i++)
        if ((st = register_host(&t->h_input[i], (float **)&t->input_host[i],
                                sp_program_buf_bytes(p, SP_SLAB_INPUT, i % t->nin))))
            goto out;
out:
    if (st != SP_OK) {
        sp_trainer_free(t);
        t = NULL;
    }
    if (status) *status = st;
    return t;
}

void sp_trainer_free(sp_trainer *t)
{
    if (!t) return;
    sp_exec_buf **lists[] = { t->h_params, t->h_grads, t->h_m, t->h_v, t->h_scratch, t->h_act,
                              t->h_bgrad, t->h_efwd, t->h_egrad, t->h_input, t->h_loss,
                              t->h_sgrad, t->h_sparam };
    size_t counts[] = { t->S, t->S, t->S, t->S, t->S, (size_t)t->m * t->S,
                        (size_t)t->m * t->S, (size_t)t->m * t->E, (size_t)t->m * t->E,
                        (size_t)t->m * t->nin, t->m, (size_t)t->nshared * t->S, t->nshared };
    for (size_t l = 0; l < sizeof lists / sizeof *lists; l++)
        for (size_t i = 0; lists[l] && i < counts[l]; i++)
            if (lists[l][i]) sp_exec_buf_unregister(lists[l][i]);
    for (size_t i = 0; i < t->nfree; i++) sp_exec_buf_unregister(t->pool_free[i]);
    free(t->pool_free);
    for (int s = 0; s < t->S; s++) {
        if (t->params) free(t->params[s]);
        if (t->grads) free(t->grads[s]);
        if (t->mom_m) free(t->mom_m[s]);
        if (t->mom_v) free(t->mom_v[s]);
    }
    for (int i = 0; t->input_host && i < t->m * t->nin; i++) free(t->input_host[i]);
    for (size_t i = 0; i < t->nhost; i++) free(t->host[i]);
    free(t->host);
    free(t->params), free(t->grads), free(t->mom_m), free(t->mom_v);
    free(t->h_params), free(t->h_grads), free(t->h_m), free(t->h_v), free(t->h_scratch);
    free(t->h_act), free(t->h_bgrad), free(t->h_efwd), free(t->h_egrad), free(t->h_input);
    free(t->input_host), free(t->h_loss), free(t->shared_param);
    free(t->h_sgrad), free(t->h_sparam), free(t->seq_task), free(t->events), free(t->msg_instr);
    free(t->nccl_of), free(t->ncalls);
    free(t->tbuf), free(t->tstart), free(t->tend);
    sp_plan_free(t->plan);
    free(t);
}

const char *sp_trainer_notice(const sp_trainer *t) { return t ? t->notice : ""; }

sp_train_memory sp_trainer_memory(const sp_trainer *t)
{
    sp_train_memory m = { 0, 0 };
    if (!t) return m;
    m.transient = t->pool_bytes;
    for (int s = 0; s < t->S; s++)
        if (owns(t, s)) m.persistent += 4 * sp_program_buf_bytes(t->p, SP_SLAB_PARAMS, s);
    return m;
}

/* ---- host access ------------------------------------------------------------------- */

static float *host_slab(sp_trainer *t, int which, int stage)
{
    if (!t || stage < 0 || stage >= t->S || !owns(t, stage)) return NULL;
    sp_exec_buf *h = which == 0 ? t->h_params[stage] : which == 1 ? t->h_grads[stage]
                   : which == 2 ? t->h_m[stage] : t->h_v[stage];
    float *host = which == 0 ? t->params[stage] : which == 1 ? t->grads[stage]
                : which == 2 ? t->mom_m[stage] : t->mom_v[stage];
    void *ptr;
    /* brings the data home; the host copy stays valid until tasks touch it again */
    if (sp_exec_buf_acquire(h, SP_EXEC_R, &ptr) != SP_OK) return NULL;
    sp_exec_buf_release(h);
    return host;
}

const float *sp_trainer_slab(sp_trainer *t, sp_slab_class cls, int stage)
{
    return cls == SP_SLAB_PARAMS ? host_slab(t, 0, stage)
         : cls == SP_SLAB_GRADS  ? host_slab(t, 1, stage) : NULL;
}

const float *sp_trainer_moment(sp_trainer *t, int which, int stage)
{
    return host_slab(t, which ? 3 : 2, stage);
}

sp_status sp_trainer_fetch(sp_trainer *t, sp_tensor param, int what, float *dst)
{
    if (!t || !sp_tensor_is_param(t->g, param) || what < 0 || what > 3 || !dst)
        return sp_set_error(SP_ERR_ARG, "sp_trainer_fetch: bad argument");
    int o = sp_program_param_owner(t->p, param);
    int64_t n = sp_tensor_numel(t->g, param);
    if (owns(t, o)) {
        const float *src = host_slab(t, what, o);
        if (!src) return sp_set_error(SP_ERR_RUNTIME, "sp_trainer_fetch: %s", sp_last_error());
        memcpy(dst, src + sp_program_param_offset(t->p, o, param), (size_t)n * sizeof(float));
    }
    /* a broadcast from the owner, not a sum with the others' zeros: -0.0 + 0.0 is +0.0,
     * and the bits must not depend on how many ranks there are */
    return sp_exec_bcast(dst, (size_t)n * sizeof(float), t->plan->stage_actor[o]);
}

sp_status sp_trainer_store(sp_trainer *t, sp_tensor param, int what, const float *src)
{
    if (!t || !sp_tensor_is_param(t->g, param) || what < 0 || what > 3 || what == 1 || !src)
        return sp_set_error(SP_ERR_ARG, "sp_trainer_store: bad argument");
    int64_t n = sp_tensor_numel(t->g, param);
    for (int s = 0; s < t->S; s++) {
        int64_t off = sp_program_param_offset(t->p, s, param);
        if (!owns(t, s) || off < 0) continue;
        sp_exec_buf *h = what == 0 ? t->h_params[s] : what == 2 ? t->h_m[s] : t->h_v[s];
        void *ptr;
        sp_status st = sp_exec_buf_acquire(h, SP_EXEC_RW, &ptr);
        if (st) return st;
        memcpy((float *)ptr + off, src, (size_t)n * sizeof(float));
        if ((st = sp_exec_buf_release(h))) return st;
    }
    return SP_OK;
}

sp_status sp_trainer_trace(sp_trainer *t, const sp_train_event **events, int *n)
{
    if (!t || !events || !n) return sp_set_error(SP_ERR_ARG, "sp_trainer_trace: NULL");
    *events = t->events;
    *n = t->nevents;
    return SP_OK;
}

/* ---- timeline of what ran --------------------------------------------------------- */

sp_status sp_trainer_write_timeline(sp_trainer *t, const char *json_path, const char *svg_path)
{
    if (!t) return sp_set_error(SP_ERR_ARG, "sp_trainer_write_timeline: NULL");
    if (!t->tbuf)
        return sp_set_error(SP_ERR_ARG, "sp_trainer_write_timeline: no step was traced");
    if (t->rank != 0) return SP_OK;
    const sp_plan *pl = t->plan;
    sp_status st = SP_OK;
    sp_sim_result r = { .nactors = pl->nactors, .nmessages = pl->nmessages,
                        .async_transfers = 1 };
    r.busy = calloc((size_t)pl->nactors, sizeof(double));
    r.idle = calloc((size_t)pl->nactors, sizeof(double));
    r.start = calloc((size_t)pl->nactors, sizeof(double *));
    r.end = calloc((size_t)pl->nactors, sizeof(double *));
    if (!r.busy || !r.idle || !r.start || !r.end) st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    /* times from the first measured start; instructions not measured drawn as empty */
    double t0 = -1;
    for (int a = 0; st == SP_OK && a < pl->nactors; a++)
        for (int i = 0; i < pl->ninstr[a]; i++)
            if (t->tstart[a][i] >= 0 && (t0 < 0 || t->tstart[a][i] < t0)) t0 = t->tstart[a][i];
    for (int a = 0; st == SP_OK && a < pl->nactors; a++) {
        r.start[a] = calloc((size_t)pl->ninstr[a] + 1, sizeof(double));
        r.end[a] = calloc((size_t)pl->ninstr[a] + 1, sizeof(double));
        if (!r.start[a] || !r.end[a]) {
            st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
            break;
        }
        for (int i = 0; i < pl->ninstr[a]; i++) {
            if (t->tstart[a][i] < 0) continue;
            r.start[a][i] = t->tstart[a][i] - t0;
            r.end[a][i] = t->tend[a][i] - t0;
            int op = pl->instr[a][i].op;
            if (op != SP_OP_SEND && op != SP_OP_RECV) r.busy[a] += r.end[a][i] - r.start[a][i];
            if (r.end[a][i] > r.step_time) r.step_time = r.end[a][i];
        }
    }
    double idle = 0;
    for (int a = 0; st == SP_OK && a < pl->nactors; a++) idle += r.idle[a] = r.step_time - r.busy[a];
    r.bubble_fraction = r.step_time > 0 ? idle / (pl->nactors * r.step_time) : 0;
    if (st == SP_OK && json_path) st = sp_sim_write_trace(pl, &r, json_path);
    if (st == SP_OK && svg_path) st = sp_sim_write_svg(pl, &r, svg_path);
    for (int a = 0; a < pl->nactors; a++) {
        if (r.start) free(r.start[a]);
        if (r.end) free(r.end[a]);
    }
    free(r.start), free(r.end), free(r.busy), free(r.idle);
    return st;
}
