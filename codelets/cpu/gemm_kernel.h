/* One register-blocked micro-kernel of gemm.c, included there once per instruction set
 * and tile shape (no include guard). The includer defines:
 *   GK_NAME    the function's name
 *   GK_ATTR    its attributes (target ISA; fp-contract off: only GK_FMA fuses)
 *   GK_FMA(acc, x, b)  acc = x * b + acc, one rounding per element (a fused
 *              multiply-add: the instruction, or fmaf on the portable path)
 *   GK_VB      vector bytes (16, 32, 64)
 *   GK_MR      rows of the tile
 *   GK_NV      vectors per row of the tile (1 or 2): NR = GK_NV * GK_VB / 4 columns */

/* c (GK_MR, NR) [+]= a (GK_MR, kc) @ bp (kc, NR). a[r][k] is a[roff[r] + k * csa]; bp is
 * a packed panel (row k at bp + k * NR). load: start from c, else 0. One accumulator per
 * element, k ascending: the order sp_gemm promises. bias (NR floats) or NULL: added to
 * each row's sums, rounded, as they are stored (sp_gemm_bias). cnext (or NULL): the next
 * tile of c (GK_MR rows, ldc apart), prefetched for writing during the first steps. */
GK_ATTR static void GK_NAME(int kc, const float *restrict a, const int64_t *restrict roff,
                            int64_t csa, const float *restrict bp, float *restrict c,
                            int64_t ldc, int load, const float *restrict bias,
                            const float *cnext)
{
    typedef float v __attribute__((vector_size(GK_VB)));
    typedef float vu __attribute__((vector_size(GK_VB), aligned(4))); /* unaligned */
    enum { VL = GK_VB / 4, NV = GK_NV, NR = NV * VL };
    int64_t ro[GK_MR];
    v acc[GK_MR][NV];
    /* every row loop unrolled, so that each accumulator is a register: GCC left the 24 x
     * 16 tile's row loop rolled, with its accumulators in memory (a load and a store per
     * FMA; attention at head size 16 ran its products at half the rate), and the 8 x 32
     * tile's rolled set-up and stores went through the stack */
#pragma GCC unroll 32
    for (int r = 0; r < GK_MR; r++) {
        ro[r] = roff[r];
        for (int j = 0; j < NV; j++)
            acc[r][j] = load ? *(const vu *)(c + r * ldc + j * VL) : (v){ 0 };
    }
#define GK_STEP(k)                                                                      \
    do {                                                                                \
        v b_[NV];                                                                       \
        for (int j = 0; j < NV; j++)                                                    \
            b_[j] = *(const vu *)(bp + (int64_t)(k) * NR + j * VL);                     \
        const float *ak_ = a + (int64_t)(k) * csa;                                      \
        _Pragma("GCC unroll 32") for (int r = 0; r < GK_MR; r++) {                      \
            const float ar = ak_[ro[r]];                                                \
            for (int j = 0; j < NV; j++)                                                \
                acc[r][j] = GK_FMA(acc[r][j], ar, b_[j]);                               \
        }                                                                               \
    } while (0)
    int k = 0;
    /* The next tile's lines (the first and last float of each row), one per step: a burst
     * of them before the call stalled the core on a full set of line-fill buffers (5% of
     * the products' time on a Xeon, perf record 2026-12-06), these overlap the FMAs. */
    if (cnext)
        for (; k < kc && k < 2 * GK_MR; k++) {
            __builtin_prefetch(cnext + (k >> 1) * ldc + (k & 1) * (NR - 1), 1, 3);
            GK_STEP(k);
        }
    for (; k < kc; k++)
        GK_STEP(k);
#undef GK_STEP
    if (bias) {
        v bv[NV];
        for (int j = 0; j < NV; j++)
            bv[j] = *(const vu *)(bias + j * VL);
#pragma GCC unroll 32
        for (int r = 0; r < GK_MR; r++)
            for (int j = 0; j < NV; j++)
                acc[r][j] += bv[j];
    }
#pragma GCC unroll 32
    for (int r = 0; r < GK_MR; r++)
        for (int j = 0; j < NV; j++)
            *(vu *)(c + r * ldc + j * VL) = acc[r][j];
}

#undef GK_NAME
#undef GK_ATTR
#undef GK_FMA
#undef GK_VB
#undef GK_MR
#undef GK_NV
