/* Pipelined evaluation (sp_trainer_eval) equals the reference's (sp_reference_eval), bit
 * for bit. On N ranks (N = mpiexec -np), for R = 1 and, when N is even, R = 2 replicas of
 * a P = N / R actor pipeline; for the GPT (tied embedding over the first and last stage)
 * under every built-in schedule and the MLP under 1f1b and interleaved-1f1b; with K = R
 * and K = R (m + 1) evaluation microbatches (fewer and more than a step's m): the
 * evaluation of the initial parameters, then after each of two training steps, must equal
 * the reference's on the same K microbatches on every rank, and the training steps around
 * it must still equal the reference (evaluation changes nothing). A K that the replicas do
 * not divide is refused with a message on every rank. Optional argv[1]: only this
 * schedule. */
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

static void **alloc_in(int n)
{
    void **in = calloc((size_t)n * 2, sizeof *in);
    for (int i = 0; i < 2 * n; i++) in[i] = calloc(64, 4);
    return in;
}

static void free_in(void **in, int n)
{
    for (int i = 0; i < 2 * n; i++) free(in[i]);
    free(in);
}

static void run_case(int gpt, const char *sched_name, int R, int keval)
{
    int N = sp_exec_size(), P = N / R, m = P, bad = 0;
    char what[128];
    int v = (!strcmp(sched_name, "interleaved-1f1b") || !strcmp(sched_name, "zb-v") ||
             !strcmp(sched_name, "dualpipe-v")) ? 2 : 1;
    if (!strcmp(sched_name, "dualpipe-v")) m = 2 * P; /* its constraint */
    int K = keval ? R * (m + 1) : R;
    snprintf(what, sizeof what, "%s/%s/R=%d/P=%d/m=%d/K=%d", gpt ? "gpt" : "mlp", sched_name, R,
             P, m, K);
    sp_schedule *sch = NULL;
    if (sp_schedule_builtin(sched_name, P, m, v, &sch) != SP_OK) {
        if (sp_exec_rank() == 0) printf("skip %s: %s\n", what, sp_last_error());
        skipped++;
        return;
    }
    sp_train_opts to = { .seed = 11, .replicas = R, .eval_microbatches = K };
    sp_adamw_defaults(&to.opt);
    to.opt.lr = 1e-2f;
    check_run c = check_setup(gpt, sch, &to);
    if (!c.t || !c.r) {
        FAIL("%s: setup: %s", what, sp_last_error());
    } else {
        void **in = alloc_in(R * m), **ev = alloc_in(K);
        check_fill(gpt, -1, K, ev);
        for (int step = 0; step <= 2; step++) { /* the same path on every rank */
            if (step > 0) {
                check_fill(gpt, step, R * m, in);
                int stop = 0;
                bad += check_step(c.t, c.r, c.p, (const void *const *)in, what, step, &stop);
                if (stop) break;
            }
            float mine = -1, want = -2;
            if (sp_trainer_eval(c.t, (const void *const *)ev, &mine) != SP_OK ||
                sp_reference_eval(c.r, K, (const void *const *)ev, &want) != SP_OK) {
                FAIL("%s eval after step %d: %s", what, step, sp_last_error());
                break;
            }
            if (memcmp(&mine, &want, 4))
                FAIL("%s eval after step %d: %.9g, reference %.9g", what, step, mine, want);
        }
        free_in(in, R * m);
        free_in(ev, K);
    }
    check_teardown(&c);
    sp_schedule_free(sch);
    if (check_any(bad)) failures++; /* a case fails when it fails on any rank */
    else passes++;
}

/* K not a multiple of R: refused at creation, on every rank, with a message. */
static void refused_share(int R)
{
    int N = sp_exec_size(), P = N / R, bad = 0;
    sp_schedule *sch = NULL;
    sp_status st = sp_schedule_builtin("1f1b", P, P, 1, &sch);
    sp_graph *g = st ? NULL : check_model(0, P);
    sp_program *p = g ? sp_program_build(g, &st) : NULL;
    sp_train_opts to = { .seed = 1, .replicas = R, .eval_microbatches = R + 1 };
    sp_adamw_defaults(&to.opt);
    sp_trainer *t = p ? sp_trainer_create(p, sch, &to, &st) : NULL;
    if (t || st != SP_ERR_ARG || !strstr(sp_last_error(), "must be a multiple of"))
        FAIL("K = %d over %d replicas: status %d, '%s'", R + 1, R, st, sp_last_error());
    sp_trainer_free(t);
    sp_program_free(p);
    sp_graph_free(g);
    sp_schedule_free(sch);
    if (check_any(bad)) failures++;
    else passes++;
}

int main(int argc, char **argv)
{
    if (sp_exec_init(&argc, &argv, NULL) != SP_OK) {
        fprintf(stderr, "init: %s\n", sp_last_error());
        return 1;
    }
    int N = sp_exec_size();
    const char *only = argc > 1 ? argv[1] : NULL;
    for (int R = 1; R <= 2; R++) {
        if (N % R) continue;
        for (int k = 0; k < sp_schedule_builtin_count(); k++) {
            const char *name = sp_schedule_builtin_info(k)->name;
            if (only && strcmp(only, name)) continue;
            for (int keval = 0; keval <= 1; keval++) {
                run_case(1, name, R, keval);
                if (!strcmp(name, "1f1b") || !strcmp(name, "interleaved-1f1b"))
                    run_case(0, name, R, keval);
            }
        }
        if (R > 1) refused_share(R);
    }
    if (sp_exec_rank() == 0) {
        printf("eval on %d ranks\n", N);
        printf("%d passed, %d failed, %d skipped\n", passes, failures, skipped);
    }
    sp_exec_shutdown();
    return failures ? 1 : 0;
}
