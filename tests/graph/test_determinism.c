/* Determinism of the reference: the same seed gives bitwise the same losses, parameters
 * and AdamW moments in two runs; another seed gives other numbers; and a model cut into
 * 1, 2 or 4 stages trains to bitwise the same parameters: an MLP, and the GPT, whose tied
 * embedding has one gradient accumulator per use, summed in use order, however the
 * uses fall into stages. */
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
    for (int k = 0; k < 3; k++) free(cut[k].params);
    free(a.params), free(b.params), free(c.params);
    return check_summary("test_determinism");
}
