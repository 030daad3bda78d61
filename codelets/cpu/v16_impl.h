/* 16 floats at a time in GCC's vector types (internal to codelets/cpu): loops written on
 * them vectorize where GCC's own vectorizer gave up, under every SP_VEC_FN clone (the
 * default one lowers each to four SSE operations). Each lane does what the scalar C would,
 * in its order, so every clone gives the same bits. The helpers (SP_V16_FN, also for
 * other widths' helpers: layernorm.c's 8-float sums) are always inlined into their
 * caller's clone: a vector passed between functions of different targets would change
 * the ABI. */
#ifndef STARPIPE_CPU_V16_IMPL_H
#define STARPIPE_CPU_V16_IMPL_H

#include <stdint.h>

#include "codelets/cpu/vec_impl.h"
#include "codelets/gelu.h"

#pragma GCC diagnostic ignored "-Wpsabi" /* see above: never passed between targets */

#define SP_V16_FN static inline __attribute__((always_inline))

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef float v16f_un __attribute__((vector_size(64), aligned(4)));

SP_V16_FN v16f sp_ld16(const float *p) { return *(const v16f_un *)p; }
SP_V16_FN void sp_st16(float *p, v16f x) { *(v16f_un *)p = x; }

/* Lanes u0..u0+15 <= t: all ones, else 0. */
SP_V16_FN v16u sp_lanes_upto(int u0, int t)
{
    const v16i lane = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 };
    return (v16u)(lane <= (v16i){ 0 } + (t - u0));
}

/* a * b + c rounded once, lane by lane: GCC makes one vfmadd of each lane group where the
 * clone has FMA (AVX-512F, x86-64-v3) and calls fmaf per lane in the baseline clone. */
SP_V16_FN v16f sp_fma16(v16f a, v16f b, v16f c)
{
    v16f r;
    for (int i = 0; i < 16; i++) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
    return r;
}

/* sp_exp_nonpos (codelets/gelu.h) on 16 lanes: its steps, SP_EXP_NONPOS_BODY
 * (tests/kernels/test_attention.c compares the two bit for bit). x - 0 turns a float
 * constant into a vector of it and leaves a vector as it is (-0 too). */
#define SP_V16_TO_I_(x) __builtin_convertvector(x, v16i)
#define SP_V16_TO_F_(x) __builtin_convertvector(x, v16f)
#define SP_V16_BITS_F_(x) ((v16f)(x))
#define SP_V16_FMA_(a, b, c) sp_fma16((a), (b) - (v16f){ 0 }, (c) - (v16f){ 0 })
SP_V16_FN v16f sp_exp_nonpos16(v16f z)
{
    SP_EXP_NONPOS_BODY(v16f, v16i, z, SP_V16_TO_I_, SP_V16_TO_F_, SP_V16_BITS_F_, SP_V16_FMA_);
}

/* exp(min(max(z, -87), 0)), NaN kept: e^-87 ~ 1.6e-38 stays normal and is 0 next to a
 * softmax row's sum >= 1; z > 0 gives 1 (a softmax never has it). The clamps work on the
 * bits, and a NaN never reaches the float-to-int conversion. As unsigned bits: z in
 * [-inf, -87) is (0xC2AE0000, 0xFF800000], z > 0 is [1, 0x7F800000], NaN is |bits| >
 * 0x7F800000. */
SP_V16_FN v16f sp_exp_le0_16(v16f z)
{
    const v16u u = (v16u)z, one = { 0 };
    const v16u nan = (v16u)((u & 0x7FFFFFFFu) > one + 0x7F800000u);
    const v16u low = (v16u)(u - 0xC2AE0001u < one + (0xFF800000u - 0xC2AE0000u)) | nan;
    const v16u pos = (v16u)(u - 1u < one + 0x7F800000u);
    const v16u zc = (u & ~(low | pos)) | (0xC2AE0000u & low);
    const v16u e = (v16u)sp_exp_nonpos16((v16f)zc);
    return (v16f)((e & ~nan) | (u & nan));
}

/* Sixteen rows' horizontal reductions at once: lane r of the result reduces v[r]'s 16
 * lanes by the pairwise tree (((v0 op v8) op (v1 op v9)) op ((v2 op v10) op (v3 op v11)))
 * op (((v4 op v12) op ...) op ((v6 op v14) op (v7 op v15))), each level one two-vector
 * shuffle of even and odd lanes per pair of rows instead of fifteen scalar steps a row.
 * The operands keep their left and right places, so a sum has the bits of that scalar
 * expression. */
#define SP_LO8_ 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define SP_HI8_ 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define SP_EVEN_ 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define SP_ODD_ 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#define SP_PAIR_(OP, x, y, I, J) \
    OP(__builtin_shufflevector(x, y, I), __builtin_shufflevector(x, y, J))
#define SP_ROWS16_REDUCE_(T, OP, v)                                                          \
    do {                                                                                  \
        T a_[8], b_[4], c_[2];                                                            \
        for (int p_ = 0; p_ < 8; p_++) /* [row 2p: v_i op v_i+8, i < 8 | row 2p+1: same] */ \
            a_[p_] = SP_PAIR_(OP, v[2 * p_], v[2 * p_ + 1], SP_LO8_, SP_HI8_);              \
        for (int p_ = 0; p_ < 4; p_++) /* four rows' four pairs of those */                \
            b_[p_] = SP_PAIR_(OP, a_[2 * p_], a_[2 * p_ + 1], SP_EVEN_, SP_ODD_);           \
        for (int p_ = 0; p_ < 2; p_++) /* eight rows' two halves */                        \
            c_[p_] = SP_PAIR_(OP, b_[2 * p_], b_[2 * p_ + 1], SP_EVEN_, SP_ODD_);           \
        return SP_PAIR_(OP, c_[0], c_[1], SP_EVEN_, SP_ODD_);                              \
    } while (0)
#define SP_ADD_(x, y) ((x) + (y))
#define SP_IMAX_(x, y) sp_imax16((x), (y))

/* v[r] lane i <- v[i] lane r: four rounds of a perfect shuffle, rows j and j + 8 zipped
 * into rows 2j and 2j + 1 (each round rotates an element's 8-bit address, row then lane,
 * by one bit: four rotate row and lane into each other's place). Moves bits only. */
#define SP_ZIP_LO_ 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
#define SP_ZIP_HI_ 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31
SP_V16_FN void sp_transpose16(v16f v[16])
{
    for (int round = 0; round < 4; round++) {
        v16f t[16];
        for (int j = 0; j < 8; j++) {
            t[2 * j] = __builtin_shufflevector(v[j], v[j + 8], SP_ZIP_LO_);
            t[2 * j + 1] = __builtin_shufflevector(v[j], v[j + 8], SP_ZIP_HI_);
        }
        for (int r = 0; r < 16; r++)
            v[r] = t[r];
    }
}

SP_V16_FN v16i sp_imax16(v16i x, v16i y)
{
    const v16i gt = x > y;
    return (x & gt) | (y & ~gt);
}

/* lane r: the sum of v[r]'s lanes in the order above */
SP_V16_FN v16f sp_rows16_sum(const v16f v[16]) { SP_ROWS16_REDUCE_(v16f, SP_ADD_, v); }

/* lane r: the largest of v[r]'s lanes */
SP_V16_FN v16i sp_rows16_max(const v16i v[16]) { SP_ROWS16_REDUCE_(v16i, SP_IMAX_, v); }

#endif
