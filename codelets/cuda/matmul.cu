/* Matrix multiply forward and backward on cublasSgemm, plus the handle setup (init, TF32
 * opt-in) and the status strings. Row-major C = A B is computed as column-major
 * C^T = B^T A^T: a row-major matrix with leading dimension ld is its own transpose in
 * column-major with the same ld, so only the operand order and the sizes swap. */
#include "codelets/cuda/common.cuh"

/* cuBLAS rejects a leading dimension of 0 even when the matrix is empty. */
static int ld(int n) { return n > 0 ? n : 1; }

/* bf16 mixed precision: x rounded to bfloat16 (nearest even, NaN kept quiet), the bits of
 * codelets/cpu's sp_round_bf16, as 16-bit values for cublasGemmEx. */
__global__ void to_bf16_kernel(uint16_t *dst, const float *src, int64_t n)
{
    SP_GRID_STRIDE(i, n)
    {
        union {
            float f;
            uint32_t u;
        } v;
        v.f = src[i];
        uint32_t u = v.u;
        if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
            u |= 0x00400000u;
        else
            u += 0x7fffu + ((u >> 16) & 1u);
        dst[i] = (uint16_t)(u >> 16);
    }
}

/* The stored extent of a row-major operand (rows of ld elements) as bf16, in
 * stream-ordered scratch that the caller frees with cudaFreeAsync. */
static int to_bf16(cudaStream_t s, const float *x, int64_t rows, int ld, uint16_t **out)
{
    int64_t n = rows * (int64_t)(ld > 0 ? ld : 1);
    SP_CUDA_TRY(cudaMallocAsync((void **)out, sizeof(uint16_t) * (size_t)(n > 0 ? n : 1), s));
    to_bf16_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, s>>>(*out, x, n);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* How a product multiplies: fp32 (cublasSgemm), or bf16 with each operand either
 * rounded here or already in bf16 storage. */
typedef struct {
    int bf16, a16, b16;
} prec;

/* Row-major c (m,n) = opA (m,k) @ opB (k,n) [+ c], lda/ldb the row-major leading
 * dimensions of a and b as stored; degenerate sizes handled here, as on the CPU. bf16:
 * both operands rounded to bfloat16 (those not stored so, into stream-ordered scratch),
 * fp32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F). */
static int gemm(cudaStream_t s, cublasHandle_t h, float *c, const void *a, int lda, int ta,
                const void *b, int ldb, int tb, int m, int n, int k, int acc, prec pr)
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
    if (!pr.bf16) {
        SP_CUBLAS_TRY(cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha,
                                  (const float *)b, ld(ldb), (const float *)a, ld(lda), &beta,
                                  c, ld(n)));
        return SP_CUDA_OK;
    }
    uint16_t *a16 = NULL, *b16 = NULL; /* the conversions this call made */
    if (!pr.a16)
        rc = to_bf16(s, (const float *)a, ta ? k : m, lda, &a16);
    if (!rc && !pr.b16)
        rc = to_bf16(s, (const float *)b, tb ? n : k, ldb, &b16);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (!rc)
        st = cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                          k, &alpha, pr.b16 ? b : b16, CUDA_R_16BF, ld(ldb),
                          pr.a16 ? a : a16, CUDA_R_16BF, ld(lda), &beta, c, CUDA_R_32F, ld(n),
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (a16) cudaFreeAsync(a16, s);
    if (b16) cudaFreeAsync(b16, s);
    if (rc) return rc;
    if (st != CUBLAS_STATUS_SUCCESS) return SP_CUDA_ERR_CUBLAS_BASE + (int)st;
    return SP_CUDA_OK;
}

static int forward(float *out, const void *a, const void *b, int M, int Nc, int K, int ta,
                   int tb, int acc, void *stream, void *cublas, prec pr)
{
    return gemm(SP_STREAM(stream), SP_CUBLAS(cublas), out, a, ta ? M : K, ta, b, tb ? K : Nc,
                tb, M, Nc, K, acc, pr);
}

/* d op(a) (M,K) = dout (M,Nc) @ op(b)^T; when a is stored transposed, da (K,M) =
 * op(b) (K,Nc) @ dout^T directly (the CPU's matmul.c, line for line). pr.b16: b's
 * storage, whichever side of the product it lands on. */
static int backward_a(float *da, const float *dout, const void *b, int M, int Nc, int K,
                      int ta, int tb, int acc, void *stream, void *cublas, prec pr)
{
    cudaStream_t s = SP_STREAM(stream);
    cublasHandle_t h = SP_CUBLAS(cublas);
    int ldb = tb ? K : Nc;
    if (!ta)
        return gemm(s, h, da, dout, Nc, 0, b, ldb, !tb, M, K, Nc, acc, pr);
    return gemm(s, h, da, b, ldb, tb, dout, Nc, 1, K, M, Nc, acc,
                (prec){ pr.bf16, pr.b16, 0 });
}

/* d op(b) (K,Nc) = op(a)^T @ dout (M,Nc); stored transposed: db (Nc,K) = dout^T @ op(a).
 * pr.a16: a's storage. */
static int backward_b(float *db, const float *dout, const void *a, int M, int Nc, int K,
                      int ta, int tb, int acc, void *stream, void *cublas, prec pr)
{
    cudaStream_t s = SP_STREAM(stream);
    cublasHandle_t h = SP_CUBLAS(cublas);
    int lda = ta ? M : K;
    if (!tb)
        return gemm(s, h, db, a, lda, !ta, dout, Nc, 0, K, Nc, M, acc, pr);
    return gemm(s, h, db, dout, Nc, 1, a, lda, ta, Nc, K, M, acc,
                (prec){ pr.bf16, 0, pr.a16 });
}

static const prec fp32 = { 0, 0, 0 };

extern "C" int sp_cuda_matmul_forward(float *out, const float *a, const float *b, int M, int Nc,
                                      int K, int ta, int tb, int acc, void *stream, void *cublas)
{
    return forward(out, a, b, M, Nc, K, ta, tb, acc, stream, cublas, fp32);
}

extern "C" int sp_cuda_matmul_backward_a(float *da, const float *dout, const float *b, int M,
                                         int Nc, int K, int ta, int tb, int acc, void *stream,
                                         void *cublas)
{
    return backward_a(da, dout, b, M, Nc, K, ta, tb, acc, stream, cublas, fp32);
}

extern "C" int sp_cuda_matmul_backward_b(float *db, const float *dout, const float *a, int M,
                                         int Nc, int K, int ta, int tb, int acc, void *stream,
                                         void *cublas)
{
    return backward_b(db, dout, a, M, Nc, K, ta, tb, acc, stream, cublas, fp32);
}

extern "C" int sp_cuda_matmul_forward_bf16(float *out, const void *a, const void *b, int M,
                                           int Nc, int K, int ta, int tb, int acc, int a16,
                                           int b16, void *stream, void *cublas)
{
    return forward(out, a, b, M, Nc, K, ta, tb, acc, stream, cublas, (prec){ 1, a16, b16 });
}

extern "C" int sp_cuda_matmul_backward_a_bf16(float *da, const float *dout, const void *b, int M,
                                              int Nc, int K, int ta, int tb, int acc, int b16,
                                              void *stream, void *cublas)
{
    return backward_a(da, dout, b, M, Nc, K, ta, tb, acc, stream, cublas, (prec){ 1, 0, b16 });
}

extern "C" int sp_cuda_matmul_backward_b_bf16(float *db, const float *dout, const void *a, int M,
                                              int Nc, int K, int ta, int tb, int acc, int a16,
                                              void *stream, void *cublas)
{
    return backward_b(db, dout, a, M, Nc, K, ta, tb, acc, stream, cublas, (prec){ 1, a16, 0 });
}

extern "C" int sp_cuda_to_bf16(uint16_t *out, const float *x, int64_t n, void *stream)
{
    if (n <= 0)
        return SP_CUDA_OK;
    to_bf16_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(out, x, n);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
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
