/* The CUDA kernel backend (program_cuda.c): the table of include/starpipe/backend.h on
 * the kernels of kernels_cuda.h, and the calls the trainer's CUDA task functions make.
 * Pointers are device pointers; everything is enqueued on the context's stream. */
#ifndef STARPIPE_PROGRAM_CUDA_H
#define STARPIPE_PROGRAM_CUDA_H

#include "starpipe/backend.h"
#include "starpipe/optim.h"
#include "starpipe/program.h"

/* The backend's ctx: a cudaStream_t and a cublasHandle_t bound to it (NULL is fine for
 * AdamW, which uses no cuBLAS). */
typedef struct {
    void *stream;
    void *cublas;
} sp_cuda_ctx;
const sp_backend *sp_backend_cuda(void);

/* sp_program_run and sp_optim_update on the CUDA backend. */
sp_status sp_program_run_cuda(const sp_program *p, int stage, sp_task_kind kind,
                              void *const *bufs, const sp_run_args *args, void *stream,
                              void *cublas);
sp_status sp_optim_update_cuda(const sp_program *p, int stage, float *params,
                               const float *grads, float *m, float *v,
                               const sp_adamw_config *cfg, float grad_scale, int t,
                               void *stream);

#endif
