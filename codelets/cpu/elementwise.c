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

/* tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2|u|), with exp from Cephes' expf
 * (Cody-Waite reduction, degree-5 polynomial, scaling by building 2^n's bits). Written
 * branch-free so the GELU loops vectorize; glibc's tanhf does not, and was 1/3 of a
 * block's time. Absolute error ~2 ulp of 1: GELU uses 1 + tanh, so that is relative. */
static inline float tanh_fast(float u)
{
    /* |u| <= 43.5 so that exp(-2|u|) stays normal (tanh is +-1 in float long before).
     * The clamp compares the bits as integers (same order for non-negative floats): a
     * float compare may trap, so GCC would not if-convert it and the loop would stay
     * scalar. A NaN is clamped too, but GELU's outer factor x still propagates it. */
    union { float f; int32_t i; } a = {.f = fabsf(u)};
    a.i = a.i < 0x422E0000 ? a.i : 0x422E0000; /* 43.5f */
    float z = -2.0f * a.f;
    int n = (int)(z * 1.44269504088896341f - 0.5f); /* round(z / ln2), z <= 0 */
    float fn = (float)n;
    float r = z - fn * 0.693359375f - fn * -2.12194440e-4f; /* z - n ln2, two parts */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } two_n = {.i = (n + 127) << 23};
    float e = p * two_n.f;
    float t = (1.0f - e) / (1.0f + e);
    return copysignf(t, u);
}

void sp_gelu_forward(float *out, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        out[i] = 0.5f * xi * (1.0f + tanh_fast(GELU_K * (xi + GELU_A * xi * xi * xi)));
    }
}

/* d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3a x^2), t = tanh(k (x + a x^3)).
 * 1 - t^2 rather than 1/cosh^2: no overflow for large |x|, and the term vanishes there. */
static inline float gelu_grad(float x)
{
    float t = tanh_fast(GELU_K * (x + GELU_A * x * x * x));
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
}

void sp_gelu_backward(float *dx, const float *restrict x, const float *dout, int64_t n, int acc)
{
    if (acc) {
        for (int64_t i = 0; i < n; i++)
            dx[i] += gelu_grad(x[i]) * dout[i];
    } else {
        for (int64_t i = 0; i < n; i++)
            dx[i] = gelu_grad(x[i]) * dout[i];
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
