/* Causal multi-head attention forward (out and the saved log-sum-exp) and backward
 * against a float64 reference and central finite differences on the packed qkv. T runs
 * past several query blocks of the kernel (24 rows), with partial last blocks. Both
 * layouts of qkv: GPT's [q | k | v] (sp_attention_forward) and grouped-query attention's
 * (sp_attention_gqa_forward, G = 1, 2, 3, 4 query heads per KV head), the reference
 * reading each head where kernels.h says it is. Past T = 100 the gradient is the
 * analytic one in float64 instead of finite differences. */
#include "codelets/cpu/kernels.h"
#include "codelets/cpu/v16_impl.h"
#include "codelets/gelu.h"
#include "kcheck.h"

/* Scores are fp32 dots of hs <= 32 terms through expf and a T-term normalisation, then
 * a T-term weighted sum: observed scaled errors <= 2.3e-7 for inputs in [-1,1], so 2e-6
 * (~9x), far below what a wrong scale (1/C vs 1/hs), a missing causal mask or a dropped
 * softmax term give. With inputs in [-8,8] the scores reach |s| ~ 100 and their own
 * rounding u |s| ~ 6e-6 passes straight through exp (observed 7e-7): TOL_PEAKED 1e-5. */
#define TOL 2e-6
#define TOL_PEAKED 1e-5
/* Past T = 100 the backward sums up to T terms per element of dk and dv: observed 1.5e-6
 * at T 601, so 1e-5; a group's rows missing from dk or dv err by O(1). */
#define TOL_LONG 1e-5

typedef struct {
    int B, T, C, NH, G; /* G: 0 GPT's layout, else query heads per KV head */
    double *qkv, *out, *lse;
    const float *r;
} at_ctx;

/* qkv's row width, and where head h's query, key and value start in a row */
static int64_t width(const at_ctx *c)
{
    int hs = c->C / c->NH;
    return c->G ? (int64_t)(c->NH / c->G) * (c->G + 2) * hs : 3 * (int64_t)c->C;
}

static void offsets(const at_ctx *c, int h, int64_t *q, int64_t *k, int64_t *v)
{
    int hs = c->C / c->NH;
    if (!c->G) {
        *q = (int64_t)h * hs, *k = c->C + *q, *v = 2 * (int64_t)c->C + *q;
        return;
    }
    int64_t group = (int64_t)(h / c->G) * (c->G + 2) * hs; /* KV head h / G's block */
    *q = group + (int64_t)(h % c->G) * hs, *k = group + (int64_t)c->G * hs, *v = *k + hs;
}

static void ref_forward(at_ctx *c)
{
    int B = c->B, T = c->T, C = c->C, NH = c->NH, hs = C / NH;
    const int64_t W = width(c);
    double scale = 1.0 / sqrt((double)hs);
    double *s = kc_alloc(sizeof(double) * (size_t)T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                int64_t qo, ko, vo;
                offsets(c, h, &qo, &ko, &vo);
                const double *q = c->qkv + ((int64_t)b * T + t) * W + qo;
                double mx = -INFINITY, z = 0;
                for (int u = 0; u <= t; u++) {
                    const double *k = c->qkv + ((int64_t)b * T + u) * W + ko;
                    double d = 0;
                    for (int i = 0; i < hs; i++)
                        d += q[i] * k[i];
                    s[u] = d * scale;
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++)
                    z += exp(s[u] - mx);
                c->lse[((int64_t)b * NH + h) * T + t] = mx + log(z);
                for (int u = 0; u <= t; u++)
                    s[u] = exp(s[u] - mx) / z; /* the probabilities */
                for (int i = 0; i < hs; i++) {
                    double o = 0;
                    for (int u = 0; u <= t; u++)
                        o += s[u] * c->qkv[((int64_t)b * T + u) * W + vo + i];
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

/* The loss's gradient in float64 by the backward's own formulas, for T too long for
 * finite differences: P = exp(s - lse), dP = r v^T, dS = P (dP - rowsum(P dP)), then
 * dq = dS k scale, dk = dS^T q scale, dv = P^T r. Needs ref_forward's lse. */
static void ref_grad(at_ctx *c, double *g)
{
    int B = c->B, T = c->T, C = c->C, NH = c->NH, hs = C / NH;
    const int64_t W = width(c);
    const double scale = 1.0 / sqrt((double)hs);
    double *p = kc_alloc(sizeof(double) * (size_t)T), *dp = kc_alloc(sizeof(double) * (size_t)T);
    memset(g, 0, sizeof(double) * (size_t)(B * T * W));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int64_t qo, ko, vo;
            offsets(c, h, &qo, &ko, &vo);
            for (int t = 0; t < T; t++) {
                const int64_t rt = (int64_t)b * T + t;
                const double *q = c->qkv + rt * W + qo;
                const float *r = c->r + rt * C + h * hs;
                double D = 0;
                for (int u = 0; u <= t; u++) {
                    const double *k = c->qkv + ((int64_t)b * T + u) * W + ko;
                    const double *v = c->qkv + ((int64_t)b * T + u) * W + vo;
                    double sc = 0, d = 0;
                    for (int i = 0; i < hs; i++)
                        sc += q[i] * k[i], d += r[i] * v[i];
                    p[u] = exp(sc * scale - c->lse[((int64_t)b * NH + h) * T + t]);
                    dp[u] = d;
                    D += p[u] * d;
                }
                for (int u = 0; u <= t; u++) {
                    const int64_t ru = ((int64_t)b * T + u) * W;
                    const double ds = p[u] * (dp[u] - D) * scale;
                    for (int i = 0; i < hs; i++) {
                        g[rt * W + qo + i] += ds * c->qkv[ru + ko + i];
                        g[ru + ko + i] += ds * q[i];
                        g[ru + vo + i] += p[u] * r[i];
                    }
                }
            }
        }
    free(p);
    free(dp);
}

static void run_case(int B, int T, int C, int NH, int G, double spread, uint64_t seed)
{
    char what[160];
    const double tol = spread > 1.0 ? TOL_PEAKED : T > 100 ? TOL_LONG : TOL;
    at_ctx c = {B, T, C, NH, G, NULL, NULL, NULL, NULL};
    int64_t nq = (int64_t)B * T * width(&c), no = (int64_t)B * T * C;
    int64_t nl = (int64_t)B * NH * T, ns = sp_attention_scratch_floats(B, T, C, NH);
    kc_seed(seed);
    float *qkv = KC_F(nq), *r = KC_F(no), *out = KC_F(no), *lse = KC_F(nl);
    float *dq = KC_F(nq), *base = KC_F(nq), *scratch = KC_F(ns);
    double *qd = KC_D(nq), *od = KC_D(no), *ld = KC_D(nl), *g = KC_D(nq), *want = KC_D(nq);
    kc_fill(qkv, nq, -spread, spread);
    kc_fill(r, no, -1, 1);
    kc_fill(base, nq, -1, 1);
    kc_to_double(qd, qkv, nq);
    c.qkv = qd, c.out = od, c.lse = ld, c.r = r;
    ref_forward(&c);
#define TAG(t) (snprintf(what, sizeof what, "attention B%d T%d C%d NH%d G%d x%g seed%llu %s", \
                         B, T, C, NH, G, spread, (unsigned long long)seed, t), what)
    kc_fill_nan(out, no);
    kc_fill_nan(lse, nl);
    kc_fill_nan(scratch, ns); /* scratch is output-only */
    if (G) sp_attention_gqa_forward(out, lse, scratch, qkv, B, T, C, NH, G, 0);
    else sp_attention_forward(out, lse, scratch, qkv, B, T, C, NH);
    kc_check(TAG("forward out"), out, od, no, tol);
    /* lse is a log of sums of up to T terms: relative to its magnitude */
    kc_check(TAG("forward lse"), lse, ld, nl, tol);

    if (T > 100) /* finite differences would take T^3 */
        ref_grad(&c, g);
    else
        kc_fd_grad(g, qd, nq, ref_loss, &c);
    for (int acc = 0; acc < 2; acc++) {
        kc_acc_init(dq, base, nq, acc);
        kc_fill_nan(scratch, ns);
        if (G) sp_attention_gqa_backward(dq, scratch, r, qkv, out, lse, B, T, C, NH, G, acc, 0);
        else sp_attention_backward(dq, scratch, r, qkv, out, lse, B, T, C, NH, acc);
        kc_acc_want(want, base, g, nq, acc);
        kc_check(TAG(acc ? "dqkv acc=1 vs the float64 gradient" : "dqkv vs the float64 gradient"),
                 dq, want, nq, tol);
    }
#undef TAG
    free(qkv); free(r); free(out); free(lse); free(dq); free(base); free(scratch);
    free(qd); free(od); free(ld); free(g); free(want);
}

/* A NaN in one key reaches exactly the queries that see it (rows t >= u0 of its head):
 * the kernel's exp keeps NaN, and no other row is touched. */
static void nan_case(void)
{
    enum { B = 1, T = 30, C = 8, NH = 2, hs = C / NH, u0 = 11 };
    float *qkv = KC_F(B * T * 3 * C), *out = KC_F(B * T * C), *lse = KC_F(B * NH * T);
    float *scratch = KC_F(sp_attention_scratch_floats(B, T, C, NH));
    kc_seed(9);
    kc_fill(qkv, B * T * 3 * C, -1, 1);
    qkv[u0 * 3 * C + C + 1] = NAN; /* key of token u0, head 0 */
    sp_attention_forward(out, lse, scratch, qkv, B, T, C, NH);
    int ok = 1;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < C; i++) {
            int head0 = i < hs;
            ok &= isnan(out[t * C + i]) == (head0 && t >= u0);
        }
    kc_expect(ok, "attention: a NaN key gives NaN in exactly the rows t >= its token of its head");
    free(qkv); free(out); free(lse); free(scratch);
}

/* What the softmax's exp must give for z's bits: sp_exp_nonpos of z clamped to [-87, 0],
 * NaN kept as it is. */
static uint32_t exp_le0_want(uint32_t bits)
{
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
        return bits;
    const uint32_t z = bits > 0xC2AE0000u ? 0xC2AE0000u : bits >= 0x80000000u ? bits : 0;
    return (uint32_t)sp_gelu_f2i(sp_exp_nonpos(sp_gelu_i2f((int32_t)z)));
}

/* The softmax's 16-lane exp (v16_impl.h) against the scalar sp_exp_nonpos it must equal
 * bit for bit, in the clone this CPU runs: every 61st float of [-87, -0], then the
 * clamps' cases (below -87, above 0, infinities, NaNs). Returns the mismatches. */
static SP_VEC_FN int64_t exp16_mismatches(void)
{
    static const uint32_t special[] = { 0xC2AE0000u, 0xC2AE0001u, 0xC2C80000u, 0xF149F2CAu,
                                        0xFF7FFFFFu, 0xFF800000u, 0x00000001u, 0x3F800000u,
                                        0x7F7FFFFFu, 0x7F800000u, 0x7FC00000u, 0x7F800001u,
                                        0xFFC00000u, 0xFFFFFFFFu, 0x80000000u, 0x00000000u };
    const int64_t nsweep = (0xC2AE0000u - 0x80000000u) / 61 + 1,
                  total = nsweep + (int64_t)(sizeof special / sizeof special[0]);
    int64_t bad = 0;
    for (int64_t i0 = 0; i0 < total; i0 += 16) {
        uint32_t in[16];
        for (int j = 0; j < 16; j++) {
            const int64_t i = i0 + j < total ? i0 + j : total - 1;
            in[j] = i < nsweep ? 0x80000000u + (uint32_t)(61 * i) : special[i - nsweep];
        }
        const v16u got = (v16u)sp_exp_le0_16(sp_ld16((const float *)in));
        for (int j = 0; j < 16; j++)
            bad += got[j] != exp_le0_want(in[j]);
    }
    return bad;
}

/* The softmax's sixteen-row reductions (v16_impl.h) against the scalar tree the kernels
 * promise, in the clone this CPU runs, over rows whose sums depend on the order (lanes
 * of magnitudes 2^-20..2^20, both signs), and sp_transpose16 against its definition.
 * Returns the mismatching lanes. */
static SP_VEC_FN int64_t rows16_mismatches(void)
{
    int64_t bad = 0;
    for (int trial = 0; trial < 200; trial++) {
        v16f v[16];
        v16i k[16];
        for (int r = 0; r < 16; r++)
            for (int i = 0; i < 16; i++) {
                v[r][i] = (float)ldexp(kc_uniform(), (int)(20 * kc_uniform()));
                k[r][i] = (int32_t)(uint32_t)(kc_next() >> 32);
            }
        const v16f sum = sp_rows16_sum(v);
        const v16i mx = sp_rows16_max(k);
        for (int r = 0; r < 16; r++) {
            const v16f z = v[r];
            const float want =
                (((z[0] + z[8]) + (z[1] + z[9])) + ((z[2] + z[10]) + (z[3] + z[11]))) +
                (((z[4] + z[12]) + (z[5] + z[13])) + ((z[6] + z[14]) + (z[7] + z[15])));
            int32_t m = k[r][0];
            for (int i = 1; i < 16; i++)
                m = k[r][i] > m ? k[r][i] : m;
            bad += sp_gelu_f2i(sum[r]) != sp_gelu_f2i(want);
            bad += mx[r] != m;
        }
        /* the backward's row dot products transpose sixteen rows in registers: every
         * element must land at (lane, row), bits untouched */
        v16f t[16];
        for (int r = 0; r < 16; r++)
            t[r] = v[r];
        sp_transpose16(t);
        for (int r = 0; r < 16; r++)
            for (int i = 0; i < 16; i++)
                bad += sp_gelu_f2i(t[i][r]) != sp_gelu_f2i(v[r][i]);
    }
    return bad;
}

int main(void)
{
    kc_start();
    static const int cfg[][4] = {/* B, T, C, NH */
                                 {2, 5, 12, 3},  {1, 7, 33, 3},  {2, 13, 16, 2},
                                 {1, 6, 64, 2},  {1, 1, 8, 1},   {3, 4, 10, 5},
                                 {1, 24, 8, 2},  {1, 25, 6, 1},  {1, 50, 9, 3},
                                 {1, 73, 4, 2}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
        for (uint64_t seed = 1; seed <= 3; seed++)
            run_case(cfg[i][0], cfg[i][1], cfg[i][2], cfg[i][3], 0, 1.0, seed);
    /* grouped-query: B, T, C, NH, G (NH / G KV heads) */
    static const int gqa[][5] = {{2, 5, 12, 3, 1}, {1, 30, 16, 4, 2}, {2, 13, 24, 6, 3},
                                 {1, 26, 16, 4, 4}, {1, 49, 8, 2, 2}};
    for (size_t i = 0; i < sizeof gqa / sizeof gqa[0]; i++)
        for (uint64_t seed = 1; seed <= 2; seed++)
            run_case(gqa[i][0], gqa[i][1], gqa[i][2], gqa[i][3], gqa[i][4], 1.0, seed);
    /* Peaked softmax: scores of +-30 must not overflow exp. */
    run_case(1, 9, 12, 3, 0, 8.0, 4);
    run_case(1, 31, 12, 3, 0, 8.0, 5);
    run_case(1, 31, 12, 3, 3, 8.0, 6);
    /* Long enough that the backward splits its query rows into several groups (each
     * holding its P and dS whole for dk and dv): 608 floats a strip row, groups of 8
     * blocks (192 rows), the last one partial; against the analytic float64 gradient. */
    run_case(1, 601, 16, 4, 0, 1.0, 7);
    run_case(2, 450, 8, 4, 2, 1.0, 8);
    nan_case();
    const int64_t bad = exp16_mismatches();
    kc_expect(bad == 0, "softmax: the 16-lane exp equals sp_exp_nonpos bit for bit");
    if (bad)
        fprintf(stderr, "  %lld floats differ\n", (long long)bad);
    const int64_t bad16 = rows16_mismatches();
    kc_expect(bad16 == 0, "sixteen rows' sums and maxes equal the scalar tree's bits, and "
                           "their transpose moves every element to its place");
    if (bad16)
        fprintf(stderr, "  %lld lanes differ\n", (long long)bad16);
    return kc_finish("test_kernels_attention");
}
