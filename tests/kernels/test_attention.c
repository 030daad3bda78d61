/* Causal multi-head attention forward (out and saved probabilities) and backward
 * against a float64 reference and central finite differences on the packed qkv. */
#include "codelets/cpu/kernels.h"
#include "kcheck.h"

/* Scores are fp32 dots of hs <= 32 terms through expf and a T-term normalisation, then
 * a T-term weighted sum: observed scaled errors <= 2.3e-7 for inputs in [-1,1], so 2e-6
 * (~9x), far below what a wrong scale (1/C vs 1/hs), a missing causal mask or a dropped
 * softmax term give. With inputs in [-8,8] the scores reach |s| ~ 100 and their own
 * rounding u |s| ~ 6e-6 passes straight through exp (observed 7e-7): TOL_PEAKED 1e-5. */
#define TOL 2e-6
#define TOL_PEAKED 1e-5

typedef struct {
    int B, T, C, NH;
    double *qkv, *out, *att;
    const float *r;
} at_ctx;

static void ref_forward(at_ctx *c)
{
    int B = c->B, T = c->T, C = c->C, NH = c->NH, hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *s = kc_alloc(sizeof(double) * (size_t)T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const double *q = c->qkv + ((int64_t)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, z = 0;
                for (int u = 0; u <= t; u++) {
                    const double *k = c->qkv + ((int64_t)b * T + u) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int i = 0; i < hs; i++)
                        d += q[i] * k[i];
                    s[u] = d * scale;
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++)
                    z += exp(s[u] - mx);
                double *a = c->att + (((int64_t)b * NH + h) * T + t) * T;
                for (int u = 0; u < T; u++)
                    a[u] = u <= t ? exp(s[u] - mx) / z : 0.0;
                for (int i = 0; i < hs; i++) {
                    double o = 0;
                    for (int u = 0; u <= t; u++)
                        o += a[u] * c->qkv[((int64_t)b * T + u) * 3 * C + 2 * C + h * hs + i];
                    c->out[((int64_t)b * T + t) * C + h * hs + i] = o;
                }
            }
    free(s);
}
static double ref_loss(void *p)
{
    at_ctx *c = p;
    ref_forward(c);
    return kc_project(c->out, c->r, (int64_t)c->B * c->T * c->C);
}

static void run_case(int B, int T, int C, int NH, double spread, uint64_t seed)
{
    char what[160];
    const double tol = spread > 1.0 ? TOL_PEAKED : TOL;
    int64_t nq = (int64_t)B * T * 3 * C, no = (int64_t)B * T * C;
    int64_t na = (int64_t)B * NH * T * T, ns = sp_attention_scratch_floats(B, T, C, NH);
    kc_seed(seed);
    float *qkv = KC_F(nq), *r = KC_F(no), *out = KC_F(no), *att = KC_F(na);
    float *dq = KC_F(nq), *base = KC_F(nq), *scratch = KC_F(ns);
    double *qd = KC_D(nq), *od = KC_D(no), *ad = KC_D(na), *g = KC_D(nq), *want = KC_D(nq);
    kc_fill(qkv, nq, -spread, spread);
    kc_fill(r, no, -1, 1);
    kc_fill(base, nq, -1, 1);
    kc_to_double(qd, qkv, nq);
    at_ctx c = {B, T, C, NH, qd, od, ad, r};
    ref_forward(&c);
#define TAG(t) (snprintf(what, sizeof what, "attention B%d T%d C%d NH%d x%g seed%llu %s", B, \
                         T, C, NH, spread, (unsigned long long)seed, t), what)
    kc_fill_nan(out, no);
    kc_fill_nan(att, na);
    sp_attention_forward(out, att, qkv, B, T, C, NH);
    kc_check(TAG("forward out"), out, od, no, tol);
    kc_check(TAG("forward att"), att, ad, na, tol);
    int upper_zero = 1;
    for (int64_t row = 0; row < (int64_t)B * NH * T; row++)
        for (int u = (int)(row % T) + 1; u < T; u++)
            upper_zero &= att[row * T + u] == 0.0f;
    kc_expect(upper_zero, TAG("att upper triangle is exactly zero"));

    kc_fd_grad(g, qd, nq, ref_loss, &c);
    for (int acc = 0; acc < 2; acc++) {
        if (acc)
            memcpy(dq, base, sizeof(float) * (size_t)nq);
        else
            kc_fill_nan(dq, nq);
        kc_fill_nan(scratch, ns); /* scratch is output-only */
        sp_attention_backward(dq, scratch, r, qkv, att, B, T, C, NH, acc);
        if (acc)
            kc_plus(want, base, g, nq);
        else
            memcpy(want, g, sizeof(double) * (size_t)nq);
        kc_check(TAG(acc ? "dqkv acc=1 vs finite differences" : "dqkv vs finite differences"),
                 dq, want, nq, tol);
    }
#undef TAG
    free(qkv); free(r); free(out); free(att); free(dq); free(base); free(scratch);
    free(qd); free(od); free(ad); free(g); free(want);
}

int main(void)
{
    kc_start();
    static const int cfg[][4] = {/* B, T, C, NH */
                                 {2, 5, 12, 3},  {1, 7, 33, 3}, {2, 13, 16, 2},
                                 {1, 6, 64, 2},  {1, 1, 8, 1},  {3, 4, 10, 5}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
        for (uint64_t seed = 1; seed <= 3; seed++)
            run_case(cfg[i][0], cfg[i][1], cfg[i][2], cfg[i][3], 1.0, seed);
    /* Peaked softmax: scores of +-30 must not overflow expf. */
    run_case(1, 9, 12, 3, 8.0, 4);
    return kc_finish("test_kernels_attention");
}
