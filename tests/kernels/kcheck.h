/* Helpers shared by the kernel tests: a seeded RNG, float64 finite differences, and a
 * comparison that counts failures (NaN never passes). Each test's main returns
 * kc_finish(), which is non-zero when any check failed. */
#ifndef STARPIPE_TESTS_KCHECK_H
#define STARPIPE_TESTS_KCHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int kc_failures, kc_checks;
static int kc_verbose; /* set by KC_VERBOSE=1: print every check, not only failures */

static uint64_t kc_state = 0x9E3779B97F4A7C15ull;
static inline void kc_seed(uint64_t s) { kc_state = s * 0x9E3779B97F4A7C15ull + 1; }
static inline uint64_t kc_next(void) /* xorshift64* */
{
    kc_state ^= kc_state >> 12;
    kc_state ^= kc_state << 25;
    kc_state ^= kc_state >> 27;
    return kc_state * 0x2545F4914F6CDD1Dull;
}
/* Uniform in [-1, 1). */
static inline double kc_uniform(void) { return (double)(kc_next() >> 11) * 0x1.0p-52 - 1.0; }
static inline void kc_fill(float *x, int64_t n, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * 0.5 * (kc_uniform() + 1.0));
}
static inline void kc_fill_nan(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = NAN;
}
static inline void kc_to_double(double *d, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        d[i] = x[i];
}

static inline void *kc_alloc(size_t bytes)
{
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) {
        fprintf(stderr, "FAIL: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}
#define KC_F(n) ((float *)kc_alloc(sizeof(float) * (size_t)(n)))
#define KC_D(n) ((double *)kc_alloc(sizeof(double) * (size_t)(n)))

/* Scaled max error max|got - want| / max(1, max|want|); NaN in either gives NaN. */
static inline double kc_err(const float *got, const double *want, int64_t n)
{
    double e = 0.0, m = 1.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= e))
            e = d; /* also catches NaN: !(NaN <= e) */
        if (fabs(want[i]) > m)
            m = fabs(want[i]);
    }
    return e / m;
}

/* Records one check; the worst error seen per tag is kept for the summary line. */
static double kc_worst;
static inline int kc_check(const char *what, const float *got, const double *want, int64_t n,
                    double tol)
{
    double e = kc_err(got, want, n);
    kc_checks++;
    if (!(e <= tol)) {
        kc_failures++;
        fprintf(stderr, "FAIL: %s: scaled error %.3g > tol %.3g\n", what, e, tol);
        return 1;
    }
    if (!(e <= kc_worst))
        kc_worst = e;
    if (kc_verbose)
        printf("  ok %-60s err %.2e (tol %.0e)\n", what, e, tol);
    return 0;
}

/* A true/false check with a message. */
static inline int kc_expect(int cond, const char *what)
{
    kc_checks++;
    if (!cond) {
        kc_failures++;
        fprintf(stderr, "FAIL: %s\n", what);
        return 1;
    }
    return 0;
}

/* Gradient of loss() with respect to x (n), by central differences in float64. loss
 * reads x through ctx. h = 1e-6: truncation ~h^2 |f'''| ~ 1e-12, rounding
 * ~1e-16 |L| / h ~ 1e-10 |L|, both far below the fp32 errors being measured. */
#define KC_FD_H 1e-6
static inline void kc_fd_grad(double *g, double *x, int64_t n, double (*loss)(void *), void *ctx)
{
    for (int64_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + KC_FD_H;
        double lp = loss(ctx);
        x[i] = x0 - KC_FD_H;
        double lm = loss(ctx);
        x[i] = x0;
        g[i] = (lp - lm) / (2.0 * KC_FD_H);
    }
}

/* sum(out * r) in float64: the random scalar projection all gradient checks use. */
static inline double kc_project(const double *out, const float *r, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += out[i] * (double)r[i];
    return s;
}

/* want (n) = base (float) + delta (double): the expected result of an acc=1 call. */
static inline void kc_plus(double *want, const float *base, const double *delta, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        want[i] = (double)base[i] + delta[i];
}

/* A kernel's output before a call with `acc`: base (acc = 1 adds into it), else NaN (acc = 0
 * must overwrite every element). */
static inline void kc_acc_init(float *out, const float *base, int64_t n, int acc)
{
    if (acc)
        memcpy(out, base, sizeof(float) * (size_t)n);
    else
        kc_fill_nan(out, n);
}

/* What that call must give: base + delta for acc = 1, delta for acc = 0. */
static inline void kc_acc_want(double *want, const float *base, const double *delta, int64_t n,
                               int acc)
{
    if (acc)
        kc_plus(want, base, delta, n);
    else
        memcpy(want, delta, sizeof(double) * (size_t)n);
}

static inline void kc_start(void)
{
    const char *v = getenv("KC_VERBOSE");
    kc_verbose = v && v[0] == '1';
}

static inline int kc_finish(const char *name)
{
    if (kc_failures) {
        fprintf(stderr, "%s: %d of %d checks FAILED\n", name, kc_failures, kc_checks);
        return 1;
    }
    if (kc_checks == 0) {
        fprintf(stderr, "%s: no checks ran\n", name);
        return 1;
    }
    printf("%s: all %d checks passed (worst scaled error %.2e)\n", name, kc_checks, kc_worst);
    return 0;
}

#endif
