/* Helpers shared by the .cu files of codelets/cuda: status mapping, launch checks, grid
 * sizing, warp reductions and the cuBLAS binding. Internal: not part of the C API. */
#ifndef STARPIPE_CUDA_COMMON_CUH
#define STARPIPE_CUDA_COMMON_CUH

#include "codelets/cuda/kernels_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define SP_STREAM(s) ((cudaStream_t)(s))
#define SP_CUBLAS(h) ((cublasHandle_t)(h))

/* Returns the status of the launch just made (a bad configuration, or an error left by
 * an earlier asynchronous failure) from the enclosing function. */
#define SP_CUDA_LAUNCHED()                                                                    \
    do {                                                                                      \
        cudaError_t sp_e_ = cudaGetLastError();                                               \
        if (sp_e_ != cudaSuccess)                                                             \
            return (int)sp_e_;                                                                \
    } while (0)

#define SP_CUDA_TRY(call)                                                                     \
    do {                                                                                      \
        cudaError_t sp_e_ = (call);                                                           \
        if (sp_e_ != cudaSuccess)                                                             \
            return (int)sp_e_;                                                                \
    } while (0)

#define SP_CUBLAS_TRY(call)                                                                   \
    do {                                                                                      \
        cublasStatus_t sp_b_ = (call);                                                        \
        if (sp_b_ != CUBLAS_STATUS_SUCCESS)                                                   \
            return SP_CUDA_ERR_CUBLAS_BASE + (int)sp_b_;                                      \
    } while (0)

/* Threads per block of the elementwise kernels, and the grid for n elements: capped, the
 * kernels loop with a grid stride, so any int64 n is covered. The CPU emulation
 * (tests/gpu/emu) lowers the cap so that the loop runs more than once at test sizes. */
#define SP_EW_THREADS 256
#ifndef SP_EW_MAX_BLOCKS
#define SP_EW_MAX_BLOCKS 65536 /* 16.7M threads in flight: the H200 holds ~270k */
#endif
static inline unsigned sp_ew_blocks(int64_t n)
{
    int64_t b = (n + SP_EW_THREADS - 1) / SP_EW_THREADS;
    const int64_t cap = SP_EW_MAX_BLOCKS;
    return (unsigned)(b < 1 ? 1 : (b > cap ? cap : b));
}

#define SP_GRID_STRIDE(i, n)                                                                  \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
         i += (int64_t)gridDim.x * blockDim.x)

/* Butterfly reductions: every lane ends with the same value, formed in the same order on
 * every run, so they are deterministic. */
static __device__ __forceinline__ float sp_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float sp_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum and max for blocks of whole warps (<= 1024 threads): each warp reduces by
 * butterfly, then every thread adds the warp results in warp order, so all threads return
 * the same value, formed the same way every run. sh: 32 entries of shared memory, free
 * again on return. */
template <typename V> static __device__ __forceinline__ V sp_block_sum(V v, V *sh)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    V r = sh[0];
    for (int i = 1; i < nw; i++)
        r += sh[i];
    __syncthreads();
    return r;
}
static __device__ __forceinline__ float sp_block_max(float v, float *sh)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = sp_warp_max(v);
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    float r = sh[0];
    for (int i = 1; i < nw; i++)
        r = fmaxf(r, sh[i]);
    __syncthreads();
    return r;
}

/* Binds the handle to the stream (only when it differs: cublasSetStream also resets a
 * user workspace) and makes alpha/beta host pointers, as every call here passes them. */
static inline int sp_cublas_bind(cublasHandle_t h, cudaStream_t s)
{
    if (!h)
        return SP_CUDA_ERR_ARG;
    cudaStream_t cur = NULL;
    SP_CUBLAS_TRY(cublasGetStream(h, &cur));
    if (cur != s)
        SP_CUBLAS_TRY(cublasSetStream(h, s));
    cublasPointerMode_t pm;
    SP_CUBLAS_TRY(cublasGetPointerMode(h, &pm));
    if (pm != CUBLAS_POINTER_MODE_HOST)
        SP_CUBLAS_TRY(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    return SP_CUDA_OK;
}

#endif
