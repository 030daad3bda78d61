/* A padded vocabulary (models.h vocab_pad, graph.h sp_param_pad_rows and
 * sp_cross_entropy_padded), for the GPT (tied wte) and the Llama (embed_tokens and
 * lm_head): V = 37 tokens padded to a multiple of 8 x T.
 *   - T = 1, padded against unpadded, 3 AdamW steps with clipping: the loss and every
 *     gradient norm the same bits, every parameter's token rows the same bits, the padding
 *     rows zero (their gradients zero): padding changes nothing;
 *   - T = 2 and 3 (37 divides by neither: padding is what lets them run) against T = 1
 *     unpadded: the loss, the norm and the token rows within float32 rounding, the padding
 *     zero, the logits' padding columns left out of the loss;
 *   - the padding rows are zero from the start (sp_param_init_values) and every token
 *     row is the unpadded model's draw; a target or a token in the padding is refused by
 *     the program's input check, naming the input. */
#include <math.h>
#include <string.h>

#include "starpipe/models.h"
#include "tests/graph/tp_group.h"

enum { M = 2, V = 37 };

typedef struct {
    int llama, pad;
} variant;

static sp_graph *build(int T, int rank, const void *ctx)
{
    const variant *v = ctx;
    sp_status st;
    sp_graph *g;
    if (v->llama) {
        sp_llama_config c = { .vocab = V, .context = 6, .layers = 2, .heads = 2, .kv_heads = 2,
                              .channels = 16, .hidden = 12, .batch = 2, .stages = 1,
                              .tensor = T, .tensor_rank = rank, .vocab_pad = v->pad };
        g = sp_model_llama(&c, &st);
    } else {
        sp_gpt_config c = { .vocab = V, .context = 6, .layers = 2, .heads = 6, .channels = 18,
                            .batch = 2, .stages = 1, .tensor = T, .tensor_rank = rank,
                            .vocab_pad = v->pad };
        g = sp_model_gpt(&c, &st);
    }
    REQUIRE(g, "build T=%d pad %d: %s", T, v->pad, sp_last_error());
    return g;
}

static int32_t tok[M][12], tgt[M][12];
static const void *inputs[2 * M];

static tp_run run_of(int steps)
{
    tp_run run = { .microbatches = M, .steps = steps, .inputs = inputs, .seed = 9 };
    sp_adamw_defaults(&run.opt);
    run.opt.lr = 1e-2f;
    run.opt.grad_clip = 0.1f; /* below the norms here: every step clips */
    return run;
}

/* The token rows (the first V of a padded parameter, all of another) of `name` in G and
 * in the reference ref: the largest difference, a gradient's against ref's largest
 * magnitude, a value's against 1 + its own; *zero set to whether G's padding rows are all
 * zero. */
static double rows_err(const tp_group *G, const tp_group *ref, const char *name, int grad,
                       int *zero)
{
    const sp_graph *g = G->m[0].g, *gr = ref->m[0].g;
    sp_tensor p = sp_graph_find(g, name), pr = sp_graph_find(gr, name);
    const int64_t rows = sp_param_full_shape(g, p)[0], valid = sp_param_valid_rows(g, p);
    const int64_t len = sp_param_whole_numel(g, p) / rows;
    REQUIRE(sp_param_valid_rows(gr, pr) == valid, "%s: %lld and %lld token rows", name,
            (long long)valid, (long long)sp_param_valid_rows(gr, pr));
    float *a = tp_whole(G, name, grad), *b = tp_whole(ref, name, grad);
    double d = 0, mag = 0; /* values: each against 1 + its size (test_tp_models' measures) */
    for (int64_t j = 0; j < valid * len; j++) {
        const double e = fabs((double)a[j] - b[j]) / (grad ? 1 : 1 + fabs(b[j]));
        if (!(e <= d)) d = e;
        if (grad && fabs(b[j]) > mag) mag = fabs(b[j]);
    }
    *zero = 1;
    for (int64_t j = valid * len; j < rows * len; j++) *zero &= a[j] == 0.0f;
    free(a), free(b);
    return d / (mag > 0 ? mag : 1);
}

/* kinds: bit 0 the values, bit 1 the gradients */
static void compare(const char *what, const tp_group *G, const tp_group *ref, double tol,
                    int kinds)
{
    const sp_graph *g = G->m[0].g;
    CHECK(tol ? fabs(G->m[0].loss - ref->m[0].loss) <= tol * (1 + fabs(ref->m[0].loss))
              : !memcmp(&G->m[0].loss, &ref->m[0].loss, 4),
          "%s: loss %.9g, unpadded %.9g", what, G->m[0].loss, ref->m[0].loss);
    const double n = sp_reference_grad_norm(G->m[0].r), nr = sp_reference_grad_norm(ref->m[0].r);
    CHECK(tol ? fabs(n - nr) <= tol * nr : n == nr, "%s: gradient norm %.9g, unpadded %.9g",
          what, n, nr);
    int padded = 0;
    for (int i = 0; i < sp_graph_num_params(g); i++) {
        const char *name = sp_tensor_name(g, sp_graph_param(g, i));
        for (int grad = 0; grad < 2; grad++) {
            if (!(kinds >> grad & 1)) continue;
            int zero;
            const double e = rows_err(G, ref, name, grad, &zero);
            CHECK(e <= tol, "%s: %s%s's token rows off the unpadded model's by %.3g", what,
                  grad ? "d" : "", name, e);
            CHECK(zero, "%s: %s%s's padding rows are not zero", what, grad ? "d" : "", name);
        }
        padded += sp_param_valid_rows(g, sp_graph_param(g, i)) < sp_param_full_shape(g, sp_graph_param(g, i))[0];
    }
    CHECK(padded == (strstr(what, "llama") ? 2 : 1), "%s: %d padded parameters", what, padded);
}

int main(void)
{
    for (int i = 0; i < M; i++) {
        for (int k = 0; k < 12; k++) {
            tok[i][k] = (int32_t)((7 * k + 3 * i + 1) % V);
            tgt[i][k] = (int32_t)((5 * k + 11 * i + 2) % V);
        }
        inputs[2 * i] = tok[i], inputs[2 * i + 1] = tgt[i];
    }
    for (int llama = 0; llama < 2; llama++) {
        const variant plain = { llama, 0 }, pad = { llama, 8 };
        const char *arch = llama ? "llama" : "gpt";
        char what[64];
        /* the initial values: padding zero, token rows the unpadded draw */
        sp_graph *gp = build(1, 0, &pad), *gu = build(1, 0, &plain);
        const char *emb = llama ? "model.embed_tokens.weight" : "wte";
        sp_tensor ep = sp_graph_find(gp, emb), eu = sp_graph_find(gu, emb);
        CHECK(sp_param_full_shape(gp, ep)[0] == 40 && sp_param_valid_rows(gp, ep) == V &&
                  sp_param_full_shape(gu, eu)[0] == V, "%s: %s padded to 40 rows", arch, emb);
        float *vp = malloc(4 * 40 * 18), *vu = malloc(4 * 40 * 18);
        const int64_t C = sp_param_full_shape(gp, ep)[1];
        sp_param_init_values(gp, ep, 5, vp);
        sp_param_init_values(gu, eu, 5, vu);
        int zero = 1;
        for (int64_t j = V * C; j < 40 * C; j++) zero &= vp[j] == 0.0f;
        CHECK(!memcmp(vp, vu, 4 * (size_t)(V * C)) && zero, "%s: %s's initial values: the "
              "token rows the unpadded draw, the padding zero", arch, emb);
        free(vp), free(vu);
        /* the input check: a target and a token in the padding */
        sp_status st;
        sp_program *pp = sp_program_build(gp, &st);
        REQUIRE(pp, "%s", sp_last_error());
        int32_t bad[12];
        for (int which = 0; which < 2; which++) {
            memcpy(bad, tok[0], sizeof bad);
            bad[3] = V; /* the first padding row */
            const void *in[2] = { which ? (const void *)tok[0] : bad,
                                  which ? (const void *)bad : tgt[0] };
            st = sp_program_check_inputs(pp, in, 1);
            CHECK(st != SP_OK && strstr(sp_last_error(), which ? "targets" : "tokens"),
                  "%s: a %s of %d (padding) accepted: %s", arch, which ? "target" : "token", V,
                  st ? sp_last_error() : "");
        }
        sp_program_free(pp);
        sp_graph_free(gp), sp_graph_free(gu);

        tp_group ref, G;
        tp_run steps = run_of(3);
        tp_run_group(&ref, 1, build, &plain, &steps);
        tp_run_group(&G, 1, build, &pad, &steps);
        snprintf(what, sizeof what, "%s T=1 padded", arch);
        compare(what, &G, &ref, 0, 3);
        tp_free_group(&G);
        /* other T: the gradients of one forward-backward, the values after the 3 steps */
        tp_group ref0;
        tp_run fb = run_of(0);
        tp_run_group(&ref0, 1, build, &plain, &fb);
        for (int T = 2; T <= (llama ? 2 : 3); T++) { /* the Llama's 2 KV heads: T = 2 */
            snprintf(what, sizeof what, "%s T=%d padded", arch, T);
            tp_run_group(&G, T, build, &pad, &fb);
            compare(what, &G, &ref0, 2e-5, 2);
            tp_free_group(&G);
            tp_run_group(&G, T, build, &pad, &steps);
            compare(what, &G, &ref, 2e-5, 1);
            for (int r = 1; r < T; r++)
                CHECK(!memcmp(&G.m[r].loss, &G.m[0].loss, 4), "%s: member %d's loss", what, r);
            tp_free_group(&G);
        }
        tp_free_group(&ref), tp_free_group(&ref0);
    }
    return check_summary("test_padded_vocab");
}
