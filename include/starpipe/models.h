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
 * makes the logits at position j depend on tokens 0..j only.
 * Tensor parallelism (`tensor` T > 1; graph.h): the graph is tensor rank `tensor_rank`'s,
 * in Megatron's layout. Per block, ln1 (whole) -> sp_tp_copy -> qkv column-parallel by
 * heads (h<l>.attn.w (C,3C) and h<l>.attn.b (3C) split with sp_param_split_view: the
 * part (C,3C/T) holds the q, k and v columns of this rank's heads/T heads) -> attention
 * over heads/T heads -> h<l>.proj.w row-parallel (split along dim 0: its heads' rows) ->
 * sp_tp_sum -> + h<l>.proj.b (whole, once after the sum) -> residual; ln2 -> sp_tp_copy ->
 * h<l>.fc.w (C,4C) and h<l>.fc.b split by columns -> GELU -> h<l>.fcproj.w (4C,C) split by
 * rows -> sp_tp_sum -> + h<l>.fcproj.b (whole). The vocabulary is split too (Megatron's
 * vocab-parallel embedding and cross-entropy, graph.h): wte (V,C) by rows (sp_param_split
 * along dim 0, rows [r V/T, (r+1) V/T)), the embedding sp_embed_vocab -> sp_tp_sum ->
 * sp_add_positions (wpe whole, added once after the sum); the tied head sp_tp_copy ->
 * x wte_part^T, this rank's slice of the logits (B,T,V/T) -> sp_cross_entropy_vocab. lnf
 * and wpe stay whole. T must divide the heads (then also C and 4C), and the vocabulary
 * unless vocab_pad pads it (then wte has Vp = round_up(V, vocab_pad T) rows, the last Vp - V
 * padding, and the loss is sp_cross_entropy_padded's over V tokens): else SP_ERR_ARG naming
 * the model, the size and T ("sp_model_gpt: tensor parallelism of 3 does not divide the
 * vocabulary of 256"). At T = 1 (tensor 0 or 1) the graph is the one
 * without tensor parallelism, node for node, its logits named "logits"; a graph of T > 1
 * names its slice "logits.slice" instead and has no "logits" (sampling builds a T = 1
 * graph and loads whole tensors). */
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
    int tensor;      /* T, the tensor group's size; 0 means 1 */
    int tensor_rank; /* this graph's rank in it, 0 .. T-1 */
    /* Padding of the vocabulary (Megatron's make-vocab-size-divisible-by: 128, which pads
     * GPT-2's 50257 to 50304 at T = 1, as llm.c does): wte holds round_up(vocab, pad x T)
     * rows, those past vocab zero and kept out of the loss (sp_param_pad_rows,
     * sp_cross_entropy_padded), so that any T splits any vocabulary. 0: none, and T must
     * divide vocab. */
    int vocab_pad;
} sp_gpt_config;

sp_graph *sp_model_gpt(const sp_gpt_config *cfg, sp_status *status);

/* Llama-family decoder (Llama 2's architecture; Hugging Face's LlamaForCausalLM with
 * attention_bias = mlp_bias = False, tie_word_embeddings = False, rope_scaling = None):
 * tokens (B,T) -> model.embed_tokens (V,C) -> `layers` pre-norm blocks -> RMSNorm ->
 * logits = x lm_head^T (untied) -> cross-entropy against targets (B,T). A block:
 *   h = RMSNorm(x) (input_layernorm) -> qkv = h W_qkv^T -> rotary embeddings of the
 *   queries and keys (theta) -> causal attention with kv_heads KV heads shared by groups
 *   of G = heads / kv_heads query heads (sp_attention_gqa) -> o_proj -> x += ...;
 *   h = RMSNorm(x) (post_attention_layernorm) -> SwiGLU: silu(h W_gate^T) (h W_up^T) ->
 *   down_proj -> x += ...
 * No biases, eps 1e-5. Weights are stored as (out, in), Hugging Face's nn.Linear layout,
 * and multiplied transposed. Parameters, in Hugging Face's names:
 *   model.embed_tokens.weight (V,C); per layer l, model.layers.<l>.:
 *     input_layernorm.weight (C), self_attn.qkv_proj.weight (kv_heads (G+2) hs, C): per
 *     KV head its G query heads' rows, its key's, its value's (hs each; Hugging Face's
 *     q_proj, k_proj, v_proj are its rows gathered, apps/checkpoint.h), self_attn.o_proj.
 *     weight (C, heads hs), post_attention_layernorm.weight (C), mlp.gate_up_proj.weight
 *     (2 hidden, C): gate_proj's rows then up_proj's, mlp.down_proj.weight (C, hidden);
 *   model.norm.weight (C), lm_head.weight (V,C).
 * Init N(0, 0.02), o_proj and down_proj N(0, 0.02/sqrt(2 layers)), the norms ones. Stages
 * as sp_model_gpt's (the embedding in stage 0, the head in the last; the first and the
 * last may hold no block). The logits are named "logits" ("logits.slice" at T > 1).
 * Tensor parallelism T (Megatron's layout): the KV heads split by T, each rank with its
 * query heads (qkv_proj split by its view (kv_heads, G+2, hs, C) along dim 0: whole
 * blocks), o_proj by columns (dim 1), gate_up_proj by its view (2, hidden, C) along dim 1
 * (each rank its gate and up rows), down_proj by columns, the embedding and the head by
 * the vocabulary (sp_embed_vocab, sp_cross_entropy_vocab); the norms whole. Refused with
 * one message (SP_ERR_ARG, "sp_model_llama: ..."): kv_heads not dividing heads, heads not
 * dividing channels, an odd head size (the rotation pairs halves), T not dividing the KV
 * heads, the hidden size or the vocabulary. */
typedef struct {
    int vocab;    /* 256 for bytes */
    int context;  /* T */
    int layers;
    int heads;    /* query heads */
    int kv_heads; /* dividing heads; = heads for multi-head attention */
    int channels; /* C = heads x head size */
    int hidden;   /* the MLP's width (Llama 2 7B: 11008 for C = 4096) */
    float rope_theta; /* 0: 10000, Llama 2's */
    int batch;
    int stages;
    const int *stage_layers; /* as sp_gpt_config's */
    int tensor;
    int tensor_rank;
    int vocab_pad; /* as sp_gpt_config's: embed_tokens and lm_head padded */
} sp_llama_config;

sp_graph *sp_model_llama(const sp_llama_config *cfg, sp_status *status);

/* MLP classifier: x (B,in) -> `depth` x [linear, relu] of `width` -> linear -> classes,
 * cross-entropy against y (B). Hidden layers split evenly over `stages` (depth >=
 * stages) or as `stage_layers` says; the head is in the last stage. He-initialised
 * weights. Inputs "x", "y"; the logits (B,classes) are named "logits".
 * Tensor parallelism (`tensor` T > 1): the hidden layers pair up, (0,1), (2,3), ...; the
 * first of a pair is column-parallel (sp_tp_copy, none before layer 0 since the input x has
 * no gradient, then l<k>.w split by columns and l<k>.b alike), the second row-parallel (l<k>.w split by rows, sp_tp_sum, then its whole l<k>.b
 * and the ReLU). With an odd depth the last hidden layer is whole, as is the head. A pair
 * may straddle a stage boundary: the activation handed over is each rank's part. T must
 * divide the width when depth >= 2 (else SP_ERR_ARG naming the model, the width and T).
 * At T = 1 the graph is the one without tensor parallelism, node for node. */
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
    int tensor;      /* T, the tensor group's size; 0 means 1 */
    int tensor_rank; /* this graph's rank in it, 0 .. T-1 */
} sp_mlp_config;

sp_graph *sp_model_mlp(const sp_mlp_config *cfg, sp_status *status);

/* The shapes users know by name, one table for the apps (--model) and the planner (--gpt,
 * --llama): the GPT-2 family and GPT-3 175B (the GPT's architecture; 50257 tokens, as
 * published), Llama 2 7B, 13B and 70B (Hugging Face's configs), and the apps' small
 * defaults (gpt-small, llama-small). hidden 0: Llama's 8C/3 rule (the apps'). */
typedef struct {
    const char *name;
    int llama; /* 0: the GPT (sp_model_gpt), 1: the Llama (sp_model_llama) */
    int layers, heads, kv_heads, channels, hidden, context, vocab;
    float rope_theta;
} sp_model_preset;
/* The preset named `name`, or NULL. */
const sp_model_preset *sp_model_preset_find(const char *name);
/* The names, comma-separated, into buf (for messages and help). */
const char *sp_model_preset_names(char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
