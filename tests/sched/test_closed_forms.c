/* Built-in schedules against the published closed forms (docs/planner.md): bubble
 * fractions and idle times on unit costs with free links, and peak activations in units
 * of one stage's activations for one microbatch. Every plan also passes sp_plan_check
 * and runs to completion with rendezvous channels. */
#include <math.h>
#include <string.h>

#include "test_util.h"

typedef struct {
    sp_stage_model *model;
    sp_schedule *sch;
    sp_plan *plan;
    sp_sim_result *res;
} run_t;

static void run_free(run_t *r)
{
    sp_sim_result_free(r->res);
    sp_plan_free(r->plan);
    sp_schedule_free(r->sch);
    sp_stage_model_free(r->model);
    memset(r, 0, sizeof *r);
}

/* Plans `name` on a chain with per-stage costs F, B, W (BW = B + W); split: its sending
 * backwards as B W (sp_schedule_split_backward, "NAME+split"). */
static run_t run_as(const char *name, int p, int m, int v, double F, double B, double W,
                    int split)
{
    run_t r = { 0 };
    MUST(sp_schedule_builtin(name, p, m, v, &r.sch));
    if (split) MUST(sp_schedule_split_backward(r.sch));
    r.model = sp_stage_model_chain(r.sch->nstages, F, B, W, 64);
    CHECK(r.model != NULL, "model");
    MUST(sp_plan_build(r.model, r.sch, &r.plan));
    MUST(sp_plan_check(r.plan));
    sp_sim_config cfg = { 0 };
    MUST(sp_simulate(r.plan, r.model, &cfg, &r.res));
    for (int a = 0; a < p; a++) {
        CHECK(r.res->peak[a].total == r.plan->peak[a].total
                  && r.res->peak[a].act_units == r.plan->peak[a].act_units,
              "%s p=%d m=%d actor %d: simulator memory %zu/%d != plan %zu/%d", name, p, m, a,
              r.res->peak[a].total, r.res->peak[a].act_units, r.plan->peak[a].total,
              r.plan->peak[a].act_units);
    }
    /* NCCL-like channels: a SEND blocks until its RECV is posted. Must still finish. */
    sp_sim_result *rv;
    cfg.rendezvous = 1;
    cfg.latency = 0.25;
    cfg.bandwidth = 1000;
    MUST(sp_simulate(r.plan, r.model, &cfg, &rv));
    sp_sim_result_free(rv);
    return r;
}

static run_t run(const char *name, int p, int m, int v, double F, double B, double W)
{
    return run_as(name, p, m, v, F, B, W, 0);
}

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * (1 + fabs(b)); }

static int imin(int a, int b) { return a < b ? a : b; }

int main(void)
{
    const int ms[] = { 1, 2, 3, 5, 8, 13, 16, 24 };
    /* GPipe and 1F1B: bubble (p-1)/(m+p-1) with F=1, BW=2; peaks m and min(p-s, m). */
    for (int p = 2; p <= 8; p++)
        for (size_t k = 0; k < sizeof ms / sizeof *ms; k++) {
            int m = ms[k];
            double want = (double)(p - 1) / (m + p - 1);
            run_t g = run("gpipe", p, m, 0, 1, 1, 1);
            run_t o = run("1f1b", p, m, 0, 1, 1, 1);
            run_t e = run("eager-1f1b", p, m, 0, 1, 1, 1);
            run_t z = run("zb-h1", p, m, 0, 1, 1, 1);
            CHECK(near(g.res->bubble_fraction, want), "gpipe p=%d m=%d bubble %g want %g", p, m,
                  g.res->bubble_fraction, want);
            CHECK(near(o.res->bubble_fraction, want), "1f1b p=%d m=%d bubble %g want %g", p, m,
                  o.res->bubble_fraction, want);
            CHECK(near(e.res->bubble_fraction, want), "eager-1f1b p=%d m=%d bubble %g want %g",
                  p, m, e.res->bubble_fraction, want);
            int max1 = 0, maxz = 0;
            for (int s = 0; s < p; s++) {
                CHECK(g.plan->peak[s].act_units == m, "gpipe p=%d m=%d stage %d peak %d", p, m,
                      s, g.plan->peak[s].act_units);
                CHECK(o.plan->peak[s].act_units == imin(p - s, m), "1f1b p=%d m=%d stage %d "
                      "peak %d want %d", p, m, s, o.plan->peak[s].act_units, imin(p - s, m));
                CHECK(e.plan->peak[s].act_units == imin(2 * (p - s) - 1, m), "eager-1f1b p=%d "
                      "m=%d stage %d peak %d", p, m, s, e.plan->peak[s].act_units);
                /* ZB-H1 keeps each microbatch's activations until its deferred W: p on every
                 * stage, so the worst stage matches 1F1B's (the paper's claim). */
                CHECK(z.plan->peak[s].act_units == imin(p, m), "zb-h1 p=%d m=%d stage %d peak "
                      "%d want %d", p, m, s, z.plan->peak[s].act_units, imin(p, m));
                if (o.plan->peak[s].act_units > max1) max1 = o.plan->peak[s].act_units;
                if (z.plan->peak[s].act_units > maxz) maxz = z.plan->peak[s].act_units;
            }
            CHECK(max1 == maxz, "zb-h1 p=%d m=%d worst stage %d vs 1f1b %d", p, m, maxz, max1);
            run_free(&g), run_free(&o), run_free(&e), run_free(&z);
        }

    /* ZB-H1 idle per actor (p-1)(F+B-W) (Qi et al. 2024, Table; W <= F, B), against
     * 1F1B's (p-1)(F+B+W): p-1 versus 3(p-1) on unit costs. */
    const double costs[][3] = { { 1, 1, 1 }, { 2, 1, 1 }, { 3, 2, 1 }, { 2, 2, 1 } };
    for (int p = 2; p <= 8; p++)
        for (int c = 0; c < 4; c++)
            for (int m = p; m <= 3 * p; m += p) {
                double F = costs[c][0], B = costs[c][1], W = costs[c][2];
                run_t z = run("zb-h1", p, m, 0, F, B, W);
                run_t o = run("1f1b", p, m, 0, F, B, W);
                for (int a = 0; a < p; a++) {
                    CHECK(near(z.res->idle[a], (p - 1) * (F + B - W)), "zb-h1 p=%d m=%d "
                          "F,B,W=%g,%g,%g actor %d idle %g want %g", p, m, F, B, W, a,
                          z.res->idle[a], (p - 1) * (F + B - W));
                    CHECK(near(o.res->idle[a], (p - 1) * (F + B + W)), "1f1b p=%d m=%d actor "
                          "%d idle %g", p, m, a, o.res->idle[a]);
                }
                run_free(&z), run_free(&o);
            }

    /* Split backwards (sp_schedule_split_backward, "NAME+split"): every stage after the
     * first runs B then W and sends its input gradient when B ends, so each of the p - 1
     * hand-offs of the cool-down waits on B, not BW: step (m+p-1)(F+B+W) - (p-1)W, where
     * the fused form takes (m+p-1)(F+B+W). Stage 0 keeps BW; the peaks stay the fused
     * ones. */
    const char *const split[] = { "gpipe", "1f1b", "eager-1f1b" };
    for (int p = 2; p <= 8; p++)
        for (int c = 0; c < 4; c++)
            for (size_t k = 0; k < sizeof ms / sizeof *ms; k++)
                for (int q = 0; q < 3; q++) {
                    const int m = ms[k];
                    const double F = costs[c][0], B = costs[c][1], W = costs[c][2];
                    char name[32];
                    snprintf(name, sizeof name, "%s+split", split[q]);
                    run_t x = run_as(split[q], p, m, 0, F, B, W, 1);
                    run_t f = run(split[q], p, m, 0, F, B, W);
                    const double want = (m + p - 1) * (F + B + W) - (p - 1) * W;
                    CHECK(near(x.res->step_time, want) &&
                              near(f.res->step_time, want + (p - 1) * W),
                          "%s p=%d m=%d F,B,W=%g,%g,%g: step %g (fused %g), want %g", name, p, m,
                          F, B, W, x.res->step_time, f.res->step_time, want);
                    CHECK(!strcmp(x.sch->name, name), "name '%s', want '%s'", x.sch->name, name);
                    for (int a = 0; a < p; a++) {
                        int nbw = 0, nb = 0;
                        for (int j = 0; j < x.sch->ntasks[a]; j++) {
                            nbw += x.sch->tasks[a][j].kind == SP_TASK_BW;
                            nb += x.sch->tasks[a][j].kind == SP_TASK_B;
                        }
                        CHECK(nbw == (a == 0 ? m : 0) && nb == (a == 0 ? 0 : m),
                              "%s p=%d m=%d actor %d: %d BW and %d B", name, p, m, a, nbw, nb);
                        CHECK(x.plan->peak[a].act_units == f.plan->peak[a].act_units,
                              "%s p=%d m=%d actor %d peak %d, fused %d", name, p, m, a,
                              x.plan->peak[a].act_units, f.plan->peak[a].act_units);
                    }
                    run_free(&x), run_free(&f);
                }
    {
        sp_schedule *s = NULL;
        CHECK(sp_schedule_from_env("auto+split", 2, 4, 0, &s) == SP_ERR_ARG
                  && strstr(sp_last_error(), "'+split' applies to a built-in"),
              "auto+split refused: %s", sp_last_error());
        CHECK(sp_schedule_from_env("1f1c+split", 2, 4, 0, &s) == SP_ERR_ARG
                  && strstr(sp_last_error(), "unknown schedule '1f1c'"),
              "1f1c+split: %s", sp_last_error());
        /* No name and no STARPIPE_SCHEDULE: 1F1B with its sending backwards split, task for
         * task */
        unsetenv("STARPIPE_SCHEDULE");
        sp_schedule *d = NULL;
        MUST(sp_schedule_from_env(NULL, 3, 6, 0, &d));
        MUST(sp_schedule_from_env("1f1b+split", 3, 6, 0, &s));
        int same = !strcmp(d->name, "1f1b+split") && d->nactors == s->nactors;
        for (int a = 0; same && a < d->nactors; a++) {
            same = d->ntasks[a] == s->ntasks[a];
            for (int j = 0; same && j < d->ntasks[a]; j++)
                same = !memcmp(&d->tasks[a][j], &s->tasks[a][j], sizeof(sp_task));
        }
        CHECK(same, "the default schedule '%s' is not 1f1b+split", d->name);
        sp_schedule_free(d), sp_schedule_free(s);
    }
    /* Every built-in: a BW stays where its stage is the first or the stage before is on
     * the same actor (the V placements' turn), else it becomes B W in its place; nothing
     * else moves. */
    for (int i = 0; i < sp_schedule_builtin_count(); i++)
        for (int p = 2; p <= 4; p++) {
            const char *bn = sp_schedule_builtin_info(i)->name;
            sp_schedule *f = NULL, *s = NULL;
            MUST(sp_schedule_builtin(bn, p, 2 * p, 0, &f));
            MUST(sp_schedule_builtin(bn, p, 2 * p, 0, &s));
            MUST(sp_schedule_split_backward(s));
            for (int a = 0; a < p; a++) {
                int j = 0, ok = 1;
                for (int k = 0; k < f->ntasks[a] && ok; k++) {
                    const sp_task t = f->tasks[a][k];
                    const int splits = t.kind == SP_TASK_BW && t.stage > 0 &&
                                       f->stage_actor[t.stage - 1] != a;
                    if (!splits)
                        ok = j < s->ntasks[a] && !memcmp(&s->tasks[a][j++], &t, sizeof t);
                    else {
                        ok = j + 1 < s->ntasks[a] && s->tasks[a][j].kind == SP_TASK_B &&
                             s->tasks[a][j + 1].kind == SP_TASK_W &&
                             s->tasks[a][j].mb == t.mb && s->tasks[a][j + 1].mb == t.mb &&
                             s->tasks[a][j].stage == t.stage &&
                             s->tasks[a][j + 1].stage == t.stage;
                        j += 2;
                    }
                }
                CHECK(ok && j == s->ntasks[a], "%s+split p=%d actor %d: not the fused order "
                      "with its sending BW as B W", bn, p, a);
            }
            sp_schedule_free(f);
            sp_schedule_free(s);
        }

    /* Interleaved 1F1B, m a multiple of p: bubble ((p-1)/v) / (m + (p-1)/v) (Narayanan
     * et al. 2021); peak on actor r: min(2(p-r-1) + (v-1)p + 1, m v) chunks (Megatron's
     * warm-up count plus one). */
    for (int p = 2; p <= 8; p++)
        for (int v = 2; v <= 4; v++)
            for (int m = p; m <= 3 * p; m += p) {
                run_t r = run("interleaved-1f1b", p, m, v, 1, 1, 1);
                double q = (double)(p - 1) / v, want = q / (m + q);
                CHECK(near(r.res->bubble_fraction, want), "interleaved p=%d v=%d m=%d bubble %g "
                      "want %g", p, v, m, r.res->bubble_fraction, want);
                for (int a = 0; a < p; a++) {
                    int pk = imin(2 * (p - a - 1) + (v - 1) * p + 1, m * v);
                    CHECK(r.plan->peak[a].act_units == pk, "interleaved p=%d v=%d m=%d actor %d "
                          "peak %d want %d", p, v, m, a, r.plan->peak[a].act_units, pk);
                }
                run_free(&r);
            }

    /* V-shaped schedules, unit chunk costs F = B = W = 1, m >= 2p:
     * ZB-V: no bubble inside any actor's span (the authors' "zero bubble"), idle p-1 per
     * actor in the step (the fill of the V that no schedule avoids), peak 2p chunks = the
     * p whole-stage activations of 1F1B. DualPipeV: idle p-1, peak 2p+1 = PP+1 chunks. */
    for (int p = 2; p <= 8; p++)
        for (int m = 2 * p; m <= 4 * p; m += p) {
            run_t z = run("zb-v", p, m, 2, 1, 1, 1);
            run_t d = run("dualpipe-v", p, m, 2, 1, 1, 1);
            for (int a = 0; a < p; a++) {
                double first = -1, last = 0;
                for (int j = 0; j < z.plan->ninstr[a]; j++)
                    if (z.plan->instr[a][j].op == SP_OP_RUN) {
                        if (first < 0) first = z.res->start[a][j];
                        last = z.res->end[a][j];
                    }
                CHECK(near(last - first, z.res->busy[a]), "zb-v p=%d m=%d actor %d span %g busy "
                      "%g", p, m, a, last - first, z.res->busy[a]);
                CHECK(near(z.res->idle[a], p - 1), "zb-v p=%d m=%d actor %d idle %g", p, m, a,
                      z.res->idle[a]);
                CHECK(z.plan->peak[a].act_units == 2 * p, "zb-v p=%d m=%d actor %d peak %d", p,
                      m, a, z.plan->peak[a].act_units);
                CHECK(near(d.res->idle[a], p - 1), "dualpipe-v p=%d m=%d actor %d idle %g", p, m,
                      a, d.res->idle[a]);
                CHECK(d.plan->peak[a].act_units == 2 * p + 1, "dualpipe-v p=%d m=%d actor %d "
                      "peak %d", p, m, a, d.plan->peak[a].act_units);
            }
            run_free(&z), run_free(&d);
        }
    /* ZB-V below 2p microbatches still plans (the torch construction pads, then drops). */
    for (int p = 2; p <= 8; p++)
        for (int m = 1; m < 2 * p; m++) {
            run_t z = run("zb-v", p, m, 2, 1, 1, 1);
            run_free(&z);
        }

    /* Constraints give clear errors. */
    sp_schedule *s;
    CHECK(sp_schedule_builtin("dualpipe-v", 4, 7, 2, &s) == SP_ERR_ARG
              && strstr(sp_last_error(), "m >= 2p"), "dualpipe-v m<2p: %s", sp_last_error());
    CHECK(sp_schedule_builtin("interleaved-1f1b", 4, 6, 2, &s) == SP_ERR_ARG
              && strstr(sp_last_error(), "multiple of p"), "interleaved m: %s", sp_last_error());
    CHECK(sp_schedule_builtin("zb-v", 4, 8, 3, &s) == SP_ERR_ARG, "zb-v v=3");
    CHECK(sp_schedule_builtin("1f1b", 4, 8, 2, &s) == SP_ERR_ARG, "1f1b v=2");
    CHECK(sp_schedule_builtin("nope", 4, 8, 0, &s) == SP_ERR_ARG
              && strstr(sp_last_error(), "gpipe") && strstr(sp_last_error(), "dualpipe-v"),
          "unknown name lists the valid ones: %s", sp_last_error());
    return test_done("test_closed_forms");
}
