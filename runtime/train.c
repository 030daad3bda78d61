/* A training step (sp_trainer_step): walks this rank's part of the plan, each instruction
 * turned into executor calls (train_instr.c, include/starpipe/exec.h). Two phases:
 *   1. the pipeline: every RUN, SEND, RECV and COMBINE of the plan, in plan order;
 *   2. the update: the global gradient norm (one allreduce), then OPTIMIZER and the
 *      tied parameters' copies, in plan order.
 * Clipping needs the norm over all stages before any update, hence the split; the same
 * float operations as the reference interpreter run in the same order. */
#include "starpipe/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codelets/tasks.h"
#include "runtime/exec_impl.h" /* the collectives named for the watchdog */
#include "runtime/trainer_impl.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* The per-parameter sums of squares of every stage's gradients on every rank (each
 * value from the one rank that holds its shard; the others add zeros, exactly), folded
 * per stage as sp_optim_sumsq would: v[s]. */
static sp_status stage_sumsq(sp_trainer *t, double *v)
{
    int np = t->nparams;
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
sp_status sp_tr_walk_pipeline(sp_trainer *t)
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
        if (sp_tr_is_update_phase(in)) continue;
        switch (in->op) {
        case SP_OP_RUN:
            if (!(st = sp_tr_do_run(t, &in->task, i))) st = sp_tr_reduce_pending(t);
            break;
        case SP_OP_SEND:
        case SP_OP_RECV:
            st = t->nccl_of && t->nccl_of[i] >= 0 ? sp_tr_do_nccl(t, t->nccl_of[i])
                                                  : sp_tr_do_transfer(t, in);
            break;
        case SP_OP_COMBINE: st = sp_tr_do_combine(t, in->buf.idx, i); break;
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
            size_t bytes = sp_tr_bytes(t, SP_BUF_INPUT, i % t->nin);
            memcpy(ptr, mine[i], bytes);
            t->host_bytes += bytes;
            st = sp_exec_buf_release(t->h_input[i]);
        }
    if (st) return st;

    const sp_plan *pl = t->plan;
    const sp_instr *prog = pl->instr[t->actor];
    int n = pl->ninstr[t->actor];
    int world = sp_exec_size();
    if (!t->link_base && (!(t->link_base = calloc((size_t)world, sizeof *t->link_base)) ||
                          !(t->link_step = calloc((size_t)world, sizeof *t->link_step))))
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int r = 0; r < world; r++) t->link_base[r] = sp_exec_bytes_sent_to(r);
    if ((st = sp_exec_begin_step())) return st;
    st = sp_tr_walk_pipeline(t);
    if (st) { /* a local submission error the peers cannot know of: the step is lost */
        sp_exec_cancel_step();
        return st;
    }
    sp_status end = sp_exec_end_step();
    if (end) return end;
    sp_run_measure run = { 0 };
    if (t->o.trace && ((st = sp_tr_record_events(t)) || (st = sp_tr_gather_times(t)) ||
                       (st = sp_plan_measure(pl, t->model,
                                             (const double *const *)t->tstart,
                                             (const double *const *)t->tend, &run)) ||
                       (st = sp_tr_profile_step(t))))
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
        if (!sp_tr_is_update_phase(in)) continue;
        st = in->op == SP_OP_OPTIMIZER ? sp_tr_do_optimizer(t, in->stage, scale)
                                       : sp_tr_do_transfer(t, in);
    }
    if (st) {
        sp_exec_cancel_step();
        return st;
    }
    end = sp_exec_end_step();
    if (end) return end;
    sp_tr_profile_update(t);
    for (int r = 0; r < world; r++) t->link_step[r] = sp_exec_bytes_sent_to(r) - t->link_base[r];
    t->steps++;
    if (stats) stats->step_s = now() - t0;
    return SP_OK;
}
