/* Determinism of the reference: the same seed gives bitwise the same losses, parameters
 * and AdamW moments in two runs; another seed gives other numbers; and a model cut into
 * 1, 2 or 4 stages trains to bitwise the same parameters: an MLP, and the GPT, whose tied
 * embedding has one gradient accumulator per use, summed in use order, however the
 * uses fall into stages; the same for uneven cuts (stage_layers), including a GPT stage
 * holding only the embedding or only the head, and bad cuts are refused with a message. */
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/models.h"
#include "starpipe/reference.h"
#include "tests/check.h"

typedef struct {
    float loss[3];
    float *params; /* all parameters, in graph order */
    size_t n;
} run_result;

static run_result run(sp_graph *g, int m, uint64_t seed, int gpt, int B, int T, int in_dim,
                      int classes)
{
    sp_status st;
    REQUIRE(g, "%s", sp_last_error());
    sp_program *p = sp_program_build(g, &st);
    REQUIRE(p, "%s", sp_last_error());
    sp_reference *r = sp_reference_create(p, m, NULL, seed, &st);
    REQUIRE(r, "%s", sp_last_error());
    run_result res = { .n = (size_t)sp_graph_param_count(g) };
    res.params = malloc(res.n * sizeof(float));
    void *in[16];
    for (int i = 0; i < m; i++) {
        in[2 * i] = malloc((size_t)B * (gpt ? T : in_dim) * 4);
        in[2 * i + 1] = malloc((size_t)B * (gpt ? T : 1) * 4);
    }
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < m; i++) {
            if (gpt)
                for (int k = 0; k < B * T; k++) {
                    ((int32_t *)in[2 * i])[k] = (int32_t)(sp_mix64(seed * 1000 + step * 100 + i * 10 + k) % 256);
                    ((int32_t *)in[2 * i + 1])[k] = (int32_t)(sp_mix64(seed * 7 + step * 100 + i * 10 + k) % 256);
                }
            else
                sp_mlp_batch(seed, step, i, B, in_dim, classes, in[2 * i], in[2 * i + 1]);
        }
        REQUIRE(sp_reference_step(r, (const void *const *)in, &res.loss[step]) == SP_OK, "%s",
                sp_last_error());
    }
    size_t k = 0;
    for (int i = 0; i < sp_graph_num_params(g); i++) {
        sp_tensor t = sp_graph_param(g, i);
        memcpy(res.params + k, sp_reference_param(r, t), (size_t)sp_tensor_numel(g, t) * 4);
        k += (size_t)sp_tensor_numel(g, t);
    }
    for (int i = 0; i < 2 * m; i++) free(in[i]);
    sp_reference_free(r);
    sp_program_free(p);
    sp_graph_free(g);
    return res;
}

static int same(const run_result *a, const run_result *b)
{
    return a->n == b->n && !memcmp(a->loss, b->loss, sizeof a->loss) &&
           !memcmp(a->params, b->params, a->n * 4);
}

int main(void)
{
    sp_status st;
    sp_gpt_config gc = { .vocab = 256, .context = 8, .layers = 2, .heads = 2, .channels = 16,
                         .batch = 2, .stages = 2 };
    run_result a = run(sp_model_gpt(&gc, &st), 3, 5, 1, 2, 8, 0, 0);
    run_result b = run(sp_model_gpt(&gc, &st), 3, 5, 1, 2, 8, 0, 0);
    run_result c = run(sp_model_gpt(&gc, &st), 3, 6, 1, 2, 8, 0, 0);
    CHECK(same(&a, &b), "gpt: two runs with seed 5 differ");
    CHECK(!same(&a, &c), "gpt: seeds 5 and 6 give the same run");
    CHECK(a.loss[2] != a.loss[0], "gpt: the loss did not move");

    run_result cut[3];
    int stages[3] = { 1, 2, 4 };
    for (int k = 0; k < 3; k++) {
        sp_mlp_config mc = { .in_dim = 11, .width = 17, .depth = 4, .classes = 5, .batch = 6,
                             .stages = stages[k] };
        cut[k] = run(sp_model_mlp(&mc, &st), 4, 9, 0, 6, 0, 11, 5);
    }
    CHECK(same(&cut[0], &cut[1]), "mlp: 1 and 2 stages differ");
    CHECK(same(&cut[0], &cut[2]), "mlp: 1 and 4 stages differ");
    for (int k = 0; k < 3; k++) free(cut[k].params);
    for (int k = 0; k < 3; k++) {
        sp_gpt_config gk = gc;
        gk.layers = 4;
        gk.stages = stages[k];
        cut[k] = run(sp_model_gpt(&gk, &st), 3, 5, 1, 2, 8, 0, 0);
    }
    CHECK(same(&cut[0], &cut[1]), "gpt: 1 and 2 stages differ");
    CHECK(same(&cut[0], &cut[2]), "gpt: 1 and 4 stages differ");

    /* uneven cuts of the same 4-layer models */
    static const int gcuts[][5] = { { 2, 0, 4 }, { 2, 4, 0 }, { 2, 1, 3 },
                                    { 4, 0, 2, 2, 0 }, { 3, 0, 4, 0 } }; /* S, counts */
    for (size_t k = 0; k < sizeof gcuts / sizeof *gcuts; k++) {
        sp_gpt_config gk = gc;
        gk.layers = 4;
        gk.stages = gcuts[k][0];
        gk.stage_layers = &gcuts[k][1];
        sp_graph *g = sp_model_gpt(&gk, &st);
        REQUIRE(g, "gpt cut %zu refused: %s", k, sp_last_error());
        CHECK(sp_graph_num_stages(g) == gk.stages, "gpt cut %zu: %d stages, not %d", k,
              sp_graph_num_stages(g), gk.stages);
        run_result u = run(g, 3, 5, 1, 2, 8, 0, 0);
        CHECK(same(&cut[0], &u), "gpt: cut %zu differs from 1 stage", k);
        free(u.params);
    }
    for (int k = 0; k < 3; k++) free(cut[k].params);
    sp_mlp_config m1 = { .in_dim = 11, .width = 17, .depth = 4, .classes = 5, .batch = 6,
                         .stages = 1 };
    run_result whole = run(sp_model_mlp(&m1, &st), 4, 9, 0, 6, 0, 11, 5);
    static const int mcuts[][4] = { { 2, 1, 3 }, { 2, 4, 0 }, { 3, 2, 2, 0 } };
    for (size_t k = 0; k < sizeof mcuts / sizeof *mcuts; k++) {
        sp_mlp_config mk = m1;
        mk.stages = mcuts[k][0];
        mk.stage_layers = &mcuts[k][1];
        run_result u = run(sp_model_mlp(&mk, &st), 4, 9, 0, 6, 0, 11, 5);
        CHECK(same(&whole, &u), "mlp: cut %zu differs from 1 stage", k);
        free(u.params);
    }
    free(whole.params);

    /* bad cuts: status, message, no graph */
    static const struct { int gpt, S, n[3]; const char *msg; } bad[] = {
        { 1, 3, { 2, 0, 2 }, "stage 1 of 3 would have 0 layers (only the first and the last" },
        { 1, 2, { 1, 1 }, "add up to 2, not the model's 4 layers" },
        { 1, 2, { -1, 5 }, "stage 0 of 2 would have -1 layers" },
        { 0, 2, { 0, 4 }, "stage 0 of 2 would have 0 layers (only the last stage" },
        { 0, 2, { 3, 3 }, "add up to 6, not the model's 4 layers" },
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        sp_graph *g;
        if (bad[k].gpt) {
            sp_gpt_config gk = gc;
            gk.layers = 4, gk.stages = bad[k].S, gk.stage_layers = bad[k].n;
            g = sp_model_gpt(&gk, &st);
        } else {
            sp_mlp_config mk = m1;
            mk.stages = bad[k].S, mk.stage_layers = bad[k].n;
            g = sp_model_mlp(&mk, &st);
        }
        CHECK(!g && st == SP_ERR_ARG && strstr(sp_last_error(), bad[k].msg),
              "bad cut %zu: status %d, message '%s'", k, st, sp_last_error());
        sp_graph_free(g);
    }
    free(a.params), free(b.params), free(c.params);
    return check_summary("test_determinism");
}
