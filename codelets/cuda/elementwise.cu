/* Elementwise ops on the GPU: bias add (and its deterministic column sum), add, scale,
 * GELU (the CPU's tanh polynomial), ReLU, SwiGLU (the CPU's SiLU). Grid-stride loops over
 * int64 n; outputs may alias an input exactly, so nothing here is __restrict__ but the
 * bias. */
#include "codelets/cuda/common.cuh"
#include "codelets/gelu.h"

static __global__ void bias_add_kernel(float *out, const float *x, const float *__restrict__ bias,
                                       int64_t n, int C)
{
    SP_GRID_STRIDE(i, n)
        out[i] = x[i] + bias[i % C];
}

extern "C" int sp_cuda_bias_add_forward(float *out, const float *x, const float *bias, int N,
                                        int C, void *stream)
{
    if (N <= 0 || C <= 0)
        return SP_CUDA_OK;
    int64_t n = (int64_t)N * C;
    bias_add_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(out, x, bias, n, C);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* Column sums: a block owns 32 columns; lane y sums rows y, y+32, ... in order, then the
 * 32 lane sums meet in a fixed tree. Reads of one row are 32 consecutive floats. */
#define COL_W 32
#define COL_H 32
static __global__ void bias_backward_kernel(float *__restrict__ dbias,
                                            const float *__restrict__ dout, int N, int C, int acc)
{
    __shared__ float part[COL_H][COL_W + 1];
    const int c = blockIdx.x * COL_W + threadIdx.x;
    float s = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += COL_H)
            s += dout[(int64_t)n * C + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    for (int h = COL_H / 2; h > 0; h >>= 1) {
        if (threadIdx.y < h)
            part[threadIdx.y][threadIdx.x] += part[threadIdx.y + h][threadIdx.x];
        __syncthreads();
    }
    if (threadIdx.y == 0 && c < C)
        dbias[c] = acc ? dbias[c] + part[0][threadIdx.x] : part[0][threadIdx.x];
}

extern "C" int sp_cuda_bias_add_backward_bias(float *dbias, const float *dout, int N, int C,
                                              int acc, void *stream)
{
    if (C <= 0)
        return SP_CUDA_OK;
    if (N <= 0) { /* the sum over no rows is 0 */
        if (!acc)
            SP_CUDA_TRY(cudaMemsetAsync(dbias, 0, sizeof(float) * (size_t)C, SP_STREAM(stream)));
        return SP_CUDA_OK;
    }
    dim3 block(COL_W, COL_H);
    bias_backward_kernel<<<(C + COL_W - 1) / COL_W, block, 0, SP_STREAM(stream)>>>(dbias, dout, N,
                                                                                  C, acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void add_kernel(float *out, const float *a, const float *b, int64_t n)
{
    SP_GRID_STRIDE(i, n)
        out[i] = a[i] + b[i];
}

extern "C" int sp_cuda_add_forward(float *out, const float *a, const float *b, int64_t n,
                                   void *stream)
{
    if (n <= 0)
        return SP_CUDA_OK;
    add_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(out, a, b, n);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* the tensor group's maximum rule: b, the later member's, where it is larger */
static __global__ void maximum_kernel(float *out, const float *a, const float *b, int64_t n)
{
    SP_GRID_STRIDE(i, n)
        out[i] = b[i] > a[i] ? b[i] : a[i];
}

extern "C" int sp_cuda_maximum_forward(float *out, const float *a, const float *b, int64_t n,
                                       void *stream)
{
    if (n <= 0)
        return SP_CUDA_OK;
    maximum_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(out, a, b, n);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* out = s x, or out += s x: the product is rounded before the add (no FMA), as on the
 * CPU, which keeps acc = 1 bitwise equal to it. */
static __global__ void scale_kernel(float *out, const float *x, float s, int64_t n, int acc)
{
    SP_GRID_STRIDE(i, n) {
        float p = __fmul_rn(s, x[i]);
        out[i] = acc ? __fadd_rn(out[i], p) : p;
    }
}

extern "C" int sp_cuda_scale_forward(float *out, const float *x, float s, int64_t n,
                                     void *stream)
{
    if (n <= 0)
        return SP_CUDA_OK;
    scale_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(out, x, s, n, 0);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

extern "C" int sp_cuda_scale_backward(float *dx, const float *dout, float s, int64_t n, int acc,
                                      void *stream)
{
    if (n <= 0)
        return SP_CUDA_OK;
    cudaStream_t st = SP_STREAM(stream);
    if (!acc && s == 1.0f) { /* the plain gradient copy: the exact bits, like memmove */
        if (dx != dout)
            SP_CUDA_TRY(cudaMemcpyAsync(dx, dout, sizeof(float) * (size_t)n,
                                        cudaMemcpyDeviceToDevice, st));
        return SP_CUDA_OK;
    }
    scale_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, st>>>(dx, dout, s, n, acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void gelu_kernel(float *out, const float *x, int64_t n)
{
    SP_GRID_STRIDE(i, n) {
        float xi = x[i];
        out[i] = sp_gelu(xi);
    }
}

extern "C" int sp_cuda_gelu_forward(float *out, const float *x, int64_t n, void *stream)
{
    if (n <= 0)
        return SP_CUDA_OK;
    gelu_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(out, x, n);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void gelu_backward_kernel(float *dx, const float *x, const float *dout, int64_t n,
                                            int acc)
{
    SP_GRID_STRIDE(i, n) {
        float p = __fmul_rn(sp_gelu_grad(x[i]), dout[i]);
        dx[i] = acc ? __fadd_rn(dx[i], p) : p;
    }
}

extern "C" int sp_cuda_gelu_backward(float *dx, const float *x, const float *dout, int64_t n,
                                     int acc, void *stream)
{
    if (n <= 0)
        return SP_CUDA_OK;
    gelu_backward_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(dx, x, dout, n,
                                                                                  acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void relu_kernel(float *out, const float *x, int64_t n)
{
    SP_GRID_STRIDE(i, n)
        out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

extern "C" int sp_cuda_relu_forward(float *out, const float *x, int64_t n, void *stream)
{
    if (n <= 0)
        return SP_CUDA_OK;
    relu_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(out, x, n);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void relu_backward_kernel(float *dx, const float *x, const float *dout, int64_t n,
                                            int acc)
{
    SP_GRID_STRIDE(i, n) {
        float g = x[i] > 0.0f ? dout[i] : 0.0f;
        dx[i] = acc ? dx[i] + g : g;
    }
}

extern "C" int sp_cuda_relu_backward(float *dx, const float *x, const float *dout, int64_t n,
                                     int acc, void *stream)
{
    if (n <= 0)
        return SP_CUDA_OK;
    relu_backward_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(dx, x, dout, n,
                                                                                  acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* SwiGLU's gate: x (N, 2I) is [a | b] per row, out (N, I) = silu(a) b; the backward's dx
 * [dout b silu'(a) | dout silu(a)], the CPU's order of products, each rounded alone. */
static __global__ void swiglu_kernel(float *out, const float *x, int64_t n, int I)
{
    SP_GRID_STRIDE(e, n) {
        const int64_t o = e / I * 2 * I + e % I;
        out[e] = __fmul_rn(sp_silu(x[o]), x[o + I]);
    }
}

extern "C" int sp_cuda_swiglu_forward(float *out, const float *x, int N, int I, void *stream)
{
    if (N <= 0 || I <= 0)
        return SP_CUDA_OK;
    const int64_t n = (int64_t)N * I;
    swiglu_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(out, x, n, I);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void swiglu_backward_kernel(float *dx, const float *x, const float *dout,
                                              int64_t n, int I, int acc)
{
    SP_GRID_STRIDE(e, n) {
        const int64_t o = e / I * 2 * I + e % I;
        const float a = x[o], b = x[o + I], d = dout[e];
        const float da = __fmul_rn(__fmul_rn(d, b), sp_silu_grad(a));
        const float db = __fmul_rn(d, sp_silu(a));
        dx[o] = acc ? __fadd_rn(dx[o], da) : da;
        dx[o + I] = acc ? __fadd_rn(dx[o + I], db) : db;
    }
}

extern "C" int sp_cuda_swiglu_backward(float *dx, const float *x, const float *dout, int N,
                                       int I, int acc, void *stream)
{
    if (N <= 0 || I <= 0)
        return SP_CUDA_OK;
    const int64_t n = (int64_t)N * I;
    swiglu_backward_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(
        dx, x, dout, n, I, acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* ---- the replicas' gradient sum (runtime/replicas.c): dst = ((x0 + x1) + x2) + ... in
 * replica order, x_own being dst's own values; the order and bits of the CPU's
 * sp_reduce_task_cpu. Up to REDUCE_MAX sources per launch; past that, the running sum
 * waits in dst between launches (an exact store), own values kept aside first. */
#define REDUCE_MAX 8
typedef struct {
    const float *x[REDUCE_MAX];
} reduce_srcs;

static __global__ void reduce_kernel(float *dst, reduce_srcs s, int ns, int from_dst, int64_t n)
{
    SP_GRID_STRIDE(i, n)
    {
        float acc = from_dst ? dst[i] + s.x[0][i] : s.x[0][i];
        for (int q = 1; q < ns; q++)
            acc += s.x[q][i];
        dst[i] = acc;
    }
}

extern "C" int sp_cuda_reduce_replicas(float *dst, const float *const *others, int R, int own,
                                       int64_t n, void *stream)
{
    if (n <= 0 || R < 1 || own < 0 || own >= R)
        return n <= 0 ? SP_CUDA_OK : SP_CUDA_ERR_ARG;
    cudaStream_t st = SP_STREAM(stream);
    float *mine = dst; /* own values, copied aside when a later launch reads them */
    if (R > REDUCE_MAX && own >= REDUCE_MAX) {
        SP_CUDA_TRY(cudaMallocAsync((void **)&mine, sizeof(float) * (size_t)n, st));
        SP_CUDA_TRY(cudaMemcpyAsync(mine, dst, sizeof(float) * (size_t)n,
                                    cudaMemcpyDeviceToDevice, st));
    }
    int rc = SP_CUDA_OK;
    for (int q0 = 0, j = 0; q0 < R && rc == SP_CUDA_OK; q0 += REDUCE_MAX) {
        reduce_srcs s;
        int ns = R - q0 < REDUCE_MAX ? R - q0 : REDUCE_MAX;
        for (int k = 0; k < ns; k++)
            s.x[k] = q0 + k == own ? mine : others[j++];
        reduce_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, st>>>(dst, s, ns, q0 > 0, n);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) rc = (int)e;
    }
    if (mine != dst) cudaFreeAsync(mine, st);
    return rc;
}
