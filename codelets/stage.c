/* Task functions of the trainer: stage programs and the optimizer's helpers. They run on
 * StarPU workers; a non-zero return fails the step (the executor reports it on every
 * rank), with the program's message printed here since it lives in this thread. */
#include "codelets/stage.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

int sp_stage_task_fault(const sp_stage_task_args *a)
{
    if (a->fault == 1) {
        fprintf(stderr, "starpipe: stage %d task failed: injected failure (STARPIPE_FAULT)\n",
                a->stage);
        return 99;
    }
    while (a->fault == 2) sleep(60); /* injected hang: only the watchdog or a kill ends it */
    return 0;
}

int sp_stage_task_done(const sp_stage_task_args *a, sp_status st)
{
    if (st == SP_OK) return 0;
    fprintf(stderr, "starpipe: stage %d task failed: %s\n", a->stage, sp_last_error());
    return (int)st;
}

int sp_stage_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args)
{
    (void)counts;
    (void)nbufs;
    const sp_stage_task_args *a = args;
    int rc = sp_stage_task_fault(a);
    if (rc) return rc;
    sp_run_args run = { .dloss = a->dloss };
    return sp_stage_task_done(a, sp_program_run(a->prog, a->stage, (sp_task_kind)a->kind, bufs,
                                                &run));
}

int sp_copy_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args)
{
    (void)counts;
    (void)nbufs;
    const sp_copy_task_args *a = args;
    memcpy((float *)bufs[0] + a->dst_off, (const float *)bufs[1] + a->src_off,
           (size_t)a->n * sizeof(float));
    return 0;
}

int sp_combine_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args)
{
    (void)counts;
    const sp_combine_task_args *a = args;
    float *dst = (float *)bufs[0] + a->dst_off;
    for (int j = 1; j < nbufs; j++) {
        const float *src = (const float *)bufs[j] + a->src_off[j];
        for (int64_t i = 0; i < a->n; i++) dst[i] += src[i];
    }
    return 0;
}

int sp_reduce_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args)
{
    (void)counts;
    const sp_reduce_task_args *a = args;
    float *dst = (float *)bufs[0] + a->dst_off;
    /* x_q is this rank's own values at q == own, else the next other replica's buffer;
     * blocks of a stack buffer so that each pass is a plain vectorisable loop */
    enum { BLOCK = 1024 };
    float acc[BLOCK];
    for (int64_t i0 = 0; i0 < a->n; i0 += BLOCK) {
        int64_t n = a->n - i0 < BLOCK ? a->n - i0 : BLOCK;
        for (int q = 0, j = 1; q < nbufs; q++) {
            const float *x = q == a->own ? dst + i0 : (const float *)bufs[j++] + i0;
            if (q == 0) memcpy(acc, x, (size_t)n * sizeof(float));
            else
                for (int64_t i = 0; i < n; i++) acc[i] += x[i];
        }
        memcpy(dst + i0, acc, (size_t)n * sizeof(float));
    }
    return 0;
}

int sp_zero_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args)
{
    (void)nbufs, (void)args;
    memset(bufs[0], 0, counts[0] * sizeof(float));
    return 0;
}

int sp_sumsq_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args)
{
    (void)nbufs;
    const sp_sumsq_task_args *a = args;
    memset(bufs[1], 0, counts[1] * sizeof(double)); /* registered with 8-byte elements */
    sp_optim_param_sumsq(a->prog, a->stage, a->lo, a->hi, bufs[0], bufs[1]);
    return 0;
}

int sp_local_add_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args)
{
    (void)counts;
    (void)nbufs;
    const sp_local_add_task_args *a = args;
    sp_program_local_add_run(a->prog, a->stage, bufs[0]);
    return 0;
}

int sp_optim_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args)
{
    (void)counts;
    (void)nbufs;
    const sp_optim_task_args *a = args;
    int64_t lo, hi;
    sp_optim_task_range(a, &lo, &hi);
    sp_optim_update_range(a->prog, a->stage, lo, hi, bufs[0], bufs[1], bufs[2], bufs[3], &a->opt,
                          a->grad_scale, a->t);
    return 0;
}
