/* GELU (tanh form), SiLU and their derivatives, one definition for the CPU kernels
 * (cpu/elementwise.c) and the CUDA ones (cuda/elementwise.cu), so both run the same
 * operations in the same order. nvcc contracts the polynomial into FMAs (plain C on
 * x86-64 without -march does not), so GPU results differ from the CPU's by a few ulp:
 * up to 1.6e-6 absolute in the gradient on [-6, 6], found with an FMA emulation. */
#ifndef STARPIPE_CODELETS_GELU_H
#define STARPIPE_CODELETS_GELU_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SP_GELU_FN static __host__ __device__ __forceinline__
#else
#define SP_GELU_FN static inline
#endif

#define SP_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define SP_GELU_A 0.044715f

SP_GELU_FN int32_t sp_gelu_f2i(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_int(f);
#else
    union { float f; int32_t i; } u = { f };
    return u.i;
#endif
}

SP_GELU_FN float sp_gelu_i2f(int32_t i)
{
#ifdef __CUDA_ARCH__
    return __int_as_float(i);
#else
    union { int32_t i; float f; } u = { i };
    return u.f;
#endif
}

/* exp(z) for z in [-87, 0] (no range check: the caller clamps), from Cephes' expf: Cody-
 * Waite reduction, degree-5 polynomial, scaling by building 2^n's bits. Branch-free, so
 * loops over it vectorize; ~1 ulp. NaN gives NaN. Also the CPU attention's softmax, on 16
 * lanes (cpu/v16_impl.h): so its steps are written once, for a float type F whose ints
 * are I, with TO_I truncating F to I, TO_F converting back and BITS_F reading an I's bits
 * as an F. */
#define SP_EXP_NONPOS_BODY(F, I, z, TO_I, TO_F, BITS_F)                                    \
    const I n_ = TO_I((z) * 1.44269504088896341f - 0.5f); /* round(z / ln2), z <= 0 */     \
    const F fn_ = TO_F(n_);                                                                \
    const F r_ = (z) - fn_ * 0.693359375f - fn_ * -2.12194440e-4f; /* z - n ln2 */         \
    F p_ = r_ * 1.9875691500e-4f + 1.3981999507e-3f;                                       \
    p_ = p_ * r_ + 8.3334519073e-3f;                                                       \
    p_ = p_ * r_ + 4.1665795894e-2f;                                                       \
    p_ = p_ * r_ + 1.6666665459e-1f;                                                       \
    p_ = p_ * r_ + 5.0000001201e-1f;                                                       \
    p_ = p_ * r_ * r_ + r_ + 1.0f;                                                         \
    return p_ * BITS_F((n_ + 127) << 23)

#define SP_FLOAT_TO_INT_(x) ((int)(x))
#define SP_INT_TO_FLOAT_(x) ((float)(x))

SP_GELU_FN float sp_exp_nonpos(float z)
{
    SP_EXP_NONPOS_BODY(float, int, z, SP_FLOAT_TO_INT_, SP_INT_TO_FLOAT_, sp_gelu_i2f);
}

/* tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2|u|) (sp_exp_nonpos). Written
 * branch-free so the CPU's GELU loops vectorize; glibc's tanhf does not, and was 1/3 of a
 * block's time. Absolute error ~2 ulp of 1: GELU uses 1 + tanh, so that is relative. */
SP_GELU_FN float sp_tanh_fast(float u)
{
    /* |u| <= 43.5 so that exp(-2|u|) stays normal (tanh is +-1 in float long before).
     * The clamp compares the bits as integers (same order for non-negative floats): a
     * float compare may trap, so GCC would not if-convert it and the loop would stay
     * scalar. A NaN is clamped too, but GELU's outer factor x still propagates it. */
    int32_t ai = sp_gelu_f2i(fabsf(u));
    ai = ai < 0x422E0000 ? ai : 0x422E0000; /* 43.5f */
    float e = sp_exp_nonpos(-2.0f * sp_gelu_i2f(ai));
    float t = (1.0f - e) / (1.0f + e);
    return copysignf(t, u);
}

SP_GELU_FN float sp_gelu(float x)
{
    return 0.5f * x * (1.0f + sp_tanh_fast(SP_GELU_K * (x + SP_GELU_A * x * x * x)));
}

/* d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3a x^2), t = tanh(k (x + a x^3)).
 * 1 - t^2 rather than 1/cosh^2: no overflow for large |x|, and the term vanishes there. */
SP_GELU_FN float sp_gelu_grad(float x)
{
    float t = sp_tanh_fast(SP_GELU_K * (x + SP_GELU_A * x * x * x));
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * SP_GELU_K * (1.0f + 3.0f * SP_GELU_A * x * x);
}

/* The logistic sigmoid, 1 / (1 + e) for x >= 0 and e / (1 + e) below, e = exp(-|x|)
 * (|x| clamped to 87, so e stays normal): no cancellation for large negative x. The
 * select works on the bits, so the CPU loops vectorize. A NaN gives a number here, and
 * SiLU's outer factor x propagates it. */
SP_GELU_FN float sp_sigmoid(float x)
{
    int32_t ai = sp_gelu_f2i(fabsf(x));
    ai = ai < 0x42AE0000 ? ai : 0x42AE0000; /* 87.0f */
    const float e = sp_exp_nonpos(-sp_gelu_i2f(ai));
    const int32_t neg = sp_gelu_f2i(x) >> 31; /* all ones where the sign bit is set */
    const float num = sp_gelu_i2f((sp_gelu_f2i(e) & neg) | (0x3F800000 & ~neg));
    return num / (1.0f + e);
}

/* SiLU (swish), x sigmoid(x), and its derivative s (1 + x (1 - s)): SwiGLU's gate. */
SP_GELU_FN float sp_silu(float x) { return x * sp_sigmoid(x); }

SP_GELU_FN float sp_silu_grad(float x)
{
    const float s = sp_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

#endif
