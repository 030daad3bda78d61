/* The Llama model (sp_model_llama) against an independent float64 forward written here
 * from Hugging Face's LlamaForCausalLM (modeling_llama.py: RMSNorm, q/k/v projections,
 * apply_rotary_pos_emb with rotate_half, repeat_kv, SwiGLU), reading q, k and v as the
 * rows of qkv_proj that models.h documents:
 *   - the float32 loss of a step within 1e-5 of the float64 one, and every entry of every
 *     gradient against central finite differences of it (4 heads sharing 2 KV heads);
 *   - the same loss and gradients, bit for bit, when the model is cut into 3 stages (the
 *     embedding alone, the blocks, the head alone) and into 2;
 *   - after 40 AdamW steps, on a one-sequence build, greedy picks the float64 forward's
 *     argmax on the contexts of a greedy text and of a sampled one (sp_generate's own
 *     picks for the greedy text), with the logits within 1e-4 of it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/models.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"
#include "starpipe/sample.h"
#include "tests/check.h"
#include "tests/graph/grad64.h"

enum { V = 23, CTX = 9, L = 2, H = 4, KV = 2, C = 16, I = 12, B = 2, M = 2 };
enum { G = H / KV, HS = C / H, R = KV * (G + 2) * HS };
static const float THETA = 10000.0f;

static void rmsnorm(double *out, const double *x, const double *w)
{
    double ss = 0;
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    const double rs = 1.0 / sqrt(ss / C + 1e-5);
    for (int c = 0; c < C; c++) out[c] = w[c] * (x[c] * rs);
}

/* y (n) = x (k) W^T, W (n, k): nn.Linear */
static void linear(double *y, const double *x, const double *w, int k, int n)
{
    for (int j = 0; j < n; j++) {
        double s = 0;
        for (int i = 0; i < k; i++) s += x[i] * w[j * k + i];
        y[j] = s;
    }
}

/* apply_rotary_pos_emb on one head at position t: x cos + rotate_half(x) sin, cos and sin
 * of cat(freqs, freqs) */
static void rotate(double *x, int t)
{
    double y[HS];
    for (int i = 0; i < HS; i++) {
        const double f = t * pow(THETA, -2.0 * (i % (HS / 2)) / HS);
        const double rh = i < HS / 2 ? -x[i + HS / 2] : x[i - HS / 2];
        y[i] = x[i] * cos(f) + rh * sin(f);
    }
    memcpy(x, y, sizeof y);
}

/* The mean loss of one sequence (n tokens), and its logits at every position. */
static double forward64(const params64 *P, const int32_t *tok, const int32_t *tgt, int n,
                        double (*logits)[V])
{
    static double x[CTX][C], h[CTX][C], q[H][CTX][HS], k[KV][CTX][HS], v[KV][CTX][HS];
    static double a[CTX][C], o[C], gu[2 * I], s[I];
    const double *emb = PP(P, "model.embed_tokens.weight", 0);
    for (int t = 0; t < n; t++) memcpy(x[t], emb + tok[t] * C, sizeof x[t]);
    for (int l = 0; l < L; l++) {
        for (int t = 0; t < n; t++) {
            double qkv[R];
            rmsnorm(h[t], x[t], PP(P, "model.layers.%d.input_layernorm.weight", l));
            linear(qkv, h[t], PP(P, "model.layers.%d.self_attn.qkv_proj.weight", l), C, R);
            for (int kv = 0; kv < KV; kv++) {
                const double *blk = qkv + kv * (G + 2) * HS;
                for (int g = 0; g < G; g++) {
                    memcpy(q[kv * G + g][t], blk + g * HS, sizeof q[0][0]);
                    rotate(q[kv * G + g][t], t);
                }
                memcpy(k[kv][t], blk + G * HS, sizeof k[0][0]);
                rotate(k[kv][t], t);
                memcpy(v[kv][t], blk + (G + 1) * HS, sizeof v[0][0]);
            }
        }
        for (int hd = 0; hd < H; hd++) { /* repeat_kv: head hd reads KV head hd / G */
            const int kv = hd / G;
            for (int t = 0; t < n; t++) {
                double sc[CTX], mx = -INFINITY, z = 0;
                for (int u = 0; u <= t; u++) {
                    sc[u] = 0;
                    for (int i = 0; i < HS; i++) sc[u] += q[hd][t][i] * k[kv][u][i];
                    sc[u] /= sqrt((double)HS);
                    mx = fmax(mx, sc[u]);
                }
                for (int u = 0; u <= t; u++) z += exp(sc[u] - mx);
                for (int i = 0; i < HS; i++) {
                    double acc = 0;
                    for (int u = 0; u <= t; u++) acc += exp(sc[u] - mx) / z * v[kv][u][i];
                    a[t][hd * HS + i] = acc;
                }
            }
        }
        for (int t = 0; t < n; t++) {
            linear(o, a[t], PP(P, "model.layers.%d.self_attn.o_proj.weight", l), C, C);
            for (int c = 0; c < C; c++) x[t][c] += o[c];
            rmsnorm(h[t], x[t], PP(P, "model.layers.%d.post_attention_layernorm.weight", l));
            linear(gu, h[t], PP(P, "model.layers.%d.mlp.gate_up_proj.weight", l), C, 2 * I);
            for (int i = 0; i < I; i++) s[i] = gu[i] / (1 + exp(-gu[i])) * gu[I + i];
            linear(o, s, PP(P, "model.layers.%d.mlp.down_proj.weight", l), I, C);
            for (int c = 0; c < C; c++) x[t][c] += o[c];
        }
    }
    double loss = 0;
    for (int t = 0; t < n; t++) {
        double lg[V], mx = -INFINITY, z = 0;
        rmsnorm(h[t], x[t], PP(P, "model.norm.weight", 0));
        linear(lg, h[t], PP(P, "lm_head.weight", 0), C, V);
        for (int j = 0; j < V; j++) mx = fmax(mx, lg[j]);
        for (int j = 0; j < V; j++) z += exp(lg[j] - mx);
        if (tgt) loss += -(lg[tgt[t]] - mx - log(z));
        if (logits) memcpy(logits[t], lg, sizeof lg);
    }
    return loss / n;
}

static int32_t tok[M][B * CTX], tgt[M][B * CTX];

static double step_loss64(const params64 *P)
{
    double total = 0;
    for (int m = 0; m < M; m++)
        for (int b = 0; b < B; b++)
            total += forward64(P, tok[m] + b * CTX, tgt[m] + b * CTX, CTX, NULL);
    return total / (M * B);
}

static double step_loss_of(void *P) { return step_loss64(P); }

static sp_reference *build(int batch, int stages, const int *cut, sp_graph **g, sp_program **p)
{
    sp_llama_config c = { .vocab = V, .context = CTX, .layers = L, .heads = H, .kv_heads = KV,
                          .channels = C, .hidden = I, .batch = batch, .stages = stages,
                          .stage_layers = cut };
    sp_status st;
    *g = sp_model_llama(&c, &st);
    REQUIRE(*g, "%s", sp_last_error());
    *p = sp_program_build(*g, &st);
    REQUIRE(*p, "%s", sp_last_error());
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    opt.lr = 1e-2f;
    sp_reference *r = sp_reference_create(*p, M, &opt, 11, &st);
    REQUIRE(r, "%s", sp_last_error());
    return r;
}

static void set_params(const sp_reference *from, sp_reference *to)
{
    const sp_graph *gf = sp_program_graph(sp_reference_program(from));
    const sp_graph *gt = sp_program_graph(sp_reference_program(to));
    for (int i = 0; i < sp_graph_num_params(gt); i++) {
        sp_tensor t = sp_graph_param(gt, i);
        sp_tensor f = sp_graph_find(gf, sp_tensor_name(gt, t));
        REQUIRE(f >= 0 && sp_reference_set_param(to, t, sp_reference_param(from, f)) == SP_OK,
                "parameter %s: %s", sp_tensor_name(gt, t), sp_last_error());
    }
}

int main(void)
{
    const void *in[2 * M];
    for (int m = 0; m < M; m++) {
        for (int j = 0; j < B * CTX; j++) {
            tok[m][j] = (int32_t)((5 * j + 7 * m + 3) % V);
            tgt[m][j] = (int32_t)((3 * j + 2 * m + 1) % V);
        }
        in[2 * m] = tok[m], in[2 * m + 1] = tgt[m];
    }
    sp_graph *g1, *g3, *g2;
    sp_program *p1, *p3, *p2;
    sp_reference *r1 = build(B, 1, NULL, &g1, &p1);
    float loss1;
    REQUIRE(sp_reference_forward_backward(r1, in, &loss1) == SP_OK, "%s", sp_last_error());
    params64 P = copy_params(g1, r1);
    const double l64 = step_loss64(&P);
    CHECK(fabs(loss1 - l64) <= 1e-5 * fmax(1.0, fabs(l64)), "loss float32 %.9g, float64 %.9g",
          loss1, l64);
    for (int i = 0; i < sp_graph_num_params(g1); i++) { /* every entry */
        sp_tensor t = sp_graph_param(g1, i);
        char what[128];
        snprintf(what, sizeof what, "gradient of %s", sp_tensor_name(g1, t));
        fd_check(what, P.val[t], NULL, sp_tensor_numel(g1, t), sp_reference_grad(r1, t),
                 step_loss_of, &P);
    }
    /* the same bits under other cuts */
    sp_reference *r3 = build(B, 3, (const int[]){ 0, 2, 0 }, &g3, &p3);
    sp_reference *r2 = build(B, 2, NULL, &g2, &p2);
    const struct { sp_reference *r; const sp_graph *g; const char *what; } cuts[2] = {
        { r3, g3, "3 stages (0, 2, 0)" }, { r2, g2, "2 stages" } };
    for (int k = 0; k < 2; k++) {
        set_params(r1, cuts[k].r);
        float lk;
        REQUIRE(sp_reference_forward_backward(cuts[k].r, in, &lk) == SP_OK, "%s",
                sp_last_error());
        CHECK(!memcmp(&lk, &loss1, 4), "%s: loss %.9g, one stage %.9g", cuts[k].what, lk, loss1);
        for (int i = 0; i < sp_graph_num_params(g1); i++) {
            sp_tensor t = sp_graph_param(g1, i);
            sp_tensor u = sp_graph_find(cuts[k].g, sp_tensor_name(g1, t));
            CHECK(!memcmp(sp_reference_grad(r1, t), sp_reference_grad(cuts[k].r, u),
                          4 * (size_t)sp_tensor_numel(g1, t)),
                  "%s: the gradient of %s differs from one stage's", cuts[k].what,
                  sp_tensor_name(g1, t));
        }
    }
    /* train, then generate greedily on a one-sequence build */
    for (int s = 0; s < 40; s++) REQUIRE(sp_reference_step(r1, in, NULL) == SP_OK, "%s",
                                         sp_last_error());
    sp_graph *gb;
    sp_program *pb;
    sp_reference *rb = build(1, 1, NULL, &gb, &pb);
    set_params(r1, rb);
    params64 Pt = copy_params(gb, rb);
    const int32_t prompt[3] = { 3, 8, 13 };
    enum { N = 14 };
    int32_t texts[2][3 + N]; /* a greedy text and a sampled one: varied contexts */
    for (int q = 0; q < 2; q++) {
        sp_sample_opts so = { .temperature = q ? 1.0f : 0.0f, .seed = 1 };
        memcpy(texts[q], prompt, sizeof prompt);
        REQUIRE(sp_generate(rb, prompt, 3, N, &so, texts[q] + 3) == SP_OK, "%s",
                sp_last_error());
    }
    double worst = 0;
    int distinct = 0;
    unsigned char seen[V] = { 0 };
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < N; i++) {
            const int have = 3 + i, n = have < CTX ? have : CTX;
            const int32_t *all = texts[q];
            static double lg[CTX][V];
            forward64(&Pt, all + have - n, NULL, n, lg);
            int best = 0;
            for (int j = 1; j < V; j++)
                if (lg[n - 1][j] > lg[n - 1][best]) best = j;
            /* the model's own logits of this context: row 0 of a window padded with 0 */
            int32_t ctx[CTX] = { 0 }, zeros[CTX] = { 0 };
            memcpy(ctx, all + have - n, sizeof(int32_t) * (size_t)n);
            const void *one[2] = { ctx, zeros };
            REQUIRE(sp_reference_eval(rb, 1, one, NULL) == SP_OK, "%s", sp_last_error());
            const float *mine = sp_reference_value(rb, sp_graph_find(gb, "logits")) +
                                (size_t)(n - 1) * V;
            for (int j = 0; j < V; j++) worst = fmax(worst, fabs(mine[j] - lg[n - 1][j]));
            const int pick = sp_sample_token(mine, V, 0.0f, 0, 0.5);
            CHECK(pick == best || lg[n - 1][best] - lg[n - 1][pick] < 1e-6,
                  "%s text, token %d: greedy picks %d (float64 logit %.7f), the float64 argmax "
                  "is %d (%.7f)", q ? "sampled" : "greedy", i, pick, lg[n - 1][pick], best,
                  lg[n - 1][best]);
            if (q == 0)
                CHECK(all[have] == pick, "greedy token %d is %d, not the argmax %d", i,
                      all[have], pick);
            distinct += !seen[pick], seen[pick] = 1;
        }
    printf("greedy picks on %d contexts: %d distinct tokens; logits within %.2e of the "
           "float64 forward\n", 2 * N, distinct, worst);
    CHECK(distinct >= 3, "only %d distinct tokens: too weak a check", distinct);
    CHECK(worst < 1e-4, "logits off the float64 forward by %.3g", worst);
    free_params(&P), free_params(&Pt);
    sp_reference *const refs[4] = { r1, r3, r2, rb };
    sp_program *const progs[4] = { p1, p3, p2, pb };
    sp_graph *const graphs[4] = { g1, g3, g2, gb };
    for (int k = 0; k < 4; k++) {
        sp_reference_free(refs[k]);
        sp_program_free(progs[k]);
        sp_graph_free(graphs[k]);
    }
    return check_summary("test_llama_model");
}
