/* The CPU backend (include/starpipe/backend.h): each entry calls its kernel of
 * codelets/cpu/kernels.h on host memory, as is. Only the index checks and the scalars
 * that the table keeps in the backend's memory (dloss, the sum's upstream) add code. */
#include "starpipe/backend.h"

#include <string.h>

#include "codelets/cpu/kernels.h"

static int matmul(void *c, float *out, const void *a, const void *b, int M, int Nc, int K,
                  int ta, int tb, int acc, int prec)
{
    if (prec & SP_PREC_BF16)
        return sp_matmul_forward_bf16(out, a, b, M, Nc, K, ta, tb, acc, !!(prec & SP_PREC_A16),
                                      !!(prec & SP_PREC_B16));
    sp_matmul_forward(out, a, b, M, Nc, K, ta, tb, acc);
    return 0;
}

static int matmul_bias(void *c, float *out, const void *a, const void *b, const float *bias,
                       int M, int Nc, int K, int ta, int tb, int prec)
{
    if (prec & SP_PREC_BF16)
        return sp_matmul_forward_bias_bf16(out, a, b, bias, M, Nc, K, ta, tb,
                                           !!(prec & SP_PREC_A16), !!(prec & SP_PREC_B16));
    sp_matmul_forward_bias(out, a, b, bias, M, Nc, K, ta, tb);
    return 0;
}

static int bias_add(void *c, float *out, const float *x, const float *bias, int N, int C)
{
    sp_bias_add_forward(out, x, bias, N, C);
    return 0;
}

static int add(void *c, float *out, const float *a, const float *b, int64_t n)
{
    sp_add_forward(out, a, b, n);
    return 0;
}

static int maximum(void *c, float *out, const float *a, const float *b, int64_t n)
{
    sp_maximum_forward(out, a, b, n);
    return 0;
}

static int scale(void *c, float *out, const float *x, float s, int64_t n, int acc)
{
    sp_scale_backward(out, x, s, n, acc);
    return 0;
}

static int gelu(void *c, float *out, const float *x, int64_t n)
{
    sp_gelu_forward(out, x, n);
    return 0;
}

static int relu(void *c, float *out, const float *x, int64_t n)
{
    sp_relu_forward(out, x, n);
    return 0;
}

static int layernorm(void *c, float *out, float *mean, float *rstd, const float *x,
                     const float *gamma, const float *beta, int N, int C)
{
    sp_layernorm_forward(out, mean, rstd, x, gamma, beta, N, C);
    return 0;
}

static int rmsnorm(void *c, float *out, float *rstd, const float *x, const float *weight, int N,
                   int C)
{
    sp_rmsnorm_forward(out, rstd, x, weight, N, C);
    return 0;
}

static int embed(void *c, float *out, const int32_t *tokens, const float *wte, const float *wpe,
                 int B, int T, int C, int64_t V)
{
    for (int64_t k = 0; k < (int64_t)B * T; k++)
        if (tokens[k] < 0 || tokens[k] >= V) return SP_BACKEND_BAD_INDEX;
    sp_embed_forward(out, tokens, wte, wpe, B, T, C);
    return 0;
}

static int attention(void *c, float *out, float *lse, float *scratch, const float *qkv, int B,
                     int T, int C, int NH, int group, int prec)
{
    sp_attention_gqa_forward(out, lse, scratch, qkv, B, T, C, NH, group, prec & SP_PREC_BF16);
    return 0;
}

static int rope(void *c, float *out, const float *x, int B, int T, int D, int hs, int period,
                int rotated, float theta, int inverse, int acc)
{
    sp_rope_forward(out, x, B, T, D, hs, period, rotated, theta, inverse, acc);
    return 0;
}

static int swiglu(void *c, float *out, const float *x, int N, int I)
{
    sp_swiglu_forward(out, x, N, I);
    return 0;
}

static int swiglu_dx(void *c, float *dx, const float *x, const float *dout, int N, int I,
                     int acc)
{
    sp_swiglu_backward(dx, x, dout, N, I, acc);
    return 0;
}

static int cross_entropy(void *c, float *loss, float *probs, const float *logits,
                         const int32_t *targets, int N, int V, int valid, float *scratch)
{
    return sp_cross_entropy_forward(loss, probs, logits, targets, N, V, valid)
               ? SP_BACKEND_BAD_INDEX : 0;
}

static int embed_vocab(void *c, float *out, const int32_t *tokens, const float *wte, int N,
                       int C, int64_t lo, int64_t rows, int64_t V)
{
    for (int64_t k = 0; k < N; k++)
        if (tokens[k] < 0 || tokens[k] >= V) return SP_BACKEND_BAD_INDEX;
    sp_embed_vocab_forward(out, tokens, wte, N, C, lo, rows);
    return 0;
}

static int embed_vocab_dwte(void *c, float *dwte, const float *dout, const int32_t *tokens,
                            int N, int C, int64_t lo, int64_t rows)
{
    sp_embed_vocab_backward(dwte, dout, tokens, N, C, lo, rows);
    return 0;
}

static int vocab_ce_max(void *c, float *rowmax, const float *logits, int N, int V, int valid)
{
    sp_vocab_ce_max(rowmax, logits, N, V, valid);
    return 0;
}

static int vocab_ce_exp(void *c, float *exps, float *stats, int32_t *ltargets,
                        const float *logits, const int32_t *targets, const float *rowmax, int N,
                        int V, int64_t lo, int64_t Vall)
{
    return sp_vocab_ce_exp(exps, stats, ltargets, logits, targets, rowmax, N, V, lo, Vall)
               ? SP_BACKEND_BAD_INDEX : 0;
}

static int vocab_ce_loss(void *c, float *loss, float *exps, const float *rowmax,
                         const float *stats, int N, int V)
{
    sp_vocab_ce_loss(loss, exps, rowmax, stats, N, V);
    return 0;
}

static int sum(void *c, float *out, const float *x, int64_t n)
{
    sp_sum_forward(out, x, n);
    return 0;
}

static int matmul_da(void *c, float *da, const float *dout, const void *b, int M, int Nc, int K,
                     int ta, int tb, int acc, int prec)
{
    if (prec & SP_PREC_BF16)
        return sp_matmul_backward_a_bf16(da, dout, b, M, Nc, K, ta, tb, acc,
                                         !!(prec & SP_PREC_B16));
    sp_matmul_backward_a(da, dout, b, M, Nc, K, ta, tb, acc);
    return 0;
}

static int matmul_db(void *c, float *db, const float *dout, const void *a, int M, int Nc, int K,
                     int ta, int tb, int acc, int prec)
{
    if (prec & SP_PREC_BF16)
        return sp_matmul_backward_b_bf16(db, dout, a, M, Nc, K, ta, tb, acc,
                                         !!(prec & SP_PREC_A16));
    sp_matmul_backward_b(db, dout, a, M, Nc, K, ta, tb, acc);
    return 0;
}

static int bias_db(void *c, float *dbias, const float *dout, int N, int C, int acc)
{
    sp_bias_add_backward_bias(dbias, dout, N, C, acc);
    return 0;
}

static int gelu_dx(void *c, float *dx, const float *x, const float *dout, int64_t n, int acc)
{
    sp_gelu_backward(dx, x, dout, n, acc);
    return 0;
}

static int relu_dx(void *c, float *dx, const float *x, const float *dout, int64_t n, int acc)
{
    sp_relu_backward(dx, x, dout, n, acc);
    return 0;
}

static int layernorm_dx(void *c, float *dx, const float *dout, const float *x,
                        const float *mean, const float *rstd, const float *gamma, int N, int C,
                        int acc)
{
    sp_layernorm_backward_x(dx, dout, x, mean, rstd, gamma, N, C, acc);
    return 0;
}

static int layernorm_dparams(void *c, float *dgamma, float *dbeta, const float *dout,
                             const float *x, const float *mean, const float *rstd, int N, int C,
                             int acc)
{
    sp_layernorm_backward_params(dgamma, dbeta, dout, x, mean, rstd, N, C, acc);
    return 0;
}

static int rmsnorm_dx(void *c, float *dx, const float *dout, const float *x, const float *rstd,
                      const float *weight, int N, int C, int acc)
{
    sp_rmsnorm_backward_x(dx, dout, x, rstd, weight, N, C, acc);
    return 0;
}

static int rmsnorm_dweight(void *c, float *dweight, const float *dout, const float *x,
                           const float *rstd, int N, int C, int acc)
{
    sp_rmsnorm_backward_weight(dweight, dout, x, rstd, N, C, acc);
    return 0;
}

static int embed_dparams(void *c, float *dwte, float *dwpe, const float *dout,
                         const int32_t *tokens, int B, int T, int C)
{
    sp_embed_backward(dwte, dwpe, dout, tokens, B, T, C);
    return 0;
}

static int attention_dx(void *c, float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *out, const float *lse, int B, int T,
                        int C, int NH, int group, int acc, int prec)
{
    sp_attention_gqa_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, group, acc,
                              prec & SP_PREC_BF16);
    return 0;
}

static int cross_entropy_dx(void *c, float *dlogits, const float *probs,
                            const int32_t *targets, const float *dloss, int N, int V, int acc)
{
    sp_cross_entropy_backward(dlogits, probs, targets, *dloss, N, V, acc);
    return 0;
}

static int sum_dx(void *c, float *dx, const float *dout, float s, int64_t n, int acc)
{
    sp_sum_backward(dx, s * *dout, n, acc);
    return 0;
}

static int set(void *c, float *x, float value)
{
    *x = value;
    return 0;
}

static int zero(void *c, float *x, int64_t n)
{
    memset(x, 0, (size_t)n * sizeof(float));
    return 0;
}

static int to_bf16(void *c, uint16_t *out, const float *x, int64_t n)
{
    sp_to_bf16(out, x, n);
    return 0;
}

static int adamw(void *c, float *param, float *m, float *v, const float *grad, int64_t n,
                 float lr, float beta1, float beta2, float eps, float weight_decay,
                 float grad_scale, int t)
{
    sp_adamw_update(param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
    return 0;
}

static int sum_squares(void *c, double *out, const float *x, int64_t n)
{
    (void)c;
    *out = sp_sum_squares(x, n);
    return 0;
}

static int copy(void *c, float *out, const float *x, int64_t n)
{
    memcpy(out, x, (size_t)n * sizeof(float));
    return 0;
}

static int reduce_replicas(void *c, float *dst, const float *const *others, int R, int own,
                           int64_t n)
{
    sp_reduce_replicas(dst, others, R, own, n);
    return 0;
}

static const char *status_string(int code)
{
    return code == SP_BACKEND_BAD_INDEX ? "an index outside its range (a token or a target)"
           : code == SP_KERNEL_NOMEM ? "out of memory for the bf16 rounding of an operand"
                                     : "unknown CPU status";
}

static const sp_backend cpu = { .name = "cpu", SP_BACKEND_ENTRIES,
                                .status_string = status_string };

const sp_backend *sp_backend_cpu(void) { return &cpu; }
