/* cuBLAS of the emulation (README.md): handles, and sgemm on OpenBLAS with cuBLAS's
 * checks of sizes and leading dimensions, run when it reaches the head of the handle's
 * stream. Compiled against include/ (the emulation in every build) or against the
 * toolkit's cublas_v2.h (the fake device's libcublas.so.13, tests/gpu/fake), where the
 * matrices must also lie inside device memory (SP_EMU_STRICT).
 * A new handle is in device pointer mode (cuBLAS's default is host): starpipe binds
 * every handle to host mode itself (sp_cublas_bind), and this shows if it stops. */
#include <cblas.h>
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

#include <vector>
#include "emu.h"

struct cublasContext {
    cudaStream_t stream;
    cublasPointerMode_t pointer_mode;
    cublasMath_t math;
};

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    *handle = (cublasHandle_t)calloc(1, sizeof(struct cublasContext));
    if (!*handle)
        return CUBLAS_STATUS_ALLOC_FAILED;
    (*handle)->pointer_mode = CUBLAS_POINTER_MODE_DEVICE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t stream)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *stream)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *stream = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode(cublasHandle_t h, cublasPointerMode_t *mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *mode = h->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* TF32 is remembered, not emulated: products stay fp32. */
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "unknown cuBLAS status";
    }
}

} /* extern "C" */

static int max1(int n) { return n > 1 ? n : 1; }

/* A column-major rows x cols matrix with leading dimension ld, in device memory: what
 * cuBLAS would read or write past is a fault on a GPU, a message here. */
static void check_matrix(const char *call, char name, const float *p, int rows, int cols,
                         int ld)
{
    if (!sp_emu_strict || !rows || !cols)
        return;
    const size_t bytes = sizeof(float) * ((size_t)ld * (size_t)(cols - 1) + (size_t)rows);
    if (!sp_emu_dev_find(p, bytes, NULL))
        sp_emu_die("%s: %c (%p, %d x %d, leading dimension %d) %s", call, name, (const void *)p,
                   rows, cols, ld,
                   sp_emu_dev_find(p, 0, NULL) ? "runs past the end of its cudaMalloc block"
                                               : "is not device memory");
}

/* Column-major C (m,n) = alpha op(A) (m,k) op(B) (k,n) + beta C, as cuBLAS defines it,
 * for batch matrices sa, sb, sc floats apart; enqueued on the handle's stream. */
static cublasStatus_t gemm(const char *call, cublasHandle_t h, cublasOperation_t ta,
                           cublasOperation_t tb, int m, int n, int k, const float *alpha,
                           const float *A, int lda, long long sa, const float *B, int ldb,
                           long long sb, const float *beta, float *C, int ldc, long long sc,
                           int batch)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (h->pointer_mode != CUBLAS_POINTER_MODE_HOST)
        return CUBLAS_STATUS_NOT_SUPPORTED; /* alpha and beta would be read on the device */
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) ||
        m < 0 || n < 0 || k < 0 || batch < 0 || lda < max1(ta == CUBLAS_OP_N ? m : k) ||
        ldb < max1(tb == CUBLAS_OP_N ? k : n) || ldc < max1(m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0 || batch == 0)
        return CUBLAS_STATUS_SUCCESS;
    const float al = *alpha, be = *beta; /* host pointer mode: read at the call */
    const bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
    for (int i = 0; i < batch; i++) {
        if (k > 0 && al != 0.0f) {
            check_matrix(call, 'A', A + i * sa, na ? m : k, na ? k : m, lda);
            check_matrix(call, 'B', B + i * sb, nb ? k : n, nb ? n : k, ldb);
        }
        check_matrix(call, 'C', C + i * sc, m, n, ldc);
    }
    auto run = [=]() {
        for (int i = 0; i < batch; i++) {
            float *c = C + i * sc;
            if (be == 0.0f) /* cuBLAS never reads C then: NaN there must not show */
                for (int j = 0; j < n; j++)
                    memset(c + (int64_t)j * ldc, 0, sizeof(float) * (size_t)m);
            if (k == 0) {
                if (be != 0.0f && be != 1.0f)
                    for (int j = 0; j < n; j++)
                        cblas_sscal(m, be, c + (int64_t)j * ldc, 1);
                continue;
            }
            cblas_sgemm(CblasColMajor, na ? CblasNoTrans : CblasTrans,
                        nb ? CblasNoTrans : CblasTrans, m, n, k, al, A + i * sa, lda,
                        B + i * sb, ldb, be, c, ldc);
        }
        sp_emu_check_fences(call);
    };
    if (sp_emu_submit(h->stream, sp_emu_op{ call, run, {} }, SP_EMU_GEMMS))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" {

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc)
{
    return gemm("cublasSgemm", h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0,
                1);
}

/* Only A and B of CUDA_R_16BF (16-bit words), C of CUDA_R_32F, CUBLAS_COMPUTE_32F (what
 * codelets/cuda's bf16 products use): the operands widened to fp32 (exact) when the
 * stream reaches the call, then OpenBLAS's sgemm, as cublasSgemm. */
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t comp,
                            cublasGemmAlgo_t algo)
{
    (void)algo;
    if (at != CUDA_R_16BF || bt != CUDA_R_16BF || ct != CUDA_R_32F || comp != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (h->pointer_mode != CUBLAS_POINTER_MODE_HOST)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) ||
        m < 0 || n < 0 || k < 0 || lda < max1(na ? m : k) || ldb < max1(nb ? k : n) ||
        ldc < max1(m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    const int acols = na ? k : m, bcols = nb ? n : k;
    float *c = (float *)C;
    check_matrix("cublasGemmEx", 'C', c, m, n, ldc);
    auto run = [=]() {
        auto widen = [](const void *x, int ld, int cols) {
            std::vector<float> w((size_t)max1(ld) * (size_t)max1(cols));
            const uint16_t *hx = (const uint16_t *)x;
            for (size_t i = 0; i < (size_t)ld * (size_t)cols; i++) {
                uint32_t u = (uint32_t)hx[i] << 16;
                memcpy(&w[i], &u, 4);
            }
            return w;
        };
        if (be == 0.0f)
            for (int j = 0; j < n; j++) memset(c + (int64_t)j * ldc, 0, sizeof(float) * (size_t)m);
        if (k > 0) {
            std::vector<float> a = widen(A, lda, acols), b = widen(B, ldb, bcols);
            cblas_sgemm(CblasColMajor, na ? CblasNoTrans : CblasTrans,
                        nb ? CblasNoTrans : CblasTrans, m, n, k, al, a.data(), lda, b.data(), ldb,
                        be, c, ldc);
        }
        sp_emu_check_fences("cublasGemmEx");
    };
    if (sp_emu_submit(h->stream, sp_emu_op{ "cublasGemmEx", run, {} }, SP_EMU_GEMMS))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
                                         cublasOperation_t tb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda,
                                         long long sa, const float *B, int ldb, long long sb,
                                         const float *beta, float *C, int ldc, long long sc,
                                         int batch)
{
    return gemm("cublasSgemmStridedBatched", h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb,
                beta, C, ldc, sc, batch);
}

} /* extern "C" */
