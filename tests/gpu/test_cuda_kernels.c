/* Every CUDA kernel (codelets/cuda) against its CPU twin (codelets/cpu): forward and every
 * backward, acc 0 and 1, awkward sizes, fresh random inputs. Each GPU call runs twice from
 * the same state and must give the same bits. Ends with the fp32 sgemm rate, TF32 off and
 * on, and the attention rate at T = S/2, C = S. Exits 77 (skipped) without a CUDA device, 1
 * when any check failed. `--rate-size S` sets the sgemm size (4096); tests/gpu/emu, on a
 * CPU, runs 256.
 *
 * Tolerance: max|gpu - cpu| / max(1, max|cpu|) <= 1e-5 for every op (TF32 off). Each op's
 * reductions are over at most a few thousand fp32 terms of magnitude <= ~15, so the two
 * summation orders differ by ~1e-6 at worst; the elementwise ops, embed, AdamW and the
 * cross-entropy gradient differ by an ulp (FMA) or not at all; the bf16 products multiply
 * the same bf16 values exactly on both sides. sum_squares is compared in double, 1e-9: both
 * sides are double sums of positive terms, each off by < n u_d. */
#include "codelets/cpu/kernels.h"
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
static struct {
    char op[32];
    double worst;
} worst[128];
static int n_worst;
static void note_worst(const char *label, double e)
{
    char op[32];
    size_t k = strcspn(label, " ");
    if (k >= sizeof op)
        k = sizeof op - 1;
    memcpy(op, label, k);
    op[k] = 0;
    for (int i = 0; i < n_worst; i++)
        if (!strcmp(worst[i].op, op)) {
            if (!(e <= worst[i].worst))
                worst[i].worst = e;
            return;
        }
    if (n_worst < (int)(sizeof worst / sizeof *worst)) {
        strcpy(worst[n_worst].op, op);
        worst[n_worst++].worst = e;
    }
}

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
    note_worst(label, e);
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
/* An in/out buffer starting from given contents (in-place ops, AdamW state). */
static void ob_from(obuf *o, const float *init, int64_t n)
{
    ob_make(o, n, 0);
    memcpy(o->init, init, sizeof(float) * (size_t)n);
    memcpy(o->cpu, init, sizeof(float) * (size_t)n);
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

/* ------------------------------------------------------------------ matmul */
static void test_matmul(void)
{
    static const int sz[][3] = {{7, 13, 33}, {37, 7, 13}, {33, 37, 64}, {1, 5, 1}, {5, 7, 0}};
    char L[128];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int M = sz[s][0], Nc = sz[s][1], K = sz[s][2];
        float *a = hrand((int64_t)M * K, -1, 1), *b = hrand((int64_t)K * Nc, -1, 1);
        float *dout = hrand((int64_t)M * Nc, -1, 1);
        float *da_ = dcopy(a, (int64_t)M * K), *db_ = dcopy(b, (int64_t)K * Nc);
        float *dd = dcopy(dout, (int64_t)M * Nc);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int acc = 0; acc < 2; acc++) {
                    obuf o;
#define MM_LABEL(op)                                                                          \
    snprintf(L, sizeof L, op " M=%d Nc=%d K=%d ta=%d tb=%d acc=%d", M, Nc, K, ta, tb, acc)
                    MM_LABEL("matmul_forward");
                    ob_make(&o, (int64_t)M * Nc, acc);
                    sp_matmul_forward(o.cpu, a, b, M, Nc, K, ta, tb, acc);
                    TWICE(L, sp_cuda_matmul_forward(o.d, da_, db_, M, Nc, K, ta, tb, acc, stream,
                                                    blas), &o);
                    ob_check(&o, L, TOL);
                    ob_free(&o);

                    MM_LABEL("matmul_backward_a");
                    ob_make(&o, (int64_t)M * K, acc);
                    sp_matmul_backward_a(o.cpu, dout, b, M, Nc, K, ta, tb, acc);
                    TWICE(L, sp_cuda_matmul_backward_a(o.d, dd, db_, M, Nc, K, ta, tb, acc,
                                                       stream, blas), &o);
                    ob_check(&o, L, TOL);
                    ob_free(&o);

                    MM_LABEL("matmul_backward_b");
                    ob_make(&o, (int64_t)K * Nc, acc);
                    sp_matmul_backward_b(o.cpu, dout, a, M, Nc, K, ta, tb, acc);
                    TWICE(L, sp_cuda_matmul_backward_b(o.d, dd, da_, M, Nc, K, ta, tb, acc,
                                                       stream, blas), &o);
                    ob_check(&o, L, TOL);
                    ob_free(&o);
                }
        free(a), free(b), free(dout);
        dfree(da_), dfree(db_), dfree(dd);
    }
}

/* ------------------------------------------------------------------ bf16 */
/* to_bf16 bit for bit against the CPU's sp_to_bf16; the three bf16 products against the
 * CPU's _bf16 ones within TOL (the same exact products of bf16 values, summed in another
 * order); and each with its operands given in bf16 storage (a16, b16), bitwise equal to
 * the GPU's product of the fp32 operands: the conversion is skipped, the bits stay. */
static void test_bf16(void)
{
    const int64_t n = 1031;
    float *x = hrand(n, -3, 3);
    const float special[] = {NAN, INFINITY, -INFINITY, -0.0f, 3.4028235e38f, 0x1.01p0f,
                             0x1.03p0f, 1.401298464e-45f};
    memcpy(x, special, sizeof special);
    uint16_t *hc = halloc(2 * n), *hg = halloc(2 * n), *dh = dalloc(2 * n);
    float *dx = dcopy(x, n);
    sp_to_bf16(hc, x, n);
    kstat("to_bf16", sp_cuda_to_bf16(dh, dx, n, stream));
    down(hg, dh, 2 * (size_t)n);
    expect(!memcmp(hg, hc, 2 * (size_t)n), "to_bf16", "the CPU's bits (NaN, ties, overflow)");
    free(x), free(hc), free(hg), dfree(dh), dfree(dx);

    static const int sz[][3] = {{7, 13, 33}, {37, 7, 13}, {33, 37, 64}, {1, 5, 1}, {5, 7, 0}};
    char L[128];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int M = sz[s][0], Nc = sz[s][1], K = sz[s][2];
        const int64_t na = (int64_t)M * K, nb = (int64_t)K * Nc, nd = (int64_t)M * Nc;
        float *a = hrand(na, -1, 1), *b = hrand(nb, -1, 1), *dout = hrand(nd, -1, 1);
        uint16_t *a16 = halloc(2 * na + 2), *b16 = halloc(2 * nb + 2);
        sp_to_bf16(a16, a, na);
        sp_to_bf16(b16, b, nb);
        float *da_ = dcopy(a, na), *db_ = dcopy(b, nb), *dd = dcopy(dout, nd);
        uint16_t *da16 = dalloc(2 * na + 2), *db16 = dalloc(2 * nb + 2);
        up(da16, a16, 2 * (size_t)na);
        up(db16, b16, 2 * (size_t)nb);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int acc = 0; acc < 2; acc++) {
                    obuf o, q;
#define BF_LABEL(op)                                                                          \
    snprintf(L, sizeof L, op " M=%d Nc=%d K=%d ta=%d tb=%d acc=%d", M, Nc, K, ta, tb, acc)
                    BF_LABEL("matmul_forward_bf16");
                    ob_make(&o, nd, acc);
                    sp_matmul_forward_bf16(o.cpu, a, b, M, Nc, K, ta, tb, acc, 0, 0);
                    TWICE(L, sp_cuda_matmul_forward_bf16(o.d, da_, db_, M, Nc, K, ta, tb, acc, 0,
                                                         0, stream, blas), &o);
                    ob_check(&o, L, TOL);
                    for (int w = 1; w <= 3; w++) { /* a, b, both in bf16 storage */
                        ob_from(&q, o.init, nd);
                        BF_LABEL("matmul_forward_bf16 stored");
                        TWICE(L, sp_cuda_matmul_forward_bf16(q.d, w & 1 ? (void *)da16 : da_,
                                                             w & 2 ? (void *)db16 : db_, M, Nc, K,
                                                             ta, tb, acc, w & 1, w >> 1, stream,
                                                             blas), &q);
                        expect(!memcmp(q.g[0], o.g[0], sizeof(float) * (size_t)nd), L,
                               w == 1 ? "a in bf16 storage: the bits of fp32 a"
                               : w == 2 ? "b in bf16 storage: the bits of fp32 b"
                                        : "a and b in bf16 storage: the bits of fp32 ones");
                        ob_free(&q);
                    }
                    ob_free(&o);

                    BF_LABEL("matmul_backward_a_bf16");
                    ob_make(&o, na, acc);
                    sp_matmul_backward_a_bf16(o.cpu, dout, b, M, Nc, K, ta, tb, acc, 0);
                    TWICE(L, sp_cuda_matmul_backward_a_bf16(o.d, dd, db_, M, Nc, K, ta, tb, acc,
                                                            0, stream, blas), &o);
                    ob_check(&o, L, TOL);
                    ob_from(&q, o.init, na);
                    TWICE(L, sp_cuda_matmul_backward_a_bf16(q.d, dd, db16, M, Nc, K, ta, tb, acc,
                                                            1, stream, blas), &q);
                    expect(!memcmp(q.g[0], o.g[0], sizeof(float) * (size_t)na), L,
                           "b in bf16 storage: the bits of fp32 b");
                    ob_free(&q);
                    ob_free(&o);

                    BF_LABEL("matmul_backward_b_bf16");
                    ob_make(&o, nb, acc);
                    sp_matmul_backward_b_bf16(o.cpu, dout, a, M, Nc, K, ta, tb, acc, 0);
                    TWICE(L, sp_cuda_matmul_backward_b_bf16(o.d, dd, da_, M, Nc, K, ta, tb, acc,
                                                            0, stream, blas), &o);
                    ob_check(&o, L, TOL);
                    ob_from(&q, o.init, nb);
                    TWICE(L, sp_cuda_matmul_backward_b_bf16(q.d, dd, da16, M, Nc, K, ta, tb, acc,
                                                            1, stream, blas), &q);
                    expect(!memcmp(q.g[0], o.g[0], sizeof(float) * (size_t)nb), L,
                           "a in bf16 storage: the bits of fp32 a");
                    ob_free(&q);
                    ob_free(&o);
                }
        free(a), free(b), free(dout), free(a16), free(b16);
        dfree(da_), dfree(db_), dfree(dd), dfree(da16), dfree(db16);
    }
}

/* ------------------------------------------------------------------ elementwise */
static void test_bias(void)
{
    static const int sz[][2] = {{7, 13}, {37, 33}, {333, 65}, {1, 1}, {64, 12}};
    char L[128];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int N = sz[s][0], C = sz[s][1];
        const int64_t n = (int64_t)N * C;
        float *x = hrand(n, -1, 1), *bias = hrand(C, -1, 1), *dout = hrand(n, -1, 1);
        float *dx = dcopy(x, n), *dbias = dcopy(bias, C), *dd = dcopy(dout, n);
        obuf o;
        snprintf(L, sizeof L, "bias_add_forward N=%d C=%d", N, C);
        ob_make(&o, n, 0);
        sp_bias_add_forward(o.cpu, x, bias, N, C);
        TWICE(L, sp_cuda_bias_add_forward(o.d, dx, dbias, N, C, stream), &o);
        ob_check(&o, L, TOL);
        ob_free(&o);
        snprintf(L, sizeof L, "bias_add_forward(in-place) N=%d C=%d", N, C);
        ob_from(&o, x, n);
        sp_bias_add_forward(o.cpu, o.cpu, bias, N, C);
        TWICE(L, sp_cuda_bias_add_forward(o.d, o.d, dbias, N, C, stream), &o);
        ob_check(&o, L, TOL);
        ob_free(&o);
        for (int acc = 0; acc < 2; acc++) {
            snprintf(L, sizeof L, "bias_add_backward_bias N=%d C=%d acc=%d", N, C, acc);
            ob_make(&o, C, acc);
            sp_bias_add_backward_bias(o.cpu, dout, N, C, acc);
            TWICE(L, sp_cuda_bias_add_backward_bias(o.d, dd, N, C, acc, stream), &o);
            ob_check(&o, L, TOL);
            ob_free(&o);
        }
        free(x), free(bias), free(dout);
        dfree(dx), dfree(dbias), dfree(dd);
    }
}

static void test_pointwise(void)
{
    static const int64_t sizes[] = {7, 37, 1048579};
    char L[128];
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const int64_t n = sizes[s];
        /* GELU inputs over [-6, 6] (tanh saturates), a few far out, and exact zeros */
        float *a = hrand(n, -6, 6), *b = hrand(n, -1, 1), *dout = hrand(n, -1, 1);
        a[0] = 0.0f;
        if (n > 3)
            a[1] = 50.0f, a[2] = -50.0f, a[3] = -0.0f;
        float *da_ = dcopy(a, n), *db_ = dcopy(b, n), *dd = dcopy(dout, n);
        obuf o;

        snprintf(L, sizeof L, "add_forward n=%lld", (long long)n);
        ob_make(&o, n, 0);
        sp_add_forward(o.cpu, a, b, n);
        TWICE(L, sp_cuda_add_forward(o.d, da_, db_, n, stream), &o);
        ob_check(&o, L, TOL);
        ob_free(&o);
        snprintf(L, sizeof L, "add_forward(in-place) n=%lld", (long long)n);
        ob_from(&o, a, n);
        sp_add_forward(o.cpu, o.cpu, b, n);
        TWICE(L, sp_cuda_add_forward(o.d, o.d, db_, n, stream), &o);
        ob_check(&o, L, TOL);
        ob_free(&o);

        snprintf(L, sizeof L, "maximum_forward(in-place) n=%lld", (long long)n);
        ob_from(&o, b, n);
        sp_maximum_forward(o.cpu, o.cpu, a, n);
        TWICE(L, sp_cuda_maximum_forward(o.d, o.d, da_, n, stream), &o);
        ob_check(&o, L, 0);
        ob_free(&o);

        snprintf(L, sizeof L, "scale_forward n=%lld", (long long)n);
        ob_make(&o, n, 0);
        sp_scale_forward(o.cpu, a, 0.37f, n);
        TWICE(L, sp_cuda_scale_forward(o.d, da_, 0.37f, n, stream), &o);
        ob_check(&o, L, TOL);
        ob_free(&o);

        static const float scales[] = {1.0f, -1.5f};
        for (int si = 0; si < 2; si++)
            for (int acc = 0; acc < 2; acc++) {
                const float sc = scales[si];
                snprintf(L, sizeof L, "scale_backward n=%lld s=%g acc=%d", (long long)n, sc, acc);
                ob_make(&o, n, acc);
                sp_scale_backward(o.cpu, dout, sc, n, acc);
                TWICE(L, sp_cuda_scale_backward(o.d, dd, sc, n, acc, stream), &o);
                ob_check(&o, L, TOL);
                ob_free(&o);
                snprintf(L, sizeof L, "scale_backward(in-place) n=%lld s=%g acc=%d",
                         (long long)n, sc, acc);
                ob_from(&o, dout, n);
                sp_scale_backward(o.cpu, o.cpu, sc, n, acc);
                TWICE(L, sp_cuda_scale_backward(o.d, o.d, sc, n, acc, stream), &o);
                ob_check(&o, L, TOL);
                ob_free(&o);
            }

        snprintf(L, sizeof L, "gelu_forward n=%lld", (long long)n);
        ob_make(&o, n, 0);
        sp_gelu_forward(o.cpu, a, n);
        TWICE(L, sp_cuda_gelu_forward(o.d, da_, n, stream), &o);
        ob_check(&o, L, TOL);
        ob_free(&o);
        snprintf(L, sizeof L, "gelu_forward(in-place) n=%lld", (long long)n);
        ob_from(&o, a, n);
        sp_gelu_forward(o.cpu, o.cpu, n);
        TWICE(L, sp_cuda_gelu_forward(o.d, o.d, n, stream), &o);
        ob_check(&o, L, TOL);
        ob_free(&o);

        snprintf(L, sizeof L, "relu_forward n=%lld", (long long)n);
        ob_make(&o, n, 0);
        sp_relu_forward(o.cpu, a, n);
        TWICE(L, sp_cuda_relu_forward(o.d, da_, n, stream), &o);
        ob_check(&o, L, TOL);
        ob_free(&o);

        for (int acc = 0; acc < 2; acc++) {
            snprintf(L, sizeof L, "gelu_backward n=%lld acc=%d", (long long)n, acc);
            ob_make(&o, n, acc);
            sp_gelu_backward(o.cpu, a, dout, n, acc);
            TWICE(L, sp_cuda_gelu_backward(o.d, da_, dd, n, acc, stream), &o);
            ob_check(&o, L, TOL);
            ob_free(&o);
            snprintf(L, sizeof L, "relu_backward n=%lld acc=%d", (long long)n, acc);
            ob_make(&o, n, acc);
            sp_relu_backward(o.cpu, a, dout, n, acc);
            TWICE(L, sp_cuda_relu_backward(o.d, da_, dd, n, acc, stream), &o);
            ob_check(&o, L, TOL);
            ob_free(&o);
        }
        free(a), free(b), free(dout);
        dfree(da_), dfree(db_), dfree(dd);
    }
}

/* ------------------------------------------------------------------ layernorm */
static void test_layernorm(void)
{
    static const int sz[][2] = {{7, 13}, {37, 33}, {13, 770}, {5, 1}, {64, 12}};
    char L[128];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int N = sz[s][0], C = sz[s][1];
        const int64_t n = (int64_t)N * C;
        float *x = hrand(n, 2, 4); /* mean ~3: the two-pass variance matters */
        float *gamma = hrand(C, -1.5, 1.5), *beta = hrand(C, -1, 1), *dout = hrand(n, -1, 1);
        float *dx_ = dcopy(x, n), *dg = dcopy(gamma, C), *dbt = dcopy(beta, C);
        float *dd = dcopy(dout, n);
        obuf o, m, r;
        snprintf(L, sizeof L, "layernorm_forward N=%d C=%d", N, C);
        ob_make(&o, n, 0), ob_make(&m, N, 0), ob_make(&r, N, 0);
        sp_layernorm_forward(o.cpu, m.cpu, r.cpu, x, gamma, beta, N, C);
        TWICE(L, sp_cuda_layernorm_forward(o.d, m.d, r.d, dx_, dg, dbt, N, C, stream), &o, &m,
              &r);
        ob_check(&o, L, TOL);
        snprintf(L, sizeof L, "layernorm_forward(mean) N=%d C=%d", N, C);
        ob_check(&m, L, TOL);
        snprintf(L, sizeof L, "layernorm_forward(rstd) N=%d C=%d", N, C);
        ob_check(&r, L, TOL);
        /* the backward gets the CPU's saved statistics on both sides */
        float *dmean = dcopy(m.cpu, N), *drstd = dcopy(r.cpu, N);
        for (int acc = 0; acc < 2; acc++) {
            obuf dx, dgm, dbe;
            snprintf(L, sizeof L, "layernorm_backward_x N=%d C=%d acc=%d", N, C, acc);
            ob_make(&dx, n, acc);
            sp_layernorm_backward_x(dx.cpu, dout, x, m.cpu, r.cpu, gamma, N, C, acc);
            TWICE(L, sp_cuda_layernorm_backward_x(dx.d, dd, dx_, dmean, drstd, dg, N, C, acc,
                                                  stream), &dx);
            ob_check(&dx, L, TOL);
            ob_free(&dx);
            ob_make(&dgm, C, acc), ob_make(&dbe, C, acc);
            sp_layernorm_backward_params(dgm.cpu, dbe.cpu, dout, x, m.cpu, r.cpu, N, C, acc);
            snprintf(L, sizeof L, "layernorm_backward_params N=%d C=%d acc=%d", N, C, acc);
            TWICE(L, sp_cuda_layernorm_backward_params(dgm.d, dbe.d, dd, dx_, dmean, drstd, N, C,
                                                       acc, stream), &dgm, &dbe);
            snprintf(L, sizeof L, "layernorm_backward_params(dgamma) N=%d C=%d acc=%d", N, C,
                     acc);
            ob_check(&dgm, L, TOL);
            snprintf(L, sizeof L, "layernorm_backward_params(dbeta) N=%d C=%d acc=%d", N, C, acc);
            ob_check(&dbe, L, TOL);
            ob_free(&dgm), ob_free(&dbe);
        }
        ob_free(&o), ob_free(&m), ob_free(&r);
        free(x), free(gamma), free(beta), free(dout);
        dfree(dx_), dfree(dg), dfree(dbt), dfree(dd);
        dfree(dmean), dfree(drstd);
    }
}

/* ------------------------------------------------------------------ rmsnorm */
static void test_rmsnorm(void)
{
    static const int sz[][2] = {{7, 13}, {37, 33}, {13, 770}, {5, 1}, {64, 12}};
    char L[128];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int N = sz[s][0], C = sz[s][1];
        const int64_t n = (int64_t)N * C;
        float *x = hrand(n, -2, 3), *w = hrand(C, -1.5, 1.5), *dout = hrand(n, -1, 1);
        float *dx_ = dcopy(x, n), *dw = dcopy(w, C), *dd = dcopy(dout, n);
        obuf o, r;
        snprintf(L, sizeof L, "rmsnorm_forward N=%d C=%d", N, C);
        ob_make(&o, n, 0), ob_make(&r, N, 0);
        sp_rmsnorm_forward(o.cpu, r.cpu, x, w, N, C);
        TWICE(L, sp_cuda_rmsnorm_forward(o.d, r.d, dx_, dw, N, C, stream), &o, &r);
        ob_check(&o, L, TOL);
        snprintf(L, sizeof L, "rmsnorm_forward(rstd) N=%d C=%d", N, C);
        ob_check(&r, L, TOL);
        float *drstd = dcopy(r.cpu, N); /* the CPU's saved rstd on both sides */
        for (int acc = 0; acc < 2; acc++) {
            obuf dx, dwt;
            snprintf(L, sizeof L, "rmsnorm_backward_x N=%d C=%d acc=%d", N, C, acc);
            ob_make(&dx, n, acc);
            sp_rmsnorm_backward_x(dx.cpu, dout, x, r.cpu, w, N, C, acc);
            TWICE(L, sp_cuda_rmsnorm_backward_x(dx.d, dd, dx_, drstd, dw, N, C, acc, stream),
                  &dx);
            ob_check(&dx, L, TOL);
            ob_free(&dx);
            snprintf(L, sizeof L, "rmsnorm_backward_weight N=%d C=%d acc=%d", N, C, acc);
            ob_make(&dwt, C, acc);
            sp_rmsnorm_backward_weight(dwt.cpu, dout, x, r.cpu, N, C, acc);
            TWICE(L, sp_cuda_rmsnorm_backward_weight(dwt.d, dd, dx_, drstd, N, C, acc, stream),
                  &dwt);
            ob_check(&dwt, L, TOL);
            ob_free(&dwt);
        }
        ob_free(&o), ob_free(&r);
        free(x), free(w), free(dout);
        dfree(dx_), dfree(dw), dfree(dd), dfree(drstd);
    }
}

/* ------------------------------------------------------------------ embed */
static void test_embed(void)
{
    static const int sz[][4] = {{3, 5, 12, 7}, {2, 64, 33, 13}, {4, 37, 13, 1000}, {1, 1, 1, 1}};
    char L[128];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int B = sz[s][0], T = sz[s][1], C = sz[s][2], V = sz[s][3], Tmax = T + 3;
        const int64_t BT = (int64_t)B * T, n = BT * C;
        int32_t *tok = halloc(sizeof(int32_t) * (size_t)BT);
        for (int64_t i = 0; i < BT; i++) /* small V: many repeats, exercising the scatter */
            tok[i] = (int32_t)(next_u64() % (uint64_t)V);
        float *wte = hrand((int64_t)V * C, -1, 1), *wpe = hrand((int64_t)Tmax * C, -1, 1);
        float *dout = hrand(n, -1, 1);
        int32_t *dtok = dcopy_i(tok, BT);
        float *dwte_in = dcopy(wte, (int64_t)V * C), *dwpe_in = dcopy(wpe, (int64_t)Tmax * C);
        float *dd = dcopy(dout, n);
        obuf o, gte, gpe;
        snprintf(L, sizeof L, "embed_forward B=%d T=%d C=%d V=%d", B, T, C, V);
        ob_make(&o, n, 0);
        sp_embed_forward(o.cpu, tok, wte, wpe, B, T, C);
        TWICE(L, sp_cuda_embed_forward(o.d, dtok, dwte_in, dwpe_in, B, T, C, stream), &o);
        ob_check(&o, L, TOL);
        ob_free(&o);
        /* always accumulates: random initial gradients */
        ob_make(&gte, (int64_t)V * C, 1), ob_make(&gpe, (int64_t)T * C, 1);
        sp_embed_backward(gte.cpu, gpe.cpu, dout, tok, B, T, C);
        snprintf(L, sizeof L, "embed_backward B=%d T=%d C=%d V=%d", B, T, C, V);
        TWICE(L, sp_cuda_embed_backward(gte.d, gpe.d, dd, dtok, B, T, C, stream), &gte, &gpe);
        snprintf(L, sizeof L, "embed_backward(dwte) B=%d T=%d C=%d V=%d", B, T, C, V);
        ob_check(&gte, L, TOL);
        snprintf(L, sizeof L, "embed_backward(dwpe) B=%d T=%d C=%d V=%d", B, T, C, V);
        ob_check(&gpe, L, TOL);
        ob_free(&gte), ob_free(&gpe);

        /* the range check: none bad, then three bad (below 0, V, beyond) when room */
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
        free(tok), free(wte), free(wpe), free(dout);
        dfree(dtok), dfree(dwte_in), dfree(dwpe_in), dfree(dd);
        dfree(dbad);
    }
}

/* The vocab-parallel embedding: rank `rank` of T holds rows [lo, lo + V/T); tokens over the
 * whole vocabulary, most of them another rank's. */
static void test_embed_vocab(void)
{
    static const int sz[][5] = {{15, 12, 14, 2, 1}, {37, 33, 1000, 4, 2}, {64, 17, 50, 5, 4},
                                {9, 7, 6, 3, 0}, {1, 1, 1, 1, 0}};
    char L[128];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int N = sz[s][0], C = sz[s][1], V = sz[s][2], T = sz[s][3], rank = sz[s][4];
        const int64_t rows = V / T, lo = (int64_t)rank * rows, n = (int64_t)N * C;
        int32_t *tok = halloc(sizeof(int32_t) * (size_t)N);
        for (int i = 0; i < N; i++)
            tok[i] = (int32_t)(next_u64() % (uint64_t)V);
        tok[0] = (int32_t)lo; /* at least one of this rank's, repeated when room */
        if (N > 2) tok[N - 1] = (int32_t)lo;
        float *wte = hrand(rows * C, -1, 1), *dout = hrand(n, -1, 1);
        int32_t *dtok = dcopy_i(tok, N);
        float *dwte = dcopy(wte, rows * C), *dd = dcopy(dout, n);
        obuf o, g;
        snprintf(L, sizeof L, "embed_vocab_forward N=%d C=%d V=%d T=%d r=%d", N, C, V, T, rank);
        ob_make(&o, n, 0);
        sp_embed_vocab_forward(o.cpu, tok, wte, N, C, lo, rows);
        TWICE(L, sp_cuda_embed_vocab_forward(o.d, dtok, dwte, N, C, lo, rows, stream), &o);
        ob_check(&o, L, 0);
        ob_free(&o);
        snprintf(L, sizeof L, "embed_vocab_backward N=%d C=%d V=%d T=%d r=%d", N, C, V, T, rank);
        ob_make(&g, rows * C, 1); /* always accumulates */
        sp_embed_vocab_backward(g.cpu, dout, tok, N, C, lo, rows);
        TWICE(L, sp_cuda_embed_vocab_backward(g.d, dd, dtok, N, C, lo, rows, stream), &g);
        ob_check(&g, L, 0); /* the CPU's sequence of additions */
        ob_free(&g);
        free(tok), free(wte), free(dout);
        dfree(dtok), dfree(dwte), dfree(dd);
    }
}

/* ------------------------------------------------------------------ attention */
/* One precision's attention: the CUDA kernels, against the CPU's sp_attention_gqa_* of the
 * same precision (group 0: sp_attention_forward / _bf16 themselves), the inputs' range and
 * the tolerances of out and of lse and the backward. */
typedef struct {
    const char *suffix; /* "" or "_bf16", in the labels */
    int bf16;
    int (*cuda_fwd)(float *, float *, float *, const float *, int, int, int, int, int, void *,
                    void *);
    int (*cuda_bwd)(float *, float *, const float *, const float *, const float *,
                    const float *, int, int, int, int, int, int, void *, void *);
    float qkv_range; /* qkv uniform in [-qkv_range, qkv_range] */
    double tol_out, tol;
} attention_impl;

/* A row of qkv: 3C in GPT's layout (group 0), (NH/G)(G+2) hs grouped (kernels.h). */
static int64_t qkv_width(int C, int NH, int G)
{
    return G ? (int64_t)(NH / G) * (G + 2) * (C / NH) : 3 * (int64_t)C;
}

/* Column of query head h's q (part 0), its KV head's k (1) or v (2) in a row of qkv. */
static int64_t qkv_col(int part, int h, int C, int NH, int G)
{
    const int hs = C / NH;
    if (!G)
        return (int64_t)part * C + (int64_t)h * hs;
    const int64_t kv = (int64_t)(h / G) * (G + 2) * hs;
    return kv + (part ? (int64_t)(G + part - 1) * hs : (int64_t)(h % G) * hs);
}

/* GPT's layout (B,T,3C) holding the same attention as the grouped qkv (B,T,W): each query
 * head with a copy of its KV head's k and v. */
static float *qkv_ungroup(const float *qkv, int B, int T, int C, int NH, int G)
{
    const int hs = C / NH;
    const int64_t W = qkv_width(C, NH, G);
    float *m = halloc(sizeof(float) * (size_t)((int64_t)B * T * 3 * C));
    for (int64_t r = 0; r < (int64_t)B * T; r++)
        for (int part = 0; part < 3; part++)
            for (int h = 0; h < NH; h++)
                memcpy(m + r * 3 * C + qkv_col(part, h, C, NH, 0),
                       qkv + r * W + qkv_col(part, h, C, NH, G), sizeof(float) * (size_t)hs);
    return m;
}

static void at_label(char *L, size_t n, const char *op, const char *suffix, const char *what,
                     int B, int T, int C, int NH, int G, int acc)
{
    int k = snprintf(L, n, "attention_%s%s%s%s B=%d T=%d C=%d NH=%d G=%d", G ? "gqa_" : "", op,
                     suffix, what, B, T, C, NH, G);
    if (acc >= 0 && k > 0 && (size_t)k < n)
        snprintf(L + k, n - (size_t)k, " acc=%d", acc);
}

/* Forward (out, lse) and backward (acc 0 and 1, given the CPU's out and lse) of each
 * {B, T, C, NH, group} against the CPU's, each CUDA call run twice (same bits). For a
 * group G >= 1, two checks on the index math against the GPT-layout kernels (group 0):
 * the forward of the same heads laid out as GPT's, each query head with a copy of its KV
 * head, gives the same bits; and at G = 1 (one query head per KV head: a permutation of
 * GPT's columns) so does the backward, column for column. */
static void check_attention(const attention_impl *im, const int (*sz)[5], size_t nsz)
{
    char L[128];
    for (size_t s = 0; s < nsz; s++) {
        const int B = sz[s][0], T = sz[s][1], C = sz[s][2], NH = sz[s][3], G = sz[s][4];
        const int64_t W = qkv_width(C, NH, G), nqkv = (int64_t)B * T * W;
        const int64_t nout = (int64_t)B * T * C, nlse = (int64_t)B * NH * T;
        float *qkv = hrand(nqkv, -im->qkv_range, im->qkv_range), *dout = hrand(nout, -1, 1);
        float *dq = dcopy(qkv, nqkv), *dd = dcopy(dout, nout);
        const int64_t ncs = im->bf16 ? sp_attention_scratch_floats_bf16(B, T, C, NH)
                                     : sp_attention_scratch_floats(B, T, C, NH);
        float *cscr = halloc(sizeof(float) * (size_t)ncs);
        float *gscr = dalloc(sizeof(float) *
                             (size_t)sp_cuda_attention_scratch_floats(B, T, C, NH, 1));
        obuf o, lse;
/* "attention[_gqa]_<op><suffix><what> B=.. T=.. C=.. NH=.. G=..[ acc=..]" */
#define AT_LABEL(op, what, acc)                                                               \
    at_label(L, sizeof L, op, im->suffix, what, B, T, C, NH, G, acc)
        AT_LABEL("forward", "", -1);
        ob_make(&o, nout, 0), ob_make(&lse, nlse, 0);
        if (G)
            sp_attention_gqa_forward(o.cpu, lse.cpu, cscr, qkv, B, T, C, NH, G, im->bf16);
        else if (im->bf16)
            sp_attention_forward_bf16(o.cpu, lse.cpu, cscr, qkv, B, T, C, NH);
        else
            sp_attention_forward(o.cpu, lse.cpu, cscr, qkv, B, T, C, NH);
        TWICE(L, im->cuda_fwd(o.d, lse.d, gscr, dq, B, T, C, NH, G, stream, blas), &o, &lse);
        ob_check(&o, L, im->tol_out);
        AT_LABEL("forward", "(lse)", -1);
        ob_check(&lse, L, im->tol);
        float *mha = NULL, *dmha = NULL;
        if (G) {
            obuf mo, ml;
            mha = qkv_ungroup(qkv, B, T, C, NH, G);
            dmha = dcopy(mha, (int64_t)B * T * 3 * C);
            ob_make(&mo, nout, 0), ob_make(&ml, nlse, 0);
            AT_LABEL("forward", "(GPT layout)", -1);
            TWICE(L, im->cuda_fwd(mo.d, ml.d, gscr, dmha, B, T, C, NH, 0, stream, blas), &mo,
                  &ml);
            expect(!memcmp(mo.g[0], o.g[0], sizeof(float) * (size_t)nout) &&
                       !memcmp(ml.g[0], lse.g[0], sizeof(float) * (size_t)nlse),
                   L, "out and lse: the bits of group 0 on the same heads");
            ob_free(&mo), ob_free(&ml);
        }
        /* both backwards get the CPU's out and lse */
        float *dev_out = dcopy(o.cpu, nout), *dlse = dcopy(lse.cpu, nlse);
        for (int acc = 0; acc < 2; acc++) {
            obuf g;
            AT_LABEL("backward", "", acc);
            ob_make(&g, nqkv, acc);
            if (G)
                sp_attention_gqa_backward(g.cpu, cscr, dout, qkv, o.cpu, lse.cpu, B, T, C, NH, G,
                                          acc, im->bf16);
            else if (im->bf16)
                sp_attention_backward_bf16(g.cpu, cscr, dout, qkv, o.cpu, lse.cpu, B, T, C, NH,
                                           acc);
            else
                sp_attention_backward(g.cpu, cscr, dout, qkv, o.cpu, lse.cpu, B, T, C, NH, acc);
            TWICE(L, im->cuda_bwd(g.d, gscr, dd, dq, dev_out, dlse, B, T, C, NH, G, acc, stream,
                                  blas), &g);
            ob_check(&g, L, im->tol);
            if (G == 1) { /* the same gradients as GPT's layout gives, moved back */
                obuf m;
                float *init = qkv_ungroup(g.init, B, T, C, NH, 1);
                ob_from(&m, init, (int64_t)B * T * 3 * C);
                AT_LABEL("backward", "(GPT layout)", acc);
                TWICE(L, im->cuda_bwd(m.d, gscr, dd, dmha, dev_out, dlse, B, T, C, NH, 0, acc,
                                      stream, blas), &m);
                float *mine = qkv_ungroup(g.g[0], B, T, C, NH, 1);
                expect(!memcmp(mine, m.g[0], sizeof(float) * (size_t)m.n), L,
                       "dq, dk, dv: the bits of group 0 on the same heads");
                free(init), free(mine);
                ob_free(&m);
            }
            ob_free(&g);
        }
        ob_free(&o), ob_free(&lse);
        free(qkv), free(dout), free(cscr), free(mha);
        dfree(dq), dfree(dd), dfree(dev_out), dfree(dlse), dfree(gscr);
        if (dmha)
            dfree(dmha);
    }
#undef AT_LABEL
}

/* A group that does not divide NH (and a negative one) is refused, in both directions. */
static void check_attention_groups_refused(const attention_impl *im)
{
    float *x = dalloc(sizeof(float) * 4096);
    static const int bad[][2] = { { 4, 3 }, { 6, 4 }, { 4, -1 } }; /* {NH, group} */
    char L[128];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const int NH = bad[i][0], G = bad[i][1];
        snprintf(L, sizeof L, "attention%s NH=%d G=%d", im->suffix, NH, G);
        const int rf = im->cuda_fwd(x, x, x, x, 1, 3, 8 * NH, NH, G, stream, blas);
        const int rb = im->cuda_bwd(x, x, x, x, x, x, 1, 3, 8 * NH, NH, G, 0, stream, blas);
        expect(rf == (int)cudaErrorInvalidValue && rb == (int)cudaErrorInvalidValue, L,
               "refused with cudaErrorInvalidValue, forward and backward");
    }
    CK(cudaStreamSynchronize(stream));
    dfree(x);
}

/* {B, T, C, NH, G} of grouped-query attention: G = 1, 2, 3, 4 (also NH/G = 1 KV head),
 * heads of 4, 16, 22 and 64 columns, T = 1 and T across the 64-row tiles and the bf16
 * backward's 16-query steps (37, 65, 70, 130). */
#define GQA_SIZES                                                                             \
    {2, 37, 64, 4, 1}, {2, 37, 64, 4, 2}, {1, 65, 64, 4, 4}, {2, 70, 256, 4, 2},              \
        {1, 130, 512, 8, 4}, {2, 5, 24, 6, 3}, {1, 1, 32, 4, 2}, {1, 67, 128, 2, 1},          \
        {1, 67, 44, 2, 2}

static void test_attention(void)
{
    /* {B, T, C, NH, 0}: GPT's layout, head sizes 4 .. 200 (8, 16, 32, 64, 128 among them;
     * 11 and 200 are not multiples of the kernels' 16-column groups, 200 spans two
     * 128-column slices), T below, at and across the 64-row tiles (1, 63, 64, 65, 130), B
     * and NH > 1. Then grouped-query attention, and a head of 200 grouped. */
    static const int sz[][5] = {{2, 5, 12, 3, 0},   {3, 64, 12, 3, 0},  {1, 13, 33, 3, 0},
                                {2, 37, 64, 4, 0},  {1, 64, 128, 2, 0}, {1, 1, 12, 3, 0},
                                {2, 65, 32, 4, 0},  {1, 130, 64, 4, 0}, {2, 63, 128, 4, 0},
                                {1, 67, 128, 1, 0}, {1, 70, 256, 2, 0}, {2, 1, 64, 1, 0},
                                {1, 66, 400, 2, 0}, GQA_SIZES,          {1, 66, 400, 2, 2}};
    static const attention_impl fp32 = {
        "", 0, sp_cuda_attention_forward, sp_cuda_attention_backward, 1, TOL, TOL};
    check_attention(&fp32, sz, sizeof sz / sizeof *sz);
    check_attention_groups_refused(&fp32);
}

/* bf16 attention on the tensor cores against the CPU's bf16 attention (the same rounding
 * points, codelets/cpu/kernels.h). The forward rounds exp(s - m) against a running max
 * where the CPU has the row's max: where a row spans key tiles, its P~ rounds other
 * values, ~2^-9 relative per term (up to 1e-3 on the emulator): TOL_BF16_OUT. lse and the
 * backward (given the CPU's out and lse) differ by fp32 orders of summation, and by a dS
 * next to a bf16 boundary now and then: TOL_BF16 (the CPU test's 4e-6 worst, 25x).
 * Head sizes 4 .. 128 (not multiples of 16: padded), T across the 64-row tiles and the
 * backward's 16-query steps, GPT's layout and grouped; a head of 200 is refused. */
#define TOL_BF16_OUT 4e-3
#define TOL_BF16 1e-4
static void test_attention_bf16(void)
{
    static const int sz[][5] = {{2, 5, 12, 3, 0},   {1, 13, 33, 3, 0}, {2, 37, 64, 4, 0},
                                {1, 64, 128, 1, 0}, {1, 1, 12, 3, 0},  {2, 65, 32, 4, 0},
                                {1, 130, 64, 4, 0}, {1, 67, 128, 1, 0}, {1, 70, 22, 2, 0},
                                GQA_SIZES};
    static const attention_impl bf16 = {
        "_bf16", 1, sp_cuda_attention_forward_bf16, sp_cuda_attention_backward_bf16, 2,
        TOL_BF16_OUT, TOL_BF16};
    check_attention(&bf16, sz, sizeof sz / sizeof *sz);
    check_attention_groups_refused(&bf16);
    float *x = dalloc(sizeof(float) * 3 * 400);
    for (int G = 0; G <= 2; G += 2) {
        const int rc = sp_cuda_attention_forward_bf16(x, x, x, x, 1, 1, 400, 2, G, stream, blas);
        expect(rc == (int)cudaErrorInvalidValue,
               G ? "attention_forward_bf16 C=400 NH=2 G=2" : "attention_forward_bf16 C=400 NH=2",
               "a head of 200 columns is refused with cudaErrorInvalidValue");
    }
    dfree(x);
}

/* ------------------------------------------------------------------ rope, swiglu */
/* Rotary embeddings against the CPU's: every {B, T, D, hs, period, rotated, theta} forward
 * and inverse, acc 0 and 1, and in place. The angles are made in double on both sides,
 * then the same float products: the emulation gives the CPU's bits; a GPU differs only
 * where its double cos, sin or pow round to another float (an ulp). */
static void test_rope(void)
{
    static const struct {
        int B, T, D, hs, period, rotated;
        float theta;
    } sz[] = {{2, 7, 64, 16, 1, 1, 10000.0f},     {3, 37, 96, 32, 4, 3, 10000.0f},
              {1, 70, 384, 64, 4, 3, 500000.0f},  {2, 5, 24, 8, 3, 0, 10000.0f},
              {1, 1, 8, 8, 1, 1, 10000.0f},       {2, 300, 256, 128, 2, 1, 10000.0f},
              {2, 33, 72, 6, 5, 2, 1.5f}};
    char L[160];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int B = sz[s].B, T = sz[s].T, D = sz[s].D, hs = sz[s].hs, P = sz[s].period;
        const int R = sz[s].rotated;
        const float th = sz[s].theta;
        const int64_t n = (int64_t)B * T * D;
        float *x = hrand(n, -2, 2), *dx = dcopy(x, n);
        for (int inv = 0; inv < 2; inv++) {
            for (int acc = 0; acc < 2; acc++) {
                obuf o;
                snprintf(L, sizeof L, "rope_forward B=%d T=%d D=%d hs=%d period=%d rotated=%d "
                         "theta=%g inverse=%d acc=%d", B, T, D, hs, P, R, th, inv, acc);
                ob_make(&o, n, acc);
                sp_rope_forward(o.cpu, x, B, T, D, hs, P, R, th, inv, acc);
                TWICE(L, sp_cuda_rope_forward(o.d, dx, B, T, D, hs, P, R, th, inv, acc, stream),
                      &o);
                ob_check(&o, L, TOL);
                if (verbose)
                    printf("  info %s: bitwise equal to the CPU: %s\n", L,
                           memcmp(o.g[0], o.cpu, sizeof(float) * (size_t)n) ? "no" : "yes");
                ob_free(&o);
            }
            obuf o;
            snprintf(L, sizeof L, "rope_forward(in-place) B=%d T=%d D=%d hs=%d period=%d "
                     "rotated=%d inverse=%d", B, T, D, hs, P, R, inv);
            ob_from(&o, x, n);
            sp_rope_forward(o.cpu, x, B, T, D, hs, P, R, th, inv, 0);
            TWICE(L, sp_cuda_rope_forward(o.d, o.d, B, T, D, hs, P, R, th, inv, 0, stream), &o);
            ob_check(&o, L, TOL);
            ob_free(&o);
        }
        free(x);
        dfree(dx);
    }
    float *d = dalloc(sizeof(float) * 64);
    expect(sp_cuda_rope_forward(d, d, 1, 2, 32, 16, 0, 0, 10000.0f, 0, 0, stream) ==
                   (int)cudaErrorInvalidValue &&
               sp_cuda_rope_forward(d, d, 1, 2, 30, 15, 1, 1, 10000.0f, 0, 0, stream) ==
                   (int)cudaErrorInvalidValue,
           "rope_forward(period 0, hs 15)", "refused with cudaErrorInvalidValue");
    dfree(d);
}

/* SwiGLU against the CPU's: a over [-6, 6] and far out (the sigmoid's clamp at 87, both
 * signs, zeros), b over [-1, 1]; forward, backward acc 0 and 1. */
static void test_swiglu(void)
{
    static const int sz[][2] = {{7, 13}, {37, 33}, {333, 65}, {1, 1}, {64, 1031}};
    char L[128];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++) {
        const int N = sz[s][0], I = sz[s][1];
        const int64_t n = (int64_t)N * I;
        float *x = halloc(sizeof(float) * (size_t)(2 * n));
        for (int r = 0; r < N; r++)
            for (int i = 0; i < I; i++) {
                x[(int64_t)r * 2 * I + i] = unif(-6, 6);
                x[(int64_t)r * 2 * I + I + i] = unif(-1, 1);
            }
        static const float far[] = {0.0f, -0.0f, 50.0f, -50.0f, 100.0f, -100.0f, 1e-30f};
        for (size_t k = 0; k < sizeof far / sizeof *far && (int64_t)k < I; k++)
            x[k] = far[k];
        float *dout = hrand(n, -1, 1), *dx_ = dcopy(x, 2 * n), *dd = dcopy(dout, n);
        obuf o;
        snprintf(L, sizeof L, "swiglu_forward N=%d I=%d", N, I);
        ob_make(&o, n, 0);
        sp_swiglu_forward(o.cpu, x, N, I);
        TWICE(L, sp_cuda_swiglu_forward(o.d, dx_, N, I, stream), &o);
        ob_check(&o, L, TOL);
        ob_free(&o);
        for (int acc = 0; acc < 2; acc++) {
            snprintf(L, sizeof L, "swiglu_backward N=%d I=%d acc=%d", N, I, acc);
            ob_make(&o, 2 * n, acc);
            sp_swiglu_backward(o.cpu, x, dout, N, I, acc);
            TWICE(L, sp_cuda_swiglu_backward(o.d, dx_, dd, N, I, acc, stream), &o);
            ob_check(&o, L, TOL);
            ob_free(&o);
        }
        free(x), free(dout);
        dfree(dx_), dfree(dd);
    }
}

/* ------------------------------------------------------------------ loss, sum */
static void test_cross_entropy(void)
{
    static const int sz[][2] = {{7, 13}, {37, 33}, {5, 1000}, {64, 50257}, {3, 1}};
    char L[128];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++)
        for (int with_bad = 0; with_bad < 2; with_bad++) {
            const int N = sz[s][0], V = sz[s][1];
            const int64_t n = (int64_t)N * V;
            float *logits = hrand(n, -4, 4);
            int32_t *tg = halloc(sizeof(int32_t) * (size_t)N);
            for (int i = 0; i < N; i++)
                tg[i] = (int32_t)(next_u64() % (uint64_t)V);
            if (with_bad)
                tg[0] = -3, tg[N - 1] = V;
            float *dl = dcopy(logits, n);
            int32_t *dtg = dcopy_i(tg, N);
            void *scr = dalloc((size_t)sp_cuda_cross_entropy_scratch_bytes(N));
            int *dbad = dalloc(sizeof(int));
            obuf loss, probs;
            ob_make(&loss, 1, 0), ob_make(&probs, n, 0);
            int cbad = sp_cross_entropy_forward(loss.cpu, probs.cpu, logits, tg, N, V);
            snprintf(L, sizeof L, "cross_entropy_forward N=%d V=%d bad=%d", N, V, cbad);
            TWICE(L, sp_cuda_cross_entropy_forward(loss.d, probs.d, dl, dtg, N, V, dbad, scr,
                                                   stream), &loss, &probs);
            int gbad = -1;
            down(&gbad, dbad, sizeof gbad);
            expect(gbad == cbad, L, "same count of bad targets as the CPU");
            snprintf(L, sizeof L, "cross_entropy_forward(probs) N=%d V=%d bad=%d", N, V, cbad);
            ob_check(&probs, L, TOL);
            snprintf(L, sizeof L, "cross_entropy_forward(loss) N=%d V=%d bad=%d", N, V, cbad);
            if (cbad) /* NaN on both sides, by contract */
                expect(isnan(loss.g[0][0]) && isnan(loss.g[1][0]), L, "loss is NaN");
            else
                ob_check(&loss, L, TOL);

            float *dprobs = dcopy(probs.cpu, n);
            const float dloss = 0.73f, mult = 2.5f;
            float *ddl = dcopy(&dloss, 1);
            for (int acc = 0; acc < 2; acc++) {
                obuf g;
                snprintf(L, sizeof L, "cross_entropy_backward N=%d V=%d bad=%d acc=%d", N, V, cbad,
                         acc);
                ob_make(&g, n, acc);
                sp_cross_entropy_backward(g.cpu, probs.cpu, tg, mult * dloss, N, V, acc);
                TWICE(L, sp_cuda_cross_entropy_backward(g.d, dprobs, dtg, ddl, mult, N, V, acc,
                                                        stream), &g);
                ob_check(&g, L, TOL);
                ob_free(&g);
            }
            ob_free(&loss), ob_free(&probs);
            free(logits), free(tg);
            dfree(dl), dfree(dtg), dfree(scr), dfree(dbad);
            dfree(dprobs), dfree(ddl);
        }
}

/* The vocab-parallel cross-entropy's steps on rank `rank` of T (slices of Vp columns): the
 * group's all-reduces between them are stood in for by raising some rows' maxima and sums,
 * as other ranks' slices would. */
static void test_cross_entropy_vocab(void)
{
    static const int sz[][4] = {{7, 13, 2, 1}, {37, 33, 3, 0}, {5, 1000, 4, 3}, {64, 2000, 2, 1},
                                {3, 1, 2, 0}};
    char L[128];
    for (size_t s = 0; s < sizeof sz / sizeof *sz; s++)
        for (int with_bad = 0; with_bad < 2; with_bad++) {
            const int N = sz[s][0], V = sz[s][1], T = sz[s][2], rank = sz[s][3];
            const int64_t n = (int64_t)N * V, Vall = (int64_t)V * T, lo = (int64_t)rank * V;
            float *logits = hrand(n, -4, 4);
            int32_t *tg = halloc(sizeof(int32_t) * (size_t)N);
            for (int i = 0; i < N; i++)
                tg[i] = (int32_t)(next_u64() % (uint64_t)Vall);
            tg[0] = (int32_t)(lo + V - 1); /* one in the slice, at its last column */
            if (with_bad)
                tg[N - 1] = (int32_t)Vall;
            float *dl = dcopy(logits, n);
            int32_t *dtg = dcopy_i(tg, N);
            obuf mx;
            ob_make(&mx, N, 0);
            sp_vocab_ce_max(mx.cpu, logits, N, V);
            snprintf(L, sizeof L, "vocab_ce_max N=%d V=%d", N, V);
            TWICE(L, sp_cuda_vocab_ce_max(mx.d, dl, N, V, stream), &mx);
            ob_check(&mx, L, 0);
            /* the group's maxima: some rows' raised, as a larger logit elsewhere would */
            float *gmax = halloc(sizeof(float) * (size_t)N);
            for (int i = 0; i < N; i++)
                gmax[i] = mx.cpu[i] + (i % 2 ? unif(0, 2) : 0.0f);
            float *dgmax = dcopy(gmax, N);
            obuf ex, st;
            ob_make(&ex, n, 0), ob_make(&st, 2 * N, 0);
            int32_t *ltg = halloc(sizeof(int32_t) * (size_t)N), *gl = halloc(sizeof(int32_t) * (size_t)N);
            int32_t *dltg = dcopy_i(ltg, N);
            int cbad = sp_vocab_ce_exp(ex.cpu, st.cpu, ltg, logits, tg, gmax, N, V, lo, Vall);
            expect(cbad == with_bad, "vocab_ce_exp", "counts the targets outside [0,Vall)");
            snprintf(L, sizeof L, "vocab_ce_exp N=%d V=%d T=%d bad=%d", N, V, T, cbad);
            TWICE(L, sp_cuda_vocab_ce_exp(ex.d, st.d, dltg, dl, dtg, dgmax, N, V, lo, Vall, stream),
                  &ex, &st);
            ob_check(&ex, L, TOL);
            down(gl, dltg, sizeof(int32_t) * (size_t)N);
            expect(!memcmp(gl, ltg, sizeof(int32_t) * (size_t)N), L, "the same targets in the slice");
            check_close(L, st.g[0], st.cpu, N, TOL); /* the sums */
            expect(!memcmp(st.g[0], st.g[1], sizeof(float) * (size_t)N), L,
                   "two GPU runs give identical sums");
            int tok = 1;
            for (int i = 0; i < N; i++) /* the target logits: copied, or NaN where bad */
                tok &= with_bad && i == N - 1 ? isnan(st.g[0][N + i]) && isnan(st.g[1][N + i])
                                               : st.g[0][N + i] == st.cpu[N + i] &&
                                                     st.g[1][N + i] == st.cpu[N + i];
            expect(tok, L, "the target logits (NaN for a bad target)");
            /* the group's sums: raised in some rows, as other slices' exponentials would */
            float *gst = halloc(sizeof(float) * 2 * (size_t)N);
            memcpy(gst, st.cpu, sizeof(float) * 2 * (size_t)N);
            for (int i = 0; i < N; i++)
                gst[i] += i % 3 ? unif(0, 3) : 0.0f;
            float *dgst = dcopy(gst, 2 * N);
            obuf loss, pr;
            ob_make(&loss, 1, 0), ob_from(&pr, ex.cpu, n);
            sp_vocab_ce_loss(loss.cpu, pr.cpu, gmax, gst, N, V);
            snprintf(L, sizeof L, "vocab_ce_loss N=%d V=%d T=%d", N, V, T);
            TWICE(L, sp_cuda_vocab_ce_loss(loss.d, pr.d, dgmax, dgst, N, V, stream), &loss, &pr);
            ob_check(&pr, L, TOL);
            ob_check(&loss, L, TOL);
            /* the backward: the plain one on the slice, targets outside it -1 */
            float *dprobs = dcopy(pr.cpu, n);
            const float dloss = 0.61f;
            float *ddl = dcopy(&dloss, 1);
            for (int acc = 0; acc < 2; acc++) {
                obuf g;
                snprintf(L, sizeof L, "cross_entropy_backward(slice) N=%d V=%d acc=%d", N, V, acc);
                ob_make(&g, n, acc);
                sp_cross_entropy_backward(g.cpu, pr.cpu, ltg, dloss, N, V, acc);
                TWICE(L, sp_cuda_cross_entropy_backward(g.d, dprobs, dltg, ddl, 1.0f, N, V, acc,
                                                        stream), &g);
                ob_check(&g, L, TOL);
                ob_free(&g);
            }
            ob_free(&mx), ob_free(&ex), ob_free(&st), ob_free(&loss), ob_free(&pr);
            free(logits), free(tg), free(gmax), free(ltg), free(gl), free(gst);
            dfree(dl), dfree(dtg), dfree(dgmax), dfree(dltg), dfree(dgst), dfree(dprobs),
                dfree(ddl);
        }
}

static void test_sum(void)
{
    static const int64_t sizes[] = {0, 7, 37, 100003};
    char L[128];
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        const int64_t n = sizes[s];
        float *x = hrand(n, -1, 1);
        float *dx = dcopy(x, n);
        obuf o;
        snprintf(L, sizeof L, "sum_forward n=%lld", (long long)n);
        ob_make(&o, 1, 0);
        sp_sum_forward(o.cpu, x, n);
        TWICE(L, sp_cuda_sum_forward(o.d, dx, n, stream), &o);
        ob_check(&o, L, TOL);
        ob_free(&o);
        const float dout = -0.61f, mult = n > 0 ? 1.0f / (float)n : 1.0f;
        float *ddo = dcopy(&dout, 1);
        for (int acc = 0; acc < 2; acc++) {
            snprintf(L, sizeof L, "sum_backward n=%lld acc=%d", (long long)n, acc);
            ob_make(&o, n, acc);
            sp_sum_backward(o.cpu, mult * dout, n, acc);
            TWICE(L, sp_cuda_sum_backward(o.d, ddo, mult, n, acc, stream), &o);
            ob_check(&o, L, TOL);
            ob_free(&o);
        }
        free(x);
        dfree(dx), dfree(ddo);
    }
}

/* ------------------------------------------------------------------ optimizer */
static void test_optim(void)
{
    static const int64_t sizes[] = {37, 10007};
    static const int steps[] = {1, 10};
    char L[128];
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int k = 0; k < 2; k++) {
            const int64_t n = sizes[s];
            const int t = steps[k];
            float *p0 = hrand(n, -1, 1), *m0 = hrand(n, -0.1, 0.1), *v0 = hrand(n, 0, 0.01);
            float *grad = hrand(n, -1, 1);
            float *dg = dcopy(grad, n);
            obuf p, m, v;
            ob_from(&p, p0, n), ob_from(&m, m0, n), ob_from(&v, v0, n);
            const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
            sp_adamw_update(p.cpu, m.cpu, v.cpu, grad, n, lr, b1, b2, eps, wd, gs, t);
            snprintf(L, sizeof L, "adamw_update n=%lld t=%d", (long long)n, t);
            TWICE(L, sp_cuda_adamw_update(p.d, m.d, v.d, dg, n, lr, b1, b2, eps, wd, gs, t,
                                          stream), &p, &m, &v);
            snprintf(L, sizeof L, "adamw_update(param) n=%lld t=%d", (long long)n, t);
            ob_check(&p, L, TOL);
            if (verbose)
                printf("  info %s: bitwise equal to the CPU: %s\n", L,
                       memcmp(p.g[0], p.cpu, sizeof(float) * (size_t)n) ? "no" : "yes");
            snprintf(L, sizeof L, "adamw_update(m) n=%lld t=%d", (long long)n, t);
            ob_check(&m, L, TOL);
            snprintf(L, sizeof L, "adamw_update(v) n=%lld t=%d", (long long)n, t);
            ob_check(&v, L, TOL);
            ob_free(&p), ob_free(&m), ob_free(&v);
            free(p0), free(m0), free(v0), free(grad);
            dfree(dg);
        }

    static const int64_t ssq[] = {0, 37, 1048581};
    for (size_t s = 0; s < sizeof ssq / sizeof *ssq; s++) {
        const int64_t n = ssq[s];
        float *x = hrand(n, -1, 1);
        float *dx = dcopy(x, n);
        double *dout = dalloc(sizeof(double)), want = sp_sum_squares(x, n), got[2];
        snprintf(L, sizeof L, "sum_squares n=%lld", (long long)n);
        for (int rep = 0; rep < 2; rep++) {
            double junk = NAN;
            up(dout, &junk, sizeof junk);
            kstat(L, sp_cuda_sum_squares(dout, dx, n, stream));
            down(&got[rep], dout, sizeof(double));
        }
        double e = fabs(got[0] - want) / fmax(1.0, fabs(want));
        char what[96];
        snprintf(what, sizeof what, "vs CPU (double): err %.3g (tol 1e-9)", e);
        note_worst(L, e);
        expect(e <= 1e-9, L, what);
        expect(!memcmp(&got[0], &got[1], sizeof(double)), L, "two GPU runs give identical bits");
        free(x);
        dfree(dx), dfree(dout);
    }
}

/* ------------------------------------------------------------------ helpers, errors */
/* The replicas' gradient sum against the sum in replica order, ((x0 + x1) + x2) + ...
 * (codelets/stage.c's sp_reduce_task_cpu): the same adds, so the same bits, for R past one
 * launch's 8 sources and the own values anywhere. */
static void test_reduce(void)
{
    const int64_t n = 1037;
    static const int cases[][2] = { { 2, 0 }, { 2, 1 }, { 3, 1 }, { 9, 0 }, { 9, 8 }, { 12, 10 } };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const int R = cases[c][0], own = cases[c][1];
        char L[96];
        snprintf(L, sizeof L, "reduce_replicas R=%d own=%d", R, own);
        float *h[12], *d[12], *cpu = hrand(n, -1, 1), got[1037];
        for (int q = 0; q < R - 1; q++) {
            h[q] = hrand(n, -1, 1);
            d[q] = dcopy(h[q], n);
        }
        float *dd = dcopy(cpu, n);
        for (int64_t i = 0; i < n; i++) { /* x_q: own values at q == own, else the next other */
            float acc = 0.0f;
            for (int q = 0, j = 0; q < R; q++) {
                float x = q == own ? cpu[i] : h[j++][i];
                acc = q == 0 ? x : acc + x;
            }
            cpu[i] = acc;
        }
        kstat(L, sp_cuda_reduce_replicas(dd, (const float *const *)d, R, own, n, stream));
        down(got, dd, sizeof(float) * (size_t)n);
        expect(!memcmp(got, cpu, sizeof(float) * (size_t)n), L, "bitwise the CPU task's sum");
        for (int q = 0; q < R - 1; q++) free(h[q]), dfree(d[q]);
        free(cpu);
        dfree(dd);
    }
}

static void test_misc(void)
{
    float *d = dalloc(sizeof(float) * 37), h[37];
    kstat("set_scalar", sp_cuda_set_scalar(d + 5, 0.125f, stream));
    down(h, d + 5, sizeof(float));
    expect(h[0] == 0.125f, "set_scalar", "writes the value");
    kstat("fill_zero", sp_cuda_fill_zero(d, 37, stream));
    down(h, d, sizeof h);
    int zero = 1;
    for (int i = 0; i < 37; i++)
        zero &= h[i] == 0.0f && !signbit(h[i]);
    expect(zero, "fill_zero", "37 floats are +0");
    expect(sp_cuda_matmul_forward(d, d, d, 1, 1, 1, 0, 0, 0, stream, NULL) == SP_CUDA_ERR_ARG,
           "matmul_forward(NULL handle)", "returns SP_CUDA_ERR_ARG");
    expect(sp_cuda_status_string(SP_CUDA_ERR_CUBLAS_BASE + 13) != NULL &&
               sp_cuda_status_string(1) != NULL,
           "status_string", "names CUDA and cuBLAS errors");
    dfree(d);
}

/* ------------------------------------------------------------------ throughput */
/* out (S,S) = a (S,S) b (S,S): checks the first rows against the CPU, then times it with
 * TF32 off and on. Reported, not enforced: the H200's fp32 peak is ~67 TFLOP/s (SXM); a
 * number far below that means a wrong math mode or a throttled GPU. */
static void test_matmul_rate(int S)
{
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
        kstat(L, sp_cuda_matmul_forward(dc, da_, db_, S, S, S, 0, 0, 0, stream, blas));
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
            kstat("matmul rate", sp_cuda_matmul_forward(dc, da_, db_, S, S, S, 0, 0, 0, stream,
                                                        blas));
        CK(cudaEventRecord(e0, stream));
        for (int r = 0; r < reps; r++)
            kstat("matmul rate", sp_cuda_matmul_forward(dc, da_, db_, S, S, S, 0, 0, 0, stream,
                                                        blas));
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
static void test_attention_rate(int S, int bf16, int kv_group)
{
    int (*fwd)(float *, float *, float *, const float *, int, int, int, int, int, void *,
               void *) = bf16 ? sp_cuda_attention_forward_bf16 : sp_cuda_attention_forward;
    int (*bwd)(float *, float *, const float *, const float *, const float *, const float *,
               int, int, int, int, int, int, void *, void *) =
        bf16 ? sp_cuda_attention_backward_bf16 : sp_cuda_attention_backward;
    const int B = 1, T = S / 2, C = S, NH = C / 128 > 0 ? C / 128 : 1, reps = 3;
    int G = 0; /* kv_group: the largest of 4, 2, 1 that divides NH */
    for (int g = 4; kv_group && !G; g /= 2)
        G = NH % g ? 0 : g;
    const int64_t nqkv = (int64_t)B * T * qkv_width(C, NH, G), nout = (int64_t)B * T * C;
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
        kstat(L, fwd(o, lse, scr, dq, B, T, C, NH, G, stream, blas));
        kstat(L, bwd(g, scr, dd, dq, o, lse, B, T, C, NH, G, 0, stream, blas));
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
        kstat(L, fwd(o, lse, scr, dq, B, T, C, NH, G, stream, blas));
    CK(cudaEventRecord(e[1], stream));
    for (int r = 0; r < reps; r++)
        kstat(L, bwd(g, scr, dd, dq, o, lse, B, T, C, NH, G, 0, stream, blas));
    CK(cudaEventRecord(e[2], stream));
    CK(cudaEventSynchronize(e[2]));
    float fms = 0.0f, bms = 0.0f;
    CK(cudaEventElapsedTime(&fms, e[0], e[1]));
    CK(cudaEventElapsedTime(&bms, e[1], e[2]));
    const double flops = 2.0 * B * T * (double)T * C, tf = fms / 1e3 / reps;
    const double tb = bms / 1e3 / reps;
    printf("attention B=%d T=%d C=%d NH=%d G=%d %s: forward %.3f ms, %.1f TFLOP/s; "
           "backward %.3f ms, %.1f TFLOP/s\n", B, T, C, NH, G, bf16 ? "bf16" : "fp32", tf * 1e3,
           flops / tf / 1e12, tb * 1e3, 2 * flops / tb / 1e12);
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
    int rc = sp_cuda_kernels_init(blas);
    if (rc != SP_CUDA_OK) {
        fprintf(stderr, "FAIL: sp_cuda_kernels_init: %s\n", sp_cuda_status_string(rc));
        return 1;
    }

    test_matmul();
    test_bf16();
    test_bias();
    test_pointwise();
    test_layernorm();
    test_rmsnorm();
    test_embed();
    test_embed_vocab();
    test_rope();
    test_swiglu();
    test_attention();
    test_attention_bf16();
    test_cross_entropy();
    test_cross_entropy_vocab();
    test_sum();
    test_optim();
    test_misc();
    test_reduce();
    test_matmul_rate(rate_size);
    test_attention_rate(rate_size, 0, 0);
    test_attention_rate(rate_size, 1, 0);
    test_attention_rate(rate_size, 0, 1);
    test_attention_rate(rate_size, 1, 1);

    printf("worst error vs CPU per op:\n");
    for (int i = 0; i < n_worst; i++)
        printf("  %-28s %.3g\n", worst[i].op, worst[i].worst);
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
