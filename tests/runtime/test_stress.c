/* Stress: random valid schedules run for real. On P ranks, N random schedules (seeded):
 * a random MLP of S = 1..6 stages, m = 1..6 microbatches, stages dealt to actors at
 * random, each backward fused or split at random, each actor's order cut from a random
 * topological order of the task graph. Two steps each, bitwise against the reference,
 * executed order against the plan. A hang is bounded by the executor's watchdog (every
 * rank aborts). Usage: test_stress [count [seed]]; scripts/stress runs 1000 per P. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/exec.h"
#include "starpipe/models.h"
#include "tests/runtime/train_check.h"

static int run_one(uint64_t seed, char *what, size_t len)
{
    int P = sp_exec_size(), bad = 0;
    uint64_t r = sp_mix64(seed);
    int S = 1 + (int)(r % 6), m = 1 + (int)((r >> 8) % 6);
    sp_mlp_config c = { .in_dim = 5, .width = 7, .depth = S, .classes = 3, .batch = 3,
                        .stages = S };
    sp_status st;
    sp_graph *g = sp_model_mlp(&c, &st);
    sp_program *p = g ? sp_program_build(g, &st) : NULL;
    sp_schedule *sch = NULL;
    if (p) st = sp_schedule_random(sp_program_stage_model(p), P, m, seed, &sch);
    snprintf(what, len, "seed %llu (S=%d m=%d p=%d)", (unsigned long long)seed, S, m, P);
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    opt.lr = 1e-2f;
    sp_train_opts to = { .opt = opt, .seed = seed, .trace = 1 };
    sp_trainer *t = sch ? sp_trainer_create(p, sch, &to, &st) : NULL;
    sp_reference *ref = t ? sp_reference_create(p, m, &opt, seed, &st) : NULL;
    if (!ref) {
        FAIL("%s: setup: %s", what, sp_last_error());
    } else {
        float x[6][15];
        int32_t y[6][3];
        const void *in[12];
        for (int step = 1; step <= 2 && !bad; step++) {
            for (int i = 0; i < m; i++) {
                sp_mlp_batch(seed, step, i, 3, 5, 3, x[i], y[i]);
                in[2 * i] = x[i];
                in[2 * i + 1] = y[i];
            }
            sp_step_stats stats;
            float ref_loss;
            if (sp_trainer_step(t, in, &stats) != SP_OK ||
                sp_reference_step(ref, in, &ref_loss) != SP_OK) {
                FAIL("%s step %d: %s", what, step, sp_last_error());
                break;
            }
            if (memcmp(&stats.loss, &ref_loss, 4))
                FAIL("%s step %d: loss %.9g, reference %.9g", what, step, stats.loss, ref_loss);
            bad += compare(t, ref, p, what, step);
            bad += check_order(t, what);
        }
    }
    sp_reference_free(ref);
    sp_trainer_free(t);
    sp_schedule_free(sch);
    sp_program_free(p);
    sp_graph_free(g);
    return bad;
}

int main(int argc, char **argv)
{
    if (sp_exec_init(&argc, &argv, &(sp_exec_opts){ .trace = 1, .watchdog_s = 30 }) != SP_OK) {
        fprintf(stderr, "init: %s\n", sp_last_error());
        return 1;
    }
    int count = argc > 1 ? atoi(argv[1]) : 40;
    uint64_t seed0 = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    int passed = 0, failed = 0;
    for (int k = 0; k < count; k++) {
        char what[96];
        double bad = run_one(seed0 * 1000003ULL + (uint64_t)k, what, sizeof what);
        sp_exec_allreduce_sum(&bad, 1, 1); /* a schedule fails if it fails on any rank */
        if (bad > 0) failed++;
        else passed++;
    }
    if (sp_exec_rank() == 0) {
        printf("stress on %d ranks: %d random schedules, seed %llu\n", sp_exec_size(), count,
               (unsigned long long)seed0);
        printf("%d passed, %d failed\n", passed, failed);
    }
    sp_exec_shutdown();
    return failed ? 1 : 0;
}
