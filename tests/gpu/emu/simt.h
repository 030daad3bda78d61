/* The device side of the CPU SIMT emulation (README.md): what the .cu files of
 * codelets/cuda use from CUDA, for a C++ compiler. Each CUDA thread runs as a fiber;
 * __syncthreads and the warp shuffles are where a fiber stops until its block (or warp)
 * has caught up, and where emu.cpp checks that the whole block or warp is there.
 * A CUDA feature missing here fails the build of the rewritten .cu: add it here. */
#ifndef STARPIPE_EMU_SIMT_H
#define STARPIPE_EMU_SIMT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>

#include "cuda_runtime.h"

/* For code that must take another path here than on a GPU (inline PTX: sp_mma_bf16). */
#define SP_EMU_SIMT 1

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

/* CUDA's vector type, as aligned (a 16-byte load of shared memory). */
struct alignas(16) float4 {
    float x, y, z, w;
};

/* Set by the scheduler before it runs or resumes a thread. */
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
/* One block runs at a time, so a static local is the block's shared memory. */
#define __shared__ static
#define __launch_bounds__(...)

void sp_emu_syncthreads(void);
int sp_emu_syncthreads_or(int pred);
uint64_t sp_emu_shfl_xor(unsigned mask, uint64_t bits, int lane_mask, int width);
/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 d, a, b, c: a warp collective like a
 * shuffle, with the PTX ISA's fragments (simt.cpp); products exact, sums in fp32. */
void sp_emu_mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);
/* ldmatrix.sync.aligned.m8n8.x{n}{.trans}.shared.b16 r, [row]: a warp collective; lane
 * 8 i + j gives the address of row j of matrix i (16-byte aligned, 8 bf16), each lane
 * gets 32 bits of each matrix (simt.cpp writes the map out). */
void sp_emu_ldmatrix(uint32_t *r, int n, int trans, const void *row);
void sp_emu_launch(const char *kernel, dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                   const std::function<void()> &body);

static inline void __syncthreads(void) { sp_emu_syncthreads(); }
static inline int __syncthreads_or(int pred) { return sp_emu_syncthreads_or(pred); }

template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffles move at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = sp_emu_shfl_xor(mask, bits, lane_mask, width);
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* Integer atomics only: threads never run at the same time here, and float atomics would
 * break the kernels' determinism (docs/cuda-kernels.md), so their absence is wanted. */
static inline int atomicAdd(int *p, int v)
{
    int old = *p;
    *p = old + v;
    return old;
}
static inline unsigned atomicAdd(unsigned *p, unsigned v)
{
    unsigned old = *p;
    *p = old + v;
    return old;
}

/* Rounded alone, never fused: the emulation is built with -ffp-contract=off. */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }

/* cu2cpp.cmake rewrites k<<<grid, block, shared, stream>>>(args) into
 * SP_LAUNCH(k, grid, block, shared, stream)(args): a launcher whose call copies the
 * arguments, as a launch does, and runs the grid before it returns. */
template <typename K> struct sp_emu_launcher {
    K *kernel;
    const char *name;
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;
    template <typename... A> void operator()(A... args) const
    {
        K *k = kernel;
        sp_emu_launch(name, grid, block, shared, stream, [=]() { k(args...); });
    }
};
template <typename K>
static inline sp_emu_launcher<K> sp_emu_launcher_of(K *kernel, const char *name, dim3 grid,
                                                    dim3 block, size_t shared = 0,
                                                    cudaStream_t stream = 0)
{
    return sp_emu_launcher<K>{kernel, name, grid, block, shared, stream};
}
#define SP_LAUNCH(k, ...) sp_emu_launcher_of(k, #k, __VA_ARGS__)

#endif
