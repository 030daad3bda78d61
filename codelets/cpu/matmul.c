/* Matrix multiply forward and backward on sp_gemm (gemm.c), and sp_kernels_init.
 * acc maps onto sp_gemm's acc (start from the old c, or from 0), so no temporary is ever
 * allocated. */
#include "codelets/cpu/kernels.h"

#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "codelets/cpu/gemm_impl.h"
#include "codelets/cpu/scratch_impl.h"

/* C (m,n) = opA (m,k) @ opB (k,n) [+ C]. */
static void gemm(float *c, const float *a, int lda, int ta, const float *b, int ldb, int tb,
                 int m, int n, int k, int acc)
{
    sp_gemm(c, n, a, lda, ta, b, ldb, tb, m, n, k, acc);
}

void sp_matmul_forward(float *out, const float *a, const float *b,
                       int M, int Nc, int K, int ta, int tb, int acc)
{
    gemm(out, a, ta ? M : K, ta, b, tb ? K : Nc, tb, M, Nc, K, acc);
}

void sp_matmul_forward_bias(float *out, const float *a, const float *b, const float *bias,
                            int M, int Nc, int K, int ta, int tb)
{
    sp_gemm_bias(out, Nc, a, ta ? M : K, ta, b, tb ? K : Nc, tb, M, Nc, K, bias);
}

/* d op(a) (M,K) = dout (M,Nc) @ op(b)^T. When a is stored transposed, compute its
 * transpose directly: da (K,M) = op(b) (K,Nc) @ dout^T. */
void sp_matmul_backward_a(float *da, const float *dout, const float *b,
                          int M, int Nc, int K, int ta, int tb, int acc)
{
    int ldb = tb ? K : Nc;
    if (!ta)
        gemm(da, dout, Nc, 0, b, ldb, !tb, M, K, Nc, acc);
    else
        gemm(da, b, ldb, tb, dout, Nc, 1, K, M, Nc, acc);
}

/* d op(b) (K,Nc) = op(a)^T @ dout (M,Nc). When b is stored transposed:
 * db (Nc,K) = dout^T @ op(a). */
void sp_matmul_backward_b(float *db, const float *dout, const float *a,
                          int M, int Nc, int K, int ta, int tb, int acc)
{
    int lda = ta ? M : K;
    if (!tb)
        gemm(db, a, lda, !ta, dout, Nc, 0, K, Nc, M, acc);
    else
        gemm(db, dout, Nc, 1, a, lda, ta, Nc, K, M, acc);
}

/* The bits of x rounded to bfloat16, in the upper half (round_bits(u) & 0xffff is 0). */
static uint32_t round_bits(uint32_t u)
{
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
        return (u | 0x00400000u) & 0xffff0000u; /* NaN: quiet, and still a NaN */
    return (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; /* to nearest, ties to even */
}

void sp_round_bf16(float *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        u = round_bits(u);
        memcpy(&dst[i], &u, 4);
    }
}

void sp_to_bf16(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        dst[i] = (uint16_t)(round_bits(u) >> 16);
    }
}

/* Operand k (0 or 1) as the fp32 values of its bfloat16 rounding, n of them: x rounded,
 * or, when is16, x's bf16 storage widened (exact), in a buffer the thread keeps
 * (sp_scratch), so a step allocates nothing after its first products. NULL when memory
 * runs out: the caller fails rather than compute in the wrong precision. */
static const float *rounded(int k, const void *x, int is16, int64_t n)
{
    float *p = sp_scratch(k ? SP_SCRATCH_ROUND_Y : SP_SCRATCH_ROUND_X, n);
    if (!p) return NULL;
    if (!is16) {
        sp_round_bf16(p, x, n);
        return p;
    }
    const uint16_t *h = x;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&p[i], &u, 4);
    }
    return p;
}

/* Both operands of a product rounded (x, then y);
 * 0, or SP_KERNEL_NOMEM. */
static int round_both(const void *x, int x16, int64_t nx, const void *y, int y16, int64_t ny,
                      const float **rx, const float **ry)
{
    *rx = rounded(0, x, x16, nx);
    *ry = *rx ? rounded(1, y, y16, ny) : NULL;
    return *ry ? 0 : SP_KERNEL_NOMEM;
}

int sp_matmul_forward_bf16(float *out, const void *a, const void *b, int M, int Nc, int K,
                           int ta, int tb, int acc, int a16, int b16)
{
    const float *ra, *rb;
    int rc = round_both(a, a16, (int64_t)M * K, b, b16, (int64_t)K * Nc, &ra, &rb);
    if (!rc) sp_matmul_forward(out, ra, rb, M, Nc, K, ta, tb, acc);
    return rc;
}

int sp_matmul_forward_bias_bf16(float *out, const void *a, const void *b, const float *bias,
                                int M, int Nc, int K, int ta, int tb, int a16, int b16)
{
    const float *ra, *rb;
    int rc = round_both(a, a16, (int64_t)M * K, b, b16, (int64_t)K * Nc, &ra, &rb);
    if (!rc) sp_matmul_forward_bias(out, ra, rb, bias, M, Nc, K, ta, tb);
    return rc;
}

int sp_matmul_backward_a_bf16(float *da, const float *dout, const void *b, int M, int Nc,
                              int K, int ta, int tb, int acc, int b16)
{
    const float *rd, *rb;
    int rc = round_both(dout, 0, (int64_t)M * Nc, b, b16, (int64_t)K * Nc, &rd, &rb);
    if (!rc) sp_matmul_backward_a(da, rd, rb, M, Nc, K, ta, tb, acc);
    return rc;
}

int sp_matmul_backward_b_bf16(float *db, const float *dout, const void *a, int M, int Nc,
                              int K, int ta, int tb, int acc, int a16)
{
    const float *rd, *ra;
    int rc = round_both(dout, 0, (int64_t)M * Nc, a, a16, (int64_t)M * K, &rd, &ra);
    if (!rc) sp_matmul_backward_b(db, rd, ra, M, Nc, K, ta, tb, acc);
    return rc;
}

/* The kernels no longer call OpenBLAS, but a program linking it (benchmarks, the CUDA
 * emulation's cuBLAS) must not have it start threads beside the runtime's. */
void sp_kernels_init(void)
{
    openblas_set_num_threads(1);
}
