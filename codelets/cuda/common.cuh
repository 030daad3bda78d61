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

/* bf16 of codelets/cpu's sp_round_bf16 (nearest even, NaN kept quiet), as its 16 bits. */
static __device__ __forceinline__ uint32_t sp_bf16_bits(float x)
{
    union {
        float f;
        uint32_t u;
    } v;
    v.f = x;
    uint32_t u = v.u;
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
        u |= 0x00400000u;
    else
        u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}
/* Two values as one .b32 register of bf16x2: lo in the low half (the lower index). */
static __device__ __forceinline__ uint32_t sp_bf16x2(float lo, float hi)
{
    return sp_bf16_bits(lo) | sp_bf16_bits(hi) << 16;
}

/* d = a b + c on the tensor cores, one warp: mma.sync.aligned.m16n8k16.row.col.f32.bf16.
 * bf16.f32, a 16 x 16 (4 registers of bf16x2), b 16 x 8 (2), c and d 16 x 8 fp32 (4), in
 * the PTX ISA's fragment layouts (lane = 4 groupID + threadID_in_group; tests/gpu/emu/
 * simt.cpp writes them out). Every lane of the warp must execute it, converged. d may be
 * c. The CPU emulation runs it as a warp collective. */
static __device__ __forceinline__ void sp_mma_bf16(float d[4], const uint32_t a[4],
                                                   const uint32_t b[2], const float c[4])
{
#ifdef SP_EMU_SIMT
    sp_emu_mma_bf16(d, a, b, c);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}

/* ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: four 8 x 8 bf16 matrices from shared
 * memory into the mma fragment layout, one instruction for what would be 4 (16 with
 * .trans) loads per lane. Lane 8 i + j passes row j of matrix i (16-byte aligned); lane
 * 4 groupID + tig gets r[i] = matrix i's (groupID, 2 tig | 2 tig + 1), or with .trans the
 * transposed matrix's. Every lane of the warp, converged. */
template <int TRANS>
static __device__ __forceinline__ void sp_ldmatrix_x4_of(uint32_t r[4], const void *row)
{
#ifdef SP_EMU_SIMT
    sp_emu_ldmatrix(r, 4, TRANS, row);
#else
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#endif
}
static __device__ __forceinline__ void sp_ldmatrix_x4(uint32_t r[4], const void *row)
{
    sp_ldmatrix_x4_of<0>(r, row);
}
static __device__ __forceinline__ void sp_ldmatrix_x4_trans(uint32_t r[4], const void *row)
{
    sp_ldmatrix_x4_of<1>(r, row);
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
