/* The schedule `auto` (sched/auto.c): every synthesized schedule valid, its plan well formed
 * and within the memory cap, for many (p, m, costs, message time, cap), random ones
 * included; its bubble against the built-ins' on the same model; a cap below one
 * microbatch refused; the apps' selection refusing it with one message. */
#include <math.h>

#include "test_util.h"

typedef struct {
    double step, bubble;
    int peak; /* largest act_units over the actors */
} sim_t;

static sim_t sim(const sp_stage_model *md, const sp_schedule *s, double lat, const int *cap)
{
    sp_plan *plan;
    sp_sim_result *r;
    sp_sim_config cfg = { .latency = lat };
    MUST(sp_schedule_validate(s, md));
    MUST(sp_plan_build(md, s, &plan));
    MUST(sp_plan_check(plan));
    MUST(sp_simulate(plan, md, &cfg, &r));
    sim_t x = { r->step_time, r->bubble_fraction, 0 };
    for (int a = 0; a < plan->nactors; a++) {
        if (plan->peak[a].act_units > x.peak) x.peak = plan->peak[a].act_units;
        /* the simulator recounts the peaks while it runs: both within the cap */
        if (cap) {
            CHECK(plan->peak[a].act_units <= cap[a] && r->peak[a].act_units <= cap[a],
                  "%s: actor %d holds %d (simulated %d) activation units, cap %d", s->name, a,
                  plan->peak[a].act_units, r->peak[a].act_units, cap[a]);
        }
    }
    sp_sim_result_free(r);
    sp_plan_free(plan);
    return x;
}

static sim_t builtin(const sp_stage_model *md, const char *name, int p, int m, double lat)
{
    sp_schedule *s;
    MUST(sp_schedule_builtin(name, p, m, 1, &s));
    sim_t x = sim(md, s, lat, NULL);
    sp_schedule_free(s);
    return x;
}

static sim_t synth(const sp_stage_model *md, int p, int m, double lat, int cap)
{
    int caps[64];
    for (int a = 0; a < p; a++) caps[a] = cap ? cap : sp_schedule_auto_default_cap(p, m);
    sp_auto_config cfg = { .latency = lat, .mem_cap = cap };
    sp_schedule *s;
    MUST(sp_schedule_auto(md, p, m, &cfg, &s));
    CHECK(!strcmp(s->name, "auto"), "name '%s'", s->name);
    sim_t x = sim(md, s, lat, caps);
    sp_schedule_free(s);
    return x;
}

static sp_stage_model *chain(int p, double f, double b, double w, const double *scale)
{
    sp_stage_model *md = sp_stage_model_chain(p, f, b, w, 64);
    for (int s = 0; scale && s < p; s++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++) md->stage[s].cost[k] *= scale[s];
    return md;
}

/* No schedule of a chain does better: actor s starts after the forwards of the stages
 * before it and their messages, then has its m (F + B + W) of work. As a bubble. */
static double floor_bubble(const sp_stage_model *md, int p, int m, double lat)
{
    double lb = 0, head = 0, work = 0;
    for (int s = 0; s < p; s++) {
        const double *c = md->stage[s].cost;
        double mine = m * (c[SP_TASK_F] + c[SP_TASK_B] + c[SP_TASK_W]);
        if (head + mine > lb) lb = head + mine;
        work += mine;
        head += c[SP_TASK_F] + lat;
    }
    return 1 - work / (p * lb);
}

/* Many shapes, random costs and caps: valid, well formed, within the cap (sim checks). */
static void random_valid(void)
{
    rng r = { 38 };
    int n = 0;
    for (int it = 0; it < 300; it++) {
        int p = 1 + rng_int(&r, 6), m = 1 + rng_int(&r, 12), cap = 1 + rng_int(&r, 2 * p + 1);
        double lat = rng_int(&r, 2) ? 0 : 0.1 * rng_int(&r, 10), scale[8];
        for (int s = 0; s < p; s++) scale[s] = 0.25 + 0.25 * rng_int(&r, 12);
        sp_stage_model *md = chain(p, 0.2 + 0.1 * rng_int(&r, 20), 0.2 + 0.1 * rng_int(&r, 30),
                                   0.1 * rng_int(&r, 20), scale);
        sim_t a = synth(md, p, m, lat, cap);
        CHECK(a.peak <= cap, "p=%d m=%d cap=%d: peak %d", p, m, cap, a.peak);
        sp_stage_model_free(md);
        n++;
    }
    CHECK(n == 300, "ran %d", n);
}

/* The three goals, against the built-ins simulated on the same model. */
static void goals(void)
{
    static const struct { int p, m; double f, b, w, lat; } cases[] = {
        { 4, 8, 1, 1, 1, 0 }, { 4, 16, 1, 1, 1, 0 }, { 8, 16, 1, 1, 1, 0 }, { 3, 9, 1, 1, 1, 0 },
        { 4, 8, 1, 2, 1, 0 }, { 8, 24, 1, 1.5, 0.7, 0.1 }, { 4, 8, 1, 1, 1, 0.5 },
        { 6, 12, 1, 1.2, 0.8, 0.2 } };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int p = cases[k].p, m = cases[k].m;
        double lat = cases[k].lat;
        sp_stage_model *md = chain(p, cases[k].f, cases[k].b, cases[k].w, NULL);
        sim_t zb = builtin(md, "zb-h1", p, m, lat), f1 = builtin(md, "1f1b", p, m, lat);
        sim_t a1 = synth(md, p, m, lat, 0), a2 = synth(md, p, m, lat, 2 * f1.peak);
        double lb = floor_bubble(md, p, m, lat);
        /* 0. never behind the default schedule (1F1B split), which holds 1F1B's memory */
        sp_schedule *d;
        MUST(sp_schedule_from_env(SP_SCHEDULE_DEFAULT, p, m, 1, &d));
        sim_t df = sim(md, d, lat, NULL);
        sp_schedule_free(d);
        CHECK(df.peak <= f1.peak && a1.step <= df.step * (1 + 1e-12),
              "case %zu: auto %.4f behind the default %s %.4f", k, a1.step,
              SP_SCHEDULE_DEFAULT, df.step);
        /* 1. at 1F1B's memory: no more memory than 1F1B, a bubble no larger than ZB-H1's */
        CHECK(a1.peak <= f1.peak, "case %zu: auto holds %d, 1f1b %d", k, a1.peak, f1.peak);
        CHECK(a1.bubble <= zb.bubble + 1e-12, "case %zu: auto %.4f > zb-h1 %.4f", k, a1.bubble,
              zb.bubble);
        /* 2. at twice that memory: ZB-H1's bubble above the floor no schedule goes under
         * cut to at most a third (the floor itself is ZB-H1's at F = B = W, lat = 0). Not
         * met when a message takes half an F (case 6: auto 0.294, zb-h1 0.351, the floor,
         * which ignores the backward's messages, 0.158): only no worse there. */
        CHECK(a2.bubble <= zb.bubble + 1e-12, "case %zu: auto at 2x %.4f > zb-h1 %.4f", k,
              a2.bubble, zb.bubble);
        if (lat < 0.5)
            CHECK(a2.bubble - lb <= (zb.bubble - lb) / 3 + 1e-12, "case %zu: auto at 2x %.4f, "
                  "zb-h1 %.4f, floor %.4f", k, a2.bubble, zb.bubble, lb);
        CHECK(lb <= a2.bubble + 1e-12, "case %zu: under the floor? %.4f < %.4f", k, a2.bubble, lb);
        sp_stage_model_free(md);
    }
    /* 0'. a chain where the greedy and the published seeds all trail 1F1B split (36.160):
     * auto took 37.208 before the default was a seed (19 of 3000 random chains were so) */
    {
        static const double fb[3] = { 1.575, 0.85, 0.825 }, w[3] = { 0.063, 1.343, 0.264 };
        sp_stage_model *md = sp_stage_model_chain(3, 1, 1, 1, 64);
        for (int s = 0; s < 3; s++) {
            md->stage[s].cost[SP_TASK_F] = md->stage[s].cost[SP_TASK_B] = fb[s];
            md->stage[s].cost[SP_TASK_W] = w[s];
            md->stage[s].cost[SP_TASK_BW] = fb[s] + w[s];
        }
        sp_schedule *d;
        MUST(sp_schedule_from_env(SP_SCHEDULE_DEFAULT, 3, 11, 1, &d));
        sim_t df = sim(md, d, 0, NULL), a = synth(md, 3, 11, 0, 0);
        sp_schedule_free(d);
        CHECK(a.step <= df.step * (1 + 1e-12), "auto %.4f behind the default %.4f", a.step,
              df.step);
        sp_stage_model_free(md);
    }
    /* 3. uneven stages (a head three times a block): no worse than every built-in that
     * runs this model (one stage per actor), and better than GPipe and both 1F1Bs when
     * messages take time; ZB-H1 ties it: at lat = 0 it already keeps the head's actor busy
     * from its first F (the floor), and with latency too since the simulator holds an
     * actor only where a task reads a message, not at the receive (as the runtime; until
     * 2026-12-04 its receives held the actor and auto was strictly ahead) */
    static const double head[4] = { 1, 1, 1, 3 };
    static const char *const names[] = { "gpipe", "1f1b", "eager-1f1b", "zb-h1" };
    for (int m = 8; m <= 16; m += 8)
        for (int l = 0; l < 3; l++) {
            double lat = 0.25 * l;
            sp_stage_model *md = chain(4, 1, 1, 1, head);
            sim_t a = synth(md, 4, m, lat, 0);
            for (int i = 0; i < 4; i++) {
                sim_t b = builtin(md, names[i], 4, m, lat);
                if (lat > 0 && i < 3)
                    CHECK(a.step < b.step * (1 - 1e-9), "1,1,1,3 m=%d lat=%g: auto %.4f, %s "
                          "%.4f", m, lat, a.step, names[i], b.step);
                else
                    CHECK(a.step <= b.step * (1 + 1e-12), "1,1,1,3 m=%d: auto %.4f, %s %.4f", m,
                          a.step, names[i], b.step);
            }
            if (lat == 0)
                CHECK(fabs(a.bubble - floor_bubble(md, 4, m, 0)) < 1e-12, "1,1,1,3 m=%d: %.4f "
                      "vs floor %.4f", m, a.bubble, floor_bubble(md, 4, m, 0));
            sp_stage_model_free(md);
        }
}

static void refused(void)
{
    sp_stage_model *md = chain(4, 1, 1, 1, NULL);
    sp_schedule *s = NULL;
    int caps[4] = { 4, 4, 0, 4 };
    sp_auto_config cfg = { .mem_caps = caps };
    CHECK(sp_schedule_auto(md, 4, 8, &cfg, &s) == SP_ERR_ARG && !s &&
              strstr(sp_last_error(), "memory cap 0 on actor 2 is below the minimum of 1"),
          "cap 0: %s", sp_last_error());
    cfg = (sp_auto_config){ .mem_cap = -3 };
    CHECK(sp_schedule_auto(md, 4, 8, &cfg, &s) == SP_ERR_ARG && !s &&
              strstr(sp_last_error(), "below the minimum"), "cap -3: %s", sp_last_error());
    /* the least cap runs: one microbatch in flight per actor */
    cfg = (sp_auto_config){ .mem_cap = 1 };
    int ones[4] = { 1, 1, 1, 1 };
    MUST(sp_schedule_auto(md, 4, 8, &cfg, &s));
    sim(md, s, 0, ones);
    sp_schedule_free(s);
    /* not a chain of one stage per actor */
    CHECK(sp_schedule_auto(md, 2, 8, NULL, &s) == SP_ERR_ARG && strstr(sp_last_error(), "chain"),
          "4 stages on 2 actors: %s", sp_last_error());
    sp_stage_model_free(md);
    /* a name alone gives no costs: one clear refusal */
    CHECK(sp_schedule_from_env("auto", 4, 8, 0, &s) == SP_ERR_ARG &&
              strstr(sp_last_error(), "which a name alone does not give"), "by name: %s",
          sp_last_error());
}

int main(void)
{
    random_valid();
    goals();
    refused();
    return test_done("test_auto");
}
