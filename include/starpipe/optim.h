/* The optimizer step on stage slabs, shared by the reference interpreter and the runtime
 * so that both perform the same float operations in the same order:
 *   1. combine: a parameter used by several stages (tied weights) has one gradient
 *      accumulator per stage; the owner (lowest stage) adds the others, ascending;
 *   2. clip: the global gradient norm is the square root of the per-stage sums of
 *      squares (double, over owned parameters), added in stage order;
 *   3. AdamW on each owned parameter; copies in other stages then take the owner's values.
 * Weight decay applies to parameters of two or more dims only (not biases, norms). */
#ifndef STARPIPE_OPTIM_H
#define STARPIPE_OPTIM_H

#include "starpipe/program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float lr;           /* 3e-4 */
    float beta1, beta2; /* 0.9, 0.95 */
    float eps;          /* 1e-8 */
    float weight_decay; /* 0.1 */
    float grad_clip;    /* clip the global norm to this; 0 = off (default 1.0) */
    int skip_nonfinite; /* on a non-finite loss or gradient: 1 skips the update (the step
                           does not count), 0 (default) fails with SP_ERR_NUMERIC */
} sp_adamw_config;

void sp_adamw_defaults(sp_adamw_config *cfg);

/* ---- learning-rate schedule ----
 * The learning rate of a step is a pure function of the step number, so a run resumed
 * from a checkpoint at step k continues with the bits the uninterrupted run would have
 * used: nothing but the schedule's fields and the step enter it. With steps numbered
 * from 1, W = warmup, T = total, lr the peak and lr_min the floor:
 *   step <= W:              lr * step / W                       (linear warmup)
 *   decay NONE, step > W:   lr
 *   else, with x = min(1, (step - W) / (T - W))  (x = 1 when T <= W):
 *     COSINE:               lr_min + (lr - lr_min) * (1 + cos(pi x)) / 2
 *     LINEAR:               lr_min + (lr - lr_min) * (1 - x)
 * so the rate reaches lr at step W and lr_min at step T, and stays there after T.
 * Computed in double and rounded once to float; every rank computes it itself, so ranks
 * agree as they agree on the kernels' libm calls (the same libm). */
typedef enum { SP_LR_DECAY_NONE = 0, SP_LR_DECAY_COSINE, SP_LR_DECAY_LINEAR } sp_lr_decay;
typedef struct {
    float lr;          /* peak (the constant rate when warmup = 0 and decay NONE) */
    float lr_min;      /* floor the decay ends at */
    int warmup;        /* W steps of linear warmup; 0: none */
    int total;         /* T: the step at which the decay reaches lr_min (its horizon) */
    sp_lr_decay decay;
} sp_lr_schedule;

float sp_lr_at(const sp_lr_schedule *s, int step);
/* "none", "cosine", "linear"; sp_lr_decay_parse returns -1 for another name. */
const char *sp_lr_decay_name(sp_lr_decay d);
int sp_lr_decay_parse(const char *name);

/* owner_grads (GRADS of the owner stage) += other_grads (GRADS of stage `other`) for every
 * parameter the two stages share. */
void sp_optim_combine(const sp_program *p, int owner, float *owner_grads, int other,
                      const float *other_grads);

/* Sum of squares, in double, of the gradients of the parameters stage s owns. */
double sp_optim_sumsq(const sp_program *p, int s, const float *grads);

/* ---- shards of a stage (replicas, sharded optimizer) ----
 * The R replicas of a stage split its PARAMS slab into R shards: contiguous float ranges
 * [bounds[c], bounds[c+1]) made of whole tensors, each cut placed at the tensor start
 * nearest to c/R of the slab (a shard may be empty). Replica c reduces shard c of the
 * gradients, and with a sharded optimizer keeps the AdamW moments of shard c only.
 * bounds: R + 1 entries; bounds[0] = 0, bounds[R] = the PARAMS floats. */
void sp_optim_shards(const sp_program *p, int s, int R, int64_t *bounds);

/* The sum of squares of each parameter that stage s owns and that lies in [lo, hi):
 * sumsq[i] for graph parameter i (sp_graph_param order); others untouched. Folding them
 * with sp_optim_fold_sumsq gives sp_optim_sumsq bit for bit, however the stage is
 * sharded, so the global norm does not depend on R or on sharding. */
void sp_optim_param_sumsq(const sp_program *p, int s, int64_t lo, int64_t hi,
                          const float *grads, double *sumsq);
double sp_optim_fold_sumsq(const sp_program *p, int s, const double *sumsq);
/* sp_optim_param_sumsq on a backend (backend.h): sumsq in the backend's memory. */
sp_status sp_optim_param_sumsq_on(const sp_program *p, int s, int64_t lo, int64_t hi,
                                  const float *grads, double *sumsq, const sp_backend *be,
                                  void *ctx);

/* Tensor parallelism: the norm counts each split parameter's gradient once, whole. terms
 * (sp_optim_param_sumsq's, of stage s, np doubles): each split parameter's term becomes
 * the sum over the group of its parts' terms, in rank order (sp_tp_group's sum_f64);
 * the others, whole on every rank with the same bits, stay. _group_sumsq: a stage's sum
 * of squares so, sp_optim_sumsq's over the group (grads: host memory). */
sp_status sp_optim_group_terms(const sp_program *p, int s, double *terms, sp_tp_group *g);
sp_status sp_optim_group_sumsq(const sp_program *p, int s, const float *grads, sp_tp_group *g,
                               double *sumsq);

/* Scale for the gradients given the per-stage sums of squares (in stage order):
 * min(1, clip / norm), 1 when clipping is off. *norm gets the global norm. */
float sp_optim_clip_scale(const sp_adamw_config *cfg, const double *stage_sumsq, int nstages,
                          double *norm);

/* The first stage whose gradients are not finite (from the per-stage sums of squares),
 * S - 1 if only the loss is not finite, -1 if all is finite. */
int sp_optim_nonfinite_stage(const double *stage_sumsq, int nstages, float loss);

/* AdamW for the parameters stage s owns, at step t (1-based). m and v are laid out like
 * params (2 slabs of the stage's PARAMS size). */
void sp_optim_update(const sp_program *p, int s, float *params, const float *grads, float *m,
                     float *v, const sp_adamw_config *cfg, float grad_scale, int t);

/* sp_optim_update for the owned parameters in [lo, hi) only (a shard): params and grads
 * are the whole slabs, m and v hold the moments of floats lo..hi-1. Bitwise the same
 * values as the unsharded update (AdamW is elementwise). */
void sp_optim_update_range(const sp_program *p, int s, int64_t lo, int64_t hi, float *params,
                           const float *grads, float *m, float *v, const sp_adamw_config *cfg,
                           float grad_scale, int t);
/* The same on any kernel backend (starpipe/backend.h), the slabs in its memory, ctx its
 * state: sp_optim_update_range is this with sp_backend_cpu(). A failed kernel fails it
 * with a message naming the parameter. */
sp_status sp_optim_update_range_on(const sp_program *p, int s, int64_t lo, int64_t hi,
                                   float *params, const float *grads, float *m, float *v,
                                   const sp_adamw_config *cfg, float grad_scale, int t,
                                   const sp_backend *be, void *ctx);

/* Which of the owned parameters an update takes: all, only the tied ones (held by other
 * stages too, whose copies wait for them), or all but those. TIED then UNTIED is ALL, in
 * another order of tensors: the same bits. */
typedef enum { SP_OPTIM_ALL = 0, SP_OPTIM_TIED = 1, SP_OPTIM_UNTIED = 2 } sp_optim_part;
/* sp_optim_update_range_on for one part of the owned parameters. */
sp_status sp_optim_update_part_on(const sp_program *p, int s, int64_t lo, int64_t hi,
                                  sp_optim_part part, float *params, const float *grads,
                                  float *m, float *v, const sp_adamw_config *cfg,
                                  float grad_scale, int t, const sp_backend *be, void *ctx);

/* Copies the owner's values of every parameter the two stages share into stage `other`. */
void sp_optim_copy_shared(const sp_program *p, int owner, const float *owner_params, int other,
                          float *other_params);

/* 1 if stages a and b share a parameter. */
int sp_optim_stages_share(const sp_program *p, int a, int b);

#ifdef __cplusplus
}
#endif
#endif
