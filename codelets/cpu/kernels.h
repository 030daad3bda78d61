/* CPU kernels: forward and backward of every op, in float32, row-major.
 * Convention (llm.c): outputs first, then inputs, then sizes. Size letters: N rows
 * (flattened leading dims, B*T for a sequence model), C channels, B batch, T sequence,
 * NH heads, V classes/vocabulary, M/K/Nc matmul sizes.
 * Gradient rule: every backward function takes `acc`: 0 assigns (=) the gradient,
 * 1 accumulates (+=) into it. Parameter gradients are always called with acc=1 by the
 * graph executor; activation gradients with acc=0 for the first contribution.
 * These functions are pure and single-threaded; results are deterministic: the same
 * inputs give the same bits. The matrix products (matmul, attention) run on the kernels'
 * own sgemm (gemm_impl.h), whose bits are the same on every machine and instruction set;
 * the other loops too, except where libm is called (logf, expf: the loss, attention's
 * log-sum-exp).
 * acc=0 never reads the old gradient (it may hold NaN). acc=1 is deterministic but not
 * always bitwise equal to "acc=0 into a temporary, then add": sums over rows (matmul
 * starts from the old value, bias, layernorm params, attention) add into the buffer as
 * they go.
 * Aliasing: the elementwise ops (bias_add, add, scale, gelu, relu forwards, scale_backward)
 * may run in place (out == an input, exactly); no other buffers may overlap. */
#ifndef STARPIPE_CPU_KERNELS_H
#define STARPIPE_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* out (M,Nc) = op(a) @ op(b) [+ out if acc]; op(a) is (M,K), op(b) is (K,Nc).
 * ta: a is stored (K,M) and transposed; tb: b is stored (Nc,K) and transposed.
 * Each element is one sequential sum over K, from out (acc) or 0 (see gemm_impl.h). */
void sp_matmul_forward(float *out, const float *a, const float *b,
                       int M, int Nc, int K, int ta, int tb, int acc);
/* out (M,Nc) = op(a) @ op(b) + bias (Nc) on each row: the bits of sp_matmul_forward
 * (acc 0) and then sp_bias_add_forward, in one pass (the bias added as each tile of out is
 * stored). out may not overlap a, b or bias. */
void sp_matmul_forward_bias(float *out, const float *a, const float *b, const float *bias,
                            int M, int Nc, int K, int ta, int tb);
/* da (shape of a as stored) from dout (M,Nc) and b. */
void sp_matmul_backward_a(float *da, const float *dout, const float *b,
                          int M, int Nc, int K, int ta, int tb, int acc);
/* db (shape of b as stored) from dout (M,Nc) and a. */
void sp_matmul_backward_b(float *db, const float *dout, const float *a,
                          int M, int Nc, int K, int ta, int tb, int acc);

/* out (N,C) = x (N,C) + bias (C). */
void sp_bias_add_forward(float *out, const float *x, const float *bias, int N, int C);
/* dbias (C) from dout (N,C): sum over rows. (dx is dout itself: use sp_copy_grad.) */
void sp_bias_add_backward_bias(float *dbias, const float *dout, int N, int C, int acc);

/* out (n) = a + b. */
void sp_add_forward(float *out, const float *a, const float *b, int64_t n);
/* out (n) = b > a ? b : a: the tensor group's maximum rule (starpipe/program.h,
 * allreduce_max), a being the earlier member's; out may be a. */
void sp_maximum_forward(float *out, const float *a, const float *b, int64_t n);
/* out (n) = s * x. */
void sp_scale_forward(float *out, const float *x, float s, int64_t n);
/* dx (n) = s * dout (acc: +=). s = 1 is the plain copy used by add and bias_add. */
void sp_scale_backward(float *dx, const float *dout, float s, int64_t n, int acc);
/* The replicas' sum of one gradient shard: dst (n) = ((x0 + x1) + x2) + ... over R
 * replicas in replica order, where x_own is dst's own values and others[] the R - 1 other
 * replicas' values in order (without own). */
void sp_reduce_replicas(float *dst, const float *const *others, int R, int own, int64_t n);

/* GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void sp_gelu_forward(float *out, const float *x, int64_t n);
void sp_gelu_backward(float *dx, const float *x, const float *dout, int64_t n, int acc);

void sp_relu_forward(float *out, const float *x, int64_t n);
/* Uses the input x: the gradient is dout where x > 0, else 0. */
void sp_relu_backward(float *dx, const float *x, const float *dout, int64_t n, int acc);

/* SwiGLU's gate: x (N, 2I) holds [a | b] per row; out (N, I) = silu(a) b. The backward
 * writes dx (N, 2I): [dout b silu'(a) | dout silu(a)]. */
void sp_swiglu_forward(float *out, const float *x, int N, int I);
void sp_swiglu_backward(float *dx, const float *x, const float *dout, int N, int I, int acc);

/* Rotary position embeddings, the half-split rotation (GPT-NeoX's and Hugging Face
 * Llama's convention). x (B,T,D): each row is D/hs heads of hs (even) floats, row (b, t)
 * at position t; head j is rotated iff j % period < rotated, the others are copied. Pair
 * i < hs/2 of a rotated head, (u, w) = (x_i, x_{i+hs/2}), turns by the angle t f_i,
 * f_i = theta^(-2i/hs): (u c - w s, w c + u s), c and s computed in double and rounded.
 * inverse: by the opposite angle, the transpose (the backward). acc: out +=. hs is at
 * most SP_ROPE_MAX_HEAD (sp_rope checks). */
#define SP_ROPE_MAX_HEAD 1024
void sp_rope_forward(float *out, const float *x, int B, int T, int D, int hs, int period,
                     int rotated, float theta, int inverse, int acc);

/* LayerNorm over the last dim, eps = 1e-5. out (N,C); saves mean (N) and rstd (N). */
void sp_layernorm_forward(float *out, float *mean, float *rstd, const float *x,
                          const float *gamma, const float *beta, int N, int C);
void sp_layernorm_backward_x(float *dx, const float *dout, const float *x,
                             const float *mean, const float *rstd, const float *gamma,
                             int N, int C, int acc);
/* dgamma, dbeta (C) from dout, x, mean, rstd. */
void sp_layernorm_backward_params(float *dgamma, float *dbeta, const float *dout,
                                  const float *x, const float *mean, const float *rstd,
                                  int N, int C, int acc);
/* RMSNorm over the last dim, eps = 1e-5 (Llama's): out (N,C) = x rstd weight, rstd =
 * 1/sqrt(mean(x^2) + eps), saved (N). dweight accumulates (acc 0: assigned). */
void sp_rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int N,
                        int C);
void sp_rmsnorm_backward_x(float *dx, const float *dout, const float *x, const float *rstd,
                           const float *weight, int N, int C, int acc);
void sp_rmsnorm_backward_weight(float *dweight, const float *dout, const float *x,
                                const float *rstd, int N, int C, int acc);

/* out (B,T,C) = wte[tokens[b,t]] + wpe[t]. tokens (B,T) in [0,V). wpe has >= T rows.
 * V is not an argument, so the kernel cannot range-check tokens: the caller must. */
void sp_embed_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                      int B, int T, int C);
/* dwte (V,C) += scatter of dout by token; dwpe (T,C) += sum over b. Always accumulates:
 * rows in token order b, t ascending, so the result is deterministic. */
void sp_embed_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                       int B, int T, int C);

/* The vocab-parallel embedding (sp_embed_vocab): wte holds the rows [lo, lo + rows) of the
 * whole vocabulary's. out (N,C) = wte[token - lo] for a token it holds, else 0. */
void sp_embed_vocab_forward(float *out, const int32_t *tokens, const float *wte, int N, int C,
                            int64_t lo, int64_t rows);
/* dwte (rows,C) += dout (N,C) by token, for the tokens it holds, positions ascending (the
 * order of sp_embed_backward). Always accumulates. */
void sp_embed_vocab_backward(float *dwte, const float *dout, const int32_t *tokens, int N,
                             int C, int64_t lo, int64_t rows);

/* Causal multi-head self-attention. qkv (B,T,3C) holds q, k, v side by side per token;
 * out (B,T,C); lse (B,NH,T) saves each row's log-sum-exp of the scaled scores (the
 * backward recomputes the probabilities from it). Scale 1/sqrt(C/NH). C must be divisible
 * by NH. Tiled: keys after a query's block are never touched, nothing T x T is formed.
 * scratch: sp_attention_scratch_floats floats, contents undefined on entry and exit. */
void sp_attention_forward(float *out, float *lse, float *scratch, const float *qkv, int B,
                          int T, int C, int NH);
/* dqkv (B,T,3C) from dout (B,T,C), and the forward's qkv, out and lse. */
void sp_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                           const float *out, const float *lse, int B, int T, int C, int NH,
                           int acc);
/* Floats of scratch either direction needs: O(T (C/NH + query block)), never T x T. */
int64_t sp_attention_scratch_floats(int B, int T, int C, int NH);
/* bf16 mixed precision (sp_program_set_precision), the rounding points of FlashAttention-2
 * in bf16, which the GPU's tensor-core kernels share (each product of two bf16 values is
 * exact in fp32, sums in fp32; sp_round_bf16's rounding):
 *   forward:  S = bf16(q) bf16(k)^T; m = rowmax(scale S); P~ = exp(scale S - m) in fp32,
 *             l = rowsum(P~) in fp32, lse = m + log l; out = (bf16(P~) bf16(v)) / l.
 *   backward: P = exp(scale S - lse) in fp32 (S as forward); dP = bf16(dout) bf16(v)^T;
 *             D = rowsum(dout * out) in fp32 (fp32 dout); dS = P (dP - D) scale in fp32;
 *             dq = bf16(dS) bf16(k), dk = bf16(dS)^T bf16(q), dv = bf16(P)^T bf16(dout).
 * The GPU rounds P~ against a running max (online softmax), so their out differs by P's
 * rounding, not more. Same contract and determinism as the fp32 ones; scratch:
 * sp_attention_scratch_floats_bf16 floats (the fp32 need and two rounded row blocks). */
void sp_attention_forward_bf16(float *out, float *lse, float *scratch, const float *qkv, int B,
                               int T, int C, int NH);
void sp_attention_backward_bf16(float *dqkv, float *scratch, const float *dout,
                                const float *qkv, const float *out, const float *lse, int B,
                                int T, int C, int NH, int acc);
int64_t sp_attention_scratch_floats_bf16(int B, int T, int C, int NH);

/* Attention whose KV heads are shared by groups of query heads (grouped-query attention),
 * or any of the above in another layout of qkv. group 0: the layout above; group G >= 1
 * (G divides NH): qkv (B, T, (NH/G)(G+2) hs), per KV head its G query heads, its key and
 * its value, hs = C/NH each; query head h uses KV head h/G. out (B,T,C), C = NH hs, in
 * query-head order; lse (B,NH,T). The backward sums each KV head's gradient over its G
 * query heads in ascending order. bf16: the rounding points above. Scratch as above. */
void sp_attention_gqa_forward(float *out, float *lse, float *scratch, const float *qkv, int B,
                              int T, int C, int NH, int group, int bf16);
void sp_attention_gqa_backward(float *dqkv, float *scratch, const float *dout,
                               const float *qkv, const float *out, const float *lse, int B,
                               int T, int C, int NH, int group, int acc, int bf16);

/* Softmax cross-entropy, mean over the N rows. logits (N,V) whose first `valid` columns
 * are the tokens (the rest: a padded vocabulary's padding, probability 0), targets (N) in
 * [0,valid). probs (N,V) saves the softmax; *loss gets the mean of -log p[target].
 * Returns the number of out-of-range targets (0 when all are valid; then loss is NaN). */
int sp_cross_entropy_forward(float *loss, float *probs, const float *logits,
                             const int32_t *targets, int N, int V, int valid);
/* dlogits (N,V) = dloss * (probs - onehot(target)) / N. */
void sp_cross_entropy_backward(float *dlogits, const float *probs, const int32_t *targets,
                               float dloss, int N, int V, int acc);

/* The vocab-parallel cross-entropy (sp_cross_entropy_vocab), the three steps around the
 * group's all-reduces (starpipe/backend.h, vocab_ce_*): logits (N,V) a slice of the whole
 * vocabulary (Vall) starting at column lo.
 * Vall counts the tokens; columns from Vall on (padding) take no part.
 * sp_vocab_ce_max: rowmax (N) = each row's maximum over the slice's first `valid` columns
 *   (-inf for none: a slice of padding alone) (the rule of sp_cross_entropy_forward).
 * sp_vocab_ce_exp: exps (N,V) = expf(logit - rowmax); stats[n] = their sum in float, in
 *   column order, stats[N + n] = the target's logit where the slice holds it, else 0;
 *   ltargets[n] = target - lo there, else -1. Returns the number of targets outside
 *   [0,Vall) (their rows get 0 and -1).
 * sp_vocab_ce_loss: with the group's rowmax and stats: exps *= 1 / stats[n] per row, *loss =
 *   the mean of log(stats[n]) + rowmax[n] - stats[N + n] over the rows, in double, as
 *   sp_cross_entropy_forward forms -log p[target]. Its backward is
 *   sp_cross_entropy_backward on exps and ltargets. */
void sp_vocab_ce_max(float *rowmax, const float *logits, int N, int V, int valid);
int sp_vocab_ce_exp(float *exps, float *stats, int32_t *ltargets, const float *logits,
                    const int32_t *targets, const float *rowmax, int N, int V, int64_t lo,
                    int64_t Vall);
void sp_vocab_ce_loss(float *loss, float *exps, const float *rowmax, const float *stats, int N,
                      int V);

/* *out = sum of x (n), summed in double for accuracy, rounded once. */
void sp_sum_forward(float *out, const float *x, int64_t n);
/* dx (n) = dout broadcast (times s: 1 for sum, 1/n for mean). */
void sp_sum_backward(float *dx, float dout_times_s, int64_t n, int acc);

/* AdamW on a flat array of n parameters, step t >= 1 (bias correction). weight_decay is
 * decoupled (applied as p -= lr * wd * p). grad_scale multiplies each gradient first
 * (1 when no clipping). m and v are the moment buffers. */
void sp_adamw_update(float *param, float *m, float *v, const float *grad, int64_t n,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     float grad_scale, int t);

/* Sum of squares of x (n) in double: for the global gradient norm. */
double sp_sum_squares(const float *x, int64_t n);
/* One core's FMA peak in FLOP/s, measured now for about `seconds` (peak.c): independent
 * fused multiply-add chains in the widest vectors the core has. what (len bytes, may be
 * NULL): how it was measured, for the output. */
double sp_cpu_fma_peak(double seconds, char *what, size_t len);

/* bfloat16 mixed precision. sp_round_bf16: dst = src rounded to bfloat16, round to
 * nearest even (NaN stays a quiet NaN, overflow goes to infinity), kept in fp32 storage:
 * the value a bf16 tensor would hold (dst may be src). sp_to_bf16: the same rounding, as
 * bf16 storage (each value the upper 16 bits of its rounded fp32). The _bf16 products
 * round both operands so and accumulate in fp32 (each product of two bf16 values is exact
 * in fp32): what a GPU's bf16 GEMM computes, up to its order of summation. a16 / b16: a /
 * b is given in bf16 storage (sp_to_bf16's output, a const uint16_t *), widened exactly
 * instead of rounded, so the product has the bits it has from the fp32 operand. */
void sp_round_bf16(float *dst, const float *src, int64_t n);
void sp_to_bf16(uint16_t *dst, const float *src, int64_t n);
int sp_matmul_forward_bf16(float *out, const void *a, const void *b, int M, int Nc, int K,
                           int ta, int tb, int acc, int a16, int b16);
int sp_matmul_forward_bias_bf16(float *out, const void *a, const void *b, const float *bias,
                                int M, int Nc, int K, int ta, int tb, int a16, int b16);
int sp_matmul_backward_a_bf16(float *da, const float *dout, const void *b, int M, int Nc,
                              int K, int ta, int tb, int acc, int b16);
int sp_matmul_backward_b_bf16(float *db, const float *dout, const void *a, int M, int Nc,
                              int K, int ta, int tb, int acc, int a16);
/* What the _bf16 products return when their rounded operands find no memory (each
 * worker thread keeps two buffers, grown to the largest operand): the product is not
 * computed, never quietly in fp32. 0 otherwise. */
#define SP_KERNEL_NOMEM (-3)

/* Sets OpenBLAS to one thread (the kernels do not use it, but a program may link it; the
 * runtime owns the cores). Idempotent. */
void sp_kernels_init(void);

#endif
