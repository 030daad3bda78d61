/* The CUDA kernels (codelets/cuda) where their table does not reach, and their rates. Every
 * entry of the table (codelets/cuda/backend.c) is compared with the CPU table, through the
 * table, by tests/backend/test_backend_ops.c (tests/gpu/emu: gpu_emu.backend_ops); here
 * remains what is the kernels' own: the arguments they refuse, where no CPU twin checks
 * (through the table where it has the entry), what the table keeps to itself (the
 * cross-entropy's count of bad targets and the gradient's upstream multiplier, the token
 * check, scale_forward, the bf16 attention's widest head), and at size S (`--rate-size S`,
 * 4096; tests/gpu/emu, on a CPU, runs 256) the fp32 sgemm, TF32 off and on, and attention at
 * T = S/2, C = S, each giving the same bits twice, with their rates. Each GPU call runs twice
 * from the same state and must give the same bits. Exits 77 (skipped) without a CUDA
 * device, 1 when any check failed.
 *
 * Tolerance: max|gpu - cpu| / max(1, max|cpu|) <= 1e-5 (TF32 off), as test_backend_ops
 * holds the same kernels to; 1e-2 with TF32 on (a 10-bit mantissa). */
#include "codelets/cpu/kernels.h"
#include "codelets/cuda/backend.h"
#include "codelets/cuda/kernels_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-5
#define SKIP 77

static int n_pass, n_fail, verbose;
static cudaStream_t stream;
static cublasHandle_t blas;
static sp_cuda_ctx cx; /* the table's state: stream and blas */

/* ---- setup failures end the test: they are not kernel results */
#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "FAIL: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(e_));                                                  \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static void *halloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "FAIL: out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}
static void *dalloc(size_t bytes)
{
    void *p = NULL;
    CK(cudaMalloc(&p, bytes ? bytes : 4));
    return p;
}
static void dfree(void *d) { CK(cudaFree(d)); }
static void up(void *d, const void *h, size_t bytes)
{
    CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream));
    CK(cudaStreamSynchronize(stream));
}
static void down(void *h, const void *d, size_t bytes)
{
    CK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
}

/* ---- random inputs: xorshift64*, uniform in [lo, hi) */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}
static float unif(double lo, double hi)
{
    return (float)(lo + (hi - lo) * (double)(next_u64() >> 11) * 0x1.0p-53);
}
static float *hrand(int64_t n, double lo, double hi)
{
    float *x = halloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        x[i] = unif(lo, hi);
    return x;
}
static float *dcopy(const float *h, int64_t n)
{
    float *d = dalloc(sizeof(float) * (size_t)n);
    up(d, h, sizeof(float) * (size_t)n);
    return d;
}
static int32_t *dcopy_i(const int32_t *h, int64_t n)
{
    int32_t *d = dalloc(sizeof(int32_t) * (size_t)n);
    up(d, h, sizeof(int32_t) * (size_t)n);
    return d;
}

/* ---- results */
static void expect(int ok, const char *label, const char *what)
{
    if (ok) {
        n_pass++;
        if (verbose)
            printf("  ok   %s: %s\n", label, what);
    } else {
        n_fail++;
        printf("FAIL: %s: %s\n", label, what);
    }
}

/* max|got - want| / max(1, max|want|); NaN anywhere gives NaN (never passes). */
static double rel_err(const float *got, const float *want, int64_t n)
{
    double e = 0.0, m = 1.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= e))
            e = d;
        if (fabs((double)want[i]) > m)
            m = fabs((double)want[i]);
    }
    return e / m;
}

static void check_close(const char *label, const float *got, const float *want, int64_t n,
                        double tol)
{
    double e = rel_err(got, want, n);
    char what[96];
    snprintf(what, sizeof what, "vs CPU: err %.3g (tol %.0e)", e, tol);
    expect(e <= tol, label, what);
}

static void kstat(const char *label, int rc)
{
    if (rc != SP_CUDA_OK) {
        char what[160];
        snprintf(what, sizeof what, "returned %d (%s)", rc, sp_cuda_status_string(rc));
        expect(0, label, what);
    }
}

/* ---- an output buffer: its initial contents (random when acc, NaN when the op assigns:
 * acc = 0 must not read it), the CPU result, and the two GPU results. */
typedef struct {
    int64_t n;
    float *init, *cpu, *g[2], *d;
} obuf;

static void ob_make(obuf *o, int64_t n, int random_init)
{
    o->n = n;
    o->init = random_init ? hrand(n, -1, 1) : halloc(sizeof(float) * (size_t)n);
    if (!random_init)
        for (int64_t i = 0; i < n; i++)
            o->init[i] = NAN;
    o->cpu = halloc(sizeof(float) * (size_t)n);
    memcpy(o->cpu, o->init, sizeof(float) * (size_t)n);
    o->g[0] = halloc(sizeof(float) * (size_t)n);
    o->g[1] = halloc(sizeof(float) * (size_t)n);
    o->d = dalloc(sizeof(float) * (size_t)n);
}
static void ob_reset(obuf *o) { up(o->d, o->init, sizeof(float) * (size_t)o->n); }
static void ob_fetch(obuf *o, int rep) { down(o->g[rep], o->d, sizeof(float) * (size_t)o->n); }
static void ob_check(obuf *o, const char *label, double tol)
{
    check_close(label, o->g[0], o->cpu, o->n, tol);
    expect(!memcmp(o->g[0], o->g[1], sizeof(float) * (size_t)o->n), label,
           "two GPU runs give identical bits");
}
static void ob_free(obuf *o)
{
    free(o->init);
    free(o->cpu);
    free(o->g[0]);
    free(o->g[1]);
    dfree(o->d);
}

/* Runs a GPU call twice, each time from the initial outputs, fetching both results. */
#define TWICE(label, call, ...)                                                               \
    do {                                                                                      \
        obuf *os_[] = {__VA_ARGS__};                                                          \
        for (int rep_ = 0; rep_ < 2; rep_++) {                                                \
            for (size_t k_ = 0; k_ < sizeof os_ / sizeof *os_; k_++)                          \
                ob_reset(os_[k_]);                                                            \
            kstat(label, (call));                                                             \
            CK(cudaStreamSynchronize(stream));                                                \
            for (size_t k_ = 0; k_ < sizeof os_ / sizeof *os_; k_++)                          \
                ob_fetch(os_[k_], rep_);                                                      \
        }                                                                                     \
    } while (0)


/* ------------------------------------------------------------------ no table entry */
/* scale_forward, which no entry runs (the table's scale is sp_cuda_scale_backward) */
static void test_scale_forward(void)
{
    static const int64_t sizes[] = {7, 37, 1048579};
    char L[128];
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const int64_t n = sizes[s];
        float *a = hrand(n, -6, 6), *da_ = dcopy(a, n);
        obuf o;
        snprintf(L, sizeof L, "scale_forward n=%lld", (long long)n);
        ob_make(&o, n, 0);
        sp_scale_forward(o.cpu, a, 0.37f, n);
        TWICE(L, sp_cuda_scale_forward(o.d, da_, 0.37f, n, stream), &o);
        ob_check(&o, L, TOL);
        ob_free(&o);
        free(a);
        dfree(da_);
    }
}

/* The token check (the table's embed leaves it to the host, sp_program_check_inputs):
 * none bad, then three bad (below 0, V, beyond) when room. */
static void test_embed_check_tokens(void)
{
    static const int sz[][3] = {{3, 5, 7}, {2, 64, 13}, {4, 37, 1000}, {1, 1, 1}};
    char L[128];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int B = sz[s][0], T = sz[s][1], V = sz[s][2];
        const int64_t BT = (int64_t)B * T;
        int32_t *tok = halloc(sizeof(int32_t) * (size_t)BT);
        for (int64_t i = 0; i < BT; i++)
            tok[i] = (int32_t)(next_u64() % (uint64_t)V);
        int32_t *dtok = dcopy_i(tok, BT);
        int *dbad = dalloc(sizeof(int)), bad = -1;
        snprintf(L, sizeof L, "embed_check_tokens B=%d T=%d V=%d", B, T, V);
        kstat(L, sp_cuda_embed_check_tokens(dbad, dtok, BT, V, stream));
        down(&bad, dbad, sizeof bad);
        expect(bad == 0, L, "no token out of range");
        if (BT >= 3) {
            tok[0] = -1, tok[BT / 2] = V, tok[BT - 1] = V + 5;
            up(dtok, tok, sizeof(int32_t) * (size_t)BT);
            kstat(L, sp_cuda_embed_check_tokens(dbad, dtok, BT, V, stream));
            down(&bad, dbad, sizeof bad);
            expect(bad == 3, L, "counts 3 tokens out of range");
        }
        free(tok);
        dfree(dtok), dfree(dbad);
    }
}

/* The cross-entropy's count of bad targets, which the table leaves in its scratch, against
 * the CPU's; and the gradient's upstream multiplier, which the table always passes as 1. */
static void test_cross_entropy_extras(void)
{
    static const int sz[][2] = {{7, 13}, {37, 33}, {5, 1000}, {64, 50257}, {3, 1}};
    char L[128];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++)
        for (int with_bad = 0; with_bad < 2; with_bad++) {
            const int N = sz[s][0], V = sz[s][1];
            const int64_t n = (int64_t)N * V;
            float *logits = hrand(n, -4, 4), *probs = halloc(sizeof(float) * (size_t)n), loss;
            int32_t *tg = halloc(sizeof(int32_t) * (size_t)N);
            for (int i = 0; i < N; i++)
                tg[i] = (int32_t)(next_u64() % (uint64_t)V);
            if (with_bad)
                tg[0] = -3, tg[N - 1] = V;
            float *dl = dcopy(logits, n), *dloss_ = dalloc(sizeof(float));
            float *dprobs = dalloc(sizeof(float) * (size_t)n);
            int32_t *dtg = dcopy_i(tg, N);
            void *scr = dalloc((size_t)sp_cuda_cross_entropy_scratch_bytes(N));
            int *dbad = dalloc(sizeof(int));
            int cbad = sp_cross_entropy_forward(&loss, probs, logits, tg, N, V, V), gbad[2] = {-1, -1};
            snprintf(L, sizeof L, "cross_entropy_forward N=%d V=%d bad=%d", N, V, cbad);
            for (int rep = 0; rep < 2; rep++) {
                kstat(L, sp_cuda_cross_entropy_forward(dloss_, dprobs, dl, dtg, N, V, V, dbad, scr,
                                                       stream));
                down(&gbad[rep], dbad, sizeof(int));
            }
            expect(gbad[0] == cbad && gbad[1] == cbad, L, "same count of bad targets as the CPU");

            up(dprobs, probs, sizeof(float) * (size_t)n); /* the CPU's probabilities */
            const float dloss = 0.73f, mult = 2.5f;
            float *ddl = dcopy(&dloss, 1);
            for (int acc = 0; acc < 2; acc++) {
                obuf g;
                snprintf(L, sizeof L, "cross_entropy_backward N=%d V=%d bad=%d acc=%d mult=%g", N,
                         V, cbad, acc, mult);
                ob_make(&g, n, acc);
                sp_cross_entropy_backward(g.cpu, probs, tg, mult * dloss, N, V, acc);
                TWICE(L, sp_cuda_cross_entropy_backward(g.d, dprobs, dtg, ddl, mult, N, V, acc,
                                                        stream), &g);
                ob_check(&g, L, TOL);
                ob_free(&g);
            }
            free(logits), free(probs), free(tg);
            dfree(dl), dfree(dloss_), dfree(dprobs), dfree(dtg), dfree(scr), dfree(dbad);
            dfree(ddl);
        }
}

/* ------------------------------------------------------------------ refusals */
/* What the kernels refuse, where the CPU's kernels take the caller's word: through the
 * table, a group that does not divide NH (and a negative one) in both directions, fp32 and
 * bf16; rope's period 0 and odd head; a matmul without a cuBLAS handle. With no entry (the
 * table runs wider heads on the fp32 kernels): the bf16 kernels' head of 200 columns.
 * status_string names CUDA and cuBLAS codes. */
static void test_refusals(void)
{
    const sp_backend *be = sp_backend_cuda();
    float *x = dalloc(sizeof(float) * 4096);
    static const int bad[][2] = {{4, 3}, {6, 4}, {4, -1}}; /* {NH, group} */
    char L[128];
    for (int prec = 0; prec <= SP_PREC_BF16; prec += SP_PREC_BF16)
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            const int NH = bad[i][0], G = bad[i][1];
            snprintf(L, sizeof L, "attention%s NH=%d G=%d", prec ? "_bf16" : "", NH, G);
            const int rf = be->attention(&cx, x, x, x, x, 1, 3, 8 * NH, NH, G, prec);
            const int rb = be->attention_dx(&cx, x, x, x, x, x, x, 1, 3, 8 * NH, NH, G, 0, prec);
            expect(rf == (int)cudaErrorInvalidValue && rb == (int)cudaErrorInvalidValue, L,
                   "refused with cudaErrorInvalidValue, forward and backward");
        }
    for (int G = 0; G <= 2; G += 2) {
        const int rc = sp_cuda_attention_forward_bf16(x, x, x, x, 1, 1, 400, 2, G, stream, blas);
        expect(rc == (int)cudaErrorInvalidValue,
               G ? "attention_forward_bf16 C=400 NH=2 G=2" : "attention_forward_bf16 C=400 NH=2",
               "a head of 200 columns is refused with cudaErrorInvalidValue");
    }
    expect(be->rope(&cx, x, x, 1, 2, 32, 16, 0, 0, 10000.0f, 0, 0) == (int)cudaErrorInvalidValue &&
               be->rope(&cx, x, x, 1, 2, 30, 15, 1, 1, 10000.0f, 0, 0) ==
                   (int)cudaErrorInvalidValue,
           "rope(period 0, hs 15)", "refused with cudaErrorInvalidValue");
    sp_cuda_ctx no_blas = {stream, NULL};
    expect(be->matmul(&no_blas, x, x, x, 1, 1, 1, 0, 0, 0, 0) == SP_CUDA_ERR_ARG,
           "matmul(NULL handle)", "returns SP_CUDA_ERR_ARG");
    expect(be->status_string(SP_CUDA_ERR_CUBLAS_BASE + 13) != NULL &&
               be->status_string(1) != NULL,
           "status_string", "names CUDA and cuBLAS errors");
    CK(cudaStreamSynchronize(stream));
    dfree(x);
}

/* ------------------------------------------------------------------ sum of squares */
/* The gradient norm's sum of squares (optim.cu), spread over the device: the bits of the
 * order optim.cu documents, formed here on the host (chunks of sp_cuda_sum_squares_chunk,
 * lane t's four fma chains, the block tree of common.cuh's sp_block_sum), within 1e-12 of
 * a long double sum, the same bits twice; under the emulation, the grid it launched
 * (sp_emu_last_grid, absent on a GPU: a weak symbol); on a GPU, its rate at 64M floats
 * against a floor of 1 TB/s (a one-block sum gave ~10-15 GB/s). */
long long sp_emu_last_grid(const char *kernel) __attribute__((weak));

static double tree_sum(const double *lane, int nlanes) /* sp_block_sum's order */
{
    double warp[32], sh[32];
    int nw = (nlanes + 31) / 32;
    for (int w = 0; w < nw; w++) {
        for (int l = 0; l < 32; l++)
            warp[l] = lane[32 * w + l];
        for (int o = 16; o > 0; o >>= 1) {
            double nx[32];
            for (int l = 0; l < 32; l++)
                nx[l] = warp[l] + warp[l ^ o];
            memcpy(warp, nx, sizeof warp);
        }
        sh[w] = warp[0];
    }
    double r = sh[0];
    for (int w = 1; w < nw; w++)
        r += sh[w];
    return r;
}

static double ssq_host(const float *x, int64_t n, int64_t *nblocks)
{
    enum { T = 256, STEP = 4 * T };
    const int64_t chunk = sp_cuda_sum_squares_chunk(n);
    const int64_t nb = n > chunk ? (n + chunk - 1) / chunk : 1;
    double *part = halloc(sizeof(double) * 1024), lane[T];
    part[0] = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * chunk, hi = lo + chunk < n ? lo + chunk : n;
        for (int t = 0; t < T; t++) {
            double c[4] = {0, 0, 0, 0};
            int64_t i = lo + t;
            for (; i + 3 * T < hi; i += STEP)
                for (int j = 0; j < 4; j++)
                    c[j] = fma((double)x[i + j * T], (double)x[i + j * T], c[j]);
            for (int j = 0; j < 3; j++)
                if (i + j * T < hi)
                    c[j] = fma((double)x[i + j * T], (double)x[i + j * T], c[j]);
            lane[t] = (c[0] + c[1]) + (c[2] + c[3]);
        }
        part[b] = tree_sum(lane, T);
    }
    double r = part[0];
    if (nb > 1) {
        double all[1024];
        for (int l = 0; l < 1024; l++)
            all[l] = l < nb ? part[l] : 0.0;
        r = tree_sum(all, 1024);
    }
    free(part);
    *nblocks = nb;
    return r;
}

static void test_sum_squares(int on_gpu)
{
    const sp_backend *be = sp_backend_cuda();
    const int64_t chunk_min = sp_cuda_sum_squares_chunk(1);
    const int64_t sizes[] = {0, 1, 255, 1023, 1025, chunk_min, chunk_min + 1,
                             5 * chunk_min + 777, 1024 * chunk_min + 3 * 1024 + 5,
                             on_gpu ? (int64_t)1 << 26 : 0};
    double *dout = dalloc(2 * sizeof(double));
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const int64_t n = sizes[k];
        if (k && !n) continue;
        const int64_t chunk = sp_cuda_sum_squares_chunk(n);
        char L[96];
        snprintf(L, sizeof L, "sum_squares n=%lld", (long long)n);
        expect(chunk % 1024 == 0 && chunk >= 16384 && (n + chunk - 1) / chunk <= 1024, L,
               "chunks of whole steps, at most 1024 of them");
        float *h = hrand(n, -2, 2), *d = dcopy(h, n);
        int64_t nb;
        double want = ssq_host(h, n, &nb), got[2];
        long double exact = 0;
        for (int64_t i = 0; i < n; i++)
            exact += (long double)h[i] * h[i];
        for (int rep = 0; rep < 2; rep++) {
            kstat(L, be->sum_squares(&cx, dout, d, n));
            down(&got[rep], dout, sizeof(double));
        }
        expect(!memcmp(&got[0], &got[1], sizeof(double)), L, "two GPU runs give identical bits");
        expect(!memcmp(&got[0], &want, sizeof(double)), L, "the bits of the documented order");
        char what[96];
        snprintf(what, sizeof what, "within 1e-12 of a long double sum (%.3g)",
                 n ? (double)fabsl(got[0] - exact) / (double)exact : 0.0);
        expect(n ? fabsl(got[0] - exact) <= 1e-12L * exact : got[0] == 0.0, L, what);
        if (sp_emu_last_grid) {
            snprintf(what, sizeof what, "launched %lld blocks (expected %lld)",
                     sp_emu_last_grid("sum_squares_kernel"), (long long)nb);
            expect(sp_emu_last_grid("sum_squares_kernel") == nb, L, what);
        }
        if (n == (int64_t)1 << 26) {
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            const int reps = 20;
            CK(cudaEventRecord(e0, stream));
            for (int r = 0; r < reps; r++)
                kstat(L, be->sum_squares(&cx, dout, d, n));
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float ms = 0.0f;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            const double tbs = 4.0 * n / (ms / 1e3 / reps) / 1e12;
            printf("sum of squares of %lld floats (%lld blocks): %.3f ms, %.2f TB/s\n",
                   (long long)n, (long long)nb, ms / reps, tbs);
            snprintf(what, sizeof what, "%.2f TB/s >= 1 TB/s", tbs);
            expect(tbs >= 1.0, "sum_squares rate", what);
            CK(cudaEventDestroy(e0));
            CK(cudaEventDestroy(e1));
        }
        free(h);
        dfree(d);
    }
    dfree(dout);
}

/* ------------------------------------------------------------------ throughput */
/* out (S,S) = a (S,S) b (S,S): checks the first rows against the CPU, then times it with
 * TF32 off and on. Reported, not enforced: the H200's fp32 peak is ~67 TFLOP/s (SXM); a
 * number far below that means a wrong math mode or a throttled GPU. */
static void test_matmul_rate(int S)
{
    const sp_backend *be = sp_backend_cuda();
    const int R = 64, reps = 10;
    const int64_t nn = (int64_t)S * S;
    float *a = hrand(nn, -1, 1), *b = hrand(nn, -1, 1);
    float *da_ = dcopy(a, nn), *db_ = dcopy(b, nn), *dc = dalloc(sizeof(float) * (size_t)nn);
    float *g0 = halloc(sizeof(float) * (size_t)nn), *g1 = halloc(sizeof(float) * (size_t)nn);
    float *want = halloc(sizeof(float) * (size_t)R * S);
    char L[96];
    snprintf(L, sizeof L, "matmul_forward(large) S=%d (first %d rows)", S, R);
    sp_matmul_forward(want, a, b, R, S, S, 0, 0, 0);
    for (int rep = 0; rep < 2; rep++) {
        kstat(L, be->matmul(&cx, dc, da_, db_, S, S, S, 0, 0, 0, 0));
        down(rep ? g1 : g0, dc, sizeof(float) * (size_t)nn);
    }
    check_close(L, g0, want, (int64_t)R * S, TOL);
    expect(!memcmp(g0, g1, sizeof(float) * (size_t)nn), L, "two GPU runs give identical bits");

    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int tf32 = 0; tf32 < 2; tf32++) {
        kstat("set_tf32", sp_cuda_set_tf32(blas, tf32));
        for (int w = 0; w < 2; w++) /* warm up: heuristics, clocks */
            kstat("matmul rate", be->matmul(&cx, dc, da_, db_, S, S, S, 0, 0, 0, 0));
        CK(cudaEventRecord(e0, stream));
        for (int r = 0; r < reps; r++)
            kstat("matmul rate", be->matmul(&cx, dc, da_, db_, S, S, S, 0, 0, 0, 0));
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        double t = ms / 1e3 / reps, tflops = 2.0 * S * (double)S * S / t / 1e12;
        printf("matmul %dx%dx%d fp32, TF32 %s: %.3f ms per call, %.1f TFLOP/s\n", S, S, S,
               tf32 ? "on " : "off", t * 1e3, tflops);
        if (tf32) { /* TF32 must still be close (10-bit mantissa), just not 1e-5 close */
            down(g1, dc, sizeof(float) * (size_t)nn);
            double e = rel_err(g1, want, (int64_t)R * S);
            char what[96];
            snprintf(what, sizeof what, "TF32 vs CPU: err %.3g (tol 1e-2; %s)", e,
                     e > 1e-6 ? "TF32 in use" : "no visible TF32 rounding");
            expect(e <= 1e-2, "matmul_forward(large, TF32)", what);
        }
    }
    kstat("set_tf32", sp_cuda_set_tf32(blas, 0));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    free(a), free(b), free(g0), free(g1), free(want);
    dfree(da_), dfree(db_), dfree(dc);
}

/* Attention at the shape of a large GPT block, T = S/2, C = S, heads of 128 columns
 * (issue 11: S = 4096 is C = 4096, T = 2048, NH = 32): both directions give the same bits
 * twice (blocks really run concurrently on a GPU), and their rate, counting the causal
 * half's FLOPs as graph/program.c does (forward 2 B T T C, backward twice that). kv_group:
 * grouped-query attention instead, G = 4 (32 heads: 8 KV heads, as Llama's larger models). */
/* FNV-1a of n bytes: the "bits" a rate line prints, to compare builds of a kernel that
 * must keep them (same input, same device). */
static uint64_t fnv1a(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

/* On a GPU: how many blocks of each attention kernel fit on an SM, against what their
 * launch bounds ask for (2 of the fp32 kernels' 256 threads, 3 of the bf16 ones' 128):
 * registers or shared memory grown past that show here, before any rate does. */
static void test_attention_occupancy(void)
{
    const char *names[8];
    int blocks[8];
    const int n = sp_cuda_attention_occupancy(names, blocks, 8);
    if (n < 0)
        return; /* the emulation: no SM to ask */
    expect(n == 6, "attention occupancy", "six kernels");
    for (int i = 0; i < n; i++) {
        const int want = strstr(names[i], "bf16") ? 3 : 2;
        char what[96];
        snprintf(what, sizeof what, "%d blocks per SM (at least %d)", blocks[i], want);
        printf("occupancy %s: %s\n", names[i], what);
        expect(blocks[i] >= want, names[i], what);
    }
}

static void test_attention_rate(int S, int bf16, int kv_group)
{
    const sp_backend *be = sp_backend_cuda();
    const int prec = bf16 ? SP_PREC_BF16 : 0;
    const int B = 1, T = S / 2, C = S, NH = C / 128 > 0 ? C / 128 : 1, reps = 3;
    int G = 0; /* kv_group: the largest of 4, 2, 1 that divides NH */
    for (int g = 4; kv_group && !G; g /= 2)
        G = NH % g ? 0 : g;
    const int64_t W = G ? (int64_t)(NH / G) * (G + 2) * (C / NH) : 3 * (int64_t)C;
    const int64_t nqkv = (int64_t)B * T * W, nout = (int64_t)B * T * C;
    float *h = hrand(nqkv, -1, 1), *dq = dcopy(h, nqkv);
    float *dd = dcopy(h, nout); /* any values will do as dout */
    float *o = dalloc(sizeof(float) * (size_t)nout), *g = dalloc(sizeof(float) * (size_t)nqkv);
    float *lse = dalloc(sizeof(float) * (size_t)B * NH * T);
    float *scr = dalloc(sizeof(float) * (size_t)sp_cuda_attention_scratch_floats(B, T, C, NH, 1));
    float *o2[2], *g2[2];
    char L[96];
    snprintf(L, sizeof L, "attention(large, %s) T=%d C=%d NH=%d G=%d", bf16 ? "bf16" : "fp32", T,
             C, NH, G);
    for (int rep = 0; rep < 2; rep++) {
        o2[rep] = halloc(sizeof(float) * (size_t)nout);
        g2[rep] = halloc(sizeof(float) * (size_t)nqkv);
        kstat(L, be->attention(&cx, o, lse, scr, dq, B, T, C, NH, G, prec));
        kstat(L, be->attention_dx(&cx, g, scr, dd, dq, o, lse, B, T, C, NH, G, 0, prec));
        down(o2[rep], o, sizeof(float) * (size_t)nout);
        down(g2[rep], g, sizeof(float) * (size_t)nqkv);
    }
    expect(!memcmp(o2[0], o2[1], sizeof(float) * (size_t)nout), L,
           "forward: two GPU runs give identical bits");
    expect(!memcmp(g2[0], g2[1], sizeof(float) * (size_t)nqkv), L,
           "backward: two GPU runs give identical bits");
    cudaEvent_t e[3];
    for (int i = 0; i < 3; i++)
        CK(cudaEventCreate(&e[i]));
    CK(cudaEventRecord(e[0], stream));
    for (int r = 0; r < reps; r++)
        kstat(L, be->attention(&cx, o, lse, scr, dq, B, T, C, NH, G, prec));
    CK(cudaEventRecord(e[1], stream));
    for (int r = 0; r < reps; r++)
        kstat(L, be->attention_dx(&cx, g, scr, dd, dq, o, lse, B, T, C, NH, G, 0, prec));
    CK(cudaEventRecord(e[2], stream));
    CK(cudaEventSynchronize(e[2]));
    float fms = 0.0f, bms = 0.0f;
    CK(cudaEventElapsedTime(&fms, e[0], e[1]));
    CK(cudaEventElapsedTime(&bms, e[1], e[2]));
    const double flops = 2.0 * B * T * (double)T * C, tf = fms / 1e3 / reps;
    const double tb = bms / 1e3 / reps;
    printf("attention B=%d T=%d C=%d NH=%d G=%d %s: forward %.3f ms, %.1f TFLOP/s; "
           "backward %.3f ms, %.1f TFLOP/s; bits %016llx %016llx\n", B, T, C, NH, G,
           bf16 ? "bf16" : "fp32", tf * 1e3, flops / tf / 1e12, tb * 1e3,
           2 * flops / tb / 1e12, (unsigned long long)fnv1a(o2[0], sizeof(float) * (size_t)nout),
           (unsigned long long)fnv1a(g2[0], sizeof(float) * (size_t)nqkv));
    /* Floors on a GPU (S = 4096: T = 2048, heads of 128), against regressions: about 2/3 of
     * what the H200 gave on 2026-12-04 at 2 (fp32) and 3 (bf16) blocks per SM: fp32 18.6 /
     * 10.1, bf16 33.6 / 27.1 TFLOP/s (before the register work: 18.5 / 7.1, 23.2 / 19.5). */
    if (S >= 4096 && !G) {
        const double ffl = bf16 ? 22.0 : 12.0, bfl = bf16 ? 18.0 : 6.5;
        char what[96];
        snprintf(what, sizeof what, "forward %.1f >= %.1f, backward %.1f >= %.1f TFLOP/s",
                 flops / tf / 1e12, ffl, 2 * flops / tb / 1e12, bfl);
        expect(flops / tf / 1e12 >= ffl && 2 * flops / tb / 1e12 >= bfl, L, what);
    }
    for (int i = 0; i < 3; i++)
        CK(cudaEventDestroy(e[i]));
    free(h), free(o2[0]), free(o2[1]), free(g2[0]), free(g2[1]);
    dfree(dq), dfree(dd), dfree(o), dfree(lse), dfree(g), dfree(scr);
}

int main(int argc, char **argv)
{
    int rate_size = 4096;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rate-size") && i + 1 < argc && (rate_size = atoi(argv[++i])) >= 64)
            continue;
        fprintf(stderr, "usage: %s [--rate-size S]: S >= 64, default 4096\n", argv[0]);
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return SKIP;
    }
    const char *v = getenv("SP_VERBOSE");
    verbose = v && v[0] == '1';
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount);
    sp_kernels_init();
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "FAIL: cublasCreate\n");
        return 1;
    }
    cx = (sp_cuda_ctx){stream, blas};
    int rc = sp_cuda_kernels_init(blas);
    if (rc != SP_CUDA_OK) {
        fprintf(stderr, "FAIL: sp_cuda_kernels_init: %s\n", sp_cuda_status_string(rc));
        return 1;
    }

    test_scale_forward();
    test_embed_check_tokens();
    test_cross_entropy_extras();
    test_refusals();
    test_sum_squares(rate_size >= 4096 && !sp_emu_last_grid);
    test_matmul_rate(rate_size);
    test_attention_occupancy();
    test_attention_rate(rate_size, 0, 0);
    test_attention_rate(rate_size, 1, 0);
    test_attention_rate(rate_size, 0, 1);
    test_attention_rate(rate_size, 1, 1);

    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("FAIL: device error at exit: %s\n", cudaGetErrorString(e));
        n_fail++;
    }
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
