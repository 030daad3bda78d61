/* Stage programs and the optimizer on a GPU (program_cuda.c): the CUDA counterparts of
 * sp_program_run and sp_optim_update, for the trainer's CUDA task functions. Pointers
 * are device pointers; everything is enqueued on `stream`, `cublas` bound to it. */
#ifndef STARPIPE_PROGRAM_CUDA_H
#define STARPIPE_PROGRAM_CUDA_H

#include "starpipe/optim.h"
#include "starpipe/program.h"

sp_status sp_program_run_cuda(const sp_program *p, int stage, sp_task_kind kind,
                              void *const *bufs, const sp_run_args *args, void *stream,
                              void *cublas);

sp_status sp_optim_update_cuda(const sp_program *p, int stage, float *params,
                               const float *grads, float *m, float *v,
                               const sp_adamw_config *cfg, float grad_scale, int t,
                               void *stream);

#endif
