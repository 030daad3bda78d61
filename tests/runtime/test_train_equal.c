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

/* split: the schedule with its sending backwards as B W (sp_schedule_split_backward);
 * a schedule it leaves unchanged is not run twice. */
static void run_case(int gpt, const char *sched_name, int m, int split)
{
    int P = sp_exec_size(), bad = 0;
    char what[128];
    snprintf(what, sizeof what, "%s/%s%s/p=%d/m=%d", gpt ? "gpt" : "mlp", sched_name,
             split ? "+split" : "", P, m);
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
    if (split) {
        const int before = sp_schedule_total_tasks(sch);
        if (sp_schedule_split_backward(sch) != SP_OK || sp_schedule_total_tasks(sch) == before) {
            sp_schedule_free(sch);
            return;
        }
    }
    sp_train_opts to = { .seed = 11, .trace = 1 };
    sp_adamw_defaults(&to.opt);
    to.opt.lr = 1e-2f;
    to.opt.grad_clip = 0.5f; /* small enough that clipping really scales */
    check_run c = check_setup(gpt, sch, &to);
    if (!c.t || !c.r) {
        FAIL("%s: setup: %s", what, sp_last_error());
    } else {
        int nin = sp_program_num_inputs(c.p);
        void **in = calloc((size_t)m * nin, sizeof *in);
        for (int i = 0; i < m * nin; i++) in[i] = calloc(64, 4);
        for (int step = 1; step <= 3; step++) {
            check_fill(gpt, step, m, in);
            int stop = 0;
            bad += check_step(c.t, c.r, c.p, (const void *const *)in, what, step, &stop);
            if (stop) break;
            bad += check_order(c.t, what);
        }
        for (int i = 0; i < m * nin; i++) free(in[i]);
        free(in);
    }
    check_teardown(&c);
    sp_schedule_free(sch);
    if (check_any(bad)) failures++; /* a case fails when it fails on any rank */
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
                run_case(gpt, name, ms[j], 0);
                run_case(gpt, name, ms[j], 1);
            }
        }
    if (sp_exec_rank() == 0) {
        printf("train_equal on %d ranks\n", P);
        printf("%d passed, %d failed, %d skipped\n", passes, failures, skipped);
    }
    sp_exec_shutdown();
    return failures ? 1 : 0;
}
