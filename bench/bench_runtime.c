/* bench_runtime: how close the StarPU runtime comes to the planner's simulator.
 * Run under mpirun -np P. For each schedule: train the GPT for a few steps, take the
 * median pipeline span (first task start to last task end, all ranks) and each actor's
 * busy time from the executed-task trace, then feed the measured mean time of every
 * (stage, kind) task into the simulator with the same plan; measured / simulated is the
 * runtime's overhead (target: within 5%). Also the per-rank memory of per-microbatch
 * buffers next to the planner's prediction. Prints a table on rank 0.
 *   mpirun -np 2 bench_runtime [steps] [layers channels context batch microbatches] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/exec.h"
#include "starpipe/models.h"
#include "starpipe/train.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (sp_exec_init(&argc, &argv, &(sp_exec_opts){ .trace = 1 }) != SP_OK) {
        fprintf(stderr, "bench_runtime: %s\n", sp_last_error());
        return 1;
    }
    int me = sp_exec_rank(), P = sp_exec_size();
    int steps = argc > 1 ? atoi(argv[1]) : 6;
    sp_gpt_config base = { .vocab = 256, .layers = argc > 2 ? atoi(argv[2]) : 4,
                           .channels = argc > 3 ? atoi(argv[3]) : 128,
                           .context = argc > 4 ? atoi(argv[4]) : 128,
                           .batch = argc > 5 ? atoi(argv[5]) : 4, .heads = 4 };
    int m = argc > 6 ? atoi(argv[6]) : 8;
    const char *names[] = { "gpipe", "1f1b", "interleaved-1f1b", "zb-h1" };
    sp_status st;
    sp_text *text = sp_text_load(SP_DEFAULT_CORPUS, base.context, &st);
    if (!text) sp_exec_abort(1, "%s", sp_last_error());
    if (me == 0) {
        printf("GPT layers=%d channels=%d context=%d batch=%d, m=%d, p=%d, %d steps "
               "(median of all but the first)\n\n", base.layers, base.channels, base.context,
               base.batch, m, P, steps);
        printf("| schedule | task ms (F/B/W/BW mean) | measured span ms | simulated ms | "
               "measured/simulated | busy per actor ms | step ms | transient MiB per rank "
               "(measured / planned) |\n|---|---|---|---|---|---|---|---|\n");
    }
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        int v = !strcmp(names[k], "interleaved-1f1b") ? 2 : 1;
        sp_schedule *sch;
        if (sp_schedule_builtin(names[k], P, m, v, &sch) != SP_OK)
            sp_exec_abort(1, "%s", sp_last_error());
        sp_gpt_config c = base;
        c.stages = sch->nstages;
        sp_graph *g = sp_model_gpt(&c, &st);
        sp_program *p = g ? sp_program_build(g, &st) : NULL;
        sp_adamw_config opt;
        sp_adamw_defaults(&opt);
        sp_train_opts to = { .opt = opt, .seed = 1, .trace = 1 };
        sp_trainer *t = p ? sp_trainer_create(p, sch, &to, &st) : NULL;
        if (!t) sp_exec_abort(1, "%s: %s", names[k], sp_last_error());
        const sp_plan *pl = sp_trainer_plan(t);
        int S = sch->nstages;
        int32_t *buf = malloc(sizeof(int32_t) * 2 * (size_t)m * c.batch * c.context);
        const void **in = malloc(sizeof(void *) * 2 * (size_t)m);
        double *span = calloc((size_t)steps, sizeof *span), *stepms = calloc((size_t)steps, sizeof *stepms);
        /* per (stage, kind): total time and count; per actor: busy */
        double *sum = calloc((size_t)S * SP_NUM_TASK_KINDS * 2 + P, sizeof(double));
        for (int step = 1; step <= steps; step++) {
            for (int i = 0; i < m; i++) {
                int32_t *x = buf + (size_t)i * 2 * c.batch * c.context, *y = x + c.batch * c.context;
                sp_text_batch(text, 1, step, i, c.batch, c.context, x, y);
                in[2 * i] = x;
                in[2 * i + 1] = y;
            }
            sp_step_stats stats;
            if (sp_trainer_step(t, in, &stats) != SP_OK) sp_exec_abort(1, "%s", sp_last_error());
            const sp_train_event *ev;
            int n;
            sp_trainer_trace(t, &ev, &n);
            double first = 1e30, last = 0, busy = 0;
            for (int e = 0; e < n; e++) {
                if (ev[e].transfer) continue; /* tasks only: transfers overlap them */
                if (ev[e].start_us < first) first = ev[e].start_us;
                if (ev[e].end_us > last) last = ev[e].end_us;
                busy += ev[e].end_us - ev[e].start_us;
                if (step > 1 && ev[e].kind >= 0) {
                    int j = ev[e].stage * SP_NUM_TASK_KINDS + ev[e].kind;
                    sum[2 * j] += ev[e].end_us - ev[e].start_us;
                    sum[2 * j + 1] += 1;
                }
            }
            if (step > 1) sum[(size_t)S * SP_NUM_TASK_KINDS * 2 + me] += busy / (steps - 1);
            /* the span of the whole pipeline: latest end over the ranks (clocks start at
             * the same collective begin_step, close enough on one host) */
            double *all = calloc((size_t)2 * P, sizeof(double));
            all[2 * me] = first;
            all[2 * me + 1] = last;
            sp_exec_allreduce_sum(all, (size_t)2 * P, 1);
            double f = 1e30, l = 0;
            for (int a = 0; a < P; a++) {
                if (all[2 * a] < f) f = all[2 * a];
                if (all[2 * a + 1] > l) l = all[2 * a + 1];
            }
            free(all);
            span[step - 1] = (l - f) / 1e3;
            stepms[step - 1] = stats.step_s * 1e3;
        }
        sp_exec_allreduce_sum(sum, (size_t)S * SP_NUM_TASK_KINDS * 2 + P, 1);
        sp_train_memory mem = sp_trainer_memory(t);
        double *memv = calloc((size_t)P, sizeof(double));
        memv[me] = (double)mem.transient;
        sp_exec_allreduce_sum(memv, (size_t)P, 1);
        if (me == 0) {
            /* simulate the same plan with the measured mean task times */
            sp_stage_model model = *sp_program_stage_model(p);
            sp_stage_info *info = malloc(sizeof *info * (size_t)S);
            memcpy(info, model.stage, sizeof *info * (size_t)S);
            double kind_ms[SP_NUM_TASK_KINDS] = { 0 }, kind_n[SP_NUM_TASK_KINDS] = { 0 };
            for (int s = 0; s < S; s++)
                for (int kd = 0; kd < SP_NUM_TASK_KINDS; kd++) {
                    int j = s * SP_NUM_TASK_KINDS + kd;
                    info[s].cost[kd] = sum[2 * j + 1] > 0 ? sum[2 * j] / sum[2 * j + 1] / 1e3 : 0;
                    kind_ms[kd] += sum[2 * j];
                    kind_n[kd] += sum[2 * j + 1];
                }
            model.stage = info;
            sp_sim_config cfg = { 0 };
            sp_sim_result *r = NULL;
            if (sp_simulate(pl, &model, &cfg, &r) != SP_OK) sp_exec_abort(1, "%s", sp_last_error());
            qsort(span + 1, (size_t)steps - 1, sizeof *span, cmp_double);
            qsort(stepms + 1, (size_t)steps - 1, sizeof *stepms, cmp_double);
            double med = span[1 + (steps - 1) / 2], medstep = stepms[1 + (steps - 1) / 2];
            printf("| %s | ", names[k]);
            for (int kd = 0; kd < SP_NUM_TASK_KINDS; kd++)
                printf(kd ? "/%.1f" : "%.1f", kind_n[kd] ? kind_ms[kd] / kind_n[kd] / 1e3 : 0.0);
            printf(" | %.1f | %.1f | %.3f | ", med, r->step_time, med / r->step_time);
            for (int a = 0; a < P; a++)
                printf(a ? " / %.1f" : "%.1f", sum[(size_t)S * SP_NUM_TASK_KINDS * 2 + a] / 1e3);
            printf(" | %.1f | ", medstep);
            for (int a = 0; a < P; a++)
                printf(a ? " ; %.2f / %.2f" : "%.2f / %.2f", memv[a] / 1048576.0,
                       (double)(pl->peak[a].acts + pl->peak[a].boundary) / 1048576.0);
            printf(" |\n");
            fflush(stdout);
            sp_sim_result_free(r);
            free(info);
        }
        free(memv), free(sum), free(span), free(stepms), free(buf), free(in);
        sp_trainer_free(t);
        sp_program_free(p);
        sp_graph_free(g);
        sp_schedule_free(sch);
    }
    sp_text_free(text);
    sp_exec_shutdown();
    return 0;
}
