/* bench_runtime: how close a pipelined step comes to what its schedule allows.
 * Run under mpirun -np P with the default launch (nothing set: that is what users run).
 * For every schedule it trains the GPT for a few steps and prints, as medians over all
 * steps but the first:
 *   - the measured span of the pipelined phase (first task start to last task end, on
 *     the ranks' common clock) and its bubble;
 *   - "replay": the plan simulated with this run's own task durations and instant
 *     messages, i.e. the schedule's bound for the tasks as they ran (sp_plan_measure);
 *   - "ideal": the plan simulated with each task's uncontended time, measured by the
 *     reference interpreter running that task alone while every other rank sleeps (with
 *     more ranks than cores, at least the total work over the cores);
 *   - message waits: how long a task that could have run waited for its message, in
 *     all and from the message's arrival (the runtime's own share);
 *   - the memory of per-microbatch buffers per rank against the planner's prediction, and
 *     (when any) the copies the transport keeps of sends in flight, outside the plan.
 *
 *   mpirun -np 2 bench_runtime [--steps N] [--microbatches M] [--schedules a,b,...]
 *                              [--layers L --channels C --context T --batch B --heads H] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "starpipe/data.h"
#include "starpipe/exec.h"
#include "starpipe/models.h"
#include "starpipe/reference.h"
#include "starpipe/train.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[1..n-1] (the first step allocates buffers), or v[0] when n == 1. */
static double median_after_first(double *v, int n)
{
    int skip = n > 1;
    qsort(v + skip, (size_t)(n - skip), sizeof *v, cmp_double);
    return v[skip + (n - skip) / 2];
}

/* A barrier whose waiters sleep, so that a rank timing tasks has its core to itself. */
static void sleeping_barrier(void)
{
    MPI_Request rq;
    int done = 0;
    MPI_Ibarrier(MPI_COMM_WORLD, &rq);
    while (MPI_Test(&rq, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done)
        nanosleep(&(struct timespec){ 0, 200000 }, NULL);
}

static int arg_int(int argc, char **argv, const char *flag, int dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], flag)) return atoi(argv[i + 1]);
    return dflt;
}

static const char *arg_str(int argc, char **argv, const char *flag, const char *dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], flag)) return argv[i + 1];
    return dflt;
}

int main(int argc, char **argv)
{
    if (sp_exec_init(&argc, &argv, &(sp_exec_opts){ .trace = 1 }) != SP_OK) {
        fprintf(stderr, "bench_runtime: %s\n", sp_last_error());
        return 1;
    }
    int me = sp_exec_rank(), P = sp_exec_size();
    int steps = arg_int(argc, argv, "--steps", 8);
    int m = arg_int(argc, argv, "--microbatches", 2 * P);
    sp_gpt_config base = { .vocab = 256, .layers = arg_int(argc, argv, "--layers", 4),
                           .channels = arg_int(argc, argv, "--channels", 64),
                           .context = arg_int(argc, argv, "--context", 64),
                           .batch = arg_int(argc, argv, "--batch", 4),
                           .heads = arg_int(argc, argv, "--heads", 4) };
    char list[512];
    snprintf(list, sizeof list, "%s", arg_str(argc, argv, "--schedules",
             "gpipe,1f1b,eager-1f1b,interleaved-1f1b,zb-h1,zb-v,dualpipe-v"));
    if (steps < 2) sp_exec_abort(2, "--steps must be at least 2 (the first step is left out)");
    sp_status st;
    sp_text *text = sp_text_load(SP_DEFAULT_CORPUS, base.context, &st);
    if (!text) sp_exec_abort(1, "%s", sp_last_error());
    if (me == 0) {
        printf("GPT layers=%d channels=%d heads=%d context=%d batch=%d, m=%d, p=%d ranks, %d "
               "steps (medians of all but the first)\n\n", base.layers, base.channels,
               base.heads, base.context, base.batch, m, P, steps);
        printf("| schedule | span ms | replay ms | span/replay | ideal ms | span/ideal | "
               "bubble (replay, ideal) | message wait median / p90 (after arrival) us | step ms | transient "
               "MiB per rank (measured / planned pool (live peak) [+ copies of sends]) |\n|---|---|---|---|---|---|---|---|---|---|\n");
    }
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
        int v = !strcmp(name, "interleaved-1f1b") || !strcmp(name, "zb-v") ||
                !strcmp(name, "dualpipe-v") ? 2 : 1;
        sp_schedule *sch;
        if (sp_schedule_builtin(name, P, m, v, &sch) != SP_OK) {
            if (me == 0) printf("| %s | skipped: %s |\n", name, sp_last_error());
            continue;
        }
        sp_gpt_config c = base;
        c.stages = sch->nstages;
        sp_graph *g = sp_model_gpt(&c, &st);
        sp_program *p = g ? sp_program_build(g, &st) : NULL;
        sp_adamw_config opt;
        sp_adamw_defaults(&opt);
        sp_train_opts to = { .opt = opt, .seed = 1, .trace = 1 };
        sp_trainer *t = p ? sp_trainer_create(p, sch, &to, &st) : NULL;
        if (!t) sp_exec_abort(1, "%s: %s", name, sp_last_error());
        const sp_plan *pl = sp_trainer_plan(t);
        int S = sch->nstages;
        int32_t *buf = malloc(sizeof(int32_t) * 2 * (size_t)m * c.batch * c.context);
        const void **in = malloc(sizeof(void *) * 2 * (size_t)m);
        double *col[8];
        for (int k = 0; k < 8; k++) col[k] = calloc((size_t)steps, sizeof(double));

        /* the ideal: every task alone on rank 0's core while the other ranks sleep */
        double *cost = calloc((size_t)S * SP_NUM_TASK_KINDS, sizeof(double));
        for (int i = 0; i < m; i++) {
            int32_t *x = buf + (size_t)i * 2 * c.batch * c.context, *y = x + c.batch * c.context;
            sp_text_batch(text, 1, 1, i, c.batch, c.context, x, y);
            in[2 * i] = x;
            in[2 * i + 1] = y;
        }
        /* every rank done setting up (its trainer touches its buffers for the first time)
         * before rank 0 times: the first schedule's ideal came out 10-40% high without */
        sleeping_barrier();
        if (me == 0) {
            sp_reference *ref = sp_reference_create(p, m, &opt, 1, &st);
            if (!ref || sp_reference_task_times(ref, (const void *const *)in, 7, cost) != SP_OK)
                sp_exec_abort(1, "%s: %s", name, sp_last_error());
            sp_reference_free(ref);
        }
        sleeping_barrier();

        for (int step = 1; step <= steps; step++) {
            for (int i = 0; i < m; i++) {
                int32_t *x = buf + (size_t)i * 2 * c.batch * c.context, *y = x + c.batch * c.context;
                sp_text_batch(text, 1, step, i, c.batch, c.context, x, y);
            }
            sp_step_stats s;
            if (sp_trainer_step(t, in, &s) != SP_OK) sp_exec_abort(1, "%s", sp_last_error());
            double row[8] = { s.span_s, s.plan_span_s, s.bubble, s.plan_bubble,
                              s.wait_median_s, s.wait_p90_s, s.step_s, s.dispatch_median_s };
            for (int k = 0; k < 8; k++) col[k][step - 1] = row[k];
        }
        sp_train_memory mem = sp_trainer_memory(t);
        double *memv = calloc(2 * (size_t)P, sizeof(double));
        memv[me] = (double)mem.transient;
        memv[P + me] = (double)mem.staging;
        sp_exec_allreduce_sum(memv, 2 * (size_t)P, 1);
        if (me == 0) {
            sp_stage_model model = *sp_program_stage_model(p);
            sp_stage_info *info = malloc(sizeof *info * (size_t)S);
            memcpy(info, model.stage, sizeof *info * (size_t)S);
            for (int s = 0; s < S; s++)
                for (int kd = 0; kd < SP_NUM_TASK_KINDS; kd++)
                    info[s].cost[kd] = cost[s * SP_NUM_TASK_KINDS + kd];
            model.stage = info;
            sp_sim_result *ideal = NULL;
            if (sp_simulate(pl, &model, &(sp_sim_config){ 0 }, &ideal) != SP_OK)
                sp_exec_abort(1, "%s", sp_last_error());
            /* ranks that share cores cannot beat the total work over the cores (this
             * benchmark runs all ranks on one host) */
            double work = 0, ideal_span = ideal->step_time;
            long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
            for (int a = 0; a < P; a++) work += ideal->busy[a];
            if (ncpu > 0 && P > ncpu && work / ncpu > ideal_span) ideal_span = work / ncpu;
            double med[8];
            for (int k = 0; k < 8; k++) med[k] = median_after_first(col[k], steps);
            printf("| %s | %.1f | %.1f | %.3f | %.1f | %.3f | %.1f%% (%.1f%%, %.1f%%) | "
                   "%.0f / %.0f (%.0f) | %.1f | ", name, 1e3 * med[0], 1e3 * med[1], med[0] / med[1],
                   1e3 * ideal_span, med[0] / ideal_span, 100 * med[2],
                   100 * med[3], 100 * ideal->bubble_fraction, 1e6 * med[4], 1e6 * med[5],
                   1e6 * med[7], 1e3 * med[6]);
            for (int a = 0; a < P; a++) { /* measured / the plan's pool (its live peak) */
                size_t packed = 0;
                if (sp_plan_pool_bytes(pl, sp_program_stage_model(p), a, &packed) != SP_OK)
                    packed = 0;
                printf(a ? " ; %.2f / %.2f (%.2f)" : "%.2f / %.2f (%.2f)", memv[a] / 1048576.0,
                       packed / 1048576.0, (double)pl->peak[a].transient / 1048576.0);
                if (memv[P + a] > 0) printf(" +%.2f", memv[P + a] / 1048576.0);
            }
            printf(" |\n");
            fflush(stdout);
            sp_sim_result_free(ideal);
            free(info);
        }
        for (int k = 0; k < 8; k++) free(col[k]);
        free(memv), free(cost), free(buf), free(in);
        sp_trainer_free(t);
        sp_program_free(p);
        sp_graph_free(g);
        sp_schedule_free(sch);
    }
    sp_text_free(text);
    sp_exec_shutdown();
    return 0;
}
