/* LayerNorm over the last dim (eps 1e-5): forward saving mean and rstd, backward for x,
 * backward for gamma and beta; and RMSNorm (eps 1e-5, Llama's): the same without the
 * centering and the bias. Row reductions use 8 fixed partial sums (see row_sums). */
#include "codelets/cpu/kernels.h"

#include <math.h>
#include <string.h>

#include "codelets/cpu/v16_impl.h"
#include "codelets/cpu/vec_impl.h"

#define LN_EPS 1e-5f
#define RMS_EPS 1e-5f /* Llama's */

/* Row sums with 8 interleaved partial sums (lane j adds elements j, j + 8, ...) combined
 * in a fixed tree, then the tail in order: the bits do not depend on the vector width.
 * The lanes are an explicit 8-float vector: left to itself, GCC's AVX-512 clone
 * vectorized the 8 scalar sums two iterations at a time with shuffles, and layernorm's
 * rows of 512 ran at half the baseline's speed. One row's sum is one chain of dependent
 * adds (64 over 512 floats) that waits on the add's latency, so the sums of several rows
 * run side by side (LN_ROWS, LN_BWD_ROWS), each in its own row's order. */
typedef float v8f __attribute__((vector_size(32)));
typedef float v8f_un __attribute__((vector_size(32), aligned(4)));
#define LD8(p) (*(const v8f_un *)(p))
#define LN_ROWS 8     /* rows summed side by side: 8 chains cover the add's latency */
#define LN_BWD_ROWS 4 /* the backward has two sums a row */

/* The 8 lanes' fixed tree. Macros, not functions: an 8-float vector passed by value
 * makes GCC print an ABI note for the baseline clone. */
#define TREE8(s) ((((s)[0] + (s)[4]) + ((s)[1] + (s)[5])) + (((s)[2] + (s)[6]) + ((s)[3] + (s)[7])))

/* What a row sum adds up: x, (x - m)^2 (m the row's mean) or x^2. */
enum { SUM_X, SUM_SQDEV, SUM_SQ };
#define ROW_TERM(v, m, term) \
    ((term) == SUM_X ? (v) : (term) == SUM_SQ ? (v) * (v) : ((v) - (m)) * ((v) - (m)))

/* out[r] = the sum of row r's terms, R <= LN_ROWS rows of n, ld apart; m: the rows' means
 * (SUM_SQDEV). */
SP_V16_FN void row_sums(float *restrict out, const float *restrict x, int64_t ld,
                        const float *restrict m, int R, int n, int term)
{
    v8f s[LN_ROWS];
    float mr[LN_ROWS];
    for (int r = 0; r < R; r++)
        s[r] = (v8f){ 0 }, mr[r] = term == SUM_SQDEV ? m[r] : 0.0f;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int r = 0; r < R; r++) {
            const v8f v = LD8(x + r * ld + i);
            s[r] += ROW_TERM(v, mr[r], term);
        }
    for (int r = 0; r < R; r++) {
        float t = TREE8(s[r]);
        for (int j = i; j < n; j++)
            t += ROW_TERM(x[r * ld + j], mr[r], term);
        out[r] = t;
    }
}

/* LayerNorm (rms 0) or RMSNorm (rms 1, no mean, beta NULL) on R <= LN_ROWS rows of x (C
 * wide, from row 0 of every pointer). LayerNorm takes two passes (mean, then squared
 * deviations) rather than E[x^2] - E[x]^2: no cancellation when |mean| >> std. */
SP_V16_FN void norm_forward_rows(float *restrict out, float *restrict mean, float *restrict rstd,
                                 const float *restrict x, const float *restrict gamma,
                                 const float *restrict beta, int R, int C, int rms)
{
    float m[LN_ROWS] = { 0 }, var[LN_ROWS];
    if (!rms) {
        row_sums(m, x, C, NULL, R, C, SUM_X);
        for (int r = 0; r < R; r++)
            m[r] = m[r] / (float)C;
    }
    row_sums(var, x, C, m, R, C, rms ? SUM_SQ : SUM_SQDEV);
    for (int r = 0; r < R; r++) {
        const float *xr = x + (int64_t)r * C;
        float *o = out + (int64_t)r * C;
        const float s = 1.0f / sqrtf(var[r] / (float)C + (rms ? RMS_EPS : LN_EPS));
        if (rms) {
            for (int c = 0; c < C; c++)
                o[c] = xr[c] * s * gamma[c];
        } else {
            for (int c = 0; c < C; c++)
                o[c] = (xr[c] - m[r]) * s * gamma[c] + beta[c];
            mean[r] = m[r];
        }
        rstd[r] = s;
    }
}

/* Rows in groups of LN_ROWS, then one at a time. */
SP_V16_FN void norm_forward(float *restrict out, float *restrict mean, float *restrict rstd,
                            const float *restrict x, const float *restrict gamma,
                            const float *restrict beta, int N, int C, int rms)
{
    int n = 0;
    for (; n + LN_ROWS <= N; n += LN_ROWS)
        norm_forward_rows(out + (int64_t)n * C, rms ? NULL : mean + n, rstd + n,
                          x + (int64_t)n * C, gamma, beta, LN_ROWS, C, rms);
    for (; n < N; n++)
        norm_forward_rows(out + (int64_t)n * C, rms ? NULL : mean + n, rstd + n,
                          x + (int64_t)n * C, gamma, beta, 1, C, rms);
}

SP_VEC_FN void sp_layernorm_forward(float *restrict out, float *restrict mean,
                                    float *restrict rstd, const float *restrict x,
                                    const float *restrict gamma, const float *restrict beta,
                                    int N, int C)
{
    norm_forward(out, mean, rstd, x, gamma, beta, N, C, 0);
}

/* The backward's two row means, sum(g) and sum(g xhat) with g = gamma dout and xhat =
 * (x - mean) rstd (RMSNorm: x rstd, no sum(g)), over R <= LN_BWD_ROWS rows C wide: by
 * chunks of LN_CHUNK floats (each summed in row_sums' order), added in order. */
#define LN_CHUNK 512
#define XHAT(xv, m, s, rms) ((rms) ? (xv) * (s) : ((xv) - (m)) * (s)) /* x normalized */
SP_V16_FN void norm_bwd_sums(float *restrict sg, float *restrict sgx, const float *restrict d,
                             const float *restrict x, const float *restrict mean,
                             const float *restrict rstd, const float *restrict gamma, int R,
                             int C, int rms)
{
    float m[LN_BWD_ROWS], s[LN_BWD_ROWS];
    for (int r = 0; r < R; r++)
        sg[r] = 0.0f, sgx[r] = 0.0f, m[r] = rms ? 0.0f : mean[r], s[r] = rstd[r];
    for (int c0 = 0; c0 < C; c0 += LN_CHUNK) {
        const int len = C - c0 < LN_CHUNK ? C - c0 : LN_CHUNK;
        v8f a[LN_BWD_ROWS], b[LN_BWD_ROWS];
        for (int r = 0; r < R; r++)
            a[r] = (v8f){ 0 }, b[r] = (v8f){ 0 };
        int i = c0;
        for (; i + 8 <= c0 + len; i += 8) {
            const v8f gm = LD8(gamma + i);
            for (int r = 0; r < R; r++) {
                const v8f g = gm * LD8(d + (int64_t)r * C + i), xv = LD8(x + (int64_t)r * C + i);
                a[r] += g;
                b[r] += g * XHAT(xv, m[r], s[r], rms);
            }
        }
        for (int r = 0; r < R; r++) {
            float ta = TREE8(a[r]), tb = TREE8(b[r]);
            for (int j = i; j < c0 + len; j++) {
                const float g = gamma[j] * d[(int64_t)r * C + j], xv = x[(int64_t)r * C + j];
                ta += g;
                tb += g * XHAT(xv, m[r], s[r], rms);
            }
            sg[r] += ta;
            sgx[r] += tb;
        }
    }
}

/* dx = rstd (g - mean(g) - xhat mean(g xhat)); RMSNorm: dx = rstd (g - xhat mean(g xhat)).
 * R <= LN_BWD_ROWS rows from row 0 of every pointer. */
SP_V16_FN void norm_backward_x_rows(float *restrict dx, const float *restrict dout,
                                    const float *restrict x, const float *restrict mean,
                                    const float *restrict rstd, const float *restrict gamma,
                                    int R, int C, int acc, int rms)
{
    float sg[LN_BWD_ROWS], sgx[LN_BWD_ROWS];
    norm_bwd_sums(sg, sgx, dout, x, mean, rstd, gamma, R, C, rms);
    for (int r = 0; r < R; r++) {
        const float *d = dout + (int64_t)r * C, *xr = x + (int64_t)r * C;
        float *o = dx + (int64_t)r * C;
        const float s = rstd[r], mgx = sgx[r] / (float)C;
        if (rms) {
            for (int c = 0; c < C; c++) {
                const float v = s * (gamma[c] * d[c] - xr[c] * s * mgx);
                o[c] = acc ? o[c] + v : v;
            }
            continue;
        }
        const float m = mean[r], mg = sg[r] / (float)C;
        if (acc) {
            for (int c = 0; c < C; c++)
                o[c] += s * (gamma[c] * d[c] - mg - (xr[c] - m) * s * mgx);
        } else {
            for (int c = 0; c < C; c++)
                o[c] = s * (gamma[c] * d[c] - mg - (xr[c] - m) * s * mgx);
        }
    }
}

/* LayerNorm (rms 0, mean given) or RMSNorm (rms 1) backward for x, rows in groups. */
SP_V16_FN void norm_backward_x(float *restrict dx, const float *restrict dout,
                               const float *restrict x, const float *restrict mean,
                               const float *restrict rstd, const float *restrict gamma, int N,
                               int C, int acc, int rms)
{
    int n = 0;
    for (; n + LN_BWD_ROWS <= N; n += LN_BWD_ROWS) {
        const int64_t o = (int64_t)n * C;
        norm_backward_x_rows(dx + o, dout + o, x + o, rms ? NULL : mean + n, rstd + n, gamma,
                             LN_BWD_ROWS, C, acc, rms);
    }
    for (; n < N; n++) {
        const int64_t o = (int64_t)n * C;
        norm_backward_x_rows(dx + o, dout + o, x + o, rms ? NULL : mean + n, rstd + n, gamma,
                             1, C, acc, rms);
    }
}

SP_VEC_FN void sp_layernorm_backward_x(float *restrict dx, const float *restrict dout,
                                       const float *restrict x, const float *restrict mean,
                                       const float *restrict rstd, const float *restrict gamma,
                                       int N, int C, int acc)
{
    norm_backward_x(dx, dout, x, mean, rstd, gamma, N, C, acc, 0);
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
SP_VEC_FN void sp_rmsnorm_forward(float *restrict out, float *restrict rstd,
                                  const float *restrict x, const float *restrict weight, int N,
                                  int C)
{
    norm_forward(out, NULL, rstd, x, weight, NULL, N, C, 1);
}

/* dx = rstd (g - xhat mean(g xhat)), g = weight * dout, xhat = x rstd: layernorm's with no
 * mean to subtract. */
SP_VEC_FN void sp_rmsnorm_backward_x(float *restrict dx, const float *restrict dout,
                                     const float *restrict x, const float *restrict rstd,
                                     const float *restrict weight, int N, int C, int acc)
{
    norm_backward_x(dx, dout, x, NULL, rstd, weight, N, C, acc, 1);
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
