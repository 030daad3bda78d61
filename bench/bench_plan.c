/* Planner speed at scale: build, validate and lower large schedules, check the plans and
 * simulate them. One core. Exits 1 if planning p=64, v=4, m=256 takes a second or more
 * (the goal of the planner issue). Usage: bench_plan [repeats] */
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench_util.h"
#include "starpipe/plan.h"

static void die(const char *what) { bench_die("bench_plan", what); }

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    if (reps < 1) reps = 1;
    struct { const char *name; int p, m, v; } cases[] = {
        { "interleaved-1f1b", 64, 256, 4 },
        { "zb-v", 128, 256, 2 },
        { "zb-h1", 64, 1024, 0 },
        { "1f1b", 64, 2048, 0 },
    };
    int slow = 0;
    printf("%-17s %4s %5s %2s %8s %9s %10s %10s %10s %10s\n", "schedule", "p", "m", "v",
           "tasks", "messages", "schedule_s", "plan_s", "check_s", "sim_s");
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        double best[4] = { 1e30, 1e30, 1e30, 1e30 };
        int tasks = 0;
        long long msgs = 0;
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            sp_schedule *s;
            if (sp_schedule_builtin(cases[c].name, cases[c].p, cases[c].m, cases[c].v, &s))
                die("schedule");
            double t1 = now();
            sp_stage_model *md = sp_stage_model_chain(s->nstages, 1, 1, 1, 1 << 20);
            sp_plan *pl;
            double t2 = now();
            if (sp_plan_build(md, s, &pl)) die("plan");
            double t3 = now();
            if (sp_plan_check(pl)) die("check");
            double t4 = now();
            sp_sim_result *res;
            sp_sim_config cfg = { .latency = 1e-3, .bandwidth = 1e9 };
            if (sp_simulate(pl, md, &cfg, &res)) die("simulate");
            double t5 = now();
            double t[4] = { t1 - t0, t3 - t2, t4 - t3, t5 - t4 };
            for (int k = 0; k < 4; k++)
                if (t[k] < best[k]) best[k] = t[k];
            tasks = pl->ntasks;
            msgs = (long long)pl->nmessages;
            sp_sim_result_free(res);
            sp_plan_free(pl);
            sp_stage_model_free(md);
            sp_schedule_free(s);
        }
        printf("%-17s %4d %5d %2d %8d %9lld %10.4f %10.4f %10.4f %10.4f\n", cases[c].name,
               cases[c].p, cases[c].m, cases[c].v, tasks, msgs, best[0], best[1], best[2],
               best[3]);
        if (c == 0 && best[1] >= 1.0) slow = 1;
    }
    if (slow) {
        fprintf(stderr, "bench_plan: planning p=64 v=4 m=256 took >= 1 s\n");
        return 1;
    }
    return 0;
}
