/* CUDA kernels: the same ops as codelets/cpu/kernels.h (read it first: shapes, size letters,
 * the acc rule, aliasing), on device memory, checked against the CPU ones by
 * tests/backend/test_backend_ops.c through their table (backend.c), and what it does not
 * reach by tests/gpu/test_cuda_kernels.c. Plain C: includable without the CUDA headers.
 *
 * Conventions, for every function below:
 * - Same name with sp_cuda_ for sp_, same arguments in the same order, then `stream`
 *   (a cudaStream_t; NULL is the legacy default stream) and, for the ops on cuBLAS,
 *   `cublas` (a cublasHandle_t). Every pointer is a DEVICE pointer unless said otherwise.
 * - Everything is enqueued on `stream` and returns before it runs: nothing synchronizes,
 *   allocates or exits. The return is a status: SP_CUDA_OK (0); a cudaError_t (> 0) when
 *   a launch or runtime call failed (possibly an earlier asynchronous error surfacing);
 *   SP_CUDA_ERR_CUBLAS_BASE + a cublasStatus_t; SP_CUDA_ERR_ARG for a NULL handle.
 * - acc: 0 assigns and never reads the old contents (NaN there is fine), 1 accumulates.
 * - Deterministic: the same inputs give the same bits, run to run: reductions are in a
 *   fixed order, no float atomics (integer atomics count bad indices only). Bits may differ
 *   from the CPU kernels (summation order, FMA), within the tolerances of the test.
 * - Sizes <= 0 mean there is nothing to do, as on the CPU.
 *
 * cuBLAS handle (matmul): the calls bind it to `stream` (cublasSetStream, only
 * when it is bound elsewhere) and to host pointer mode. Its math mode is the caller's:
 * call sp_cuda_kernels_init (or sp_cuda_set_tf32(h, 0)) once per handle for exact fp32
 * (CUBLAS_DEFAULT_MATH, no TF32); sp_cuda_set_tf32(h, 1) opts in to TF32 tensor cores
 * (~10 bits of mantissa: faster, no longer within 1e-5 of the CPU). cuBLAS is bitwise
 * reproducible for a given toolkit, GPU model and SM count when one stream uses a handle;
 * with several concurrent streams give each its own workspace (cublasSetWorkspace) or set
 * CUBLAS_WORKSPACE_CONFIG=:4096:8. */
#ifndef STARPIPE_CUDA_KERNELS_H
#define STARPIPE_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SP_CUDA_OK 0
#define SP_CUDA_ERR_ARG (-1)
#define SP_CUDA_ERR_CUBLAS_BASE 100000

/* A name for a status returned here: the CUDA or cuBLAS error string. Never NULL. */
const char *sp_cuda_status_string(int status);

/* Configures a cuBLAS handle for these kernels: host pointer mode and CUBLAS_DEFAULT_MATH
 * (fp32 without TF32). The analog of sp_kernels_init; call it once per handle. */
int sp_cuda_kernels_init(void *cublas);
/* on = 1: CUBLAS_TF32_TENSOR_OP_MATH (opt-in, faster, ~1e-3 relative); 0: back to
 * CUBLAS_DEFAULT_MATH. Affects every later call on this handle, also from other code. */
int sp_cuda_set_tf32(void *cublas, int on);

/* ---- matmul.cu: cublasSgemm, row-major through the usual operand swap; acc is beta. */
int sp_cuda_matmul_forward(float *out, const float *a, const float *b, int M, int Nc, int K,
                           int ta, int tb, int acc, void *stream, void *cublas);
int sp_cuda_matmul_backward_a(float *da, const float *dout, const float *b, int M, int Nc,
                              int K, int ta, int tb, int acc, void *stream, void *cublas);
int sp_cuda_matmul_backward_b(float *db, const float *dout, const float *a, int M, int Nc,
                              int K, int ta, int tb, int acc, void *stream, void *cublas);
/* bf16 mixed precision: the same products with both operands rounded to bfloat16 (the
 * CPU's sp_round_bf16 bits) and fp32 accumulation on the tensor cores (cublasGemmEx);
 * compared with the CPU's _bf16 products within a tolerance (their summation orders
 * differ). a16 / b16: a / b is given in bf16 storage (const uint16_t *, as
 * sp_cuda_to_bf16 writes it) and goes to cublasGemmEx as it is, with no conversion. */
int sp_cuda_matmul_forward_bf16(float *out, const void *a, const void *b, int M, int Nc, int K,
                                int ta, int tb, int acc, int a16, int b16, void *stream,
                                void *cublas);
int sp_cuda_matmul_backward_a_bf16(float *da, const float *dout, const void *b, int M, int Nc,
                                   int K, int ta, int tb, int acc, int b16, void *stream,
                                   void *cublas);
int sp_cuda_matmul_backward_b_bf16(float *db, const float *dout, const void *a, int M, int Nc,
                                   int K, int ta, int tb, int acc, int a16, void *stream,
                                   void *cublas);
/* NEW. out (n bf16) = x rounded to bfloat16: the CPU's sp_to_bf16, bit for bit. */
int sp_cuda_to_bf16(uint16_t *out, const float *x, int64_t n, void *stream);

/* ---- elementwise.cu. bias, add, scale, gelu, relu forwards and scale_backward may run
 * in place (out == an input exactly), as on the CPU. */
int sp_cuda_bias_add_forward(float *out, const float *x, const float *bias, int N, int C,
                             void *stream);
/* Per column: 32 row lanes each sum every 32nd row in order, then a fixed tree: not the
 * CPU's sequential order, but the same bits every run. */
int sp_cuda_bias_add_backward_bias(float *dbias, const float *dout, int N, int C, int acc,
                                   void *stream);
int sp_cuda_add_forward(float *out, const float *a, const float *b, int64_t n, void *stream);
/* out = b > a ? b : a, bit for bit the CPU's (the tensor group's maximum rule) */
int sp_cuda_maximum_forward(float *out, const float *a, const float *b, int64_t n,
                            void *stream);
/* s is a host float. */
int sp_cuda_scale_forward(float *out, const float *x, float s, int64_t n, void *stream);
int sp_cuda_scale_backward(float *dx, const float *dout, float s, int64_t n, int acc,
                           void *stream);
/* GELU uses the CPU's branch-free tanh (codelets/gelu.h), so it tracks it within a few
 * ulp (FMA contraction on the GPU). */
int sp_cuda_gelu_forward(float *out, const float *x, int64_t n, void *stream);
int sp_cuda_gelu_backward(float *dx, const float *x, const float *dout, int64_t n, int acc,
                          void *stream);
int sp_cuda_relu_forward(float *out, const float *x, int64_t n, void *stream);
int sp_cuda_relu_backward(float *dx, const float *x, const float *dout, int64_t n, int acc,
                          void *stream);
/* SwiGLU's gate, x (N, 2I) = [a | b] per row: out (N, I) = silu(a) b; the backward dx (N,
 * 2I) = [dout b silu'(a) | dout silu(a)]. The CPU's sp_silu and sp_silu_grad (codelets/
 * gelu.h), products rounded alone: within an ulp or two of the CPU (FMA in the sigmoid). */
int sp_cuda_swiglu_forward(float *out, const float *x, int N, int I, void *stream);
int sp_cuda_swiglu_backward(float *dx, const float *x, const float *dout, int N, int I, int acc,
                            void *stream);

/* ---- rope.cu: rotary embeddings, the CPU's sp_rope_forward (its arguments, theta a host
 * float): heads j with j % period < rotated turned by position, the others copied; inverse
 * the transpose; acc +=. The angle t theta^(-2i/hs), its cos and sin in double on the
 * device, rounded to float, then the CPU's products and sums each rounded alone: the CPU's
 * bits wherever the device's double cos, sin and pow round to the same float as libm's
 * (the emulation: always). May run in place (out == x). period < 1: cudaErrorInvalidValue. */
int sp_cuda_rope_forward(float *out, const float *x, int B, int T, int D, int hs, int period,
                         int rotated, float theta, int inverse, int acc, void *stream);

/* ---- layernorm.cu: one warp per row (two passes, as the CPU); dgamma/dbeta by a
 * fixed-order column reduction like bias (no atomics). */
int sp_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *x,
                              const float *gamma, const float *beta, int N, int C,
                              void *stream);
int sp_cuda_layernorm_backward_x(float *dx, const float *dout, const float *x,
                                 const float *mean, const float *rstd, const float *gamma,
                                 int N, int C, int acc, void *stream);
int sp_cuda_layernorm_backward_params(float *dgamma, float *dbeta, const float *dout,
                                      const float *x, const float *mean, const float *rstd,
                                      int N, int C, int acc, void *stream);
/* RMSNorm (eps 1e-5), the same layout: one warp per row; dweight by the column reduction. */
int sp_cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int N,
                            int C, void *stream);
int sp_cuda_rmsnorm_backward_x(float *dx, const float *dout, const float *x, const float *rstd,
                               const float *weight, int N, int C, int acc, void *stream);
int sp_cuda_rmsnorm_backward_weight(float *dweight, const float *dout, const float *x,
                                    const float *rstd, int N, int C, int acc, void *stream);

/* ---- embed.cu. Tokens must be in [0,V): the kernels cannot check (V is not an argument)
 * and an out-of-range token reads or writes out of bounds, which on a GPU usually poisons
 * the whole context. Validate on the host before upload, or run sp_cuda_embed_check_tokens
 * and read its count before launching these. */
int sp_cuda_embed_forward(float *out, const int32_t *tokens, const float *wte,
                          const float *wpe, int B, int T, int C, void *stream);
/* Always accumulates. Each distinct token's row is summed by one block over the positions
 * in (b, t) order, and each dwpe element by one thread over b: the same sequence of float
 * additions as the CPU, so the bits match it. */
int sp_cuda_embed_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int B, int T, int C, void *stream);
/* The vocab-parallel embedding: the CPU's sp_embed_vocab_forward / _backward (wte the rows
 * [lo, lo + rows)); the backward with sp_cuda_embed_backward's ownership, bit for bit the
 * CPU's. Tokens need not lie in [0,V): one outside the rows gives zeros and no gradient. */
int sp_cuda_embed_vocab_forward(float *out, const int32_t *tokens, const float *wte, int N,
                                int C, int64_t lo, int64_t rows, void *stream);
int sp_cuda_embed_vocab_backward(float *dwte, const float *dout, const int32_t *tokens, int N,
                                 int C, int64_t lo, int64_t rows, void *stream);
/* NEW. *bad (device int) = how many of tokens (n) are outside [0,V). Assigns (zeroes it
 * first, on the stream); integer atomics only. */
int sp_cuda_embed_check_tokens(int *bad, const int32_t *tokens, int64_t n, int V,
                               void *stream);

/* ---- attention.cu: the CPU's contract (out, lse (B,NH,T) per-row log-sum-exp; the
 * backward recomputes the probabilities and reads out), FlashAttention-2 style: tiles of
 * 64 queries x 64 keys up to the diagonal, online softmax, fp32 on the CUDA cores; nothing
 * T x T in device memory. Any head size (heads wider than 128 columns are split into
 * slices that each recompute the scores). The backward has no atomics: one kernel per key
 * tile (dk, dv), one per query tile (dq). `cublas` is not used.
 * group: qkv's layout, sp_attention_gqa_forward's (cpu/kernels.h): 0 GPT's (B,T,3C) [q | k |
 * v]; G >= 1 (G divides NH, else cudaErrorInvalidValue) grouped-query, (B, T, (NH/G)(G+2)
 * hs), per KV head its G query heads, its key, its value. One key-tile block per (b, KV
 * head) sums dk and dv over the G query heads in ascending order, in registers.
 * DIFFERS: scratch is sp_cuda_attention_scratch_floats(..., backward) floats of device
 * memory (none forward; B*NH*T backward: D = rowsum(dout * out)), not the CPU's; reused in
 * stream order. */
int sp_cuda_attention_forward(float *out, float *lse, float *scratch, const float *qkv, int B,
                              int T, int C, int NH, int group, void *stream, void *cublas);
int sp_cuda_attention_backward(float *dqkv, float *scratch, const float *dout,
                               const float *qkv, const float *out, const float *lse, int B,
                               int T, int C, int NH, int group, int acc, void *stream,
                               void *cublas);
/* Host function. backward ? B*NH*T : 0, at least 1. */
int64_t sp_cuda_attention_scratch_floats(int B, int T, int C, int NH, int backward);
/* NEW. bf16 attention on the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulation):
 * the CPU's sp_attention_*_bf16 rounding points (codelets/cpu/kernels.h), q, k, v, dout
 * rounded while staged into shared memory; compared with the CPU's bf16 attention within a
 * tolerance (summation orders and the online max differ). Same scratch and determinism
 * as the fp32 kernels (each output element summed in one thread in a fixed order, no
 * atomics). Head sizes up to SP_CUDA_ATTN_BF16_MAX_HS (padded to 16 with zeros); wider
 * ones return cudaErrorInvalidValue (the CUDA backend runs the fp32 kernels for them). */
#define SP_CUDA_ATTN_BF16_MAX_HS 128
int sp_cuda_attention_forward_bf16(float *out, float *lse, float *scratch, const float *qkv,
                                   int B, int T, int C, int NH, int group, void *stream,
                                   void *cublas);
int sp_cuda_attention_backward_bf16(float *dqkv, float *scratch, const float *dout,
                                    const float *qkv, const float *out, const float *lse, int B,
                                    int T, int C, int NH, int group, int acc, void *stream,
                                    void *cublas);

/* NEW. Host function. The attention kernels' names and how many blocks of each fit on one
 * SM of the current device (cudaOccupancyMaxActiveBlocksPerMultiprocessor: registers,
 * shared memory, threads), at most max of them; returns how many, or -1 where there is no
 * GPU to ask (the CPU emulation). The kernels are sized for 2 (fp32) and 3 (bf16). */
int sp_cuda_attention_occupancy(const char **names, int *blocks, int max);

/* ---- loss.cu */
/* DIFFERS: the loss and the count stay on the device. *loss (device float) = mean over
 * rows of -log p[target] (NaN if any target is bad), *bad (device int) = number of targets
 * outside [0,valid) (the CPU's return value), both assigned. Columns [valid, V) are a
 * padded vocabulary's padding: probability 0. scratch: device memory of
 * sp_cuda_cross_entropy_scratch_bytes(N) bytes for the per-row losses (double), reduced
 * in a fixed order by one block. One block of 512 threads per row for the softmax. */
int sp_cuda_cross_entropy_forward(float *loss, float *probs, const float *logits,
                                  const int32_t *targets, int N, int V, int valid, int *bad,
                                  void *scratch, void *stream);
/* Host function: bytes of scratch for sp_cuda_cross_entropy_forward (N doubles, >= 8). */
int64_t sp_cuda_cross_entropy_scratch_bytes(int N);
/* DIFFERS: dloss is a DEVICE pointer to the upstream scalar, read in the kernel; the CPU's
 * float dloss is dloss_mult * *dloss (pass 1.0f for the plain gradient). */
int sp_cuda_cross_entropy_backward(float *dlogits, const float *probs, const int32_t *targets,
                                   const float *dloss, float dloss_mult, int N, int V, int acc,
                                   void *stream);
/* The vocab-parallel cross-entropy's steps (the CPU's sp_vocab_ce_*), one block of 512
 * threads per row for max and exp (the sums a fixed tree, not the CPU's column order), the
 * loss summed by one block in double. DIFFERS: a target outside [0,Vall) is not counted;
 * its target logit is NaN, and so the loss (sp_program_check_inputs catches it first). */
int sp_cuda_vocab_ce_max(float *rowmax, const float *logits, int N, int V, int valid,
                         void *stream);
int sp_cuda_vocab_ce_exp(float *exps, float *stats, int32_t *ltargets, const float *logits,
                         const int32_t *targets, const float *rowmax, int N, int V, int64_t lo,
                         int64_t Vall, void *stream);
int sp_cuda_vocab_ce_loss(float *loss, float *exps, const float *rowmax, const float *stats,
                          int N, int V, void *stream);
/* *out (device float) = sum of x (n), in double, rounded once. One block: fine up to tens
 * of millions of elements (a scalar loss is tiny). */
int sp_cuda_sum_forward(float *out, const float *x, int64_t n, void *stream);
/* DIFFERS: dx (n) = mult * *dout broadcast; dout is a DEVICE pointer to one float, mult a
 * host float (the CPU's dout_times_s = mult * dout: 1 for sum, 1/n for mean). */
int sp_cuda_sum_backward(float *dx, const float *dout, float mult, int64_t n, int acc,
                         void *stream);

/* NEW. The replicas' sum of one gradient shard: dst (n) = ((x0 + x1) + x2) + ... over R
 * replicas in order, x_own = dst's own values, others the R - 1 others in replica order
 * (device pointers); bitwise the CPU's sp_reduce_task_cpu (adds only). */
int sp_cuda_reduce_replicas(float *dst, const float *const *others, int R, int own, int64_t n,
                            void *stream);

/* ---- optim.cu */
/* Bit for bit the CPU's formula: the same host-side bias corrections, the same per-element
 * operations in the same order, with FMA contraction suppressed. */
int sp_cuda_adamw_update(float *param, float *m, float *v, const float *grad, int64_t n,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         float grad_scale, int t, void *stream);
/* DIFFERS: *out (device double) = sum of squares of x (n), in double, assigned (the CPU
 * returns it); the caller adds the per-tensor results. A block per chunk of
 * sp_cuda_sum_squares_chunk(n) elements (at most 1024 chunks), their partials summed by
 * one block: the order is fixed by n alone (optim.cu says which). Several chunks take a
 * stream-ordered scratch of 8 bytes per chunk (cudaMallocAsync). */
int sp_cuda_sum_squares(double *out, const float *x, int64_t n, void *stream);
int64_t sp_cuda_sum_squares_chunk(int64_t n);

/* ---- small device-side helpers (loss.cu) */
/* NEW. *x (device float) = value (host float), ordered on the stream: the loss seed. */
int sp_cuda_set_scalar(float *x, float value, void *stream);
/* NEW. x (n floats) = +0.0f (cudaMemsetAsync). */
int sp_cuda_fill_zero(float *x, int64_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
