/* AdamW against an independent float64 AdamW (PyTorch's definition: decoupled weight
 * decay p -= lr wd p, bias-corrected moments) over several steps; sum of squares. */
#include "codelets/cpu/kernels.h"
#include "kcheck.h"

/* Each step is ~10 fp32 operations per element, each within u = 6e-8 of its operands
 * (|p|, |m|/sqrt(v) <= ~1): 10 steps bound the parameter error near 100 u = 6e-6,
 * observed 2.4e-7. TOL 1e-6 sits between; with lr = 0.05 each step moves p by ~0.05, so
 * a missing bias correction, a coupled (L2) decay or a wrong eps placement all exceed it
 * by orders of magnitude. m and v are compared relative to their largest entry. */
#define TOL 1e-6

typedef struct {
    float lr, b1, b2, eps, wd, gs;
} hp;

static void ref_adamw(double *p, double *m, double *v, const float *grad, int64_t n, hp h, int t)
{
    double bc1 = 1.0 - pow(h.b1, t), bc2 = 1.0 - pow(h.b2, t);
    for (int64_t i = 0; i < n; i++) {
        double g = (double)grad[i] * h.gs;
        p[i] -= (double)h.lr * h.wd * p[i]; /* decoupled: on p, not through g */
        m[i] = h.b1 * m[i] + (1.0 - h.b1) * g;
        v[i] = h.b2 * v[i] + (1.0 - h.b2) * g * g;
        double mhat = m[i] / bc1, vhat = v[i] / bc2;
        p[i] -= h.lr * mhat / (sqrt(vhat) + h.eps);
    }
}

/* kc_check relative to the largest entry of want instead of max(1, .). */
static void check_rel(const char *what, const float *got, const double *want, int64_t n)
{
    double mx = 0;
    for (int64_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(want[i]));
    if (mx == 0)
        mx = 1;
    float *g = KC_F(n);
    double *w = KC_D(n);
    for (int64_t i = 0; i < n; i++) {
        g[i] = (float)(got[i] / mx);
        w[i] = want[i] / mx;
    }
    kc_check(what, g, w, n, TOL);
    free(g);
    free(w);
}

static void run_case(const char *name, int64_t n, hp h, double gmag, int t0, int steps,
                     uint64_t seed)
{
    char what[160];
    kc_seed(seed);
    float *p = KC_F(n), *m = KC_F(n), *v = KC_F(n), *g = KC_F(n);
    double *pd = KC_D(n), *md = KC_D(n), *vd = KC_D(n);
    kc_fill(p, n, -1, 1);
    kc_to_double(pd, p, n);
    for (int s = 0; s < steps; s++) {
        int t = t0 + s;
        kc_fill(g, n, -gmag, gmag);
        sp_adamw_update(p, m, v, g, n, h.lr, h.b1, h.b2, h.eps, h.wd, h.gs, t);
        ref_adamw(pd, md, vd, g, n, h, t);
    }
    snprintf(what, sizeof what, "adamw %s n%lld seed%llu: param after %d steps", name,
             (long long)n, (unsigned long long)seed, steps);
    kc_check(what, p, pd, n, TOL);
    snprintf(what, sizeof what, "adamw %s n%lld seed%llu: m", name, (long long)n,
             (unsigned long long)seed);
    check_rel(what, m, md, n);
    snprintf(what, sizeof what, "adamw %s n%lld seed%llu: v", name, (long long)n,
             (unsigned long long)seed);
    check_rel(what, v, vd, n);
    free(p); free(m); free(v); free(g); free(pd); free(md); free(vd);
}

static void run_sumsq(int64_t n, uint64_t seed)
{
    char what[80];
    kc_seed(seed);
    float *x = KC_F(n);
    kc_fill(x, n, -3, 3);
    double ref = 0;
    for (int64_t i = 0; i < n; i++)
        ref += (double)x[i] * x[i];
    double got = sp_sum_squares(x, n);
    /* Both are double sums of exact products (a float squared fits in a double): only
     * the summation order differs, n u_64 ~ 1e-11 at most. */
    snprintf(what, sizeof what, "sum_squares n%lld within 1e-12 relative", (long long)n);
    kc_expect(fabs(got - ref) <= 1e-12 * fmax(ref, 1e-300) || got == ref, what);
    free(x);
}

int main(void)
{
    kc_start();
    const hp base = {0.05f, 0.9f, 0.999f, 1e-8f, 0.1f, 1.0f};
    for (uint64_t seed = 1; seed <= 3; seed++) {
        run_case("default", 37, base, 1.0, 1, 10, seed);
        hp s = base;
        s.gs = 0.37f; /* clipping scale */
        run_case("grad_scale", 13, s, 2.0, 1, 10, seed);
        s = base;
        s.wd = 0.0f;
        s.eps = 1e-6f; /* gradients ~1e-6: eps is as large as sqrt(v) */
        run_case("tiny grads", 33, s, 1e-6, 1, 10, seed);
        run_case("late steps", 7, base, 1.0, 5000, 3, seed); /* bias corrections ~1 */
        s = base;
        s.b1 = 0.0f;
        s.b2 = 0.0f; /* no memory: the update is lr sign(g) for |g| >> eps */
        run_case("beta 0", 7, s, 1.0, 1, 3, seed);
    }
    /* Zero gradients: only weight decay acts, p (1 - lr wd)^t. */
    run_case("decay only", 13, base, 0.0, 1, 10, 4);

    run_sumsq(0, 1);
    run_sumsq(37, 2);
    run_sumsq(100003, 3);
    return kc_finish("test_kernels_optim");
}
