/* Softmax cross-entropy (mean over rows), its vocab-parallel steps, and the scalar sum, on
 * the GPU, plus the small device-scalar helpers (set, zero). Scalars stay on the device: the loss, the bad-target
 * count and the upstream gradient are device pointers, so nothing here synchronizes. */
#include "codelets/cuda/common.cuh"

#include <math.h>

#define CE_THREADS 512
#define SUM_THREADS 1024

/* A row's maximum and its sum of exponentials over one block, each thread taking every
 * blockDim-th column, then the fixed block trees: the steps the cross-entropy and its
 * vocab-parallel form share. */
static __device__ __forceinline__ float row_max(const float *__restrict__ x, int V, float *sh)
{
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        mx = fmaxf(mx, x[v]);
    return sp_block_max(mx, sh);
}

/* p = exp(x - mx); returns their sum */
static __device__ __forceinline__ float row_exp_sum(float *__restrict__ p,
                                                    const float *__restrict__ x, float mx, int V,
                                                    float *sh)
{
    float s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float e = expf(x[v] - mx);
        p[v] = e;
        s += e;
    }
    return sp_block_sum(s, sh);
}

/* Padding columns [valid, V) of a row: probability 0 (and so no gradient). */
static __device__ __forceinline__ void row_zero(float *__restrict__ p, int valid, int V)
{
    for (int v = valid + (int)threadIdx.x; v < V; v += blockDim.x)
        p[v] = 0.0f;
}

/* One block per row: max, exp and sum, normalize over the row's first `valid` columns
 * (the tokens; the rest is padding) (the CPU's order of operations; the sum is a fixed
 * tree). The row's -log p[target] = log(sum) + max - x[target] goes to rowloss in double;
 * a bad target counts in *bad and contributes 0. */
static __global__ void __launch_bounds__(CE_THREADS)
    ce_forward_kernel(float *__restrict__ probs, double *__restrict__ rowloss, int *bad,
                      const float *__restrict__ logits, const int32_t *__restrict__ targets,
                      int V, int valid)
{
    __shared__ float sh[32];
    const int64_t row = blockIdx.x;
    const float *x = logits + row * V;
    float *p = probs + row * V;
    const float mx = row_max(x, valid, sh);
    const float s = row_exp_sum(p, x, mx, valid, sh);
    const float inv = 1.0f / s;
    for (int v = threadIdx.x; v < valid; v += blockDim.x)
        p[v] *= inv; /* each thread rescales the entries it wrote */
    row_zero(p, valid, V);
    if (threadIdx.x == 0) {
        const int32_t tg = targets[row];
        if (tg < 0 || tg >= valid) {
            atomicAdd(bad, 1); /* integer count: order-independent */
            rowloss[row] = 0.0;
        } else {
            rowloss[row] = log((double)s) + (double)mx - (double)x[tg];
        }
    }
}

/* One block: *out = (float)(sum of x (n) in double [* 1/n]); lanes take every
 * SUM_THREADS-th element in order, then the fixed block tree. */
template <typename In>
static __device__ double block_sum_all(const In *__restrict__ x, int64_t n, double *sh)
{
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        s += (double)x[i];
    return sp_block_sum(s, sh);
}

static __global__ void __launch_bounds__(SUM_THREADS)
    ce_loss_kernel(float *loss, const int *bad, const double *__restrict__ rowloss, int N)
{
    __shared__ double sh[32];
    const double total = block_sum_all(rowloss, N, sh);
    if (threadIdx.x == 0)
        *loss = *bad ? NAN : (float)(total / N);
}

extern "C" int64_t sp_cuda_cross_entropy_scratch_bytes(int N)
{
    return (int64_t)sizeof(double) * (N > 0 ? N : 1);
}

extern "C" int sp_cuda_cross_entropy_forward(float *loss, float *probs, const float *logits,
                                             const int32_t *targets, int N, int V, int valid,
                                             int *bad, void *scratch, void *stream)
{
    cudaStream_t s = SP_STREAM(stream);
    SP_CUDA_TRY(cudaMemsetAsync(bad, 0, sizeof(int), s));
    if (N <= 0) /* no rows: loss 0, as the CPU */
        return sp_cuda_set_scalar(loss, 0.0f, stream);
    double *rowloss = (double *)scratch;
    V = V < 0 ? 0 : V;
    ce_forward_kernel<<<(unsigned)N, CE_THREADS, 0, s>>>(probs, rowloss, bad, logits, targets, V,
                                                         valid < 0 ? 0 : valid > V ? V : valid);
    SP_CUDA_LAUNCHED();
    ce_loss_kernel<<<1, SUM_THREADS, 0, s>>>(loss, bad, rowloss, N);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* dlogits = s (probs - onehot(target)), s = mult * *dloss / N. The target's entry is
 * formed first and added once, with the CPU's roundings (no FMA); a bad target gets no
 * one-hot term. */
static __global__ void ce_backward_kernel(float *__restrict__ dlogits,
                                          const float *__restrict__ probs,
                                          const int32_t *__restrict__ targets,
                                          const float *__restrict__ dloss, float mult, int N, int V,
                                          int acc)
{
    const float s = __fdiv_rn(__fmul_rn(mult, *dloss), (float)N);
    const int64_t n = (int64_t)N * V;
    SP_GRID_STRIDE(i, n) {
        const int64_t row = i / V;
        const int v = (int)(i - row * V);
        const int32_t tg = targets[row];
        const float sp = __fmul_rn(s, probs[i]);
        float d;
        if (v == tg) /* implies a valid target: v is in [0,V) */
            d = __fadd_rn(acc ? dlogits[i] : 0.0f, __fsub_rn(sp, s));
        else
            d = acc ? __fadd_rn(dlogits[i], sp) : sp;
        dlogits[i] = d;
    }
}

extern "C" int sp_cuda_cross_entropy_backward(float *dlogits, const float *probs,
                                              const int32_t *targets, const float *dloss,
                                              float dloss_mult, int N, int V, int acc,
                                              void *stream)
{
    if (N <= 0 || V <= 0)
        return SP_CUDA_OK;
    int64_t n = (int64_t)N * V;
    ce_backward_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(
        dlogits, probs, targets, dloss, dloss_mult, N, V, acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* ---- the vocab-parallel cross-entropy (kernels_cuda.h): ce_forward_kernel's steps,
 * cut where the group's all-reduces come in ---- */
static __global__ void __launch_bounds__(CE_THREADS)
    vce_max_kernel(float *__restrict__ rowmax, const float *__restrict__ logits, int V,
                   int valid)
{
    __shared__ float sh[32];
    const int64_t row = blockIdx.x;
    const float mx = row_max(logits + row * V, valid, sh);
    if (threadIdx.x == 0)
        rowmax[row] = mx;
}

extern "C" int sp_cuda_vocab_ce_max(float *rowmax, const float *logits, int N, int V,
                                    int valid, void *stream)
{
    if (N <= 0)
        return SP_CUDA_OK;
    V = V < 0 ? 0 : V;
    vce_max_kernel<<<(unsigned)N, CE_THREADS, 0, SP_STREAM(stream)>>>(
        rowmax, logits, V, valid < 0 ? 0 : valid > V ? V : valid);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void __launch_bounds__(CE_THREADS)
    vce_exp_kernel(float *__restrict__ exps, float *__restrict__ stats,
                   int32_t *__restrict__ ltargets, const float *__restrict__ logits,
                   const int32_t *__restrict__ targets, const float *__restrict__ rowmax, int N,
                   int V, int64_t lo, int64_t Vall)
{
    __shared__ float sh[32];
    const int64_t row = blockIdx.x;
    const float *x = logits + row * V;
    /* the slice's tokens: columns before Vall - lo (the rest, if any, is padding) */
    const int valid = Vall - lo >= V ? V : Vall - lo > 0 ? (int)(Vall - lo) : 0;
    const float s = row_exp_sum(exps + row * V, x, rowmax[row], valid, sh);
    row_zero(exps + row * V, valid, V);
    if (threadIdx.x == 0) {
        const int64_t tg = targets[row], r = tg - lo;
        const int ok = tg >= 0 && tg < Vall, here = ok && r >= 0 && r < V;
        stats[row] = s;
        stats[N + row] = here ? x[r] : ok ? 0.0f : NAN; /* a bad target: a NaN loss */
        ltargets[row] = here ? (int32_t)r : -1;
    }
}

extern "C" int sp_cuda_vocab_ce_exp(float *exps, float *stats, int32_t *ltargets,
                                    const float *logits, const int32_t *targets,
                                    const float *rowmax, int N, int V, int64_t lo, int64_t Vall,
                                    void *stream)
{
    if (N <= 0)
        return SP_CUDA_OK;
    vce_exp_kernel<<<(unsigned)N, CE_THREADS, 0, SP_STREAM(stream)>>>(
        exps, stats, ltargets, logits, targets, rowmax, N, V < 0 ? 0 : V, lo, Vall);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* exps *= 1 / the row's sum, as ce_forward_kernel normalizes */
static __global__ void vce_normalize_kernel(float *__restrict__ exps,
                                            const float *__restrict__ stats, int V, int64_t n)
{
    SP_GRID_STRIDE(i, n)
        exps[i] = __fmul_rn(exps[i], __fdiv_rn(1.0f, stats[i / V]));
}

/* One block: the rows' log(sum) + max - target logit in double, lanes over every
 * SUM_THREADS-th row, then the fixed block tree (ce_loss_kernel's) */
static __global__ void __launch_bounds__(SUM_THREADS)
    vce_loss_kernel(float *loss, const float *__restrict__ rowmax,
                    const float *__restrict__ stats, int N)
{
    __shared__ double sh[32];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x)
        s += log((double)stats[i]) + (double)rowmax[i] - (double)stats[N + i];
    const double total = sp_block_sum(s, sh);
    if (threadIdx.x == 0)
        *loss = (float)(total / N);
}

extern "C" int sp_cuda_vocab_ce_loss(float *loss, float *exps, const float *rowmax,
                                     const float *stats, int N, int V, void *stream)
{
    cudaStream_t s = SP_STREAM(stream);
    if (N <= 0) /* no rows: loss 0, as the CPU */
        return sp_cuda_set_scalar(loss, 0.0f, stream);
    int64_t n = (int64_t)N * (V < 0 ? 0 : V);
    if (n > 0) {
        vce_normalize_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, s>>>(exps, stats, V, n);
        SP_CUDA_LAUNCHED();
    }
    vce_loss_kernel<<<1, SUM_THREADS, 0, s>>>(loss, rowmax, stats, N);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void __launch_bounds__(SUM_THREADS)
    sum_kernel(float *out, const float *__restrict__ x, int64_t n)
{
    __shared__ double sh[32];
    const double total = block_sum_all(x, n, sh);
    if (threadIdx.x == 0)
        *out = (float)total;
}

extern "C" int sp_cuda_sum_forward(float *out, const float *x, int64_t n, void *stream)
{
    /* n <= 0 still runs: it writes the empty sum, 0. */
    sum_kernel<<<1, SUM_THREADS, 0, SP_STREAM(stream)>>>(out, x, n);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void sum_backward_kernel(float *dx, const float *__restrict__ dout, float mult,
                                           int64_t n, int acc)
{
    const float g = __fmul_rn(mult, *dout);
    SP_GRID_STRIDE(i, n)
        dx[i] = acc ? __fadd_rn(dx[i], g) : g;
}

extern "C" int sp_cuda_sum_backward(float *dx, const float *dout, float mult, int64_t n, int acc,
                                    void *stream)
{
    if (n <= 0)
        return SP_CUDA_OK;
    sum_backward_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(dx, dout, mult, n,
                                                                                 acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void set_scalar_kernel(float *x, float value) { *x = value; }

extern "C" int sp_cuda_set_scalar(float *x, float value, void *stream)
{
    set_scalar_kernel<<<1, 1, 0, SP_STREAM(stream)>>>(x, value);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

extern "C" int sp_cuda_fill_zero(float *x, int64_t n, void *stream)
{
    if (n <= 0)
        return SP_CUDA_OK;
    SP_CUDA_TRY(cudaMemsetAsync(x, 0, sizeof(float) * (size_t)n, SP_STREAM(stream)));
    return SP_CUDA_OK;
}
