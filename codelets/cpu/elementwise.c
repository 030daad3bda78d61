/* Elementwise ops: bias add, add, scale (and the gradient copy), GELU, ReLU.
 * Outputs may alias an input exactly (in place), so only the read-only inputs here are
 * restrict; GCC still vectorizes each loop behind a runtime overlap check. */
#include "codelets/cpu/kernels.h"

#include <math.h>
#include <string.h>

void sp_bias_add_forward(float *out, const float *x, const float *restrict bias, int N, int C)
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
void sp_bias_add_backward_bias(float *restrict dbias, const float *restrict dout, int N, int C,
                               int acc)
{
    if (!acc)
        memset(dbias, 0, sizeof(float) * (size_t)(C > 0 ? C : 0));
    for (int n = 0; n < N; n++) {
        const float *d = dout + (int64_t)n * C;
        for (int c = 0; c < C; c++)
            dbias[c] += d[c];
    }
}

void sp_add_forward(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void sp_scale_forward(float *out, const float *x, float s, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = s * x[i];
}

void sp_scale_backward(float *dx, const float *dout, float s, int64_t n, int acc)
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

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

void sp_gelu_forward(float *out, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        out[i] = 0.5f * xi * (1.0f + tanhf(GELU_K * (xi + GELU_A * xi * xi * xi)));
    }
}

/* d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3a x^2), t = tanh(k (x + a x^3)).
 * 1 - t^2 rather than 1/cosh^2: no overflow for large |x|, and the term vanishes there. */
void sp_gelu_backward(float *dx, const float *restrict x, const float *dout, int64_t n, int acc)
{
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float t = tanhf(GELU_K * (xi + GELU_A * xi * xi * xi));
        float g = 0.5f * (1.0f + t) +
                  0.5f * xi * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * xi * xi);
        float d = g * dout[i];
        dx[i] = acc ? dx[i] + d : d;
    }
}

void sp_relu_forward(float *out, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void sp_relu_backward(float *dx, const float *restrict x, const float *dout, int64_t n, int acc)
{
    if (acc) {
        for (int64_t i = 0; i < n; i++)
            dx[i] += x[i] > 0.0f ? dout[i] : 0.0f;
    } else {
        for (int64_t i = 0; i < n; i++)
            dx[i] = x[i] > 0.0f ? dout[i] : 0.0f;
    }
}
