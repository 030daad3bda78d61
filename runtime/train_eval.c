/* Evaluation (sp_trainer_eval): the forward-only plan walked as one executor step, and
 * its loss averaged over every replica's microbatches in order. */
#include <stdlib.h>
#include <string.h>

#include "runtime/exec_impl.h" /* the collectives named for the watchdog */
#include "runtime/trainer_impl.h"

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
sp_status sp_tr_walk_eval(sp_trainer *t)
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
        case SP_OP_RUN: st = sp_tr_do_run(t, &in->task, i); break;
        case SP_OP_SEND:
        case SP_OP_RECV: st = sp_tr_do_transfer(t, in); break;
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
            memcpy(ptr, mine[i], sp_tr_bytes(t, SP_BUF_INPUT, i % t->nin));
            st = sp_exec_buf_release(t->h_input[i]);
        }
    if (st) return st;
    if ((st = sp_exec_begin_step())) return st;
    st = sp_tr_walk_eval(t);
    if (st) { /* a local submission error the peers cannot know of */
        sp_exec_cancel_step();
        return st;
    }
    if ((st = sp_exec_end_step())) return st;
    return eval_loss(t, loss);
}
