/* Elementwise ops: bias add, add, scale (and the gradient copy), GELU, ReLU, SwiGLU.
 * Outputs may alias an input exactly (in place), so only the read-only inputs here are
 * restrict; GCC still vectorizes each loop behind a runtime overlap check. Every loop is
 * an SP_VEC_FN, the plain ones too: their operands often sit in L1 or L2 (a microbatch's
 * activations), where the baseline's 16-byte vectors took twice a copy's time. */
#include "codelets/cpu/kernels.h"
#include "codelets/gelu.h"

#include <math.h>
#include <string.h>

#include "codelets/cpu/vec_impl.h"

SP_VEC_FN void sp_bias_add_forward(float *out, const float *x, const float *restrict bias,
                                   int N, int C)
{
    for (int n = 0; n < N; n++) {
        float *o = out + (int64_t)n * C;
        const float *xr = x + (int64_t)n * C;
        for (int c = 0; c < C; c++)
            o[c] = xr[c] + bias[c];
    }
}

/* Rows are added in order n = 0..N-1 into a float per column: deterministic, and the
 * column loop vectorizes. */
SP_VEC_FN void sp_bias_add_backward_bias(float *restrict dbias, const float *restrict dout,
                                         int N, int C, int acc)
{
    if (!acc)
        memset(dbias, 0, sizeof(float) * (size_t)(C > 0 ? C : 0));
    for (int n = 0; n < N; n++) {
        const float *d = dout + (int64_t)n * C;
        for (int c = 0; c < C; c++)
            dbias[c] += d[c];
    }
}

SP_VEC_FN void sp_reduce_replicas(float *dst, const float *const *others, int R, int own, int64_t n)
{
    /* x_q is dst's own values at q == own, else the next other replica's; blocks of a
     * stack buffer so that each pass is a plain vectorisable loop */
    enum { BLOCK = 1024 };
    float acc[BLOCK];
    for (int64_t i0 = 0; i0 < n; i0 += BLOCK) {
        int64_t nb = n - i0 < BLOCK ? n - i0 : BLOCK;
        for (int q = 0, j = 0; q < R; q++) {
            const float *x = q == own ? dst + i0 : others[j++] + i0;
            if (q == 0) memcpy(acc, x, (size_t)nb * sizeof(float));
            else
                for (int64_t i = 0; i < nb; i++) acc[i] += x[i];
        }
        memcpy(dst + i0, acc, (size_t)nb * sizeof(float));
    }
}

SP_VEC_FN void sp_add_forward(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

SP_VEC_FN void sp_maximum_forward(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = b[i] > a[i] ? b[i] : a[i];
}

SP_VEC_FN void sp_scale_forward(float *out, const float *x, float s, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = s * x[i];
}

SP_VEC_FN void sp_scale_backward(float *dx, const float *dout, float s, int64_t n, int acc)
{
    if (acc) {
        for (int64_t i = 0; i < n; i++)
            dx[i] += s * dout[i];
    } else if (s == 1.0f) {
        if (dx != dout)
            memmove(dx, dout, sizeof(float) * (size_t)(n > 0 ? n : 0));
    } else {
        for (int64_t i = 0; i < n; i++)
            dx[i] = s * dout[i];
    }
}

/* GELU is compute-bound (the tanh's exp): AVX-512/AVX2 clones, the same bits as the
 * baseline's (vec_impl.h). Its loops compute as long as they read, so the core's out-of-
 * order window never reaches far enough ahead to keep the memory busy: each block of
 * GELU_BLOCK floats first prefetches its inputs GELU_AHEAD floats (4 KB) on. In the
 * block's stream of 16 MB, -7% (bench/README.md). */
#define GELU_BLOCK 256
#define GELU_AHEAD 1024
static inline void gelu_prefetch(const float *p, int64_t i0, int64_t n)
{
    for (int64_t i = i0 + GELU_AHEAD; i < i0 + GELU_AHEAD + GELU_BLOCK && i < n; i += 16)
        __builtin_prefetch(p + i, 0, 3);
}
#define GELU_BLOCKS(n, body)                                                                \
    for (int64_t i0 = 0; i0 < (n); i0 += GELU_BLOCK) {                                     \
        const int64_t end_ = i0 + GELU_BLOCK < (n) ? i0 + GELU_BLOCK : (n);                 \
        body                                                                                \
    }

SP_VEC_FN void sp_gelu_forward(float *out, const float *x, int64_t n)
{
    GELU_BLOCKS(n, {
        gelu_prefetch(x, i0, n);
        for (int64_t i = i0; i < end_; i++) {
            float xi = x[i];
            out[i] = sp_gelu(xi);
        }
    })
}

SP_VEC_FN void sp_gelu_backward(float *dx, const float *restrict x, const float *dout, int64_t n,
                                int acc)
{
    GELU_BLOCKS(n, {
        gelu_prefetch(x, i0, n);
        gelu_prefetch(dout, i0, n);
        if (acc) {
            for (int64_t i = i0; i < end_; i++)
                dx[i] += sp_gelu_grad(x[i]) * dout[i];
        } else {
            for (int64_t i = i0; i < end_; i++)
                dx[i] = sp_gelu_grad(x[i]) * dout[i];
        }
    })
}

/* SwiGLU's gate: rows (N, 2I) of [a | b] (x W1 and x W3 side by side) give out (N, I) =
 * silu(a) b. Compute-bound like GELU (the exp): the same vector clones. */
SP_VEC_FN void sp_swiglu_forward(float *out, const float *restrict x, int N, int I)
{
    for (int64_t n = 0; n < N; n++) {
        const float *a = x + n * 2 * I, *b = a + I;
        float *o = out + n * I;
        for (int i = 0; i < I; i++)
            o[i] = sp_silu(a[i]) * b[i];
    }
}

/* dx (N, 2I): da = dout b silu'(a), db = dout silu(a); += with acc. */
SP_VEC_FN void sp_swiglu_backward(float *dx, const float *restrict x, const float *dout, int N,
                                  int I, int acc)
{
    for (int64_t n = 0; n < N; n++) {
        const float *a = x + n * 2 * I, *b = a + I, *d = dout + n * I;
        float *da = dx + n * 2 * I, *db = da + I;
        if (acc)
            for (int i = 0; i < I; i++) {
                da[i] += d[i] * b[i] * sp_silu_grad(a[i]);
                db[i] += d[i] * sp_silu(a[i]);
            }
        else
            for (int i = 0; i < I; i++) {
                da[i] = d[i] * b[i] * sp_silu_grad(a[i]);
                db[i] = d[i] * sp_silu(a[i]);
            }
    }
}

SP_VEC_FN void sp_relu_forward(float *out, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

SP_VEC_FN void sp_relu_backward(float *dx, const float *restrict x, const float *dout, int64_t n,
                                int acc)
{
    if (acc) {
        for (int64_t i = 0; i < n; i++)
            dx[i] += x[i] > 0.0f ? dout[i] : 0.0f;
    } else {
        for (int64_t i = 0; i < n; i++)
            dx[i] = x[i] > 0.0f ? dout[i] : 0.0f;
    }
}
