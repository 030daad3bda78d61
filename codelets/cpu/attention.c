/* Causal multi-head self-attention: forward saves the softmax probabilities; backward
 * uses them. Per (batch, head) the four products are strided sgemm calls on the packed qkv. */
#include "codelets/cpu/kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* The products run on the full T x T square (the masked half is multiplied by exact
 * zeros): twice the causal FLOPs, but at sgemm speed rather than that of dot loops.
 * Each (b, h) writes its own columns of out and dqkv exactly once, so acc maps onto
 * sgemm's beta as in matmul.c. */

void sp_attention_forward(float *restrict out, float *restrict att, const float *restrict qkv,
                          int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || NH <= 0)
        return;
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (int64_t)b * T * C3 + h * hs;
            float *a = att + ((int64_t)b * NH + h) * T * T;
            /* scores (T,T) = scale q k^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, q + C,
                        C3, 0.0f, a, T);
            for (int t = 0; t < T; t++) {
                float *r = a + (int64_t)t * T;
                float maxv = r[0];
                for (int t2 = 1; t2 <= t; t2++)
                    maxv = r[t2] > maxv ? r[t2] : maxv;
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    r[t2] = expf(r[t2] - maxv);
                    sum += r[t2];
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 <= t; t2++)
                    r[t2] *= inv;
                for (int t2 = t + 1; t2 < T; t2++)
                    r[t2] = 0.0f;
            }
            /* out_h (T,hs) = att v */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, q + 2 * C,
                        C3, 0.0f, out + (int64_t)b * T * C + h * hs, C);
        }
}

/* datt = dout v^T; dv = att^T dout; dpre = att (datt - rowsum(att datt)) scale (the
 * softmax backward, zero above the diagonal); dq = dpre k; dk = dpre^T q.
 * scratch holds datt, then dpre in place: T*T floats. */
void sp_attention_backward(float *restrict dqkv, float *restrict scratch,
                           const float *restrict dout, const float *restrict qkv,
                           const float *restrict att, int B, int T, int C, int NH, int acc)
{
    if (B <= 0 || T <= 0 || NH <= 0)
        return;
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs), beta = acc ? 1.0f : 0.0f;
    float *dp = scratch;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (int64_t)b * T * C3 + h * hs;
            const float *a = att + ((int64_t)b * NH + h) * T * T;
            const float *d = dout + (int64_t)b * T * C + h * hs;
            float *dq = dqkv + (int64_t)b * T * C3 + h * hs;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, q + 2 * C,
                        C3, 0.0f, dp, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, d, C, beta,
                        dq + 2 * C, C3);
            for (int t = 0; t < T; t++) {
                const float *ar = a + (int64_t)t * T;
                float *r = dp + (int64_t)t * T;
                float s = 0.0f;
                for (int t2 = 0; t2 <= t; t2++)
                    s += ar[t2] * r[t2];
                for (int t2 = 0; t2 <= t; t2++)
                    r[t2] = ar[t2] * (r[t2] - s) * scale;
                for (int t2 = t + 1; t2 < T; t2++)
                    r[t2] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, dp, T, q + C,
                        C3, beta, dq, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, dp, T, q, C3, beta,
                        dq + C, C3);
        }
}

int64_t sp_attention_scratch_floats(int B, int T, int C, int NH)
{
    return T > 0 ? (int64_t)T * T : 1;
}
