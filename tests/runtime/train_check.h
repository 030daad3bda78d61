/* Checks shared by the trainer tests: a trained rank's stages against the reference
 * interpreter (bitwise), and the executed task order against the plan. Each returns the
 * number of failures and prints them. */
#ifndef STARPIPE_TEST_TRAIN_CHECK_H
#define STARPIPE_TEST_TRAIN_CHECK_H

#include <stdio.h>
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/exec.h"
#include "starpipe/models.h"
#include "starpipe/reference.h"
#include "starpipe/train.h"

#define FAIL(...)                                                                          \
    do {                                                                                   \
        fprintf(stderr, "FAIL rank %d: ", sp_exec_rank());                                 \
        fprintf(stderr, __VA_ARGS__);                                                      \
        fputc('\n', stderr);                                                               \
        bad++;                                                                             \
    } while (0)

/* The trainer tests' small models: a GPT (tied embedding over the first and last stage)
 * or an MLP, one layer per stage. */
static inline sp_graph *check_model(int gpt, int stages)
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

/* n microbatches (inputs in[2 i], in[2 i + 1], 64 floats each) of step `key`'s data for
 * check_model; key < 0: held-out data (the MLP's evaluation stream). */
static inline void check_fill(int gpt, int key, int n, void **in)
{
    for (int i = 0; i < n; i++) {
        if (gpt)
            for (int k = 0; k < 12; k++) {
                ((int32_t *)in[2 * i])[k] = (int32_t)(sp_mix64((uint64_t)(key * 1000 + i * 50 + k)) % 256);
                ((int32_t *)in[2 * i + 1])[k] = (int32_t)(sp_mix64((uint64_t)(key * 977 + i * 31 + k)) % 256);
            }
        else if (key < 0)
            sp_mlp_eval_batch(3, i, 5, 7, 5, in[2 * i], in[2 * i + 1]);
        else
            sp_mlp_batch(3, key, i, 5, 7, 5, in[2 * i], in[2 * i + 1]);
    }
}

/* The plan's RUN order on this rank against what the trace says ran. */
static inline int check_order(sp_trainer *t, const char *what)
{
    int bad = 0, me = sp_exec_rank();
    const sp_plan *pl = sp_trainer_plan(t);
    const sp_train_event *ev;
    int n;
    sp_trainer_trace(t, &ev, &n);
    int e = 0;
    for (int j = 0; j < pl->ninstr[me]; j++) {
        const sp_instr *in = &pl->instr[me][j];
        if (in->op != SP_OP_RUN) continue;
        while (e < n && ev[e].kind < 0) e++; /* helper tasks: copies, combines */
        if (e == n) {
            FAIL("%s: the trace ends before %s%d s%d", what, sp_task_kind_name(in->task.kind),
                 in->task.mb, in->task.stage);
            return bad;
        }
        if (ev[e].kind != in->task.kind || ev[e].mb != in->task.mb ||
            ev[e].stage != in->task.stage) {
            FAIL("%s: ran '%s' where the plan has %s mb%d s%d", what, ev[e].name,
                 sp_task_kind_name(in->task.kind), in->task.mb, in->task.stage);
            return bad;
        }
        e++;
    }
    return bad;
}

static inline int compare(sp_trainer *t, sp_reference *r, const sp_program *p, const char *what, int step)
{
    int bad = 0;
    for (int s = 0; s < sp_program_num_stages(p); s++) {
        if (!sp_trainer_owns_stage(t, s)) continue;
        size_t bytes = sp_program_buf_bytes(p, SP_BUF_PARAMS, s);
        const float *a[4] = { sp_trainer_slab(t, SP_BUF_PARAMS, s), sp_trainer_slab(t, SP_BUF_GRADS, s),
                              sp_trainer_moment(t, 0, s), sp_trainer_moment(t, 1, s) };
        const float *b[4] = { sp_reference_slab(r, SP_BUF_PARAMS, s), sp_reference_slab(r, SP_BUF_GRADS, s),
                              sp_reference_moment(r, 0, s), sp_reference_moment(r, 1, s) };
        const char *names[4] = { "parameters", "gradients", "AdamW m", "AdamW v" };
        for (int k = 0; k < 4; k++)
            if (!a[k] || memcmp(a[k], b[k], bytes))
                FAIL("%s step %d: %s of stage %d differ from the reference", what, step,
                     names[k], s);
    }
    return bad;
}

/* A case of the trainer tests: check_model's model cut for sch, its trainer (opts to)
 * and a reference interpreter with the same optimizer, seed and replicas. On failure t
 * or r is NULL (sp_last_error says why); check_teardown frees what exists. */
typedef struct {
    sp_graph *g;
    sp_program *p;
    sp_trainer *t;
    sp_reference *r;
} check_run;

static inline check_run check_setup(int gpt, const sp_schedule *sch, const sp_train_opts *to)
{
    check_run c = { 0 };
    sp_status st;
    c.g = check_model(gpt, sch->nstages);
    c.p = c.g ? sp_program_build(c.g, &st) : NULL;
    c.t = c.p ? sp_trainer_create(c.p, sch, to, &st) : NULL;
    c.r = c.p ? sp_reference_create(c.p, sch->nmicro, &to->opt, to->seed, &st) : NULL;
    if (c.r && sp_reference_set_replicas(c.r, to->replicas > 1 ? to->replicas : 1) != SP_OK) {
        sp_reference_free(c.r);
        c.r = NULL;
    }
    return c;
}

static inline void check_teardown(check_run *c)
{
    sp_trainer_free(c->t);
    sp_reference_free(c->r);
    sp_program_free(c->p);
    sp_graph_free(c->g);
}

/* One step of the trainer and of the reference on the same inputs: the losses, then every
 * stage of this rank, must be identical. Returns the failures; *stop is set when a step
 * failed to run (a status, the same on every rank). */
static inline int check_step(sp_trainer *t, sp_reference *r, const sp_program *p,
                             const void *const *in, const char *what, int step, int *stop)
{
    int bad = 0;
    sp_step_stats stats;
    float ref_loss;
    if (sp_trainer_step(t, in, &stats) != SP_OK || sp_reference_step(r, in, &ref_loss) != SP_OK) {
        FAIL("%s step %d: %s", what, step, sp_last_error());
        *stop = 1;
        return bad;
    }
    if (memcmp(&stats.loss, &ref_loss, 4))
        FAIL("%s step %d: loss %.9g, reference %.9g", what, step, stats.loss, ref_loss);
    /* the host touches only this replica's inputs, the losses and the norm's terms:
     * gradients are zeroed, normed and applied where they live (no GPU round trip) */
    const sp_graph *g = sp_program_graph(p);
    int m = sp_trainer_plan(t)->nmicro, S = sp_program_num_stages(p);
    size_t want = 0;
    for (int k = 0; k < sp_program_num_inputs(p); k++)
        want += (size_t)m * sp_program_buf_bytes(p, SP_BUF_INPUT, k);
    for (int s = 0; s < S; s++)
        if (sp_trainer_owns_stage(t, s))
            want += (size_t)sp_graph_num_params(g) * sizeof(double) +
                    (s == S - 1 ? (size_t)m * sizeof(float) : 0);
    if (stats.host_bytes != want) {
        FAIL("%s step %d: the host moved %zu bytes, expected %zu", what, step, stats.host_bytes,
             want);
        bad++;
    }
    return bad + compare(t, r, p, what, step);
}

/* Whether a case failed on any rank (collective). */
static inline int check_any(int bad)
{
    double any = bad;
    sp_exec_allreduce_sum(&any, 1, 1);
    return any > 0;
}

#endif
