/* Shards of a stage (sp_optim_shards) for replicas and the sharded optimizer: contiguous,
 * covering the PARAMS slab, cut only at tensor starts, close to even where tensors allow;
 * per-parameter sums of squares over any sharding fold to sp_optim_sumsq bit for bit;
 * AdamW over the shards equals AdamW over the whole stage bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/models.h"
#include "starpipe/optim.h"
#include "tests/check.h"

int main(void)
{
    sp_status st;
    sp_gpt_config cfg = { .vocab = 256, .context = 16, .layers = 4, .heads = 2, .channels = 32,
                          .batch = 2, .stages = 2 };
    sp_graph *g = sp_model_gpt(&cfg, &st);
    REQUIRE(g, "%s", sp_last_error());
    sp_program *p = sp_program_build(g, &st);
    REQUIRE(p, "%s", sp_last_error());
    int np = sp_graph_num_params(g);
    for (int s = 0; s < 2; s++) {
        int64_t total = (int64_t)(sp_program_buf_bytes(p, SP_BUF_PARAMS, s) / 4);
        float *grads = malloc((size_t)total * 4), *params = malloc((size_t)total * 4);
        float *m0 = calloc((size_t)total, 4), *v0 = calloc((size_t)total, 4);
        float *p0 = malloc((size_t)total * 4);
        REQUIRE(grads && params && m0 && v0 && p0, "out of memory");
        for (int64_t j = 0; j < total; j++) {
            grads[j] = (float)sin(0.37 * (double)j) * 1e-2f;
            params[j] = (float)cos(0.11 * (double)j) * 0.1f;
        }
        memcpy(p0, params, (size_t)total * 4);
        sp_adamw_config opt;
        sp_adamw_defaults(&opt);
        sp_optim_update(p, s, p0, grads, m0, v0, &opt, 0.5f, 1); /* the unsharded update */
        double whole = sp_optim_sumsq(p, s, grads);
        for (int R = 1; R <= 7; R++) {
            int64_t b[8];
            sp_optim_shards(p, s, R, b);
            CHECK(b[0] == 0 && b[R] == total, "stage %d R %d: bounds %lld..%lld of %lld", s, R,
                  (long long)b[0], (long long)b[R], (long long)total);
            for (int c = 1; c < R; c++) {
                CHECK(b[c] >= b[c - 1], "stage %d R %d: cut %d goes back", s, R, c);
                int at_start = b[c] == total;
                for (int i = 0; i < np; i++)
                    at_start |= sp_program_param_offset(p, s, sp_graph_param(g, i)) == b[c];
                CHECK(at_start, "stage %d R %d: cut %d at %lld is inside a tensor", s, R, c,
                      (long long)b[c]);
            }
            double *each = calloc((size_t)np, sizeof *each);
            float *pr = malloc((size_t)total * 4);
            REQUIRE(each && pr, "out of memory");
            memcpy(pr, params, (size_t)total * 4);
            for (int c = 0; c < R; c++) {
                sp_optim_param_sumsq(p, s, b[c], b[c + 1], grads, each);
                int64_t n = b[c + 1] - b[c];
                float *m = calloc((size_t)n + 1, 4), *v = calloc((size_t)n + 1, 4);
                sp_optim_update_range(p, s, b[c], b[c + 1], pr, grads, m, v, &opt, 0.5f, 1);
                CHECK(!memcmp(m, m0 + b[c], (size_t)n * 4) && !memcmp(v, v0 + b[c], (size_t)n * 4),
                      "stage %d R %d: moments of shard %d differ", s, R, c);
                free(m), free(v);
            }
            double folded = sp_optim_fold_sumsq(p, s, each);
            CHECK(!memcmp(&folded, &whole, sizeof whole), "stage %d R %d: folded %.17g vs %.17g",
                  s, R, folded, whole);
            CHECK(!memcmp(pr, p0, (size_t)total * 4), "stage %d R %d: sharded AdamW differs", s, R);
            free(each), free(pr);
        }
        /* two shards split a GPT stage near its middle (blocks are many small tensors) */
        int64_t b2[3];
        sp_optim_shards(p, s, 2, b2);
        CHECK(b2[1] > total / 5 && b2[1] < 4 * total / 5, "stage %d: cut at %lld of %lld", s,
              (long long)b2[1], (long long)total);
        free(grads), free(params), free(m0), free(v0), free(p0);
    }
    sp_program_free(p);
    sp_graph_free(g);
    return check_summary("test_shards");
}
