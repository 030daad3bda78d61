/* Kernel benchmark (prints a table; not a test): the MLP fc matmul through
 * sp_matmul_forward (the kernels' own sgemm, gemm.c) next to OpenBLAS's cblas_sgemm, then
 * one GPT-2 block forward + backward composed from the kernels (llm.c-style) with a
 * per-op breakdown, attention alone, and the LM head, all on one thread.
 * Usage: bench_kernels [--quick] [--B n] [--T n] [--C n] [--NH n] [--V n] [--reps n]
 *                      [--path portable|avx2|avx512f]
 * --path: a narrower sgemm path than the CPU's widest (the AVX2 kernels on an AVX-512
 * core, say); same bits on every path. */
#include "codelets/cpu/gemm_impl.h"
#include "codelets/cpu/kernels.h"
#include "codelets/cpu/vec_impl.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hostmem.h"
#include "bench/bench_util.h"

static float *alloc_f(int64_t n, unsigned seed)
{
    /* as the runtime's host buffers are (sp_exec_host_alloc): on a cache line, and from
     * 4 MB on, from a 2 MB boundary on transparent huge pages */
    const size_t bytes = sizeof(float) * (size_t)(n > 0 ? n : 1);
    const size_t align = bytes >= SP_MEM_HUGE_MIN ? SP_MEM_HUGE_PAGE : 64;
    float *p = aligned_alloc(align, (bytes + align - 1) & ~(align - 1));
    if (p) sp_mem_want_huge_pages(p, bytes);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory (%lld floats)\n", (long long)n);
        exit(1);
    }
    uint32_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.2f;
    }
    return p;
}

/* Per-op timing of the block: each kernel call is wrapped in T0/T1. */
enum { OP_LN, OP_MATMUL, OP_BIAS, OP_ATTN, OP_GELU, OP_RESID, OP_COUNT };
static const char *op_name[OP_COUNT] = {"layernorm", "matmul", "bias grad",
                                        "attention", "gelu", "residual/copy"};
static double op_time[OP_COUNT];
/* The least bytes each non-matmul group of the block must move per step (each input read
 * once, each output written once, 4 bytes a float; bias adds run in place), in units of
 * N C floats: the memory-bound ops' ceiling is these bytes at the copy bandwidth.
 *   layernorm: 2 forwards (x in, out: 2 each) 4, 2 backward_x (dln, x in, dx out: 3
 *     each, both adding into dx: + 1 each) 8, 2 backward_params (dln, x in: 2 each) 4 -> 16
 *   bias: the forward rides on the products' stores (matmul_bias, in "matmul"); the
 *     backward reads 3 + 1 + 4 + 1 -> 9
 *   gelu: forward 4 in, 4 out; backward 4 + 4 in, 4 out -> 20
 *   residual/copy: 2 adds (2 in, 1 out) 6, 2 copies (1 in, 1 out) 4 -> 10 */
static const double op_nc_floats[OP_COUNT] = {16, 0, 9, 0, 20, 10};
#define TIMED(op, call)                                                                     \
    do {                                                                                    \
        double t0_ = now();                                                                 \
        call;                                                                               \
        op_time[op] += now() - t0_;                                                         \
    } while (0)

/* The memory-bound ops' own bound: in a "stream" run of the block each of them is replaced
 * by a plain stream of its least bytes over its own buffers (each input read once, each
 * output written once), so the bound meets the caches as the block leaves them, where a
 * separate memcpy finds its buffers warm. The products and attention run as usual. */
static int stream_run;
#define MEMOP(op, call, stream)                                                             \
    do {                                                                                    \
        if (stream_run) TIMED(op, stream);                                                  \
        else TIMED(op, call);                                                               \
    } while (0)
#define COPY(dst, src, n) memcpy(dst, src, sizeof(float) * (size_t)(n))

/* out = a + b (+ c), n floats: an elementwise op's least traffic */
SP_VEC_FN static void stream_add(float *out, const float *a, const float *restrict b,
                                 const float *restrict c, int64_t n)
{
    if (c)
        for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i] + c[i];
    else
        for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
/* out[0] = a sum of a (and b), n floats: a reduction's least traffic (64 lanes, so the
 * adds' latency does not bound it in L1) */
SP_VEC_FN static void stream_read(float *out, const float *restrict a, const float *restrict b,
                                  int64_t n)
{
    float l[64] = { 0 };
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int j = 0; j < 64; j++) l[j] += b ? a[i + j] + b[i + j] : a[i + j];
    for (int j = 1; j < 64; j++) l[0] += l[j];
    for (; i < n; i++) l[0] += a[i] + (b ? b[i] : 0.0f);
    out[0] = l[0];
}

/* The block's products one by one, in call order: each run's time, and the FLOPs of an
 * (m, k) @ (k, n) product. */
enum { MM_COUNT = 12 };
typedef struct {
    const char *name;
    double flops, t;
} product;
static product mm[MM_COUNT];
static int mm_n;
#define TIMED_MM(name, m, n, k, call)                                                       \
    do {                                                                                    \
        const double before_ = op_time[OP_MATMUL];                                          \
        TIMED(OP_MATMUL, call);                                                             \
        if (mm_n < MM_COUNT)                                                                \
            mm[mm_n++] = (product){ name, 2.0 * (m) * (n) * (k), op_time[OP_MATMUL] - before_ }; \
    } while (0)

typedef struct {
    int B, T, C, NH, N;
    /* parameters (weights stored (OC, C) as in llm.c: out = in @ W^T) and their grads */
    float *g1, *b1, *wqkv, *bqkv, *wproj, *bproj, *g2, *b2, *wfc, *bfc, *wfcp, *bfcp;
    float *dg1, *db1, *dwqkv, *dbqkv, *dwproj, *dbproj, *dg2, *db2, *dwfc, *dbfc, *dwfcp,
        *dbfcp;
    /* activations and their grads */
    float *x, *ln1, *m1, *r1, *qkv, *atty, *lse, *proj, *res1, *ln2, *m2, *r2, *fc, *gel,
        *fcp, *res2;
    float *dres2, *dres1, *dx, *dln, *dqkv, *datty, *dfc, *dgel, *scratch;
} block;

static void block_init(block *k, int B, int T, int C, int NH)
{
    int64_t N = (int64_t)B * T, C3 = 3 * (int64_t)C, C4 = 4 * (int64_t)C;
    unsigned s = 1;
    *k = (block){.B = B, .T = T, .C = C, .NH = NH, .N = (int)N};
    k->g1 = alloc_f(C, s++), k->b1 = alloc_f(C, s++), k->g2 = alloc_f(C, s++);
    k->b2 = alloc_f(C, s++);
    k->wqkv = alloc_f(C3 * C, s++), k->bqkv = alloc_f(C3, s++);
    k->wproj = alloc_f((int64_t)C * C, s++), k->bproj = alloc_f(C, s++);
    k->wfc = alloc_f(C4 * C, s++), k->bfc = alloc_f(C4, s++);
    k->wfcp = alloc_f(C * C4, s++), k->bfcp = alloc_f(C, s++);
    k->dg1 = alloc_f(C, s++), k->db1 = alloc_f(C, s++), k->dg2 = alloc_f(C, s++);
    k->db2 = alloc_f(C, s++);
    k->dwqkv = alloc_f(C3 * C, s++), k->dbqkv = alloc_f(C3, s++);
    k->dwproj = alloc_f((int64_t)C * C, s++), k->dbproj = alloc_f(C, s++);
    k->dwfc = alloc_f(C4 * C, s++), k->dbfc = alloc_f(C4, s++);
    k->dwfcp = alloc_f(C * C4, s++), k->dbfcp = alloc_f(C, s++);
    k->x = alloc_f(N * C, s++), k->ln1 = alloc_f(N * C, s++), k->m1 = alloc_f(N, s++);
    k->r1 = alloc_f(N, s++), k->qkv = alloc_f(N * C3, s++), k->atty = alloc_f(N * C, s++);
    k->lse = alloc_f((int64_t)B * NH * T, s++), k->proj = alloc_f(N * C, s++);
    k->res1 = alloc_f(N * C, s++), k->ln2 = alloc_f(N * C, s++), k->m2 = alloc_f(N, s++);
    k->r2 = alloc_f(N, s++), k->fc = alloc_f(N * C4, s++), k->gel = alloc_f(N * C4, s++);
    k->fcp = alloc_f(N * C, s++), k->res2 = alloc_f(N * C, s++);
    k->dres2 = alloc_f(N * C, s++), k->dres1 = alloc_f(N * C, s++), k->dx = alloc_f(N * C, s++);
    k->dln = alloc_f(N * C, s++), k->dqkv = alloc_f(N * C3, s++);
    k->datty = alloc_f(N * C, s++), k->dfc = alloc_f(N * C4, s++);
    k->dgel = alloc_f(N * C4, s++);
    k->scratch = alloc_f(sp_attention_scratch_floats(B, T, C, NH), s++);
}

/* One block forward then backward; parameter grads accumulate (acc=1), activation
 * grads are assigned on their first contribution (acc=0), as the executor will do. */
static void block_step(block *k)
{
    const int B = k->B, T = k->T, C = k->C, NH = k->NH, N = k->N, C3 = 3 * C, C4 = 4 * C;
    const int64_t NC = (int64_t)N * C, NC4 = (int64_t)N * C4;
    /* forward */
    MEMOP(OP_LN, sp_layernorm_forward(k->ln1, k->m1, k->r1, k->x, k->g1, k->b1, N, C),
          COPY(k->ln1, k->x, NC));
    /* each linear layer's forward is one product with its bias (the programs' matmul_bias) */
    TIMED_MM("qkv forward", N, C3, C,
             sp_matmul_forward_bias(k->qkv, k->ln1, k->wqkv, k->bqkv, N, C3, C, 0, 1));
    TIMED(OP_ATTN, sp_attention_forward(k->atty, k->lse, k->scratch, k->qkv, B, T, C, NH));
    TIMED_MM("attn proj forward", N, C, C,
             sp_matmul_forward_bias(k->proj, k->atty, k->wproj, k->bproj, N, C, C, 0, 1));
    MEMOP(OP_RESID, sp_add_forward(k->res1, k->x, k->proj, NC),
          stream_add(k->res1, k->x, k->proj, NULL, NC));
    MEMOP(OP_LN, sp_layernorm_forward(k->ln2, k->m2, k->r2, k->res1, k->g2, k->b2, N, C),
          COPY(k->ln2, k->res1, NC));
    TIMED_MM("fc forward", N, C4, C,
             sp_matmul_forward_bias(k->fc, k->ln2, k->wfc, k->bfc, N, C4, C, 0, 1));
    MEMOP(OP_GELU, sp_gelu_forward(k->gel, k->fc, NC4), COPY(k->gel, k->fc, NC4));
    TIMED_MM("fc proj forward", N, C, C4,
             sp_matmul_forward_bias(k->fcp, k->gel, k->wfcp, k->bfcp, N, C, C4, 0, 1));
    MEMOP(OP_RESID, sp_add_forward(k->res2, k->res1, k->fcp, NC),
          stream_add(k->res2, k->res1, k->fcp, NULL, NC));
    /* backward, from dres2 */
    MEMOP(OP_RESID, sp_scale_backward(k->dres1, k->dres2, 1.0f, NC, 0),
          COPY(k->dres1, k->dres2, NC));
    TIMED_MM("fc proj dW", N, C, C4,
             sp_matmul_backward_b(k->dwfcp, k->dres2, k->gel, N, C, C4, 0, 1, 1));
    MEMOP(OP_BIAS, sp_bias_add_backward_bias(k->dbfcp, k->dres2, N, C, 1),
          stream_read(k->dbfcp, k->dres2, NULL, NC));
    TIMED_MM("fc proj dx", N, C, C4,
             sp_matmul_backward_a(k->dgel, k->dres2, k->wfcp, N, C, C4, 0, 1, 0));
    MEMOP(OP_GELU, sp_gelu_backward(k->dfc, k->fc, k->dgel, NC4, 0),
          stream_add(k->dfc, k->fc, k->dgel, NULL, NC4));
    TIMED_MM("fc dW", N, C4, C,
             sp_matmul_backward_b(k->dwfc, k->dfc, k->ln2, N, C4, C, 0, 1, 1));
    MEMOP(OP_BIAS, sp_bias_add_backward_bias(k->dbfc, k->dfc, N, C4, 1),
          stream_read(k->dbfc, k->dfc, NULL, NC4));
    TIMED_MM("fc dx", N, C4, C,
             sp_matmul_backward_a(k->dln, k->dfc, k->wfc, N, C4, C, 0, 1, 0));
    MEMOP(OP_LN, sp_layernorm_backward_x(k->dres1, k->dln, k->res1, k->m2, k->r2, k->g2, N,
                                         C, 1),
          stream_add(k->dres1, k->dres1, k->dln, k->res1, NC));
    MEMOP(OP_LN, sp_layernorm_backward_params(k->dg2, k->db2, k->dln, k->res1, k->m2, k->r2,
                                              N, C, 1),
          stream_read(k->dg2, k->dln, k->res1, NC));
    TIMED_MM("attn proj dW", N, C, C,
             sp_matmul_backward_b(k->dwproj, k->dres1, k->atty, N, C, C, 0, 1, 1));
    MEMOP(OP_BIAS, sp_bias_add_backward_bias(k->dbproj, k->dres1, N, C, 1),
          stream_read(k->dbproj, k->dres1, NULL, NC));
    TIMED_MM("attn proj dx", N, C, C,
             sp_matmul_backward_a(k->datty, k->dres1, k->wproj, N, C, C, 0, 1, 0));
    TIMED(OP_ATTN, sp_attention_backward(k->dqkv, k->scratch, k->datty, k->qkv, k->atty,
                                         k->lse, B, T, C, NH, 0));
    TIMED_MM("qkv dW", N, C3, C,
             sp_matmul_backward_b(k->dwqkv, k->dqkv, k->ln1, N, C3, C, 0, 1, 1));
    MEMOP(OP_BIAS, sp_bias_add_backward_bias(k->dbqkv, k->dqkv, N, C3, 1),
          stream_read(k->dbqkv, k->dqkv, NULL, (int64_t)N * C3));
    TIMED_MM("qkv dx", N, C3, C,
             sp_matmul_backward_a(k->dln, k->dqkv, k->wqkv, N, C3, C, 0, 1, 0));
    MEMOP(OP_RESID, sp_scale_backward(k->dx, k->dres1, 1.0f, NC, 0), COPY(k->dx, k->dres1, NC));
    MEMOP(OP_LN, sp_layernorm_backward_x(k->dx, k->dln, k->x, k->m1, k->r1, k->g1, N, C, 1),
          stream_add(k->dx, k->dx, k->dln, k->x, NC));
    MEMOP(OP_LN, sp_layernorm_backward_params(k->dg1, k->db1, k->dln, k->x, k->m1, k->r1, N,
                                              C, 1),
          stream_read(k->dg1, k->dln, k->x, NC));
}

/* The block's twelve products alone, same shapes and transposes, on OpenBLAS. */
static void block_sgemm_only(block *k)
{
    const int N = k->N, C = k->C;
    const int oc[4] = {3 * C, C, 4 * C, C}, ic[4] = {C, C, C, 4 * C};
    float *in[4] = {k->ln1, k->atty, k->ln2, k->gel}, *w[4] = {k->wqkv, k->wproj, k->wfc, k->wfcp};
    float *out[4] = {k->qkv, k->proj, k->fc, k->fcp}, *dw[4] = {k->dwqkv, k->dwproj, k->dwfc,
                                                                k->dwfcp};
    float *dout[4] = {k->dqkv, k->dres1, k->dfc, k->dres2}, *din[4] = {k->dln, k->datty, k->dln,
                                                                         k->dgel};
    for (int i = 0; i < 4; i++) {
        /* out (N,oc) = in (N,ic) @ w^T; dw (oc,ic) += dout^T @ in; din (N,ic) = dout @ w */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, oc[i], ic[i], 1.0f, in[i], ic[i],
                    w[i], ic[i], 0.0f, out[i], oc[i]);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, oc[i], ic[i], N, 1.0f, dout[i],
                    oc[i], in[i], ic[i], 1.0f, dw[i], ic[i]);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, ic[i], oc[i], 1.0f, dout[i],
                    oc[i], w[i], ic[i], 0.0f, din[i], ic[i]);
    }
}

static int arg_int(int argc, char **argv, int *i, const char *name, int *v)
{
    if (strcmp(argv[*i], name) != 0)
        return 0;
    if (*i + 1 >= argc || (*v = atoi(argv[*i + 1])) <= 0) {
        fprintf(stderr, "bench_kernels: %s needs a positive integer\n", name);
        exit(2);
    }
    (*i)++;
    return 1;
}

/* --path NAME: that sgemm path, or a message and exit 2 where this CPU or build lacks it */
static int arg_path(int argc, char **argv, int *i)
{
    if (strcmp(argv[*i], "--path") != 0)
        return 0;
    const char *name = *i + 1 < argc ? argv[++*i] : "";
    for (int p = 0; p < SP_GEMM_NPATHS; p++)
        if (!strcmp(name, sp_gemm_path_name(p))) {
            if (sp_gemm_set_path(p) == 0)
                return 1;
            fprintf(stderr, "bench_kernels: --path %s: this CPU or build lacks it\n", name);
            exit(2);
        }
    fprintf(stderr, "bench_kernels: --path '%s' is not one of", name);
    for (int p = 0; p < SP_GEMM_NPATHS; p++) fprintf(stderr, " %s", sp_gemm_path_name(p));
    fprintf(stderr, "\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int B = 8, T = 256, C = 512, NH = 8, V = 256, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            B = 2, T = 64, C = 128, NH = 4, V = 256, reps = 2;
        } else if (!(arg_path(argc, argv, &i) || arg_int(argc, argv, &i, "--B", &B) ||
                     arg_int(argc, argv, &i, "--T", &T) || arg_int(argc, argv, &i, "--C", &C) ||
                     arg_int(argc, argv, &i, "--NH", &NH) || arg_int(argc, argv, &i, "--V", &V) ||
                     arg_int(argc, argv, &i, "--reps", &reps))) {
            fprintf(stderr, "usage: %s [--quick] [--B n] [--T n] [--C n] [--NH n] [--V n] "
                            "[--reps n] [--path portable|avx2|avx512f]\n", argv[0]);
            return 2;
        }
    }
    if (C % NH) {
        fprintf(stderr, "bench_kernels: C (%d) must be divisible by NH (%d)\n", C, NH);
        return 2;
    }
    sp_kernels_init(); /* one thread: the numbers are per core */
    const int N = B * T;
    printf("bench_kernels: B=%d T=%d C=%d NH=%d V=%d (N=B*T=%d), 1 thread, best of %d\n", B, T,
           C, NH, V, N, reps);
    /* The kernels' sgemm path (from the CPU; same bits on every path); OpenBLAS, for
     * comparison, picks its kernels from the CPU model, and on an unknown (virtual) one
     * falls back to an SSE3 core several times slower: say which ran. */
    printf("sgemm path: %s; OpenBLAS core (comparison only): %s (OPENBLAS_CORETYPE=...)\n",
           sp_gemm_path_name(sp_gemm_path()), openblas_get_corename());
    /* the hardware's ceiling, as MFU counts it (codelets/cpu/peak.c): each rate's share */
    char how[160];
    const double peak = sp_cpu_fma_peak(0.2, how, sizeof how) * 1e-9;
    printf("core peak: %.1f GFLOP/s, %s; '%% peak' columns are shares of it\n", peak, how);

    /* 1. The largest matmul, the MLP fc: (N,C) @ (C,4C), weights stored (4C,C). */
    {
        float *a = alloc_f((int64_t)N * C, 1), *w = alloc_f(4 * (int64_t)C * C, 2);
        float *o = alloc_f((int64_t)N * 4 * C, 3);
        double fl = 2.0 * N * C * 4.0 * C, best_sp = 1e30, best_raw = 1e30;
        for (int r = 0; r < reps + 1; r++) { /* the first run warms caches and buffers */
            double t0 = now();
            sp_matmul_forward(o, a, w, N, 4 * C, C, 0, 1, 0);
            double t1 = now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, 4 * C, C, 1.0f, a, C, w, C,
                        0.0f, o, 4 * C);
            double t2 = now();
            if (r) {
                best_sp = t1 - t0 < best_sp ? t1 - t0 : best_sp;
                best_raw = t2 - t1 < best_raw ? t2 - t1 : best_raw;
            }
        }
        printf("\nMLP fc matmul (%d x %d) @ (%d x %d), %.2f GFLOP\n", N, C, C, 4 * C, fl * 1e-9);
        printf("  %-28s %10s %10s %8s\n", "", "ms", "GFLOP/s", "% peak");
        printf("  %-28s %10.2f %10.1f %8.1f\n", "sp_matmul_forward", best_sp * 1e3,
               fl / best_sp * 1e-9, 100 * fl / best_sp * 1e-9 / peak);
        printf("  %-28s %10.2f %10.1f %8.1f\n", "cblas_sgemm (OpenBLAS)", best_raw * 1e3,
               fl / best_raw * 1e-9, 100 * fl / best_raw * 1e-9 / peak);
        free(a), free(w), free(o);
    }

    /* 2. One block forward + backward. FLOPs: matmuls 3 x 2 N (3C C + C C + 4C C + 4C C);
     * attention: forward 4 C per (t, t2 <= t) pair and batch (QK^T, AV), backward 8 C. */
    {
        block k;
        block_init(&k, B, T, C, NH);
        double pairs = (double)B * T * (T + 1) / 2.0;
        double fl_mm = 6.0 * N * 12.0 * C * C, fl_att = 12.0 * C * pairs;
        double best = 1e30, best_gemm = 1e30, best_ops[OP_COUNT], best_mm[MM_COUNT];
        for (int i = 0; i < MM_COUNT; i++) best_mm[i] = 1e30;
        for (int r = 0; r < reps + 1; r++) {
            memset(op_time, 0, sizeof op_time);
            mm_n = 0;
            double t0 = now();
            block_step(&k);
            double t1 = now();
            for (int i = 0; r && i < mm_n; i++)
                if (mm[i].t < best_mm[i]) best_mm[i] = mm[i].t;
            block_sgemm_only(&k);
            double t2 = now();
            if (r && t1 - t0 < best) {
                best = t1 - t0;
                memcpy(best_ops, op_time, sizeof op_time);
            }
            if (r && t2 - t1 < best_gemm)
                best_gemm = t2 - t1;
        }
        printf("\nGPT-2 block forward+backward: %.2f GFLOP in matmuls + %.2f in attention\n",
               fl_mm * 1e-9, fl_att * 1e-9);
        printf("  %-28s %10s %10s %8s %8s\n", "", "ms", "GFLOP/s", "% block", "% peak");
        printf("  %-28s %10.2f %10.1f %8s %8.1f\n", "whole block (kernels)", best * 1e3,
               (fl_mm + fl_att) / best * 1e-9, "100.0",
               100 * (fl_mm + fl_att) / best * 1e-9 / peak);
        for (int i = 0; i < OP_COUNT; i++) {
            double f = i == OP_MATMUL ? fl_mm : i == OP_ATTN ? fl_att : 0.0;
            char g[16] = "-", q[16] = "-";
            if (f > 0) {
                snprintf(g, sizeof g, "%.1f", f / best_ops[i] * 1e-9);
                snprintf(q, sizeof q, "%.1f", 100 * f / best_ops[i] * 1e-9 / peak);
            }
            printf("    %-26s %10.2f %10s %8.1f %8s\n", op_name[i], best_ops[i] * 1e3, g,
                   100.0 * best_ops[i] / best, q);
        }
        printf("  %-28s %10.2f %10.1f\n", "same matmuls, OpenBLAS", best_gemm * 1e3,
               fl_mm / best_gemm * 1e-9);
        printf("  outside matmul: %.1f%% of the block's time\n",
               100.0 * (best - best_ops[OP_MATMUL]) / best);
        /* Each product at its best run: on a shared core a burst of noise then spoils one
         * product's time, not the whole block's (the rates above are of one run). */
        printf("\n  the block's products, each the best of %d runs\n", reps);
        printf("  %-28s %10s %10s %8s\n", "", "ms", "GFLOP/s", "% peak");
        double t_all = 0, f_all = 0;
        for (int i = 0; i < mm_n; i++) {
            printf("    %-26s %10.2f %10.1f %8.1f\n", mm[i].name, best_mm[i] * 1e3,
                   mm[i].flops / best_mm[i] * 1e-9, 100 * mm[i].flops / best_mm[i] * 1e-9 / peak);
            t_all += best_mm[i], f_all += mm[i].flops;
        }
        printf("    %-26s %10.2f %10.1f %8.1f\n", "all twelve", t_all * 1e3, f_all / t_all * 1e-9,
               100 * f_all / t_all * 1e-9 / peak);
        /* The memory-bound ops against this core's copy bandwidth at the block's sizes (a
         * memcpy of 4 N C floats, best of reps): how far each is from it (issue 41). */
        const int64_t nc = (int64_t)N * C, nbuf = 4 * nc;
        float *src = alloc_f(nbuf, 90), *dst = alloc_f(nbuf, 91);
        double bcopy = 1e30;
        for (int r = 0; r < reps + 2; r++) {
            double t0 = now();
            memcpy(dst, src, sizeof(float) * (size_t)nbuf);
            double dt = now() - t0;
            if (r && dt < bcopy) bcopy = dt;
        }
        const double copy_gbs = 2.0 * sizeof(float) * (double)nbuf / bcopy * 1e-9;
        /* Each op against its own stream (stream_run above): block runs and stream runs
         * alternated, each op at its best run of each kind. */
        double op_best[2][OP_COUNT];
        for (int i = 0; i < 2 * OP_COUNT; i++) op_best[i / OP_COUNT][i % OP_COUNT] = 1e30;
        for (int r = 0; r < 2 * (reps + 1); r++) {
            memset(op_time, 0, sizeof op_time);
            mm_n = MM_COUNT; /* the products' times are kept from the runs above */
            stream_run = r % 2;
            block_step(&k);
            for (int i = 0; r >= 2 && i < OP_COUNT; i++)
                if (op_time[i] < op_best[stream_run][i]) op_best[stream_run][i] = op_time[i];
        }
        stream_run = 0;
        printf("\n  memory-bound ops: their least bytes against a memcpy of %.1f MB (%.1f GB/s "
               "read + write),\n  and against the same bytes streamed over their own buffers "
               "in the block (best of %d runs each)\n", sizeof(float) * (double)nbuf * 1e-6,
               copy_gbs, reps);
        printf("    %-26s %10s %10s %10s %8s %10s %8s\n", "", "ms", "least MB", "GB/s", "% copy",
               "stream ms", "% stream");
        for (int i = 0; i < OP_COUNT; i++) {
            if (op_nc_floats[i] <= 0) continue;
            const double bytes = op_nc_floats[i] * (double)nc * sizeof(float);
            const double t = op_best[0][i], ts = op_best[1][i];
            printf("    %-26s %10.3f %10.1f %10.1f %8.1f %10.3f %8.1f\n", op_name[i], t * 1e3,
                   bytes * 1e-6, bytes / t * 1e-9, 100.0 * bytes / t * 1e-9 / copy_gbs, ts * 1e3,
                   100.0 * ts / t);
        }
        free(src), free(dst);
    }

    /* 3. Attention alone, warm (the same inputs again and again, best of 20 x reps): the
     * kernel's own speed, apart from what the block's other ops leave in the caches. */
    {
        const int64_t n3 = (int64_t)N * 3 * C, nc = (int64_t)N * C;
        float *qkv = alloc_f(n3, 13), *out = alloc_f(nc, 14), *dout = alloc_f(nc, 15);
        float *dqkv = alloc_f(n3, 16), *lse = alloc_f((int64_t)B * NH * T, 17);
        float *scr = alloc_f(sp_attention_scratch_floats(B, T, C, NH), 18);
        const double pairs = (double)B * T * (T + 1) / 2.0;
        double bf = 1e30, bb = 1e30;
        for (int r = 0; r < 20 * reps + 1; r++) {
            double t0 = now();
            sp_attention_forward(out, lse, scr, qkv, B, T, C, NH);
            double t1 = now();
            sp_attention_backward(dqkv, scr, dout, qkv, out, lse, B, T, C, NH, 0);
            double t2 = now();
            if (r) {
                bf = t1 - t0 < bf ? t1 - t0 : bf;
                bb = t2 - t1 < bb ? t2 - t1 : bb;
            }
        }
        printf("\nattention alone, warm (best of %d; FLOPs as above: forward 4 C, backward 8 C "
               "per pair)\n", 20 * reps);
        printf("  %-28s %10s %10s %8s\n", "", "us", "GFLOP/s", "% peak");
        printf("  %-28s %10.1f %10.1f %8.1f\n", "forward", bf * 1e6, 4 * C * pairs / bf * 1e-9,
               100 * 4 * C * pairs / bf * 1e-9 / peak);
        printf("  %-28s %10.1f %10.1f %8.1f\n", "backward", bb * 1e6, 8 * C * pairs / bb * 1e-9,
               100 * 8 * C * pairs / bb * 1e-9 / peak);
        free(qkv), free(out), free(dout), free(dqkv), free(lse), free(scr);
    }

    /* 4. LM head: logits (N,V) = x (N,C) @ wte^T, cross-entropy forward and backward. */
    {
        float *x = alloc_f((int64_t)N * C, 7), *wte = alloc_f((int64_t)V * C, 8);
        float *lg = alloc_f((int64_t)N * V, 9), *pr = alloc_f((int64_t)N * V, 10);
        float *dx = alloc_f((int64_t)N * C, 11), *dw = alloc_f((int64_t)V * C, 12), loss;
        int32_t *tg = malloc(sizeof(int32_t) * (size_t)N);
        if (!tg)
            return 1;
        for (int i = 0; i < N; i++)
            tg[i] = (int32_t)((i * 7919u) % (unsigned)V);
        double fl = 3 * 2.0 * N * C * V, best = 1e30, best_ce = 1e30;
        for (int r = 0; r < reps + 1; r++) {
            double t0 = now();
            sp_matmul_forward(lg, x, wte, N, V, C, 0, 1, 0);
            double t1 = now();
            sp_cross_entropy_forward(&loss, pr, lg, tg, N, V, V);
            sp_cross_entropy_backward(lg, pr, tg, 1.0f, N, V, 0);
            double t2 = now();
            sp_matmul_backward_a(dx, lg, wte, N, V, C, 0, 1, 0);
            sp_matmul_backward_b(dw, lg, x, N, V, C, 0, 1, 1);
            double t3 = now();
            if (r && (t3 - t0) < best)
                best = t3 - t0, best_ce = t2 - t1;
        }
        printf("\nLM head (N,C) @ (C,V) + cross-entropy, forward+backward (%.2f GFLOP)\n",
               fl * 1e-9);
        printf("  %-28s %10.2f %10.1f\n", "total", best * 1e3, fl / best * 1e-9);
        printf("    %-26s %10.2f %10s %8.1f\n", "cross-entropy fwd+bwd", best_ce * 1e3, "-",
               100.0 * best_ce / best);
        free(x), free(wte), free(lg), free(pr), free(dx), free(dw), free(tg);
    }
    return 0;
}
