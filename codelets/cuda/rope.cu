/* Rotary position embeddings on the GPU, the CPU's sp_rope_forward (cpu/rope.c): a thread
 * per (position, pair i) makes the pair's angle once, in double as the CPU does, and turns
 * pair i of every rotated head of the batch rows its grid row covers. */
#include "codelets/cuda/common.cuh"

#include <math.h>

/* Threads over the T * hs/2 (t, i) pairs, grid rows over b. Each thread reads and writes
 * only its pair's two elements of each head (or, in a copied head, the same two), so out
 * may be x. Products and sums rounded alone (no FMA), in the CPU's order. */
static __global__ void rope_kernel(float *out, const float *x, int B, int T, int D, int hs,
                                   int period, int rotated, double theta, int inverse, int acc)
{
    const int half = hs / 2, nh = D / hs;
    const int64_t n = (int64_t)T * half;
    SP_GRID_STRIDE(e, n) {
        const int t = (int)(e / half), i = (int)(e % half);
        const double a = (double)t * pow(theta, -2.0 * i / hs);
        const float c = (float)cos(a), sn = (float)sin(a), s = inverse ? -sn : sn;
        for (int b = blockIdx.y; b < B; b += gridDim.y) {
            const int64_t row = ((int64_t)b * T + t) * D + i;
            for (int j = 0; j < nh; j++) {
                const int64_t o = row + (int64_t)j * hs;
                const float u = x[o], w = x[o + half];
                float ru = u, rw = w;
                if (j % period < rotated) {
                    ru = __fsub_rn(__fmul_rn(u, c), __fmul_rn(w, s));
                    rw = __fadd_rn(__fmul_rn(w, c), __fmul_rn(u, s));
                }
                out[o] = acc ? __fadd_rn(out[o], ru) : ru;
                out[o + half] = acc ? __fadd_rn(out[o + half], rw) : rw;
            }
        }
    }
}

extern "C" int sp_cuda_rope_forward(float *out, const float *x, int B, int T, int D, int hs,
                                    int period, int rotated, float theta, int inverse, int acc,
                                    void *stream)
{
    if (B <= 0 || T <= 0 || D <= 0 || hs <= 1)
        return SP_CUDA_OK;
    if (period < 1 || hs % 2) /* the CPU would divide by zero, or leave a column unwritten */
        return (int)cudaErrorInvalidValue;
    const dim3 grid(sp_ew_blocks((int64_t)T * (hs / 2)), (unsigned)(B < 65535 ? B : 65535));
    rope_kernel<<<grid, SP_EW_THREADS, 0, SP_STREAM(stream)>>>(out, x, B, T, D, hs, period,
                                                               rotated, (double)theta, inverse,
                                                               acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}
