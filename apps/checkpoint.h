/* Checkpoints and gradient dumps of the apps, in the safetensors format: one tensor per
 * parameter under its graph name or its model's layout's (Hugging Face's names for the
 * GPT and the Llama), with ".adam_m" and ".adam_v" for the AdamW moments,
 * and metadata starpipe.format, starpipe.model (the model's signature), starpipe.step
 * and starpipe.settings (the flags a resume needs to continue the same run).
 * Parameters are stored by name, not by stage, so a run can resume under another
 * schedule or rank count. Loading checks everything before it sets anything. Tensors are
 * whole (sp_param_full_shape): a run of tensor parallelism T saves and loads the same
 * files as T = 1, and resumes at any other T (ckpt_io moves whole tensors). */
#ifndef STARPIPE_APP_CHECKPOINT_H
#define STARPIPE_APP_CHECKPOINT_H

#include "starpipe/graph.h"
#include "starpipe/models.h"
#include "starpipe/status.h"

/* A model may store a parameter as several tensors, each of whole rows of it (its first
 * dimension) gathered with a stride: rows [row0 + b stride, row0 + b stride + rows) for
 * b = 0 .. blocks-1, in that order, under the piece's own name and shape (blocks x rows
 * x the row's floats in all). So a fused weight is kept in another layout's names: the
 * Llama's qkv_proj as Hugging Face's q_proj, k_proj and v_proj (starpipe-gpt.c). */
typedef struct {
    char name[96];
    int ndim;
    int64_t shape[SP_MAX_DIMS];
    int64_t row0, rows, blocks, stride;
    /* The rotary embedding of the attention these rows feed (rope_head 0: none). Files of
     * the layout may hold its frequencies under rope_buffer (older transformers saved
     * rotary_emb.inv_freq: rope_head/2 floats 1/theta^(2i/rope_head)); ckpt_load_values
     * skips them once they agree with rope_theta, and refuses them otherwise. */
    int rope_head;
    double rope_theta;
    char rope_buffer[96];
    /* Other spellings a file may use for the piece (read, never written; "" none): a
     * layout's shorter names (GPT-2's files without "transformer.") and the graph's names
     * of files written before the layout. */
    char alt[2][96];
    /* A tied weight's second name ("" none): the values are written under it too, for a
     * loader that wants both (transformers' lm_head.weight, tied to wte); read back, it
     * must hold the piece's values. */
    char alias[96];
} ckpt_piece;
#define CKPT_MAX_PIECES 8
/* Fills the pieces of parameter p (at most CKPT_MAX_PIECES) and returns their count; 0:
 * the parameter is one tensor under its graph name. ctx: the model's (ckpt_io). */
typedef int (*ckpt_layout_fn)(const void *ctx, const sp_graph *g, sp_tensor p,
                              ckpt_piece *pieces);

/* Hugging Face's LlamaForCausalLM layout of sp_model_llama's parameters (models.h): the
 * fused qkv_proj stored as q_proj (each KV group's G query heads' rows, gathered), k_proj
 * and v_proj; gate_up_proj as gate_proj and up_proj; every other parameter under its own
 * name (already Hugging Face's). q_proj carries the layer's rotary embedding (rope_head,
 * rope_theta, and rope_buffer: model.layers.N.self_attn.rotary_emb.inv_freq). */
int ckpt_llama_layout(const sp_llama_config *l, const sp_graph *g, sp_tensor p,
                      ckpt_piece *pieces);

/* Hugging Face's GPT2LMHeadModel layout of sp_model_gpt's parameters: each under its
 * transformers name (wte as transformer.wte.weight, h0.attn.w as
 * transformer.h.0.attn.c_attn.weight, ...; the Conv1D weights are (in, out), as starpipe's
 * are), the head tied to wte and written as lm_head.weight too. Files without the
 * "transformer." prefix, and starpipe's files of the graph's own names, read as well. */
int ckpt_gpt_layout(const sp_graph *g, sp_tensor p, ckpt_piece *pieces);

/* Where the parameters of a run live (the trainer or the reference interpreter). what: 0
 * value, 1 gradient of the last step, 2 AdamW m, 3 AdamW v. get may be collective: every
 * rank calls the save functions; only the writer writes. layout: the model's (NULL: every
 * parameter under its graph name); the moments and gradients follow it, suffixed. */
typedef struct {
    void *ctx;
    sp_status (*get)(void *ctx, sp_tensor p, int what, float *dst);
    sp_status (*set)(void *ctx, sp_tensor p, int what, const float *src);
    int writer;
    ckpt_layout_fn layout;
    const void *layout_ctx;
} ckpt_io;

/* settings (may be NULL): the flags that resume the same run, "--flag value" lines,
 * stored as metadata starpipe.settings. */
sp_status ckpt_save(const char *path, const sp_graph *g, const char *model_sig,
                    const char *settings, int steps_done, const ckpt_io *io);
/* The metadata `key` of a checkpoint (free() it): "starpipe.settings", "starpipe.step"...;
 * NULL when it cannot be read or has none: then ckpt_load says what is wrong. */
char *ckpt_read_meta(const char *path, const char *key);
/* The gradients of one step (before clipping), as float32 tensors under the parameters'
 * names; metadata starpipe.step says which step. */
sp_status ckpt_dump_grads(const char *path, const sp_graph *g, const char *model_sig, int step,
                          const ckpt_io *io);
/* Loads values and moments; *steps_done gets the checkpoint's step. A file of another
 * model (any difference of signature), or a truncated, corrupted or foreign one, or one
 * holding a NaN or an infinity in a value or a moment, is refused with a message naming
 * what differs (the tensor and the element), and nothing is set. */
sp_status ckpt_load(const char *path, const sp_graph *g, const char *model_sig, int *steps_done,
                    const ckpt_io *io);
/* Loads parameter values only, from any safetensors file in the model's layout (one saved
 * by Hugging Face's save_pretrained, say): every parameter's tensors by name and shape,
 * in F32, BF16 or F16 (widened to float32 exactly), metadata ignored, and no tensor that
 * is not one of them, a starpipe checkpoint's moment of one, or a layout's rotary buffer
 * (ckpt_piece) whose frequencies are the model's (a missing, extra or misshapen tensor, a
 * non-finite value, or rotary frequencies of another theta are refused by name, and
 * nothing is set). The optimizer's moments are left as they are. */
sp_status ckpt_load_values(const char *path, const sp_graph *g, const ckpt_io *io);

#endif
