/* The CUDA backend (include/starpipe/backend.h): each entry enqueues its kernel of
 * codelets/cuda/kernels_cuda.h on the context's stream, with its cuBLAS handle; the
 * interpreter that walks a stage program, the optimizer's parameter loop and the task
 * functions (codelets/tasks.c) are the same the CPU runs. Nothing here synchronizes: StarPU's CUDA worker waits for the
 * stream when the task ends (STARPU_CUDA_ASYNC). Integer inputs were range-checked on the
 * host before the step (sp_program_check_inputs): embed cannot check them here. */
#include "codelets/cuda/backend.h"

#include <cuda_runtime_api.h>

#include "codelets/cuda/kernels_cuda.h"

#define STREAM(c) (((sp_cuda_ctx *)(c))->stream)
#define CUBLAS(c) (((sp_cuda_ctx *)(c))->cublas)

static int matmul(void *c, float *out, const void *a, const void *b, int M, int Nc, int K,
                  int ta, int tb, int acc, int prec)
{
    if (prec & SP_PREC_BF16)
        return sp_cuda_matmul_forward_bf16(out, a, b, M, Nc, K, ta, tb, acc,
                                           !!(prec & SP_PREC_A16), !!(prec & SP_PREC_B16),
                                           STREAM(c), CUBLAS(c));
    return sp_cuda_matmul_forward(out, a, b, M, Nc, K, ta, tb, acc, STREAM(c), CUBLAS(c));
}

/* cuBLAS's product, then the bias added in place on the same stream: bias_add's bits on
 * matmul's (a cuBLASLt bias epilogue would save the pass, with bits of its own) */
static int matmul_bias(void *c, float *out, const void *a, const void *b, const float *bias,
                       int M, int Nc, int K, int ta, int tb, int prec)
{
    int rc = matmul(c, out, a, b, M, Nc, K, ta, tb, 0, prec);
    return rc ? rc : sp_cuda_bias_add_forward(out, out, bias, M, Nc, STREAM(c));
}

static int bias_add(void *c, float *out, const float *x, const float *bias, int N, int C)
{
    return sp_cuda_bias_add_forward(out, x, bias, N, C, STREAM(c));
}

static int add(void *c, float *out, const float *a, const float *b, int64_t n)
{
    return sp_cuda_add_forward(out, a, b, n, STREAM(c));
}

static int maximum(void *c, float *out, const float *a, const float *b, int64_t n)
{
    return sp_cuda_maximum_forward(out, a, b, n, STREAM(c));
}

static int scale(void *c, float *out, const float *x, float s, int64_t n, int acc)
{
    return sp_cuda_scale_backward(out, x, s, n, acc, STREAM(c));
}

static int gelu(void *c, float *out, const float *x, int64_t n)
{
    return sp_cuda_gelu_forward(out, x, n, STREAM(c));
}

static int relu(void *c, float *out, const float *x, int64_t n)
{
    return sp_cuda_relu_forward(out, x, n, STREAM(c));
}

static int layernorm(void *c, float *out, float *mean, float *rstd, const float *x,
                     const float *gamma, const float *beta, int N, int C)
{
    return sp_cuda_layernorm_forward(out, mean, rstd, x, gamma, beta, N, C, STREAM(c));
}

static int rmsnorm(void *c, float *out, float *rstd, const float *x, const float *weight, int N,
                   int C)
{
    return sp_cuda_rmsnorm_forward(out, rstd, x, weight, N, C, STREAM(c));
}

static int rope(void *c, float *out, const float *x, int B, int T, int D, int hs, int period,
                int rotated, float theta, int inverse, int acc)
{
    return sp_cuda_rope_forward(out, x, B, T, D, hs, period, rotated, theta, inverse, acc,
                                STREAM(c));
}

static int swiglu(void *c, float *out, const float *x, int N, int I)
{
    return sp_cuda_swiglu_forward(out, x, N, I, STREAM(c));
}

static int embed(void *c, float *out, const int32_t *tokens, const float *wte, const float *wpe,
                 int B, int T, int C, int64_t V)
{
    return sp_cuda_embed_forward(out, tokens, wte, wpe, B, T, C, STREAM(c));
}

/* bf16: the tensor-core kernels; heads wider than they take (SP_CUDA_ATTN_BF16_MAX_HS)
 * go to the fp32 kernels, which agree with the CPU's bf16 attention within bf16's error
 * only, not by its rounding points. */
static int attention(void *c, float *out, float *lse, float *scratch, const float *qkv, int B,
                     int T, int C, int NH, int group, int prec)
{
    if ((prec & SP_PREC_BF16) && NH > 0 && C / NH <= SP_CUDA_ATTN_BF16_MAX_HS)
        return sp_cuda_attention_forward_bf16(out, lse, scratch, qkv, B, T, C, NH, group,
                                              STREAM(c), CUBLAS(c));
    return sp_cuda_attention_forward(out, lse, scratch, qkv, B, T, C, NH, group, STREAM(c),
                                     CUBLAS(c));
}

/* scratch: N doubles of per-row losses, then the bad-target count (left on the device) */
static int cross_entropy(void *c, float *loss, float *probs, const float *logits,
                         const int32_t *targets, int N, int V, int valid, float *scratch)
{
    return sp_cuda_cross_entropy_forward(loss, probs, logits, targets, N, V, valid,
                                         (int *)(scratch + 2 * (int64_t)N), scratch, STREAM(c));
}

/* the token range was checked on the host (sp_program_check_inputs); V is unused here */
static int embed_vocab(void *c, float *out, const int32_t *tokens, const float *wte, int N,
                       int C, int64_t lo, int64_t rows, int64_t V)
{
    return sp_cuda_embed_vocab_forward(out, tokens, wte, N, C, lo, rows, STREAM(c));
}

static int embed_vocab_dwte(void *c, float *dwte, const float *dout, const int32_t *tokens,
                            int N, int C, int64_t lo, int64_t rows)
{
    return sp_cuda_embed_vocab_backward(dwte, dout, tokens, N, C, lo, rows, STREAM(c));
}

static int vocab_ce_max(void *c, float *rowmax, const float *logits, int N, int V, int valid)
{
    return sp_cuda_vocab_ce_max(rowmax, logits, N, V, valid, STREAM(c));
}

static int vocab_ce_exp(void *c, float *exps, float *stats, int32_t *ltargets,
                        const float *logits, const int32_t *targets, const float *rowmax, int N,
                        int V, int64_t lo, int64_t Vall)
{
    return sp_cuda_vocab_ce_exp(exps, stats, ltargets, logits, targets, rowmax, N, V, lo, Vall,
                                STREAM(c));
}

static int vocab_ce_loss(void *c, float *loss, float *exps, const float *rowmax,
                         const float *stats, int N, int V)
{
    return sp_cuda_vocab_ce_loss(loss, exps, rowmax, stats, N, V, STREAM(c));
}

static int sum(void *c, float *out, const float *x, int64_t n)
{
    return sp_cuda_sum_forward(out, x, n, STREAM(c));
}

static int matmul_da(void *c, float *da, const float *dout, const void *b, int M, int Nc, int K,
                     int ta, int tb, int acc, int prec)
{
    if (prec & SP_PREC_BF16)
        return sp_cuda_matmul_backward_a_bf16(da, dout, b, M, Nc, K, ta, tb, acc,
                                              !!(prec & SP_PREC_B16), STREAM(c), CUBLAS(c));
    return sp_cuda_matmul_backward_a(da, dout, b, M, Nc, K, ta, tb, acc, STREAM(c), CUBLAS(c));
}

static int matmul_db(void *c, float *db, const float *dout, const void *a, int M, int Nc, int K,
                     int ta, int tb, int acc, int prec)
{
    if (prec & SP_PREC_BF16)
        return sp_cuda_matmul_backward_b_bf16(db, dout, a, M, Nc, K, ta, tb, acc,
                                              !!(prec & SP_PREC_A16), STREAM(c), CUBLAS(c));
    return sp_cuda_matmul_backward_b(db, dout, a, M, Nc, K, ta, tb, acc, STREAM(c), CUBLAS(c));
}

static int bias_db(void *c, float *dbias, const float *dout, int N, int C, int acc)
{
    return sp_cuda_bias_add_backward_bias(dbias, dout, N, C, acc, STREAM(c));
}

static int gelu_dx(void *c, float *dx, const float *x, const float *dout, int64_t n, int acc)
{
    return sp_cuda_gelu_backward(dx, x, dout, n, acc, STREAM(c));
}

static int relu_dx(void *c, float *dx, const float *x, const float *dout, int64_t n, int acc)
{
    return sp_cuda_relu_backward(dx, x, dout, n, acc, STREAM(c));
}

static int layernorm_dx(void *c, float *dx, const float *dout, const float *x,
                        const float *mean, const float *rstd, const float *gamma, int N, int C,
                        int acc)
{
    return sp_cuda_layernorm_backward_x(dx, dout, x, mean, rstd, gamma, N, C, acc, STREAM(c));
}

static int layernorm_dparams(void *c, float *dgamma, float *dbeta, const float *dout,
                             const float *x, const float *mean, const float *rstd, int N, int C,
                             int acc)
{
    return sp_cuda_layernorm_backward_params(dgamma, dbeta, dout, x, mean, rstd, N, C, acc,
                                             STREAM(c));
}

static int rmsnorm_dx(void *c, float *dx, const float *dout, const float *x, const float *rstd,
                      const float *weight, int N, int C, int acc)
{
    return sp_cuda_rmsnorm_backward_x(dx, dout, x, rstd, weight, N, C, acc, STREAM(c));
}

static int rmsnorm_dweight(void *c, float *dweight, const float *dout, const float *x,
                           const float *rstd, int N, int C, int acc)
{
    return sp_cuda_rmsnorm_backward_weight(dweight, dout, x, rstd, N, C, acc, STREAM(c));
}

static int embed_dparams(void *c, float *dwte, float *dwpe, const float *dout,
                         const int32_t *tokens, int B, int T, int C)
{
    return sp_cuda_embed_backward(dwte, dwpe, dout, tokens, B, T, C, STREAM(c));
}

static int attention_dx(void *c, float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *out, const float *lse, int B, int T,
                        int C, int NH, int group, int acc, int prec)
{
    if ((prec & SP_PREC_BF16) && NH > 0 && C / NH <= SP_CUDA_ATTN_BF16_MAX_HS)
        return sp_cuda_attention_backward_bf16(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH,
                                               group, acc, STREAM(c), CUBLAS(c));
    return sp_cuda_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, group,
                                      acc, STREAM(c), CUBLAS(c));
}

static int swiglu_dx(void *c, float *dx, const float *x, const float *dout, int N, int I,
                     int acc)
{
    return sp_cuda_swiglu_backward(dx, x, dout, N, I, acc, STREAM(c));
}

static int cross_entropy_dx(void *c, float *dlogits, const float *probs,
                            const int32_t *targets, const float *dloss, int N, int V, int acc)
{
    return sp_cuda_cross_entropy_backward(dlogits, probs, targets, dloss, 1.0f, N, V, acc,
                                          STREAM(c));
}

static int sum_dx(void *c, float *dx, const float *dout, float s, int64_t n, int acc)
{
    return sp_cuda_sum_backward(dx, dout, s, n, acc, STREAM(c));
}

static int set(void *c, float *x, float value) { return sp_cuda_set_scalar(x, value, STREAM(c)); }

static int zero(void *c, float *x, int64_t n) { return sp_cuda_fill_zero(x, n, STREAM(c)); }

static int to_bf16(void *c, uint16_t *out, const float *x, int64_t n)
{
    return sp_cuda_to_bf16(out, x, n, STREAM(c));
}

static int adamw(void *c, float *param, float *m, float *v, const float *grad, int64_t n,
                 float lr, float beta1, float beta2, float eps, float weight_decay,
                 float grad_scale, int t)
{
    return sp_cuda_adamw_update(param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay,
                                grad_scale, t, STREAM(c));
}

static int sum_squares(void *c, double *out, const float *x, int64_t n)
{
    return sp_cuda_sum_squares(out, x, n, STREAM(c));
}

static int copy(void *c, float *out, const float *x, int64_t n)
{
    cudaError_t e = cudaMemcpyAsync(out, x, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
                                    (cudaStream_t)STREAM(c));
    return e == cudaSuccess ? 0 : (int)e;
}

static int reduce_replicas(void *c, float *dst, const float *const *others, int R, int own,
                           int64_t n)
{
    return sp_cuda_reduce_replicas(dst, others, R, own, n, STREAM(c));
}

static const sp_backend cuda = { .name = "cuda", SP_BACKEND_ENTRIES,
                                 .status_string = sp_cuda_status_string };

const sp_backend *sp_backend_cuda(void) { return &cuda; }
