/* Evaluation and sampling on the reference interpreter.
 * - sp_reference_eval: the mean loss of K microbatches equals a step's loss on the same
 *   microbatches bit for bit, leaves gradients, parameters and the step's losses alone,
 *   and does not depend on how the model is cut into stages.
 * - sp_sample_token: greedy is the argmax (lowest index on ties), top-k 1 is greedy,
 *   top-k never leaves the k largest, the draw follows softmax(logits / temperature),
 *   non-finite logits are refused.
 * - the held-out split: training windows stay in the first 90% of the bytes, evaluation
 *   windows in the last 10%.
 * - sp_generate on a GPT trained for 500 steps: the same seed gives the same tokens,
 *   another seed others, every token is in the vocabulary; greedy (temperature 0, or
 *   top-k 1) picks the argmax of logits computed independently (a float64 GPT-2 forward
 *   written here), on the contexts of a greedy and of a sampled text; the logits at the
 *   context's last position do not depend on the right padding nor on the batch row or
 *   batch size of the build. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/models.h"
#include "starpipe/reference.h"
#include "starpipe/sample.h"
#include "tests/check.h"
#include "tests/graph/program_util.h"

enum { V = 256, T = 16, C = 32, NH = 4, LAYERS = 2, B = 3, M = 3 };

/* A GPT build: `batch` sequences, `stages` stages (cut as `cut` says, or evenly). */
static sp_reference *gpt_reference(int batch, int stages, const int *cut, sp_graph **g,
                                   sp_program **p)
{
    sp_gpt_config c = { .vocab = V, .context = T, .layers = LAYERS, .heads = NH, .channels = C,
                        .batch = batch, .stages = stages, .stage_layers = cut };
    return test_gpt_reference(&c, M, 3e-3f, 7, g, p);
}

/* Parameters of `from` into `to` (another build of the same model), by name. */
static void copy_params(const sp_reference *from, sp_reference *to)
{
    const sp_graph *gf = sp_program_graph(sp_reference_program(from));
    const sp_graph *gt = sp_program_graph(sp_reference_program(to));
    for (int i = 0; i < sp_graph_num_params(gt); i++) {
        sp_tensor t = sp_graph_param(gt, i);
        sp_tensor f = sp_graph_find(gf, sp_tensor_name(gt, t));
        REQUIRE(f >= 0, "no parameter %s", sp_tensor_name(gt, t));
        REQUIRE(sp_reference_set_param(to, t, sp_reference_param(from, f)) == SP_OK, "%s",
                sp_last_error());
    }
}

/* ---- an independent GPT-2 forward in float64 (pre-norm, tanh GELU, tied head) ---- */
static const float *P(const sp_reference *r, const char *fmt, int l)
{
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    const sp_graph *g = sp_program_graph(sp_reference_program(r));
    const float *x = sp_reference_param(r, sp_graph_find(g, name));
    REQUIRE(x, "no parameter %s", name);
    return x;
}

static void layernorm(double *out, const double *x, const float *g, const float *b)
{
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C;
    double s = 1.0 / sqrt(v + 1e-5);
    for (int c = 0; c < C; c++) out[c] = (x[c] - m) * s * g[c] + b[c];
}

/* y (n) = x (k) W (k,n) + bias */
static void linear(double *y, const double *x, const float *w, const float *bias, int k, int n)
{
    for (int j = 0; j < n; j++) {
        double s = bias[j];
        for (int i = 0; i < k; i++) s += x[i] * w[(size_t)i * n + j];
        y[j] = s;
    }
}

/* Logits (V) at position L-1 of tokens[0..L). */
static void naive_logits(const sp_reference *r, const int32_t *tok, int L, double *logits)
{
    static double x[T][C], h[T][C], qkv[T][3 * C], att[T][C], fc[T][4 * C], tmp[4 * C];
    const float *wte = P(r, "wte", 0), *wpe = P(r, "wpe", 0);
    for (int t = 0; t < L; t++)
        for (int c = 0; c < C; c++) x[t][c] = (double)wte[tok[t] * C + c] + wpe[t * C + c];
    const int hs = C / NH;
    for (int l = 0; l < LAYERS; l++) {
        for (int t = 0; t < L; t++) {
            layernorm(h[t], x[t], P(r, "h%d.ln1.g", l), P(r, "h%d.ln1.b", l));
            linear(qkv[t], h[t], P(r, "h%d.attn.w", l), P(r, "h%d.attn.b", l), C, 3 * C);
        }
        for (int t = 0; t < L; t++)
            for (int hd = 0; hd < NH; hd++) {
                double w[T], mx = -INFINITY, z = 0;
                for (int u = 0; u <= t; u++) {
                    double s = 0;
                    for (int i = 0; i < hs; i++) s += qkv[t][hd * hs + i] * qkv[u][C + hd * hs + i];
                    w[u] = s / sqrt((double)hs);
                    if (w[u] > mx) mx = w[u];
                }
                for (int u = 0; u <= t; u++) z += (w[u] = exp(w[u] - mx));
                for (int i = 0; i < hs; i++) {
                    double s = 0;
                    for (int u = 0; u <= t; u++) s += w[u] / z * qkv[u][2 * C + hd * hs + i];
                    att[t][hd * hs + i] = s;
                }
            }
        for (int t = 0; t < L; t++) {
            linear(tmp, att[t], P(r, "h%d.proj.w", l), P(r, "h%d.proj.b", l), C, C);
            for (int c = 0; c < C; c++) x[t][c] += tmp[c];
            layernorm(h[t], x[t], P(r, "h%d.ln2.g", l), P(r, "h%d.ln2.b", l));
            linear(fc[t], h[t], P(r, "h%d.fc.w", l), P(r, "h%d.fc.b", l), C, 4 * C);
            for (int j = 0; j < 4 * C; j++) {
                double u = fc[t][j];
                fc[t][j] = 0.5 * u * (1 + tanh(0.7978845608028654 * (u + 0.044715 * u * u * u)));
            }
            linear(tmp, fc[t], P(r, "h%d.fcproj.w", l), P(r, "h%d.fcproj.b", l), 4 * C, C);
            for (int c = 0; c < C; c++) x[t][c] += tmp[c];
        }
    }
    layernorm(h[L - 1], x[L - 1], P(r, "lnf.g", 0), P(r, "lnf.b", 0));
    for (int v = 0; v < V; v++) {
        double s = 0;
        for (int c = 0; c < C; c++) s += h[L - 1][c] * wte[v * C + c];
        logits[v] = s;
    }
}

/* The model's float logits at position L-1 of row `row` of a build, tokens right-padded
 * with `pad`. */
static const float *model_logits(sp_reference *r, int batch, int row, const int32_t *tok, int L,
                                 int32_t pad)
{
    static int32_t in_tok[8 * T], in_tgt[8 * T];
    for (int i = 0; i < batch * T; i++) in_tok[i] = (int32_t)((i * 37 + 11) % V), in_tgt[i] = 0;
    for (int t = 0; t < T; t++) in_tok[row * T + t] = t < L ? tok[t] : pad;
    const void *in[2] = { in_tok, in_tgt };
    REQUIRE(sp_reference_eval(r, 1, in, NULL) == SP_OK, "%s", sp_last_error());
    const sp_graph *g = sp_program_graph(sp_reference_program(r));
    return sp_reference_value(r, sp_graph_find(g, "logits")) + ((size_t)row * T + L - 1) * V;
}

/* Whether the window (tokens, targets) of T+1 bytes lies somewhere in bytes [lo, end). */
static int window_in(const uint8_t *bytes, size_t lo, size_t end, const int32_t *tok,
                     const int32_t *tgt)
{
    for (size_t off = lo; off + T < end; off++) {
        int ok = 1;
        for (int j = 0; j < T && ok; j++)
            ok = bytes[off + j] == tok[j] && bytes[off + j + 1] == tgt[j];
        if (ok) return 1;
    }
    return 0;
}

static void test_token_picks(void)
{
    float x[8] = { 0.5f, 2.0f, -1.0f, 2.0f, 1.5f, 0.0f, 1.9f, -3.0f };
    for (int k = 0; k < 5; k++) {
        double u = k / 5.0;
        CHECK(sp_sample_token(x, 8, 0.0f, 0, u) == 1, "greedy is the first argmax");
        CHECK(sp_sample_token(x, 8, 0.7f, 1, u) == 1, "top-k 1 is greedy");
    }
    /* top-3: only 1, 3 (both 2.0) and 6 (1.9); ties to the lower index first */
    int seen[8] = { 0 };
    for (int j = 0; j < 1000; j++) seen[sp_sample_token(x, 8, 5.0f, 3, (j + 0.5) / 1000)]++;
    CHECK(seen[1] && seen[3] && seen[6] && seen[1] + seen[3] + seen[6] == 1000,
          "top-3 picks outside {1, 3, 6}: %d %d %d", seen[1], seen[3], seen[6]);
    CHECK(sp_sample_token(x, 8, 5.0f, 3, 0.0) == 1, "u = 0: the largest, lower index first");
    /* frequencies follow softmax(logits / temperature): weights 1:2:3:4 at temperature 1,
     * their square roots at temperature 2 */
    float y[4] = { 0, logf(2), logf(3), logf(4) };
    for (int q = 1; q <= 2; q++) {
        int cnt[4] = { 0 }, n = 20000;
        for (int j = 0; j < n; j++) cnt[sp_sample_token(y, 4, (float)q, 0, (j + 0.5) / n)]++;
        double w[4], tot = 0;
        for (int v = 0; v < 4; v++) tot += w[v] = pow(v + 1.0, 1.0 / q);
        for (int v = 0; v < 4; v++)
            CHECK(fabs(cnt[v] / (double)n - w[v] / tot) < 1e-3, "temperature %d: token %d "
                  "drawn %.4f, softmax %.4f", q, v, cnt[v] / (double)n, w[v] / tot);
    }
    /* the seeded draws: in [0, 1), reproducible, about uniform */
    double mean = 0;
    for (uint64_t i = 0; i < 10000; i++) {
        double u = sp_sample_uniform(42, i);
        CHECK(u >= 0 && u < 1 && u == sp_sample_uniform(42, i), "draw %f", u);
        mean += u / 10000;
    }
    CHECK(fabs(mean - 0.5) < 0.01 && sp_sample_uniform(42, 0) != sp_sample_uniform(43, 0),
          "draws: mean %f", mean);
    x[5] = NAN;
    CHECK(sp_sample_token(x, 8, 1.0f, 0, 0.5) == -1, "a NaN logit is refused");
    x[5] = INFINITY;
    CHECK(sp_sample_token(x, 8, 0.0f, 0, 0.5) == -1, "an infinite logit is refused");
}

int main(void)
{
    test_token_picks();
    sp_status st;
    sp_text *text = sp_text_load(SP_DEFAULT_CORPUS, T, &st);
    REQUIRE(text, "%s", sp_last_error());
    sp_graph *g, *g1, *g3;
    sp_program *p, *p1, *p3;
    sp_reference *r = gpt_reference(B, 2, NULL, &g, &p);
    int32_t tok[M][2][B * T];
    const void *in[2 * M];
    for (int i = 0; i < M; i++) in[2 * i] = tok[i][0], in[2 * i + 1] = tok[i][1];
    /* a few steps, so the logits are far from uniform */
    float loss = 0;
    for (int step = 1; step <= 500; step++) {
        for (int i = 0; i < M; i++) sp_text_batch(text, 1, step, i, B, T, tok[i][0], tok[i][1]);
        REQUIRE(sp_reference_step(r, in, &loss) == SP_OK, "%s", sp_last_error());
    }
    printf("trained 500 steps: loss %.4f\n", loss);

    /* ---- evaluation: a step's loss on the same microbatches, and nothing changes ---- */
    for (int i = 0; i < M; i++) sp_text_batch(text, 1, 99, i, B, T, tok[i][0], tok[i][1]);
    float fb = 0, ev = 0, ev1 = 0, ev3 = 0;
    REQUIRE(sp_reference_forward_backward(r, in, &fb) == SP_OK, "%s", sp_last_error());
    size_t gb = sp_program_buf_bytes(p, SP_BUF_GRADS, 0), pb = sp_program_buf_bytes(p, SP_BUF_PARAMS, 1);
    float *grads = malloc(gb), *params = malloc(pb), losses[M];
    memcpy(grads, sp_reference_slab(r, SP_BUF_GRADS, 0), gb);
    memcpy(params, sp_reference_slab(r, SP_BUF_PARAMS, 1), pb);
    memcpy(losses, sp_reference_microbatch_losses(r), sizeof losses);
    REQUIRE(sp_reference_eval(r, M, in, &ev) == SP_OK, "%s", sp_last_error());
    CHECK(!memcmp(&ev, &fb, 4), "eval %.9g vs a step's loss %.9g", ev, fb);
    CHECK(!memcmp(grads, sp_reference_slab(r, SP_BUF_GRADS, 0), gb) &&
              !memcmp(params, sp_reference_slab(r, SP_BUF_PARAMS, 1), pb) &&
              !memcmp(losses, sp_reference_microbatch_losses(r), sizeof losses),
          "evaluation changed gradients, parameters or the step's losses");
    /* the same parameters in one stage, and in three (embedding and head alone) */
    sp_reference *r1 = gpt_reference(B, 1, NULL, &g1, &p1);
    sp_reference *r3 = gpt_reference(B, 3, (const int[]){ 0, 2, 0 }, &g3, &p3);
    copy_params(r, r1);
    copy_params(r, r3);
    REQUIRE(sp_reference_eval(r1, M, in, &ev1) == SP_OK && sp_reference_eval(r3, M, in, &ev3) == SP_OK,
            "%s", sp_last_error());
    CHECK(!memcmp(&ev1, &ev, 4) && !memcmp(&ev3, &ev, 4), "eval by cut: %.9g %.9g %.9g", ev,
          ev1, ev3);
    sp_reference_free(r3), sp_program_free(p3), sp_graph_free(g3);
    /* the held-out split: the last 10%; training windows stay before it (the batches of a
     * step change), evaluation windows lie in it */
    size_t n = sp_text_size(text);
    REQUIRE(sp_text_hold_out(text, 10, T) == SP_OK, "%s", sp_last_error());
    size_t train = sp_text_train_size(text);
    CHECK(train == n - n / 10, "train part %zu of %zu", train, n);
    const uint8_t *bytes = sp_text_bytes(text);
    for (int step = 1; step <= 100; step++) {
        sp_text_batch(text, 1, step, 0, B, T, tok[0][0], tok[0][1]);
        for (int b = 0; b < B; b++)
            CHECK(window_in(bytes, 0, train, tok[0][0] + b * T, tok[0][1] + b * T),
                  "step %d: a training window is not in the first %zu bytes", step, train);
    }
    for (int k = 0; k < 4; k++) {
        int32_t et[B * T], eg[B * T];
        sp_text_eval_batch(text, k, 4, B, T, et, eg);
        for (int b = 0; b < B; b++)
            CHECK(window_in(bytes, train, n, et + b * T, eg + b * T),
                  "eval window %d.%d is not in the held-out tail", k, b);
    }
    CHECK(sp_text_hold_out(text, 10, (int)n) == SP_ERR_ARG && strstr(sp_last_error(), "--context"),
          "a context longer than the tail: %s", sp_last_error());
    sp_text_free(text);

    /* ---- generation on a batch-1, one-stage build of the trained parameters ---- */
    sp_reference *r1b = gpt_reference(1, 1, NULL, &g3, &p3);
    copy_params(r, r1b);
    const int32_t prompt[] = { 'T', 'h', 'e', ' ' };
    enum { N = 40 };
    int32_t a[N], b2[N], c[N], greedy[N], greedy_k1[N];
    sp_sample_opts so = { .temperature = 1.0f, .top_k = 0, .seed = 5 };
    REQUIRE(sp_generate(r1b, prompt, 4, N, &so, a) == SP_OK, "%s", sp_last_error());
    REQUIRE(sp_generate(r1b, prompt, 4, N, &so, b2) == SP_OK, "%s", sp_last_error());
    so.seed = 6;
    REQUIRE(sp_generate(r1b, prompt, 4, N, &so, c) == SP_OK, "%s", sp_last_error());
    CHECK(!memcmp(a, b2, sizeof a), "the same seed gave different tokens");
    CHECK(memcmp(a, c, sizeof a), "seeds 5 and 6 gave the same %d tokens", N);
    for (int i = 0; i < N; i++)
        CHECK(a[i] >= 0 && a[i] < V && c[i] >= 0 && c[i] < V, "token %d out of range", i);
    so = (sp_sample_opts){ .temperature = 0.0f, .seed = 5 };
    REQUIRE(sp_generate(r1b, prompt, 4, N, &so, greedy) == SP_OK, "%s", sp_last_error());
    so = (sp_sample_opts){ .temperature = 0.8f, .top_k = 1, .seed = 9 };
    REQUIRE(sp_generate(r1b, prompt, 4, N, &so, greedy_k1) == SP_OK, "%s", sp_last_error());
    CHECK(!memcmp(greedy, greedy_k1, sizeof greedy), "temperature 0 and top-k 1 differ");
    /* greedy against the float64 forward, on the contexts of the greedy text and of the
     * sampled one (varied contexts: a young model's greedy text repeats itself) */
    int32_t all[2][4 + N];
    memcpy(all[0], prompt, sizeof prompt), memcpy(all[0] + 4, greedy, sizeof greedy);
    memcpy(all[1], prompt, sizeof prompt), memcpy(all[1] + 4, a, sizeof a);
    double worst = 0;
    int distinct = 0;
    unsigned char used[V] = { 0 };
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < N; i++) {
            int have = 4 + i, L = have < T ? have : T;
            const int32_t *ctx = all[q] + have - L;
            double ref[V];
            naive_logits(r1b, ctx, L, ref);
            int best = 0;
            for (int v = 1; v < V; v++)
                if (ref[v] > ref[best]) best = v;
            const float *mine = model_logits(r1b, 1, 0, ctx, L, 0);
            for (int v = 0; v < V; v++)
                if (fabs(mine[v] - ref[v]) > worst) worst = fabs(mine[v] - ref[v]);
            int pick = sp_sample_token(mine, V, 0.0f, 0, 0.5);
            distinct += !used[pick], used[pick] = 1;
            CHECK(ref[best] - ref[pick] < 1e-4, "%s token %d: greedy picks %d (logit %.6f), the "
                  "float64 argmax is %d (%.6f)", q ? "sampled" : "greedy", i, pick, ref[pick],
                  best, ref[best]);
            if (q == 0) CHECK(greedy[i] == pick, "greedy token %d is %d, not the argmax %d", i,
                              greedy[i], pick);
            /* exact: neither the padding nor a row of a larger build changes these bits */
            float keep[V];
            memcpy(keep, mine, sizeof keep);
            CHECK(!memcmp(keep, model_logits(r1b, 1, 0, ctx, L, 'z'), sizeof keep),
                  "token %d: the padding changed the logits", i);
            CHECK(!memcmp(keep, model_logits(r1, B, B - 1, ctx, L, 'q'), sizeof keep),
                  "token %d: the last row of a batch-%d build gives other logits", i, B);
        }
    printf("greedy picks on %d contexts: %d distinct tokens\n", 2 * N, distinct);
    CHECK(distinct >= 3, "only %d distinct greedy picks: the check is too weak", distinct);
    printf("logits within %.2e of the float64 forward\n", worst);
    CHECK(worst < 1e-3, "logits differ from the float64 forward by %.3e", worst);
    /* bad calls fail with a message */
    CHECK(sp_generate(r1b, prompt, 0, 1, &so, a) == SP_ERR_ARG, "an empty prompt");
    int32_t bad[1] = { V };
    CHECK(sp_generate(r1b, bad, 1, 1, &so, a) != SP_OK && strstr(sp_last_error(), "tokens"),
          "a prompt token out of range: %s", sp_last_error());
    CHECK(sp_generate(r, prompt, 4, 1, &so, a) == SP_OK, "a batch-%d build samples (row 0)", B);
    sp_reference_free(r1b), sp_program_free(p3), sp_graph_free(g3);
    sp_reference_free(r1), sp_program_free(p1), sp_graph_free(g1);
    sp_reference_free(r), sp_program_free(p), sp_graph_free(g);
    free(grads), free(params);
    return check_summary("test_sample");
}
