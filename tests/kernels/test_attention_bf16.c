/* bf16 attention (sp_attention_*_bf16) against a float64 reference with the same rounding
 * points (codelets/cpu/kernels.h): bf16 q, k, v, dout; P~ (forward), P and dS (backward)
 * rounded to bf16, everything else exact. Also: that the tolerance catches a wrong
 * rounding point (the reference without P's or dS's rounding is far outside it), that
 * two runs give the same bits, and that bf16 really differs from fp32; and grouped-query
 * attention in bf16 against multi-head attention on repeated keys and values. */
#include "codelets/cpu/kernels.h"
#include "kcheck.h"

/* The reference rounds each value as the kernel's fp32 value would round: (float) first,
 * so it and the kernel round the same value to bf16 unless their fp32 values differ by an
 * ulp right at a bf16 boundary (about 2^-16 of the elements; none at these seeds). The
 * other differences are fp32 sums of up to T exact products and expf: observed scaled
 * errors <= 3e-7, 4e-6 at most (a dS next to a bf16 boundary), so TOL 1e-4. Leaving out
 * P's or dS's rounding moves the results by ~2^-9 per term: observed 1.3e-3 and 2.1e-3,
 * checked below to stay over 4 x TOL. */
#define TOL 1e-4

static double rb(double x) /* x as fp32, rounded to bf16 */
{
    float f = (float)x;
    sp_round_bf16(&f, &f, 1);
    return f;
}

typedef struct {
    int B, T, C, NH, round_p, round_ds; /* round_*: 0 leaves that rounding point out */
    const float *qkv, *dout;
    double *out, *lse, *dqkv;
} ref;

static void reference(ref *c)
{
    const int B = c->B, T = c->T, C = c->C, NH = c->NH, hs = C / NH, C3 = 3 * C;
    const double scale = (double)(1.0f / sqrtf((float)hs));
    double *s = KC_D(T), *dp = KC_D(T);
#define QKV(b, t, i) rb(c->qkv[((int64_t)(b) * T + (t)) * C3 + (i)])
    memset(c->dqkv, 0, sizeof(double) * (size_t)B * T * C3);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                double mx = -INFINITY, l = 0;
                for (int u = 0; u <= t; u++) {
                    double d = 0;
                    for (int i = 0; i < hs; i++)
                        d += QKV(b, t, h * hs + i) * QKV(b, u, C + h * hs + i);
                    s[u] = (double)(float)d * scale; /* the kernel's fp32 score */
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++)
                    l += exp(s[u] - mx);
                const double L = mx + log(l);
                c->lse[((int64_t)b * NH + h) * T + t] = L;
                double *o = c->out + ((int64_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    double a = 0;
                    for (int u = 0; u <= t; u++) {
                        const double p = exp(s[u] - mx);
                        a += (c->round_p ? rb(p) : p) * QKV(b, u, 2 * C + h * hs + i);
                    }
                    o[i] = a / l;
                }
                /* backward of row t: P, dP, D, dS */
                const float *d = c->dout + ((int64_t)b * T + t) * C + h * hs;
                double D = 0;
                for (int i = 0; i < hs; i++)
                    D += (double)d[i] * o[i];
                double *dq = c->dqkv + ((int64_t)b * T + t) * C3 + h * hs;
                for (int u = 0; u <= t; u++) {
                    double x = 0;
                    for (int i = 0; i < hs; i++)
                        x += rb(d[i]) * QKV(b, u, 2 * C + h * hs + i);
                    const double p = exp(s[u] - L);
                    const double ds = p * (x - D) * scale;
                    const double dsr = c->round_ds ? rb(ds) : ds, pr = c->round_p ? rb(p) : p;
                    double *dk = c->dqkv + ((int64_t)b * T + u) * C3 + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += dsr * QKV(b, u, C + h * hs + i);
                        dk[i] += dsr * QKV(b, t, h * hs + i);
                        dk[C + i] += pr * rb(d[i]);
                    }
                }
            }
#undef QKV
    free(s);
    free(dp);
}

static void run_case(int B, int T, int C, int NH, uint64_t seed)
{
    char what[160];
    const int64_t nq = (int64_t)B * T * 3 * C, no = (int64_t)B * T * C, nl = (int64_t)B * NH * T;
    const int64_t ns = sp_attention_scratch_floats_bf16(B, T, C, NH);
    kc_seed(seed);
    float *qkv = KC_F(nq), *dout = KC_F(no), *out = KC_F(no), *lse = KC_F(nl), *sc = KC_F(ns);
    float *dq = KC_F(nq), *base = KC_F(nq), *out2 = KC_F(no), *lse2 = KC_F(nl), *dq2 = KC_F(nq);
    float *o32 = KC_F(no), *l32 = KC_F(nl), *s32 = KC_F(sp_attention_scratch_floats(B, T, C, NH));
    double *od = KC_D(no), *ld = KC_D(nl), *gd = KC_D(nq), *want = KC_D(nq);
    kc_fill(qkv, nq, -2, 2);
    kc_fill(dout, no, -1, 1);
    kc_fill(base, nq, -1, 1);
    ref c = { B, T, C, NH, 1, 1, qkv, dout, od, ld, gd };
    reference(&c);
#define TAG(t) (snprintf(what, sizeof what, "attention bf16 B%d T%d C%d NH%d seed%llu %s", B, \
                         T, C, NH, (unsigned long long)seed, t), what)
    kc_fill_nan(out, no);
    kc_fill_nan(lse, nl);
    kc_fill_nan(sc, ns);
    sp_attention_forward_bf16(out, lse, sc, qkv, B, T, C, NH);
    kc_check(TAG("forward out"), out, od, no, TOL);
    kc_check(TAG("forward lse"), lse, ld, nl, TOL);
    for (int acc = 0; acc < 2; acc++) {
        kc_acc_init(dq, base, nq, acc);
        kc_fill_nan(sc, ns);
        sp_attention_backward_bf16(dq, sc, dout, qkv, out, lse, B, T, C, NH, acc);
        kc_acc_want(want, base, gd, nq, acc);
        kc_check(TAG(acc ? "dqkv acc=1" : "dqkv"), dq, want, nq, TOL);
    }
    /* the same bits again, with the scratch's old contents left in */
    sp_attention_forward_bf16(out2, lse2, sc, qkv, B, T, C, NH);
    sp_attention_backward_bf16(dq2, sc, dout, qkv, out2, lse2, B, T, C, NH, 0);
    kc_fill_nan(sc, ns);
    sp_attention_backward_bf16(dq, sc, dout, qkv, out, lse, B, T, C, NH, 0);
    kc_expect(!memcmp(out, out2, sizeof(float) * (size_t)no) &&
                  !memcmp(lse, lse2, sizeof(float) * (size_t)nl) &&
                  !memcmp(dq, dq2, sizeof(float) * (size_t)nq),
              TAG("two runs give the same bits"));
    /* bf16 is not fp32 */
    sp_attention_forward(o32, l32, s32, qkv, B, T, C, NH);
    kc_expect(memcmp(out, o32, sizeof(float) * (size_t)no) != 0, TAG("bf16 differs from fp32"));
    free(qkv); free(dout); free(out); free(lse); free(sc); free(dq); free(base); free(out2);
    free(lse2); free(dq2); free(o32); free(l32); free(s32); free(od); free(ld); free(gd);
    free(want);
}

/* Grouped-query attention in bf16 (sp_attention_gqa_*, bf16 = 1) is multi-head attention
 * on the keys and values repeated for each of their G query heads (Hugging Face's
 * repeat_kv): the output, lse and dq bit for bit those of sp_attention_*_bf16 on that
 * repeated qkv in GPT's layout, each KV head's dk and dv the sum of its G query heads'
 * (within float rounding: the kernel adds them block by block). */
static void gqa_case(int B, int T, int C, int NH, int G, uint64_t seed)
{
    char what[160];
    const int hs = C / NH, KV = NH / G;
    const int64_t W = (int64_t)KV * (G + 2) * hs, n3 = (int64_t)B * T * 3 * C;
    const int64_t ng = (int64_t)B * T * W, no = (int64_t)B * T * C, nl = (int64_t)B * NH * T;
    const int64_t ns = sp_attention_scratch_floats_bf16(B, T, C, NH);
    kc_seed(seed);
    float *qg = KC_F(ng), *q3 = KC_F(n3), *dout = KC_F(no), *sc = KC_F(ns);
    float *og = KC_F(no), *o3 = KC_F(no), *lg = KC_F(nl), *l3 = KC_F(nl);
    float *dg = KC_F(ng), *d3 = KC_F(n3);
    kc_fill(qg, ng, -2, 2);
    kc_fill(dout, no, -1, 1);
    for (int64_t r = 0; r < (int64_t)B * T; r++) /* the repeated keys and values */
        for (int h = 0; h < NH; h++) {
            const float *blk = qg + r * W + (int64_t)(h / G) * (G + 2) * hs;
            memcpy(q3 + r * 3 * C + h * hs, blk + (h % G) * hs, sizeof(float) * hs);
            memcpy(q3 + r * 3 * C + C + h * hs, blk + G * hs, sizeof(float) * hs);
            memcpy(q3 + r * 3 * C + 2 * C + h * hs, blk + (G + 1) * hs, sizeof(float) * hs);
        }
    snprintf(what, sizeof what, "attention bf16 GQA B%d T%d C%d NH%d G%d seed%llu", B, T, C,
             NH, G, (unsigned long long)seed);
    sp_attention_gqa_forward(og, lg, sc, qg, B, T, C, NH, G, 1);
    sp_attention_gqa_backward(dg, sc, dout, qg, og, lg, B, T, C, NH, G, 0, 1);
    sp_attention_forward_bf16(o3, l3, sc, q3, B, T, C, NH);
    sp_attention_backward_bf16(d3, sc, dout, q3, o3, l3, B, T, C, NH, 0);
    int same = !memcmp(og, o3, sizeof(float) * (size_t)no) &&
               !memcmp(lg, l3, sizeof(float) * (size_t)nl);
    double worst = 0, mag = 0;
    for (int64_t r = 0; r < (int64_t)B * T; r++)
        for (int h = 0; h < NH; h++) {
            const int64_t blk = r * W + (int64_t)(h / G) * (G + 2) * hs;
            same &= !memcmp(dg + blk + (h % G) * hs, d3 + r * 3 * C + h * hs,
                            sizeof(float) * hs);
            if (h % G) continue;
            for (int i = 0; i < hs; i++)
                for (int kv = 1; kv <= 2; kv++) { /* dk, then dv */
                    double sum = 0;
                    for (int g = 0; g < G; g++)
                        sum += d3[r * 3 * C + kv * C + (h + g) * hs + i];
                    worst = fmax(worst, fabs(dg[blk + (G + kv - 1) * hs + i] - sum));
                    mag = fmax(mag, fabs(sum));
                }
        }
    char msg[240];
    snprintf(msg, sizeof msg, "%s: out, lse and dq are repeated MHA's bits", what);
    kc_expect(same, msg);
    snprintf(msg, sizeof msg, "%s: dk, dv within %.2e of the sum over the group (scale %.2g)",
             what, worst, mag);
    kc_expect(worst <= 1e-5 * fmax(mag, 1.0), msg);
    free(qg); free(q3); free(dout); free(sc); free(og); free(o3); free(lg); free(l3);
    free(dg); free(d3);
}

/* A rounding point left out of the reference must fail the tolerance, by a margin: so
 * the check above tells whether P and dS are rounded where kernels.h says. */
static void detects(int B, int T, int C, int NH, uint64_t seed, int round_p, int round_ds,
                    const char *what)
{
    const int64_t nq = (int64_t)B * T * 3 * C, no = (int64_t)B * T * C, nl = (int64_t)B * NH * T;
    kc_seed(seed);
    float *qkv = KC_F(nq), *dout = KC_F(no), *out = KC_F(no), *lse = KC_F(nl), *dq = KC_F(nq);
    float *sc = KC_F(sp_attention_scratch_floats_bf16(B, T, C, NH));
    double *od = KC_D(no), *ld = KC_D(nl), *gd = KC_D(nq);
    kc_fill(qkv, nq, -2, 2);
    kc_fill(dout, no, -1, 1);
    ref c = { B, T, C, NH, round_p, round_ds, qkv, dout, od, ld, gd };
    reference(&c);
    sp_attention_forward_bf16(out, lse, sc, qkv, B, T, C, NH);
    sp_attention_backward_bf16(dq, sc, dout, qkv, out, lse, B, T, C, NH, 0);
    const double eo = kc_err(out, od, no), eg = kc_err(dq, gd, nq);
    const double e = round_p ? eg : (eo > eg ? eo : eg);
    if (kc_verbose)
        printf("  %s: error %.2e (out %.2e, dqkv %.2e), tol %.0e\n", what, e, eo, eg, TOL);
    char msg[200];
    snprintf(msg, sizeof msg, "%s is caught: error %.2e > 4 x tol", what, e);
    kc_expect(e > 4 * TOL, msg);
    free(qkv); free(dout); free(out); free(lse); free(dq); free(sc); free(od); free(ld);
    free(gd);
}

int main(void)
{
    kc_start();
    static const int cfg[][4] = {/* B, T, C, NH: head sizes 4..33, partial blocks */
                                 {2, 5, 12, 3}, {1, 7, 33, 1}, {2, 13, 16, 2}, {1, 6, 64, 2},
                                 {1, 1, 8, 1},  {1, 25, 6, 1}, {1, 50, 9, 3},  {1, 73, 32, 2}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
        for (uint64_t seed = 1; seed <= 2; seed++)
            run_case(cfg[i][0], cfg[i][1], cfg[i][2], cfg[i][3], seed);
    static const int gqa[][5] = {/* B, T, C, NH, G */
                                 {2, 5, 12, 3, 1}, {1, 30, 16, 4, 2}, {2, 13, 24, 6, 3},
                                 {1, 50, 32, 4, 4}};
    for (size_t i = 0; i < sizeof gqa / sizeof gqa[0]; i++)
        gqa_case(gqa[i][0], gqa[i][1], gqa[i][2], gqa[i][3], gqa[i][4], 7 + i);
    detects(1, 50, 32, 2, 7, 0, 1, "a reference without P's rounding");
    detects(1, 50, 32, 2, 7, 1, 0, "a reference without dS's rounding");
    return kc_finish("attention_bf16");
}
