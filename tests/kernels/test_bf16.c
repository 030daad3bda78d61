/* bfloat16 mixed precision on the CPU (the reference a GPU's bf16 run is checked against):
 * sp_round_bf16 against an independent rounding in double arithmetic (nearest, ties to
 * even, over random floats, every exponent, ties, subnormals, overflow, infinities, NaN);
 * sp_to_bf16 (bf16 storage) against the same independent rounding; the three _bf16
 * products against float64 products of the rounded operands, which they must match to
 * fp32 accumulation error while differing from the fp32 products; and each product with
 * its operands given in bf16 storage, bitwise equal to the product of the fp32 ones. And
 * an operand too large for memory: each product and the CPU table's entries return
 * SP_KERNEL_NOMEM with its message, and the process goes on (it used to abort). */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "codelets/cpu/kernels.h"
#include "starpipe/backend.h"
#include "tests/kernels/kcheck.h"

/* The bf16 value nearest to x, ties to even: from the two bf16 neighbours, in double. */
static float nearest_bf16(float x)
{
    if (isnan(x) || isinf(x)) return x;
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t lo_bits = u & 0xffff0000u, hi_bits = lo_bits + 0x10000u;
    float lo, hi;
    memcpy(&lo, &lo_bits, 4);
    memcpy(&hi, &hi_bits, 4); /* the next bf16 away from zero (may be infinity) */
    double dl = fabs((double)x - (double)lo);
    /* past the largest bf16 the next value is 2^128 (IEEE rounds as if the exponent went
     * on, then overflows to infinity) */
    double dh = isinf(hi) ? ldexp(1.0, 128) - fabs((double)x) : fabs((double)hi - (double)x);
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return (lo_bits >> 16) & 1 ? hi : lo; /* a tie: the even mantissa */
}

static void rounding(void)
{
    enum { N = 200000 };
    float *x = KC_F(N), *y = KC_F(N);
    int64_t n = 0;
    for (; n < 100000; n++) { /* random bits: every exponent, sign and mantissa */
        uint32_t u = (uint32_t)kc_next();
        memcpy(&x[n], &u, 4);
    }
    for (int e = -149; e < 128 && n < N - 8; e++) { /* ties and near-ties at every scale */
        float base = ldexpf(1.0f, e);
        x[n++] = base;
        x[n++] = base * (1.0f + 0x1p-8f);          /* exactly halfway: ties to even */
        x[n++] = base * (1.0f + 0x1p-8f + 0x1p-7f); /* halfway above an odd one: up */
        x[n++] = base * (1.0f + 0x1p-8f + 0x1p-20f);
        x[n++] = -base * (1.0f + 0x1p-9f);
    }
    x[n++] = 3.4028235e38f; /* FLT_MAX rounds to infinity */
    x[n++] = -3.4028235e38f;
    x[n++] = INFINITY;
    x[n++] = -INFINITY;
    x[n++] = 0.0f;
    x[n++] = -0.0f;
    x[n++] = 1.401298464e-45f; /* the smallest subnormal */
    sp_round_bf16(y, x, n);
    int bad = 0, nan_ok = 1;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) {
            uint32_t u;
            memcpy(&u, &y[i], 4);
            nan_ok &= isnan(y[i]) && (u & 0xffff) == 0;
            continue;
        }
        float want = nearest_bf16(x[i]);
        if (memcmp(&want, &y[i], 4)) {
            if (bad++ < 5)
                fprintf(stderr, "round_bf16(%a) = %a, want %a\n", (double)x[i], (double)y[i],
                        (double)want);
        }
    }
    kc_expect(bad == 0, "sp_round_bf16 is round to nearest, ties to even");
    kc_expect(nan_ok, "NaN stays a NaN with a 16-bit pattern");
    float z[2] = { 3.4028235e38f, 0x1.00ff00p0f }, w[2];
    sp_round_bf16(w, z, 2);
    kc_expect(isinf(w[0]) && w[1] == 0x1.00p0f, "overflow to infinity; a tie to even");
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n);
    sp_to_bf16(h, x, n);
    int bad16 = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        float got;
        memcpy(&got, &u, 4);
        float want = nearest_bf16(x[i]);
        bad16 += isnan(x[i]) ? !isnan(got) : memcmp(&got, &want, 4) != 0;
    }
    kc_expect(bad16 == 0, "sp_to_bf16 stores the nearest bf16, ties to even, NaN a NaN");
    free(h);
    sp_round_bf16(x, x, n); /* in place */
    kc_expect(!memcmp(x, y, sizeof(float) * (size_t)n), "in place gives the same bits");
    free(x), free(y);
}

/* Row-major op(a) (M,K), op(b) (K,Nc) in double, of operands already rounded. */
static void ref_mm(double *c, const float *a, const float *b, int M, int Nc, int K, int ta,
                   int tb)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < Nc; j++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)(ta ? a[k * M + i] : a[i * K + k]) *
                     (double)(tb ? b[j * K + k] : b[k * Nc + j]);
            c[i * Nc + j] = s;
        }
}

/* Operands in bf16 storage (sp_to_bf16) give bitwise the products of the fp32 operands,
 * each way they can be given, assigning and accumulating. */
static void stored(const float *as, const float *bs, const float *dout, int M, int Nc, int K,
                   int ta, int tb)
{
    uint16_t *a16 = malloc(sizeof(uint16_t) * (size_t)(M * K));
    uint16_t *b16 = malloc(sizeof(uint16_t) * (size_t)(K * Nc));
    float *want = KC_F(M * K + K * Nc + M * Nc), *got = KC_F(M * K + K * Nc + M * Nc);
    sp_to_bf16(a16, as, M * K);
    sp_to_bf16(b16, bs, K * Nc);
    char what[96];
    for (int acc = 0; acc <= 1; acc++) {
        for (int which = 1; which <= 3; which++) { /* a, b, both stored */
            kc_fill(want, M * Nc, -1, 1);
            memcpy(got, want, sizeof(float) * (size_t)(M * Nc));
            sp_matmul_forward_bf16(want, as, bs, M, Nc, K, ta, tb, acc, 0, 0);
            sp_matmul_forward_bf16(got, which & 1 ? (const void *)a16 : as,
                                   which & 2 ? (const void *)b16 : bs, M, Nc, K, ta, tb, acc,
                                   which & 1, which >> 1);
            snprintf(what, sizeof what, "forward, %s in bf16 storage, ta=%d tb=%d acc=%d: "
                     "same bits", which == 1 ? "a" : which == 2 ? "b" : "a and b", ta, tb, acc);
            kc_expect(!memcmp(got, want, sizeof(float) * (size_t)(M * Nc)), what);
        }
        kc_fill(want, M * K, -1, 1);
        memcpy(got, want, sizeof(float) * (size_t)(M * K));
        sp_matmul_backward_a_bf16(want, dout, bs, M, Nc, K, ta, tb, acc, 0);
        sp_matmul_backward_a_bf16(got, dout, b16, M, Nc, K, ta, tb, acc, 1);
        snprintf(what, sizeof what, "backward a, b in bf16 storage, ta=%d tb=%d acc=%d: same bits",
                 ta, tb, acc);
        kc_expect(!memcmp(got, want, sizeof(float) * (size_t)(M * K)), what);
        kc_fill(want, K * Nc, -1, 1);
        memcpy(got, want, sizeof(float) * (size_t)(K * Nc));
        sp_matmul_backward_b_bf16(want, dout, as, M, Nc, K, ta, tb, acc, 0);
        sp_matmul_backward_b_bf16(got, dout, a16, M, Nc, K, ta, tb, acc, 1);
        snprintf(what, sizeof what, "backward b, a in bf16 storage, ta=%d tb=%d acc=%d: same bits",
                 ta, tb, acc);
        kc_expect(!memcmp(got, want, sizeof(float) * (size_t)(K * Nc)), what);
    }
    free(a16), free(b16), free(want), free(got);
}

static void products(void)
{
    const int M = 37, Nc = 29, K = 53;
    float *a = KC_F(M * K), *b = KC_F(K * Nc), *ar = KC_F(M * K), *br = KC_F(K * Nc);
    float *c = KC_F(M * Nc), *c32 = KC_F(M * Nc), *dout = KC_F(M * Nc), *dr = KC_F(M * Nc);
    float *da = KC_F(M * K), *db = KC_F(K * Nc), *bt = KC_F(K * Nc);
    double *want = KC_D(M * Nc), *wa = KC_D(M * K), *wb = KC_D(K * Nc);
    kc_fill(a, M * K, -1, 1);
    kc_fill(b, K * Nc, -1, 1);
    kc_fill(dout, M * Nc, -1, 1);
    sp_round_bf16(ar, a, M * K);
    sp_round_bf16(br, b, K * Nc);
    sp_round_bf16(dr, dout, M * Nc);
    for (int ta = 0; ta <= 1; ta++)
        for (int tb = 0; tb <= 1; tb++) {
            /* the stored layouts of op(a), op(b) */
            float *as = KC_F(M * K), *bs = KC_F(K * Nc), *asr = KC_F(M * K), *bsr = KC_F(K * Nc);
            for (int i = 0; i < M; i++)
                for (int k = 0; k < K; k++) as[ta ? k * M + i : i * K + k] = a[i * K + k];
            for (int k = 0; k < K; k++)
                for (int j = 0; j < Nc; j++) bs[tb ? j * K + k : k * Nc + j] = b[k * Nc + j];
            sp_round_bf16(asr, as, M * K);
            sp_round_bf16(bsr, bs, K * Nc);
            char what[96];
            sp_matmul_forward_bf16(c, as, bs, M, Nc, K, ta, tb, 0, 0, 0);
            sp_matmul_forward(c32, as, bs, M, Nc, K, ta, tb, 0);
            ref_mm(want, asr, bsr, M, Nc, K, ta, tb);
            snprintf(what, sizeof what, "bf16 forward ta=%d tb=%d vs float64 of bf16 operands", ta, tb);
            kc_check(what, c, want, M * Nc, 1e-5);
            snprintf(what, sizeof what, "bf16 forward ta=%d tb=%d differs from fp32", ta, tb);
            kc_expect(memcmp(c, c32, sizeof(float) * (size_t)(M * Nc)) != 0, what);
            /* dA = dout op(b)^T; dB = op(a)^T dout, laid out as the operand is stored */
            sp_matmul_backward_a_bf16(da, dout, bs, M, Nc, K, ta, tb, 0, 0);
            for (int i = 0; i < M; i++)
                for (int k = 0; k < K; k++) {
                    double s = 0;
                    for (int j = 0; j < Nc; j++)
                        s += (double)dr[i * Nc + j] * (double)bsr[tb ? j * K + k : k * Nc + j];
                    wa[ta ? k * M + i : i * K + k] = s;
                }
            snprintf(what, sizeof what, "bf16 backward a ta=%d tb=%d", ta, tb);
            kc_check(what, da, wa, M * K, 1e-5);
            sp_matmul_backward_b_bf16(db, dout, as, M, Nc, K, ta, tb, 0, 0);
            for (int k = 0; k < K; k++)
                for (int j = 0; j < Nc; j++) {
                    double s = 0;
                    for (int i = 0; i < M; i++)
                        s += (double)asr[ta ? k * M + i : i * K + k] * (double)dr[i * Nc + j];
                    wb[tb ? j * K + k : k * Nc + j] = s;
                }
            snprintf(what, sizeof what, "bf16 backward b ta=%d tb=%d", ta, tb);
            kc_check(what, db, wb, K * Nc, 1e-5);
            stored(as, bs, dout, M, Nc, K, ta, tb);
            free(as), free(bs), free(asr), free(bsr);
        }
    free(a), free(b), free(ar), free(br), free(c), free(c32), free(dout), free(dr), free(da);
    free(db), free(bt), free(want), free(wa), free(wb);
}

/* Under AddressSanitizer (scripts/sanitize) a failed allocation must return NULL, as
 * malloc does, rather than end the process: that is what this test is about. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* 2^40 floats (4 TiB) for the rounded copy of one operand, with the address space capped
 * at this process's size + 1 GiB (whatever the machine's overcommit policy), so the
 * allocation fails before any operand is read (they are a few floats here: the first
 * operand each product rounds is the large one). The output must be left as it was. */
static void out_of_memory(void)
{
    struct rlimit saved, cap;
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld", &pages) != 1) pages = 0;
    if (f) fclose(f);
    int capped = getrlimit(RLIMIT_AS, &saved) == 0 && pages > 0;
    if (capped) {
        cap = saved;
        rlim_t want = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)1 << 30);
        if (saved.rlim_cur == RLIM_INFINITY || want < saved.rlim_cur) cap.rlim_cur = want;
        capped = setrlimit(RLIMIT_AS, &cap) == 0;
    }
    const int big = 1 << 20;
    float x[4] = { 1, 2, 3, 4 }, out[4] = { 7, 7, 7, 7 };
    kc_expect(sp_matmul_forward_bf16(out, x, x, big, 1, big, 0, 0, 0, 0, 0) == SP_KERNEL_NOMEM,
              "forward bf16: an operand too large for memory returns SP_KERNEL_NOMEM");
    kc_expect(sp_matmul_backward_a_bf16(out, x, x, big, big, 1, 0, 0, 0, 0) == SP_KERNEL_NOMEM,
              "backward a bf16: out of memory returns SP_KERNEL_NOMEM");
    kc_expect(sp_matmul_backward_b_bf16(out, x, x, big, big, 1, 0, 0, 0, 0) == SP_KERNEL_NOMEM,
              "backward b bf16: out of memory returns SP_KERNEL_NOMEM");
    kc_expect(out[0] == 7 && out[3] == 7, "out of memory: the output is untouched");
    const sp_backend *be = sp_backend_cpu();
    int rc = be->matmul(NULL, out, x, x, big, 1, big, 0, 0, 0, SP_PREC_BF16);
    kc_expect(rc == SP_KERNEL_NOMEM, "CPU table: matmul bf16 out of memory fails");
    kc_expect(rc && strstr(be->status_string(rc), "out of memory") != NULL,
              "CPU table: its status string says out of memory");
    kc_expect(be->matmul_da(NULL, out, x, x, big, big, 1, 0, 0, 0, SP_PREC_BF16) != 0 &&
              be->matmul_db(NULL, out, x, x, big, big, 1, 0, 0, 0, SP_PREC_BF16) != 0,
              "CPU table: matmul_da / matmul_db bf16 out of memory fail");
    if (capped) setrlimit(RLIMIT_AS, &saved);
    /* and the next product, of a size that fits, still works */
    kc_expect(sp_matmul_forward_bf16(out, x, x, 2, 2, 2, 0, 0, 0, 0, 0) == 0 && out[0] == 7.0f,
              "after out of memory: a small product works (1*1 + 2*3 = 7)");
}

int main(void)
{
    kc_start();
    rounding();
    products();
    out_of_memory();
    return kc_finish("test_bf16");
}
