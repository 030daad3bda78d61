/* Token + position embedding on the GPU, the vocab-parallel embedding (the rows of wte
 * one rank holds), and a token range check. The backwards are deterministic without float
 * atomics: each distinct token is owned by the block of its first position, which adds
 * every position holding it in (b, t) order. */
#include "codelets/cuda/common.cuh"

static __global__ void embed_forward_kernel(float *__restrict__ out,
                                            const int32_t *__restrict__ tokens,
                                            const float *__restrict__ wte,
                                            const float *__restrict__ wpe, int T, int C, int64_t n)
{
    SP_GRID_STRIDE(i, n) {
        int64_t bt = i / C;
        int c = (int)(i - bt * C);
        int t = (int)(bt % T);
        out[i] = wte[(int64_t)tokens[bt] * C + c] + wpe[(int64_t)t * C + c];
    }
}

extern "C" int sp_cuda_embed_forward(float *out, const int32_t *tokens, const float *wte,
                                     const float *wpe, int B, int T, int C, void *stream)
{
    if (B <= 0 || T <= 0 || C <= 0)
        return SP_CUDA_OK;
    int64_t n = (int64_t)B * T * C;
    embed_forward_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(
        out, tokens, wte, wpe, T, C, n);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* One block per position i. If tokens[i] already occurred at an earlier position, that
 * position's block owns the row and this one leaves. Otherwise each thread takes columns
 * and adds, from the row's old value, dout of every position j >= i with the same token,
 * j ascending: the CPU's exact sequence of additions. Cost: one pass over the tokens per
 * distinct token (tokens are read by all threads at once: broadcast loads). */
#define EMB_THREADS 256
static __global__ void embed_backward_wte_kernel(float *__restrict__ dwte,
                                                 const float *__restrict__ dout,
                                                 const int32_t *__restrict__ tokens, int64_t BT,
                                                 int C)
{
    const int64_t i = blockIdx.x;
    const int32_t v = tokens[i];
    int seen = 0;
    for (int64_t j = threadIdx.x; j < i; j += blockDim.x)
        seen |= tokens[j] == v;
    if (__syncthreads_or(seen))
        return; /* the whole block leaves: the condition is block-uniform */
    float *row = dwte + (int64_t)v * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = row[c];
        for (int64_t j = i; j < BT; j++)
            if (tokens[j] == v)
                s += dout[j * C + c];
        row[c] = s;
    }
}

/* dwpe[t] += dout[b, t] for b ascending: one thread per (t, c). */
static __global__ void embed_backward_wpe_kernel(float *__restrict__ dwpe,
                                                 const float *__restrict__ dout, int B, int T,
                                                 int C)
{
    const int64_t n = (int64_t)T * C, stride_b = (int64_t)T * C;
    SP_GRID_STRIDE(i, n) {
        float s = dwpe[i];
        for (int b = 0; b < B; b++)
            s += dout[b * stride_b + i];
        dwpe[i] = s;
    }
}

extern "C" int sp_cuda_embed_backward(float *dwte, float *dwpe, const float *dout,
                                      const int32_t *tokens, int B, int T, int C, void *stream)
{
    if (B <= 0 || T <= 0 || C <= 0)
        return SP_CUDA_OK;
    cudaStream_t s = SP_STREAM(stream);
    int64_t BT = (int64_t)B * T;
    if (BT > 0x7fffffffLL)
        return (int)cudaErrorInvalidValue; /* one block per position: grid.x <= 2^31 - 1 */
    embed_backward_wte_kernel<<<(unsigned)BT, EMB_THREADS, 0, s>>>(dwte, dout, tokens, BT, C);
    SP_CUDA_LAUNCHED();
    embed_backward_wpe_kernel<<<sp_ew_blocks((int64_t)T * C), SP_EW_THREADS, 0, s>>>(dwpe, dout, B,
                                                                                    T, C);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* ---- the vocab-parallel embedding: wte holds rows [lo, lo + rows) ---- */
static __global__ void embed_vocab_forward_kernel(float *__restrict__ out,
                                                  const int32_t *__restrict__ tokens,
                                                  const float *__restrict__ wte, int C,
                                                  int64_t lo, int64_t rows, int64_t n)
{
    SP_GRID_STRIDE(i, n) {
        int64_t row = i / C;
        int c = (int)(i - row * C);
        int64_t r = (int64_t)tokens[row] - lo;
        out[i] = r >= 0 && r < rows ? wte[r * C + c] : 0.0f;
    }
}

extern "C" int sp_cuda_embed_vocab_forward(float *out, const int32_t *tokens, const float *wte,
                                           int N, int C, int64_t lo, int64_t rows, void *stream)
{
    if (N <= 0 || C <= 0)
        return SP_CUDA_OK;
    int64_t n = (int64_t)N * C;
    embed_vocab_forward_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, SP_STREAM(stream)>>>(
        out, tokens, wte, C, lo, rows, n);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* embed_backward_wte_kernel's ownership, for the tokens this rank holds: a block whose
 * token another rank holds leaves at once (the condition is block-uniform). */
static __global__ void embed_vocab_backward_kernel(float *__restrict__ dwte,
                                                   const float *__restrict__ dout,
                                                   const int32_t *__restrict__ tokens,
                                                   int64_t N, int C, int64_t lo, int64_t rows)
{
    const int64_t i = blockIdx.x;
    const int32_t v = tokens[i];
    if ((int64_t)v - lo < 0 || (int64_t)v - lo >= rows)
        return;
    int seen = 0;
    for (int64_t j = threadIdx.x; j < i; j += blockDim.x)
        seen |= tokens[j] == v;
    if (__syncthreads_or(seen))
        return;
    float *row = dwte + ((int64_t)v - lo) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = row[c];
        for (int64_t j = i; j < N; j++)
            if (tokens[j] == v)
                s += dout[j * C + c];
        row[c] = s;
    }
}

extern "C" int sp_cuda_embed_vocab_backward(float *dwte, const float *dout,
                                            const int32_t *tokens, int N, int C, int64_t lo,
                                            int64_t rows, void *stream)
{
    if (N <= 0 || C <= 0)
        return SP_CUDA_OK;
    embed_vocab_backward_kernel<<<(unsigned)N, EMB_THREADS, 0, SP_STREAM(stream)>>>(
        dwte, dout, tokens, N, C, lo, rows);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

static __global__ void check_tokens_kernel(int *bad, const int32_t *__restrict__ tokens, int64_t n,
                                           int V)
{
    int mine = 0;
    SP_GRID_STRIDE(i, n)
        mine += tokens[i] < 0 || tokens[i] >= V;
    if (mine)
        atomicAdd(bad, mine); /* integer: the total does not depend on the order */
}

extern "C" int sp_cuda_embed_check_tokens(int *bad, const int32_t *tokens, int64_t n, int V,
                                          void *stream)
{
    cudaStream_t s = SP_STREAM(stream);
    SP_CUDA_TRY(cudaMemsetAsync(bad, 0, sizeof(int), s));
    if (n <= 0)
        return SP_CUDA_OK;
    check_tokens_kernel<<<sp_ew_blocks(n), SP_EW_THREADS, 0, s>>>(bad, tokens, n, V);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}
