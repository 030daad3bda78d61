/* Causal multi-head self-attention, llm.c-style: forward saves the softmax probabilities,
 * backward recomputes nothing else and works one (b, h, t) row at a time. */
#include "codelets/cpu/kernels.h"

#include <math.h>
#include <string.h>

/* Dot product with 8 fixed partial sums: vectorizable without -ffast-math, same bits
 * whether or not the compiler vectorizes it. */
static inline float dot8(const float *restrict a, const float *restrict b, int n)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            s[j] += a[i + j] * b[i + j];
    float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

/* y (n) += a x. */
static inline void axpy(float *restrict y, float a, const float *restrict x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

void sp_attention_forward(float *restrict out, float *restrict att, const float *restrict qkv,
                          int B, int T, int C, int NH)
{
    const int hs = C / NH;
    const int64_t C3 = 3 * (int64_t)C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((int64_t)b * T + t) * C3 + h * hs;
                float *a = att + (((int64_t)b * NH + h) * T + t) * T;
                float maxv = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((int64_t)b * T + t2) * C3 + C + h * hs;
                    float s = dot8(q, k, hs) * scale;
                    a[t2] = s;
                    maxv = s > maxv ? s : maxv;
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    float e = expf(a[t2] - maxv);
                    a[t2] = e;
                    sum += e;
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 <= t; t2++)
                    a[t2] *= inv;
                for (int t2 = t + 1; t2 < T; t2++)
                    a[t2] = 0.0f;
                float *o = out + ((int64_t)b * T + t) * C + h * hs;
                memset(o, 0, sizeof(float) * (size_t)hs);
                for (int t2 = 0; t2 <= t; t2++)
                    axpy(o, a[t2], qkv + ((int64_t)b * T + t2) * C3 + 2 * C + h * hs, hs);
            }
}

/* Per row: datt = dout . v; dv += att dout; the softmax backward
 * dpre = att (datt - sum(att datt)); then dq += dpre k scale, dk += dpre q scale.
 * Each row needs T floats of scratch, reused from row to row. */
void sp_attention_backward(float *restrict dqkv, float *restrict scratch,
                           const float *restrict dout, const float *restrict qkv,
                           const float *restrict att, int B, int T, int C, int NH, int acc)
{
    const int hs = C / NH;
    const int64_t C3 = 3 * (int64_t)C;
    const float scale = 1.0f / sqrtf((float)hs);
    if (!acc)
        memset(dqkv, 0, sizeof(float) * (size_t)B * (size_t)T * (size_t)C3);
    float *datt = scratch;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *a = att + (((int64_t)b * NH + h) * T + t) * T;
                const float *d = dout + ((int64_t)b * T + t) * C + h * hs;
                const float *q = qkv + ((int64_t)b * T + t) * C3 + h * hs;
                float *dq = dqkv + ((int64_t)b * T + t) * C3 + h * hs;
                float s = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    int64_t off = ((int64_t)b * T + t2) * C3 + 2 * C + h * hs;
                    datt[t2] = dot8(d, qkv + off, hs);
                    axpy(dqkv + off, a[t2], d, hs);
                    s += a[t2] * datt[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    int64_t off = ((int64_t)b * T + t2) * C3 + C + h * hs;
                    float dpre = a[t2] * (datt[t2] - s) * scale;
                    axpy(dq, dpre, qkv + off, hs);
                    axpy(dqkv + off, dpre, q, hs);
                }
            }
}

int64_t sp_attention_scratch_floats(int B, int T, int C, int NH)
{
    return T > 0 ? T : 1;
}
