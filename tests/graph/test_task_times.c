/* sp_reference_task_times (bench_runtime's uncontended task costs): every (stage, kind)
 * of a 3-stage GPT gets a time of its own, positive and finite, whatever the number of
 * passes; the parameters are left as they were, bit for bit; bad arguments are refused.
 * No assertion on the times' values: the machines are shared (the benchmark reads them). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"
#include "tests/graph/program_util.h"

enum { V = 64, T = 8, C = 16, NH = 2, LAYERS = 3, B = 2, S = 3, M = 2 };

int main(void)
{
    sp_gpt_config c = { .vocab = V, .context = T, .layers = LAYERS, .heads = NH, .channels = C,
                        .batch = B, .stages = S };
    sp_graph *g;
    sp_program *p;
    sp_reference *r = test_gpt_reference(&c, M, 1e-3f, 3, &g, &p);

    int32_t tok[M][B * T], tgt[M][B * T];
    const void *in[2 * M];
    for (int i = 0; i < M; i++) {
        for (int k = 0; k < B * T; k++) {
            tok[i][k] = (int32_t)((7 * i + 3 * k) % V);
            tgt[i][k] = (int32_t)((5 * i + 11 * k + 1) % V);
        }
        in[2 * i] = tok[i], in[2 * i + 1] = tgt[i];
    }

    /* the parameters before, to compare bit for bit after */
    int np = sp_graph_num_params(g);
    float **before = calloc((size_t)np, sizeof *before);
    REQUIRE(before, "out of memory");
    for (int i = 0; i < np; i++) {
        sp_tensor t = sp_graph_param(g, i);
        size_t n = (size_t)sp_tensor_numel(g, t);
        before[i] = malloc(n * sizeof(float));
        REQUIRE(before[i], "out of memory");
        memcpy(before[i], sp_reference_param(r, t), n * sizeof(float));
    }

    for (int reps = 1; reps <= 4; reps += 3) {
        double secs[S * SP_NUM_TASK_KINDS];
        for (int k = 0; k < S * SP_NUM_TASK_KINDS; k++) secs[k] = -1;
        CHECK(sp_reference_task_times(r, in, reps, secs) == SP_OK, "reps %d: %s", reps,
              sp_last_error());
        for (int s = 0; s < S; s++)
            for (int kind = 0; kind < SP_NUM_TASK_KINDS; kind++) {
                double v = secs[s * SP_NUM_TASK_KINDS + kind];
                CHECK(isfinite(v) && v > 0 && v < 10, "reps %d: stage %d kind %d timed %g s",
                      reps, s, kind, v);
            }
    }

    for (int i = 0; i < np; i++) {
        sp_tensor t = sp_graph_param(g, i);
        CHECK(!memcmp(before[i], sp_reference_param(r, t),
                      (size_t)sp_tensor_numel(g, t) * sizeof(float)),
              "parameter %s changed by timing", sp_tensor_name(g, t));
        free(before[i]);
    }
    free(before);

    double secs[S * SP_NUM_TASK_KINDS];
    CHECK(sp_reference_task_times(r, in, 0, secs) == SP_ERR_ARG, "reps 0 accepted");
    CHECK(sp_reference_task_times(r, NULL, 3, secs) == SP_ERR_ARG, "no inputs accepted");
    CHECK(sp_reference_task_times(NULL, in, 3, secs) == SP_ERR_ARG, "no reference accepted");

    sp_reference_free(r);
    sp_program_free(p);
    sp_graph_free(g);
    return check_summary("test_task_times");
}
