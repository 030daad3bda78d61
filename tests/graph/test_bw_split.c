/* The zero-bubble split: for every stage of the MLP, the GPT and a graph with a skip
 * edge, running B and then W leaves every buffer bitwise equal to running the fused BW,
 * with SCRATCH overwritten between B and W (W reads what B hands it from BGRAD only) and
 * BGRAD and SCRATCH filled with NaNs before; B never touches parameter gradients and W
 * never writes what earlier stages receive. */
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/models.h"
#include "tests/graph/arena.h"
#include "tests/check.h"
#include "tests/graph/skip_graph.h"

static void fill_random(float *x, size_t n, uint64_t key)
{
    for (size_t j = 0; j < n; j++) x[j] = (float)((int64_t)(sp_mix64(key + j) % 2001) - 1000) / 997.0f;
}

static void check_split(const char *name, sp_graph *g, const void *const *inputs)
{
    sp_status st;
    REQUIRE(g, "%s: %s", name, sp_last_error());
    sp_program *p = sp_program_build(g, &st);
    REQUIRE(p, "%s: %s", name, sp_last_error());
    int S = sp_program_num_stages(p);
    arena a = { .p = p };
    for (int k = 0; k < sp_program_num_inputs(p); k++) {
        void *in = arena_get(&a, SP_BUF_INPUT, k);
        memcpy(in, inputs[k], sp_program_buf_bytes(p, SP_BUF_INPUT, k));
    }
    for (int s = 0; s < S; s++) {
        float *params = arena_get(&a, SP_BUF_PARAMS, s);
        for (int i = 0; i < sp_graph_num_params(g); i++) {
            sp_tensor t = sp_graph_param(g, i);
            int64_t off = sp_program_param_offset(p, s, t);
            if (off >= 0) sp_param_init_values(g, t, 3, params + off);
        }
        /* gradients from "earlier microbatches": the split must accumulate onto them */
        fill_random(arena_get(&a, SP_BUF_GRADS, s), sp_program_buf_bytes(p, SP_BUF_GRADS, s) / 4,
                    1000 + (uint64_t)s);
    }
    for (int s = 0; s < S; s++)
        REQUIRE(arena_run(&a, s, SP_TASK_F, 0.5f) == SP_OK, "%s F%d: %s", name, s, sp_last_error());
    for (int s = S - 1; s >= 0; s--) {
        for (int j = 0; j < sp_program_num_bufs(p, s, SP_TASK_B); j++) {
            sp_slab_ref r = sp_program_buf(p, s, SP_TASK_B, j);
            CHECK(r.cls != SP_BUF_GRADS, "%s: B%d touches parameter gradients", name, s);
        }
        for (int j = 0; j < sp_program_num_bufs(p, s, SP_TASK_W); j++) {
            sp_slab_ref r = sp_program_buf(p, s, SP_TASK_W, j);
            CHECK(r.cls != SP_BUF_EDGE_GRAD, "%s: W%d touches gradient edge %d", name, s,
                  r.cls == SP_BUF_EDGE_GRAD ? r.index : -1);
        }
        if (s == 0) { /* nothing flows to a stage before 0: B0 only takes in gradients */
            const sp_stage_model *sm = sp_program_stage_model(p);
            double copied = 0;
            for (int e = 0; e < sm->nedges; e++)
                if (sm->edge[e].src_stage == 0) copied += sm->edge[e].bytes / 4.0;
            CHECK(sp_program_flops(p, 0, SP_TASK_B) <= copied,
                  "%s: B0 computes %.3g flops, more than copying its %.3g received floats",
                  name, sp_program_flops(p, 0, SP_TASK_B), copied);
        } else
            CHECK(sp_program_num_ops(p, s, SP_TASK_B) > 0, "%s: B%d is empty", name, s);
        CHECK(sp_program_num_ops(p, s, SP_TASK_W) > 0, "%s: W%d is empty", name, s);
        /* BGRAD and SCRATCH come as the runtime's pool and StarPU leave them: whatever a
         * program reads there it must have written first */
        memset(arena_get(&a, SP_BUF_BGRAD, s), 0xff, sp_program_buf_bytes(p, SP_BUF_BGRAD, s));
        memset(arena_get(&a, SP_BUF_SCRATCH, s), 0xff,
               sp_program_buf_bytes(p, SP_BUF_SCRATCH, s));
        arena fused, split;
        arena_copy(&fused, &a);
        arena_copy(&split, &a);
        REQUIRE(arena_run(&fused, s, SP_TASK_BW, 0.5f) == SP_OK, "%s", sp_last_error());
        REQUIRE(arena_run(&split, s, SP_TASK_B, 0.5f) == SP_OK, "%s", sp_last_error());
        /* other tasks run between B and W and SCRATCH is theirs then: W may read only
         * BGRAD of what B computed (NaNs here would reach the gradients) */
        memset(arena_get(&split, SP_BUF_SCRATCH, s), 0xff,
               sp_program_buf_bytes(p, SP_BUF_SCRATCH, s));
        REQUIRE(arena_run(&split, s, SP_TASK_W, 0.5f) == SP_OK, "%s", sp_last_error());
        REQUIRE(fused.n == split.n, "%s: buffer sets differ", name);
        for (int j = 0; j < fused.n; j++) {
            if (fused.cls[j] == SP_BUF_SCRATCH) continue;
            int same = memcmp(fused.buf[j], split.buf[j], fused.bytes[j]) == 0;
            CHECK(same, "%s stage %d: %s[%d] differs between BW and B;W", name, s,
                  sp_buf_class_name(fused.cls[j]), fused.index[j]);
        }
        /* the fused state moves on to the stage below */
        arena_free(&a);
        a = fused;
        arena_free(&split);
    }
    arena_free(&a);
    sp_program_free(p);
    sp_graph_free(g);
}

int main(void)
{
    sp_status st;
    for (int S = 1; S <= 4; S++) {
        sp_mlp_config mc = { .in_dim = 7, .width = 13, .depth = 4, .classes = 5, .batch = 9,
                             .stages = S };
        float x[9 * 7];
        int32_t y[9];
        sp_mlp_batch(1, 1, 0, 9, 7, 5, x, y);
        const void *in[2] = { x, y };
        char name[32];
        snprintf(name, sizeof name, "mlp/%d", S);
        check_split(name, sp_model_mlp(&mc, &st), in);

        sp_gpt_config gc = { .vocab = 256, .context = 7, .layers = 4, .heads = 2, .channels = 10,
                             .batch = 3, .stages = S };
        int32_t tok[21], tgt[21];
        for (int k = 0; k < 21; k++) {
            tok[k] = (int32_t)(sp_mix64(7 + k) % 256);
            tgt[k] = (int32_t)(sp_mix64(70 + k) % 256);
        }
        const void *gin[2] = { tok, tgt };
        snprintf(name, sizeof name, "gpt/%d", S);
        check_split(name, sp_model_gpt(&gc, &st), gin);

        if (S <= 3) { /* the skip edge crosses stage 1 when there are three */
            float sx[SK_B * SK_D];
            int32_t sy[SK_B];
            fill_random(sx, SK_B * SK_D, 1000 + (uint64_t)S);
            for (int k = 0; k < SK_B; k++) sy[k] = (int32_t)(sp_mix64(2000 + k) % SK_K);
            const void *sin[2] = { sx, sy };
            snprintf(name, sizeof name, "skip/%d", S);
            check_split(name, skip_graph(S), sin);
        }
    }
    return check_summary("test_bw_split");
}
