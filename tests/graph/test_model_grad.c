/* Whole-model gradients against float64 finite differences.
 * For the GPT (tied embedding across the first and last stage), the MLP, and a graph with
 * a skip connection over a stage, scale, reshape, sum and mean: an independent float64
 * forward written here (plain loops, no starpipe kernels) gives the loss, central finite
 * differences of it give the gradient, and the reference interpreter's float32 loss and
 * gradients (after the tied-weight combine) must agree. Checked for 1 and several stages.
 * A graph of bias adds checks the gradients an input shares with a bias add's output
 * (program.c, grad_root) and those it must not share. */
#include <math.h>
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/models.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"
#include "tests/check.h"
#include "tests/graph/grad64.h"
#include "tests/graph/skip_graph.h"

/* ---- float64 building blocks ---- */
static void mm(double *out, const double *a, const double *w, int N, int K, int M)
{ /* out (N,M) = a (N,K) w (K,M) */
    for (int i = 0; i < N; i++)
        for (int j = 0; j < M; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += a[i * K + k] * w[k * M + j];
            out[i * M + j] = s;
        }
}
static void addbias(double *x, const double *b, int N, int C)
{
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) x[i * C + c] += b[c];
}
static void ln(double *out, const double *x, const double *g, const double *b, int N, int C)
{
    for (int i = 0; i < N; i++) {
        double mu = 0, var = 0;
        for (int c = 0; c < C; c++) mu += x[i * C + c];
        mu /= C;
        for (int c = 0; c < C; c++) var += (x[i * C + c] - mu) * (x[i * C + c] - mu);
        var /= C;
        double rs = 1.0 / sqrt(var + 1e-5);
        for (int c = 0; c < C; c++) out[i * C + c] = (x[i * C + c] - mu) * rs * g[c] + b[c];
    }
}
static double gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double ce(const double *logits, const int32_t *y, int N, int V)
{
    double total = 0;
    for (int i = 0; i < N; i++) {
        double mx = logits[i * V];
        for (int v = 1; v < V; v++) mx = fmax(mx, logits[i * V + v]);
        double z = 0;
        for (int v = 0; v < V; v++) z += exp(logits[i * V + v] - mx);
        total += -(logits[i * V + y[i]] - mx - log(z));
    }
    return total / N;
}

/* ---- GPT in float64 ---- */
static double gpt_loss64(const params64 *P, const sp_gpt_config *c, const int32_t *tok,
                         const int32_t *tgt)
{
    int B = c->batch, T = c->context, C = c->channels, V = c->vocab, NH = c->heads, hs = C / NH;
    int N = B * T;
    double *x = calloc((size_t)N * C, 8), *h = calloc((size_t)N * C, 8);
    double *qkv = calloc((size_t)N * 3 * C, 8), *att = calloc((size_t)N * C, 8);
    double *y = calloc((size_t)N * C, 8), *f = calloc((size_t)N * 4 * C, 8);
    double *logits = calloc((size_t)N * V, 8);
    const double *wte = PP(P, "wte", 0), *wpe = PP(P, "wpe", 0);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int k = 0; k < C; k++)
                x[(b * T + t) * C + k] = wte[tok[b * T + t] * C + k] + wpe[t * C + k];
    for (int l = 0; l < c->layers; l++) {
        ln(h, x, PP(P, "h%d.ln1.g", l), PP(P, "h%d.ln1.b", l), N, C);
        mm(qkv, h, PP(P, "h%d.attn.w", l), N, C, 3 * C);
        addbias(qkv, PP(P, "h%d.attn.b", l), N, 3 * C);
        for (int b = 0; b < B; b++)
            for (int hd = 0; hd < NH; hd++)
                for (int t = 0; t < T; t++) {
                    const double *q = qkv + (b * T + t) * 3 * C + hd * hs;
                    double sc[T], mx = -INFINITY, z = 0;
                    for (int u = 0; u <= t; u++) {
                        const double *k = qkv + (b * T + u) * 3 * C + C + hd * hs;
                        double d = 0;
                        for (int i = 0; i < hs; i++) d += q[i] * k[i];
                        sc[u] = d / sqrt((double)hs);
                        mx = fmax(mx, sc[u]);
                    }
                    for (int u = 0; u <= t; u++) z += (sc[u] = exp(sc[u] - mx));
                    for (int i = 0; i < hs; i++) {
                        double o = 0;
                        for (int u = 0; u <= t; u++)
                            o += sc[u] / z * qkv[(b * T + u) * 3 * C + 2 * C + hd * hs + i];
                        att[(b * T + t) * C + hd * hs + i] = o;
                    }
                }
        mm(y, att, PP(P, "h%d.proj.w", l), N, C, C);
        addbias(y, PP(P, "h%d.proj.b", l), N, C);
        for (int i = 0; i < N * C; i++) x[i] += y[i];
        ln(h, x, PP(P, "h%d.ln2.g", l), PP(P, "h%d.ln2.b", l), N, C);
        mm(f, h, PP(P, "h%d.fc.w", l), N, C, 4 * C);
        addbias(f, PP(P, "h%d.fc.b", l), N, 4 * C);
        for (int i = 0; i < N * 4 * C; i++) f[i] = gelu(f[i]);
        mm(y, f, PP(P, "h%d.fcproj.w", l), N, 4 * C, C);
        addbias(y, PP(P, "h%d.fcproj.b", l), N, C);
        for (int i = 0; i < N * C; i++) x[i] += y[i];
    }
    ln(h, x, PP(P, "lnf.g", 0), PP(P, "lnf.b", 0), N, C);
    for (int i = 0; i < N; i++)
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int k = 0; k < C; k++) s += h[i * C + k] * wte[v * C + k];
            logits[i * V + v] = s;
        }
    double L = ce(logits, tgt, N, V);
    free(x), free(h), free(qkv), free(att), free(y), free(f), free(logits);
    return L;
}

/* ---- MLP in float64 ---- */
static double mlp_loss64(const params64 *P, const sp_mlp_config *c, const float *xin,
                         const int32_t *y)
{
    int B = c->batch, W = c->width;
    int maxw = W > c->in_dim ? W : c->in_dim;
    double *h = calloc((size_t)B * maxw, 8), *o = calloc((size_t)B * maxw, 8);
    for (int i = 0; i < B * c->in_dim; i++) h[i] = xin[i];
    int fan = c->in_dim;
    for (int l = 0; l < c->depth; l++) {
        mm(o, h, PP(P, "l%d.w", l), B, fan, W);
        addbias(o, PP(P, "l%d.b", l), B, W);
        for (int i = 0; i < B * W; i++) h[i] = o[i] > 0 ? o[i] : 0;
        fan = W;
    }
    double *logits = calloc((size_t)B * c->classes, 8);
    mm(logits, h, PP(P, "head.w", 0), B, W, c->classes);
    addbias(logits, PP(P, "head.b", 0), B, c->classes);
    double L = ce(logits, y, B, c->classes);
    free(h), free(o), free(logits);
    return L;
}

/* ---- a graph with a skip edge over a stage (tests/graph/skip_graph.h) ---- */

static double skip_loss64(const params64 *P, const float *xin, const int32_t *y)
{
    double x[SK_B * SK_D], a[SK_B * SK_H], c[SK_B * SK_H], d[SK_B * SK_H], lg[SK_B * SK_K];
    for (int i = 0; i < SK_B * SK_D; i++) x[i] = xin[i];
    mm(a, x, PP(P, "w0", 0), SK_B, SK_D, SK_H);
    addbias(a, PP(P, "b0", 0), SK_B, SK_H);
    for (int i = 0; i < SK_B * SK_H; i++) a[i] = a[i] > 0 ? a[i] : 0;
    double aq[SK_B * SK_H];
    for (int i = 0; i < SK_B * SK_H; i++) aq[i] = a[i] + 2.0 * a[i];
    mm(c, aq, PP(P, "w1", 0), SK_B, SK_H, SK_H);
    double sum = 0;
    for (int i = 0; i < SK_B * SK_H; i++) {
        d[i] = gelu(c[i]) + 0.5 * a[i];
        sum += d[i];
    }
    mm(lg, d, PP(P, "wo", 0), SK_B, SK_H, SK_K);
    return ce(lg, y, SK_B, SK_K) + 0.3 * sum / (SK_B * SK_H) + 0.01 * sum;
}

/* ---- bias adds: where an input's gradient is the output's (program.c, grad_root) and
 * where it must not be: on an INPUT, on a PARAM, on a product read twice (in its stage,
 * and from a later stage), on a value of an earlier stage; chains of two ---- */
enum { BA_H = 6 };

static sp_graph *bias_graph(int stages)
{
    sp_graph *g = sp_graph_create();
    sp_tensor x = sp_input_f32(g, "x", 2, (int64_t[]){ SK_B, SK_D });
    sp_tensor y = sp_input_i32(g, "y", 1, (int64_t[]){ SK_B });
    sp_tensor bx = sp_param(g, "bx", 1, (int64_t[]){ SK_D }, SP_INIT_NORMAL, 0.3f);
    sp_tensor w0 = sp_param(g, "w0", 2, (int64_t[]){ SK_D, BA_H }, SP_INIT_NORMAL, 0.4f);
    sp_tensor b0 = sp_param(g, "b0", 1, (int64_t[]){ BA_H }, SP_INIT_NORMAL, 0.2f);
    sp_tensor w1 = sp_param(g, "w1", 2, (int64_t[]){ BA_H, BA_H }, SP_INIT_NORMAL, 0.4f);
    sp_tensor b1 = sp_param(g, "b1", 1, (int64_t[]){ BA_H }, SP_INIT_NORMAL, 0.2f);
    sp_tensor pp = sp_param(g, "pp", 2, (int64_t[]){ SK_B, BA_H }, SP_INIT_NORMAL, 0.3f);
    sp_tensor b2 = sp_param(g, "b2", 1, (int64_t[]){ BA_H }, SP_INIT_NORMAL, 0.2f);
    sp_tensor wo = sp_param(g, "wo", 2, (int64_t[]){ BA_H, SK_K }, SP_INIT_NORMAL, 0.4f);
    sp_tensor bo = sp_param(g, "bo", 1, (int64_t[]){ SK_K }, SP_INIT_NORMAL, 0.2f);
    sp_tensor bo2 = sp_param(g, "bo2", 1, (int64_t[]){ SK_K }, SP_INIT_NORMAL, 0.2f);
    sp_tensor h0 = sp_matmul(g, sp_bias_add(g, x, bx), w0, 0, 0); /* also read in stage 1 */
    sp_tensor a0 = sp_bias_add(g, h0, b0);
    if (stages > 1) a0 = sp_pipeline_yield(g, a0);
    sp_tensor h1 = sp_matmul(g, sp_relu(g, a0), w1, 0, 0); /* read twice in its stage */
    sp_tensor s1 = sp_add(g, sp_gelu(g, sp_bias_add(g, h1, b1)), h1);
    sp_tensor u = sp_add(g, s1, sp_add(g, sp_bias_add(g, pp, b2), h0));
    sp_tensor hm = sp_matmul(g, u, wo, 0, 0);
    if (stages > 2) hm = sp_pipeline_yield(g, hm); /* read only by a bias add of stage 2 */
    sp_tensor lg = sp_bias_add(g, sp_bias_add(g, hm, bo), bo2);
    REQUIRE(sp_graph_set_loss(g, sp_cross_entropy(g, lg, y)) == SP_OK, "bias graph: %s",
            sp_last_error());
    return g;
}

static double bias_loss64(const params64 *P, const float *xin, const int32_t *y)
{
    double x[SK_B * SK_D], h0[SK_B * BA_H], r[SK_B * BA_H], h1[SK_B * BA_H], u[SK_B * BA_H];
    double lg[SK_B * SK_K];
    const double *bx = PP(P, "bx", 0), *b1 = PP(P, "b1", 0), *pp = PP(P, "pp", 0);
    const double *b2 = PP(P, "b2", 0);
    for (int i = 0; i < SK_B * SK_D; i++) x[i] = xin[i] + bx[i % SK_D];
    mm(h0, x, PP(P, "w0", 0), SK_B, SK_D, BA_H);
    for (int i = 0; i < SK_B * BA_H; i++) r[i] = h0[i];
    addbias(r, PP(P, "b0", 0), SK_B, BA_H);
    for (int i = 0; i < SK_B * BA_H; i++) r[i] = r[i] > 0 ? r[i] : 0;
    mm(h1, r, PP(P, "w1", 0), SK_B, BA_H, BA_H);
    for (int i = 0; i < SK_B * BA_H; i++)
        u[i] = gelu(h1[i] + b1[i % BA_H]) + h1[i] + (pp[i] + b2[i % BA_H]) + h0[i];
    mm(lg, u, PP(P, "wo", 0), SK_B, BA_H, SK_K);
    addbias(lg, PP(P, "bo", 0), SK_B, SK_K);
    addbias(lg, PP(P, "bo2", 0), SK_B, SK_K);
    return ce(lg, y, SK_B, SK_K);
}

/* ---- the check ---- */
typedef double (*loss_fn)(const params64 *P, const void *cfg, int mb);

typedef struct {
    const char *name;
    const void *cfg;
    loss_fn f;
    int m;
} model_case;

static double mean_loss(const model_case *mc, const params64 *P)
{
    double s = 0;
    for (int i = 0; i < mc->m; i++) s += mc->f(P, mc->cfg, i);
    return s / mc->m;
}

/* Compares the interpreter's loss and gradient with float64 for `per_param` entries of
 * every parameter. Relative tolerance 2e-3 of the largest finite-difference entry of the
 * parameter: float32 arithmetic through a few layers is accurate to ~1e-5 relative, so a
 * wrong VJP or a lost contribution (errors of order 1) cannot hide in it. */
typedef struct {
    const model_case *mc;
    const params64 *P;
} loss_ctx;

static double loss_of(void *c)
{
    const loss_ctx *lc = c;
    return mean_loss(lc->mc, lc->P);
}

static void check_model(const model_case *mc, const sp_graph *g, sp_reference *r,
                        const void *const *inputs, int per_param, uint64_t seed)
{
    float loss32;
    REQUIRE(sp_reference_forward_backward(r, inputs, &loss32) == SP_OK, "%s: %s", mc->name,
            sp_last_error());
    params64 P = copy_params(g, r);
    double loss64 = mean_loss(mc, &P);
    CHECK(fabs(loss32 - loss64) <= 1e-5 * fmax(1.0, fabs(loss64)),
          "%s: loss float32 %.9g vs float64 %.9g", mc->name, loss32, loss64);
    loss_ctx lc = { mc, &P };
    int64_t *entry = malloc(sizeof *entry * (size_t)per_param);
    REQUIRE(entry, "out of memory");
    for (int i = 0; i < sp_graph_num_params(g); i++) {
        sp_tensor t = sp_graph_param(g, i);
        int64_t n = sp_tensor_numel(g, t);
        for (int k = 0; k < per_param; k++)
            entry[k] = (int64_t)(sp_mix64(seed + 977 * (uint64_t)(i * per_param + k)) % (uint64_t)n);
        char what[160];
        snprintf(what, sizeof what, "%s: gradient of '%s'", mc->name, sp_tensor_name(g, t));
        fd_check(what, P.val[t], entry, per_param, sp_reference_grad(r, t), loss_of, &lc);
    }
    free(entry);
    free_params(&P);
}

/* inputs of the cases, per microbatch */
static int32_t gpt_tok[3][64], gpt_tgt[3][64];
static float mlp_x[3][5 * 7], skip_x[3][SK_B * SK_D];
static int32_t mlp_y[3][5], skip_y[3][SK_B];

static double gpt_case(const params64 *P, const void *cfg, int mb)
{
    return gpt_loss64(P, cfg, gpt_tok[mb], gpt_tgt[mb]);
}
static double mlp_case(const params64 *P, const void *cfg, int mb)
{
    return mlp_loss64(P, cfg, mlp_x[mb], mlp_y[mb]);
}
static double skip_case(const params64 *P, const void *cfg, int mb)
{
    (void)cfg;
    return skip_loss64(P, skip_x[mb], skip_y[mb]);
}

static double bias_case(const params64 *P, const void *cfg, int mb)
{
    (void)cfg;
    return bias_loss64(P, skip_x[mb], skip_y[mb]);
}

static void run_case(const char *name, sp_graph *g, const void *cfg, loss_fn f, int m,
                     const void *const *inputs, int per_param)
{
    sp_status st;
    REQUIRE(g, "%s: %s", name, sp_last_error());
    sp_program *p = sp_program_build(g, &st);
    REQUIRE(p, "%s: %s", name, sp_last_error());
    sp_reference *r = sp_reference_create(p, m, NULL, 7, &st);
    REQUIRE(r, "%s: %s", name, sp_last_error());
    model_case mc = { name, cfg, f, m };
    check_model(&mc, g, r, inputs, per_param, 99);
    sp_reference_free(r);
    sp_program_free(p);
    sp_graph_free(g);
}

int main(void)
{
    const int m = 2;
    sp_status st;
    for (int stages = 1; stages <= 2; stages++) {
        sp_gpt_config c = { .vocab = 256, .context = 5, .layers = 2, .heads = 3, .channels = 12,
                            .batch = 2, .stages = stages };
        const void *in[6];
        for (int i = 0; i < m; i++) {
            for (int k = 0; k < c.batch * c.context; k++) {
                gpt_tok[i][k] = (int32_t)(sp_mix64(100 + i * 64 + k) % 256);
                gpt_tgt[i][k] = (int32_t)(sp_mix64(900 + i * 64 + k) % 256);
            }
            in[2 * i] = gpt_tok[i];
            in[2 * i + 1] = gpt_tgt[i];
        }
        char name[32];
        snprintf(name, sizeof name, "gpt/%d stages", stages);
        run_case(name, sp_model_gpt(&c, &st), &c, gpt_case, m, in, 4);
    }
    for (int stages = 1; stages <= 3; stages += 2) {
        sp_mlp_config c = { .in_dim = 7, .width = 13, .depth = 3, .classes = 4, .batch = 5,
                            .stages = stages };
        const void *in[6];
        for (int i = 0; i < m; i++) {
            sp_mlp_batch(5, 1, i, c.batch, c.in_dim, c.classes, mlp_x[i], mlp_y[i]);
            in[2 * i] = mlp_x[i];
            in[2 * i + 1] = mlp_y[i];
        }
        char name[32];
        snprintf(name, sizeof name, "mlp/%d stages", stages);
        run_case(name, sp_model_mlp(&c, &st), &c, mlp_case, m, in, 6);
    }
    for (int stages = 1; stages <= 3; stages++) {
        const void *in[6];
        for (int i = 0; i < m; i++) {
            sp_mlp_batch(11, 2, i, SK_B, SK_D, SK_K, skip_x[i], skip_y[i]);
            in[2 * i] = skip_x[i];
            in[2 * i + 1] = skip_y[i];
        }
        char name[32];
        snprintf(name, sizeof name, "skip/%d stages", stages);
        run_case(name, skip_graph(stages), NULL, skip_case, m, in, 6);
        snprintf(name, sizeof name, "bias adds/%d stages", stages);
        run_case(name, bias_graph(stages), NULL, bias_case, m, in, 6);
    }
    return check_summary("test_model_grad");
}
