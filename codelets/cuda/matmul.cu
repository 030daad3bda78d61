/* Matrix multiply forward and backward on cublasSgemm, plus the handle setup (init, TF32
 * opt-in) and the status strings. Row-major C = A B is computed as column-major
 * C^T = B^T A^T: a row-major matrix with leading dimension ld is its own transpose in
 * column-major with the same ld, so only the operand order and the sizes swap. */
#include "codelets/cuda/common.cuh"

/* cuBLAS rejects a leading dimension of 0 even when the matrix is empty. */
static int ld(int n) { return n > 0 ? n : 1; }

/* Row-major c (m,n) = opA (m,k) @ opB (k,n) [+ c], lda/ldb the row-major leading
 * dimensions of a and b as stored; degenerate sizes handled here, as on the CPU. */
static int gemm(cudaStream_t s, cublasHandle_t h, float *c, const float *a, int lda, int ta,
                const float *b, int ldb, int tb, int m, int n, int k, int acc)
{
    if (m <= 0 || n <= 0)
        return SP_CUDA_OK;
    if (k <= 0) {
        if (!acc)
            SP_CUDA_TRY(cudaMemsetAsync(c, 0, sizeof(float) * (size_t)m * (size_t)n, s));
        return SP_CUDA_OK;
    }
    int rc = sp_cublas_bind(h, s);
    if (rc)
        return rc;
    /* beta = 0 makes sgemm ignore c's old contents (even NaN), as acc = 0 promises. */
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    SP_CUBLAS_TRY(cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                              n, m, k, &alpha, b, ld(ldb), a, ld(lda), &beta, c, ld(n)));
    return SP_CUDA_OK;
}

extern "C" int sp_cuda_matmul_forward(float *out, const float *a, const float *b, int M, int Nc,
                                      int K, int ta, int tb, int acc, void *stream,
                                      void *cublas)
{
    return gemm(SP_STREAM(stream), SP_CUBLAS(cublas), out, a, ta ? M : K, ta, b, tb ? K : Nc,
                tb, M, Nc, K, acc);
}

/* d op(a) (M,K) = dout (M,Nc) @ op(b)^T; when a is stored transposed, da (K,M) =
 * op(b) (K,Nc) @ dout^T directly (the CPU's matmul.c, line for line). */
extern "C" int sp_cuda_matmul_backward_a(float *da, const float *dout, const float *b, int M,
                                         int Nc, int K, int ta, int tb, int acc, void *stream,
                                         void *cublas)
{
    cudaStream_t s = SP_STREAM(stream);
    cublasHandle_t h = SP_CUBLAS(cublas);
    int ldb = tb ? K : Nc;
    if (!ta)
        return gemm(s, h, da, dout, Nc, 0, b, ldb, !tb, M, K, Nc, acc);
    return gemm(s, h, da, b, ldb, tb, dout, Nc, 1, K, M, Nc, acc);
}

/* d op(b) (K,Nc) = op(a)^T @ dout (M,Nc); stored transposed: db (Nc,K) = dout^T @ op(a). */
extern "C" int sp_cuda_matmul_backward_b(float *db, const float *dout, const float *a, int M,
                                         int Nc, int K, int ta, int tb, int acc, void *stream,
                                         void *cublas)
{
    cudaStream_t s = SP_STREAM(stream);
    cublasHandle_t h = SP_CUBLAS(cublas);
    int lda = ta ? M : K;
    if (!tb)
        return gemm(s, h, db, a, lda, !ta, dout, Nc, 0, K, Nc, M, acc);
    return gemm(s, h, db, dout, Nc, 1, a, lda, ta, Nc, K, M, acc);
}

extern "C" int sp_cuda_set_tf32(void *cublas, int on)
{
    if (!cublas)
        return SP_CUDA_ERR_ARG;
    SP_CUBLAS_TRY(cublasSetMathMode(SP_CUBLAS(cublas),
                                    on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    return SP_CUDA_OK;
}

extern "C" int sp_cuda_kernels_init(void *cublas)
{
    if (!cublas)
        return SP_CUDA_ERR_ARG;
    SP_CUBLAS_TRY(cublasSetPointerMode(SP_CUBLAS(cublas), CUBLAS_POINTER_MODE_HOST));
    return sp_cuda_set_tf32(cublas, 0);
}

extern "C" const char *sp_cuda_status_string(int status)
{
    if (status == SP_CUDA_OK)
        return "ok";
    if (status == SP_CUDA_ERR_ARG)
        return "bad argument (NULL cuBLAS handle)";
    if (status >= SP_CUDA_ERR_CUBLAS_BASE) {
        const char *s = cublasGetStatusString((cublasStatus_t)(status - SP_CUDA_ERR_CUBLAS_BASE));
        return s ? s : "unknown cuBLAS status";
    }
    if (status > 0) {
        const char *s = cudaGetErrorString((cudaError_t)status);
        return s ? s : "unknown CUDA error";
    }
    return "unknown status";
}
