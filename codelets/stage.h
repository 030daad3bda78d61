/* The task functions the trainer submits through the executor (include/starpipe/exec.h):
 * a stage program (F, B, W or BW), and the small tasks around the optimizer. Plain C on
 * host buffers; the executor wraps them in StarPU codelets. */
#ifndef STARPIPE_CODELETS_STAGE_H
#define STARPIPE_CODELETS_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "starpipe/optim.h"
#include "starpipe/program.h"

/* bufs: the program's buffers in sp_program_buf order. */
typedef struct {
    const sp_program *prog;
    int stage;
    int kind; /* sp_task_kind */
    float dloss;
    int fault; /* fault injection (STARPIPE_FAULT): 0 none, 1 fail, 2 hang */
} sp_stage_task_args;
int sp_stage_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args);
/* Shared by the CPU and CUDA versions: an injected fault (non-zero: fail with it; a hang
 * never returns), and the outcome of the program (prints the message on failure). */
int sp_stage_task_fault(const sp_stage_task_args *a);
int sp_stage_task_done(const sp_stage_task_args *a, sp_status st);

/* bufs[0][dst_off..+n) = bufs[1][src_off..+n): a parameter (or its gradient) moved
 * between a stage slab and a transfer buffer. */
typedef struct {
    int64_t dst_off, src_off, n;
} sp_copy_task_args;
int sp_copy_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args);

/* Tied-weight combine on the owner: bufs[0][dst_off..+n) += bufs[j][src_off[j]..+n) for
 * j = 1..nbufs-1, in that order (ascending stage). */
#define SP_COMBINE_MAX 8
typedef struct {
    int64_t dst_off, n;
    int64_t src_off[SP_COMBINE_MAX];
} sp_combine_task_args;
int sp_combine_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args);

/* The sum over replicas of one shard of a stage's gradients: bufs[0] = GRADS, whose
 * floats dst_off..+n hold this replica's values (replica `own`); bufs[1..nbufs-1] the
 * other replicas' values of the same floats, in replica order without `own`. Each float
 * becomes ((x0 + x1) + x2) + ... in replica order. */
typedef struct {
    int64_t dst_off, n;
    int own;
} sp_reduce_task_args;
int sp_reduce_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args);

/* bufs[0] = 0 (all of it, floats): a stage's gradient accumulators at a step's start. */
int sp_zero_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args);

/* The global norm's terms of stage `stage`, where the gradients are: bufs[0] = GRADS,
 * bufs[1] = one double per graph parameter, set to the sum of squares of each parameter
 * the stage owns in [lo, hi) (sp_optim_param_sumsq), 0 for the others. */
typedef struct {
    const sp_program *prog;
    int stage;
    int64_t lo, hi;
} sp_sumsq_task_args;
int sp_sumsq_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args);

/* The local adds of a stage's repeated parameter uses (sp_program_local_adds): bufs =
 * GRADS. */
typedef struct {
    const sp_program *prog;
    int stage;
} sp_local_add_task_args;
int sp_local_add_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args);

/* AdamW of the parameters stage `stage` owns: bufs = PARAMS, GRADS, m, v. With `shard`,
 * only those with slab offsets in [lo, hi), and m and v hold floats lo..hi-1. */
typedef struct {
    const sp_program *prog;
    int stage;
    sp_adamw_config opt;
    float grad_scale;
    int t;
    int shard;
    int64_t lo, hi;
} sp_optim_task_args;
/* The range sp_optim_task_args covers. */
static inline void sp_optim_task_range(const sp_optim_task_args *a, int64_t *lo, int64_t *hi)
{
    *lo = a->shard ? a->lo : 0;
    *hi = a->shard ? a->hi : INT64_MAX;
}
int sp_optim_task_cpu(void *const *bufs, const size_t *counts, int nbufs, const void *args);

/* CUDA versions (codelets/cuda/stage_cuda.c, only in a CUDA build): same arguments, on
 * device buffers, enqueued on the worker's stream. */
/* The calling CUDA worker's cuBLAS handle, bound to its stream. Provided by the layer
 * that runs these functions (runtime/exec.c; a test's own in the CPU emulation), so that
 * codelets/ never includes a runtime header. */
void *sp_stage_cublas_handle(void);
int sp_stage_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                       void *stream);
int sp_copy_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                      void *stream);
int sp_combine_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                         void *stream);
int sp_optim_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                       void *stream);
int sp_reduce_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                        void *stream);
int sp_zero_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                      void *stream);
int sp_sumsq_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                       void *stream);
int sp_local_add_task_cuda(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                           void *stream);

#endif
