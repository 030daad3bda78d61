/* CUDA task functions of the trainer: the counterparts of codelets/stage.c, run by a
 * StarPU CUDA worker on its stream with its cuBLAS handle. Built only with CUDA. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "codelets/cuda/kernels_cuda.h"
#include "codelets/cuda/program_cuda.h"
#include "codelets/stage.h"

/* TF32 tensor cores are opt-in (STARPIPE_TF32=1, exactly; the apps refuse other values
 * before anything starts): exact fp32 otherwise. */
static void *handle(void)
{
    void *h = sp_stage_cublas_handle();
    static int tf32 = -1;
    if (tf32 < 0) {
        const char *v = getenv("STARPIPE_TF32");
        tf32 = v && strcmp(v, "1") == 0;
    }
    if (h) sp_cuda_set_tf32(h, tf32);
    return h;
}

int sp_stage_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                       void *stream)
{
    (void)counts;
    (void)nbufs;
    const sp_stage_task_args *a = args;
    int rc = sp_stage_task_fault(a);
    if (rc) return rc;
    sp_run_args run = { .dloss = a->dloss };
    return sp_stage_task_done(a, sp_program_run_cuda(a->prog, a->stage, (sp_task_kind)a->kind,
                                                     bufs, &run, stream, handle()));
}

int sp_copy_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                      void *stream)
{
    (void)counts;
    (void)nbufs;
    const sp_copy_task_args *a = args;
    cudaError_t e = cudaMemcpyAsync((float *)bufs[0] + a->dst_off,
                                    (const float *)bufs[1] + a->src_off,
                                    (size_t)a->n * sizeof(float), cudaMemcpyDeviceToDevice,
                                    (cudaStream_t)stream);
    return e == cudaSuccess ? 0 : (int)e;
}

int sp_combine_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                         void *stream)
{
    (void)counts;
    const sp_combine_task_args *a = args;
    for (int j = 1; j < nbufs; j++) {
        int rc = sp_cuda_scale_backward((float *)bufs[0] + a->dst_off,
                                        (const float *)bufs[j] + a->src_off[j], 1.0f, a->n, 1,
                                        stream);
        if (rc) return rc;
    }
    return 0;
}

int sp_reduce_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                        void *stream)
{
    (void)counts;
    const sp_reduce_task_args *a = args;
    return sp_cuda_reduce_replicas((float *)bufs[0] + a->dst_off, (const float *const *)bufs + 1,
                                   nbufs, a->own, a->n, stream);
}

int sp_zero_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                      void *stream)
{
    (void)nbufs, (void)args;
    return sp_cuda_fill_zero(bufs[0], (int64_t)counts[0], stream);
}

int sp_sumsq_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                       void *stream)
{
    (void)nbufs;
    const sp_sumsq_task_args *a = args;
    int rc = sp_cuda_fill_zero(bufs[1], 2 * (int64_t)counts[1], stream); /* doubles: +0.0 */
    if (rc) return rc;
    sp_cuda_ctx c = { stream, NULL };
    sp_status st = sp_optim_param_sumsq_on(a->prog, a->stage, a->lo, a->hi, bufs[0], bufs[1],
                                           sp_backend_cuda(), &c);
    if (st != SP_OK) {
        fprintf(stderr, "starpipe: %s\n", sp_last_error());
        return (int)st;
    }
    return 0;
}

int sp_local_add_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                           void *stream)
{
    (void)counts;
    (void)nbufs;
    const sp_local_add_task_args *a = args;
    const int64_t *adds;
    int n = sp_program_local_adds(a->prog, a->stage, &adds);
    float *g = bufs[0];
    for (int j = 0; j < n; j++) {
        int rc = sp_cuda_scale_backward(g + adds[3 * j], g + adds[3 * j + 1], 1.0f,
                                        adds[3 * j + 2], 1, stream);
        if (rc) return rc;
    }
    return 0;
}

int sp_optim_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                       void *stream)
{
    (void)counts;
    (void)nbufs;
    const sp_optim_task_args *a = args;
    sp_cuda_ctx c = { stream, NULL }; /* this shard of the stage (all of it unsharded) */
    int64_t lo, hi;
    sp_optim_task_range(a, &lo, &hi);
    sp_status st = sp_optim_update_range_on(a->prog, a->stage, lo, hi, bufs[0], bufs[1],
                                            bufs[2], bufs[3], &a->opt, a->grad_scale, a->t,
                                            sp_backend_cuda(), &c);
    if (st != SP_OK) {
        fprintf(stderr, "starpipe: %s\n", sp_last_error());
        return (int)st;
    }
    return 0;
}
