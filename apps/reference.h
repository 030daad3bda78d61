/* The apps' reference interpreter (reference.c): one sp_reference, or with tensor
 * parallelism the T members of the group, each on its own graph, run together in threads
 * and joined by the in-process group (starpipe/reference.h, sp_tp_local), so that
 * `--reference --tensor T` is the ground truth of a run at T, and --check compares each
 * rank with its member. Parameters come and go as whole tensors (checkpoints). */
#ifndef STARPIPE_APP_REFERENCE_H
#define STARPIPE_APP_REFERENCE_H

#include "apps/checkpoint.h"
#include "apps/options.h"
#include "starpipe/reference.h"

/* The stage programs of g as the options ask: precision, recomputation and, for a
 * trainer (trainer = 1), bf16 storage of the activations only matrix products read; the
 * reference interpreter keeps them in fp32. NULL with *st set on failure. */
sp_program *app_program(const sp_graph *g, const sp_app_opts *o, int trainer, sp_status *st);

typedef struct app_ref app_ref;
/* T members (T >= 1) of the model cut into `stages`, each a reference of nmb microbatches
 * per replica and R replicas. */
app_ref *app_ref_create(sp_app_model *m, const sp_app_opts *o, int stages, int T, int nmb,
                        int R, const sp_adamw_config *opt, sp_status *st);
void app_ref_free(app_ref *a);
int app_ref_size(const app_ref *a);
/* Member q's reference, graph and program (member 0's graph has the parameter names and
 * whole shapes a checkpoint holds). */
sp_reference *app_ref_member(app_ref *a, int q);
const sp_graph *app_ref_graph(const app_ref *a, int q);
const sp_program *app_ref_program(const app_ref *a, int q);
/* A step, an evaluation: every member at once; the loss is the group's (every member's
 * is the same). */
sp_status app_ref_step(app_ref *a, const void *const *inputs, float *loss);
sp_status app_ref_eval(app_ref *a, int K, const void *const *inputs, float *loss);
void app_ref_set_lr(app_ref *a, float lr);
void app_ref_set_steps_done(app_ref *a, int steps);
/* Checkpoint access (checkpoint.h) in whole tensors; p is a parameter of member 0's graph. */
ckpt_io app_ref_io(app_ref *a, int writer);

#endif
