/* Optimizer kernels on the GPU: AdamW, bit for bit the CPU's (optim.c), and the sum of
 * squares (double) for the global gradient norm. */
#include "codelets/cuda/common.cuh"

#include <math.h>

/* The CPU's per-element formula with every operation rounded on its own (the _rn
 * intrinsics are never fused into FMAs), so GPU and CPU give the same bits:
 * g = grad gs; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g;
 * p = p decay - step m / (sqrt(v) rbc2 + eps). */
static __global__ void adamw_kernel(float *__restrict__ param, float *__restrict__ m,
                                    float *__restrict__ v, const float *__restrict__ grad,
                                    int64_t n, float beta1, float beta2, float omb1, float omb2,
                                    float eps, float gscale, float step, float rbc2, float decay)
{
    SP_GRID_STRIDE(i, n) {
        float g = __fmul_rn(grad[i], gscale);
        float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(omb1, g));
        float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(omb2, g), g));
        m[i] = mi;
        v[i] = vi;
        float den = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), rbc2), eps);
        param[i] = __fsub_rn(__fmul_rn(param[i], decay), __fdiv_rn(__fmul_rn(step, mi), den));
    }
}

extern "C" int sp_cuda_adamw_update(float *param, float *m, float *v, const float *grad,
                                    int64_t n, float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float grad_scale, int t, void *stream)
{
    if (n <= 0)
        return SP_CUDA_OK;
    /* The host-side constants, computed exactly as optim.c does (double bias corrections). */
    const float step = (float)((double)lr / (1.0 - pow((double)beta1, (double)t)));
    const float rbc2 = (float)(1.0 / sqrt(1.0 - pow((double)beta2, (double)t)));
    const float decay = 1.0f - lr * weight_decay;
    const float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    adamw_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(
        param, m, v, grad, n, beta1, beta2, omb1, omb2, eps, grad_scale, step, rbc2, decay);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* The gradient norm's sum of squares, at memory bandwidth (issue 42): the tensor is cut
 * into chunks of sp_cuda_sum_squares_chunk(n) elements, one block each (the grid depends on
 * n alone, never on the device, so every GPU gives the same bits). In its chunk, lane t
 * keeps four chains: chain j sums, in double and in order, the squares of the elements
 * t + j 256, t + (j + 4) 256, ... (the steps of 1024 of the chunk), each term added by one
 * fma (so no compiler can contract it another way); the lane's
 * ((c0 + c1) + (c2 + c3)), then the fixed block tree (sp_block_sum), is the block's
 * partial. One block of 1024 then sums the partials the same way, lane j holding partial
 * j. One chunk: the first kernel writes the result itself. */
#define SSQ_THREADS 256
#define SSQ_STEP (4 * SSQ_THREADS)
#define SSQ_MAX_BLOCKS 1024
#define SSQ_MIN_CHUNK (16 * SSQ_STEP)

extern "C" int64_t sp_cuda_sum_squares_chunk(int64_t n)
{
    int64_t per = (n + SSQ_MAX_BLOCKS - 1) / SSQ_MAX_BLOCKS;
    per = (per + SSQ_STEP - 1) / SSQ_STEP * SSQ_STEP;
    return per < SSQ_MIN_CHUNK ? SSQ_MIN_CHUNK : per;
}

static __global__ void __launch_bounds__(SSQ_THREADS)
    sum_squares_kernel(double *out, const float *__restrict__ x, int64_t n, int64_t chunk)
{
    __shared__ double sh[SSQ_THREADS / 32];
    const int64_t lo = (int64_t)blockIdx.x * chunk;
    const int64_t hi = lo + chunk < n ? lo + chunk : n;
    double c0 = 0.0, c1 = 0.0, c2 = 0.0, c3 = 0.0;
    int64_t i = lo + threadIdx.x;
    for (; i + 3 * SSQ_THREADS < hi; i += SSQ_STEP) {
        double a = (double)x[i], b = (double)x[i + SSQ_THREADS];
        double c = (double)x[i + 2 * SSQ_THREADS], d = (double)x[i + 3 * SSQ_THREADS];
        c0 = fma(a, a, c0);
        c1 = fma(b, b, c1);
        c2 = fma(c, c, c2);
        c3 = fma(d, d, c3);
    }
    /* the chunk's last, partial step (only the tensor's last chunk has one) */
    if (i < hi) { double a = (double)x[i]; c0 = fma(a, a, c0); }
    if (i + SSQ_THREADS < hi) { double b = (double)x[i + SSQ_THREADS]; c1 = fma(b, b, c1); }
    if (i + 2 * SSQ_THREADS < hi) { double c = (double)x[i + 2 * SSQ_THREADS]; c2 = fma(c, c, c2); }
    double r = sp_block_sum((c0 + c1) + (c2 + c3), sh);
    if (threadIdx.x == 0)
        out[blockIdx.x] = r;
}

static __global__ void __launch_bounds__(SSQ_MAX_BLOCKS)
    sum_partials_kernel(double *out, const double *__restrict__ part, int nparts)
{
    __shared__ double sh[SSQ_MAX_BLOCKS / 32];
    double r = sp_block_sum((int)threadIdx.x < nparts ? part[threadIdx.x] : 0.0, sh);
    if (threadIdx.x == 0)
        *out = r;
}

extern "C" int sp_cuda_sum_squares(double *out, const float *x, int64_t n, void *stream)
{
    cudaStream_t st = SP_STREAM(stream);
    const int64_t chunk = sp_cuda_sum_squares_chunk(n);
    const int nblocks = n > chunk ? (int)((n + chunk - 1) / chunk) : 1;
    if (nblocks == 1) { /* n <= 0 still runs: it writes 0 */
        sum_squares_kernel<<<1, SSQ_THREADS, 0, st>>>(out, x, n, chunk);
        SP_CUDA_LAUNCHED();
        return SP_CUDA_OK;
    }
    double *part;
    SP_CUDA_TRY(cudaMallocAsync((void **)&part, sizeof(double) * (size_t)nblocks, st));
    sum_squares_kernel<<<nblocks, SSQ_THREADS, 0, st>>>(part, x, n, chunk);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        sum_partials_kernel<<<1, SSQ_MAX_BLOCKS, 0, st>>>(out, part, nblocks);
        e = cudaGetLastError();
    }
    cudaFreeAsync(part, st);
    return e == cudaSuccess ? SP_CUDA_OK : (int)e;
}
