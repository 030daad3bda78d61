/* The trainer's task functions (tasks.h), each once for every device: the work goes
 * through the device's kernel table, never a device of its own. A non-zero return fails
 * the step (the executor reports it on every rank), with the message printed here since
 * it lives in this thread. */
#include "codelets/tasks.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* A failed kernel: its code, with the backend's name for it. */
static int kernel_failed(const sp_device *dev, const char *task, int rc)
{
    fprintf(stderr, "starpipe: %s task failed on %s: %s\n", task, dev->be->name,
            dev->be->status_string(rc));
    return rc;
}

/* A failed program or optimizer loop: its message. */
static int failed(const char *what, int stage, sp_status st)
{
    if (st == SP_OK) return 0;
    fprintf(stderr, "starpipe: %s %d task failed: %s\n", what, stage, sp_last_error());
    return (int)st;
}

SP_TASK_FN(sp_stage_task)
{
    (void)counts, (void)nbufs;
    const sp_stage_task_args *a = args;
    sp_run_args run = { .dloss = a->dloss, .group = dev->group,
                        .meet_only = dev->meet_only || a->fault == 1 };
    if (a->fault == 1) {
        fprintf(stderr, "starpipe: stage %d task failed: injected failure (STARPIPE_FAULT)\n",
                a->stage);
        if (run.group) /* its group still meets it */
            sp_program_run_on(a->prog, a->stage, (sp_task_kind)a->kind, bufs, &run, dev->be,
                              dev->ctx);
        return 99;
    }
    while (a->fault == 2) sleep(60); /* injected hang: only the watchdog or a kill ends it */
    if (a->fault == 5 && run.group) run.group->fail_next = 1; /* group@: in the group's code */
    sp_op_clock *c = a->clock && dev->type == SP_DEVICE_CPU && !run.meet_only ? a->clock : NULL;
    if (c && !(run.op_seconds = calloc((size_t)c->nops + 1, sizeof(double)))) c = NULL;
    sp_status st = sp_program_run_on(a->prog, a->stage, (sp_task_kind)a->kind, bufs, &run,
                                     dev->be, dev->ctx);
    if (c && st == SP_OK) {
        pthread_mutex_lock(&c->lock);
        for (int j = 0; j < c->nops; j++) c->sum[j] += run.op_seconds[j];
        c->runs++;
        pthread_mutex_unlock(&c->lock);
    }
    free(run.op_seconds);
    return run.meet_only ? 0 : failed("stage", a->stage, st);
}

SP_TASK_FN(sp_copy_task)
{
    (void)counts, (void)nbufs;
    const sp_copy_task_args *a = args;
    int rc = dev->be->copy(dev->ctx, (float *)bufs[0] + a->dst_off,
                           (const float *)bufs[1] + a->src_off, a->n);
    return rc ? kernel_failed(dev, "copy", rc) : 0;
}

SP_TASK_FN(sp_gather_task)
{
    (void)nbufs;
    const sp_gather_task_args *a = args;
    sp_tp_group *g = dev->group;
    if (!g || !g->allgather) {
        fprintf(stderr, "starpipe: gather task without a tensor group\n");
        return 1;
    }
    int rc = dev->meet_only ? 0 /* the step is lost: only meet the group */
                            : dev->be->copy(dev->ctx, (float *)bufs[0] + a->lo,
                                            (const float *)bufs[1], a->n);
    int grc = g->allgather(g, (float *)bufs[0], (int64_t)counts[0]);
    if (rc) return kernel_failed(dev, "gather", rc);
    if (grc)
        fprintf(stderr, "starpipe: gather task failed: %s\n", g->status_string(g, grc));
    return grc;
}

SP_TASK_FN(sp_combine_task)
{
    (void)counts;
    const sp_combine_task_args *a = args;
    for (int j = 1; j < nbufs; j++) { /* += 1 x, in stage order: exact adds */
        int rc = dev->be->scale(dev->ctx, (float *)bufs[0] + a->dst_off,
                                (const float *)bufs[j] + a->src_off[j], 1.0f, a->n, 1);
        if (rc) return kernel_failed(dev, "combine", rc);
    }
    return 0;
}

SP_TASK_FN(sp_reduce_task)
{
    (void)counts;
    const sp_reduce_task_args *a = args;
    int rc = dev->be->reduce_replicas(dev->ctx, (float *)bufs[0] + a->dst_off,
                                      (const float *const *)bufs + 1, nbufs, a->own, a->n);
    return rc ? kernel_failed(dev, "reduce", rc) : 0;
}

SP_TASK_FN(sp_zero_task)
{
    (void)nbufs, (void)args;
    int rc = dev->be->zero(dev->ctx, bufs[0], (int64_t)counts[0]);
    return rc ? kernel_failed(dev, "zero", rc) : 0;
}

SP_TASK_FN(sp_sumsq_task)
{
    (void)nbufs;
    const sp_sumsq_task_args *a = args;
    /* one double per parameter (registered with 8-byte elements): +0.0 is all zero bits */
    int rc = dev->be->zero(dev->ctx, bufs[1], 2 * (int64_t)counts[1]);
    if (rc) return kernel_failed(dev, "sum of squares", rc);
    return failed("sum of squares of stage", a->stage,
                  sp_optim_param_sumsq_on(a->prog, a->stage, a->lo, a->hi, bufs[0], bufs[1],
                                          dev->be, dev->ctx));
}

SP_TASK_FN(sp_local_add_task)
{
    (void)counts, (void)nbufs;
    const sp_local_add_task_args *a = args;
    return failed("local add of stage", a->stage,
                  sp_program_local_add_run_on(a->prog, a->stage, bufs[0], dev->be, dev->ctx));
}

SP_TASK_FN(sp_optim_task)
{
    (void)counts, (void)nbufs;
    const sp_optim_task_args *a = args;
    int64_t lo = a->shard ? a->lo : 0, hi = a->shard ? a->hi : INT64_MAX;
    return failed("AdamW of stage", a->stage,
                  sp_optim_update_part_on(a->prog, a->stage, lo, hi, (sp_optim_part)a->part,
                                          bufs[0], bufs[1], bufs[2], bufs[3], &a->opt,
                                          a->grad_scale, a->t, dev->be, dev->ctx));
}
