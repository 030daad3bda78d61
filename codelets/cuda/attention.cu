/* Causal multi-head self-attention on the GPU, the CPU's contract (attention.c: out, the
 * per-row log-sum-exp, the backward recomputing the probabilities) by another route: per
 * batch row b, the products of all NH heads are one cuBLAS strided-batched sgemm each
 * (head h of the packed qkv starts at column h*hs, so the batch stride is hs) on the full
 * T x T square in scratch; the softmax and its backward are one warp per row. */
#include "codelets/cuda/common.cuh"

#include <math.h>

/* Row-major batched c_i (m,n) = alpha opA(a_i) (m,k) @ opB(b_i) (k,n) + beta c_i, lda/ldb/
 * ldc row-major leading dimensions, sa/sb/sc the strides between batch entries; through
 * the column-major operand swap, as in matmul.cu. All sizes here are > 0. */
static int gemm_batched(cublasHandle_t h, const float *a, int lda, long long sa, int ta,
                        const float *b, int ldb, long long sb, int tb, float *c, int ldc,
                        long long sc, int m, int n, int k, float alpha, float beta, int batch)
{
    SP_CUBLAS_TRY(cublasSgemmStridedBatched(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                                            ldb, sb, a, lda, sa, &beta, c, ldc, sc, batch));
    return SP_CUDA_OK;
}

#define ATT_WARPS 8 /* rows per block */

/* rows of (T,T) scaled score matrices, t = row % T: softmax over columns 0..t, zeros
 * after; lse[row] = log-sum-exp of columns 0..t. */
static __global__ void causal_softmax_kernel(float *__restrict__ att, float *__restrict__ lse,
                                             int64_t rows, int T)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    if (row >= rows)
        return; /* whole warps only */
    const int t = (int)(row % T);
    float *r = att + row * T;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32)
        mx = fmaxf(mx, r[j]);
    mx = sp_warp_max(mx);
    float s = 0.0f;
    for (int j = lane; j <= t; j += 32) {
        float e = expf(r[j] - mx);
        r[j] = e;
        s += e;
    }
    s = sp_warp_sum(s);
    const float inv = 1.0f / s;
    for (int j = lane; j < T; j += 32)
        r[j] = j <= t ? r[j] * inv : 0.0f;
    if (lane == 0)
        lse[row] = mx + logf(s);
}

/* Rows (h, t) of one batch row: p holds the scaled scores, dp holds dout v^T. p becomes
 * P = exp(s - lse), dp becomes dS = P (dP - D) scale over 0..t, both zero after, with
 * D = dout_t . out_t of head h (hs columns at h*hs of rows of stride C). */
static __global__ void causal_softmax_backward_kernel(float *__restrict__ p,
                                                      float *__restrict__ dp,
                                                      const float *__restrict__ lse,
                                                      const float *__restrict__ dout,
                                                      const float *__restrict__ out,
                                                      int64_t rows, int T, int C, int hs,
                                                      float scale)
{
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    if (row >= rows)
        return;
    const int t = (int)(row % T), h = (int)(row / T);
    const float *d = dout + (int64_t)t * C + h * hs, *o = out + (int64_t)t * C + h * hs;
    float D = 0.0f;
    for (int i = lane; i < hs; i += 32)
        D += d[i] * o[i];
    D = sp_warp_sum(D);
    const float l = lse[row];
    float *x = p + row * T, *g = dp + row * T;
    for (int j = lane; j < T; j += 32) {
        if (j <= t) {
            const float pr = expf(x[j] - l);
            x[j] = pr;
            g[j] = pr * (g[j] - D) * scale;
        } else {
            x[j] = 0.0f;
            g[j] = 0.0f;
        }
    }
}

static unsigned row_blocks(int64_t rows) { return (unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS); }

/* Per batch row b: scores_h (T,T) = scale q_h k_h^T into scratch, softmax (lse saved),
 * out_h = P_h v_h. */
extern "C" int sp_cuda_attention_forward(float *out, float *lse, float *scratch,
                                         const float *qkv, int B, int T, int C, int NH,
                                         void *stream, void *cublas)
{
    if (B <= 0 || T <= 0 || NH <= 0)
        return SP_CUDA_OK;
    cudaStream_t s = SP_STREAM(stream);
    cublasHandle_t h = SP_CUBLAS(cublas);
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    const long long TT = (long long)T * T;
    int rc = sp_cublas_bind(h, s);
    if (rc)
        return rc;
    float *att = scratch;
    const int64_t rows = (int64_t)NH * T;
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (int64_t)b * T * C3;
        if (hs <= 0) { /* empty heads: the scores are sums of nothing */
            SP_CUDA_TRY(cudaMemsetAsync(att, 0, sizeof(float) * (size_t)(NH * TT), s));
        } else {
            rc = gemm_batched(h, q, C3, hs, 0, q + C, C3, hs, 1, att, T, TT, T, T, hs, scale,
                              0.0f, NH);
            if (rc)
                return rc;
        }
        causal_softmax_kernel<<<row_blocks(rows), ATT_WARPS * 32, 0, s>>>(
            att, lse + (int64_t)b * rows, rows, T);
        SP_CUDA_LAUNCHED();
        if (hs <= 0)
            continue;
        /* out_h (T,hs) = att_h (T,T) v_h (T,hs), into columns h*hs of out (B,T,C) */
        rc = gemm_batched(h, att, T, TT, 0, q + 2 * C, C3, hs, 0, out + (int64_t)b * T * C, C,
                          hs, T, hs, T, 1.0f, 0.0f, NH);
        if (rc)
            return rc;
    }
    return SP_CUDA_OK;
}

/* Per batch row b: S = scale q k^T and dP = dout v^T (scratch, NH*T*T each); P from lse,
 * dS = P (dP - D) scale; dv = P^T dout; dq = dS k; dk = dS^T q. */
extern "C" int sp_cuda_attention_backward(float *dqkv, float *scratch, const float *dout,
                                          const float *qkv, const float *out, const float *lse,
                                          int B, int T, int C, int NH, int acc, void *stream,
                                          void *cublas)
{
    if (B <= 0 || T <= 0 || NH <= 0)
        return SP_CUDA_OK;
    cudaStream_t s = SP_STREAM(stream);
    cublasHandle_t h = SP_CUBLAS(cublas);
    const int hs = C / NH, C3 = 3 * C;
    if (hs <= 0)
        return SP_CUDA_OK; /* dqkv has no columns a head touches */
    const float scale = 1.0f / sqrtf((float)hs), beta = acc ? 1.0f : 0.0f;
    const long long TT = (long long)T * T;
    int rc = sp_cublas_bind(h, s);
    if (rc)
        return rc;
    float *p = scratch, *dp = scratch + NH * TT;
    const int64_t rows = (int64_t)NH * T;
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (int64_t)b * T * C3, *k = q + C, *v = q + 2 * C;
        const float *d = dout + (int64_t)b * T * C;
        float *dq = dqkv + (int64_t)b * T * C3, *dk = dq + C, *dv = dq + 2 * C;
        /* S_h (T,T) = scale q_h k_h^T; dP_h (T,T) = dout_h (T,hs) v_h^T */
        rc = gemm_batched(h, q, C3, hs, 0, k, C3, hs, 1, p, T, TT, T, T, hs, scale, 0.0f, NH);
        if (rc)
            return rc;
        rc = gemm_batched(h, d, C, hs, 0, v, C3, hs, 1, dp, T, TT, T, T, hs, 1.0f, 0.0f, NH);
        if (rc)
            return rc;
        causal_softmax_backward_kernel<<<row_blocks(rows), ATT_WARPS * 32, 0, s>>>(
            p, dp, lse + (int64_t)b * rows, d, out + (int64_t)b * T * C, rows, T, C, hs, scale);
        SP_CUDA_LAUNCHED();
        /* dv_h (T,hs) = P_h^T (T,T) dout_h; dq_h = dS_h k_h; dk_h = dS_h^T q_h */
        rc = gemm_batched(h, p, T, TT, 1, d, C, hs, 0, dv, C3, hs, T, hs, T, 1.0f, beta, NH);
        if (rc)
            return rc;
        rc = gemm_batched(h, dp, T, TT, 0, k, C3, hs, 0, dq, C3, hs, T, hs, T, 1.0f, beta, NH);
        if (rc)
            return rc;
        rc = gemm_batched(h, dp, T, TT, 1, q, C3, hs, 0, dk, C3, hs, T, hs, T, 1.0f, beta, NH);
        if (rc)
            return rc;
    }
    return SP_CUDA_OK;
}

extern "C" int64_t sp_cuda_attention_scratch_floats(int /* B */, int T, int /* C */, int NH,
                                                    int backward)
{
    int64_t n = (backward ? 2 : 1) * (int64_t)(NH > 0 ? NH : 0) * (T > 0 ? T : 0) *
                (T > 0 ? T : 0);
    return n > 0 ? n : 1;
}
