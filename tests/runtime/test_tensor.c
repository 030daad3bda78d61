/* Tensor parallelism through the runtime (train.h, opts.tensor): each actor a group of T
 * ranks, whose stage programs meet their group's all-reduces inside the StarPU tasks
 * (runtime/group.c). On R x P x T ranks (mpiexec), for every built-in schedule a residual
 * network of S stages (each a column-then-row split MLP block, the head whole), 3 steps
 * with clipping active: each rank's stage slabs (parameters, gradients, AdamW moments)
 * and the loss must be bitwise those of the reference of T, the T members' references
 * run in threads of this process and joined by the in-process group (sp_tp_local).
 * argv: T [R [SCHEDULE | wide | fail]]. wide: the all-reduced vectors large enough for
 * the chunked all-reduce, under 1F1B and ZB-H1. Also: a task that fails on one member
 * (STARPIPE_FAULT, argv[3] "fail") fails the step on every rank, with no member left
 * waiting in an all-reduce. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/exec.h"
#include "starpipe/graph.h"
#include "starpipe/optim.h"
#include "starpipe/plan.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"
#include "starpipe/train.h"
#include "tests/runtime/train_check.h"

enum { H = 12, V = 5, STEPS = 3 };
/* the batch and the residual width; "wide" (argv[3]): 7 x 2341 = 16387 floats, past
 * runtime/group.c's SP_GROUP_CHUNKED_FLOATS (the reduce-scatter and all-gather) and
 * divisible by neither 2 nor 3, so that the members' chunks differ in size */
static int B = 3, D = 8;

static int bad; /* FAIL (train_check.h) counts here */

static sp_graph *model(int S, int T, int rank)
{
    sp_graph *g = sp_graph_create();
    if (!g || sp_graph_set_tensor(g, T, rank)) return NULL;
    sp_tensor x = sp_input_f32(g, "x", 2, (int64_t[]){ B, D });
    sp_tensor y = sp_input_i32(g, "y", 1, (int64_t[]){ B });
    sp_tensor h = x;
    char n[32];
    for (int s = 0; s < S; s++) {
        if (s) h = sp_pipeline_yield(g, h);
        snprintf(n, sizeof n, "b%d.w1", s);
        sp_tensor w1 = sp_param_split(g, n, 2, (int64_t[]){ D, H }, 1, SP_INIT_NORMAL, 0.4f);
        snprintf(n, sizeof n, "b%d.b1", s);
        sp_tensor b1 = sp_param_split(g, n, 1, (int64_t[]){ H }, 0, SP_INIT_NORMAL, 0.1f);
        snprintf(n, sizeof n, "b%d.w2", s);
        sp_tensor w2 = sp_param_split(g, n, 2, (int64_t[]){ H, D }, 0, SP_INIT_NORMAL, 0.4f);
        snprintf(n, sizeof n, "b%d.b2", s);
        sp_tensor b2 = sp_param(g, n, 1, (int64_t[]){ D }, SP_INIT_NORMAL, 0.1f);
        sp_tensor a = sp_gelu(g, sp_bias_add(g, sp_matmul(g, sp_tp_copy(g, h), w1, 0, 0), b1));
        h = sp_add(g, h, sp_bias_add(g, sp_tp_sum(g, sp_matmul(g, a, w2, 0, 0)), b2));
    }
    sp_tensor wo = sp_param(g, "head.w", 2, (int64_t[]){ D, V }, SP_INIT_NORMAL, 0.4f);
    if (sp_graph_set_loss(g, sp_cross_entropy(g, sp_matmul(g, h, wo, 0, 0), y))) {
        sp_graph_free(g);
        return NULL;
    }
    return g;
}

/* ---- the reference of T: one member per thread ---- */
typedef struct {
    sp_reference *r;
    const void *const *in;
    float loss;
    sp_status st;
    sp_tp_local *local;
} member;

static void *member_step(void *arg)
{
    member *m = arg;
    m->st = sp_reference_step(m->r, m->in, &m->loss);
    if (m->st) sp_tp_local_abort(m->local);
    return NULL;
}

static void fill(int key, int n, void **in)
{
    for (int i = 0; i < n; i++) {
        float *x = in[2 * i];
        int32_t *y = in[2 * i + 1];
        for (int k = 0; k < B * D; k++)
            x[k] = (float)((int)(sp_mix64((uint64_t)(key * 7919 + i * 131 + k)) % 2001) - 1000) / 500.0f;
        for (int b = 0; b < B; b++) y[b] = (int32_t)(sp_mix64((uint64_t)(key * 31 + i * 7 + b)) % V);
    }
}

static void run(const char *sched_name, int T, int R, int P, int fail)
{
    const int me = sp_exec_rank(), m = 2 * P;
    const int v = !strcmp(sched_name, "interleaved-1f1b") || !strcmp(sched_name, "zb-v") ||
                  !strcmp(sched_name, "dualpipe-v") ? 2 : 1;
    const int S = sp_schedule_builtin_stages(sched_name, P, v);
    sp_layout lay = { .replicas = R, .actors = P, .tensor = T };
    int replica, actor, trank;
    sp_layout_place_t(&lay, me, &replica, &actor, &trank);
    sp_status st;
    sp_graph *g = model(S, T, trank);
    sp_program *p = g ? sp_program_build(g, &st) : NULL;
    sp_schedule *sch = NULL;
    if (!p || sp_schedule_builtin(sched_name, P, m, v, &sch)) {
        FAIL("%s: setup: %s", sched_name, sp_last_error());
        return;
    }
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    opt.lr = 0.02f;
    opt.grad_clip = 0.05f; /* clips every step: the norm must count split parts once */
    sp_trainer *t = sp_trainer_create(p, sch, &(sp_train_opts){ .opt = opt, .seed = 9, .replicas = R,
                                                                .tensor = T }, &st);
    /* the reference of T: every member, in this process */
    sp_graph *rg[8] = { 0 };
    sp_program *rp[8] = { 0 };
    member mem[8];
    sp_tp_local *local = sp_tp_local_create(T);
    for (int q = 0; q < T; q++) {
        rg[q] = model(S, T, q);
        rp[q] = rg[q] ? sp_program_build(rg[q], &st) : NULL;
        mem[q] = (member){ .r = rp[q] ? sp_reference_create(rp[q], m, &opt, 9, &st) : NULL,
                           .local = local };
        if (!mem[q].r) {
            FAIL("reference: %s", sp_last_error());
            return;
        }
        sp_reference_set_replicas(mem[q].r, R);
        sp_reference_set_group(mem[q].r, T > 1 ? sp_tp_local_member(local, q) : NULL);
    }
    if (!t) {
        FAIL("%s: trainer: %s", sched_name, sp_last_error());
        return;
    }
    void **in = calloc((size_t)(2 * R * m), sizeof *in);
    for (int i = 0; i < R * m; i++) in[2 * i] = calloc(B * D, 4), in[2 * i + 1] = calloc(B, 4);
    for (int step = 1; step <= STEPS && !bad; step++) {
        fill(step, R * m, in);
        sp_step_stats stats;
        st = sp_trainer_step(t, (const void *const *)in, &stats);
        if (fail && st) { /* STARPIPE_FAULT=fail@2:S: step 2 fails, on every rank */
            if (step != 2) FAIL("%s: step %d failed, expected step 2: %s", sched_name, step,
                                sp_last_error());
            else if (me == 0) printf("step 2 failed on every rank, as it should: %s\n",
                                     sp_last_error());
            fail = 2;
            break;
        }
        if (st) {
            FAIL("%s step %d: %s", sched_name, step, sp_last_error());
            break;
        }
        pthread_t th[8];
        for (int q = 0; q < T; q++) {
            mem[q].in = (const void *const *)in;
            pthread_create(&th[q], NULL, member_step, &mem[q]);
        }
        for (int q = 0; q < T; q++) pthread_join(th[q], NULL);
        for (int q = 0; q < T; q++)
            if (mem[q].st) FAIL("reference member %d: step %d failed", q, step);
        if (memcmp(&stats.loss, &mem[trank].loss, 4))
            FAIL("%s step %d: loss %.9g, the reference's %.9g", sched_name, step, stats.loss,
                 mem[trank].loss);
        char where[160];
        double diff = sp_trainer_compare(t, mem[trank].r, 0.0, where, sizeof where);
        if (diff > 0) FAIL("%s step %d: %.0f floats differ from the reference of T=%d (%s)",
                           sched_name, step, diff, T, where);
    }
    if (fail == 1) FAIL("%s: the injected failure failed no step", sched_name);
    for (int i = 0; i < 2 * R * m; i++) free(in[i]);
    free(in);
    sp_trainer_free(t);
    for (int q = 0; q < T; q++) sp_reference_free(mem[q].r), sp_program_free(rp[q]), sp_graph_free(rg[q]);
    sp_tp_local_free(local);
    sp_schedule_free(sch);
    sp_program_free(p);
    sp_graph_free(g);
}

int main(int argc, char **argv)
{
    if (sp_exec_init(&argc, &argv, &(sp_exec_opts){ .ncpus = 1 }) != SP_OK) {
        fprintf(stderr, "init: %s\n", sp_last_error());
        return 1;
    }
    const int T = argc > 1 ? atoi(argv[1]) : 2, R = argc > 2 ? atoi(argv[2]) : 1,
              fail = argc > 3 && !strcmp(argv[3], "fail"),
              wide = argc > 3 && !strcmp(argv[3], "wide");
    const char *only = argc > 3 && !fail && !wide ? argv[3] : NULL; /* one schedule */
    if (wide) B = 7, D = 2341;
    const int P = sp_exec_size() / (R * T);
    if (P < 1 || P * R * T != sp_exec_size()) {
        fprintf(stderr, "test_tensor: %d ranks are not R=%d x P x T=%d\n", sp_exec_size(), R, T);
        sp_exec_shutdown();
        return 1;
    }
    if (fail) {
        run("1f1b", T, R, P, 1);
    } else if (wide) {
        static const char *const two[2] = { "1f1b", "zb-h1" };
        for (int i = 0; i < 2 && !bad; i++) {
            run(two[i], T, R, P, 0);
            if (sp_exec_rank() == 0 && !bad)
                printf("%s: T=%d R=%d P=%d, %d x %d: bitwise the reference\n", two[i], T, R, P,
                       B, D);
        }
    } else {
        for (int i = 0; i < sp_schedule_builtin_count() && !bad; i++) {
            const char *name = sp_schedule_builtin_info(i)->name;
            if (only && strcmp(name, only)) continue;
            run(name, T, R, P, 0);
            if (sp_exec_rank() == 0 && !bad) printf("%s: T=%d R=%d P=%d bitwise the reference\n",
                                                    name, T, R, P);
        }
    }
    double any = bad;
    sp_exec_allreduce_sum(&any, 1, 1);
    sp_exec_shutdown();
    if (sp_exec_rank() == 0) printf("%s\n", any > 0 ? "FAIL" : "PASS");
    return any > 0;
}
