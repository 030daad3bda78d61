/* sp_gemm (gemm_impl.h): a blocked single-threaded sgemm whose bits do not depend on the
 * machine. On x86-64 it runs AVX-512F or AVX2+FMA micro-kernels when the CPU has them,
 * with the same results as the portable one: each element is the same sequential chain
 * of fused multiply-adds (fmaf is correctly rounded, as the instructions are). */
#include "codelets/cpu/gemm_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#endif

#include "codelets/cpu/scratch_impl.h"
#include "codelets/cpu/vec_impl.h"

/* Block sizes: a packed panel of b (kc x NR) stays in L1 (or L2) while the rows of a
 * stream past it; MC rows of a (MC x kc) stay in L2 while the panels go by. kc is the
 * tile's (gemm_tile). Products of more than one block of rows pack b's panels once per
 * block of k, up to NC_SHARED_BYTES of them, for all the row blocks to share. Buffers
 * are the thread's (sp_scratch); without memory, a panel of up to KC_STACK rows is packed
 * at a time on the stack (with an edge tile of c, about 36 KB). */
#define KC_STACK 256
#define MC 384
#define MC_LAST (MC + MC / 2) /* the last block of rows takes up to this many */
/* 1 MB, not 1024 columns: 512 deep, those were 2 MB, a Xeon core's whole L2, beside a
 * block of rows of a read in place; the block's forward products +1% (bench/README.md,
 * "Huge pages, whole") */
#define NC_SHARED_BYTES ((int64_t)1 << 20)
#define PACK_AHEAD 8
#define MR_MAX 24
#define NR_MAX 32

typedef void (*kernel_fn)(int kc, const float *a, const int64_t *roff, int64_t csa,
                          const float *bp, float *c, int64_t ldc, int load, const float *bias,
                          const float *cnext);

/* The portable path: fmaf per element (a library call where the CPU has no FMA: slow,
 * but the same bits as the vector paths). */
#define GK_NAME kernel_portable
#define GK_ATTR SP_NOFMA
#define GK_FMA(acc, x, b) fma_portable(acc, x, b)
typedef float v4sf __attribute__((vector_size(16)));
static inline v4sf fma_portable(v4sf acc, float x, v4sf b)
{
    for (int e = 0; e < 4; e++)
        acc[e] = fmaf(x, b[e], acc[e]);
    return acc;
}
#define GK_VB 16
#define GK_MR 4
#define GK_NV 2
#include "codelets/cpu/gemm_kernel.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SP_GEMM_X86 1
#define GK_NAME kernel_avx2
#define GK_ATTR SP_NOFMA __attribute__((target("avx2,fma")))
#define GK_FMA(acc, x, b) ((v)_mm256_fmadd_ps(_mm256_set1_ps(x), (__m256)(b), (__m256)(acc)))
#define GK_VB 32
#define GK_MR 6
#define GK_NV 2
#include "codelets/cpu/gemm_kernel.h"

/* 8 rows, not 12: on a Zen 4 core the 8 x 32 tile ran the GPT-2 block's products 2-4%
 * faster at 2048 rows and up to 10% at 64 (where 12 rows compute 72), same bits
 * (bench/README.md, "The 8 x 32 tile"). */
#define GK_NAME kernel_avx512
#define GK_ATTR SP_NOFMA __attribute__((target("avx512f")))
#define GK_FMA(acc, x, b) ((v)_mm512_fmadd_ps(_mm512_set1_ps(x), (__m512)(b), (__m512)(acc)))
#define GK_VB 64
#define GK_MR 8
#define GK_NV 2
#include "codelets/cpu/gemm_kernel.h"

/* For n <= 16 (attention's head columns): one vector per row, taller tiles. */
#define GK_NAME kernel_avx512_narrow
#define GK_ATTR SP_NOFMA __attribute__((target("avx512f")))
#define GK_FMA(acc, x, b) ((v)_mm512_fmadd_ps(_mm512_set1_ps(x), (__m512)(b), (__m512)(acc)))
#define GK_VB 64
#define GK_MR 24
#define GK_NV 1
#include "codelets/cpu/gemm_kernel.h"
#endif

typedef struct {
    kernel_fn kernel;
    int mr, nr, kc; /* kc: the depth of a block of k */
    int pack_rows;  /* large products pack an untransposed a too (else read in place) */
    int kc_packed;  /* the depth of a block of k when a is packed */
} gemm_tile;

/* A path's tile, and optionally a narrow one for products of at most its nr columns. */
typedef struct {
    const char *name;
    gemm_tile wide, narrow; /* wide.kernel NULL: not in this build; narrow.kernel optional */
} gemm_path;

static const gemm_path paths[SP_GEMM_NPATHS] = {
    [SP_GEMM_PORTABLE] = { "portable", { kernel_portable, 4, 8, 256, 1, 256 }, { NULL } },
#ifdef SP_GEMM_X86
    [SP_GEMM_AVX2] = { "avx2", { kernel_avx2, 6, 16, 256, 1, 256 }, { NULL } },
    /* kc 768, not 256: a GPT-2 width (768) in one block, c loaded and stored once; on a
     * Zen 4 core (1 MB of L2) the block's products +2-3% at 2048 rows, the head's forward
     * at 64 rows +15% (bench/README.md, "The 8 x 32 tile"). An untransposed a is read in
     * place: its eight rows are eight streams the core follows, and packing them cost
     * 2-3% of the large GPT config's products on a Xeon (bench/README.md, "Aligned
     * buffers"); on a Zen 4 core it made no difference. A transposed a (the dW products)
     * is packed, 256 deep: a block of up to 576 rows 768 deep (1.8 MB) filled a Xeon
     * core's 2 MB of L2 beside c and b's panels; at 256 (0.6 MB) the block's dW products
     * ran 1.5-2% faster (bench/README.md, "Huge pages, whole"). */
    [SP_GEMM_AVX512] = { "avx512f", { kernel_avx512, 8, 32, 768, 0, 256 },
                         { kernel_avx512_narrow, 24, 16, 256, 1, 256 } },
#else
    [SP_GEMM_AVX2] = { "avx2", { NULL } },
    [SP_GEMM_AVX512] = { "avx512f", { NULL } },
#endif
};

/* The tile for products of n columns (or packed panels of n columns): every tile gives
 * the same bits, so this only saves the padding of a wide tile. */
static const gemm_tile *tile_for(int n)
{
    const gemm_path *P = &paths[sp_gemm_path()];
    return P->narrow.kernel && n <= P->narrow.nr ? &P->narrow : &P->wide;
}

static int supported(int p)
{
    if (p < 0 || p >= SP_GEMM_NPATHS || !paths[p].wide.kernel)
        return 0;
#ifdef SP_GEMM_X86
    __builtin_cpu_init();
    if (p == SP_GEMM_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (p == SP_GEMM_AVX512)
        return __builtin_cpu_supports("avx512f");
#endif
    return 1;
}

/* -1 until first use; every thread that races here picks the same path. */
static int current = -1;

int sp_gemm_path(void)
{
    int p = __atomic_load_n(&current, __ATOMIC_RELAXED);
    if (p < 0) {
        p = SP_GEMM_NPATHS - 1;
        while (!supported(p))
            p--;
        __atomic_store_n(&current, p, __ATOMIC_RELAXED);
    }
    return p;
}

int sp_gemm_set_path(int path)
{
    if (!supported(path))
        return -1;
    __atomic_store_n(&current, path, __ATOMIC_RELAXED);
    return 0;
}

const char *sp_gemm_path_name(int path)
{
    return path >= 0 && path < SP_GEMM_NPATHS ? paths[path].name : "?";
}

#ifdef SP_GEMM_X86
/* The 8x8 transpose of r (r[i][j] -> out[j][i]), in registers. */
__attribute__((target("avx2"))) static inline void transpose8(const __m256 r[8], __m256 out[8])
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    out[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    out[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    out[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    out[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    out[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    out[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    out[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    out[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* bp rows k = 0..kc8-1 (kc8 a multiple of 8), columns j..j+7 <- eight rows of b stored
 * (n, k), ldb apart, from s: b's rows become the panel's columns. */
__attribute__((target("avx2"))) static void pack_cols8_avx2(float *restrict bp, int NR,
                                                           const float *restrict s,
                                                           int64_t ldb, int kc8)
{
    for (int k = 0; k < kc8; k += 8) {
        __m256 r[8], c[8];
        for (int i = 0; i < 8; i++)
            r[i] = _mm256_loadu_ps(s + i * ldb + k);
        transpose8(r, c);
        for (int i = 0; i < 8; i++)
            _mm256_storeu_ps(bp + (int64_t)(k + i) * NR, c[i]);
    }
}

/* d (kc, MR interleaved) <- MR rows of a (MR 6, or a multiple of 8), lda apart, kc long,
 * rows from mr on repeating the last: a tile's micro-panel of an untransposed a, eight
 * rows and eight columns at a time by 8x8 register transposes instead of one load and
 * store per element (that gather was 5% of the large GPT config's pipelined step on the
 * AVX-512 tiles, perf record 2026-12-05). */
__attribute__((target("avx2"))) static void pack_rows_avx2(float *restrict d, int MR,
                                                           const float *restrict src,
                                                           int64_t lda, int mr, int kc)
{
    for (int g = 0; g < MR; g += 8) {
        const int w = MR - g < 8 ? MR - g : 8; /* rows this group stores */
        const float *row[8];
        for (int i = 0; i < 8; i++)
            row[i] = src + (int64_t)(g + i < mr ? g + i : mr - 1) * lda;
        int kk = 0;
        for (; kk + 8 <= kc; kk += 8) {
            __m256 r[8], col[8]; /* col[j] = (row 0 .. row 7)[kk + j] */
            for (int i = 0; i < 8; i++)
                r[i] = _mm256_loadu_ps(row[i] + kk);
            transpose8(r, col);
            for (int j = 0; j < 8; j++) {
                float *o = d + (int64_t)(kk + j) * MR + g;
                if (w == 8)
                    _mm256_storeu_ps(o, col[j]);
                else { /* six: four, then two (AMD's masked stores are slow) */
                    _mm_storeu_ps(o, _mm256_castps256_ps128(col[j]));
                    _mm_storel_pi((__m64 *)(o + 4), _mm256_extractf128_ps(col[j], 1));
                }
            }
        }
        for (; kk < kc; kk++)
            for (int i = 0; i < w; i++)
                d[(int64_t)kk * MR + g + i] = row[i][kk];
    }
}
#endif

/* bp (kc, NR) <- op(b) rows k0.., columns j0..j0+nr-1, zero-padded to NR columns. */
static void pack_panel(float *restrict bp, int NR, const float *restrict b, int64_t ldb,
                       int tb, int k0, int kc, int j0, int nr)
{
    if (!tb) {
        /* a whole panel row is a copy of a size known here: inlined, not a memcpy call
         * per 32-128 bytes (which took a tenth of the GPT step's products on AVX2). The
         * rows are ldb apart, beyond what the hardware prefetchers follow: the row
         * PACK_AHEAD on is fetched as each is copied (+1-2% on the products on a Xeon). */
#define SP_PACK_ROWS(W)                                                               \
    for (int k = 0; k < kc; k++) {                                                    \
        const float *s_ = b + (int64_t)(k0 + k) * ldb + j0;                           \
        if (k + PACK_AHEAD < kc) {                                                    \
            __builtin_prefetch(s_ + PACK_AHEAD * ldb);                                \
            __builtin_prefetch(s_ + PACK_AHEAD * ldb + (W) - 1);                      \
        }                                                                             \
        memcpy(bp + (int64_t)k * (W), s_, sizeof(float) * (W));                      \
    }
        switch (nr == NR ? NR : 0) {
        case 8: SP_PACK_ROWS(8); return;
        case 16: SP_PACK_ROWS(16); return;
        case 32: SP_PACK_ROWS(32); return;
        }
#undef SP_PACK_ROWS
        for (int k = 0; k < kc; k++) {
            float *d = bp + (int64_t)k * NR;
            memcpy(d, b + (int64_t)(k0 + k) * ldb + j0, sizeof(float) * (size_t)nr);
            for (int j = nr; j < NR; j++)
                d[j] = 0.0f;
        }
        return;
    }
    /* b stored (n, k): gather 8 columns at a time, so each read stream stays in a line */
    for (int j = 0; j < nr; j += 8) {
        const int w = nr - j < 8 ? nr - j : 8;
        const float *s = b + (int64_t)(j0 + j) * ldb + k0;
        int k = 0;
#ifdef SP_GEMM_X86
        if (w == 8 && sp_gemm_path() != SP_GEMM_PORTABLE) { /* the vector paths have AVX2 */
            k = kc & ~7;
            pack_cols8_avx2(bp + j, NR, s, ldb, k);
        }
#endif
        for (; k < kc; k++)
            for (int jj = 0; jj < w; jj++)
                bp[(int64_t)k * NR + j + jj] = s[jj * ldb + k];
    }
    if (nr < NR)
        for (int k = 0; k < kc; k++)
            for (int j = nr; j < NR; j++)
                bp[(int64_t)k * NR + j] = 0.0f;
}

/* Memory the loops read next (rows of lines `stride` bytes apart: b's next panel),
 * prefetched a few lines before each tile: a weight that one small microbatch uses
 * comes from memory once, in rows too short or too far apart for the hardware
 * prefetchers to follow. +2-5% on GPT-2 124M's products at 64-256 rows on a Zen 4 core
 * (bench/README.md, "The 8 x 32 tile"). Not on Intel cores: on a Xeon it cost 2-5% of
 * the products, in bursts before each tile or spread through the kernel's steps alike
 * (bench/README.md, "Aligned buffers"). */
typedef struct {
    const char *row;
    int64_t stride;
    int lines_per_row, line, left;
} prefetch_stream;

static void stream_start(prefetch_stream *s, const float *p, int64_t stride_floats, int rows,
                         int floats)
{
    const uintptr_t a = (uintptr_t)p & ~(uintptr_t)63;
    const int lines = (int)(((uintptr_t)(p + floats) - a + 63) / 64);
    *s = (prefetch_stream){ (const char *)a, stride_floats * 4, lines, 0, rows * lines };
}

static void stream_fetch(prefetch_stream *s, int lines)
{
    for (; lines > 0 && s->left > 0; lines--, s->left--) {
        __builtin_prefetch(s->row + (int64_t)s->line * 64, 0, 2);
        if (++s->line == s->lines_per_row) {
            s->line = 0;
            s->row += s->stride;
        }
    }
}

static int next_panel_prefetch(void)
{
    static int on = -1; /* every thread that races here finds the same */
    int v = __atomic_load_n(&on, __ATOMIC_RELAXED);
    if (v < 0) {
        v = 1;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
        __builtin_cpu_init();
        v = !__builtin_cpu_is("intel");
#endif
        __atomic_store_n(&on, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* d (kc, MR interleaved) <- a micro-panel of op(a): mr rows (a[r][kk] = src[r * rsa +
 * kk * csa]), kc long, the rows from mr to MR repeating the last. */
static void pack_a(float *restrict d, const gemm_tile *P, const float *restrict src, int ta,
                   int64_t rsa, int64_t csa, int mr, int kc)
{
    const int MR = P->mr;
#ifdef SP_GEMM_X86
    /* the vector paths, which have AVX2: a copy a vector at a time, not a float */
#define SP_PACK_COPY(W)                                                                 \
    for (int kk = 0; kk < kc; kk++)                                                     \
        memcpy(d + (int64_t)kk * (W), src + (int64_t)kk * csa, sizeof(float) * (W))
    if (P->kernel != kernel_portable && (MR == 6 || MR % 8 == 0)) {
        if (!ta) { /* rows lda apart */
            pack_rows_avx2(d, MR, src, rsa, mr, kc);
            return;
        }
        if (mr == MR) { /* a's MR rows lie side by side at each k */
            switch (MR) {
            case 6: SP_PACK_COPY(6); return;
            case 8: SP_PACK_COPY(8); return;
            case 24: SP_PACK_COPY(24); return;
            }
        }
    }
#undef SP_PACK_COPY
#endif
    int64_t roff[MR_MAX];
    for (int r = 0; r < MR; r++) /* rows past the edge: the last again */
        roff[r] = (r < mr ? r : mr - 1) * rsa;
    for (int kk = 0; kk < kc; kk++, src += csa, d += MR)
        for (int r = 0; r < MR; r++) d[r] = src[roff[r]];
}

/* d <- the micro-panels of mc rows of a stored transposed (a[i][kk] = src[i + kk * lda]),
 * kc deep, as pack_a lays them out tile by tile, but k in chunks of 16: the tiles that
 * share a line of src (two 8-row tiles) read it back to back, not kc rows apart, when
 * with rows 4 KB apart it had long left L1. +1-6% on the large GPT config's dW products
 * on a Xeon (bench/README.md, "Aligned buffers"). */
static void pack_a_t(float *restrict d, const gemm_tile *P, const float *restrict src,
                     int64_t lda, int mc, int kc)
{
    const int MR = P->mr;
    for (int kk0 = 0; kk0 < kc; kk0 += 16) {
        const int kn = kc - kk0 < 16 ? kc - kk0 : 16;
        for (int i0 = 0; i0 < mc; i0 += MR)
            pack_a(d + (int64_t)i0 * kc + (int64_t)kk0 * MR, P, src + i0 + (int64_t)kk0 * lda,
                   1, 1, lda, mc - i0 < MR ? mc - i0 : MR, kn);
    }
}

/* The blocked loops. B comes packed (bpk: panels of depth kp, as sp_gemm_pack writes
 * them) or is packed here into the thread's buffer: the panels of a block of k shared by
 * all the blocks of rows, or one panel at a time when there is one block of rows. bias (n
 * floats, with acc 0) or NULL: added to each row as the last block of k stores it. */
static void gemm_run(float *c, int64_t ldc, const float *a, int64_t lda, int ta, const float *b,
                     int64_t ldb, int tb, const float *bpk, int kp, int np, int m, int n, int k,
                     int acc, int no_apack, const float *bias)
{
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0) {
        if (!acc)
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++)
                    c[(int64_t)i * ldc + j] = bias ? 0.0f + bias[j] : 0.0f;
        return;
    }
    const gemm_tile *P = tile_for(bpk ? np : n);
    const int MR = P->mr, NR = P->nr;
    /* a[i][kk] = a[i * rsa + kk * csa] */
    const int64_t rsa = ta ? 1 : lda, csa = ta ? lda : 1;
    /* Large products pack each block of a into micro-panels (MR rows interleaved, k
     * ascending): the kernel then reads one stream rather than MR rows lda apart (or,
     * transposed, one line per k). +16% on the GPT block's products on an AVX2 core
     * (bench/README.md); the arithmetic is the same. Not small ones, nor an untransposed a
     * where the tile reads its rows in place (pack_rows 0). */
    const int pack_a_block = !no_apack && (ta || P->pack_rows) &&
                             (int64_t)m * n * k >= (1 << 21) && m >= 2 * MR;
    int KC = pack_a_block ? P->kc_packed : P->kc;
    /* Shared panels: each panel of b was packed m / MC times, once per block of rows (for
     * the layers' forward, a transpose each time); packed once, the GPT block's products
     * at 2048 rows went from 81.6% to 83.7% of a Xeon core's peak (bench/README.md,
     * "Shared panels"). ncb columns are packed at a time. */
    int shared = !bpk && m > MC_LAST;
    int ncb = NR;
    if (shared) {
        const int64_t depth = k < KC ? k : KC;
        const int64_t most = NC_SHARED_BYTES / ((int64_t)sizeof(float) * depth) / NR * NR;
        ncb = n < most ? (n + NR - 1) / NR * NR : most > NR ? (int)most : NR;
    }
    float bstack[KC_STACK * NR_MAX] __attribute__((aligned(64)));
    float *bp = bpk ? NULL : sp_scratch(SP_SCRATCH_GEMM_B, (int64_t)KC * ncb);
    if (!bpk && !bp) { /* no memory: a panel at a time on the stack, the same bits */
        shared = 0;
        ncb = NR;
        KC = KC < KC_STACK ? KC : KC_STACK;
        bp = bstack;
    }
    float ce[MR_MAX * NR_MAX]; /* an edge tile of c */
    int64_t roff[MR_MAX], poff[MR_MAX]; /* a's rows; poff: a packed panel's */
    float *apack =
        pack_a_block ? sp_scratch(SP_SCRATCH_GEMM_A, (int64_t)(MC_LAST + MR_MAX) * KC) : NULL;
    for (int r = 0; r < MR; r++) poff[r] = r;
    for (int jc = 0; jc < n; jc += shared ? ncb : n) {
        const int jend = shared && n - jc > ncb ? jc + ncb : n; /* columns jc..jend-1 */
        for (int k0 = 0; k0 < k; k0 += KC) {
            const int kc = k - k0 < KC ? k - k0 : KC;
            const int load = acc || k0 > 0; /* the running sums wait in c between blocks */
            const float *kbias = k0 + kc >= k ? bias : NULL; /* the last block adds it */
            for (int j0 = jc; shared && j0 < jend; j0 += NR)
                pack_panel(bp + (int64_t)(j0 - jc) / NR * kc * NR, NR, b, ldb, tb, k0, kc, j0,
                           jend - j0 < NR ? jend - j0 : NR);
            /* blocks of MC rows, the last up to 1.5 MC: 512 rows (a microbatch of the large
             * GPT config) in one block, each panel of b packed once, not twice (+1-2%) */
            for (int m0 = 0, mc; m0 < m; m0 += mc) {
                mc = m - m0 < MC_LAST ? m - m0 : MC;
                if (apack && ta)
                    pack_a_t(apack, P, a + (int64_t)m0 + (int64_t)k0 * lda, lda, mc, kc);
                else if (apack)
                    for (int i0 = m0; i0 < m0 + mc; i0 += MR) {
                        float *d = apack + (int64_t)(i0 - m0) * kc;
                        const int mr = m0 + mc - i0 < MR ? m0 + mc - i0 : MR;
                        pack_a(d, P, a + (int64_t)i0 * rsa + (int64_t)k0 * csa, ta, rsa, csa,
                               mr, kc);
                    }
                for (int j0 = jc; j0 < jend; j0 += NR) {
                    const int nr = jend - j0 < NR ? jend - j0 : NR;
                    const float *panel = shared ? bp + (int64_t)(j0 - jc) / NR * kc * NR : bp;
                    prefetch_stream next = { 0 }; /* b's next panel */
                    if (bpk)
                        panel = bpk + (int64_t)(j0 / NR) * kp * NR + (int64_t)k0 * NR;
                    else if (!shared) {
                        pack_panel(bp, NR, b, ldb, tb, k0, kc, j0, nr);
                        int jn = j0 + NR, kn = k0, kcn = kc;
                        if (jn >= n && m0 + mc >= m && k0 + KC < k) { /* the next block's */
                            jn = 0;
                            kn = k0 + KC;
                            kcn = k - kn < KC ? k - kn : KC;
                        }
                        const int nrn = n - jn < NR ? n - jn : NR;
                        if (jn < n && next_panel_prefetch())
                            stream_start(&next,
                                         b + (tb ? (int64_t)jn * ldb + kn
                                                 : (int64_t)kn * ldb + jn),
                                         ldb, tb ? nrn : kcn, tb ? kcn : nrn);
                    }
                    const int tiles = (mc + MR - 1) / MR;
                    const int share = (next.left + tiles - 1) / tiles;
                    for (int i0 = m0; i0 < m0 + mc; i0 += MR) {
                        const int mr = m0 + mc - i0 < MR ? m0 + mc - i0 : MR;
                        stream_fetch(&next, share);
                        const float *ap = apack ? apack + (int64_t)(i0 - m0) * kc
                                                : a + (int64_t)i0 * rsa + (int64_t)k0 * csa;
                        const int64_t *ro = apack ? poff : roff, cs = apack ? MR : csa;
                        float *cp = c + (int64_t)i0 * ldc + j0;
                        /* rows past the edge read the last row again; their sums are
                         * dropped */
                        for (int r = 0; !apack && r < MR; r++)
                            roff[r] = (r < mr ? r : mr - 1) * rsa;
                        /* the next tile of c, fetched while this one computes: its rows
                         * are far apart, beyond what the hardware prefetchers follow */
                        const float *cnext =
                            i0 + 2 * MR <= m0 + mc ? cp + (int64_t)MR * ldc : NULL;
                        if (mr == MR && nr == NR) {
                            P->kernel(kc, ap, ro, cs, panel, cp, ldc, load,
                                      kbias ? kbias + j0 : NULL, cnext);
                            continue;
                        }
                        if (load)
                            for (int r = 0; r < mr; r++)
                                memcpy(ce + r * NR, cp + (int64_t)r * ldc,
                                       sizeof(float) * (size_t)nr);
                        /* bias: nr floats, added below */
                        P->kernel(kc, ap, ro, cs, panel, ce, NR, load, NULL, NULL);
                        for (int r = 0; r < mr; r++) {
                            float *cr = cp + (int64_t)r * ldc;
                            if (kbias)
                                for (int j = 0; j < nr; j++)
                                    cr[j] = ce[r * NR + j] + kbias[j0 + j];
                            else
                                memcpy(cr, ce + r * NR, sizeof(float) * (size_t)nr);
                        }
                    }
                }
            }
        }
    }
}

/* A few rows against a transposed b, x (m, k) @ W^T with W stored (n, k) as every layer's
 * forward has it: packing W into panels weighs on the product when m is small (a
 * microbatch of 64 tokens: 64 multiply-adds per packed element). So the product runs as
 * c^T = W x^T instead, W read in place as the a operand (its rows are contiguous in k)
 * and x packed (m columns), into a scratch that is then transposed into c. Each element is
 * still one chain fma(w, x, s) = fma(x, w, s) over k in order from c (acc) or 0: the same
 * bits. Measured on a Zen 4 core at GPT-2 124M's fc, (m, 768) @ (768, 3072): m = 64 went
 * from 71-79 to 80-97 GFLOP/s; m = 128 no change; m = 256 6% slower (bench/README.md). */
#define SWAP_MAX_M 96

static int swapped(float *c, int64_t ldc, const float *a, int64_t lda, const float *b,
                   int64_t ldb, int m, int n, int k, int acc, const float *bias)
{
    float *ct = malloc(sizeof(float) * (size_t)n * (size_t)m);
    if (!ct) return 0;
    if (acc)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) ct[(int64_t)j * m + i] = c[(int64_t)i * ldc + j];
    gemm_run(ct, m, b, ldb, 0, a, lda, 1, NULL, 0, 0, n, m, k, acc, 1, NULL);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            c[(int64_t)i * ldc + j] = bias ? ct[(int64_t)j * m + i] + bias[j]
                                           : ct[(int64_t)j * m + i];
    free(ct);
    return 1;
}

static void gemm(float *c, int64_t ldc, const float *a, int64_t lda, int ta, const float *b,
                 int64_t ldb, int tb, int m, int n, int k, int acc, const float *bias)
{
    if (!ta && tb && m > 0 && m <= SWAP_MAX_M && n >= 4 * m && k >= 64 &&
        swapped(c, ldc, a, lda, b, ldb, m, n, k, acc, bias))
        return;
    gemm_run(c, ldc, a, lda, ta, b, ldb, tb, NULL, 0, 0, m, n, k, acc, 0, bias);
}

void sp_gemm(float *c, int64_t ldc, const float *a, int64_t lda, int ta, const float *b,
             int64_t ldb, int tb, int m, int n, int k, int acc)
{
    gemm(c, ldc, a, lda, ta, b, ldb, tb, m, n, k, acc, NULL);
}

void sp_gemm_bias(float *c, int64_t ldc, const float *a, int64_t lda, int ta, const float *b,
                  int64_t ldb, int tb, int m, int n, int k, const float *bias)
{
    gemm(c, ldc, a, lda, ta, b, ldb, tb, m, n, k, 0, bias);
}

int64_t sp_gemm_packed_floats(int k, int n)
{
    int64_t np = ((int64_t)(n > 0 ? n : 0) + NR_MAX - 1) / NR_MAX * NR_MAX;
    return (int64_t)(k > 0 ? k : 0) * np;
}

void sp_gemm_pack(float *bp, const float *b, int64_t ldb, int tb, int k, int n)
{
    const int NR = tile_for(n)->nr;
    for (int j0 = 0; j0 < n; j0 += NR)
        pack_panel(bp + (int64_t)(j0 / NR) * k * NR, NR, b, ldb, tb, 0, k, j0,
                   n - j0 < NR ? n - j0 : NR);
}

const float *sp_gemm_packed_from(const float *bp, int np, int k0)
{
    return bp + (int64_t)k0 * tile_for(np)->nr; /* each panel's rows are nr floats */
}

void sp_gemm_packed(float *c, int64_t ldc, const float *a, int64_t lda, int ta,
                    const float *bp, int kp, int np, int m, int n, int k, int acc)
{
    gemm_run(c, ldc, a, lda, ta, NULL, 0, 0, bp, kp, np, m, n, k, acc, 0, NULL);
}
