/* Checkpoints and gradient dumps of the apps, in the safetensors format: one tensor per
 * parameter under its graph name, with ".adam_m" and ".adam_v" for the AdamW moments,
 * and metadata starpipe.format, starpipe.model (the model's signature), starpipe.step
 * and starpipe.settings (the flags a resume needs to continue the same run).
 * Parameters are stored by name, not by stage, so a run can resume under another
 * schedule or rank count. Loading checks everything before it sets anything. Tensors are
 * whole (sp_param_full_shape): a run of tensor parallelism T saves and loads the same
 * files as T = 1, and resumes at any other T (ckpt_io moves whole tensors). */
#ifndef STARPIPE_APP_CHECKPOINT_H
#define STARPIPE_APP_CHECKPOINT_H

#include "starpipe/graph.h"
#include "starpipe/status.h"

/* Where the parameters of a run live (the trainer or the reference interpreter). what: 0
 * value, 1 gradient of the last step, 2 AdamW m, 3 AdamW v. get may be collective: every
 * rank calls the save functions; only the writer writes. */
typedef struct {
    void *ctx;
    sp_status (*get)(void *ctx, sp_tensor p, int what, float *dst);
    sp_status (*set)(void *ctx, sp_tensor p, int what, const float *src);
    int writer;
} ckpt_io;

/* settings (may be NULL): the flags that resume the same run, "--flag value" lines,
 * stored as metadata starpipe.settings. */
sp_status ckpt_save(const char *path, const sp_graph *g, const char *model_sig,
                    const char *settings, int steps_done, const ckpt_io *io);
/* The starpipe.settings of a checkpoint (free() it), or NULL when it cannot be read or has
 * none: then ckpt_load says what is wrong. */
char *ckpt_read_settings(const char *path);
/* The gradients of one step (before clipping), as float32 tensors under the parameters'
 * names; metadata starpipe.step says which step. */
sp_status ckpt_dump_grads(const char *path, const sp_graph *g, const char *model_sig, int step,
                          const ckpt_io *io);
/* Loads values and moments; *steps_done gets the checkpoint's step. A file of another
 * model (any difference of signature), or a truncated, corrupted or foreign one, is
 * refused with a message naming what differs, and nothing is set. */
sp_status ckpt_load(const char *path, const sp_graph *g, const char *model_sig, int *steps_done,
                    const ckpt_io *io);

#endif
