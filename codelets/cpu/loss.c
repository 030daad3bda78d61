/* Softmax cross-entropy (mean over rows) and the scalar sum reduction.
 * The loss uses log-sum-exp, so it stays finite even where a probability underflows. */
#include "codelets/cpu/kernels.h"

#include <math.h>
#include <string.h>

int sp_cross_entropy_forward(float *loss, float *restrict probs, const float *restrict logits,
                             const int32_t *restrict targets, int N, int V)
{
    int bad = 0;
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        const float *x = logits + (int64_t)n * V;
        float *p = probs + (int64_t)n * V;
        float maxv = -INFINITY;
        for (int v = 0; v < V; v++)
            maxv = x[v] > maxv ? x[v] : maxv;
        float sum = 0.0f;
        for (int v = 0; v < V; v++) {
            p[v] = expf(x[v] - maxv);
            sum += p[v];
        }
        float inv = 1.0f / sum;
        for (int v = 0; v < V; v++)
            p[v] *= inv;
        int32_t tg = targets[n];
        if (tg < 0 || tg >= V) {
            bad++;
            continue;
        }
        /* -log p[tg] = log(sum) + max - x[tg], evaluated without forming p[tg]. */
        total += log((double)sum) + (double)maxv - (double)x[tg];
    }
    if (bad)
        *loss = NAN;
    else
        *loss = N > 0 ? (float)(total / N) : 0.0f;
    return bad;
}

/* Rows with an out-of-range target get probs * dloss / N and no one-hot term: the
 * forward already reported them, and nothing is written out of bounds. */
void sp_cross_entropy_backward(float *restrict dlogits, const float *restrict probs,
                               const int32_t *restrict targets, float dloss, int N, int V,
                               int acc)
{
    const float s = N > 0 ? dloss / (float)N : 0.0f;
    for (int n = 0; n < N; n++) {
        float *d = dlogits + (int64_t)n * V;
        const float *p = probs + (int64_t)n * V;
        int32_t tg = targets[n];
        int ok = tg >= 0 && tg < V;
        float old = ok && acc ? d[tg] : 0.0f;
        if (acc) {
            for (int v = 0; v < V; v++)
                d[v] += s * p[v];
        } else {
            for (int v = 0; v < V; v++)
                d[v] = s * p[v];
        }
        /* The target's gradient is formed first, then added once, like the others. */
        if (ok)
            d[tg] = old + (s * p[tg] - s);
    }
}

void sp_sum_forward(float *out, const float *restrict x, int64_t n)
{
    /* Four partial sums in double: a fixed order, so the same bits every run. */
    double s[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            s[j] += (double)x[i + j];
    double r = (s[0] + s[2]) + (s[1] + s[3]);
    for (; i < n; i++)
        r += (double)x[i];
    *out = (float)r;
}

void sp_sum_backward(float *restrict dx, float dout_times_s, int64_t n, int acc)
{
    if (acc) {
        for (int64_t i = 0; i < n; i++)
            dx[i] += dout_times_s;
    } else {
        for (int64_t i = 0; i < n; i++)
            dx[i] = dout_times_s;
    }
}
