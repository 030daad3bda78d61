/* Matrix multiply forward and backward on OpenBLAS sgemm, and sp_kernels_init.
 * acc maps onto sgemm's beta (0 or 1), so no temporary is ever allocated. */
#include "codelets/cpu/kernels.h"

#include <cblas.h>
#include <string.h>

/* sgemm rejects a leading dimension of 0 even when the matrix is empty. */
static int ld(int n) { return n > 0 ? n : 1; }

/* C (m,n) = opA (m,k) @ opB (k,n) [+ C]; degenerate sizes handled here, not by BLAS. */
static void gemm(float *c, const float *a, int lda, int ta, const float *b, int ldb, int tb,
                 int m, int n, int k, int acc)
{
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0) {
        if (!acc)
            memset(c, 0, sizeof(float) * (size_t)m * (size_t)n);
        return;
    }
    /* beta = 0 makes sgemm ignore C's old contents (even NaN), as acc = 0 promises. */
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                m, n, k, 1.0f, a, ld(lda), b, ld(ldb), acc ? 1.0f : 0.0f, c, ld(n));
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

void sp_kernels_init(void)
{
    openblas_set_num_threads(1);
}
