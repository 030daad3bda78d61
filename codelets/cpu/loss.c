/* Softmax cross-entropy (mean over rows) and the scalar sum reduction.
 * The loss uses log-sum-exp, so it stays finite even where a probability underflows.
 * exp is sp_expf (expf_impl.h): glibc's expf bits, from C, a vector at a time. */
#include "codelets/cpu/kernels.h"

#include <math.h>
#include <string.h>

#include "codelets/cpu/expf_impl.h"

/* p = exp(x - shift[r]) over the first `valid` columns of g <= CE_ROWS rows (stride V),
 * and each row's sum of them into sum[r], in column order (the loss's bits). A row's sum
 * alone is a chain of dependent adds: a third of GPT-2's cross-entropy. So the rows go
 * side by side, a chunk of columns at a time while it is in cache: eight chains at once,
 * each still in its own order. */
#define CE_ROWS 8
#define CE_CHUNK 1024
static void exp_rows_summed(float *restrict p, const float *restrict x, int64_t V, int valid,
                            int g, const float *restrict shift, float *restrict sum)
{
    float s[CE_ROWS] = { 0 };
    for (int v0 = 0; v0 < valid; v0 += CE_CHUNK) {
        const int len = valid - v0 < CE_CHUNK ? valid - v0 : CE_CHUNK;
        for (int r = 0; r < g; r++)
            sp_expf_shifted(p + r * V + v0, x + r * V + v0, shift[r], len);
        const float *q = p + v0;
        if (g == CE_ROWS) {
            for (int v = 0; v < len; v++)
                for (int r = 0; r < CE_ROWS; r++)
                    s[r] += q[r * V + v];
        } else {
            for (int r = 0; r < g; r++)
                for (int v = 0; v < len; v++)
                    s[r] += q[r * V + v];
        }
    }
    for (int r = 0; r < g; r++)
        sum[r] = s[r];
}

int sp_cross_entropy_forward(float *loss, float *restrict probs, const float *restrict logits,
                             const int32_t *restrict targets, int N, int V, int valid)
{
    int bad = 0;
    double total = 0.0;
    for (int n0 = 0; n0 < N; n0 += CE_ROWS) {
        const int g = N - n0 < CE_ROWS ? N - n0 : CE_ROWS;
        float maxv[CE_ROWS], sums[CE_ROWS];
        for (int r = 0; r < g; r++)
            maxv[r] = sp_max_skip_nan(logits + (int64_t)(n0 + r) * V, valid);
        exp_rows_summed(probs + (int64_t)n0 * V, logits + (int64_t)n0 * V, V, valid, g, maxv,
                        sums);
        for (int r = 0; r < g; r++) {
            const int n = n0 + r;
            const float *x = logits + (int64_t)n * V;
            float *p = probs + (int64_t)n * V;
            const float sum = sums[r];
            float inv = 1.0f / sum;
            for (int v = 0; v < valid; v++)
                p[v] *= inv;
            for (int v = valid; v < V; v++) /* padding: no probability, so no gradient */
                p[v] = 0.0f;
            int32_t tg = targets[n];
            if (tg < 0 || tg >= valid) {
                bad++;
                continue;
            }
            /* -log p[tg] = log(sum) + max - x[tg], evaluated without forming p[tg]. */
            total += log((double)sum) + (double)maxv[r] - (double)x[tg];
        }
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

/* The vocab-parallel cross-entropy: sp_cross_entropy_forward's steps, cut where the
 * group's all-reduces come in (the maximum after the first, the sums after the second). */
void sp_vocab_ce_max(float *restrict rowmax, const float *restrict logits, int N, int V,
                     int valid)
{
    for (int n = 0; n < N; n++)
        rowmax[n] = sp_max_skip_nan(logits + (int64_t)n * V, valid);
}

int sp_vocab_ce_exp(float *restrict exps, float *restrict stats, int32_t *restrict ltargets,
                    const float *restrict logits, const int32_t *restrict targets,
                    const float *restrict rowmax, int N, int V, int64_t lo, int64_t Vall)
{
    int bad = 0;
    /* the slice's tokens: columns before Vall - lo (the rest, if any, is padding) */
    const int valid = Vall - lo >= V ? V : Vall - lo > 0 ? (int)(Vall - lo) : 0;
    for (int n0 = 0; n0 < N; n0 += CE_ROWS)
        exp_rows_summed(exps + (int64_t)n0 * V, logits + (int64_t)n0 * V, V, valid,
                        N - n0 < CE_ROWS ? N - n0 : CE_ROWS, rowmax + n0, stats + n0);
    for (int n = 0; n < N; n++) {
        const float *x = logits + (int64_t)n * V;
        float *p = exps + (int64_t)n * V;
        for (int v = valid; v < V; v++)
            p[v] = 0.0f;
        int64_t tg = targets[n], r = tg - lo;
        bad += tg < 0 || tg >= Vall;
        int here = tg >= 0 && tg < Vall && r >= 0 && r < V;
        stats[N + n] = here ? x[r] : 0.0f;
        ltargets[n] = here ? (int32_t)r : -1;
    }
    return bad;
}

void sp_vocab_ce_loss(float *restrict loss, float *restrict exps, const float *restrict rowmax,
                      const float *restrict stats, int N, int V)
{
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        float *p = exps + (int64_t)n * V;
        float inv = 1.0f / stats[n];
        for (int v = 0; v < V; v++)
            p[v] *= inv;
        total += log((double)stats[n]) + (double)rowmax[n] - (double)stats[N + n];
    }
    *loss = N > 0 ? (float)(total / N) : 0.0f;
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
