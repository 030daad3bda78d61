/* Model builders used by the apps and tests: a GPT-2-style decoder and an MLP, each cut
 * into a given number of pipeline stages. All shapes are those of one microbatch. */
#ifndef STARPIPE_MODELS_H
#define STARPIPE_MODELS_H

#include "starpipe/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Byte-level GPT-2: tokens (B,T) -> embeddings (tied wte) -> `layers` pre-norm blocks
 * (attention, 4x MLP with GELU) -> final LayerNorm -> logits = x wte^T -> cross-entropy
 * against targets (B,T). Blocks are split evenly over `stages` (layers >= stages), or as
 * `stage_layers` says: the embedding sits in stage 0 and the head in the last stage, so
 * with stages > 1 the tied embedding is shared by the first and the last stage.
 * Inputs: "tokens", "targets". Parameters: wte wpe h<l>.{ln1,attn,proj,ln2,fc,fcproj}.{w,b,g}
 * lnf.{g,b}; weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2 layers)). The
 * logits (B,T,V) are named "logits" (sp_graph_find), for sampling: causal attention
 * makes the logits at position j depend on tokens 0..j only. */
typedef struct {
    int vocab;    /* 256 for bytes */
    int context;  /* T */
    int layers;
    int heads;
    int channels; /* C, divisible by heads */
    int batch;    /* B: sequences per microbatch */
    int stages;
    /* NULL: an even split. Else `stages` block counts summing to `layers`, for stages of
     * unequal cost: the first and the last may be 0 (embedding only, head only). */
    const int *stage_layers;
} sp_gpt_config;

sp_graph *sp_model_gpt(const sp_gpt_config *cfg, sp_status *status);

/* MLP classifier: x (B,in) -> `depth` x [linear, relu] of `width` -> linear -> classes,
 * cross-entropy against y (B). Hidden layers split evenly over `stages` (depth >=
 * stages) or as `stage_layers` says; the head is in the last stage. He-initialised
 * weights. Inputs "x", "y"; the logits (B,classes) are named "logits". */
typedef struct {
    int in_dim;
    int width;
    int depth;
    int classes;
    int batch;
    int stages;
    /* NULL: an even split. Else `stages` layer counts summing to `depth`; only the last
     * may be 0 (the head alone). */
    const int *stage_layers;
} sp_mlp_config;

sp_graph *sp_model_mlp(const sp_mlp_config *cfg, sp_status *status);

#ifdef __cplusplus
}
#endif
#endif
