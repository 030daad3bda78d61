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

#include "codelets/tasks.h"
#include "runtime/exec_impl.h" /* the collectives named for the watchdog */
#include "runtime/trainer_impl.h"
#include "starpipe/data.h"
#include "base/env.h"

int sp_trainer_owns_stage(const sp_trainer *t, int stage)
{
    return t && stage >= 0 && stage < t->S && owns(t, stage);
}
int sp_trainer_steps_done(const sp_trainer *t) { return t ? t->steps : 0; }
void sp_trainer_set_steps_done(sp_trainer *t, int steps) { t->steps = steps; }
void sp_trainer_set_lr(sp_trainer *t, float lr) { t->o.opt.lr = lr; }
const sp_plan *sp_trainer_plan(const sp_trainer *t) { return t ? t->plan : NULL; }
sp_layout sp_trainer_layout(const sp_trainer *t) { return t->layout; }
int sp_trainer_replica(const sp_trainer *t) { return t ? t->replica : 0; }

void sp_trainer_shard(const sp_trainer *t, int stage, int64_t *lo, int64_t *hi)
{
    *lo = 0;
    *hi = (int64_t)(sp_program_buf_bytes(t->p, SP_BUF_PARAMS, stage) / 4);
    if (t->rep && t->rep[stage].bounds) {
        *lo = t->rep[stage].bounds[t->replica];
        *hi = t->rep[stage].bounds[t->replica + 1];
    }
}

/* A program's scratch is the executor's per-task temporary. */
static sp_access_mode exec_mode(sp_buf_class c, sp_access_mode m)
{
    return c == SP_BUF_SCRATCH ? SP_ACCESS_SCRATCH : m;
}

/* Each stage program's key in StarPU's performance model, once: its stage and the bytes
 * it reads and writes, not those of the pool buffers it runs on (which may be larger). */
static void stage_footprints(sp_trainer *t)
{
    for (int s = 0; s < t->S; s++)
        for (int kind = 0; kind < SP_NUM_TASK_KINDS; kind++) {
            uint64_t h = sp_mix64((uint64_t)s + 1);
            for (int j = 0; j < sp_program_num_bufs(t->p, s, (sp_task_kind)kind); j++) {
                sp_slab_ref r = sp_program_buf(t->p, s, (sp_task_kind)kind, j);
                h = sp_mix64(h ^ sp_program_buf_bytes(t->p, r.cls, r.index));
            }
            t->footprint[s * SP_NUM_TASK_KINDS + kind] = (uint32_t)h | 1; /* 0: no key */
        }
}

/* Submits stage s's program `kind` for microbatch mb. act_mb: the microbatch whose ACT
 * slot it uses (mb + m for a recomputing stage's backward: a buffer of its own). redo: the
 * recomputation of F inside the backward: its boundary outputs go to scratch buffers (the
 * real ones were sent, and may serve another microbatch by now). */
static sp_status submit_program(sp_trainer *t, int s, sp_task_kind kind, int mb, int act_mb,
                                int redo, int instr, sp_exec_buf **bufs, sp_access_mode *modes)
{
    int nb = sp_program_num_bufs(t->p, s, kind), nscratch = 0;
    sp_exec_buf *scratch[8] = { NULL };
    sp_status st = SP_OK;
    for (int j = 0; st == SP_OK && j < nb; j++) {
        sp_slab_ref r = sp_program_buf(t->p, s, kind, j);
        if (redo && r.cls == SP_BUF_EDGE_FWD && r.mode != SP_ACCESS_R && nscratch < 8)
            bufs[j] = sp_tr_pool_scratch(t, &scratch[nscratch++],
                                         sp_program_buf_bytes(t->p, r.cls, r.index) / 4);
        else
            bufs[j] = sp_tr_slab_buf(t, r.cls, r.index, r.cls == SP_BUF_ACT ? act_mb : mb);
        modes[j] = exec_mode(r.cls, r.mode);
        if (!bufs[j]) st = sp_error_context(SP_ERR_RUNTIME, "trainer: no buffer %s[%d] for %s "
                                            "mb%d s%d", sp_buf_class_name(r.cls), r.index,
                                            sp_task_kind_name(kind), mb, s);
    }
    if (st == SP_OK) {
        char name[32];
        snprintf(name, sizeof name, "%s%s mb%d s%d", sp_task_kind_name(kind), redo ? "'" : "",
                 mb, s);
        sp_stage_task_args a = { .prog = t->p, .stage = s, .kind = kind,
                                 .dloss = 1.0f / (float)(t->R * t->m) };
        if (t->fault.kind && !redo && !t->evaluating && t->fault.step == t->steps + 1 &&
            t->fault.stage == s && kind == SP_TASK_F && mb == 0)
            a.fault = t->fault.kind;
        st = sp_tr_submit(t, name, sp_stage_task, nb, bufs, modes, &a, sizeof a,
                          (task_id){ kind, mb, s, redo ? -1 : instr });
    }
    for (int k = 0; k < nscratch; k++) sp_tr_pool_give(t, &scratch[k]);
    return st;
}

static sp_status do_run(sp_trainer *t, const sp_task *task, int instr)
{
    int s = task->stage, mb = task->mb;
    sp_task_kind kind = (sp_task_kind)task->kind;
    int nb = sp_program_num_bufs(t->p, s, kind), nf = sp_program_num_bufs(t->p, s, SP_TASK_F);
    if (nf > nb) nb = nf;
    sp_exec_buf *stack_bufs[32];
    sp_access_mode stack_modes[32];
    sp_exec_buf **bufs = nb <= 32 ? stack_bufs : malloc((size_t)nb * sizeof *bufs);
    sp_access_mode *modes = nb <= 32 ? stack_modes : malloc((size_t)nb * sizeof *modes);
    sp_status st = SP_OK;
    if (!bufs || !modes) st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    /* activation recomputation (sp_program_set_recompute): F again, into the backward's
     * own activations, right before the first backward task of the microbatch */
    int rec = sp_program_stage_model(t->p)->stage[s].recompute && !t->evaluating;
    int act_mb = rec && kind != SP_TASK_F ? mb + t->m : mb;
    if (st == SP_OK && rec && (kind == SP_TASK_B || kind == SP_TASK_BW))
        st = submit_program(t, s, SP_TASK_F, mb, act_mb, 1, instr, bufs, modes);
    if (st == SP_OK) {
        st = submit_program(t, s, kind, mb, act_mb, 0, instr, bufs, modes);
        /* BW's activation gradients live and die inside the task (the plan does not
         * track them): the buffer can serve the next user at once */
        if (kind == SP_TASK_BW) sp_tr_pool_give(t, sp_tr_mb_slot(t, SP_BUF_BGRAD, s, mb));
        /* after the stage's last weight gradient: repeated uses of a parameter in the
         * stage are added into its first accumulator (program.h) */
        if (st == SP_OK && (kind == SP_TASK_W || kind == SP_TASK_BW) && mb == t->m - 1 &&
            sp_program_local_adds(t->p, s, NULL) > 0) {
            sp_exec_buf *g = t->h_grads[s];
            sp_access_mode rw = SP_ACCESS_RW;
            sp_local_add_task_args la = { .prog = t->p, .stage = s };
            st = sp_tr_submit(t, "local add", sp_local_add_task, 1, &g, &rw, &la,
                              sizeof la, (task_id){ -1, -1, s, -1 });
        }
    }
    if (bufs != stack_bufs) free(bufs);
    if (modes != stack_modes) free(modes);
    return st;
}

static sp_status do_transfer(sp_trainer *t, const sp_instr *in)
{
    const sp_buf *b = &in->buf;
    sp_exec_buf *x = sp_tr_transfer_buf(t, b);
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
            (st = sp_tr_submit_copy(t, x, 0, t->h_grads[b->stage], sp_tr_shared_off(t, b->idx, b->stage),
                              sp_tr_shared_numel(t, b->idx), "pack grad", SP_TR_HELPER)))
            return st;
        if (b->cls == SP_BUF_SHARED_PARAM) {
            int o = sp_tr_shared_owner(t, b->idx);
            if ((st = sp_tr_submit_copy(t, x, 0, t->h_params[o], sp_tr_shared_off(t, b->idx, o),
                                  sp_tr_shared_numel(t, b->idx), "pack param", SP_TR_HELPER)))
                return st;
        }
        return sp_tr_send(t, x, peer_rank(t, in->peer), (uint32_t)in->seq);
    }
    if ((st = sp_tr_recv(t, x, peer_rank(t, in->peer), (uint32_t)in->seq))) return st;
    if (b->cls == SP_BUF_SHARED_PARAM) /* the owner's new values into every local copy */
        for (int s = 0; s < t->S; s++) {
            int64_t off = owns(t, s) ? sp_tr_shared_off(t, b->idx, s) : -1;
            if (off >= 0 && s != sp_tr_shared_owner(t, b->idx) &&
                (st = sp_tr_submit_copy(t, t->h_params[s], off, x, 0, sp_tr_shared_numel(t, b->idx),
                                  "unpack param", SP_TR_HELPER)))
                return st;
        }
    return SP_OK;
}

static sp_status do_combine(sp_trainer *t, int k, int instr)
{
    const sp_stage_shared *sh = &sp_program_stage_model(t->p)->shared[k];
    int o = sh->stages[0];
    sp_exec_buf *bufs[SP_COMBINE_MAX];
    sp_access_mode modes[SP_COMBINE_MAX];
    sp_combine_task_args a = { .dst_off = sp_tr_shared_off(t, k, o), .n = sp_tr_shared_numel(t, k) };
    bufs[0] = t->h_grads[o];
    modes[0] = SP_ACCESS_RW;
    int nb = 1;
    for (int q = 1; q < sh->nstages; q++) {
        int s = sh->stages[q];
        if (owns(t, s)) {
            bufs[nb] = t->h_grads[s];
            a.src_off[nb] = sp_tr_shared_off(t, k, s);
        } else {
            bufs[nb] = sp_tr_transfer_buf(t, &(sp_buf){ .cls = SP_BUF_SHARED_GRAD, .idx = k,
                                                  .mb = -1, .stage = s });
            a.src_off[nb] = 0;
        }
        modes[nb++] = SP_ACCESS_R;
    }
    return sp_tr_submit(t, "combine", sp_combine_task, nb, bufs, modes, &a, sizeof a,
                  (task_id){ -1, -1, o, instr });
}

/* One task for a whole NCCL group of the plan (sp_nccl_calls), at its first call. */
static sp_status do_nccl(sp_trainer *t, int call)
{
    const sp_nccl_call *c = &t->ncalls[call];
    if (call > 0 && t->ncalls[call - 1].group == c->group) return SP_OK; /* already issued */
    int n = 0;
    while (call + n < t->nncalls && t->ncalls[call + n].group == c->group) n++;
    sp_exec_xfer *x = malloc((size_t)n * sizeof *x);
    if (!x) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int k = 0; k < n; k++) {
        const sp_instr *in = &t->plan->instr[t->actor][t->ncalls[call + k].instr];
        x[k] = (sp_exec_xfer){ sp_tr_transfer_buf(t, &in->buf), in->op == SP_OP_SEND,
                               peer_rank(t, in->peer) };
    }
    char name[32];
    snprintf(name, sizeof name, "nccl group %d", c->group);
    sp_status st = sp_tr_submit_group(t, name, x, n, (task_id){ -1, -1, -1, c->instr });
    free(x);
    return st;
}

static int is_update_phase(const sp_instr *in)
{
    return in->op == SP_OP_OPTIMIZER ||
           ((in->op == SP_OP_SEND || in->op == SP_OP_RECV) && in->buf.cls == SP_BUF_SHARED_PARAM);
}

static sp_status do_optimizer(sp_trainer *t, int s, float scale)
{
    sp_exec_buf *bufs[4] = { t->h_params[s], t->h_grads[s], t->h_m[s], t->h_v[s] };
    sp_access_mode modes[4] = { SP_ACCESS_RW, SP_ACCESS_R, SP_ACCESS_RW, SP_ACCESS_RW };
    sp_optim_task_args a = { .prog = t->p, .stage = s, .opt = t->o.opt, .grad_scale = scale,
                             .t = t->steps + 1, .shard = t->o.shard_optimizer };
    if (a.shard) sp_trainer_shard(t, s, &a.lo, &a.hi);
    char name[32];
    snprintf(name, sizeof name, "AdamW s%d", s);
    sp_status st = sp_tr_submit(t, name, sp_optim_task, 4, bufs, modes, &a, sizeof a,
                          (task_id){ -1, -1, s, -1 });
    /* ZeRO-1: the other replicas' updated shards */
    if (st == SP_OK && t->rep && t->o.shard_optimizer) st = sp_tr_gather_params(t, s);
    /* tied parameters with a copy in another stage of this rank: no message, a copy */
    for (int k = 0; st == SP_OK && k < t->nshared; k++) {
        const sp_stage_shared *sh = &sp_program_stage_model(t->p)->shared[k];
        if (sh->stages[0] != s) continue;
        for (int q = 1; st == SP_OK && q < sh->nstages; q++)
            if (owns(t, sh->stages[q]))
                st = sp_tr_submit_copy(t, t->h_params[sh->stages[q]], sp_tr_shared_off(t, k, sh->stages[q]),
                                 t->h_params[s], sp_tr_shared_off(t, k, s), sp_tr_shared_numel(t, k),
                                 "copy param", SP_TR_HELPER);
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
        if (rec[i].transfer) /* a message: its plan instruction on this rank, or a replica
                                * collective's (numbered past the plan's, replicas.c) */
            id = (int64_t)rec[i].seq < t->plan->nmessages
                     ? (task_id){ -1, -1, -1, t->msg_instr[rec[i].seq] }
                     : (task_id){ SP_TR_COLLECTIVE, -1,
                                  (int)((rec[i].seq - t->plan->nmessages) / 3), -1 };
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
 * row, the others add zeros (exact), so one allreduce gathers them all. After the rows,
 * each stage's collectives (first start, last end; zeros when none). */
static sp_status gather_times(sp_trainer *t)
{
    const sp_plan *pl = t->plan;
    size_t cells = (size_t)pl->nactors * (size_t)t->tmax, all = 2 * cells + 2 * (size_t)t->S;
    if (!t->tbuf) {
        t->tbuf = malloc(all * sizeof *t->tbuf + 1);
        t->tstart = malloc((size_t)pl->nactors * sizeof *t->tstart);
        t->tend = malloc((size_t)pl->nactors * sizeof *t->tend);
        if (!t->tbuf || !t->tstart || !t->tend) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        for (int a = 0; a < pl->nactors; a++) {
            t->tstart[a] = t->tbuf + (size_t)a * t->tmax;
            t->tend[a] = t->tbuf + cells + (size_t)a * t->tmax;
        }
    }
    memset(t->tbuf, 0, all * sizeof *t->tbuf);
    /* with replicas, replica 0 speaks for its actor, and tensor rank 0 for its group (the
     * others add zeros) */
    if (t->replica != 0 || t->trank != 0)
        return sp_exec_allreduce_sum_named(t->tbuf, all, 1, "the trace's all-reduce of times");
    double *ar = t->tbuf + 2 * cells; /* [2 s]: start, [2 s + 1]: end */
    double *mine = t->tstart[t->actor], *mine_end = t->tend[t->actor];
    for (int i = 0; i < pl->ninstr[t->actor]; i++) mine[i] = mine_end[i] = -1;
    double origin = sp_exec_step_origin_us();
    for (int e = 0; e < t->nevents; e++) {
        const sp_train_event *ev = &t->events[e];
        double t0 = 1e-6 * (origin + ev->start_us), t1 = 1e-6 * (origin + ev->end_us);
        if (ev->kind == SP_TR_COLLECTIVE && ev->stage >= 0 && ev->stage < t->S) {
            /* from its first task (messages count from their posting, at submission) to
             * its last task or message */
            double *c = ar + 2 * ev->stage;
            if (!ev->transfer && (c[0] == 0 || t0 < c[0])) c[0] = t0;
            if (t1 > c[1]) c[1] = t1;
        }
        if (ev->instr < 0) continue;
        mine[ev->instr] = t0;
        mine_end[ev->instr] = t1;
    }
    return sp_exec_allreduce_sum_named(t->tbuf, all, 1, "the trace's all-reduce of times");
}

/* The per-parameter sums of squares of every stage's gradients on every rank (each
 * value from the one rank that holds its shard; the others add zeros, exactly), folded
 * per stage as sp_optim_sumsq would: v[s]. */
static sp_status stage_sumsq(sp_trainer *t, double *v)
{
    int np = sp_graph_num_params(t->g);
    double *each = calloc((size_t)np + 1, sizeof *each);
    if (!each) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    sp_status st = SP_OK;
    void *ptr;
    /* the terms were computed where the gradients are (sp_sumsq_task): only np doubles
     * per stage come to the host; owned stages' terms are disjoint, the others zeros */
    for (int s = 0; s < t->S && st == SP_OK; s++)
        if (owns(t, s) && !(st = sp_exec_buf_acquire(t->h_sumsq[s], SP_ACCESS_R, &ptr))) {
            for (int i = 0; i < np; i++) each[i] += ((const double *)ptr)[i];
            t->host_bytes += (size_t)np * sizeof(double);
            st = sp_exec_buf_release(t->h_sumsq[s]);
        }
    /* tensor parallelism: a split parameter's terms summed over the group in its order,
     * then tensor rank 0 speaks for the group (its members' terms are now the same) */
    if (st == SP_OK && t->T > 1) {
        st = sp_optim_group_terms(t->p, 0, each, sp_exec_tensor_group_host(t->tgroup));
        if (t->trank != 0) memset(each, 0, sizeof *each * (size_t)np);
    }
    if (st == SP_OK)
        st = sp_exec_allreduce_sum_named(each, (size_t)np, 1, "the gradient norm's all-reduce");
    for (int s = 0; s < t->S; s++) v[s] = sp_optim_fold_sumsq(t->p, s, each);
    free(each);
    return st;
}

/* The step's loss on every rank: each replica's last actor contributes its microbatches'
 * losses (the others zeros), then the mean over all R x m in microbatch order, as the
 * reference computes it. */
static sp_status step_loss(sp_trainer *t, float *loss)
{
    int n = t->R * t->m;
    float *each = calloc((size_t)n, sizeof *each);
    if (!each) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    sp_status st = SP_OK;
    void *ptr;
    if (owns(t, t->S - 1) && t->trank == 0) /* one member speaks for the group */
        for (int i = 0; i < t->m && st == SP_OK; i++)
            if (!(st = sp_exec_buf_acquire(t->h_loss[i], SP_ACCESS_R, &ptr))) {
                each[t->replica * t->m + i] = *(float *)ptr;
                t->host_bytes += sizeof(float);
                st = sp_exec_buf_release(t->h_loss[i]);
            }
    if (st == SP_OK) st = sp_exec_allreduce_sum_named(each, (size_t)n, 0, "the loss all-reduce");
    double total = 0.0;
    for (int i = 0; i < n; i++) total += each[i];
    *loss = (float)(total / n);
    free(each);
    return st;
}

/* Phase 1 of a step: the pipeline, and with replicas each stage's gradient reduction as
 * soon as its gradients are final (replicas.c). Also walked dry to plan the pool. */
static sp_status walk_pipeline(sp_trainer *t)
{
    const sp_plan *pl = t->plan;
    const sp_instr *prog = pl->instr[t->actor];
    int n = pl->ninstr[t->actor];
    sp_status st = SP_OK;
    sp_tr_pool_begin(t, 0);
    t->seq = 0;
    t->nunpack = 0;
    for (int s = 0; t->rep && s < t->S; s++) t->rep[s].pending = 0;
    /* the gradient accumulators to zero where they live (a GPU's, without a round trip) */
    for (int s = 0; s < t->S && st == SP_OK; s++) {
        sp_access_mode w = SP_ACCESS_W;
        if (owns(t, s))
            st = sp_tr_submit(t, "zero grads", sp_zero_task, 1, &t->h_grads[s], &w,
                              NULL, 0, SP_TR_HELPER);
    }
    for (int i = 0; i < n && st == SP_OK; i++) {
        const sp_instr *in = &prog[i];
        if (is_update_phase(in)) continue;
        switch (in->op) {
        case SP_OP_RUN:
            if (!(st = do_run(t, &in->task, i))) st = sp_tr_reduce_pending(t);
            break;
        case SP_OP_SEND:
        case SP_OP_RECV:
            st = t->nccl_of && t->nccl_of[i] >= 0 ? do_nccl(t, t->nccl_of[i]) : do_transfer(t, in);
            break;
        case SP_OP_COMBINE: st = do_combine(t, in->buf.idx, i); break;
        case SP_OP_FREE: sp_tr_free_buf(t, &in->buf); break;
        default: break;
        }
        for (int s = 0; t->rep && s < t->S && st == SP_OK; s++)
            if (t->grads_last[s] == i) st = sp_tr_reduce_begin(t, s);
    }
    for (int s = 0; t->rep && s < t->S && st == SP_OK; s++) /* a stage with no gradients */
        if (owns(t, s) && t->grads_last[s] < 0) st = sp_tr_reduce_begin(t, s);
    if (st == SP_OK && t->rep) st = sp_tr_reduce_end(t);
    /* the global norm's terms, computed where the gradients are */
    for (int s = 0; s < t->S && st == SP_OK; s++) {
        if (!owns(t, s)) continue;
        sp_exec_buf *bufs[2] = { t->h_grads[s], t->h_sumsq[s] };
        sp_access_mode modes[2] = { SP_ACCESS_R, SP_ACCESS_W };
        sp_sumsq_task_args a = { .prog = t->p, .stage = s };
        sp_trainer_shard(t, s, &a.lo, &a.hi);
        st = sp_tr_submit(t, "grad sumsq", sp_sumsq_task, 2, bufs, modes, &a, sizeof a,
                          SP_TR_HELPER);
    }
    /* whatever the plan left alive (nothing, for a well-formed plan) returns too */
    for (int i = 0; i < t->m * t->S; i++) {
        sp_tr_pool_give(t, &t->h_act[i]);
        sp_tr_pool_give(t, &t->h_act[i + t->m * t->S]); /* recomputed activations */
        sp_tr_pool_give(t, &t->h_bgrad[i]);
    }
    for (int i = 0; i < t->m * t->E; i++) {
        sp_tr_pool_give(t, &t->h_efwd[i]);
        sp_tr_pool_give(t, &t->h_egrad[i]);
    }
    return st;
}

sp_status sp_trainer_step(sp_trainer *t, const void *const *inputs, sp_step_stats *stats)
{
    if (!t || !inputs) return sp_set_error(SP_ERR_ARG, "sp_trainer_step: NULL argument");
    double t0 = now();
    sp_exec_label_step(t->steps + 1);
    sp_status st = sp_program_check_inputs(t->p, inputs, t->R * t->m);
    void *ptr;
    t->host_bytes = 0;
    /* this replica's inputs in (the only large host writes of a step) */
    const void *const *mine = inputs + (size_t)t->replica * t->m * t->nin;
    for (int i = 0; i < t->m * t->nin && st == SP_OK; i++)
        if (!(st = sp_exec_buf_acquire(t->h_input[i], SP_ACCESS_W, &ptr))) {
            size_t bytes = sp_program_buf_bytes(t->p, SP_BUF_INPUT, i % t->nin);
            memcpy(ptr, mine[i], bytes);
            t->host_bytes += bytes;
            st = sp_exec_buf_release(t->h_input[i]);
        }
    if (st) return st;

    const sp_plan *pl = t->plan;
    const sp_instr *prog = pl->instr[t->actor];
    int n = pl->ninstr[t->actor];
    if ((st = sp_exec_begin_step())) return st;
    st = walk_pipeline(t);
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

    float loss = 0.0f;
    if ((st = step_loss(t, &loss))) return st;

    /* phase 2: norm, clip, update */
    double *v = calloc((size_t)t->S, sizeof(double));
    if (!v) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    st = stage_sumsq(t, v);
    double norm = 0.0;
    float scale = st == SP_OK ? sp_optim_clip_scale(&t->o.opt, v, t->S, &norm) : 1.0f;
    int bad = sp_optim_nonfinite_stage(v, t->S, loss);
    int bad_is_loss = bad >= 0 && isfinite(v[bad]);
    free(v);
    if (st) return st;
    if (stats) {
        *stats = (sp_step_stats){ .loss = loss, .grad_norm = norm, .skipped = bad >= 0,
                                  .host_bytes = t->host_bytes };
        if (t->o.trace) {
            stats->bubble = run.bubble;
            stats->span_s = run.span;
            stats->plan_bubble = run.replay_bubble;
            stats->plan_span_s = run.replay_span;
            stats->wait_median_s = run.wait_median;
            stats->wait_p90_s = run.wait_p90;
            stats->dispatch_median_s = run.dispatch_median;
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

/* ---- evaluation ------------------------------------------------------------------- */

/* The evaluation's loss on every rank: each replica's last actor contributes its
 * microbatches' losses (the others zeros), then the mean over all K in microbatch order,
 * as sp_reference_eval computes it. */
static sp_status eval_loss(sp_trainer *t, float *loss)
{
    int km = t->eval_m, K = t->R * km;
    float *each = calloc((size_t)K, sizeof *each);
    if (!each) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    sp_status st = SP_OK;
    void *ptr;
    if (owns(t, t->S - 1) && t->trank == 0) /* one member speaks for the group */
        for (int i = 0; i < km && st == SP_OK; i++)
            if (!(st = sp_exec_buf_acquire(t->h_loss[i], SP_ACCESS_R, &ptr))) {
                each[t->replica * km + i] = *(float *)ptr;
                st = sp_exec_buf_release(t->h_loss[i]);
            }
    if (st == SP_OK)
        st = sp_exec_allreduce_sum_named(each, (size_t)K, 0, "the evaluation's loss all-reduce");
    double total = 0.0;
    for (int i = 0; i < K; i++) total += each[i];
    if (loss) *loss = (float)(total / K);
    free(each);
    return st;
}

/* An evaluation's walk of the forward-only plan (also walked dry to plan the pool). */
static sp_status walk_eval(sp_trainer *t)
{
    int km = t->eval_m;
    /* the forward-only plan: F tasks, boundary tensors, FREEs; nothing else is in it */
    const sp_plan *pl = t->eval_plan;
    const sp_instr *prog = pl->instr[t->actor];
    sp_status st = SP_OK;
    sp_tr_pool_begin(t, 1);
    t->seq = 0;
    t->evaluating = 1;
    for (int i = 0; i < pl->ninstr[t->actor] && st == SP_OK; i++) {
        const sp_instr *in = &prog[i];
        switch (in->op) {
        case SP_OP_RUN: st = do_run(t, &in->task, i); break;
        case SP_OP_SEND:
        case SP_OP_RECV: st = do_transfer(t, in); break;
        case SP_OP_FREE: sp_tr_free_buf(t, &in->buf); break;
        default:
            st = sp_set_error(SP_ERR_RUNTIME, "trainer: a %s in the evaluation plan",
                              sp_op_name((sp_op)in->op));
        }
    }
    t->evaluating = 0;
    for (int i = 0; i < km * t->S; i++) sp_tr_pool_give(t, &t->h_act[i]);
    for (int i = 0; i < km * t->E; i++) sp_tr_pool_give(t, &t->h_efwd[i]);
    return st;
}

/* The walks of the pool's plan (sp_tr_pool_plan): a step's phase 1, an evaluation. */
static sp_status pool_walk(sp_trainer *t, int w)
{
    return w == 0 ? walk_pipeline(t) : walk_eval(t);
}

sp_status sp_trainer_eval(sp_trainer *t, const void *const *inputs, float *loss)
{
    if (!t || !inputs) return sp_set_error(SP_ERR_ARG, "sp_trainer_eval: NULL argument");
    if (!t->eval_plan)
        return sp_set_error(SP_ERR_ARG, "sp_trainer_eval: the trainer was created without "
                            "evaluation (opts.eval_microbatches)");
    int km = t->eval_m;
    sp_exec_label_step(t->steps); /* the evaluation after step t->steps */
    sp_status st = sp_program_check_inputs(t->p, inputs, t->R * km);
    void *ptr;
    const void *const *mine = inputs + (size_t)t->replica * km * t->nin;
    for (int i = 0; i < km * t->nin && st == SP_OK; i++)
        if (!(st = sp_exec_buf_acquire(t->h_input[i], SP_ACCESS_W, &ptr))) {
            memcpy(ptr, mine[i], sp_program_buf_bytes(t->p, SP_BUF_INPUT, i % t->nin));
            st = sp_exec_buf_release(t->h_input[i]);
        }
    if (st) return st;
    if ((st = sp_exec_begin_step())) return st;
    st = walk_eval(t);
    if (st) { /* a local submission error the peers cannot know of */
        sp_exec_cancel_step();
        return st;
    }
    if ((st = sp_exec_end_step())) return st;
    return eval_loss(t, loss);
}

/* ---- creation ---------------------------------------------------------------------- */

/* Stage s's initial parameters, one tensor at a time through the host (the slab lives
 * where the tasks run: on a GPU rank the host never holds more than one tensor). */
static sp_status init_params(sp_trainer *t, int s, uint64_t seed)
{
    int64_t most = 0;
    for (int i = 0; i < sp_graph_num_params(t->g); i++) {
        sp_tensor x = sp_graph_param(t->g, i);
        if (sp_program_param_offset(t->p, s, x) >= 0 && sp_tensor_numel(t->g, x) > most)
            most = sp_tensor_numel(t->g, x);
    }
    float *tmp = malloc(sizeof(float) * (size_t)(most > 0 ? most : 1));
    sp_status st = tmp ? SP_OK : sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int i = 0; i < sp_graph_num_params(t->g) && st == SP_OK; i++) {
        sp_tensor x = sp_graph_param(t->g, i);
        int64_t off = sp_program_param_offset(t->p, s, x), n = sp_tensor_numel(t->g, x);
        if (off >= 0 && !(st = sp_param_init_values(t->g, x, seed, tmp)))
            st = sp_exec_buf_write(t->h_params[s], 4 * (size_t)off, 4 * (size_t)n, tmp);
    }
    free(tmp);
    return st;
}

static sp_status alloc_arrays(sp_trainer *t)
{
    int S = t->S, E = t->E, m = t->mcap;
#define ALLOC(field, count)                                                              \
    if (!(t->field = calloc((size_t)(count) + 1, sizeof *t->field)))                      \
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    ALLOC(view, 4 * S)
    ALLOC(h_params, S) ALLOC(h_grads, S) ALLOC(h_m, S) ALLOC(h_v, S) ALLOC(h_scratch, S)
    ALLOC(h_act, 2 * m * S) ALLOC(h_bgrad, m * S) /* ACT: m more for recomputation */ ALLOC(h_efwd, m * E) ALLOC(h_egrad, m * E)
    ALLOC(h_input, m * t->nin) ALLOC(input_host, m * t->nin) ALLOC(h_loss, m)
    ALLOC(shared_param, t->nshared) ALLOC(h_sgrad, t->nshared * S)
    ALLOC(h_sparam, t->nshared) ALLOC(h_sumsq, S) ALLOC(footprint, S * SP_NUM_TASK_KINDS)
#undef ALLOC
    return SP_OK;
}

/* The last instruction of phase 1 that touches GRADS[s] on this rank: a task writing it
 * (W, BW and the local adds after them), a tied combine that writes or reads it, or a
 * tied gradient's send that reads it. After it the stage's gradients can be reduced over the replicas. */
static sp_status find_grads_last(sp_trainer *t)
{
    if (!(t->grads_last = malloc(sizeof(int) * (size_t)t->S)))
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int s = 0; s < t->S; s++) t->grads_last[s] = -1;
    const sp_stage_model *model = sp_program_stage_model(t->p);
    for (int i = 0; i < t->plan->ninstr[t->actor]; i++) {
        const sp_instr *in = &t->plan->instr[t->actor][i];
        if (is_update_phase(in)) continue;
        if (in->op == SP_OP_RUN) {
            int s = in->task.stage;
            sp_task_kind kind = (sp_task_kind)in->task.kind;
            for (int j = 0; j < sp_program_num_bufs(t->p, s, kind); j++) {
                sp_slab_ref r = sp_program_buf(t->p, s, kind, j);
                if (r.cls == SP_BUF_GRADS && r.mode != SP_ACCESS_R) t->grads_last[r.index] = i;
            }
        } else if (in->op == SP_OP_COMBINE) { /* writes the owner's, reads local others' */
            const sp_stage_shared *sh = &model->shared[in->buf.idx];
            for (int q = 0; q < sh->nstages; q++)
                if (owns(t, sh->stages[q])) t->grads_last[sh->stages[q]] = i;
        } else if (in->op == SP_OP_SEND && in->buf.cls == SP_BUF_SHARED_GRAD) {
            t->grads_last[in->buf.stage] = i;
        }
    }
    return SP_OK;
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
    int R = opts->replicas > 1 ? opts->replicas : 1, T = opts->tensor > 1 ? opts->tensor : 1;
    if (sp_graph_tensor_size(sp_program_graph(p)) != T) {
        st = sp_set_error(SP_ERR_ARG, "the program was built for a tensor group of %d ranks, "
                          "the trainer's is %d (sp_train_opts.tensor)",
                          sp_graph_tensor_size(sp_program_graph(p)), T);
        goto out;
    }
    if (T > 1 && sched->nactors * R * T != sp_exec_size()) {
        st = sp_set_error(SP_ERR_ARG, "%d replica%s of schedule '%s' (%d actors) of %d ranks "
                          "each (--tensor) need %d MPI ranks, but %d are running", R,
                          R == 1 ? "" : "s", sched->name, sched->nactors, T,
                          R * sched->nactors * T, sp_exec_size());
        goto out;
    }
    if (T == 1 && sched->nactors * R != sp_exec_size()) {
        if (R == 1)
            st = sp_set_error(SP_ERR_ARG, "schedule '%s' needs %d actors (MPI ranks), but %d "
                              "ranks are running: use mpirun -np %d", sched->name,
                              sched->nactors, sp_exec_size(), sched->nactors);
        else
            st = sp_set_error(SP_ERR_ARG, "%d replicas of schedule '%s' (%d actors) need %d "
                              "MPI ranks, but %d are running", R, sched->name, sched->nactors,
                              R * sched->nactors, sp_exec_size());
        goto out;
    }
    if (opts->shard_optimizer && R == 1) {
        st = sp_set_error(SP_ERR_ARG, "a sharded optimizer needs replicas (--replicas R > 1)");
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
    t->R = R;
    t->T = T;
    t->layout = (sp_layout){ .replicas = R, .actors = sched->nactors, .order = opts->rank_order,
                             .tensor = T };
    sp_layout_place_t(&t->layout, t->rank, &t->replica, &t->actor, &t->trank);
    if (T > 1 && sp_graph_tensor_rank(t->g) != t->trank) {
        st = sp_set_error(SP_ERR_ARG, "rank %d is tensor rank %d of its actor, but its program "
                          "was built for tensor rank %d", t->rank, t->trank,
                          sp_graph_tensor_rank(t->g));
        goto out;
    }
    /* the group of the actor's T ranks, colored by the group's first rank */
    if (T > 1 && (st = sp_exec_tensor_group_create(sp_layout_rank(&t->layout, t->replica, t->actor),
                                                   t->trank, T, &t->tgroup)))
        goto out;
    t->S = sp_program_num_stages(p);
    const sp_stage_model *model = sp_program_stage_model(p);
    t->E = model->nedges;
    t->m = sched->nmicro;
    t->nin = sp_program_num_inputs(p);
    t->nshared = model->nshared;
    sp_env env; /* STARPIPE_FAULT */
    if ((st = sp_env_read(&env))) goto out;
    if (env.fault.kind == SP_FAULT_FAIL || env.fault.kind == SP_FAULT_HANG)
        t->fault.kind = env.fault.kind, t->fault.step = env.fault.step,
        t->fault.stage = env.fault.stage;
    if ((st = sp_plan_build(model, sched, &t->plan))) goto out;
    if ((st = sp_plan_check(t->plan))) goto out;
    t->mcap = t->m;
    if (opts->eval_microbatches > 0) { /* the forward-only plan on the same placement */
        if (opts->eval_microbatches % R) {
            st = sp_set_error(SP_ERR_ARG, "evaluating %d microbatches over %d replicas: each "
                              "replica evaluates an equal share, so the count must be a "
                              "multiple of %d", opts->eval_microbatches, R, R);
            goto out;
        }
        t->eval_m = opts->eval_microbatches / R;
        sp_schedule *fs = NULL;
        if (!(st = sp_schedule_forward(sched, t->eval_m, &fs)) &&
            !(st = sp_plan_build(model, fs, &t->eval_plan)))
            st = sp_plan_check(t->eval_plan);
        sp_schedule_free(fs);
        if (st) goto out;
        if (t->eval_m > t->mcap) t->mcap = t->eval_m;
    }
    if (!(t->msg_instr = malloc(sizeof(int) * (size_t)(t->plan->nmessages + 1)))) {
        st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        goto out;
    }
    for (int64_t q = 0; q < t->plan->nmessages; q++) t->msg_instr[q] = -1;
    /* large boundary tensors between GPU actors go in groups (NCCL) when it can start */
    if ((st = sp_exec_groups_init(t->notice, sizeof t->notice))) goto out;
    if (sp_exec_groups_active()) {
        size_t threshold = sp_exec_group_threshold();
        if ((st = sp_nccl_calls(t->plan, t->actor, threshold, &t->ncalls, &t->nncalls)))
            goto out;
        if (!(t->nccl_of = malloc(sizeof(int) * (size_t)(t->plan->ninstr[t->actor] + 1)))) {
            st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
            goto out;
        }
        for (int i = 0; i < t->plan->ninstr[t->actor]; i++) t->nccl_of[i] = -1;
        for (int k = 0; k < t->nncalls; k++) t->nccl_of[t->ncalls[k].instr] = k;
        /* connect to every NCCL peer now (a peer of ours has us as its peer: both sides
         * of a message decide NCCL from its size alike) */
        int *peers = malloc(sizeof(int) * (size_t)(t->nncalls + R + 1)), np = 0;
        if (!peers) {
            st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
            goto out;
        }
        for (int k = 0; k < t->nncalls; k++) {
            int r = peer_rank(t, t->plan->instr[t->actor][t->ncalls[k].instr].peer), seen = 0;
            for (int j = 0; j < np; j++) seen |= peers[j] == r;
            if (!seen) peers[np++] = r;
        }
        for (int c = 0; c < R; c++) /* the replicas' collectives (replicas.c) */
            if (c != t->replica) peers[np++] = sp_layout_rank_t(&t->layout, c, t->actor, t->trank);
        st = sp_exec_groups_connect(peers, np);
        free(peers);
        if (st) goto out;
        snprintf(t->notice, sizeof t->notice, "NCCL carries boundary tensors of %zu bytes "
                 "and more%s", threshold, R > 1 ? ", and the replicas' gradient shards" : "");
    }
    for (int i = 0; i < t->plan->ninstr[t->actor]; i++) {
        const sp_instr *in = &t->plan->instr[t->actor][i];
        if (in->op == SP_OP_SEND || in->op == SP_OP_RECV) t->msg_instr[in->seq] = i;
    }
    for (int a = 0; a < t->plan->nactors; a++)
        if (t->plan->ninstr[a] > t->tmax) t->tmax = t->plan->ninstr[a];
    if ((st = alloc_arrays(t))) goto out;
    stage_footprints(t);
    for (int i = 0, k = 0; i < sp_graph_num_params(t->g); i++) {
        sp_tensor x = sp_graph_param(t->g, i);
        int users = 0;
        for (int s = 0; s < t->S; s++) users += sp_program_param_offset(p, s, x) >= 0;
        if (users > 1) t->shared_param[k++] = x;
    }
    if ((st = sp_tr_replicas_create(t)) || (st = find_grads_last(t))) goto out;
    for (int s = 0; s < t->S; s++) {
        if (!owns(t, s)) continue;
        size_t pb = sp_program_buf_bytes(p, SP_BUF_PARAMS, s);
        int64_t lo, hi; /* the moments of this rank's shard (sharded), else of all */
        sp_trainer_shard(t, s, &lo, &hi);
        size_t mb = opts->shard_optimizer ? 4 * (size_t)(hi - lo) : pb;
        if ((st = sp_tr_create_slab(t, &t->h_params[s], pb)) ||
            (st = sp_tr_create_slab(t, &t->h_grads[s], sp_program_buf_bytes(p, SP_BUF_GRADS, s))) ||
            (st = sp_tr_create_slab(t, &t->h_m[s], mb)) ||
            (st = sp_tr_create_slab(t, &t->h_v[s], mb)))
            goto out;
        t->optimizer_bytes += 2 * mb;
        void *mem;
        int np = sp_graph_num_params(t->g); /* one double per parameter: all cross the bus */
        if ((st = sp_tr_register_mem(t, &t->h_sumsq[s], &mem, (size_t)(np > 0 ? np : 1),
                                     sizeof(double))))
            goto out;
        if ((st = init_params(t, s, opts->seed))) goto out;
    }
    for (int i = 0; i < t->mcap * t->nin; i++)
        if ((st = sp_tr_register_host(t, &t->h_input[i], (float **)&t->input_host[i],
                                sp_program_buf_bytes(p, SP_BUF_INPUT, i % t->nin))))
            goto out;
    /* the per-microbatch buffers' pool, from a dry walk of a step (and an evaluation) */
    st = sp_tr_pool_plan(t, pool_walk, t->eval_plan ? 2 : 1);
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
    /* (the per-microbatch slots h_act, h_bgrad, h_efwd, h_egrad hold the pool's buffers) */
    sp_exec_buf **lists[] = { t->h_params, t->h_grads, t->h_m, t->h_v, t->h_scratch, t->h_sumsq,
                              t->h_input, t->h_loss, t->h_sgrad, t->h_sparam };
    size_t mc = (size_t)t->mcap; /* per-microbatch slots, evaluation included */
    size_t counts[] = { t->S, t->S, t->S, t->S, t->S, t->S, mc * t->nin, mc,
                        (size_t)t->nshared * t->S, t->nshared };
    for (size_t l = 0; l < sizeof lists / sizeof *lists; l++)
        for (size_t i = 0; lists[l] && i < counts[l]; i++)
            if (lists[l][i]) sp_exec_buf_unregister(lists[l][i]);
    sp_tr_pool_free(t);
    sp_tr_replicas_free(t);
    /* the memory behind every buffer, once none is registered any more */
    for (size_t i = 0; i < t->nhost; i++) sp_exec_host_free(t->host[i].p, t->host[i].bytes);
    free(t->host);
    for (int i = 0; t->view && i < 4 * t->S; i++) free(t->view[i]);
    free(t->view);
    free(t->h_params), free(t->h_grads), free(t->h_m), free(t->h_v), free(t->h_scratch);
    free(t->h_sumsq);
    free(t->h_act), free(t->h_bgrad), free(t->h_efwd), free(t->h_egrad), free(t->h_input);
    free(t->input_host), free(t->h_loss), free(t->shared_param);
    free(t->h_sgrad), free(t->h_sparam), free(t->seq_task), free(t->events), free(t->msg_instr);
    free(t->nccl_of), free(t->ncalls), free(t->grads_last), free(t->footprint);
    free(t->tbuf), free(t->tstart), free(t->tend);
    sp_plan_free(t->plan);
    sp_plan_free(t->eval_plan);
    sp_exec_tensor_group_free(t->tgroup);
    free(t);
}

