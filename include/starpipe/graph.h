/* The graph API: build a model once, mark stage boundaries with sp_pipeline_yield.
 *
 *   sp_graph *g = sp_graph_create();
 *   sp_tensor x = sp_input_f32(g, "x", 2, (int64_t[]){B, D});
 *   sp_tensor y = sp_input_i32(g, "y", 1, (int64_t[]){B});
 *   sp_tensor w = sp_param(g, "w0", 2, (int64_t[]){D, H}, SP_INIT_NORMAL, 0.02f);
 *   sp_tensor h = sp_relu(g, sp_matmul(g, x, w, 0, 0));
 *   h = sp_pipeline_yield(g, h);                 // stage 0 ends here
 *   ...
 *   sp_graph_set_loss(g, sp_cross_entropy(g, logits, y));
 *
 * Tensors are ids (>= 0). An op given a bad input returns -(sp_status), e.g.
 * -SP_ERR_SHAPE, and records a message naming the op and the shapes (sp_last_error); an
 * op given a negative id returns it unchanged, so a chain of ops can be checked once at
 * the end. Shapes are checked when an op is added; nothing
 * broadcasts silently. Every shape is that of ONE microbatch. */
#ifndef STARPIPE_GRAPH_H
#define STARPIPE_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "starpipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sp_graph sp_graph;
typedef int sp_tensor;

#define SP_MAX_DIMS 4

typedef enum { SP_F32 = 0, SP_I32 = 1 } sp_dtype;

typedef enum { SP_INIT_NORMAL = 0, SP_INIT_ZEROS = 1, SP_INIT_ONES = 2 } sp_init;

sp_graph *sp_graph_create(void);
void sp_graph_free(sp_graph *g);

/* Per-microbatch inputs: f32 activations or i32 ids (tokens, class targets). */
sp_tensor sp_input_f32(sp_graph *g, const char *name, int ndim, const int64_t *shape);
sp_tensor sp_input_i32(sp_graph *g, const char *name, int ndim, const int64_t *shape);

/* A named parameter. NORMAL draws from N(0, std^2) with a generator keyed by (seed,
 * name), so every process computes the same values without communicating.
 * Parameters with two or more dims get weight decay; vectors (biases, norms) do not. */
sp_tensor sp_param(sp_graph *g, const char *name, int ndim, const int64_t *shape, sp_init init,
                   float std);

/* out = op(a) @ op(b). a may have leading dims (flattened into rows unless ta); b is 2-D.
 * ta / tb transpose the (last two dims of the) operand. */
sp_tensor sp_matmul(sp_graph *g, sp_tensor a, sp_tensor b, int ta, int tb);
sp_tensor sp_bias_add(sp_graph *g, sp_tensor x, sp_tensor bias); /* bias: last dim of x */
sp_tensor sp_add(sp_graph *g, sp_tensor a, sp_tensor b);         /* same shapes */
sp_tensor sp_scale(sp_graph *g, sp_tensor x, float s);
sp_tensor sp_gelu(sp_graph *g, sp_tensor x);
sp_tensor sp_relu(sp_graph *g, sp_tensor x);
sp_tensor sp_layernorm(sp_graph *g, sp_tensor x, sp_tensor gamma, sp_tensor beta);
/* Llama's RMSNorm: x (...,C) -> x / sqrt(mean(x^2) + eps) * weight, eps = 1e-5 (Llama's);
 * weight (C) a parameter (init it SP_INIT_ONES). */
sp_tensor sp_rmsnorm(sp_graph *g, sp_tensor x, sp_tensor weight);
/* tokens (B,T) i32, wte (V,C), wpe (Tmax,C) with Tmax >= T -> (B,T,C). */
sp_tensor sp_embed(sp_graph *g, sp_tensor tokens, sp_tensor wte, sp_tensor wpe);
/* qkv (B,T,3C) -> (B,T,C), causal, heads must divide C. */
sp_tensor sp_attention(sp_graph *g, sp_tensor qkv, int heads);
/* Causal grouped-query attention (Llama 2 70B's): kv_heads (dividing heads) KV heads,
 * each shared by G = heads / kv_heads query heads. qkv (B,T,kv_heads (G+2) hs) holds per
 * KV head its G query heads, its key and its value, hs floats each (the layout that a
 * tensor group splits by KV heads into whole blocks); -> (B,T,heads hs), query head
 * h = kv G + g using KV head kv. kv_heads = heads is multi-head attention. */
sp_tensor sp_attention_gqa(sp_graph *g, sp_tensor qkv, int heads, int kv_heads);
/* Rotary position embeddings, the half-split rotation (GPT-NeoX's, Hugging Face Llama's
 * rotate_half): x (B,T,D) is D/head_size heads per token, and head j is rotated iff
 * j % period < rotated: period 1, rotated 1 for every head; period G+2, rotated G+1 for
 * the queries and keys of sp_attention_gqa's qkv. Pair (i, i + hs/2) of a head at
 * position t turns by the angle t theta^(-2i/hs) (theta: 10000 in Llama 2). head_size
 * even, at most 1024. Linear: its transpose turns the other way. */
sp_tensor sp_rope(sp_graph *g, sp_tensor x, int head_size, int period, int rotated,
                  float theta);
/* SwiGLU's gate (Llama's MLP): x (...,2I) = [a | b] -> (...,I) = silu(a) b, with a = x W1
 * and b = x W3 from one product with [W1 | W3]. */
sp_tensor sp_swiglu(sp_graph *g, sp_tensor x);
/* logits (...,V), targets (...) i32 with the same leading dims -> scalar mean loss. */
sp_tensor sp_cross_entropy(sp_graph *g, sp_tensor logits, sp_tensor targets);
/* sp_cross_entropy_vocab (and at T = 1 sp_cross_entropy) over a padded vocabulary: of the
 * whole logits' columns (the last dimension, times T in a tensor group) only the first
 * `vocab` are tokens; the others get no probability and no gradient. Targets in
 * [0, vocab). */
sp_tensor sp_cross_entropy_padded(sp_graph *g, sp_tensor logits, sp_tensor targets,
                                  int64_t vocab);
sp_tensor sp_sum(sp_graph *g, sp_tensor x);  /* -> scalar */
sp_tensor sp_mean(sp_graph *g, sp_tensor x); /* -> scalar */
sp_tensor sp_reshape(sp_graph *g, sp_tensor x, int ndim, const int64_t *shape);

/* Ends the current stage: x is handed to the next stage. The identity in the forward
 * pass; in the backward pass its transpose is again a marker, so the gradient of stage
 * s+1's input is handed back to stage s, and backward stage s is the VJP of forward
 * stage s. Ops added after it belong to the next stage. */
sp_tensor sp_pipeline_yield(sp_graph *g, sp_tensor x);

/* ---- Tensor parallelism inside an actor (Megatron-style) ----
 * An actor may be a group of T ranks; each builds the same model as one member of the
 * group (sp_graph_set_tensor first), with its part of the split parameters, and the
 * group's ranks meet at the two conjugate operators below. A model is written once, for
 * any T: at T = 1 both operators are the identity and add no node.
 *
 *   sp_tp_copy: the identity forward; its transpose sums the gradient over the group.
 *     It opens a parallel region whose input every rank holds whole (Megatron's f):
 *     each rank's part of the region contributes a partial gradient of x.
 *   sp_tp_sum: the sum of x over the group forward (every rank gets the sum); its
 *     transpose is the identity: the sum's gradient is each term's. It closes a
 *     parallel region whose ranks hold partial sums (Megatron's g).
 *
 * The sum has one written order, ((x_0 + x_1) + x_2) + ... in float32 by tensor rank,
 * on every path (the reference's in-process group, MPI, NCCL), so runs are bitwise
 * reproducible for a given T. A column-parallel linear layer is sp_tp_copy, then a
 * product with a parameter split along its columns (dim 1); a row-parallel one, a
 * product with a parameter split along its rows (dim 0), then sp_tp_sum. */
#define SP_MAX_TENSOR 64
sp_status sp_graph_set_tensor(sp_graph *g, int size, int rank); /* before any tensor */
int sp_graph_tensor_size(const sp_graph *g);
int sp_graph_tensor_rank(const sp_graph *g);
/* A parameter whose whole shape is `shape`, of which this rank holds part `rank` of
 * `size` equal parts along dimension dim (a size not dividing shape[dim] is SP_ERR_SHAPE
 * naming the parameter). Its initial values are that part of the whole tensor's, so
 * every T starts from the model of T = 1. */
sp_tensor sp_param_split(sp_graph *g, const char *name, int ndim, const int64_t *shape, int dim,
                         sp_init init, float std);
/* The same for a part that is not contiguous in the whole tensor: the whole `shape` seen
 * as `view` (vndim dims, which refine the shape: each dimension of shape the product of
 * consecutive ones of view) is split along view dimension dim, and the part holds its
 * elements in the view's order. The part's shape is the whole one with the dimension
 * that holds view dimension dim divided by T. GPT's qkv weight (C, 3C), columns
 * [q | k | v] of heads x head_size each, split by heads: the view (C, 3, heads,
 * head_size) along dim 2, the part (C, 3C/T) with row c = q, k, v of this rank's heads,
 * sp_attention's layout for heads/T heads. sp_param_split is the view `shape` itself.
 * The node keeps the whole shape (what a checkpoint holds); the initial values are the
 * whole tensor's at the part's elements. */
sp_tensor sp_param_split_view(sp_graph *g, const char *name, int ndim, const int64_t *shape,
                              int vndim, const int64_t *view, int dim, sp_init init, float std);
sp_tensor sp_tp_copy(sp_graph *g, sp_tensor x);
sp_tensor sp_tp_sum(sp_graph *g, sp_tensor x);
/* The vocab-parallel embedding and cross-entropy (Megatron's VocabParallelEmbedding and
 * vocab_parallel_cross_entropy), so that the vocabulary's matrix wte (V,C) is split over
 * the group by rows (sp_param_split along dim 0): rank r holds rows [r V/T, (r+1) V/T),
 * and no rank ever holds a whole row of logits. Tokens and targets are ids of the whole
 * vocabulary, checked against V before any task (sp_program_check_inputs).
 *
 *   sp_embed_vocab: tokens (B,T) i32, wte this rank's part (V/T,C) -> (B,T,C): for each
 *     token the row this rank holds, zeros where another rank holds it; followed by
 *     sp_tp_sum it is the whole embedding (exactly: one term is non-zero). Its transpose
 *     adds dout into the rows the rank holds, in (b,t) order as sp_embed's. At T = 1 it
 *     is the gather of sp_embed, without positions.
 *   sp_add_positions: x (B,T,C) + wpe[t] (wpe (Tmax,C), a parameter, Tmax >= T): the
 *     positions, added once after the sum by every rank alike (a replicated op: every
 *     rank computes the same dwpe bits, dwpe[t] += dout[b,t] over b ascending, sp_embed's
 *     order). sp_tp_sum(sp_embed_vocab(tokens, wte)) then sp_add_positions is sp_embed.
 *   sp_cross_entropy_vocab: logits (...,V/T), this rank's slice of the vocabulary (the
 *     columns [r V/T, (r+1) V/T) of the whole logits, as a product with the local wte
 *     transposed gives), targets (...) i32 over the whole vocabulary -> the scalar mean
 *     loss, the same bits on every rank: each row's maximum over the group (an
 *     all-reduce of the maximum, exact), the sum of exp(logit - max) over the group and
 *     the target's logit from the rank that holds it (zeros elsewhere; one all-reduce of
 *     the sum for both, in the group's order), loss = mean(log(sum) + max - target
 *     logit). Its transpose, on each rank for its slice only: (the softmax over the whole
 *     vocabulary, restricted to the slice, - the one-hot where the rank holds the target)
 *     x dloss / rows. At T = 1 it is sp_cross_entropy (no node of its own). */
sp_tensor sp_embed_vocab(sp_graph *g, sp_tensor tokens, sp_tensor wte);
sp_tensor sp_add_positions(sp_graph *g, sp_tensor x, sp_tensor wpe);
sp_tensor sp_cross_entropy_vocab(sp_graph *g, sp_tensor logits, sp_tensor targets);
/* Which tensors every member of the group holds whole and with the same bits: value[t]
 * (its value) and grad[t] (its gradient), 1 or 0, for each of the graph's nodes (arrays
 * of sp_graph_num_tensors). At T = 1 everything is. What a pipeline stage sends another
 * may then travel as 1/T per member and be all-gathered (runtime: scatter-gather). */
sp_status sp_graph_replicated(const sp_graph *g, uint8_t *value, uint8_t *grad);
/* A split parameter's dimension of its view (sp_param_split: of its whole shape; -1:
 * whole on every rank), its whole shape, and its view (NULL, *ndim 0 when not split).
 * Index through the view, not the whole shape, or use the two copies below. */
int sp_param_split_dim(const sp_graph *g, sp_tensor p);
const int64_t *sp_param_full_shape(const sp_graph *g, sp_tensor p);
const int64_t *sp_param_view(const sp_graph *g, sp_tensor p, int *ndim);
/* Elements of the whole tensor (numel of sp_param_full_shape; 0: not a parameter). */
int64_t sp_param_whole_numel(const sp_graph *g, sp_tensor p);
/* A padded vocabulary (Megatron's, llm.c's 50304 for GPT-2's 50257): the whole tensor's
 * rows from `valid` on are padding, initialized to zero; the model keeps them out of every
 * result (sp_cross_entropy_padded), so their gradients are zero and they stay zero, and
 * checkpoints hold only the rows before them. sp_param_valid_rows: that count, or the
 * whole tensor's rows when it has no padding. */
sp_status sp_param_pad_rows(sp_graph *g, sp_tensor p, int64_t valid);
int64_t sp_param_valid_rows(const sp_graph *g, sp_tensor p);
/* Part `rank` (any member's, 0 <= rank < T, so one rank can assemble all of them) and
 * the whole tensor (sp_param_whole_numel floats): part_to_whole writes the part's
 * elements into their places in whole and leaves the others; whole_to_part reads them.
 * A parameter that is not split is copied whole, for every rank. For checkpoints: the
 * group's parts gathered into whole tensors, and scattered back at another T. */
sp_status sp_param_part_to_whole(const sp_graph *g, sp_tensor p, int rank, const float *part,
                                 float *whole);
sp_status sp_param_whole_to_part(const sp_graph *g, sp_tensor p, int rank, const float *whole,
                                 float *part);

/* The scalar the step minimises; its microbatch values are averaged over the step. */
sp_status sp_graph_set_loss(sp_graph *g, sp_tensor loss);

/* Queries. */
int sp_graph_num_stages(const sp_graph *g);
int sp_graph_num_tensors(const sp_graph *g);
int sp_tensor_ndim(const sp_graph *g, sp_tensor t);
const int64_t *sp_tensor_shape(const sp_graph *g, sp_tensor t);
int64_t sp_tensor_numel(const sp_graph *g, sp_tensor t);
sp_dtype sp_tensor_dtype(const sp_graph *g, sp_tensor t);
const char *sp_tensor_name(const sp_graph *g, sp_tensor t); /* params and inputs; else "" */
int sp_tensor_is_param(const sp_graph *g, sp_tensor t);
int sp_tensor_is_input(const sp_graph *g, sp_tensor t);
/* Stage of the op producing t; -1 for params and inputs. */
int sp_tensor_stage(const sp_graph *g, sp_tensor t);
/* Finds a param, an input or a named tensor by name; -1 if none. */
sp_tensor sp_graph_find(const sp_graph *g, const char *name);
/* Names a computed tensor (e.g. a model's "logits"), so that code holding only the graph
 * can find it and read its value after a forward pass (sp_reference_value): sampling
 * needs the logits, while a training step exposes only the loss. */
sp_status sp_graph_name(sp_graph *g, sp_tensor t, const char *name);

/* Parameters in creation order. */
int sp_graph_num_params(const sp_graph *g);
sp_tensor sp_graph_param(const sp_graph *g, int i);
int64_t sp_graph_param_count(const sp_graph *g); /* total scalars over all params */

/* Fills dst (numel floats) with the parameter's initial values for this seed. */
sp_status sp_param_init_values(const sp_graph *g, sp_tensor p, uint64_t seed, float *dst);

/* Writes a readable listing of the graph (ops, shapes, stages). */
void sp_graph_print(const sp_graph *g, void *FILE_stream);

#ifdef __cplusplus
}
#endif
#endif
