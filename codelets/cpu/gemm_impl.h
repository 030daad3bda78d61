/* The kernels' own single-threaded sgemm (gemm.c), used by matmul.c and attention.c in
 * place of OpenBLAS. Internal to codelets/cpu and its tests.
 *
 * Its bits are defined by C alone: every element of c is one sequential chain of fused
 * multiply-adds, s = fmaf(a[i][k], b[k][j], s) for k = 0, 1, ..., k-1, from s = c[i][j]
 * when acc, else 0 (one rounding per term: fmaf is correctly rounded, like the FMA
 * instructions the vector paths use).
 * Blocking, vector width and the instruction set only change which elements are computed
 * together, never that order, so every path gives the same bits on every machine (unlike
 * OpenBLAS, whose kernels, chosen from the CPU model, each round their own way). */
#ifndef STARPIPE_CPU_GEMM_IMPL_H
#define STARPIPE_CPU_GEMM_IMPL_H

#include <stdint.h>

/* c (m,n), row stride ldc, = op(a) (m,k) @ op(b) (k,n) [+ c if acc]. ta: a is stored (k,m)
 * with row stride lda, else (m,k); tb: b is stored (n,k), else (k,n). c must not overlap
 * a or b. acc = 0 never reads c; k = 0 gives zeros (acc = 0) or leaves c. */
void sp_gemm(float *c, int64_t ldc, const float *a, int64_t lda, int ta, const float *b,
             int64_t ldb, int tb, int m, int n, int k, int acc);
/* c = op(a) @ op(b) with bias (n floats) added to each row: each element sp_gemm's chain
 * from 0, rounded, then + bias[j], rounded once, as it is stored. The bits of sp_gemm and
 * then a bias add, without a second pass over c. */
void sp_gemm_bias(float *c, int64_t ldc, const float *a, int64_t lda, int ta, const float *b,
                  int64_t ldb, int tb, int m, int n, int k, const float *bias);

/* B packed once, for products that reuse it (attention: every query block against the
 * same keys). sp_gemm_pack writes op(b) (k,n) into bp, sp_gemm_packed_floats(k, n) floats
 * (enough for any path); sp_gemm_packed then takes rows 0..k-1 and columns 0..n-1 of an
 * op(b) packed with depth kp and width np (k <= kp, n <= np) as its b. Pack and use on
 * the same path. 64-byte alignment of bp is faster, not required.
 * sp_gemm_packed_from(bp, np, k0) is that packed op(b) from row k0 on: give it to
 * sp_gemm_packed with the same kp and np, and k <= kp - k0. */
int64_t sp_gemm_packed_floats(int k, int n);
void sp_gemm_pack(float *bp, const float *b, int64_t ldb, int tb, int k, int n);
void sp_gemm_packed(float *c, int64_t ldc, const float *a, int64_t lda, int ta,
                    const float *bp, int kp, int np, int m, int n, int k, int acc);
const float *sp_gemm_packed_from(const float *bp, int np, int k0);

/* The instruction-set paths, chosen once from the CPU (the widest supported). */
enum { SP_GEMM_PORTABLE, SP_GEMM_AVX2, SP_GEMM_AVX512, SP_GEMM_NPATHS };
/* For tests and benchmarks: the path in use; sp_gemm_set_path selects one (returns 0), or
 * returns -1 when this CPU or build lacks it. */
int sp_gemm_path(void);
int sp_gemm_set_path(int path);
const char *sp_gemm_path_name(int path);

#endif
