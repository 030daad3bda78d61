/* sp_plan_measure against runs whose answer is known: a simulated run with free messages
 * is its own replay (no waits), and one whose messages each take L waits at least L for
 * some message and has the free run's span as its bound. */
#include <math.h>
#include <string.h>

#include "test_util.h"

static void check_schedule(const char *name, int p, int m, int v)
{
    int S = sp_schedule_builtin_stages(name, p, v);
    sp_stage_model *model = sp_stage_model_chain(S, 1.0, 1.3, 0.7, 4096);
    sp_schedule *sch;
    sp_plan *plan;
    MUST(sp_schedule_builtin(name, p, m, v, &sch));
    MUST(sp_plan_build(model, sch, &plan));
    sp_sim_result *free_run, *slow_run;
    MUST(sp_simulate(plan, model, &(sp_sim_config){ 0 }, &free_run));
    const double L = 0.25;
    MUST(sp_simulate(plan, model, &(sp_sim_config){ .latency = L }, &slow_run));

    /* the update phase is not measured: OPTIMIZER instructions get a negative start */
    for (int a = 0; a < p; a++)
        for (int i = 0; i < plan->ninstr[a]; i++)
            if (plan->instr[a][i].op == SP_OP_OPTIMIZER)
                free_run->start[a][i] = slow_run->start[a][i] = -1;

    sp_run_measure mf, ms;
    MUST(sp_plan_measure(plan, model, (const double *const *)free_run->start,
                         (const double *const *)free_run->end, &mf));
    MUST(sp_plan_measure(plan, model, (const double *const *)slow_run->start,
                         (const double *const *)slow_run->end, &ms));
    CHECK(fabs(mf.replay_span - mf.span) < 1e-9, "%s p=%d m=%d: free run span %g, replay %g",
          name, p, m, mf.span, mf.replay_span);
    CHECK(mf.nwaits > 0 && mf.wait_max < 1e-9, "%s: free run waits %d, max %g", name,
          mf.nwaits, mf.wait_max);
    /* in the simulator a consumer starts the moment its message arrives */
    CHECK(ms.ndispatch == ms.nwaits && ms.dispatch_median < 1e-9, "%s: dispatch %d, median %g",
          name, ms.ndispatch, ms.dispatch_median);
    CHECK(fabs(ms.replay_span - mf.span) < 1e-9, "%s p=%d m=%d: slow run's replay %g, "
          "free run %g", name, p, m, ms.replay_span, mf.span);
    CHECK(ms.span > ms.replay_span + L - 1e-9, "%s: slow span %g vs bound %g", name, ms.span,
          ms.replay_span);
    /* the first consumer waits L for its message (later ones may wait less, hidden behind
     * their actor's own work, or more, held by the simulator's in-order receives) */
    CHECK(ms.nwaits == mf.nwaits && ms.wait_max >= L - 1e-9 && ms.wait_median <= ms.wait_max,
          "%s p=%d m=%d: waits %d, median %g, max %g (L = %g)", name, p, m, ms.nwaits,
          ms.wait_median, ms.wait_max, L);
    CHECK(ms.bubble > mf.bubble && fabs(mf.bubble - free_run->bubble_fraction) < 1e-6,
          "%s: bubbles %g %g %g", name, ms.bubble, mf.bubble, free_run->bubble_fraction);
    sp_sim_result_free(free_run);
    sp_sim_result_free(slow_run);
    sp_plan_free(plan);
    sp_schedule_free(sch);
    sp_stage_model_free(model);
}

int main(void)
{
    const char *names[] = { "gpipe", "1f1b", "eager-1f1b", "interleaved-1f1b", "zb-h1", "zb-v",
                            "dualpipe-v" };
    for (size_t k = 0; k < sizeof names / sizeof *names; k++)
        for (int p = 2; p <= 4; p++) {
            int v = !strcmp(names[k], "interleaved-1f1b") || !strcmp(names[k], "zb-v") ||
                    !strcmp(names[k], "dualpipe-v") ? 2 : 1;
            check_schedule(names[k], p, 2 * p, v);
            check_schedule(names[k], p, 4 * p, v);
        }
    return test_done("test_measure");
}
