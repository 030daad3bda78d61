/* The task functions the trainer submits through the executor (include/starpipe/exec.h),
 * one per kind: a stage program (F, B, W or BW) and the small tasks around it (copy,
 * tied-weight combine, the replicas' reduce, zero, the norm's sums of squares, local
 * adds, AdamW). Each is written once against the device the executor hands it
 * (sp_device, starpipe/backend.h: the worker's kernel table and its state), so the CPU
 * and every GPU run the same code; only the tables differ (codelets/cpu, codelets/cuda).
 *
 * Every function has the executor's task signature (sp_task_fn): the device, the task's
 * buffers in the order given at submission, their element counts, and its argument
 * struct. It returns 0, or a non-zero code that fails the step (the message is printed
 * here, since it lives in the worker's thread). */
#ifndef STARPIPE_CODELETS_TASKS_H
#define STARPIPE_CODELETS_TASKS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "starpipe/backend.h"
#include "starpipe/optim.h"
#include "starpipe/program.h"

#define SP_TASK_FN(name) \
    int name(const sp_device *dev, void *const *bufs, const size_t *counts, int nbufs, \
             const void *args)

/* The seconds of each instruction of one stage program, summed over the runs timed
 * (sp_train_opts.profile): a CPU task times its instructions into an array of its own
 * and adds it here under the lock, so tasks on several workers never mix their sums. */
typedef struct sp_op_clock {
    pthread_mutex_t lock;
    double *sum; /* [nops] */
    int nops;
    int64_t runs;
} sp_op_clock;

/* A stage program: bufs in sp_program_buf order. fault: injected by tests
 * (STARPIPE_FAULT), 0 none, 1 fail, 2 hang, 5 its first tensor-group all-reduce fails
 * on this member alone (group@). clock: NULL, or where a CPU run adds its
 * instructions' times. */
typedef struct {
    const sp_program *prog;
    int stage;
    int kind; /* sp_task_kind */
    float dloss;
    int fault;
    sp_op_clock *clock;
} sp_stage_task_args;
SP_TASK_FN(sp_stage_task);

/* bufs[0][dst_off..+n) = bufs[1][src_off..+n): a parameter (or its gradient) moved
 * between a stage slab and a transfer buffer. */
typedef struct {
    int64_t dst_off, src_off, n;
} sp_copy_task_args;
SP_TASK_FN(sp_copy_task);

/* Scatter-gather's receiving half: bufs[0] (a boundary buffer, whole) gets bufs[1] (the
 * n floats of the chunk this member received, sp_tp_chunk's, at float lo), then the tensor group's
 * all-gather brings every other member's chunk. A task of the tensor group: it meets the
 * group even when the step is lost. */
typedef struct {
    int64_t lo, n;
} sp_gather_task_args;
SP_TASK_FN(sp_gather_task);

/* Tied-weight combine on the owner: bufs[0][dst_off..+n) += bufs[j][src_off[j]..+n) for
 * j = 1..nbufs-1, in that order (ascending stage). */
#define SP_COMBINE_MAX 8
typedef struct {
    int64_t dst_off, n;
    int64_t src_off[SP_COMBINE_MAX];
} sp_combine_task_args;
SP_TASK_FN(sp_combine_task);

/* The sum over replicas of one shard of a stage's gradients: bufs[0] = GRADS, whose
 * floats dst_off..+n hold this replica's values (replica `own`); bufs[1..nbufs-1] the
 * other replicas' values of the same floats, in replica order without `own`. Each float
 * becomes ((x0 + x1) + x2) + ... in replica order. */
typedef struct {
    int64_t dst_off, n;
    int own;
} sp_reduce_task_args;
SP_TASK_FN(sp_reduce_task);

/* bufs[0] = 0 (all of it, floats): a stage's gradient accumulators at a step's start. No
 * arguments. */
SP_TASK_FN(sp_zero_task);

/* The global norm's terms of stage `stage`, where the gradients are: bufs[0] = GRADS,
 * bufs[1] = one double per graph parameter, set to the sum of squares of each parameter
 * the stage owns in [lo, hi) (sp_optim_param_sumsq), 0 for the others. */
typedef struct {
    const sp_program *prog;
    int stage;
    int64_t lo, hi;
} sp_sumsq_task_args;
SP_TASK_FN(sp_sumsq_task);

/* The local adds of a stage's repeated parameter uses (sp_program_local_adds): bufs =
 * GRADS. */
typedef struct {
    const sp_program *prog;
    int stage;
} sp_local_add_task_args;
SP_TASK_FN(sp_local_add_task);

/* AdamW of the parameters stage `stage` owns: bufs = PARAMS, GRADS, m, v. With `shard`,
 * only those with slab offsets in [lo, hi), and m and v hold floats lo..hi-1; `part`
 * (sp_optim_part) picks the tied ones, the others, or all. */
typedef struct {
    const sp_program *prog;
    int stage;
    sp_adamw_config opt;
    float grad_scale;
    int t;
    int shard;
    int64_t lo, hi;
    int part;
} sp_optim_task_args;
SP_TASK_FN(sp_optim_task);

#endif
