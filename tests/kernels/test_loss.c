/* Softmax cross-entropy and sum against float64 references and central finite
 * differences, plus edge cases: out-of-range targets, logits of 1e4, a long sum; and a
 * padded vocabulary, against the same rows without their padding. */
#include <string.h>

#include "codelets/cpu/expf_impl.h"
#include "codelets/cpu/gemm_impl.h"
#include "codelets/cpu/kernels.h"
#include "kcheck.h"

/* Softmax of V <= 37 logits: expf (<= 1 ulp) and a V-term fp32 sum give probabilities
 * within ~V u = 2e-6 relative at worst (observed 1e-7); the gradient is
 * dloss (p - onehot) / N. 2e-6 keeps that bound; a missing max shift or 1/N are O(1). */
#define TOL 2e-6

typedef struct {
    int N, V;
    const int32_t *tg;
    double *logits, *probs;
    double dloss;
} ce_ctx;

/* Mean over rows of -log softmax(x)[target], in float64 with log-sum-exp. */
static double ref_forward(ce_ctx *c)
{
    double total = 0;
    for (int n = 0; n < c->N; n++) {
        const double *x = c->logits + (int64_t)n * c->V;
        double mx = -INFINITY, z = 0;
        for (int v = 0; v < c->V; v++)
            mx = fmax(mx, x[v]);
        for (int v = 0; v < c->V; v++)
            z += exp(x[v] - mx);
        for (int v = 0; v < c->V; v++)
            c->probs[(int64_t)n * c->V + v] = exp(x[v] - mx) / z;
        total += log(z) + mx - x[c->tg[n]];
    }
    return total / c->N;
}
static double ref_loss(void *p)
{
    ce_ctx *c = p;
    return c->dloss * ref_forward(c);
}

static void run_ce(int N, int V, double spread, uint64_t seed)
{
    char what[160];
    int64_t n = (int64_t)N * V;
    kc_seed(seed);
    int32_t *tg = kc_alloc(sizeof(int32_t) * (size_t)N);
    for (int i = 0; i < N; i++)
        tg[i] = (int32_t)(kc_next() % (uint64_t)V);
    float *x = KC_F(n), *p = KC_F(n), *d = KC_F(n), *base = KC_F(n), loss;
    double *xd = KC_D(n), *pd = KC_D(n), *g = KC_D(n), *want = KC_D(n);
    kc_fill(x, n, -spread, spread);
    kc_fill(base, n, -1, 1);
    float dloss = (float)(3.0 + kc_uniform()); /* gradients of order 1, not 1/N */
    kc_to_double(xd, x, n);
    ce_ctx c = {N, V, tg, xd, pd, dloss};
    double lref = ref_forward(&c);
#define TAG(t) (snprintf(what, sizeof what, "cross_entropy N%d V%d logits x%g seed%llu %s", N, \
                         V, spread, (unsigned long long)seed, t), what)
    kc_fill_nan(p, n);
    int bad = sp_cross_entropy_forward(&loss, p, x, tg, N, V, V);
    kc_expect(bad == 0, TAG("no target reported out of range"));
    kc_check(TAG("loss"), &loss, &lref, 1, TOL);
    kc_check(TAG("probs"), p, pd, n, TOL);

    kc_fd_grad(g, xd, n, ref_loss, &c);
    for (int acc = 0; acc < 2; acc++) {
        kc_acc_init(d, base, n, acc);
        sp_cross_entropy_backward(d, p, tg, dloss, N, V, acc);
        kc_acc_want(want, base, g, n, acc);
        kc_check(TAG(acc ? "dlogits acc=1 vs finite differences" : "dlogits vs finite "
                                                                   "differences"),
                 d, want, n, TOL);
    }
#undef TAG
    free(tg); free(x); free(p); free(d); free(base); free(xd); free(pd); free(g); free(want);
}

/* Logits of +-1e4: nothing overflows, probabilities stay finite and sum to 1, and the
 * loss (up to ~2e4) matches float64 to fp32 precision. */
static void ce_large_logits(void)
{
    enum { N = 5, V = 13 };
    float x[N * V], p[N * V], loss;
    double xd[N * V], pd[N * V];
    int32_t tg[N] = {0, 3, 12, 7, 5};
    kc_seed(11);
    kc_fill(x, N * V, -1e4, 1e4);
    x[2 * V + 12] = 1e4f; /* a target at the max ... */
    x[3 * V + 7] = -1e4f; /* ... and one far below it: -log p = ~2e4, p underflows */
    kc_to_double(xd, x, N * V);
    ce_ctx c = {N, V, tg, xd, pd, 1.0};
    double lref = ref_forward(&c);
    int bad = sp_cross_entropy_forward(&loss, p, x, tg, N, V, V);
    kc_expect(bad == 0 && isfinite(loss), "cross_entropy logits 1e4: loss finite");
    double rel = fabs(loss - lref) / lref;
    kc_expect(rel <= 1e-6, "cross_entropy logits 1e4: loss matches float64 within 1e-6");
    int finite = 1;
    for (int i = 0; i < N * V; i++)
        finite &= isfinite(p[i]);
    kc_expect(finite, "cross_entropy logits 1e4: probs finite");
    kc_check("cross_entropy logits 1e4: probs", p, pd, N * V, TOL);
    float d[N * V];
    sp_cross_entropy_backward(d, p, tg, 1.0f, N, V, 0);
    finite = 1;
    for (int i = 0; i < N * V; i++)
        finite &= isfinite(d[i]);
    kc_expect(finite, "cross_entropy logits 1e4: dlogits finite");
}

/* Targets -1 and V are counted, the loss is NaN, and the backward writes nothing out of
 * bounds (guard floats around dlogits stay put). */
static void ce_bad_targets(void)
{
    enum { N = 4, V = 7, G = 8 };
    float x[N * V], p[N * V], buf[G + N * V + G], loss = 0;
    int32_t tg[N] = {2, -1, V, 6};
    kc_seed(12);
    kc_fill(x, N * V, -2, 2);
    int bad = sp_cross_entropy_forward(&loss, p, x, tg, N, V, V);
    kc_expect(bad == 2, "cross_entropy: 2 out-of-range targets reported");
    kc_expect(isnan(loss), "cross_entropy: loss is NaN with out-of-range targets");
    for (int i = 0; i < G + N * V + G; i++)
        buf[i] = 42.0f;
    sp_cross_entropy_backward(buf + G, p, tg, 1.0f, N, V, 1);
    int guards = 1;
    for (int i = 0; i < G; i++)
        guards &= buf[i] == 42.0f && buf[G + N * V + i] == 42.0f;
    kc_expect(guards, "cross_entropy backward: nothing written outside dlogits");
    /* A row with a bad target gets dloss p / N and no one-hot term. */
    int ok = 1;
    for (int v = 0; v < V; v++)
        ok &= buf[G + V + v] == 42.0f + p[V + v] / N;
    kc_expect(ok, "cross_entropy backward: bad-target row gets p / N only");
    tg[1] = 0;
    tg[2] = 0;
    bad = sp_cross_entropy_forward(&loss, p, x, tg, N, V, V);
    kc_expect(bad == 0 && isfinite(loss), "cross_entropy: valid again once targets fixed");
}

typedef struct {
    int64_t n;
    double *x, out;
    float r;
} sum_ctx;
static double sum_loss(void *p)
{
    sum_ctx *c = p;
    double s = 0;
    for (int64_t i = 0; i < c->n; i++)
        s += c->x[i];
    return s * c->r;
}

static void run_sum(int64_t n, uint64_t seed)
{
    char what[120];
    kc_seed(seed);
    float *x = KC_F(n), *d = KC_F(n), *base = KC_F(n), out;
    double *xd = KC_D(n), *g = KC_D(n), *want = KC_D(n);
    kc_fill(x, n, -1, 1);
    kc_fill(base, n, -1, 1);
    kc_to_double(xd, x, n);
    sum_ctx c = {n, xd, 0, (float)kc_uniform()};
    double ref = sum_loss(&c) / c.r;
    sp_sum_forward(&out, x, n);
    snprintf(what, sizeof what, "sum n%lld forward", (long long)n);
    kc_check(what, &out, &ref, 1, 1e-7);
    kc_fd_grad(g, xd, n, sum_loss, &c);
    for (int acc = 0; acc < 2; acc++) {
        kc_acc_init(d, base, n, acc);
        sp_sum_backward(d, c.r, n, acc);
        kc_acc_want(want, base, g, n, acc);
        snprintf(what, sizeof what, "sum n%lld backward acc=%d vs finite differences",
                 (long long)n, acc);
        /* FD of a 37-term sum: rounding ~1e-16 |L| / h ~ 1e-9. */
        kc_check(what, d, want, n, 1e-7);
    }
    free(x); free(d); free(base); free(xd); free(g); free(want);
}

/* 2^22 values in [0.5, 1): summed in float one by one this would drift by ~1e-3
 * relative; in double and rounded once the error is at most u = 6e-8. */
static void sum_long(void)
{
    int64_t n = (int64_t)1 << 22;
    float *x = KC_F(n), out;
    kc_seed(13);
    kc_fill(x, n, 0.5, 1.0);
    double ref = 0;
    for (int64_t i = 0; i < n; i++)
        ref += x[i];
    sp_sum_forward(&out, x, n);
    kc_expect(fabs(out - ref) / ref <= 6e-8, "sum of 2^22 floats: rounded once, error <= u");
    free(x);
}

/* The forward's rows run eight at a time, in chunks of columns: its bits must be those of
 * the plain form, one row at a time, its sum in column order (written out here), on rows
 * of several chunks with padding, a partial last group of rows, and the vocab-parallel
 * exps' sums too. */
static void ce_row_order(void)
{
    enum { N = 19, V = 2600, VALID = 2583 };
    kc_seed(21);
    float *x = KC_F(N * V), *p = KC_F(N * V), *q = KC_F(N * V), *e = KC_F(N * V), loss;
    float st[2 * N], mx[N], sums[N];
    int32_t tg[N], lt[N];
    kc_fill(x, N * V, -6, 6);
    for (int n = 0; n < N; n++)
        tg[n] = (int32_t)(kc_next() % VALID);
    sp_cross_entropy_forward(&loss, p, x, tg, N, V, VALID);
    double total = 0.0;
    int same = 1;
    for (int n = 0; n < N; n++) {
        const float *xr = x + (int64_t)n * V;
        float *qr = q + (int64_t)n * V, sum = 0.0f;
        mx[n] = sp_max_skip_nan(xr, VALID);
        sp_expf_shifted(qr, xr, mx[n], VALID);
        for (int v = 0; v < VALID; v++)
            sum += qr[v];
        for (int v = 0; v < VALID; v++)
            qr[v] *= 1.0f / sum;
        for (int v = VALID; v < V; v++)
            qr[v] = 0.0f;
        total += log((double)sum) + (double)mx[n] - (double)xr[tg[n]];
        sums[n] = sum;
    }
    sp_vocab_ce_exp(e, st, lt, x, tg, mx, N, V, 0, VALID);
    same &= !memcmp(st, sums, sizeof sums);
    const float want = (float)(total / N);
    same &= !memcmp(p, q, sizeof(float) * N * V) && !memcmp(&loss, &want, sizeof loss);
    kc_expect(same, "cross_entropy: rows side by side give the one-row-at-a-time bits "
                    "(probabilities, loss, the vocab-parallel sums)");
    free(x); free(p); free(q); free(e);
}

/* A padded vocabulary (valid of V columns are tokens; the padding holds large logits that
 * would dominate were they counted): the loss and the tokens' probabilities bit for bit
 * those of the same rows cut to their tokens, the padding's probabilities and gradient 0,
 * a target in the padding counted bad; and the vocab-parallel steps on slices of the padded
 * row (one partly, one wholly padding) giving the cut rows' maximum, and exps of 0 past the
 * tokens. */
static void ce_padded(void)
{
    enum { N = 5, V = 48, VALID = 37 };
    kc_seed(11);
    float x[N * V], cut[N * VALID], p[N * V], q[N * VALID], d[N * V], loss, want;
    int32_t tg[N];
    for (int n = 0; n < N; n++) {
        tg[n] = (int32_t)(kc_next() % VALID);
        for (int v = 0; v < V; v++) {
            x[n * V + v] = v < VALID ? (float)(3 * kc_uniform()) : 50.0f + (float)v;
            if (v < VALID) cut[n * VALID + v] = x[n * V + v];
        }
    }
    int bad = sp_cross_entropy_forward(&loss, p, x, tg, N, V, VALID);
    int bad_cut = sp_cross_entropy_forward(&want, q, cut, tg, N, VALID, VALID);
    int same = !bad && !bad_cut && !memcmp(&loss, &want, sizeof loss), zero = 1;
    for (int n = 0; n < N; n++)
        for (int v = 0; v < V; v++)
            if (v < VALID) same &= !memcmp(&p[n * V + v], &q[n * VALID + v], 4);
            else zero &= p[n * V + v] == 0.0f;
    kc_expect(same, "cross_entropy padded: the loss and the tokens' probabilities are the "
                    "cut rows' bit for bit");
    sp_cross_entropy_backward(d, p, tg, 1.0f, N, V, 0);
    for (int n = 0; n < N; n++)
        for (int v = VALID; v < V; v++) zero &= d[n * V + v] == 0.0f;
    kc_expect(zero, "cross_entropy padded: probability and gradient 0 on the padding");
    tg[2] = VALID;
    kc_expect(sp_cross_entropy_forward(&loss, p, x, tg, N, V, VALID) == 1 && isnan(loss),
              "cross_entropy padded: a target in the padding is bad");
    tg[2] = 0;
    /* the vocab-parallel steps: slices of 24 columns; rank 1 has 13 tokens, a rank 2 none */
    float mx[N], mcut[N], e[N * 24], st[2 * N];
    int32_t lt[N];
    for (int n = 0; n < N; n++) {
        mcut[n] = -INFINITY;
        for (int v = 0; v < VALID; v++) mcut[n] = fmaxf(mcut[n], x[n * V + v]);
    }
    float s1[N * 24], gm[N];
    for (int n = 0; n < N; n++)
        for (int v = 0; v < 24; v++) s1[n * 24 + v] = x[n * V + 24 + v];
    sp_vocab_ce_max(mx, s1, N, 24, VALID - 24);
    float m0[N];
    for (int n = 0; n < N; n++) m0[n] = -INFINITY;
    for (int n = 0; n < N; n++)
        for (int v = 0; v < 24; v++) m0[n] = fmaxf(m0[n], x[n * V + v]);
    int ok = 1;
    for (int n = 0; n < N; n++) gm[n] = fmaxf(m0[n], mx[n]), ok &= gm[n] == mcut[n];
    kc_expect(ok, "vocab_ce_max padded: the group's maximum is the cut rows'");
    sp_vocab_ce_exp(e, st, lt, s1, tg, gm, N, 24, 24, VALID);
    for (int n = 0; n < N; n++)
        for (int v = 0; v < 24; v++)
            ok &= v < VALID - 24 ? e[n * 24 + v] == expf(s1[n * 24 + v] - gm[n])
                                 : e[n * 24 + v] == 0.0f;
    kc_expect(ok, "vocab_ce_exp padded: exps of the tokens, 0 past them");
    sp_vocab_ce_max(mx, s1, N, 24, 0);
    ok = 1;
    for (int n = 0; n < N; n++) ok &= mx[n] == -INFINITY;
    sp_vocab_ce_exp(e, st, lt, s1, tg, gm, N, 24, 48, VALID);
    for (int n = 0; n < N; n++) ok &= st[n] == 0.0f && lt[n] == -1;
    kc_expect(ok, "vocab-parallel: a slice of padding alone adds nothing");
}

/* sp_expf, the cross-entropy's exp: within one ulp of exp in float64 on a sweep of the
 * float bit patterns (every 4099th), glibc's values where its branches decide, and
 * sp_expf_shifted on every sgemm path bitwise the scalar form, tails and special lanes
 * among the vector ones included. */
static void expf_checks(void)
{
    int far = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        const uint32_t b = (uint32_t)u;
        float x;
        memcpy(&x, &b, sizeof x);
        const float got = sp_expf(x);
        if (isnan(x)) {
            far += !isnan(got);
            continue;
        }
        const double want = exp((double)x);
        const float w = (float)want, lo = nextafterf(w, -INFINITY), hi = nextafterf(w, INFINITY);
        if (!(got == w || (got == lo && want < w) || (got == hi && want > w))) {
            if (far++ < 3)
                fprintf(stderr, "  sp_expf(%a) = %a, exp in float64 %a\n", (double)x,
                        (double)got, want);
        }
    }
    kc_expect(far == 0, "sp_expf within one ulp of exp on 1048322 floats");
    kc_expect(sp_expf(-INFINITY) == 0.0f && sp_expf(INFINITY) == INFINITY &&
                  isnan(sp_expf(NAN)) && sp_expf(0.0f) == 1.0f && sp_expf(-0.0f) == 1.0f &&
                  sp_expf(89.0f) == INFINITY && sp_expf(-104.0f) == 0.0f &&
                  sp_expf(-103.5f) == 0x1p-149f && sp_expf(-88.5f) > 0.0f,
              "sp_expf: glibc's special values");

    enum { N = 1000 };
    float x[N], want[N], got[N];
    kc_seed(7);
    kc_fill(x, N, -120.0, 95.0);
    const float odd[] = { NAN, INFINITY, -INFINITY, -103.5f, -104.0f, 90.0f, -88.5f, 0.0f };
    for (int i = 0; i < 8; i++)
        x[37 * i + 5] = odd[i];
    const float shift = 3.25f;
    for (int i = 0; i < N; i++)
        want[i] = sp_expf(x[i] - shift);
    const int path = sp_gemm_path();
    for (int p = 0; p < SP_GEMM_NPATHS; p++) {
        if (sp_gemm_set_path(p) != 0)
            continue;
        int same = 1;
        for (int n = 0; n <= 19 && same; n++) { /* every tail length */
            sp_expf_shifted(got, x + n, shift, n);
            same = !memcmp(got, want + n, sizeof(float) * (size_t)n);
        }
        sp_expf_shifted(got, x, shift, N);
        same = same && !memcmp(got, want, sizeof got);
        char what[96];
        snprintf(what, sizeof what, "sp_expf_shifted on the %s path: the scalar's bits",
                 sp_gemm_path_name(p));
        kc_expect(same, what);
        /* the row max: NaNs skipped, every length, the loop's value */
        int ok = sp_max_skip_nan(x, 0) == -INFINITY;
        float nans[40];
        for (int i = 0; i < 40; i++)
            nans[i] = NAN;
        ok = ok && sp_max_skip_nan(nans, 40) == -INFINITY;
        for (int n = 1; n <= 40 && ok; n++) {
            float m = -INFINITY;
            for (int i = 0; i < n; i++)
                m = x[i + 200] > m ? x[i + 200] : m;
            nans[n - 1] = x[200 + n - 1];
            ok = sp_max_skip_nan(x + 200, n) == m && sp_max_skip_nan(nans, 40) == m;
        }
        snprintf(what, sizeof what, "sp_max_skip_nan on the %s path: the loop's max",
                 sp_gemm_path_name(p));
        kc_expect(ok, what);
    }
    sp_gemm_set_path(path);
}

int main(void)
{
    kc_start();
    expf_checks();
    for (uint64_t seed = 1; seed <= 3; seed++) {
        run_ce(7, 13, 3.0, seed);
        run_ce(13, 37, 3.0, seed);
        run_ce(1, 2, 1.0, seed);
        run_ce(5, 1, 1.0, seed); /* V = 1: p = 1, loss 0, gradient 0 */
        run_sum(37, seed);
        run_sum(1, seed);
    }
    ce_large_logits();
    ce_bad_targets();
    ce_padded();
    ce_row_order();
    sum_long();
    return kc_finish("test_kernels_loss");
}
