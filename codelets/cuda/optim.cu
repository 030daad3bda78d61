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

/* One block of 1024: lane j sums x[j], x[j + 1024], ... squared in double, in order, then
 * the fixed block tree. */
#define SSQ_THREADS 1024
static __global__ void __launch_bounds__(SSQ_THREADS)
    sum_squares_kernel(double *out, const float *__restrict__ x, int64_t n)
{
    __shared__ double sh[32];
    double s0 = 0.0, s1 = 0.0;
    int64_t i = threadIdx.x;
    /* Two independent chains keep more loads in flight; their split is fixed. */
    for (; i + SSQ_THREADS < n; i += 2 * SSQ_THREADS) {
        double a = (double)x[i], b = (double)x[i + SSQ_THREADS];
        s0 += a * a;
        s1 += b * b;
    }
    if (i < n) {
        double a = (double)x[i];
        s0 += a * a;
    }
    double r = sp_block_sum(s0 + s1, sh);
    if (threadIdx.x == 0)
        *out = r;
}

extern "C" int sp_cuda_sum_squares(double *out, const float *x, int64_t n, void *stream)
{
    /* n <= 0 still runs: it writes 0. */
    sum_squares_kernel<<<1, SSQ_THREADS, 0, SP_STREAM(stream)>>>(out, x, n);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}
