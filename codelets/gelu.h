/* GELU (tanh form), SiLU and their derivatives, one definition for the CPU kernels
 * (cpu/elementwise.c) and the CUDA ones (cuda/elementwise.cu), so both run the same
 * operations in the same order. Every multiply-add is an explicit fmaf, rounded once on
 * every path (an instruction where the CPU has FMA and on GPUs, glibc's correctly rounded
 * fmaf elsewhere), and no a * b + c is left for nvcc to contract: the CPU's bits do not
 * depend on the instruction set, and a GPU should give the same ones (test_backend_ops
 * holds GELU to them bit for bit: passed in the CPU emulation, not yet run on a device). */
#ifndef STARPIPE_CODELETS_GELU_H
#define STARPIPE_CODELETS_GELU_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SP_GELU_FN static __host__ __device__ __forceinline__
#else
#define SP_GELU_FN static inline
#endif

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
 * are I, with TO_I truncating F to I, TO_F converting back, BITS_F reading an I's bits as
 * an F, and FMA(a, b, c) a * b + c rounded once (b and c may be float constants). Nine
 * fused multiply-adds and two other operations where there were twenty multiplies and
 * adds: GELU and the softmax spend most of their time here. */
#define SP_EXP_NONPOS_BODY(F, I, z, TO_I, TO_F, BITS_F, FMA)                               \
    const I n_ = TO_I(FMA((z), 1.44269504088896341f, -0.5f)); /* round(z / ln2), z <= 0 */ \
    const F fn_ = TO_F(n_);                                                                \
    F r_ = FMA(fn_, -0.693359375f, (z)); /* z - n ln2, ln2 in two parts */                 \
    r_ = FMA(fn_, 2.12194440e-4f, r_);                                                     \
    F p_ = FMA(r_, 1.9875691500e-4f, 1.3981999507e-3f);                                    \
    p_ = FMA(p_, r_, 8.3334519073e-3f);                                                    \
    p_ = FMA(p_, r_, 4.1665795894e-2f);                                                    \
    p_ = FMA(p_, r_, 1.6666665459e-1f);                                                    \
    p_ = FMA(p_, r_, 5.0000001201e-1f);                                                    \
    p_ = FMA(p_, r_ * r_, r_) + 1.0f;                                                      \
    return p_ * BITS_F((n_ + 127) << 23)

#define SP_FLOAT_TO_INT_(x) ((int)(x))
#define SP_INT_TO_FLOAT_(x) ((float)(x))

SP_GELU_FN float sp_exp_nonpos(float z)
{
    SP_EXP_NONPOS_BODY(float, int, z, SP_FLOAT_TO_INT_, SP_INT_TO_FLOAT_, sp_gelu_i2f, fmaf);
}

/* e = exp(-|v|), |v| clamped to 87 so that e stays normal. The clamp compares the bits
 * as integers (the same order for non-negative floats): a float compare may trap, so GCC
 * would not if-convert it and the loops would stay scalar. A NaN is clamped too; the
 * callers' outer factor x still propagates it. */
SP_GELU_FN float sp_exp_neg_abs(float v)
{
    int32_t ai = sp_gelu_f2i(v) & 0x7FFFFFFF;
    ai = ai < 0x42AE0000 ? ai : 0x42AE0000; /* 87.0f */
    return sp_exp_nonpos(-sp_gelu_i2f(ai));
}

/* a where v's sign bit is set, b elsewhere: a select on the bits (vectorizes). */
SP_GELU_FN float sp_select_neg(float v, float a, float b)
{
    const int32_t neg = sp_gelu_f2i(v) >> 31; /* all ones where the sign bit is set */
    return sp_gelu_i2f((sp_gelu_f2i(a) & neg) | (sp_gelu_f2i(b) & ~neg));
}

/* The logistic sigmoid s(v) = 1 / (1 + e) for v >= 0 and e / (1 + e) below, e =
 * exp(-|v|): no cancellation in the negative tail. A NaN gives a number here; the
 * callers' outer factor x propagates it. */
SP_GELU_FN float sp_sigmoid(float x)
{
    const float e = sp_exp_neg_abs(x);
    return sp_select_neg(x, e, 1.0f) / (1.0f + e);
}

/* GELU's tanh form, 0.5 x (1 + tanh(u)) with u = k (x + a x^3), k = sqrt(2/pi), a =
 * 0.044715, computed as x s(v), v = 2u: 0.5 (1 + tanh(u)) is s(2u) exactly. So GELU keeps
 * its relative accuracy far into the negative tail, where 1 + tanh(u) rounded to 0, and
 * the derivative needs one exp and one division. */
#define SP_GELU_2K 1.5957691216057308f  /* 2k */
#define SP_GELU_2KA 0.0713548162726003f /* 2ka */
#define SP_GELU_6KA 0.2140644488178008f /* 6ka: dv/dx = 2k + 6ka x^2 */

SP_GELU_FN float sp_gelu(float x)
{
    const float v = x * fmaf(SP_GELU_2KA, x * x, SP_GELU_2K);
    const float e = sp_exp_neg_abs(v);
    return sp_select_neg(v, x * e, x) / (1.0f + e);
}

/* d/dx = s + x s (1 - s) dv/dx, where s (1 - s) = e / (1 + e)^2 whatever v's sign. */
SP_GELU_FN float sp_gelu_grad(float x)
{
    const float x2 = x * x;
    const float v = x * fmaf(SP_GELU_2KA, x2, SP_GELU_2K);
    const float e = sp_exp_neg_abs(v);
    const float q = 1.0f / (1.0f + e), eq = e * q;
    return fmaf(x * (eq * q), fmaf(SP_GELU_6KA, x2, SP_GELU_2K), sp_select_neg(v, eq, q));
}

/* SiLU (swish), x s(x), and its derivative s (1 + x (1 - s)): SwiGLU's gate. */
SP_GELU_FN float sp_silu(float x) { return x * sp_sigmoid(x); }

SP_GELU_FN float sp_silu_grad(float x)
{
    const float s = sp_sigmoid(x);
    return s * fmaf(x, 1.0f - s, 1.0f);
}

#endif
