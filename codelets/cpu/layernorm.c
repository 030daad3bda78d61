/* LayerNorm over the last dim (eps 1e-5): forward saving mean and rstd, backward for x,
 * backward for gamma and beta; and RMSNorm (eps 1e-5, Llama's): the same without the
 * centering and the bias. Row reductions use 8 fixed partial sums (see sum8). */
#include "codelets/cpu/kernels.h"

#include <math.h>
#include <string.h>

#include "codelets/cpu/v16_impl.h"
#include "codelets/cpu/vec_impl.h"

#define LN_EPS 1e-5f

/* Row sums with 8 interleaved partial sums (lane j adds elements j, j + 8, ...) combined
 * in a fixed tree, then the tail in order: the bits do not depend on the vector width.
 * The lanes are an explicit 8-float vector: left to itself, GCC's AVX-512 clone
 * vectorized the 8 scalar sums two iterations at a time with shuffles, and layernorm's
 * rows of 512 ran at half the baseline's speed. */
typedef float v8f __attribute__((vector_size(32)));
typedef float v8f_un __attribute__((vector_size(32), aligned(4)));
#define LD8(p) (*(const v8f_un *)(p))

SP_V16_FN float tree8(v8f s)
{
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* Sum of x (n). */
SP_V16_FN float sum8(const float *restrict x, int n)
{
    v8f s = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8)
        s += LD8(x + i);
    float r = tree8(s);
    for (; i < n; i++)
        r += x[i];
    return r;
}

/* Sum of (x - m)^2 and of a*b, same pattern as sum8. */
SP_V16_FN float sumsqdev8(const float *restrict x, float m, int n)
{
    v8f s = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const v8f d = LD8(x + i) - m;
        s += d * d;
    }
    float r = tree8(s);
    for (; i < n; i++)
        r += (x[i] - m) * (x[i] - m);
    return r;
}

SP_V16_FN float dot8(const float *restrict a, const float *restrict b, int n)
{
    v8f s = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8)
        s += LD8(a + i) * LD8(b + i);
    float r = tree8(s);
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

/* Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2: no
 * cancellation when |mean| >> std. */
SP_VEC_FN void sp_layernorm_forward(float *restrict out, float *restrict mean,
                                    float *restrict rstd, const float *restrict x,
                                    const float *restrict gamma, const float *restrict beta,
                                    int N, int C)
{
    for (int n = 0; n < N; n++) {
        const float *xr = x + (int64_t)n * C;
        float *o = out + (int64_t)n * C;
        float m = sum8(xr, C) / (float)C;
        float var = sumsqdev8(xr, m, C) / (float)C;
        float s = 1.0f / sqrtf(var + LN_EPS);
        for (int c = 0; c < C; c++)
            o[c] = (xr[c] - m) * s * gamma[c] + beta[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

/* dx = rstd (g - mean(g) - xhat mean(g xhat)), g = gamma * dout, xhat = (x - mean) rstd.
 * g and xhat are staged in stack chunks so the row sums use the helpers above without
 * any allocation. */
#define LN_CHUNK 512
SP_VEC_FN void sp_layernorm_backward_x(float *restrict dx, const float *restrict dout,
                                       const float *restrict x, const float *restrict mean,
                                       const float *restrict rstd, const float *restrict gamma,
                                       int N, int C, int acc)
{
    float g[LN_CHUNK], xh[LN_CHUNK];
    for (int n = 0; n < N; n++) {
        const float *d = dout + (int64_t)n * C;
        const float *xr = x + (int64_t)n * C;
        float *o = dx + (int64_t)n * C;
        float m = mean[n], s = rstd[n];
        /* Both means are sums over the row, accumulated chunk by chunk in order. */
        float sg = 0.0f, sgx = 0.0f;
        for (int c0 = 0; c0 < C; c0 += LN_CHUNK) {
            int len = C - c0 < LN_CHUNK ? C - c0 : LN_CHUNK;
            for (int c = 0; c < len; c++) {
                g[c] = gamma[c0 + c] * d[c0 + c];
                xh[c] = (xr[c0 + c] - m) * s;
            }
            sg += sum8(g, len);
            sgx += dot8(g, xh, len);
        }
        float mg = sg / (float)C, mgx = sgx / (float)C;
        if (acc) {
            for (int c = 0; c < C; c++)
                o[c] += s * (gamma[c] * d[c] - mg - (xr[c] - m) * s * mgx);
        } else {
            for (int c = 0; c < C; c++)
                o[c] = s * (gamma[c] * d[c] - mg - (xr[c] - m) * s * mgx);
        }
    }
}

SP_VEC_FN void sp_layernorm_backward_params(float *restrict dgamma, float *restrict dbeta,
                                            const float *restrict dout,
                                            const float *restrict x,
                                            const float *restrict mean,
                                            const float *restrict rstd, int N, int C, int acc)
{
    if (!acc && C > 0) {
        memset(dgamma, 0, sizeof(float) * (size_t)C);
        memset(dbeta, 0, sizeof(float) * (size_t)C);
    }
    for (int n = 0; n < N; n++) {
        const float *d = dout + (int64_t)n * C;
        const float *xr = x + (int64_t)n * C;
        float m = mean[n], s = rstd[n];
        for (int c = 0; c < C; c++) {
            dgamma[c] += (xr[c] - m) * s * d[c];
            dbeta[c] += d[c];
        }
    }
}

/* RMSNorm: out = x rstd weight, rstd = 1/sqrt(mean(x^2) + eps); saves rstd (N). */
#define RMS_EPS 1e-5f
SP_VEC_FN void sp_rmsnorm_forward(float *restrict out, float *restrict rstd,
                                  const float *restrict x, const float *restrict weight, int N,
                                  int C)
{
    for (int n = 0; n < N; n++) {
        const float *xr = x + (int64_t)n * C;
        float *o = out + (int64_t)n * C;
        float s = 1.0f / sqrtf(dot8(xr, xr, C) / (float)C + RMS_EPS);
        for (int c = 0; c < C; c++)
            o[c] = xr[c] * s * weight[c];
        rstd[n] = s;
    }
}

/* dx = rstd (g - xhat mean(g xhat)), g = weight * dout, xhat = x rstd: layernorm's with no
 * mean to subtract. */
SP_VEC_FN void sp_rmsnorm_backward_x(float *restrict dx, const float *restrict dout,
                                     const float *restrict x, const float *restrict rstd,
                                     const float *restrict weight, int N, int C, int acc)
{
    float g[LN_CHUNK], xh[LN_CHUNK];
    for (int n = 0; n < N; n++) {
        const float *d = dout + (int64_t)n * C;
        const float *xr = x + (int64_t)n * C;
        float *o = dx + (int64_t)n * C;
        float s = rstd[n], sgx = 0.0f;
        for (int c0 = 0; c0 < C; c0 += LN_CHUNK) {
            int len = C - c0 < LN_CHUNK ? C - c0 : LN_CHUNK;
            for (int c = 0; c < len; c++) {
                g[c] = weight[c0 + c] * d[c0 + c];
                xh[c] = xr[c0 + c] * s;
            }
            sgx += dot8(g, xh, len);
        }
        float mgx = sgx / (float)C;
        for (int c = 0; c < C; c++) {
            float v = s * (weight[c] * d[c] - xr[c] * s * mgx);
            o[c] = acc ? o[c] + v : v;
        }
    }
}

/* dweight (C) += sum over rows of x rstd dout, rows in order (= with acc 0). */
SP_VEC_FN void sp_rmsnorm_backward_weight(float *restrict dweight,
                                          const float *restrict dout,
                                          const float *restrict x, const float *restrict rstd,
                                          int N, int C, int acc)
{
    if (!acc && C > 0) memset(dweight, 0, sizeof(float) * (size_t)C);
    for (int n = 0; n < N; n++) {
        const float *d = dout + (int64_t)n * C;
        const float *xr = x + (int64_t)n * C;
        float s = rstd[n];
        for (int c = 0; c < C; c++)
            dweight[c] += xr[c] * s * d[c];
    }
}
