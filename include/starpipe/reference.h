/* The reference interpreter: one training step in one process, no StarPU. Microbatches
 * run in order (F of every stage, then BW of every stage in reverse), gradients
 * accumulate in microbatch order, then the optimizer step of optim.h. It is the ground
 * truth every pipelined run is compared with, bit for bit. */
#ifndef STARPIPE_REFERENCE_H
#define STARPIPE_REFERENCE_H

#include <stdint.h>

#include "starpipe/optim.h"
#include "starpipe/program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sp_reference sp_reference;

/* ---- Tensor parallelism: the reference of a group of T ranks in one process ----
 * Each member's reference runs its own graph (sp_graph_set_tensor) in a thread of its
 * own, joined to the others by an in-process group: every all-reduce meets there and
 * sums in the group's order (program.h, sp_tp_group), so `--reference --tensor T` is the
 * ground truth of a run at T. A member that fails calls sp_tp_local_abort so that the
 * others leave their next all-reduce with an error instead of waiting. */
typedef struct sp_tp_local sp_tp_local;
sp_tp_local *sp_tp_local_create(int T);
void sp_tp_local_free(sp_tp_local *l);
sp_tp_group *sp_tp_local_member(sp_tp_local *l, int rank);
void sp_tp_local_abort(sp_tp_local *l);
/* Runs fn(q, arg) for every member q at once, member 0 on the calling thread and each
 * other in a thread of its own, and returns when all have: SP_OK, or the first failure's
 * status and message (a member that fails aborts the group, so the others return too).
 * The group is ready for the next run. */
sp_status sp_tp_local_run(sp_tp_local *l, sp_status (*fn)(int q, void *arg), void *arg);
/* The group the reference's programs and its gradient norm use (NULL: none, T = 1). */
void sp_reference_set_group(sp_reference *r, sp_tp_group *g);

/* Parameters are initialised from seed (sp_param_init_values). */
sp_reference *sp_reference_create(const sp_program *p, int microbatches,
                                  const sp_adamw_config *opt, uint64_t seed, sp_status *status);
void sp_reference_free(sp_reference *r);
/* Data parallelism as the trainer runs it (train.h, opts.replicas): a step then takes
 * R x m microbatches. Replica q's gradients accumulate from zero over microbatches q m ..
 * q m + m - 1 (then its repeated uses and tied stages are combined, as one pipeline
 * does), each microbatch's loss seeded with 1 / (R m); the step's gradients are the
 * replicas' summed in replica order, ((g0 + g1) + g2) + ..., element by element, and the
 * loss is the mean over all R m microbatches. R = 1 is the plain step. */
sp_status sp_reference_set_replicas(sp_reference *r, int replicas);
const sp_program *sp_reference_program(const sp_reference *r);

/* inputs[i * ninputs + k]: microbatch i's slice of graph input k (sp_program_input order).
 * Computes the mean loss over the microbatches and the gradients, without updating. */
sp_status sp_reference_forward_backward(sp_reference *r, const void *const *inputs,
                                        float *loss);
/* Evaluation: the mean loss of K microbatches (inputs[i * ninputs + k], i < K), forward
 * only: F of every stage, microbatch by microbatch, the losses summed in microbatch order
 * in double, as a step's loss is. Gradients, parameters and the last step's losses stay
 * as they were. The ground truth of sp_trainer_eval, bit for bit, for any replicas (the
 * mean over K does not depend on how the trainer shares them out). */
sp_status sp_reference_eval(sp_reference *r, int K, const void *const *inputs, float *loss);
/* The value of a computed tensor (one named with sp_graph_name, say) after the last
 * forward pass, of its last microbatch: numel floats, valid until the next run. NULL for
 * parameters and inputs, for values a program stores as bf16
 * (sp_program_set_bf16_activations), and for unnamed values no backward program reads
 * (they live in SCRATCH, not kept after F; a named one and the loss always are). */
const float *sp_reference_value(const sp_reference *r, sp_tensor t);

/* forward_backward, then the optimizer step. A non-finite loss or gradient fails with
 * SP_ERR_NUMERIC naming the step and stage, or skips the update (opt.skip_nonfinite). */
sp_status sp_reference_step(sp_reference *r, const void *const *inputs, float *loss);
/* 1 if the last step's update was skipped for a non-finite loss or gradient. */
int sp_reference_last_skipped(const sp_reference *r);

/* Each stage task run alone on microbatch 0 of inputs, in reps passes over all of them:
 * secs[s * SP_NUM_TASK_KINDS + kind] is the median time of task (kind, stage) in
 * seconds, for F, B, W and BW. Uncontended task costs for the planner's simulator. Changes the gradient
 * accumulators (not the parameters): run it on a reference kept for timing. */
sp_status sp_reference_task_times(sp_reference *r, const void *const *inputs, int reps,
                                  double *secs);

/* The owner's copy of a parameter, and its combined gradient of the last step (after
 * sp_reference_forward_backward; before clipping). numel floats each. */
const float *sp_reference_param(const sp_reference *r, sp_tensor param);
const float *sp_reference_grad(const sp_reference *r, sp_tensor param);
/* Sets a parameter in every stage that holds a copy (for finite differences, loading). */
sp_status sp_reference_set_param(sp_reference *r, sp_tensor param, const float *values);
/* Sets a parameter's value (what 0) or AdamW moment m (2) or v (3) in every stage that
 * holds it, and the step count: for loading checkpoints. */
sp_status sp_reference_store(sp_reference *r, sp_tensor param, int what, const float *values);
void sp_reference_set_steps_done(sp_reference *r, int steps);
/* The learning rate of the next steps (opt->lr until set), as sp_trainer_set_lr. */
void sp_reference_set_lr(sp_reference *r, float lr);
/* The owner's AdamW moment m (which 0) or v (1) of a parameter. */
const float *sp_reference_param_moment(const sp_reference *r, sp_tensor param, int which);
/* Losses of each microbatch of the last step (R x m with replicas). */
const float *sp_reference_microbatch_losses(const sp_reference *r);
/* The global gradient norm of the last optimizer step. */
double sp_reference_grad_norm(const sp_reference *r);
int sp_reference_steps_done(const sp_reference *r);

/* Stage slabs, for comparisons with a pipelined run: PARAMS, GRADS (combined on the
 * owner after a step), and the AdamW moments m and v. EDGE_FWD and EDGE_GRAD: `stage`
 * is the edge, its buffer as the last microbatch left it. */
float *sp_reference_slab(sp_reference *r, sp_buf_class cls, int stage);
float *sp_reference_moment(sp_reference *r, int which /* 0 = m, 1 = v */, int stage);

#ifdef __cplusplus
}
#endif
#endif
