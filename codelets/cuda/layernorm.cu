/* LayerNorm over the last dim (eps 1e-5) on the GPU, and RMSNorm (eps 1e-5, Llama's): the
 * same with no centering and no bias. Forward and dx: one warp per row, lane-strided
 * partial sums and a butterfly (fixed order); two passes for the variance as on the CPU.
 * dgamma/dbeta, dweight: a fixed-order column reduction (no atomics), like bias. The
 * backward bodies serve both norms (LN: the LayerNorm's); RMSNorm's is LayerNorm's with
 * mean 0 and no mean(g) term. */
#include "codelets/cuda/common.cuh"

#define LN_EPS 1e-5f
#define LN_WARPS 8 /* rows per block */

static __global__ void layernorm_forward_kernel(float *__restrict__ out, float *__restrict__ mean,
                                                float *__restrict__ rstd,
                                                const float *__restrict__ x,
                                                const float *__restrict__ gamma,
                                                const float *__restrict__ beta, int N, int C)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= N) /* whole warps leave together: the shuffles below stay full-warp */
        return;
    const float *xr = x + (int64_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32)
        s += xr[c];
    const float m = sp_warp_sum(s) / (float)C;
    float q = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = xr[c] - m;
        q += d * d;
    }
    const float var = sp_warp_sum(q) / (float)C;
    const float r = 1.0f / sqrtf(var + LN_EPS); /* IEEE sqrt and division, as the CPU */
    float *o = out + (int64_t)row * C;
    for (int c = lane; c < C; c += 32)
        o[c] = (xr[c] - m) * r * gamma[c] + beta[c];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

extern "C" int sp_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *x,
                                         const float *gamma, const float *beta, int N, int C,
                                         void *stream)
{
    if (N <= 0 || C <= 0)
        return SP_CUDA_OK;
    unsigned blocks = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
    layernorm_forward_kernel<<<blocks, LN_WARPS * 32, 0, SP_STREAM(stream)>>>(out, mean, rstd, x,
                                                                             gamma, beta, N, C);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* dx = rstd (g - mean(g) - xhat mean(g xhat)), g = gamma dout, xhat = (x - mean) rstd;
 * RMSNorm (!LN): xhat = x rstd and no mean(g). */
template <bool LN>
static __device__ void norm_backward_x(float *__restrict__ dx, const float *__restrict__ dout,
                                       const float *__restrict__ x, const float *__restrict__ mean,
                                       const float *__restrict__ rstd,
                                       const float *__restrict__ gamma, int N, int C, int acc)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const float *d = dout + (int64_t)row * C;
    const float *xr = x + (int64_t)row * C;
    const float s = rstd[row];
    if (LN) {
        const float m = mean[row];
        float sg = 0.0f, sgx = 0.0f;
        for (int c = lane; c < C; c += 32) {
            float g = gamma[c] * d[c];
            sg += g;
            sgx += g * ((xr[c] - m) * s);
        }
        const float mg = sp_warp_sum(sg) / (float)C, mgx = sp_warp_sum(sgx) / (float)C;
        float *o = dx + (int64_t)row * C;
        for (int c = lane; c < C; c += 32) {
            float v = s * (gamma[c] * d[c] - mg - (xr[c] - m) * s * mgx);
            o[c] = acc ? o[c] + v : v;
        }
    } else {
        float sgx = 0.0f;
        for (int c = lane; c < C; c += 32)
            sgx += (gamma[c] * d[c]) * (xr[c] * s);
        const float mgx = sp_warp_sum(sgx) / (float)C;
        float *o = dx + (int64_t)row * C;
        for (int c = lane; c < C; c += 32) {
            float v = s * (gamma[c] * d[c] - xr[c] * s * mgx);
            o[c] = acc ? o[c] + v : v;
        }
    }
}

static __global__ void
layernorm_backward_x_kernel(float *__restrict__ dx, const float *__restrict__ dout,
                            const float *__restrict__ x, const float *__restrict__ mean,
                            const float *__restrict__ rstd, const float *__restrict__ gamma, int N,
                            int C, int acc)
{
    norm_backward_x<true>(dx, dout, x, mean, rstd, gamma, N, C, acc);
}

extern "C" int sp_cuda_layernorm_backward_x(float *dx, const float *dout, const float *x,
                                            const float *mean, const float *rstd,
                                            const float *gamma, int N, int C, int acc,
                                            void *stream)
{
    if (N <= 0 || C <= 0)
        return SP_CUDA_OK;
    unsigned blocks = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
    layernorm_backward_x_kernel<<<blocks, LN_WARPS * 32, 0, SP_STREAM(stream)>>>(
        dx, dout, x, mean, rstd, gamma, N, C, acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* A block owns 32 columns; lane y sums rows y, y+32, ... in order, then a fixed tree over
 * the 32 lanes: the same bits every run. */
#define COL_W 32
#define COL_H 32
/* RMSNorm (!LN): dgamma from x rstd dout, no mean, no dbeta. pg, pb: the block's shared
 * partial sums. */
template <bool LN>
static __device__ void norm_backward_params(float *__restrict__ dgamma, float *__restrict__ dbeta,
                                            const float *__restrict__ dout,
                                            const float *__restrict__ x,
                                            const float *__restrict__ mean,
                                            const float *__restrict__ rstd, int N, int C, int acc,
                                            float (*pg)[COL_W + 1], float (*pb)[COL_W + 1])
{
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c = blockIdx.x * COL_W + tx;
    float sg = 0.0f, sb = 0.0f;
    if (c < C)
        for (int n = ty; n < N; n += COL_H) {
            int64_t i = (int64_t)n * C + c;
            float d = dout[i];
            if (LN) {
                sg += (x[i] - mean[n]) * rstd[n] * d;
                sb += d;
            } else {
                sg += x[i] * rstd[n] * d;
            }
        }
    pg[ty][tx] = sg;
    pb[ty][tx] = sb;
    __syncthreads();
    for (int h = COL_H / 2; h > 0; h >>= 1) {
        if (ty < h) {
            pg[ty][tx] += pg[ty + h][tx];
            pb[ty][tx] += pb[ty + h][tx];
        }
        __syncthreads();
    }
    if (ty == 0 && c < C) {
        dgamma[c] = acc ? dgamma[c] + pg[0][tx] : pg[0][tx];
        if (LN)
            dbeta[c] = acc ? dbeta[c] + pb[0][tx] : pb[0][tx];
    }
}

static __global__ void
layernorm_backward_params_kernel(float *__restrict__ dgamma, float *__restrict__ dbeta,
                                 const float *__restrict__ dout, const float *__restrict__ x,
                                 const float *__restrict__ mean, const float *__restrict__ rstd,
                                 int N, int C, int acc)
{
    __shared__ float pg[COL_H][COL_W + 1], pb[COL_H][COL_W + 1];
    norm_backward_params<true>(dgamma, dbeta, dout, x, mean, rstd, N, C, acc, pg, pb);
}

extern "C" int sp_cuda_layernorm_backward_params(float *dgamma, float *dbeta, const float *dout,
                                                 const float *x, const float *mean,
                                                 const float *rstd, int N, int C, int acc,
                                                 void *stream)
{
    if (C <= 0)
        return SP_CUDA_OK;
    cudaStream_t s = SP_STREAM(stream);
    if (N <= 0) {
        if (!acc) {
            SP_CUDA_TRY(cudaMemsetAsync(dgamma, 0, sizeof(float) * (size_t)C, s));
            SP_CUDA_TRY(cudaMemsetAsync(dbeta, 0, sizeof(float) * (size_t)C, s));
        }
        return SP_CUDA_OK;
    }
    dim3 block(COL_W, COL_H);
    layernorm_backward_params_kernel<<<(C + COL_W - 1) / COL_W, block, 0, s>>>(
        dgamma, dbeta, dout, x, mean, rstd, N, C, acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void rmsnorm_forward_kernel(float *__restrict__ out, float *__restrict__ rstd,
                                              const float *__restrict__ x,
                                              const float *__restrict__ weight, int N, int C)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    if (row >= N)
        return;
    const float *xr = x + (int64_t)row * C;
    float q = 0.0f;
    for (int c = lane; c < C; c += 32)
        q += xr[c] * xr[c];
    const float r = 1.0f / sqrtf(sp_warp_sum(q) / (float)C + LN_EPS);
    float *o = out + (int64_t)row * C;
    for (int c = lane; c < C; c += 32)
        o[c] = xr[c] * r * weight[c];
    if (lane == 0)
        rstd[row] = r;
}

extern "C" int sp_cuda_rmsnorm_forward(float *out, float *rstd, const float *x,
                                       const float *weight, int N, int C, void *stream)
{
    if (N <= 0 || C <= 0)
        return SP_CUDA_OK;
    unsigned blocks = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
    rmsnorm_forward_kernel<<<blocks, LN_WARPS * 32, 0, SP_STREAM(stream)>>>(out, rstd, x, weight,
                                                                           N, C);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void rmsnorm_backward_x_kernel(float *__restrict__ dx,
                                                 const float *__restrict__ dout,
                                                 const float *__restrict__ x,
                                                 const float *__restrict__ rstd,
                                                 const float *__restrict__ weight, int N, int C,
                                                 int acc)
{
    norm_backward_x<false>(dx, dout, x, NULL, rstd, weight, N, C, acc);
}

extern "C" int sp_cuda_rmsnorm_backward_x(float *dx, const float *dout, const float *x,
                                          const float *rstd, const float *weight, int N, int C,
                                          int acc, void *stream)
{
    if (N <= 0 || C <= 0)
        return SP_CUDA_OK;
    unsigned blocks = (unsigned)((N + LN_WARPS - 1) / LN_WARPS);
    rmsnorm_backward_x_kernel<<<blocks, LN_WARPS * 32, 0, SP_STREAM(stream)>>>(dx, dout, x, rstd,
                                                                              weight, N, C, acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void rmsnorm_backward_weight_kernel(float *__restrict__ dweight,
                                                      const float *__restrict__ dout,
                                                      const float *__restrict__ x,
                                                      const float *__restrict__ rstd, int N,
                                                      int C, int acc)
{
    __shared__ float pg[COL_H][COL_W + 1], pb[COL_H][COL_W + 1];
    norm_backward_params<false>(dweight, NULL, dout, x, NULL, rstd, N, C, acc, pg, pb);
}

extern "C" int sp_cuda_rmsnorm_backward_weight(float *dweight, const float *dout, const float *x,
                                               const float *rstd, int N, int C, int acc,
                                               void *stream)
{
    if (C <= 0)
        return SP_CUDA_OK;
    cudaStream_t s = SP_STREAM(stream);
    if (N <= 0) {
        if (!acc)
            SP_CUDA_TRY(cudaMemsetAsync(dweight, 0, sizeof(float) * (size_t)C, s));
        return SP_CUDA_OK;
    }
    dim3 block(COL_W, COL_H);
    rmsnorm_backward_weight_kernel<<<(C + COL_W - 1) / COL_W, block, 0, s>>>(dweight, dout, x,
                                                                             rstd, N, C, acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}
