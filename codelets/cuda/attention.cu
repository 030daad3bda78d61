/* Causal multi-head self-attention on the GPU, the CPU's contract (attention.c: out, the
 * per-row log-sum-exp, the backward recomputing the probabilities) the FlashAttention-2 way:
 * tiles of 64 queries against tiles of 64 keys up to the diagonal, scores and probabilities
 * only in registers and shared memory, never a T x T square in device memory. fp32 on the
 * CUDA cores. The backward is deterministic without atomics: one kernel per key tile
 * (dk, dv), one per query tile (dq), both recomputing P from the saved lse. qkv in either
 * layout of the CPU's (group: 0 GPT's [q | k | v], G >= 1 grouped-query attention); a KV
 * head's key-tile block sums over its G query heads in ascending order. */
#include "codelets/cuda/common.cuh"

#include <math.h>

/* A block works on a 64 x 64 tile of scores with 16 x 16 threads: thread (ty, tx) holds
 * rows 4 ty + i and columns 4 tx + j (i, j < 4: one 16-byte shared load per operand and
 * step), so a row's 16 threads are 16 adjacent lanes of one warp and reduce by shuffles.
 * Products stream their reduction dimension through shared memory FA_K at a time. A block
 * accumulates at most FA_DV head columns of its output (rows 4 ty + i, columns tx + 16 j,
 * FA_J per thread, in registers); wider heads are split over blockIdx.z, each slice
 * recomputing the scores. 2 blocks per SM: __launch_bounds__ caps the registers at 128
 * (the key-tile backward spills about 120 bytes; it keeps P in shared memory while dv
 * accumulates, so its registers hold P or dS, not both). */
#define FA_TILE 64
#define FA_NT 16
#define FA_THREADS (FA_NT * FA_NT)
#define FA_R (FA_TILE / FA_NT)
#define FA_K 16
#define FA_DV 128
#define FA_J (FA_DV / FA_NT)
#define FA_LD (FA_TILE + 4) /* tiles' row stride: 16-byte aligned rows, staggered banks */
static_assert(FA_R == 4, "a thread's rows and columns of a score tile are one float4");

/* Shared memory of each kernel: two staged operands of a score product, a probability (or
 * dS) tile, a staged chunk of the value-side operand. Statically sized: <= 48 KiB. */
struct alignas(16) fa_smem {
    float a[FA_K][FA_LD], b[FA_K][FA_LD];
    float p[FA_TILE][FA_LD];
    float v[FA_K][FA_DV];
};
static_assert(sizeof(fa_smem) <= 48 * 1024, "attention tiles exceed 48 KiB of shared memory");

static __device__ __forceinline__ int fa_min(int a, int b) { return a < b ? a : b; }
static __device__ __forceinline__ int fa_tx() { return (int)threadIdx.x % FA_NT; }
static __device__ __forceinline__ int fa_ty() { return (int)threadIdx.x / FA_NT; }
static __device__ __forceinline__ float4 fa_load4(const float *x)
{
    return *reinterpret_cast<const float4 *>(x);
}

/* Where head h's q, k and v start in a row of qkv, and the rows' stride: the CPU's head_at
 * (attention.c). group 0: [q | k | v], each C = NH hs wide; group G: per KV head its G query
 * heads, its key and its value, hs each (query head h uses KV head h / G). */
struct fa_head {
    int64_t ld, q, k, v;
};
static __device__ __forceinline__ fa_head fa_head_at(int h, int C, int NH, int group)
{
    const int hs = C / NH;
    fa_head a;
    if (!group) {
        a.ld = 3 * (int64_t)C, a.q = (int64_t)h * hs;
        a.k = a.q + C, a.v = a.q + 2 * (int64_t)C;
    } else {
        const int64_t w = (int64_t)(group + 2) * hs, kv = (int64_t)(h / group) * w;
        a.ld = (NH / group) * w, a.q = kv + (int64_t)(h % group) * hs;
        a.k = kv + (int64_t)group * hs, a.v = a.k + hs;
    }
    return a;
}

/* Max and sum over a row's 16 threads (lanes ty*16 .. ty*16+15 of the warp): butterflies
 * that stay inside the half warp, same order every run. */
static __device__ __forceinline__ float fa_row_max(float v)
{
    for (int o = FA_NT / 2; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
static __device__ __forceinline__ float fa_row_sum(float v)
{
    for (int o = FA_NT / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* s[i][j] = sum over c < hs of a[r_i][c] b[r_j][c], r_i = 4 ty + i, r_j = 4 tx + j: rows
 * of stride lda / ldb, rows from na / nb on read as zero. */
static __device__ __forceinline__ void fa_scores(float s[FA_R][FA_R], const float *a,
                                                 int64_t lda, int na, const float *b,
                                                 int64_t ldb, int nb, int hs, fa_smem &sm)
{
    const int tx = fa_tx(), ty = fa_ty();
#pragma unroll
    for (int i = 0; i < FA_R; i++)
#pragma unroll
        for (int j = 0; j < FA_R; j++)
            s[i][j] = 0.0f;
    for (int c0 = 0; c0 < hs; c0 += FA_K) {
        for (int e = threadIdx.x; e < FA_TILE * FA_K; e += FA_THREADS) {
            const int r = e / FA_K, c = e % FA_K;
            const bool col = c0 + c < hs;
            sm.a[c][r] = col && r < na ? a[r * lda + c0 + c] : 0.0f;
            sm.b[c][r] = col && r < nb ? b[r * ldb + c0 + c] : 0.0f;
        }
        __syncthreads();
#pragma unroll 4
        for (int c = 0; c < FA_K; c++) {
            const float4 a4 = fa_load4(&sm.a[c][FA_R * ty]), b4 = fa_load4(&sm.b[c][FA_R * tx]);
            const float av[FA_R] = {a4.x, a4.y, a4.z, a4.w}, bv[FA_R] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
            for (int i = 0; i < FA_R; i++)
#pragma unroll
                for (int j = 0; j < FA_R; j++)
                    s[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
}

/* acc[i][j] += sum over r < nv of P(4 ty + i, r) v[r][tx + 16 j], P(x, r) = sm.p[x][r], or
 * sm.p[r][x] when trans; v has rows of stride ldv, columns from dn on read as zero. Rows of
 * P from nv on are zero or never read. Ends synchronized: sm.p may be overwritten. */
static __device__ __forceinline__ void fa_accumulate(float acc[FA_R][FA_J], bool trans,
                                                     const float *v, int64_t ldv, int nv,
                                                     int dn, fa_smem &sm)
{
    const int tx = fa_tx(), ty = fa_ty();
    const int nj = (dn + FA_NT - 1) / FA_NT, w = nj * FA_NT; /* column groups in use */
    for (int r0 = 0; r0 < nv; r0 += FA_K) {
        for (int e = threadIdx.x; e < FA_K * w; e += FA_THREADS) {
            const int r = e / w, c = e % w;
            sm.v[r][c] = r0 + r < nv && c < dn ? v[(r0 + r) * ldv + c] : 0.0f;
        }
        __syncthreads();
#pragma unroll 4
        for (int r = 0; r < FA_K; r++) {
            float pv[FA_R];
            if (trans) {
                const float4 p4 = fa_load4(&sm.p[r0 + r][FA_R * ty]);
                pv[0] = p4.x, pv[1] = p4.y, pv[2] = p4.z, pv[3] = p4.w;
            } else {
#pragma unroll
                for (int i = 0; i < FA_R; i++)
                    pv[i] = sm.p[FA_R * ty + i][r0 + r];
            }
#pragma unroll
            for (int j = 0; j < FA_J; j++)
                if (j < nj) {
                    const float x = sm.v[r][tx + FA_NT * j];
#pragma unroll
                    for (int i = 0; i < FA_R; i++)
                        acc[i][j] += pv[i] * x;
                }
        }
        __syncthreads();
    }
}

/* One block per (b h, query tile, slice of FA_DV head columns): online softmax over the key
 * tiles 0..diagonal; out = (sum p v) / l, lse = m + log l (written by slice 0). Query
 * tiles run heaviest first. */
static __global__ void __launch_bounds__(FA_THREADS, 2)
    flash_forward_kernel(float *__restrict__ out, float *__restrict__ lse,
                         const float *__restrict__ qkv, int T, int C, int NH, int group,
                         float scale)
{
    __shared__ fa_smem sm;
    const int tx = fa_tx(), ty = fa_ty(), hs = C / NH;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * FA_TILE, nq = fa_min(FA_TILE, T - q0);
    const int d0 = blockIdx.z * FA_DV, dn = fa_min(FA_DV, hs - d0);
    const fa_head at = fa_head_at(h, C, NH, group);
    const int64_t C3 = at.ld;
    const float *row = qkv + (int64_t)b * T * C3;
    const float *q = row + at.q, *k = row + at.k, *v = row + at.v;
    const int kend = q0 + nq; /* keys 0..kend-1; every tile holds key k0 <= every row */
    float m[FA_R], l[FA_R], o[FA_R][FA_J];
#pragma unroll
    for (int i = 0; i < FA_R; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < FA_J; j++)
            o[i][j] = 0.0f;
    }
    for (int k0 = 0; k0 < kend; k0 += FA_TILE) {
        const int nk = fa_min(FA_TILE, kend - k0);
        float s[FA_R][FA_R];
        fa_scores(s, q + q0 * C3, C3, nq, k + k0 * C3, C3, nk, hs, sm);
#pragma unroll
        for (int i = 0; i < FA_R; i++) {
            const int row = q0 + FA_R * ty + i; /* past T: zero q, finite, never written */
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < FA_R; j++) {
                const int key = k0 + FA_R * tx + j;
                s[i][j] = key <= row && key < kend ? s[i][j] * scale : -INFINITY;
                mx = fmaxf(mx, s[i][j]);
            }
            const float mnew = fmaxf(m[i], fa_row_max(mx));
            const float alpha = expf(m[i] - mnew); /* 0 on the first tile */
            float rs = 0.0f;
#pragma unroll
            for (int j = 0; j < FA_R; j++) {
                const float p = expf(s[i][j] - mnew);
                sm.p[FA_R * ty + i][FA_R * tx + j] = p;
                rs += p;
            }
            l[i] = l[i] * alpha + fa_row_sum(rs);
            m[i] = mnew;
#pragma unroll
            for (int j = 0; j < FA_J; j++)
                o[i][j] *= alpha;
        }
        __syncthreads();
        fa_accumulate(o, false, v + k0 * C3 + d0, C3, nk, dn, sm);
    }
#pragma unroll
    for (int i = 0; i < FA_R; i++) {
        const int row = q0 + FA_R * ty + i;
        if (row >= T)
            continue;
        float *orow = out + ((int64_t)b * T + row) * C + (int64_t)h * hs + d0;
        const float inv = 1.0f / l[i];
#pragma unroll
        for (int j = 0; j < FA_J; j++)
            if (tx + FA_NT * j < dn)
                orow[tx + FA_NT * j] = o[i][j] * inv;
        if (blockIdx.z == 0 && tx == 0)
            lse[(int64_t)bh * T + row] = m[i] + logf(l[i]);
    }
}

/* D[(b h) T + t] = dout_t . out_t over head h's columns: one warp per row. */
#define FA_D_WARPS 8
static __global__ void flash_rowdot_kernel(float *__restrict__ D, const float *__restrict__ dout,
                                           const float *__restrict__ out, int64_t rows, int T,
                                           int C, int NH)
{
    const int lane = threadIdx.x & 31, hs = C / NH;
    const int64_t row = (int64_t)blockIdx.x * FA_D_WARPS + (threadIdx.x >> 5);
    if (row >= rows)
        return; /* whole warps only */
    const int64_t bh = row / T, t = row % T;
    const int64_t off = ((bh / NH) * T + t) * C + (bh % NH) * hs;
    float d = 0.0f;
    for (int i = lane; i < hs; i += 32)
        d += dout[off + i] * out[off + i];
    d = sp_warp_sum(d);
    if (lane == 0)
        D[row] = d;
}

/* The probabilities of one (query tile q0, key tile k0) pair of head bh, into the caller's
 * registers: P = exp(scale s - lse) where key <= row < T, else 0. q, k: rows of stride C3
 * (qkv's). */
static __device__ __forceinline__ void fa_probs(float p[FA_R][FA_R], const float *q,
                                                const float *k, const float *lse, int q0,
                                                int k0, int T, int64_t C3, int hs, float scale,
                                                fa_smem &sm)
{
    const int tx = fa_tx(), ty = fa_ty();
    const int nq = fa_min(FA_TILE, T - q0), nk = fa_min(FA_TILE, T - k0);
    fa_scores(p, q + q0 * C3, C3, nq, k + k0 * C3, C3, nk, hs, sm);
#pragma unroll
    for (int i = 0; i < FA_R; i++) {
        const int row = q0 + FA_R * ty + i;
        const float L = row < T ? lse[row] : 0.0f;
#pragma unroll
        for (int j = 0; j < FA_R; j++) {
            const int key = k0 + FA_R * tx + j;
            p[i][j] = key <= row && row < T ? expf(p[i][j] * scale - L) : 0.0f;
        }
    }
}

/* dS = P (dP - D) scale of the same pair with dP = dout v^T: v rows of stride C3, dout of
 * stride C. */
static __device__ __forceinline__ void fa_dscores(float ds[FA_R][FA_R], const float p[FA_R][FA_R],
                                                  const float *v, const float *dout,
                                                  const float *D, int q0, int k0, int T, int C,
                                                  int64_t C3, int hs, float scale, fa_smem &sm)
{
    const int ty = fa_ty();
    const int nq = fa_min(FA_TILE, T - q0), nk = fa_min(FA_TILE, T - k0);
    fa_scores(ds, dout + (int64_t)q0 * C, C, nq, v + k0 * C3, C3, nk, hs, sm);
#pragma unroll
    for (int i = 0; i < FA_R; i++) {
        const int row = q0 + FA_R * ty + i;
        const float Dr = row < T ? D[row] : 0.0f;
#pragma unroll
        for (int j = 0; j < FA_R; j++)
            ds[i][j] = p[i][j] * (ds[i][j] - Dr) * scale;
    }
}

/* A thread's own entries of sm.p back into registers (the values fa_store_tile wrote). */
static __device__ __forceinline__ void fa_load_tile(float x[FA_R][FA_R], const fa_smem &sm)
{
    const int tx = fa_tx(), ty = fa_ty();
#pragma unroll
    for (int i = 0; i < FA_R; i++) {
        const float4 r = fa_load4(&sm.p[FA_R * ty + i][FA_R * tx]);
        x[i][0] = r.x, x[i][1] = r.y, x[i][2] = r.z, x[i][3] = r.w;
    }
}

static __device__ __forceinline__ void fa_store_tile(const float x[FA_R][FA_R], fa_smem &sm)
{
    const int tx = fa_tx(), ty = fa_ty();
#pragma unroll
    for (int i = 0; i < FA_R; i++)
#pragma unroll
        for (int j = 0; j < FA_R; j++)
            sm.p[FA_R * ty + i][FA_R * tx + j] = x[i][j];
    __syncthreads();
}

/* Rows r_i = 4 ty + i (< n) of a (rows, FA_J column groups) register tile into dst (rows
 * of stride ld, dn columns): assigned, or added to the old values when acc. */
static __device__ __forceinline__ void fa_write(float *dst, int64_t ld, int n, int dn,
                                                const float x[FA_R][FA_J], int acc)
{
    const int tx = fa_tx(), ty = fa_ty();
#pragma unroll
    for (int i = 0; i < FA_R; i++) {
        if (FA_R * ty + i >= n)
            continue;
        float *r = dst + (FA_R * ty + i) * ld;
#pragma unroll
        for (int j = 0; j < FA_J; j++) {
            const int c = tx + FA_NT * j;
            if (c < dn)
                r[c] = acc ? r[c] + x[i][j] : x[i][j];
        }
    }
}

/* One block per (b, KV head, key tile, column slice): dv = sum P^T dout, dk = sum dS^T q
 * over the KV head's G query heads (1 in GPT's layout) in ascending order, each over the
 * query tiles from the diagonal on, in ascending order. */
static __global__ void __launch_bounds__(FA_THREADS, 2)
    flash_backward_kv_kernel(float *__restrict__ dqkv, const float *__restrict__ dout,
                             const float *__restrict__ qkv, const float *__restrict__ lse,
                             const float *__restrict__ D, int T, int C, int NH, int group,
                             float scale, int acc)
{
    __shared__ fa_smem sm;
    const int G = group ? group : 1, NKV = NH / G;
    const int hs = C / NH, bk = blockIdx.x, b = bk / NKV, kv = bk % NKV;
    const int k0 = blockIdx.y * FA_TILE, nk = fa_min(FA_TILE, T - k0);
    const int d0 = blockIdx.z * FA_DV, dn = fa_min(FA_DV, hs - d0);
    const fa_head at = fa_head_at(kv * G, C, NH, group); /* k and v: the group's */
    const int64_t C3 = at.ld;
    const float *row = qkv + (int64_t)b * T * C3, *k = row + at.k, *v = row + at.v;
    float dk[FA_R][FA_J], dv[FA_R][FA_J];
#pragma unroll
    for (int i = 0; i < FA_R; i++)
#pragma unroll
        for (int j = 0; j < FA_J; j++)
            dk[i][j] = dv[i][j] = 0.0f;
    for (int g = 0; g < G; g++) {
        const int h = kv * G + g;
        const int64_t bh = (int64_t)b * NH + h;
        const float *q = row + fa_head_at(h, C, NH, group).q;
        const float *d = dout + (int64_t)b * T * C + (int64_t)h * hs;
        for (int q0 = k0; q0 < T; q0 += FA_TILE) {
            const int nq = fa_min(FA_TILE, T - q0);
            /* P's registers are free while dv accumulates: P waits in sm.p for dS */
            float p[FA_R][FA_R], ds[FA_R][FA_R];
            fa_probs(p, q, k, lse + bh * T, q0, k0, T, C3, hs, scale, sm);
            fa_store_tile(p, sm);
            fa_accumulate(dv, true, d + (int64_t)q0 * C + d0, C, nq, dn, sm);
            fa_load_tile(p, sm);
            fa_dscores(ds, p, v, d, D + bh * T, q0, k0, T, C, C3, hs, scale, sm);
            fa_store_tile(ds, sm);
            fa_accumulate(dk, true, q + q0 * C3 + d0, C3, nq, dn, sm);
        }
    }
    float *drow = dqkv + (int64_t)b * T * C3 + (int64_t)k0 * C3 + d0;
    fa_write(drow + at.k, C3, nk, dn, dk, acc);
    fa_write(drow + at.v, C3, nk, dn, dv, acc);
}

/* One block per (b h, query tile, column slice): dq = sum dS k over the key tiles up to
 * the diagonal, in ascending order. Query tiles run heaviest first. */
static __global__ void __launch_bounds__(FA_THREADS, 2)
    flash_backward_q_kernel(float *__restrict__ dqkv, const float *__restrict__ dout,
                            const float *__restrict__ qkv, const float *__restrict__ lse,
                            const float *__restrict__ D, int T, int C, int NH, int group,
                            float scale, int acc)
{
    __shared__ fa_smem sm;
    const int hs = C / NH, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * FA_TILE, nq = fa_min(FA_TILE, T - q0);
    const int d0 = blockIdx.z * FA_DV, dn = fa_min(FA_DV, hs - d0);
    const fa_head at = fa_head_at(h, C, NH, group);
    const int64_t C3 = at.ld, head = (int64_t)b * T * C3 + at.q;
    const float *row = qkv + (int64_t)b * T * C3;
    const float *q = row + at.q, *k = row + at.k, *v = row + at.v;
    const float *d = dout + (int64_t)b * T * C + (int64_t)h * hs;
    float dq[FA_R][FA_J];
#pragma unroll
    for (int i = 0; i < FA_R; i++)
#pragma unroll
        for (int j = 0; j < FA_J; j++)
            dq[i][j] = 0.0f;
    for (int k0 = 0; k0 < q0 + nq; k0 += FA_TILE) {
        float p[FA_R][FA_R], ds[FA_R][FA_R];
        fa_probs(p, q, k, lse + (int64_t)bh * T, q0, k0, T, C3, hs, scale, sm);
        fa_dscores(ds, p, v, d, D + (int64_t)bh * T, q0, k0, T, C, C3, hs, scale, sm);
        fa_store_tile(ds, sm);
        fa_accumulate(dq, false, k + k0 * C3 + d0, C3, fa_min(FA_TILE, T - k0), dn, sm);
    }
    fa_write(dqkv + head + (int64_t)q0 * C3 + d0, C3, nq, dn, dq, acc);
}

/* ---- bf16 on the tensor cores (mma.sync m16n8k16: common.cuh's sp_mma_bf16) ----------
 * The rounding points of the CPU's sp_attention_*_bf16 (codelets/cpu/kernels.h). Blocks of
 * 4 warps; tiles of AB_TILE rows staged into shared memory as bf16 (rounded there: the only
 * conversion of q, k, v and dout), head columns padded with zeros to a multiple of 16 (so
 * any head size up to AB_HD). A warp owns 16 rows of a product: its operands are read
 * from shared memory into the PTX ISA's fragments by ldmatrix (.trans for a k-major B); a
 * score tile's accumulators (C fragments) of two adjacent 8-column tiles are the A
 * fragment of the next product once rounded (FlashAttention-2's register reuse). Row
 * reductions run over the 4 lanes of a row (threadID_in_group) by butterflies: fixed
 * order, deterministic. Shared memory is static (< 48 KiB): no double buffering of K and
 * V yet. Registers: at most 168 (3 blocks of 4 warps per SM, __launch_bounds__), with no
 * spill: the forward reads q's fragments from shared memory as it uses them, the dq
 * kernel takes each key tile in halves of 32 keys (the same keys in the same order); every
 * change of this kind keeps the bits (tests/gpu/README.md: the hashes before and after). */
#define AB_TILE 64
#define AB_WARPS 4
#define AB_THREADS (AB_WARPS * 32)
#define AB_HD SP_CUDA_ATTN_BF16_MAX_HS
#define AB_LD (AB_HD + 8) /* bf16 row stride: 272 bytes, rows 4 banks apart */
#define AB_QB 16          /* queries per step of the key-tile backward kernel */
static_assert(AB_TILE == 16 * AB_WARPS, "a warp owns 16 rows of a tile");
static_assert(AB_HD % 16 == 0 && AB_HD <= 128, "head columns: 8-column tiles in registers");

typedef uint16_t ab_tile[AB_LD];
struct alignas(16) ab_smem {
    ab_tile q[AB_TILE], kv[AB_TILE]; /* a query-side tile kept, a key-side tile staged */
};
struct alignas(16) ab_smem_kv {
    ab_tile k[AB_TILE], v[AB_TILE], q[AB_QB], d[AB_QB];
    float lse[AB_QB], D[AB_QB];
};
static_assert(sizeof(ab_smem_kv) <= 48 * 1024, "bf16 attention tiles exceed 48 KiB");

/* dst rows 0..rows-1, columns 0..hd-1 = src rows (stride ld) rounded to bf16; rows from n
 * and columns from hs on are zero. Whole block; the caller synchronizes. */
/* 32-bit accesses of bf16 pairs (4-byte aligned: even columns); memcpy where a C++
 * compiler's aliasing rules apply (the CPU emulation). */
static __device__ __forceinline__ uint32_t ab_u32(const uint16_t *x)
{
#ifdef SP_EMU_SIMT
    uint32_t u;
    memcpy(&u, x, 4);
    return u;
#else
    return *reinterpret_cast<const uint32_t *>(x);
#endif
}
static __device__ __forceinline__ void ab_put32(uint16_t *x, uint32_t u)
{
#ifdef SP_EMU_SIMT
    memcpy(x, &u, 4);
#else
    *reinterpret_cast<uint32_t *>(x) = u;
#endif
}

static __device__ __forceinline__ void ab_stage(ab_tile *dst, const float *src, int64_t ld,
                                                int n, int rows, int hd, int hs)
{
    const int h2 = hd / 2;
    for (int e = threadIdx.x; e < rows * h2; e += AB_THREADS) {
        const int r = e / h2, c = 2 * (e % h2);
        const float *x = src + r * ld + c;
        const float x0 = r < n && c < hs ? x[0] : 0.0f, x1 = r < n && c + 1 < hs ? x[1] : 0.0f;
        ab_put32(&dst[r][c], sp_bf16x2(x0, x1));
    }
}

static __device__ __forceinline__ int ab_g() { return ((int)threadIdx.x & 31) >> 2; }
static __device__ __forceinline__ int ab_tg() { return (int)threadIdx.x & 3; }

/* Fragments by ldmatrix (common.cuh): lane l passes row l % 16 and 8-column half l / 16
 * of a 16 x 16 block, which is the A fragment's order of matrices (rows 0-7 | 8-15, then
 * columns 8-15) and, transposed, two adjacent B fragments of a k-major tile. */
static __device__ __forceinline__ const uint16_t *ab_row16(const ab_tile *t, int r0, int c0)
{
    const int l = (int)threadIdx.x & 31;
    return &t[r0 + (l & 15)][c0 + 8 * (l >> 4)];
}
/* A fragment of rows r0.., columns c0.. of a tile: A[i][j] = t[r0 + i][c0 + j]. */
static __device__ __forceinline__ void ab_load_a(uint32_t a[4], const ab_tile *t, int r0, int c0)
{
    sp_ldmatrix_x4(a, ab_row16(t, r0, c0));
}
/* The B fragments of two adjacent 8-column tiles n0 and n0 + 8 with B[k][n] = t[n][k]
 * from k0 (a tile's rows are the product's columns: q k^T with k the tile): b[0] | b[1]
 * from matrices (rows n0.., columns k0..) and (n0.., k0 + 8..), b[2] | b[3] the same
 * from row n0 + 8. */
static __device__ __forceinline__ void ab_load_bt2(uint32_t b[4], const ab_tile *t, int n0, int k0)
{
    const int l = (int)threadIdx.x & 31;
    sp_ldmatrix_x4(b, &t[n0 + (l & 7) + 8 * (l >> 4)][k0 + 8 * ((l >> 3) & 1)]);
}
/* The B fragments of two adjacent 8-column tiles n0 and n0 + 8 with B[k][n] = t[k][n]
 * from k0 (p v with v the tile): the transposed matrices of the A fragment's rows. */
static __device__ __forceinline__ void ab_load_b2(uint32_t b[4], const ab_tile *t, int k0, int n0)
{
    sp_ldmatrix_x4_trans(b, ab_row16(t, k0, n0));
}
/* The A fragment (16 x 16) of two adjacent 16 x 8 accumulator tiles lo | hi, rounded. */
static __device__ __forceinline__ void ab_c_to_a(uint32_t a[4], const float lo[4],
                                                 const float hi[4])
{
    a[0] = sp_bf16x2(lo[0], lo[1]), a[1] = sp_bf16x2(lo[2], lo[3]);
    a[2] = sp_bf16x2(hi[0], hi[1]), a[3] = sp_bf16x2(hi[2], hi[3]);
}
/* One step k0 = 16 kk of a warp's scores s (16 rows against NT 8-row groups of tile t
 * from row n0): s += a t^T over those 16 head columns, a the rows' A fragment. */
template <int NT>
static __device__ __forceinline__ void ab_scores_step(float s[NT][4], const uint32_t a[4],
                                                      const ab_tile *t, int n0, int kk)
{
    static_assert(NT % 2 == 0, "B fragments come in pairs of 8-column tiles");
#pragma unroll
    for (int j = 0; j < NT; j += 2) {
        uint32_t bf[4];
        ab_load_bt2(bf, t, n0 + 8 * j, 16 * kk);
        sp_mma_bf16(s[j], a, bf, s[j]);
        sp_mma_bf16(s[j + 1], a, bf + 2, s[j + 1]);
    }
}
template <int NT> static __device__ __forceinline__ void ab_zero(float s[NT][4])
{
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            s[j][i] = 0.0f;
}

/* A warp's 16 rows of scores against NT 8-row groups of a tile from row n0: s = qa t^T
 * over the head columns (qa: the rows' A fragments, n16 of them), every chain in
 * ascending k. */
template <int NT>
static __device__ __forceinline__ void ab_scores(float s[NT][4], const uint32_t qa[AB_HD / 16][4],
                                                 const ab_tile *t, int n0, int n16)
{
    ab_zero<NT>(s);
#pragma unroll
    for (int kk = 0; kk < AB_HD / 16; kk++)
        if (kk < n16)
            ab_scores_step<NT>(s, qa[kk], t, n0, kk);
}

/* The same with the rows' A fragments read from tile a (rows r0..r0 + 15) as they are
 * used: 8 registers live instead of 4 n16. */
template <int NT>
static __device__ __forceinline__ void ab_scores(float s[NT][4], const ab_tile *a, int r0,
                                                 const ab_tile *t, int n0, int n16)
{
    ab_zero<NT>(s);
#pragma unroll
    for (int kk = 0; kk < AB_HD / 16; kk++)
        if (kk < n16) {
            uint32_t qa[4];
            ab_load_a(qa, a, r0, 16 * kk);
            ab_scores_step<NT>(s, qa, t, n0, kk);
        }
}

/* acc (a warp's 16 rows, n8 8-column tiles) += x t: x a 16 x 8 NT block of accumulator
 * tiles (P or dS), rounded to bf16 as it becomes the A operand, t the tile in shared
 * memory from row k0 (P V, dS K: FlashAttention-2's second products). */
template <int NT>
static __device__ __forceinline__ void ab_acc_product(float acc[AB_HD / 8][4],
                                                      const float x[NT][4], const ab_tile *t,
                                                      int k0, int n8)
{
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
        uint32_t a[4];
        ab_c_to_a(a, x[2 * kk], x[2 * kk + 1]);
#pragma unroll
        for (int j = 0; j < AB_HD / 8; j += 2)
            if (j < n8) {
                uint32_t bf[4];
                ab_load_b2(bf, t, k0 + 16 * kk, 8 * j);
                sp_mma_bf16(acc[j], a, bf, acc[j]);
                sp_mma_bf16(acc[j + 1], a, bf + 2, acc[j + 1]);
            }
    }
}

/* Over a row's 4 lanes (threadID_in_group): every lane gets the same value. */
static __device__ __forceinline__ float ab_quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
static __device__ __forceinline__ float ab_quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* out columns (8-column tiles j < n8) of a warp's 16 rows from row r0 (of stride ld, rows
 * from n on skipped): x[j] is the accumulator tile; assigned, or added when acc. */
static __device__ __forceinline__ void ab_write(float *dst, int64_t ld, int n, int hs,
                                                const float x[AB_HD / 8][4], int n8, int r0,
                                                int acc)
{
    const int g = ab_g(), tg = ab_tg();
#pragma unroll
    for (int j = 0; j < AB_HD / 8; j++)
        if (j < n8)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = r0 + g + (i >= 2 ? 8 : 0), c = 8 * j + 2 * tg + (i & 1);
                if (r < n && c < hs) {
                    float *y = dst + r * ld + c;
                    *y = acc ? *y + x[j][i] : x[j][i];
                }
            }
}

/* One block per (b h, query tile of 64), heaviest first: warp w owns rows 16 w..16 w + 15.
 * q's fragments stay in registers; per key tile up to the diagonal, S = q k^T, the online
 * softmax (per-lane partial row sums of the fp32 P~, reduced once at the end), o += P~ v
 * with P~ rounded. out = o / l, lse = m + log l. */
static __global__ void __launch_bounds__(AB_THREADS, 3)
    flash_forward_bf16_kernel(float *__restrict__ out, float *__restrict__ lse,
                              const float *__restrict__ qkv, int T, int C, int NH, int group,
                              float scale)
{
    __shared__ ab_smem sm;
    const int hs = C / NH, hd = (hs + 15) & ~15, n16 = hd / 16, n8 = hd / 8;
    const int w = (int)threadIdx.x >> 5, g = ab_g(), tg = ab_tg();
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * AB_TILE, nq = fa_min(AB_TILE, T - q0);
    const fa_head at = fa_head_at(h, C, NH, group);
    const int64_t C3 = at.ld;
    const float *row = qkv + (int64_t)b * T * C3;
    const float *q = row + at.q, *k = row + at.k, *v = row + at.v;
    ab_stage(sm.q, q + q0 * C3, C3, nq, AB_TILE, hd, hs);
    float o[AB_HD / 8][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
#pragma unroll
    for (int j = 0; j < AB_HD / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            o[j][i] = 0.0f;
    const int kend = q0 + nq, row0 = q0 + 16 * w + g; /* rows row0 and row0 + 8 */
    for (int k0 = 0; k0 < kend; k0 += AB_TILE) {
        const int nk = fa_min(AB_TILE, kend - k0);
        ab_stage(sm.kv, k + k0 * C3, C3, nk, AB_TILE, hd, hs);
        __syncthreads();
        float s[AB_TILE / 8][4];
        ab_scores<AB_TILE / 8>(s, sm.q, 16 * w, sm.kv, 0, n16);
        __syncthreads(); /* every warp is done with k: v takes its place */
        ab_stage(sm.kv, v + k0 * C3, C3, nk, AB_TILE, hd, hs);
        float mx[2] = { -INFINITY, -INFINITY };
#pragma unroll
        for (int j = 0; j < AB_TILE / 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = row0 + (i >= 2 ? 8 : 0), key = k0 + 8 * j + 2 * tg + (i & 1);
                s[j][i] = key <= row && key < kend ? s[j][i] * scale : -INFINITY;
                mx[i >> 1] = fmaxf(mx[i >> 1], s[j][i]);
            }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float mnew = fmaxf(m[r], ab_quad_max(mx[r]));
            alpha[r] = expf(m[r] - mnew); /* 0 on the first tile */
            m[r] = mnew;
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int j = 0; j < AB_TILE / 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                s[j][i] = expf(s[j][i] - m[i >> 1]);
                l[i >> 1] += s[j][i];
            }
#pragma unroll
        for (int j = 0; j < AB_HD / 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                o[j][i] *= alpha[i >> 1];
        __syncthreads();
        ab_acc_product<AB_TILE / 8>(o, s, sm.kv, 0, n8);
        __syncthreads();
    }
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] = ab_quad_sum(l[r]);
        inv[r] = 1.0f / l[r];
    }
#pragma unroll
    for (int j = 0; j < AB_HD / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            o[j][i] *= inv[i >> 1];
    ab_write(out + ((int64_t)b * T + q0) * C + (int64_t)h * hs, C, nq, hs, o, n8, 16 * w, 0);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + 8 * r;
        if (tg == 0 && row < T)
            lse[(int64_t)bh * T + row] = m[r] + logf(l[r]);
    }
}

/* One block per (b, KV head, key tile of 64): warp w owns keys 16 w..16 w + 15, k and v
 * stay in shared memory; over the KV head's G query heads (1 in GPT's layout) in ascending
 * order, each over the query tiles of AB_QB from the diagonal on, in ascending order, the
 * transposed scores S^T = k q^T and dP^T = v dout^T give P^T and dS^T as A fragments:
 * dv += P^T dout, dk += dS^T q. */
static __global__ void __launch_bounds__(AB_THREADS, 3)
    flash_backward_kv_bf16_kernel(float *__restrict__ dqkv, const float *__restrict__ dout,
                                  const float *__restrict__ qkv, const float *__restrict__ lse,
                                  const float *__restrict__ D, int T, int C, int NH, int group,
                                  float scale, int acc)
{
    __shared__ ab_smem_kv sm;
    const int hs = C / NH, hd = (hs + 15) & ~15, n16 = hd / 16, n8 = hd / 8;
    const int w = (int)threadIdx.x >> 5, g = ab_g(), tg = ab_tg();
    const int G = group ? group : 1, NKV = NH / G, bk = blockIdx.x, b = bk / NKV, kv = bk % NKV;
    const int k0 = blockIdx.y * AB_TILE, nk = fa_min(AB_TILE, T - k0);
    const fa_head at = fa_head_at(kv * G, C, NH, group); /* k and v: the group's */
    const int64_t C3 = at.ld;
    const float *row = qkv + (int64_t)b * T * C3, *k = row + at.k, *v = row + at.v;
    ab_stage(sm.k, k + k0 * C3, C3, nk, AB_TILE, hd, hs);
    ab_stage(sm.v, v + k0 * C3, C3, nk, AB_TILE, hd, hs);
    float dk[AB_HD / 8][4], dv[AB_HD / 8][4];
#pragma unroll
    for (int j = 0; j < AB_HD / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            dk[j][i] = dv[j][i] = 0.0f;
    const int key0 = k0 + 16 * w + g; /* keys key0 and key0 + 8 */
    for (int qh = 0; qh < G; qh++) {
        const int h = kv * G + qh;
        const int64_t bh = (int64_t)b * NH + h;
        const float *q = row + fa_head_at(h, C, NH, group).q;
        const float *d = dout + (int64_t)b * T * C + (int64_t)h * hs;
        const float *L = lse + bh * T, *Dh = D + bh * T;
        for (int q0 = k0; q0 < T; q0 += AB_QB) {
            const int nq = fa_min(AB_QB, T - q0);
            ab_stage(sm.q, q + q0 * C3, C3, nq, AB_QB, hd, hs);
            ab_stage(sm.d, d + (int64_t)q0 * C, C, nq, AB_QB, hd, hs);
            if (threadIdx.x < AB_QB) {
                const int t = q0 + (int)threadIdx.x;
                sm.lse[threadIdx.x] = t < T ? L[t] : 0.0f;
                sm.D[threadIdx.x] = t < T ? Dh[t] : 0.0f;
            }
            __syncthreads();
            float st[AB_QB / 8][4], dpt[AB_QB / 8][4];
#pragma unroll
            for (int j = 0; j < AB_QB / 8; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    st[j][i] = dpt[j][i] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < AB_HD / 16; kk++)
                if (kk < n16) {
                    static_assert(AB_QB == 16, "one pair of 8-column tiles of queries");
                    uint32_t a[4], bf[4];
                    ab_load_a(a, sm.k, 16 * w, 16 * kk);
                    ab_load_bt2(bf, sm.q, 0, 16 * kk);
                    sp_mma_bf16(st[0], a, bf, st[0]);
                    sp_mma_bf16(st[1], a, bf + 2, st[1]);
                    ab_load_a(a, sm.v, 16 * w, 16 * kk);
                    ab_load_bt2(bf, sm.d, 0, 16 * kk);
                    sp_mma_bf16(dpt[0], a, bf, dpt[0]);
                    sp_mma_bf16(dpt[1], a, bf + 2, dpt[1]);
                }
#pragma unroll
            for (int j = 0; j < AB_QB / 8; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int key = key0 + (i >= 2 ? 8 : 0), c = 8 * j + 2 * tg + (i & 1);
                    const int t = q0 + c;
                    const float p = key <= t && t < T ? expf(st[j][i] * scale - sm.lse[c]) : 0.0f;
                    st[j][i] = p;
                    dpt[j][i] = p * (dpt[j][i] - sm.D[c]) * scale;
                }
            uint32_t pa[4], dsa[4];
            ab_c_to_a(pa, st[0], st[1]);
            ab_c_to_a(dsa, dpt[0], dpt[1]);
#pragma unroll
            for (int j = 0; j < AB_HD / 8; j += 2)
                if (j < n8) {
                    uint32_t bf[4];
                    ab_load_b2(bf, sm.d, 0, 8 * j);
                    sp_mma_bf16(dv[j], pa, bf, dv[j]);
                    sp_mma_bf16(dv[j + 1], pa, bf + 2, dv[j + 1]);
                    ab_load_b2(bf, sm.q, 0, 8 * j);
                    sp_mma_bf16(dk[j], dsa, bf, dk[j]);
                    sp_mma_bf16(dk[j + 1], dsa, bf + 2, dk[j + 1]);
                }
            __syncthreads();
        }
    }
    float *drow = dqkv + (int64_t)b * T * C3 + (int64_t)k0 * C3;
    ab_write(drow + at.k, C3, nk, hs, dk, n8, 16 * w, acc);
    ab_write(drow + at.v, C3, nk, hs, dv, n8, 16 * w, acc);
}

/* One block per (b h, query tile of 64), heaviest first: q's and dout's fragments in
 * registers, k and v tiles up to the diagonal through shared memory, in ascending order:
 * dq += dS k with dS = P (dP - D) scale rounded. */
static __global__ void __launch_bounds__(AB_THREADS, 3)
    flash_backward_q_bf16_kernel(float *__restrict__ dqkv, const float *__restrict__ dout,
                                 const float *__restrict__ qkv, const float *__restrict__ lse,
                                 const float *__restrict__ D, int T, int C, int NH, int group,
                                 float scale, int acc)
{
    __shared__ ab_smem sm;
    const int hs = C / NH, hd = (hs + 15) & ~15, n16 = hd / 16, n8 = hd / 8;
    const int w = (int)threadIdx.x >> 5, g = ab_g(), tg = ab_tg();
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * AB_TILE, nq = fa_min(AB_TILE, T - q0);
    const fa_head at = fa_head_at(h, C, NH, group);
    const int64_t C3 = at.ld, head = (int64_t)b * T * C3 + at.q;
    const float *row = qkv + (int64_t)b * T * C3;
    const float *q = row + at.q, *k = row + at.k, *v = row + at.v;
    const float *d = dout + (int64_t)b * T * C + (int64_t)h * hs;
    ab_stage(sm.q, q + q0 * C3, C3, nq, AB_TILE, hd, hs);
    __syncthreads();
    uint32_t qa[AB_HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < AB_HD / 16; kk++)
        if (kk < n16)
            ab_load_a(qa[kk], sm.q, 16 * w, 16 * kk);
    __syncthreads();
    ab_stage(sm.q, d + (int64_t)q0 * C, C, nq, AB_TILE, hd, hs); /* dout's tile stays */
    const int row0 = q0 + 16 * w + g; /* rows row0 and row0 + 8 */
    float Lr[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + 8 * r;
        Lr[r] = row < T ? lse[(int64_t)bh * T + row] : 0.0f;
        Dr[r] = row < T ? D[(int64_t)bh * T + row] : 0.0f;
    }
    float dq[AB_HD / 8][4];
#pragma unroll
    for (int j = 0; j < AB_HD / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            dq[j][i] = 0.0f;
    /* keys in halves of a 64-key tile (as many as before, so dq's chains take the same
     * keys in the same order): 32 rows of k and 32 of v in sm.kv */
    ab_tile *kh = sm.kv, *vh = sm.kv + AB_TILE / 2;
    for (int k0 = 0; k0 < q0 + nq; k0 += AB_TILE)
        for (int half = 0; half < 2; half++) {
            const int kb = k0 + AB_TILE / 2 * half, nk = fa_min(AB_TILE / 2, T - kb);
            ab_stage(kh, k + kb * C3, C3, nk, AB_TILE / 2, hd, hs);
            ab_stage(vh, v + kb * C3, C3, nk, AB_TILE / 2, hd, hs);
            __syncthreads();
            float s[AB_TILE / 16][4], dp[AB_TILE / 16][4];
            ab_scores<AB_TILE / 16>(s, qa, kh, 0, n16);            /* q k^T */
            ab_scores<AB_TILE / 16>(dp, sm.q, 16 * w, vh, 0, n16); /* dout v^T */
#pragma unroll
            for (int j = 0; j < AB_TILE / 16; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int row = row0 + (i >= 2 ? 8 : 0), key = kb + 8 * j + 2 * tg + (i & 1);
                    const float p =
                        key <= row && row < T ? expf(s[j][i] * scale - Lr[i >> 1]) : 0.0f;
                    dp[j][i] = p * (dp[j][i] - Dr[i >> 1]) * scale;
                }
            ab_acc_product<AB_TILE / 16>(dq, dp, kh, 0, n8); /* dS k */
            __syncthreads();
        }
    ab_write(dqkv + head + (int64_t)q0 * C3, C3, nq, hs, dq, n8, 16 * w, acc);
}

/* Grids: x the (b, h) pairs (up to 2^31 - 1; the key-tile kernels': (b, KV head), NH / G
 * per batch row), y the tiles of T. */
static dim3 ab_grid(int B, int T, int NH)
{
    return dim3((unsigned)(B * NH), (unsigned)((T + AB_TILE - 1) / AB_TILE), 1);
}

/* The KV heads per batch row: NH / G, or NH in GPT's layout (group 0); 0 for a group that
 * does not divide NH (refused). */
static int kv_heads(int NH, int group)
{
    if (group < 0 || (group > 0 && NH % group))
        return 0;
    return group ? NH / group : NH;
}

extern "C" int sp_cuda_attention_forward_bf16(float *out, float *lse, float * /* scratch */,
                                              const float *qkv, int B, int T, int C, int NH,
                                              int group, void *stream, void * /* cublas */)
{
    if (B <= 0 || T <= 0 || NH <= 0 || C / NH <= 0)
        return SP_CUDA_OK;
    const int hs = C / NH;
    if (hs > AB_HD || !kv_heads(NH, group))
        return (int)cudaErrorInvalidValue;
    flash_forward_bf16_kernel<<<ab_grid(B, T, NH), AB_THREADS, 0, SP_STREAM(stream)>>>(
        out, lse, qkv, T, C, NH, group, 1.0f / sqrtf((float)hs));
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* D = rowsum(dout * out) in fp32 (the fp32 path's kernel), then the key-tile and the
 * query-tile kernels. */
extern "C" int sp_cuda_attention_backward_bf16(float *dqkv, float *scratch, const float *dout,
                                               const float *qkv, const float *out,
                                               const float *lse, int B, int T, int C, int NH,
                                               int group, int acc, void *stream,
                                               void * /* cublas */)
{
    if (B <= 0 || T <= 0 || NH <= 0 || C / NH <= 0)
        return SP_CUDA_OK;
    const int hs = C / NH, NKV = kv_heads(NH, group);
    if (hs > AB_HD || !NKV)
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = SP_STREAM(stream);
    const float scale = 1.0f / sqrtf((float)hs);
    const int64_t rows = (int64_t)B * NH * T;
    flash_rowdot_kernel<<<(unsigned)((rows + FA_D_WARPS - 1) / FA_D_WARPS), FA_D_WARPS * 32, 0,
                          s>>>(scratch, dout, out, rows, T, C, NH);
    SP_CUDA_LAUNCHED();
    flash_backward_kv_bf16_kernel<<<ab_grid(B, T, NKV), AB_THREADS, 0, s>>>(
        dqkv, dout, qkv, lse, scratch, T, C, NH, group, scale, acc);
    SP_CUDA_LAUNCHED();
    flash_backward_q_bf16_kernel<<<ab_grid(B, T, NH), AB_THREADS, 0, s>>>(
        dqkv, dout, qkv, lse, scratch, T, C, NH, group, scale, acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

extern "C" int sp_cuda_attention_occupancy(const char **names, int *blocks, int max)
{
#ifdef SP_EMU_SIMT
    (void)names, (void)blocks, (void)max;
    return -1;
#else
    struct {
        const char *name;
        const void *fn;
        int threads;
    } k[] = {
        { "flash_forward", (const void *)flash_forward_kernel, FA_THREADS },
        { "flash_backward_kv", (const void *)flash_backward_kv_kernel, FA_THREADS },
        { "flash_backward_q", (const void *)flash_backward_q_kernel, FA_THREADS },
        { "flash_forward_bf16", (const void *)flash_forward_bf16_kernel, AB_THREADS },
        { "flash_backward_kv_bf16", (const void *)flash_backward_kv_bf16_kernel, AB_THREADS },
        { "flash_backward_q_bf16", (const void *)flash_backward_q_bf16_kernel, AB_THREADS },
    };
    int n = 0;
    for (int i = 0; i < (int)(sizeof k / sizeof k[0]) && n < max; i++, n++) {
        names[n] = k[i].name;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks[n], k[i].fn, k[i].threads, 0) !=
            cudaSuccess)
            blocks[n] = 0;
    }
    return n;
#endif
}

/* Grid of the tiled kernels: x the (b, h) pairs (up to 2^31 - 1; the key-tile kernel's:
 * (b, KV head)), y the tiles of T, z the column slices of a head. */
static dim3 fa_grid(int B, int T, int NH, int hs)
{
    return dim3((unsigned)(B * NH), (unsigned)((T + FA_TILE - 1) / FA_TILE),
                (unsigned)((hs + FA_DV - 1) / FA_DV));
}

extern "C" int sp_cuda_attention_forward(float *out, float *lse, float * /* scratch */,
                                         const float *qkv, int B, int T, int C, int NH,
                                         int group, void *stream, void * /* cublas */)
{
    if (B <= 0 || T <= 0 || NH <= 0 || C / NH <= 0)
        return SP_CUDA_OK;
    if (!kv_heads(NH, group))
        return (int)cudaErrorInvalidValue;
    const int hs = C / NH;
    flash_forward_kernel<<<fa_grid(B, T, NH, hs), FA_THREADS, 0, SP_STREAM(stream)>>>(
        out, lse, qkv, T, C, NH, group, 1.0f / sqrtf((float)hs));
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

/* D = rowsum(dout * out) into scratch, then the key-tile and the query-tile kernels. */
extern "C" int sp_cuda_attention_backward(float *dqkv, float *scratch, const float *dout,
                                          const float *qkv, const float *out, const float *lse,
                                          int B, int T, int C, int NH, int group, int acc,
                                          void *stream, void * /* cublas */)
{
    if (B <= 0 || T <= 0 || NH <= 0 || C / NH <= 0)
        return SP_CUDA_OK;
    const int NKV = kv_heads(NH, group);
    if (!NKV)
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = SP_STREAM(stream);
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int64_t rows = (int64_t)B * NH * T;
    flash_rowdot_kernel<<<(unsigned)((rows + FA_D_WARPS - 1) / FA_D_WARPS), FA_D_WARPS * 32, 0,
                          s>>>(scratch, dout, out, rows, T, C, NH);
    SP_CUDA_LAUNCHED();
    flash_backward_kv_kernel<<<fa_grid(B, T, NKV, hs), FA_THREADS, 0, s>>>(
        dqkv, dout, qkv, lse, scratch, T, C, NH, group, scale, acc);
    SP_CUDA_LAUNCHED();
    flash_backward_q_kernel<<<fa_grid(B, T, NH, hs), FA_THREADS, 0, s>>>(
        dqkv, dout, qkv, lse, scratch, T, C, NH, group, scale, acc);
    SP_CUDA_LAUNCHED();
    return SP_CUDA_OK;
}

extern "C" int64_t sp_cuda_attention_scratch_floats(int B, int T, int /* C */, int NH,
                                                    int backward)
{
    const int64_t n = backward && B > 0 && T > 0 && NH > 0 ? (int64_t)B * NH * T : 0;
    return n > 0 ? n : 1;
}
