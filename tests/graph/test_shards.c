/* Shards of a stage (sp_optim_shards) for replicas and the sharded optimizer: contiguous,
 * covering the PARAMS slab, cut only at tensor starts, close to even where tensors allow;
 * per-parameter sums of squares over any sharding fold to sp_optim_sumsq bit for bit;
 * AdamW over the shards equals AdamW over the whole stage bit for bit, and so does the
 * tied parameters' update followed by the rest's (the runtime's order where the tied ones
 * are sent); the floats a stage owns are its slab less the tied copies it does not own. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/backend.h"
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
        {
            const sp_tensor wte = sp_graph_find(g, "wte");
            REQUIRE(wte >= 0, "no wte");
            const int64_t off = sp_program_param_offset(p, s, wte), n = sp_tensor_numel(g, wte);
            const int owner = sp_program_param_owner(p, wte) == s;
            CHECK(sp_program_owned_floats(p, s) == total - (owner ? 0 : n),
                  "stage %d owns %lld floats of %lld (wte %lld)", s,
                  (long long)sp_program_owned_floats(p, s), (long long)total, (long long)n);
            float *pt = malloc((size_t)total * 4), *mt = calloc((size_t)total, 4);
            float *vt = calloc((size_t)total, 4);
            REQUIRE(pt && mt && vt, "out of memory");
            memcpy(pt, params, (size_t)total * 4);
            REQUIRE(sp_optim_update_part_on(p, s, 0, INT64_MAX, SP_OPTIM_TIED, pt, grads, mt,
                                            vt, &opt, 0.5f, 1, sp_backend_cpu(), NULL) == SP_OK,
                    "%s", sp_last_error());
            int64_t in = 0, out = 0; /* moments set inside and outside wte's copy */
            for (int64_t j = 0; j < total; j++) {
                const int inside = off >= 0 && j >= off && j < off + n;
                in += inside && mt[j] != 0.0f;
                out += !inside && mt[j] != 0.0f;
            }
            CHECK(out == 0 && (owner ? in > n / 2 : in == 0), "stage %d: the tied update set "
                  "%lld moments in wte and %lld outside it", s, (long long)in, (long long)out);
            REQUIRE(sp_optim_update_part_on(p, s, 0, INT64_MAX, SP_OPTIM_UNTIED, pt, grads, mt,
                                            vt, &opt, 0.5f, 1, sp_backend_cpu(), NULL) == SP_OK,
                    "%s", sp_last_error());
            CHECK(!memcmp(pt, p0, (size_t)total * 4) && !memcmp(mt, m0, (size_t)total * 4) &&
                      !memcmp(vt, v0, (size_t)total * 4),
                  "stage %d: tied then untied differs from the whole update", s);
            free(pt), free(mt), free(vt);
        }
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
