/* Determinism: every kernel run twice on the same values gives the same bits, the second
 * time with every buffer moved by one float (other alignment, other vector peeling); then
 * again on each other sp_gemm path this CPU has (portable, AVX2, AVX-512F): same bits. */
#include "codelets/cpu/gemm_impl.h"
#include "codelets/cpu/kernels.h"
#include "kcheck.h"

enum { B = 2, T = 33, C = 96, NH = 3, V = 50, N = B * T, C4 = 4 * C };

/* The outputs of one run, labelled, in the order the kernels ran. */
#define MAXOUT 64
typedef struct {
    int count;
    const char *name[MAXOUT];
    float *data[MAXOUT];
    int64_t n[MAXOUT];
    void *mem[MAXOUT * 2];
    int nmem;
} run_t;

/* A buffer of n floats starting `off` floats into its allocation; seeded values. */
static float *buf(run_t *r, int64_t n, int off, uint64_t seed, double lo, double hi)
{
    float *m = KC_F(n + off);
    if (r->nmem == MAXOUT * 2) {
        fprintf(stderr, "FAIL: test_determinism: raise MAXOUT\n");
        exit(1);
    }
    r->mem[r->nmem++] = m;
    kc_seed(seed);
    kc_fill(m + off, n, lo, hi);
    return m + off;
}
static void keep(run_t *r, const char *name, float *x, int64_t n)
{
    if (r->count == MAXOUT) {
        fprintf(stderr, "FAIL: test_determinism: raise MAXOUT\n");
        exit(1);
    }
    r->name[r->count] = name;
    r->data[r->count] = x;
    r->n[r->count++] = n;
}

/* Scratch for attention with 6 heads. */
static float *scr2(run_t *r, int off)
{
    return buf(r, sp_attention_scratch_floats(B, T, C, 6), off, 0, 0, 0);
}

static void run_all(run_t *r, int off)
{
    sp_kernels_init();
    /* matmul, all transposes, acc 0 and 1: out (N,C4) = x (N,C) @ w (C,C4) */
    static const char *mm[8] = {"matmul fwd ta0 tb0", "matmul fwd ta0 tb1",
                                "matmul fwd ta1 tb0", "matmul fwd ta1 tb1",
                                "matmul bwd ta0 tb0", "matmul bwd ta0 tb1",
                                "matmul bwd ta1 tb0", "matmul bwd ta1 tb1"};
    float *a = buf(r, (int64_t)N * C, off, 1, -1, 1), *w = buf(r, (int64_t)C * C4, off, 2, -1, 1);
    float *dout = buf(r, (int64_t)N * C4, off, 3, -1, 1);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            float *o = buf(r, (int64_t)N * C4, off, 4, -1, 1);
            sp_matmul_forward(o, a, w, N, C4, C, ta, tb, 1);
            keep(r, mm[ta * 2 + tb], o, (int64_t)N * C4);
            float *da = buf(r, (int64_t)N * C, off, 5, -1, 1);
            float *dw = buf(r, (int64_t)C * C4, off, 6, -1, 1);
            sp_matmul_backward_a(da, dout, w, N, C4, C, ta, tb, ta); /* acc 0 and 1 */
            sp_matmul_backward_b(dw, dout, a, N, C4, C, ta, tb, tb);
            keep(r, mm[4 + ta * 2 + tb], da, (int64_t)N * C);
            keep(r, mm[4 + ta * 2 + tb], dw, (int64_t)C * C4);
        }
    /* a narrow product (n <= 16: sp_gemm's narrow tile where the path has one) */
    float *w13 = buf(r, (int64_t)C * 13, off, 29, -1, 1);
    float *o13 = buf(r, (int64_t)N * 13, off, 30, -1, 1);
    sp_matmul_forward(o13, a, w13, N, 13, C, 0, 0, 1);
    keep(r, "matmul fwd n=13", o13, (int64_t)N * 13);
    /* a depth that is no multiple of 8 (sp_gemm packs a's rows 8 columns at a time) */
    float *a93 = buf(r, (int64_t)N * 93, off, 31, -1, 1);
    float *w93 = buf(r, (int64_t)93 * C4, off, 32, -1, 1);
    float *o93 = buf(r, (int64_t)N * C4, off, 33, -1, 1);
    sp_matmul_forward(o93, a93, w93, N, C4, 93, 0, 0, 0);
    keep(r, "matmul fwd k=93", o93, (int64_t)N * C4);
    float *o93t = buf(r, (int64_t)N * C4, off, 34, -1, 1); /* both stored transposed */
    sp_matmul_forward(o93t, a93, w93, N, C4, 93, 1, 1, 0);
    keep(r, "matmul fwd k=93 ta1 tb1", o93t, (int64_t)N * C4);
    int64_t n = (int64_t)N * C;
    float *x = buf(r, n, off, 7, -3, 3), *y = buf(r, n, off, 8, -1, 1);
    float *bias = buf(r, C, off, 9, -1, 1), *d = buf(r, n, off, 10, -1, 1);
    float *o;
    o = buf(r, n, off, 0, 0, 0); sp_bias_add_forward(o, x, bias, N, C); keep(r, "bias_add fwd", o, n);
    o = buf(r, C, off, 11, -1, 1); sp_bias_add_backward_bias(o, d, N, C, 1); keep(r, "bias_add bwd", o, C);
    o = buf(r, n, off, 0, 0, 0); sp_add_forward(o, x, y, n); keep(r, "add fwd", o, n);
    o = buf(r, n, off, 0, 0, 0); sp_scale_forward(o, x, 0.3f, n); keep(r, "scale fwd", o, n);
    o = buf(r, n, off, 12, -1, 1); sp_scale_backward(o, d, 0.3f, n, 1); keep(r, "scale bwd", o, n);
    o = buf(r, n, off, 0, 0, 0); sp_gelu_forward(o, x, n); keep(r, "gelu fwd", o, n);
    o = buf(r, n, off, 12, -1, 1); sp_gelu_backward(o, x, d, n, 1); keep(r, "gelu bwd", o, n);
    o = buf(r, n, off, 0, 0, 0); sp_relu_forward(o, x, n); keep(r, "relu fwd", o, n);
    o = buf(r, n, off, 12, -1, 1); sp_relu_backward(o, x, d, n, 1); keep(r, "relu bwd", o, n);

    float *gm = buf(r, C, off, 13, 0.5, 1.5), *bt = buf(r, C, off, 14, -1, 1);
    float *ln = buf(r, n, off, 0, 0, 0), *mean = buf(r, N, off, 0, 0, 0);
    float *rstd = buf(r, N, off, 0, 0, 0);
    sp_layernorm_forward(ln, mean, rstd, x, gm, bt, N, C);
    keep(r, "layernorm fwd out", ln, n);
    keep(r, "layernorm fwd mean", mean, N);
    keep(r, "layernorm fwd rstd", rstd, N);
    o = buf(r, n, off, 15, -1, 1); sp_layernorm_backward_x(o, d, x, mean, rstd, gm, N, C, 1);
    keep(r, "layernorm bwd x", o, n);
    float *dg = buf(r, C, off, 16, -1, 1), *db = buf(r, C, off, 17, -1, 1);
    sp_layernorm_backward_params(dg, db, d, x, mean, rstd, N, C, 1);
    keep(r, "layernorm bwd gamma", dg, C);
    keep(r, "layernorm bwd beta", db, C);

    int32_t *tok = kc_alloc(sizeof(int32_t) * (N + off));
    r->mem[r->nmem++] = tok;
    tok += off;
    kc_seed(18);
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)(kc_next() % V);
    float *wte = buf(r, (int64_t)V * C, off, 19, -1, 1), *wpe = buf(r, (int64_t)T * C, off, 20, -1, 1);
    o = buf(r, n, off, 0, 0, 0); sp_embed_forward(o, tok, wte, wpe, B, T, C); keep(r, "embed fwd", o, n);
    float *dte = buf(r, (int64_t)V * C, off, 21, -1, 1), *dpe = buf(r, (int64_t)T * C, off, 22, -1, 1);
    sp_embed_backward(dte, dpe, d, tok, B, T, C);
    keep(r, "embed bwd wte", dte, (int64_t)V * C);
    keep(r, "embed bwd wpe", dpe, (int64_t)T * C);

    int64_t nq = (int64_t)N * 3 * C, nl = (int64_t)B * NH * T;
    float *qkv = buf(r, nq, off, 23, -2, 2), *out = buf(r, n, off, 0, 0, 0);
    float *lse = buf(r, (int64_t)B * 6 * T, off, 0, 0, 0); /* also for 6 heads below */
    float *scr = buf(r, sp_attention_scratch_floats(B, T, C, NH), off, 0, 0, 0);
    sp_attention_forward(out, lse, scr, qkv, B, T, C, NH);
    keep(r, "attention fwd out", out, n);
    keep(r, "attention fwd lse", lse, nl);
    o = buf(r, nq, off, 24, -1, 1);
    sp_attention_backward(o, scr, d, qkv, out, lse, B, T, C, NH, 1);
    keep(r, "attention bwd", o, nq);
    /* again with heads of 16 columns (the narrow tiles), from acc = 0 */
    sp_attention_forward(out, lse, scr2(r, off), qkv, B, T, C, 6);
    keep(r, "attention hs16 fwd out", out, n);
    o = buf(r, nq, off, 0, 0, 0);
    sp_attention_backward(o, scr2(r, off), d, qkv, out, lse, B, T, C, 6, 0);
    keep(r, "attention hs16 bwd", o, nq);

    float *logits = buf(r, (int64_t)N * V, off, 25, -5, 5), *probs = buf(r, (int64_t)N * V, off, 0, 0, 0);
    float *loss = buf(r, 1, off, 0, 0, 0);
    int32_t *tg = tok; /* tokens are in [0, V) */
    kc_expect(sp_cross_entropy_forward(loss, probs, logits, tg, N, V, V) == 0, "ce targets valid");
    keep(r, "cross_entropy loss", loss, 1);
    keep(r, "cross_entropy probs", probs, (int64_t)N * V);
    o = buf(r, (int64_t)N * V, off, 26, -1, 1); sp_cross_entropy_backward(o, probs, tg, 1.3f, N, V, 1);
    keep(r, "cross_entropy bwd", o, (int64_t)N * V);

    o = buf(r, 1, off, 0, 0, 0); sp_sum_forward(o, x, n); keep(r, "sum fwd", o, 1);
    o = buf(r, n, off, 27, -1, 1); sp_sum_backward(o, 0.7f, n, 1); keep(r, "sum bwd", o, n);

    float *p = buf(r, n, off, 28, -1, 1), *m = buf(r, n, off, 0, 0, 0), *v = buf(r, n, off, 0, 0, 0);
    for (int t = 1; t <= 3; t++)
        sp_adamw_update(p, m, v, d, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
    keep(r, "adamw param", p, n);
    keep(r, "adamw m", m, n);
    keep(r, "adamw v", v, n);
    double ss = sp_sum_squares(x, n);
    o = buf(r, 2, off, 0, 0, 0);
    memcpy(o, &ss, sizeof ss); /* the double's bits, as two floats */
    keep(r, "sum_squares", o, 2);
}

static void compare(const run_t *r1, const run_t *r2, const char *how)
{
    kc_expect(r1->count == r2->count, "both runs produced the same outputs");
    for (int i = 0; i < r1->count && i < r2->count; i++) {
        char what[128];
        snprintf(what, sizeof what, "%s: same bits %s", r1->name[i], how);
        kc_expect(memcmp(r1->data[i], r2->data[i], sizeof(float) * (size_t)r1->n[i]) == 0,
                  what);
    }
}

static void free_run(run_t *r)
{
    for (int i = 0; i < r->nmem; i++)
        free(r->mem[i]);
    memset(r, 0, sizeof *r);
}

int main(void)
{
    kc_start();
    static run_t r1, r2;
    const int path = sp_gemm_path();
    run_all(&r1, 0);
    run_all(&r2, 1);
    compare(&r1, &r2, "twice (second run shifted by one float)");
    for (int p = 0; p < SP_GEMM_NPATHS; p++) {
        char how[96];
        if (p == path || sp_gemm_set_path(p) != 0)
            continue;
        free_run(&r2);
        run_all(&r2, p % 2);
        snprintf(how, sizeof how, "on the %s sgemm path as on %s", sp_gemm_path_name(p),
                 sp_gemm_path_name(path));
        compare(&r1, &r2, how);
        if (kc_verbose)
            printf("  compared the %s path\n", sp_gemm_path_name(p));
    }
    sp_gemm_set_path(path);
    free_run(&r1);
    free_run(&r2);
    return kc_finish("test_kernels_determinism");
}
