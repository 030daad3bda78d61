/* Pipelined training equals the reference interpreter, bit for bit.
 * On P ranks (P = mpiexec -np), for the MLP and the GPT (tied embedding over the first
 * and last stage), every built-in schedule and m in {1, P, 2P+1}: 3 steps of the trainer
 * and of the single-process reference; the losses, the gradients, the parameters and
 * the AdamW moments of every stage must be identical, and every rank must have run its
 * tasks in exactly the plan's order (read from the executed-task trace). A combination
 * a schedule refuses (its stated constraint, e.g. m >= P) is counted as skipped, and
 * the refusal must carry a message. Optional argv[1]: only this schedule. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/exec.h"
#include "starpipe/models.h"
#include "starpipe/reference.h"
#include "starpipe/train.h"
#include "tests/runtime/train_check.h"

static int failures, passes, skipped;

static sp_graph *build(int gpt, int stages)
{
    sp_status st;
    if (gpt) {
        sp_gpt_config c = { .vocab = 256, .context = 6, .layers = stages, .heads = 2,
                            .channels = 8, .batch = 2, .stages = stages };
        return sp_model_gpt(&c, &st);
    }
    sp_mlp_config c = { .in_dim = 7, .width = 13, .depth = stages, .classes = 5, .batch = 5,
                        .stages = stages };
    return sp_model_mlp(&c, &st);
}

static void fill(int gpt, int step, int m, void **in)
{
    for (int i = 0; i < m; i++) {
        if (gpt)
            for (int k = 0; k < 12; k++) {
                ((int32_t *)in[2 * i])[k] = (int32_t)(sp_mix64((uint64_t)(step * 1000 + i * 50 + k)) % 256);
                ((int32_t *)in[2 * i + 1])[k] = (int32_t)(sp_mix64((uint64_t)(step * 977 + i * 31 + k)) % 256);
            }
        else
            sp_mlp_batch(3, step, i, 5, 7, 5, in[2 * i], in[2 * i + 1]);
    }
}

static void run_case(int gpt, const char *sched_name, int m)
{
    int P = sp_exec_size(), bad = 0;
    char what[128];
    snprintf(what, sizeof what, "%s/%s/p=%d/m=%d", gpt ? "gpt" : "mlp", sched_name, P, m);
    int v = (!strcmp(sched_name, "interleaved-1f1b") || !strcmp(sched_name, "zb-v") ||
             !strcmp(sched_name, "dualpipe-v")) ? 2 : 1;
    sp_schedule *sch = NULL;
    if (sp_schedule_builtin(sched_name, P, m, v, &sch) != SP_OK) {
        if (!sp_last_error()[0]) {
            bad++;
            fprintf(stderr, "FAIL %s: refused without a message\n", what);
        }
        if (sp_exec_rank() == 0) printf("skip %s: %s\n", what, sp_last_error());
        skipped++;
        failures += bad;
        return;
    }
    sp_status st;
    sp_graph *g = build(gpt, sch->nstages);
    sp_program *p = g ? sp_program_build(g, &st) : NULL;
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    opt.lr = 1e-2f;
    opt.grad_clip = 0.5f; /* small enough that clipping really scales */
    sp_train_opts to = { .opt = opt, .seed = 11, .trace = 1 };
    sp_trainer *t = p ? sp_trainer_create(p, sch, &to, &st) : NULL;
    sp_reference *r = p ? sp_reference_create(p, m, &opt, 11, &st) : NULL;
    if (!t || !r) {
        FAIL("%s: setup: %s", what, sp_last_error());
    } else {
        int nin = sp_program_num_inputs(p);
        void **in = calloc((size_t)m * nin, sizeof *in);
        for (int i = 0; i < m * nin; i++) in[i] = calloc(64, 4);
        for (int step = 1; step <= 3; step++) {
            fill(gpt, step, m, in);
            sp_step_stats stats;
            float ref_loss;
            if (sp_trainer_step(t, (const void *const *)in, &stats) != SP_OK ||
                sp_reference_step(r, (const void *const *)in, &ref_loss) != SP_OK) {
                FAIL("%s step %d: %s", what, step, sp_last_error());
                break;
            }
            if (memcmp(&stats.loss, &ref_loss, 4))
                FAIL("%s step %d: loss %.9g, reference %.9g", what, step, stats.loss, ref_loss);
            bad += compare(t, r, p, what, step);
            bad += check_order(t, what);
            /* the host touches only the inputs, the losses and the norm's terms: gradients
             * are zeroed, normed and applied where they live (no GPU round trip) */
            size_t want = 0;
            for (int k = 0; k < nin; k++)
                want += (size_t)m * sp_program_buf_bytes(p, SP_SLAB_INPUT, k);
            for (int s = 0; s < sch->nstages; s++)
                if (sp_trainer_owns_stage(t, s))
                    want += (size_t)sp_graph_num_params(g) * sizeof(double) +
                            (s == sch->nstages - 1 ? (size_t)m * sizeof(float) : 0);
            if (stats.host_bytes != want) {
                FAIL("%s step %d: the host moved %zu bytes, expected %zu", what, step,
                     stats.host_bytes, want);
                bad++;
            }
        }
        for (int i = 0; i < m * nin; i++) free(in[i]);
        free(in);
    }
    sp_trainer_free(t);
    sp_reference_free(r);
    sp_program_free(p);
    sp_graph_free(g);
    sp_schedule_free(sch);
    double any = bad; /* a case fails when it fails on any rank */
    sp_exec_allreduce_sum(&any, 1, 1);
    if (any > 0) failures++;
    else passes++;
}

int main(int argc, char **argv)
{
    if (sp_exec_init(&argc, &argv, &(sp_exec_opts){ .trace = 1 }) != SP_OK) {
        fprintf(stderr, "init: %s\n", sp_last_error());
        return 1;
    }
    int P = sp_exec_size();
    const char *only = argc > 1 ? argv[1] : NULL;
    int ms[3] = { 1, P, 2 * P + 1 };
    for (int gpt = 0; gpt <= 1; gpt++)
        for (int k = 0; k < sp_schedule_builtin_count(); k++) {
            const char *name = sp_schedule_builtin_info(k)->name;
            if (only && strcmp(only, name)) continue;
            for (int j = 0; j < 3; j++) {
                if (j > 0 && ms[j] == ms[j - 1]) continue; /* p = 1: m = 1 twice */
                run_case(gpt, name, ms[j]);
            }
        }
    if (sp_exec_rank() == 0) {
        printf("train_equal on %d ranks\n", P);
        printf("%d passed, %d failed, %d skipped\n", passes, failures, skipped);
    }
    sp_exec_shutdown();
    return failures ? 1 : 0;
}
