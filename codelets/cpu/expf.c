/* sp_expf and sp_expf_shifted (expf_impl.h): glibc's expf, its FMA build's roundings
 * written out. With x = k/32 ln 2 + r ln 2 / 32 (k the nearest integer to 32 x / ln 2),
 * e^x = 2^(k/32) (1 + C2 r + C1 r^2 + C0 r^3): 2^(k/32) from the table (its exponent
 * added to the bits), the cubic in double, one rounding to float at the end. */
#include "codelets/cpu/expf_impl.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define SP_EXPF_X86 1
#endif

#include "codelets/cpu/gemm_impl.h"
#include "codelets/cpu/vec_impl.h"

/* 2^(i/32) as bits, less i << 47 (the exponent the index adds back): glibc's
 * __exp2f_data.tab. */
static const uint64_t tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
#define INVLN2N 0x1.71547652b82fep+5 /* 32 / ln 2 */
#define SHIFT 0x1.8p+52              /* adding it rounds to an integer, in the low bits */
#define C0 0x1.c6af84b912394p-20
#define C1 0x1.ebfce50fac4f3p-13
#define C2 0x1.62e42ff0c52d6p-6

static inline uint64_t bits64(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static inline double from_bits64(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* The main path, valid for |x| < 103.98 and finite. */
static inline float expf_main(float x)
{
    const double xd = (double)x;
    const double kd0 = fma(INVLN2N, xd, SHIFT);
    const uint64_t ki = bits64(kd0);
    const double kd = kd0 - SHIFT;
    const double r = fma(INVLN2N, xd, -kd);
    const double s = from_bits64(tab[ki % 32] + (ki << 47));
    const double z = fma(r, C0, C1), r2 = r * r;
    double y = fma(r, C2, 1.0);
    y = fma(z, r2, y);
    return (float)(y * s);
}

/* |x| >= 88 (the bits' top twelve above 0x42a), infinities and NaN: glibc's branches. */
static int special(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return ((u >> 20) & 0x7ff) > 0x42a;
}

static float expf_special(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if (u == 0xff800000u) return 0.0f;                 /* -inf */
    if (((u >> 20) & 0x7ff) > 0x7f7) return x + x;     /* +inf, NaN (quieted) */
    if (x > 0x1.62e42ep6f) return INFINITY;            /* overflows */
    if (x < -0x1.9fe368p6f) return 0.0f;               /* below ln 2^-150 */
    if (x < -0x1.9d1d9ep6f) return 0x1p-149f;          /* below ln 2^-149 */
    return expf_main(x);
}

SP_NOFMA float sp_expf(float x)
{
    return special(x) ? expf_special(x) : expf_main(x);
}

#ifdef SP_EXPF_X86
/* The lanes of a vector whose inputs were special (the bits of odd): sp_expf's. */
static void redo_lanes(float *p, const float *x, float shift, int odd)
{
    for (; odd; odd &= odd - 1) {
        const int j = __builtin_ctz((unsigned)odd);
        p[j] = sp_expf(x[j] - shift);
    }
}

/* The vector forms do the whole vectors and return how many elements that was; the same
 * operations as expf_main, lane by lane. Eight lanes: */
__attribute__((target("avx512f"))) static int shifted_avx512(float *p, const float *x,
                                                             float shift, int n)
{
    const __m512d invln2n = _mm512_set1_pd(INVLN2N), sh = _mm512_set1_pd(SHIFT);
    const __m512d c0 = _mm512_set1_pd(C0), c1 = _mm512_set1_pd(C1), c2 = _mm512_set1_pd(C2);
    const __m512d one = _mm512_set1_pd(1.0);
    const __m256 s8 = _mm256_set1_ps(shift);
    int v = 0;
    for (; v + 8 <= n; v += 8) {
        const __m256 xf = _mm256_sub_ps(_mm256_loadu_ps(x + v), s8);
        const __m512d xd = _mm512_cvtps_pd(xf);
        const __m512d kd0 = _mm512_fmadd_pd(invln2n, xd, sh);
        const __m512i ki = _mm512_castpd_si512(kd0);
        const __m512d kd = _mm512_sub_pd(kd0, sh);
        const __m512d r = _mm512_fmsub_pd(invln2n, xd, kd);
        const __m512i t = _mm512_i64gather_epi64(_mm512_and_si512(ki, _mm512_set1_epi64(31)),
                                                 (const void *)tab, 8);
        const __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64(ki, 47)));
        const __m512d z = _mm512_fmadd_pd(r, c0, c1), r2 = _mm512_mul_pd(r, r);
        __m512d y = _mm512_fmadd_pd(r, c2, one);
        y = _mm512_fmadd_pd(z, r2, y);
        _mm256_storeu_ps(p + v, _mm512_cvtpd_ps(_mm512_mul_pd(y, s)));
        const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(xf), 20),
                                             _mm256_set1_epi32(0x7ff));
        const __m256i odd = _mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a));
        redo_lanes(p + v, x + v, shift, _mm256_movemask_ps(_mm256_castsi256_ps(odd)));
    }
    return v;
}

/* Four lanes, AVX2 and FMA. */
__attribute__((target("avx2,fma"))) static int shifted_avx2(float *p, const float *x,
                                                            float shift, int n)
{
    const __m256d invln2n = _mm256_set1_pd(INVLN2N), sh = _mm256_set1_pd(SHIFT);
    const __m256d c0 = _mm256_set1_pd(C0), c1 = _mm256_set1_pd(C1), c2 = _mm256_set1_pd(C2);
    const __m256d one = _mm256_set1_pd(1.0);
    const __m128 s4 = _mm_set1_ps(shift);
    int v = 0;
    for (; v + 4 <= n; v += 4) {
        const __m128 xf = _mm_sub_ps(_mm_loadu_ps(x + v), s4);
        const __m256d xd = _mm256_cvtps_pd(xf);
        const __m256d kd0 = _mm256_fmadd_pd(invln2n, xd, sh);
        const __m256i ki = _mm256_castpd_si256(kd0);
        const __m256d kd = _mm256_sub_pd(kd0, sh);
        const __m256d r = _mm256_fmsub_pd(invln2n, xd, kd);
        const __m256i t = _mm256_i64gather_epi64(
            (const long long *)tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
        const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(ki, 47)));
        const __m256d z = _mm256_fmadd_pd(r, c0, c1), r2 = _mm256_mul_pd(r, r);
        __m256d y = _mm256_fmadd_pd(r, c2, one);
        y = _mm256_fmadd_pd(z, r2, y);
        _mm_storeu_ps(p + v, _mm256_cvtpd_ps(_mm256_mul_pd(y, s)));
        const __m128i top = _mm_and_si128(_mm_srli_epi32(_mm_castps_si128(xf), 20),
                                          _mm_set1_epi32(0x7ff));
        const __m128i odd = _mm_cmpgt_epi32(top, _mm_set1_epi32(0x42a));
        redo_lanes(p + v, x + v, shift, _mm_movemask_ps(_mm_castsi128_ps(odd)));
    }
    return v;
}
#endif

/* max(a, b) as the cross-entropy's loop took it: a NaN a never wins */
static inline float max_skip(float a, float m)
{
    return a > m ? a : m;
}

#ifdef SP_EXPF_X86
/* MAXPS returns its second operand when either is NaN: the running max never is. */
/* The max of the whole vectors, *done the elements they held. */
__attribute__((target("avx512f"))) static float max_avx512(const float *x, int n, int *done)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    int v = 0;
    for (; v + 16 <= n; v += 16)
        m = _mm512_max_ps(_mm512_loadu_ps(x + v), m);
    *done = v;
    return _mm512_reduce_max_ps(m);
}

__attribute__((target("avx2"))) static float max_avx2(const float *x, int n, int *done)
{
    __m256 m = _mm256_set1_ps(-INFINITY);
    int v = 0;
    for (; v + 8 <= n; v += 8)
        m = _mm256_max_ps(_mm256_loadu_ps(x + v), m);
    *done = v;
    float lanes[8], r = -INFINITY;
    _mm256_storeu_ps(lanes, m);
    for (int j = 0; j < 8; j++)
        r = max_skip(lanes[j], r);
    return r;
}
#endif

float sp_max_skip_nan(const float *x, int n)
{
    float r = -INFINITY;
    int v = 0;
#ifdef SP_EXPF_X86
    switch (sp_gemm_path()) {
    case SP_GEMM_AVX512: r = max_avx512(x, n, &v); break;
    case SP_GEMM_AVX2: r = max_avx2(x, n, &v); break;
    }
#endif
    for (; v < n; v++)
        r = max_skip(x[v], r);
    return r;
}

SP_NOFMA void sp_expf_shifted(float *p, const float *x, float shift, int n)
{
    int v = 0;
#ifdef SP_EXPF_X86
    switch (sp_gemm_path()) {
    case SP_GEMM_AVX512: v = shifted_avx512(p, x, shift, n); break;
    case SP_GEMM_AVX2: v = shifted_avx2(p, x, shift, n); break;
    }
#endif
    for (; v < n; v++)
        p[v] = sp_expf(x[v] - shift);
}
