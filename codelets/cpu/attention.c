/* Causal multi-head self-attention, tiled: per (batch, head), blocks of BQ query rows
 * against keys 0..(the block's last row) only, so neither the T x T scores nor the masked
 * half of them are ever formed. The forward saves each row's log-sum-exp; the backward
 * recomputes the probabilities of one block at a time from it. Products on sp_gemm. */
#include "codelets/cpu/kernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "codelets/cpu/gemm_impl.h"
#include "codelets/cpu/v16_impl.h"
#include "codelets/cpu/vec_impl.h"
#include "codelets/gelu.h"

/* Query rows per block: a multiple of every sp_gemm tile height (4, 6, 8, 24). The block
 * only decides which exact zeros (the masked scores of the diagonal block) enter a sum,
 * so the results do not depend on it beyond the sign of a zero. */
#define BQ 24

/* The softmax runs on 16 floats at a time in GCC's vector types (v16_impl.h), each lane
 * the scalar form's operations in its order, so every clone gives the same bits: GCC
 * left the row max scalar, and at head size 16 and T 64 the softmax was a third of
 * attention's time (bench/README.md, "Attention at small heads"). Rows run over whole
 * chunks of 16 columns, up to kend rounded up (the strips' row stride is a multiple of
 * 16), masking the columns past the row's own t: no scalar tails, which cost more than
 * the work on short rows. The columns from kend on hold anything (even NaN): they are
 * only ever selected away, never multiplied. */

/* A float's bits as an integer that orders like the float (negatives with their
 * magnitude bits flipped), and back: the map is its own inverse. */
SP_V16_FN v16i ordered_bits(v16i b) { return b ^ ((b >> 31) & 0x7FFFFFFF); }

/* The lanes' running max of x[0..t] over nc chunks, compared as integers (the bits of a
 * float, negatives with their magnitude bits flipped, order like the floats); lanes past
 * t hold INT32_MIN. A NaN with the sign bit clear becomes the max, which makes the whole
 * row NaN; one with it set is skipped, and the exp of x - max brings it back. */
SP_V16_FN v16i row_max_lanes(const float *x, int nc, int t)
{
    v16i m = (v16i){ 0 } + INT32_MIN;
    for (int c = 0; c < nc; c++) {
        const v16i b = (v16i)sp_ld16(x + 16 * c), in = (v16i)sp_lanes_upto(16 * c, t);
        m = sp_imax16(m, (ordered_bits(b) & in) | (INT32_MIN & ~in));
    }
    return m;
}

/* Rows t0..t0+bq-1 of one head: s (bq, ld) holds q k^T in columns 0..kend-1. Each row t
 * becomes its softmax over columns 0..t (16 fixed partial sums, added by the pairwise
 * tree of sp_rows16_sum), zeros after; lse[r] = the log-sum-exp of its scaled scores.
 * max(x) scale is max(x scale): rounding is monotonic. With inv (bf16, FlashAttention-2's
 * rounding points) a row instead becomes its unnormalized exp(scale x - max) rounded to
 * bf16, the product's operand, and inv[r] = 1 / its fp32 sum, applied to the output
 * after the product. Rows in passes (maxes, exps, sums): with rows of a few chunks, one
 * row at a time was a chain; the rows' horizontal max and sum run sixteen rows at once. */
static SP_VEC_FN void softmax_rows(float *restrict s, int64_t ld, int bq, int t0, int kend,
                                   float scale, float *restrict lse, float *restrict inv)
{
    enum { ROWS = (BQ + 15) / 16 * 16 };
    const int nc = (kend + 15) / 16;
    float mx[ROWS], sum[ROWS];
    v16i km[ROWS];
    v16f zs[ROWS];
    for (int r = 0; r < ROWS; r++)
        km[r] = r < bq ? row_max_lanes(s + r * ld, nc, t0 + r) : (v16i){ 0 } + INT32_MIN;
    for (int r0 = 0; r0 < bq; r0 += 16) {
        const v16f m = (v16f)ordered_bits(sp_rows16_max(km + r0));
        for (int r = 0; r < 16; r++)
            mx[r0 + r] = m[r] * scale;
    }
    for (int r = 0; r < ROWS; r++) {
        v16f z = { 0 }; /* rows past bq: sums of nothing, never read */
        for (int c = 0; r < bq && c < nc; c++) {
            float *x = s + r * ld + 16 * c;
            const v16f e = sp_exp_le0_16(sp_ld16(x) * scale - mx[r]);
            const v16f p = (v16f)((v16u)e & sp_lanes_upto(16 * c, t0 + r));
            sp_st16(x, p);
            z += p;
        }
        zs[r] = z;
    }
    for (int r0 = 0; r0 < bq; r0 += 16)
        sp_st16(sum + r0, sp_rows16_sum(zs + r0));
    for (int r = 0; r < bq; r++) {
        float *x = s + r * ld;
        if (inv) {
            sp_round_bf16(x, x, 16 * (int64_t)nc);
            inv[r] = 1.0f / sum[r];
        } else {
            const float in = 1.0f / sum[r];
            for (int c = 0; c < nc; c++)
                sp_st16(x + 16 * c, sp_ld16(x + 16 * c) * in);
        }
        lse[r] = mx[r] + logf(sum[r]);
    }
}

/* The softmax backward of one block: p holds q k^T, dp holds dout v^T (bq, ld). p
 * becomes P = exp(scale s - lse), dp becomes dS = P (dP - D) scale, both zero above the
 * diagonal, with D[r] = dout_t . out_t = sum over the row of P dP. */
static SP_VEC_FN void softmax_backward_rows(float *restrict p, float *restrict dp, int64_t ld,
                                            int bq, int t0, int kend, float scale,
                                            const float *restrict lse,
                                            const float *restrict D)
{
    const int nc = (kend + 15) / 16;
    for (int r = 0; r < bq; r++) {
        float *x = p + r * ld, *d = dp + r * ld;
        const int t = t0 + r;
        const float l = lse[r], Dr = D[r];
        for (int c = 0; c < nc; c++) {
            const v16u in = sp_lanes_upto(16 * c, t);
            const v16f e = sp_exp_le0_16(sp_ld16(x + 16 * c) * scale - l);
            sp_st16(x + 16 * c, (v16f)((v16u)e & in));
            sp_st16(d + 16 * c, (v16f)((v16u)(e * (sp_ld16(d + 16 * c) - Dr) * scale) & in));
        }
    }
}

/* Query rows per group in the backward: its strips hold a group's P and dS whole, so that
 * dk and dv take each key block's products over all the group's rows at once (a depth
 * of up to the group's rows, where one block's was BQ: c loaded and stored, and q and
 * dout packed, once per group, not per block). Up to GROUP_FLOATS floats a strip. */
#define GROUP_FLOATS (128 * 1024)

static int64_t up16(int64_t n) { return (n + 15) / 16 * 16; }

static int group_rows(int T)
{
    const int64_t blocks = (T + BQ - 1) / BQ;
    int64_t g = GROUP_FLOATS / (BQ * up16(T));
    g = g < 1 ? 1 : g > blocks ? blocks : g;
    return (int)g * BQ;
}

/* Scratch: three packed operands of one head (k^T and v, or k^T, v^T and k, each packed
 * once and reused by every query block), two (group_rows, LD) strips, LD = T rounded up
 * to 16, a group's q and dout packed, and D; each starts 64-byte aligned. */
typedef struct {
    float *kt, *p2, *p3, *s, *ds, *qg, *dg, *D;
    float *qb, *db; /* bf16 only: a block's q and dout rounded, (BQ, hs) each */
} att_scratch;

static int64_t packed_slot(int T, int hs)
{
    int64_t a = sp_gemm_packed_floats(hs, T), b = sp_gemm_packed_floats(T, hs);
    return up16(a > b ? a : b);
}

static int64_t group_slot(int T, int hs)
{
    return up16(sp_gemm_packed_floats(group_rows(T), hs));
}

static att_scratch carve(float *scratch, int T, int hs)
{
    att_scratch z;
    const int64_t slot = packed_slot(T, hs), strip = (int64_t)group_rows(T) * up16(T);
    float *base = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    z.kt = base;
    z.p2 = z.kt + slot;
    z.p3 = z.p2 + slot;
    z.s = z.p3 + slot;
    z.ds = z.s + strip;
    z.qg = z.ds + strip;
    z.dg = z.qg + group_slot(T, hs);
    z.D = z.dg + group_slot(T, hs);
    z.qb = z.D + up16(BQ);
    z.db = z.qb + (int64_t)BQ * hs;
    return z;
}

int64_t sp_attention_scratch_floats(int B, int T, int C, int NH)
{
    if (T <= 0 || NH <= 0)
        return 1;
    return 16 + 3 * packed_slot(T, C / NH) + 2 * (int64_t)group_rows(T) * up16(T) +
           2 * group_slot(T, C / NH) + up16(BQ);
}

int64_t sp_attention_scratch_floats_bf16(int B, int T, int C, int NH)
{
    if (T <= 0 || NH <= 0)
        return 1;
    return sp_attention_scratch_floats(B, T, C, NH) + 2 * (int64_t)BQ * (C / NH);
}

/* rows (bq, hs) of stride ld rounded to bf16 into dst (bq, hs) */
static void round_rows(float *restrict dst, const float *restrict src, int64_t ld, int bq,
                       int hs)
{
    for (int r = 0; r < bq; r++)
        sp_round_bf16(dst + (int64_t)r * hs, src + r * ld, hs);
}

/* Where head h's q, k and v start in a row of qkv, and the row's width: the GPT layout
 * (group 0: [q | k | v], each C = NH hs wide) or the grouped one (group G: per KV head
 * its G query heads, its key and its value, hs each; query head h uses KV head h / G). */
typedef struct {
    int64_t ld, q, k, v;
} att_head;

static att_head head_at(int h, int C, int NH, int group)
{
    const int hs = C / NH;
    if (!group) return (att_head){ 3 * (int64_t)C, (int64_t)h * hs, C + (int64_t)h * hs,
                                   2 * (int64_t)C + (int64_t)h * hs };
    const int64_t kv = h / group, w = (int64_t)(group + 2) * hs;
    return (att_head){ (NH / group) * w, kv * w + (int64_t)(h % group) * hs,
                       kv * w + (int64_t)group * hs, kv * w + (int64_t)(group + 1) * hs };
}

/* Per (b, h): k^T and v packed (and rounded, bf16), once per KV head; block by block, S =
 * q_i k^T (keys 0..kend-1), softmax, out_i = P v (bf16: (P~ v) / sum, P~ unnormalized and
 * rounded). */
static void attention_forward(float *restrict out, float *restrict lse, float *restrict scratch,
                              const float *restrict qkv, int B, int T, int C, int NH, int group,
                              int bf16)
{
    if (B <= 0 || T <= 0 || NH <= 0)
        return;
    const int hs = C / NH, G = group ? group : 1;
    const float scale = 1.0f / sqrtf((float)hs);
    const att_scratch z = carve(scratch, T, hs);
    const int64_t LD = up16(T); /* the strips' row stride */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const att_head at = head_at(h, C, NH, group);
            const int64_t C3 = at.ld;
            const float *row = qkv + (int64_t)b * T * C3;
            const float *q = row + at.q, *k = row + at.k, *v = row + at.v;
            float *o = out + (int64_t)b * T * C + h * hs;
            float *L = lse + ((int64_t)b * NH + h) * T;
            if (h % G == 0) {
                sp_gemm_pack(z.kt, k, C3, 1, hs, T); /* k^T (hs, T) */
                sp_gemm_pack(z.p2, v, C3, 0, T, hs); /* v (T, hs) */
                if (bf16) { /* rounding commutes with packing */
                    sp_round_bf16(z.kt, z.kt, sp_gemm_packed_floats(hs, T));
                    sp_round_bf16(z.p2, z.p2, sp_gemm_packed_floats(T, hs));
                }
            }
            for (int t0 = 0; t0 < T; t0 += BQ) {
                const int bq = T - t0 < BQ ? T - t0 : BQ, kend = t0 + bq;
                const float *qi = q + (int64_t)t0 * C3;
                int64_t lq = C3;
                if (bf16) {
                    round_rows(z.qb, qi, C3, bq, hs);
                    qi = z.qb, lq = hs;
                }
                sp_gemm_packed(z.s, LD, qi, lq, 0, z.kt, hs, T, bq, kend, hs, 0);
                softmax_rows(z.s, LD, bq, t0, kend, scale, L + t0, bf16 ? z.D : NULL);
                float *ot = o + (int64_t)t0 * C;
                sp_gemm_packed(ot, C, z.s, LD, 0, z.p2, T, hs, bq, hs, kend, 0);
                for (int r = 0; bf16 && r < bq; r++) /* the sums, after the product */
                    for (int i = 0; i < hs; i++)
                        ot[(int64_t)r * C + i] *= z.D[r];
            }
        }
}

void sp_attention_forward(float *restrict out, float *restrict lse, float *restrict scratch,
                          const float *restrict qkv, int B, int T, int C, int NH)
{
    attention_forward(out, lse, scratch, qkv, B, T, C, NH, 0, 0);
}

void sp_attention_forward_bf16(float *restrict out, float *restrict lse,
                               float *restrict scratch, const float *restrict qkv, int B, int T,
                               int C, int NH)
{
    attention_forward(out, lse, scratch, qkv, B, T, C, NH, 0, 1);
}

/* D[r] = x_r . y_r for bq rows of hs, ld apart: each a sequential sum in i order of
 * rounded products (no fused multiply-add); D has room for bq rounded up to 16. Sixteen
 * rows at a time: their products, sixteen columns at a time, transposed in registers
 * (sp_transpose16), so that lane r sums row r's products one after the other while the
 * sixteen chains run side by side. One row's chain at a time was a twelfth of the
 * backward's time; products stored transposed through memory, scalar, still 7%. */
static SP_VEC_FN void dot_rows(float *restrict D, const float *restrict x,
                               const float *restrict y, int64_t ld, int bq, int hs)
{
    for (int r0 = 0; r0 < bq; r0 += 16) {
        const int nr = bq - r0 < 16 ? bq - r0 : 16;
        v16f sum = { 0 };
        for (int c0 = 0; c0 < hs; c0 += 16) {
            const int w = hs - c0 < 16 ? hs - c0 : 16;
            v16f p[16];
            for (int r = 0; r < 16; r++) {
                if (r >= nr) { /* rows past bq: zeros, summed and never read */
                    p[r] = (v16f){ 0 };
                    continue;
                }
                const float *xr = x + (r0 + r) * ld + c0, *yr = y + (r0 + r) * ld + c0;
                if (w == 16) {
                    p[r] = sp_ld16(xr) * sp_ld16(yr);
                } else {
                    v16f a = { 0 }, b = { 0 };
                    for (int i = 0; i < w; i++) a[i] = xr[i], b[i] = yr[i];
                    p[r] = a * b;
                }
            }
            sp_transpose16(p);
            for (int i = 0; i < w; i++)
                sum += p[i];
        }
        sp_st16(D + r0, sum);
    }
}

/* Per (b, h), block by block: P from the saved lse, dP = dout_i v^T, dS = P (dP - D)
 * scale; dq_i = dS k. A group's blocks keep their P and dS, then dk += dS^T q and dv +=
 * P^T dout over the group's rows, per key block from its own first row (the rows before
 * it see it masked). Each dk and dv element is so one chain over the query rows in
 * ascending order, from its diagonal block's first row (masked zeros included), exactly
 * the terms a block at a time took: the same bits at any group size. A KV head collects
 * its G query heads in ascending order, from zero when acc = 0. bf16: q, k, v, dout
 * rounded as operands (D stays of the fp32 dout and out), then P and dS rounded after
 * the softmax backward (dS from the fp32 P). */
static SP_NOFMA void attention_backward(float *restrict dqkv, float *restrict scratch,
                                        const float *restrict dout, const float *restrict qkv,
                                        const float *restrict out, const float *restrict lse,
                                        int B, int T, int C, int NH, int group, int acc,
                                        int bf16)
{
    if (B <= 0 || T <= 0 || NH <= 0)
        return;
    const int hs = C / NH, G = group ? group : 1, GR = group_rows(T);
    const float scale = 1.0f / sqrtf((float)hs);
    const att_scratch z = carve(scratch, T, hs);
    const int64_t LD = up16(T); /* the strips' row stride */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const att_head at = head_at(h, C, NH, group);
            const int64_t C3 = at.ld, base = (int64_t)b * T * C3;
            const float *q = qkv + base + at.q, *k = qkv + base + at.k, *v = qkv + base + at.v;
            const float *d = dout + (int64_t)b * T * C + h * hs;
            const float *o = out + (int64_t)b * T * C + h * hs;
            const float *L = lse + ((int64_t)b * NH + h) * T;
            float *dq = dqkv + base + at.q, *dk = dqkv + base + at.k, *dv = dqkv + base + at.v;
            const int kv_acc = acc || h % G != 0; /* dk, dv: add to what is there */
            if (h % G == 0) {
                sp_gemm_pack(z.kt, k, C3, 1, hs, T); /* k^T (hs, T) */
                sp_gemm_pack(z.p2, v, C3, 1, hs, T); /* v^T (hs, T) */
                sp_gemm_pack(z.p3, k, C3, 0, T, hs); /* k (T, hs) */
                if (bf16) {
                    sp_round_bf16(z.kt, z.kt, sp_gemm_packed_floats(hs, T));
                    sp_round_bf16(z.p2, z.p2, sp_gemm_packed_floats(hs, T));
                    sp_round_bf16(z.p3, z.p3, sp_gemm_packed_floats(T, hs));
                }
            }
            for (int g0 = 0; g0 < T; g0 += GR) {
                const int g1 = T - g0 < GR ? T : g0 + GR;
                for (int t0 = g0; t0 < g1; t0 += BQ) {
                    const int bq = g1 - t0 < BQ ? g1 - t0 : BQ, kend = t0 + bq;
                    const float *qi = q + (int64_t)t0 * C3, *di = d + (int64_t)t0 * C;
                    int64_t lq = C3, ld = C;
                    dot_rows(z.D, di, o + (int64_t)t0 * C, C, bq, hs);
                    if (bf16) {
                        round_rows(z.qb, qi, C3, bq, hs);
                        round_rows(z.db, di, C, bq, hs);
                        qi = z.qb, di = z.db, lq = ld = hs;
                    }
                    float *s = z.s + (t0 - g0) * LD, *ds = z.ds + (t0 - g0) * LD;
                    sp_gemm_packed(s, LD, qi, lq, 0, z.kt, hs, T, bq, kend, hs, 0);
                    sp_gemm_packed(ds, LD, di, ld, 0, z.p2, hs, T, bq, kend, hs, 0);
                    softmax_backward_rows(s, ds, LD, bq, t0, kend, scale, L + t0, z.D);
                    if (bf16)
                        for (int r = 0; r < bq; r++) {
                            sp_round_bf16(s + r * LD, s + r * LD, up16(kend));
                            sp_round_bf16(ds + r * LD, ds + r * LD, up16(kend));
                        }
                    sp_gemm_packed(dq + (int64_t)t0 * C3, C3, ds, LD, 0, z.p3, T, hs, bq, hs,
                                   kend, acc);
                }
                /* the group's q and dout rows, packed once for all its key blocks */
                const int rows = g1 - g0;
                sp_gemm_pack(z.qg, q + (int64_t)g0 * C3, C3, 0, rows, hs);
                sp_gemm_pack(z.dg, d + (int64_t)g0 * C, C, 0, rows, hs);
                if (bf16) {
                    sp_round_bf16(z.qg, z.qg, sp_gemm_packed_floats(rows, hs));
                    sp_round_bf16(z.dg, z.dg, sp_gemm_packed_floats(rows, hs));
                }
                if (g0 > 0) { /* keys before the group: every row of it, after earlier groups */
                    sp_gemm_packed(dk, C3, z.ds, LD, 1, z.qg, rows, hs, g0, hs, rows, 1);
                    sp_gemm_packed(dv, C3, z.s, LD, 1, z.dg, rows, hs, g0, hs, rows, 1);
                }
                for (int j0 = g0; j0 < g1; j0 += BQ) { /* the group's own keys, first seen here */
                    const int bk = g1 - j0 < BQ ? g1 - j0 : BQ, r0 = j0 - g0;
                    const int64_t at0 = (int64_t)r0 * LD + j0;
                    sp_gemm_packed(dk + (int64_t)j0 * C3, C3, z.ds + at0, LD, 1,
                                   sp_gemm_packed_from(z.qg, hs, r0), rows, hs, bk, hs, g1 - j0,
                                   kv_acc);
                    sp_gemm_packed(dv + (int64_t)j0 * C3, C3, z.s + at0, LD, 1,
                                   sp_gemm_packed_from(z.dg, hs, r0), rows, hs, bk, hs, g1 - j0,
                                   kv_acc);
                }
            }
        }
}

void sp_attention_backward(float *restrict dqkv, float *restrict scratch,
                           const float *restrict dout, const float *restrict qkv,
                           const float *restrict out, const float *restrict lse, int B, int T,
                           int C, int NH, int acc)
{
    attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, 0, acc, 0);
}

void sp_attention_backward_bf16(float *restrict dqkv, float *restrict scratch,
                                const float *restrict dout, const float *restrict qkv,
                                const float *restrict out, const float *restrict lse, int B,
                                int T, int C, int NH, int acc)
{
    attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, 0, acc, 1);
}

void sp_attention_gqa_forward(float *restrict out, float *restrict lse, float *restrict scratch,
                              const float *restrict qkv, int B, int T, int C, int NH, int group,
                              int bf16)
{
    attention_forward(out, lse, scratch, qkv, B, T, C, NH, group, bf16);
}

void sp_attention_gqa_backward(float *restrict dqkv, float *restrict scratch,
                               const float *restrict dout, const float *restrict qkv,
                               const float *restrict out, const float *restrict lse, int B,
                               int T, int C, int NH, int group, int acc, int bf16)
{
    attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, group, acc, bf16);
}
