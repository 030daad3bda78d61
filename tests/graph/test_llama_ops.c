/* The Llama ops' gradients against float64 finite differences: x = xin w0 -> op ->
 * logits = (.) wo -> cross-entropy, through the reference interpreter, for 1 and 2 stages
 * (the cut after the op), accumulated over two microbatches. The ops: rotary embeddings
 * (every head, and a selection), SwiGLU, grouped-query attention at G = 1, 2, 4, and
 * rope then attention on the fused qkv as the Llama block composes them. Each has its
 * float64 forward written here from the definition (Hugging Face's rotate_half, silu,
 * softmax(q k^T / sqrt(hs)) v with the causal mask), not from the kernels. T = 29 crosses
 * the CPU attention's 24-row query block. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"
#include "tests/check.h"
#include "tests/graph/grad64.h"

enum { B = 2, T = 29, D = 5, K = 6, MB = 2, WMAX = 64 };

typedef struct {
    const char *name;
    int kind; /* 0 rope, 1 swiglu, 2 attention, 3 rope then attention */
    int W;    /* the op's input width */
    int hs, period, rotated; /* rope */
    int heads, kv;           /* attention */
    float theta;
} op_case;

static float xin[MB][B * T * D];
static int32_t tgt[MB][B * T];

static int out_width(const op_case *c)
{
    if (c->kind == 1) return c->W / 2;
    if (c->kind >= 2) return c->heads * c->hs;
    return c->W;
}

static sp_graph *op_graph(const op_case *c, int stages)
{
    sp_graph *g = sp_graph_create();
    sp_tensor x = sp_input_f32(g, "x", 3, (int64_t[]){ B, T, D });
    sp_tensor y = sp_input_i32(g, "y", 2, (int64_t[]){ B, T });
    sp_tensor w0 = sp_param(g, "w0", 2, (int64_t[]){ D, c->W }, SP_INIT_NORMAL, 0.5f);
    sp_tensor wo = sp_param(g, "wo", 2, (int64_t[]){ out_width(c), K }, SP_INIT_NORMAL, 0.5f);
    sp_tensor h = sp_matmul(g, x, w0, 0, 0);
    if (c->kind == 0 || c->kind == 3) h = sp_rope(g, h, c->hs, c->period, c->rotated, c->theta);
    if (c->kind == 1) h = sp_swiglu(g, h);
    if (c->kind >= 2) h = sp_attention_gqa(g, h, c->heads, c->kv);
    if (stages > 1) h = sp_pipeline_yield(g, h);
    REQUIRE(sp_graph_set_loss(g, sp_cross_entropy(g, sp_matmul(g, h, wo, 0, 0), y)) == SP_OK,
            "%s graph: %s", c->name, sp_last_error());
    return g;
}

/* rows (T, W) of one sequence turned in place, head j iff j % period < rotated */
static void rope64(const op_case *c, double *x)
{
    const int half = c->hs / 2;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < c->W / c->hs; j++) {
            if (j % c->period >= c->rotated) continue;
            double *u = x + t * c->W + j * c->hs;
            for (int i = 0; i < half; i++) {
                double a = t * pow(c->theta, -2.0 * i / c->hs), p = u[i], q = u[i + half];
                u[i] = p * cos(a) - q * sin(a);
                u[i + half] = q * cos(a) + p * sin(a);
            }
        }
}

/* causal attention of one sequence: qkv (T, W) in the grouped layout -> out (T, H hs) */
static void attention64(const op_case *c, const double *qkv, double *out)
{
    const int G = c->heads / c->kv, hs = c->hs, H = c->heads;
    for (int h = 0; h < H; h++) {
        const int kv = h / G, base = kv * (G + 2) * hs;
        const int qo = base + (h % G) * hs, ko = base + G * hs, vo = base + (G + 1) * hs;
        for (int t = 0; t < T; t++) {
            double s[T], mx = -INFINITY, z = 0;
            for (int u = 0; u <= t; u++) {
                s[u] = 0;
                for (int i = 0; i < hs; i++) s[u] += qkv[t * c->W + qo + i] * qkv[u * c->W + ko + i];
                s[u] /= sqrt((double)hs);
                mx = fmax(mx, s[u]);
            }
            for (int u = 0; u <= t; u++) z += exp(s[u] - mx);
            for (int i = 0; i < hs; i++) {
                double o = 0;
                for (int u = 0; u <= t; u++) o += exp(s[u] - mx) / z * qkv[u * c->W + vo + i];
                out[t * H * hs + h * hs + i] = o;
            }
        }
    }
}

/* the mean loss over the microbatches, in float64 */
static double loss64(const op_case *c, const double *w0, const double *wo)
{
    const int W = c->W, O = out_width(c);
    double *h = malloc(sizeof(double) * T * W), *o = malloc(sizeof(double) * T * O);
    double total = 0;
    for (int mb = 0; mb < MB; mb++)
        for (int b = 0; b < B; b++) {
            const float *xs = xin[mb] + b * T * D;
            for (int t = 0; t < T; t++)
                for (int w = 0; w < W; w++) {
                    h[t * W + w] = 0;
                    for (int d = 0; d < D; d++) h[t * W + w] += xs[t * D + d] * w0[d * W + w];
                }
            if (c->kind == 0 || c->kind == 3) rope64(c, h);
            if (c->kind == 0) memcpy(o, h, sizeof(double) * T * W);
            if (c->kind == 1)
                for (int t = 0; t < T; t++)
                    for (int i = 0; i < O; i++) {
                        double a = h[t * W + i], bb = h[t * W + O + i];
                        o[t * O + i] = a / (1 + exp(-a)) * bb;
                    }
            if (c->kind >= 2) attention64(c, h, o);
            for (int t = 0; t < T; t++) {
                double lg[K], mx = -INFINITY, z = 0;
                for (int k = 0; k < K; k++) {
                    lg[k] = 0;
                    for (int i = 0; i < O; i++) lg[k] += o[t * O + i] * wo[i * K + k];
                    mx = fmax(mx, lg[k]);
                }
                for (int k = 0; k < K; k++) z += exp(lg[k] - mx);
                total += -(lg[tgt[mb][b * T + t]] - mx - log(z));
            }
        }
    free(h), free(o);
    return total / (MB * B * T);
}

typedef struct {
    const op_case *c;
    const params64 *P;
} loss_ctx;

static double loss_of(void *p)
{
    const loss_ctx *lc = p;
    return loss64(lc->c, PP(lc->P, "w0", 0), PP(lc->P, "wo", 0));
}

static void run_case(const op_case *c, int stages)
{
    sp_status st;
    sp_graph *g = op_graph(c, stages);
    sp_program *p = sp_program_build(g, &st);
    REQUIRE(p, "%s/%d stages: %s", c->name, stages, sp_last_error());
    sp_reference *r = sp_reference_create(p, MB, NULL, 7, &st);
    REQUIRE(r, "%s/%d stages: %s", c->name, stages, sp_last_error());
    const void *in[2 * MB];
    for (int i = 0; i < MB; i++) in[2 * i] = xin[i], in[2 * i + 1] = tgt[i];
    float loss32;
    REQUIRE(sp_reference_forward_backward(r, in, &loss32) == SP_OK, "%s", sp_last_error());
    params64 P = copy_params(g, r);
    loss_ctx lc = { c, &P };
    double l64 = loss_of(&lc);
    CHECK(fabs(loss32 - l64) <= 1e-5 * fmax(1.0, fabs(l64)),
          "%s/%d stages: loss float32 %.9g vs float64 %.9g", c->name, stages, loss32, l64);
    const char *names[2] = { "w0", "wo" };
    for (int q = 0; q < 2; q++) { /* every entry */
        sp_tensor t = sp_graph_find(g, names[q]);
        char what[128];
        snprintf(what, sizeof what, "%s/%d stages: gradient of '%s'", c->name, stages, names[q]);
        fd_check(what, PP(&P, names[q], 0), NULL, sp_tensor_numel(g, t), sp_reference_grad(r, t),
                 loss_of, &lc);
    }
    free_params(&P);
    sp_reference_free(r);
    sp_program_free(p);
    sp_graph_free(g);
}

/* Bad configurations: one message naming what is wrong, and no node. */
static void refused(sp_tensor t, const char *want)
{
    CHECK(t < 0 && strstr(sp_last_error(), want), "refusal: got %d, '%s' lacks '%s'", t,
          t < 0 ? sp_last_error() : "", want);
}

static void refusals(void)
{
    sp_graph *g = sp_graph_create();
    sp_tensor x = sp_input_f32(g, "x", 3, (int64_t[]){ B, T, 24 });
    sp_tensor odd = sp_input_f32(g, "odd", 2, (int64_t[]){ 3, 5 });
    refused(sp_rope(g, x, 3, 1, 1, 10000.0f), "head size 3 must be even");
    refused(sp_rope(g, x, 16, 1, 1, 10000.0f), "multiple of the head size 16");
    refused(sp_rope(g, x, 4, 2, 3, 10000.0f), "rotated 3 of every 2 heads");
    refused(sp_rope(g, x, 4, 1, 1, 0.5f), "theta 0.5");
    refused(sp_attention_gqa(g, x, 4, 3), "3 KV heads do not divide 4 query heads");
    refused(sp_attention_gqa(g, x, 10, 5), "must be (B,T,20 hs)");
    refused(sp_swiglu(g, odd), "even dim");
    sp_graph_free(g);
}

int main(void)
{
    for (int i = 0; i < MB; i++) {
        for (int j = 0; j < B * T * D; j++)
            xin[i][j] = (float)((double)(sp_mix64(300 + i * 1000 + j) % 2001) / 1000.0 - 1.0);
        for (int j = 0; j < B * T; j++) tgt[i][j] = (int32_t)(sp_mix64(700 + i * 100 + j) % K);
    }
    const op_case cases[] = {
        { "rope all heads", 0, 24, 4, 1, 1, 0, 0, 10000.0f },
        { "rope 3 of every 4 heads, hs 6", 0, 48, 6, 4, 3, 0, 0, 100.0f },
        { "swiglu", 1, 22, 0, 0, 0, 0, 0, 0 },
        { "attention G=1 (4 heads)", 2, 4 * 3 * 4, 4, 0, 0, 4, 4, 0 },
        { "attention G=2 (4 heads, 2 KV)", 2, 2 * 4 * 4, 4, 0, 0, 4, 2, 0 },
        { "attention G=4 (4 heads, 1 KV)", 2, 1 * 6 * 4, 4, 0, 0, 4, 1, 0 },
        { "rope then attention G=2", 3, 2 * 4 * 4, 4, 4, 3, 4, 2, 10000.0f },
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        REQUIRE(cases[k].W <= WMAX, "case width");
        for (int stages = 1; stages <= 2; stages++) run_case(&cases[k], stages);
    }
    refusals();
    return check_summary("test_llama_ops");
}
