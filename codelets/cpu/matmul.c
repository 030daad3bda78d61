/* Matrix multiply forward and backward on sp_gemm (gemm.c), and sp_kernels_init.
 * acc maps onto sp_gemm's acc (start from the old c, or from 0), so no temporary is ever
 * allocated. */
#include "codelets/cpu/kernels.h"

#include <cblas.h>

#include "codelets/cpu/gemm_impl.h"

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

/* The kernels no longer call OpenBLAS, but a program linking it (benchmarks, the CUDA
 * emulation's cuBLAS) must not have it start threads beside the runtime's. */
void sp_kernels_init(void)
{
    openblas_set_num_threads(1);
}
