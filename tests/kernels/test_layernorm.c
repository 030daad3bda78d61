/* LayerNorm forward (out, mean, rstd) and both backwards against a float64 reference and
 * central finite differences; C = 600 crosses the kernel's 512-float staging chunk. Then
 * LayerNorm's and RMSNorm's bits against a scalar transcription of the kernels' order
 * (layernorm.c): the row sums' order fixes every step's bits. */
#include "codelets/cpu/kernels.h"
#include "codelets/cpu/vec_impl.h"
#include "kcheck.h"

/* Row statistics are fp32 sums over C <= 600 terms: observed scaled errors <= 2.3e-7
 * for zero-mean rows, so 2e-6 (~10x). With |mean| = 100 std, x - mean itself rounds at
 * u |mean| / std = 6e-6 (observed 8e-6), hence TOL_OFFSET = 5e-5; a one-pass variance
 * (E[x^2] - E[x]^2) would be off by ~u mean^2 / var ~ 1e-3 there and fail. */
#define TOL 2e-6
#define TOL_OFFSET 5e-5

typedef struct {
    int N, C;
    double *x, *gamma, *beta, *out;
    const float *r;
} ln_ctx;

static void ref_forward(ln_ctx *c, double *mean, double *rstd)
{
    for (int n = 0; n < c->N; n++) {
        const double *x = c->x + (int64_t)n * c->C;
        double m = 0, v = 0;
        for (int i = 0; i < c->C; i++)
            m += x[i];
        m /= c->C;
        for (int i = 0; i < c->C; i++)
            v += (x[i] - m) * (x[i] - m);
        v /= c->C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int i = 0; i < c->C; i++)
            c->out[(int64_t)n * c->C + i] = (x[i] - m) * s * c->gamma[i] + c->beta[i];
        if (mean)
            mean[n] = m;
        if (rstd)
            rstd[n] = s;
    }
}
static double ref_loss(void *p)
{
    ln_ctx *c = p;
    ref_forward(c, NULL, NULL);
    return kc_project(c->out, c->r, (int64_t)c->N * c->C);
}

static void run_case(int N, int C, double offset, double spread, uint64_t seed)
{
    const double TOL_CASE = offset != 0.0 ? TOL_OFFSET : TOL;
    char what[160];
    int64_t n = (int64_t)N * C;
    kc_seed(seed);
    float *x = KC_F(n), *gm = KC_F(C), *bt = KC_F(C), *r = KC_F(n), *out = KC_F(n);
    float *mean = KC_F(N), *rstd = KC_F(N), *dx = KC_F(n), *dg = KC_F(C), *db = KC_F(C);
    float *base = KC_F(n), *bg = KC_F(C), *bb = KC_F(C);
    double *xd = KC_D(n), *gd = KC_D(C), *bd = KC_D(C), *od = KC_D(n), *md = KC_D(N);
    double *sd = KC_D(N), *gx = KC_D(n), *gg = KC_D(C), *gb = KC_D(C), *want = KC_D(n);
    kc_fill(x, n, offset - spread, offset + spread);
    kc_fill(gm, C, 0.5, 1.5);
    kc_fill(bt, C, -1, 1);
    kc_fill(r, n, -1, 1);
    kc_fill(base, n, -1, 1);
    kc_fill(bg, C, -1, 1);
    kc_fill(bb, C, -1, 1);
    kc_to_double(xd, x, n);
    kc_to_double(gd, gm, C);
    kc_to_double(bd, bt, C);
    ln_ctx c = {N, C, xd, gd, bd, od, r};
    ref_forward(&c, md, sd);
#define TAG(t) (snprintf(what, sizeof what, "layernorm N%d C%d offset %g seed%llu %s", N, C, \
                         offset, (unsigned long long)seed, t), what)

    kc_fill_nan(out, n);
    sp_layernorm_forward(out, mean, rstd, x, gm, bt, N, C);
    kc_check(TAG("forward out"), out, od, n, TOL_CASE);
    kc_check(TAG("forward mean"), mean, md, N, TOL_CASE);
    /* rstd is ~1/spread: compare relative to it. */
    for (int i = 0; i < N; i++) {
        want[i] = sd[i] * spread;
        dx[i] = rstd[i] * (float)spread;
    }
    kc_check(TAG("forward rstd (relative)"), dx, want, N, TOL_CASE);

    kc_fd_grad(gx, xd, n, ref_loss, &c);
    kc_fd_grad(gg, gd, C, ref_loss, &c);
    kc_fd_grad(gb, bd, C, ref_loss, &c);
    /* dx is ~rstd larger than dout: scale it back for a relative comparison. */
    for (int acc = 0; acc < 2; acc++) {
        kc_acc_init(dx, base, n, acc);
        sp_layernorm_backward_x(dx, r, x, mean, rstd, gm, N, C, acc);
        kc_acc_want(want, base, gx, n, acc);
        kc_check(TAG(acc ? "dx acc=1 vs finite differences" : "dx vs finite differences"), dx,
                 want, n, TOL_CASE);

        kc_acc_init(dg, bg, C, acc);
        kc_acc_init(db, bb, C, acc);
        sp_layernorm_backward_params(dg, db, r, x, mean, rstd, N, C, acc);
        kc_acc_want(want, bg, gg, C, acc);
        kc_check(TAG(acc ? "dgamma acc=1" : "dgamma vs finite differences"), dg, want, C,
                 TOL_CASE);
        kc_acc_want(want, bb, gb, C, acc);
        kc_check(TAG(acc ? "dbeta acc=1" : "dbeta vs finite differences"), db, want, C, TOL_CASE);
    }
#undef TAG
    free(x); free(gm); free(bt); free(r); free(out); free(mean); free(rstd); free(dx);
    free(dg); free(db); free(base); free(bg); free(bb); free(xd); free(gd); free(bd);
    free(od); free(md); free(sd); free(gx); free(gg); free(gb); free(want);
}

/* The row sums' order in scalar C: lane j of 8 adds the terms j, j + 8, ... of the whole
 * groups of 8, then ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)), then the tail in
 * order. The backwards sum by chunks of 512 (LN_CHUNK), the chunks' sums added in order. */
#define ORD_CHUNK 512
static float ord_sum(const float *t, int n)
{
    float l[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            l[j] += t[i + j];
    float r = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
    for (; i < n; i++)
        r += t[i];
    return r;
}

/* LayerNorm (rms 0) or RMSNorm (rms 1) forward and backward_x (acc into dx) in that order,
 * one row at a time. */
SP_NOFMA static void ord_norm(int rms, float *out, float *mean, float *rstd, float *dx,
                              const float *dout, const float *x, const float *g, const float *b,
                              int N, int C, int acc)
{
    float *t = KC_F(C), *t2 = KC_F(C);
    for (int n = 0; n < N; n++) {
        const float *xr = x + (int64_t)n * C, *d = dout + (int64_t)n * C;
        float *o = out + (int64_t)n * C, *dr = dx + (int64_t)n * C, m = 0.0f, s;
        if (!rms) {
            m = ord_sum(xr, C) / (float)C;
            for (int c = 0; c < C; c++)
                t[c] = (xr[c] - m) * (xr[c] - m);
            s = 1.0f / sqrtf(ord_sum(t, C) / (float)C + 1e-5f);
            for (int c = 0; c < C; c++)
                o[c] = (xr[c] - m) * s * g[c] + b[c];
            mean[n] = m;
        } else {
            for (int c = 0; c < C; c++)
                t[c] = xr[c] * xr[c];
            s = 1.0f / sqrtf(ord_sum(t, C) / (float)C + 1e-5f);
            for (int c = 0; c < C; c++)
                o[c] = xr[c] * s * g[c];
        }
        rstd[n] = s;
        float sg = 0.0f, sgx = 0.0f;
        for (int c0 = 0; c0 < C; c0 += ORD_CHUNK) {
            const int len = C - c0 < ORD_CHUNK ? C - c0 : ORD_CHUNK;
            for (int c = 0; c < len; c++) {
                const float gd = g[c0 + c] * d[c0 + c];
                const float xh = rms ? xr[c0 + c] * s : (xr[c0 + c] - m) * s;
                t[c] = gd;
                t2[c] = gd * xh;
            }
            sg += ord_sum(t, len);
            sgx += ord_sum(t2, len);
        }
        const float mg = sg / (float)C, mgx = sgx / (float)C;
        for (int c = 0; c < C; c++) {
            const float v = rms ? s * (g[c] * d[c] - xr[c] * s * mgx)
                                : s * (g[c] * d[c] - mg - (xr[c] - m) * s * mgx);
            dr[c] = acc ? dr[c] + v : v;
        }
    }
    free(t), free(t2);
}

static void same_bits(const char *what, int N, int C, const float *got, const float *want,
                      int64_t n)
{
    char msg[160];
    int64_t i = 0;
    while (i < n && memcmp(got + i, want + i, sizeof(float)) == 0)
        i++;
    snprintf(msg, sizeof msg, "%s N%d C%d: element %lld is %a, the order's %a", what, N, C,
             (long long)i, i < n ? got[i] : 0.0f, i < n ? want[i] : 0.0f);
    kc_expect(i == n, msg);
}

static void order_case(int N, int C, uint64_t seed)
{
    const int64_t n = (int64_t)N * C;
    kc_seed(seed);
    float *x = KC_F(n), *d = KC_F(n), *g = KC_F(C), *b = KC_F(C), *base = KC_F(n);
    float *o = KC_F(n), *m = KC_F(N), *r = KC_F(N), *dx = KC_F(n);
    float *wo = KC_F(n), *wm = KC_F(N), *wr = KC_F(N), *wdx = KC_F(n);
    kc_fill(x, n, 2.0, 4.0); /* off zero: the centering rounds */
    kc_fill(d, n, -1, 1);
    kc_fill(g, C, 0.5, 1.5);
    kc_fill(b, C, -1, 1);
    kc_fill(base, n, -1, 1);
    for (int rms = 0; rms < 2; rms++)
        for (int acc = 0; acc < 2; acc++) {
            memcpy(wdx, base, sizeof(float) * (size_t)n);
            ord_norm(rms, wo, wm, wr, wdx, d, x, g, b, N, C, acc);
            memcpy(dx, base, sizeof(float) * (size_t)n);
            if (!rms) {
                sp_layernorm_forward(o, m, r, x, g, b, N, C);
                sp_layernorm_backward_x(dx, d, x, m, r, g, N, C, acc);
                same_bits("layernorm mean", N, C, m, wm, N);
            } else {
                sp_rmsnorm_forward(o, r, x, g, N, C);
                sp_rmsnorm_backward_x(dx, d, x, r, g, N, C, acc);
            }
            same_bits(rms ? "rmsnorm out" : "layernorm out", N, C, o, wo, n);
            same_bits(rms ? "rmsnorm rstd" : "layernorm rstd", N, C, r, wr, N);
            same_bits(rms ? (acc ? "rmsnorm dx acc=1" : "rmsnorm dx")
                          : (acc ? "layernorm dx acc=1" : "layernorm dx"),
                      N, C, dx, wdx, n);
        }
    free(x), free(d), free(g), free(b), free(base), free(o), free(m), free(r), free(dx);
    free(wo), free(wm), free(wr), free(wdx);
}

int main(void)
{
    kc_start();
    static const int sizes[][2] = {{7, 13}, {5, 33}, {13, 7}, {1, 37}, {3, 600}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (uint64_t seed = 1; seed <= 3; seed++)
            run_case(sizes[i][0], sizes[i][1], 0.0, 1.0, seed);
    /* A large common offset: a one-pass E[x^2] - E[x]^2 variance would lose most digits. */
    run_case(7, 33, 100.0, 1.0, 4);
    /* A small spread: rstd ~ 30, so dx is 30x dout (eps 1e-5 still visible). */
    run_case(5, 13, 0.0, 0.03, 5);
    /* Rows in whole groups and a tail, widths with and without a tail of 8, one and
     * three chunks. */
    static const int order[][2] = {{1, 7}, {9, 13}, {17, 512}, {8, 64}, {21, 600}, {11, 1030},
                                   {3, 768}};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        order_case(order[i][0], order[i][1], 100 + i);
    return kc_finish("test_kernels_layernorm");
}
