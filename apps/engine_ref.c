/* The reference engine (engine.h): `--reference` trains in this one process on the
 * reference interpreter (reference.c), the T members of a tensor group in threads, on
 * the same R x m microbatches as a pipelined run. No MPI: collectives are plain calls. */
#include "apps/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "apps/data.h"
#include "apps/outputs.h"
#include "apps/preflight.h"
#include "apps/reference.h"

typedef struct {
    app_engine e;
    app_ref *r;
    sp_schedule *sch;
} ref_engine;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static sp_status ref_step(app_engine *e, int step, float lr, app_step_out *out)
{
    (void)step;
    app_ref *r = ((ref_engine *)e)->r;
    app_ref_set_lr(r, lr);
    double t0 = now();
    sp_status st = app_ref_step(r, (const void *const *)e->in, &out->loss);
    out->step_s = now() - t0;
    out->grad_norm = sp_reference_grad_norm(app_ref_member(r, 0));
    out->skipped = sp_reference_last_skipped(app_ref_member(r, 0));
    out->has_bubble = out->mismatch = 0;
    return st;
}

static sp_status ref_eval(app_engine *e, int step, float *loss, int *mismatch)
{
    (void)step;
    *mismatch = 0;
    return app_ref_eval(((ref_engine *)e)->r, e->K, (const void *const *)e->ev, loss);
}

static sp_status ref_load(app_engine *e, const char *path, const char *sig, int *start)
{
    if (!start) return ckpt_load_values(path, e->g, &e->io);
    sp_status st = ckpt_load(path, e->g, sig, start, &e->io);
    if (st == SP_OK) app_ref_set_steps_done(((ref_engine *)e)->r, *start);
    return st;
}

static int ref_agree(app_engine *e, int bad, const char *msg)
{
    if (bad) fprintf(stderr, "%s: error: %s\n", e->m->name, msg);
    return bad;
}

static int ref_stop(app_engine *e, int step)
{
    (void)e;
    (void)step;
    return app_stop_requested();
}

static int ref_end(app_engine *e, int code)
{
    ref_engine *re = (ref_engine *)e;
    app_inputs_free(e->ev, e->K, e->p);
    if (re->sch) app_inputs_free(e->in, e->R * re->sch->nmicro, e->p);
    app_ref_free(re->r);
    sp_schedule_free(re->sch);
    free(re);
    return code;
}

static const app_engine_ops ref_ops = {
    .step = ref_step, .eval = ref_eval, .load = ref_load, .agree = ref_agree,
    .stop = ref_stop, .end = ref_end,
};

/* Says what stops the run before it starts, and ends what it had built. */
static app_engine *refuse(ref_engine *re, const char *name, const char *msg, int code,
                          int *out)
{
    fprintf(stderr, "%s: error: %s\n", name, msg);
    *out = code;
    if (re) ref_end(&re->e, code);
    return NULL;
}

app_engine *app_engine_reference(sp_app_model *m, const sp_app_opts *o, const sp_env *env,
                                 const sp_adamw_config *opt, int *code)
{
    char msg[1024];
    int P = o->actors ? o->actors : 1;
    int T0 = o->tensor > 0 ? o->tensor : env->tensor > 0 ? env->tensor : 1;
    if (app_preflight(m, o, P, 1, T0, 1, msg, sizeof msg))
        return refuse(NULL, m->name, msg, 2, code);
    ref_engine *re = calloc(1, sizeof *re);
    if (!re) return refuse(NULL, m->name, "out of memory", 1, code);
    app_engine *e = &re->e;
    *e = (app_engine){ .ops = &ref_ops, .m = m, .o = o, .env = env, .speaks = 1, .cuda = 0,
                       .ranks = 1, .local = 1, .same_note = NULL, .done_note = "",
                       .log_after_sample = 1 };
    /* the schedule sets only the stages and microbatches here: auto's are 1F1B's (one stage
     * per actor), whatever order it picks */
    const char *name = o->schedule ? o->schedule : env->schedule;
    if (name && !strcmp(name, "auto")) name = "1f1b";
    else name = o->schedule;
    if (sp_schedule_from_env(name, P, o->microbatches, o->chunks, &re->sch) != SP_OK)
        return refuse(re, m->name, sp_last_error(), 2, code);
    e->sch = re->sch;
    if (app_check_data(m, o) != SP_OK) return refuse(re, m->name, sp_last_error(), 1, code);
    if (m->prepare(m->cfg, &e->samples, msg, sizeof msg) || app_hold_out(m, o, msg, sizeof msg) ||
        app_check_sample(m, o, msg, sizeof msg) || app_scan_data(m, env->verbose, msg, sizeof msg))
        return refuse(re, m->name, msg, 1, code);
    int nmb = re->sch->nmicro;
    /* replicas: the same R x m microbatches a replicated run trains on; tensor
     * parallelism: the T members of each actor's group, in threads */
    sp_layout lay;
    if (sp_layout_from_env(P * (o->replicas ? o->replicas : 1) * T0, o->replicas, o->actors,
                           o->tensor, o->rank_order, &lay))
        return refuse(re, m->name, sp_last_error(), 2, code);
    e->R = lay.replicas, e->T = sp_layout_tensor(&lay);
    sp_status st = SP_OK;
    re->r = app_ref_create(m, o, re->sch->nstages, e->T, nmb, e->R, opt, &st);
    e->g = re->r ? app_ref_graph(re->r, 0) : NULL;
    e->p = re->r ? app_ref_program(re->r, 0) : NULL;
    e->in = e->p ? app_inputs_alloc(e->p, e->R * nmb) : NULL;
    e->K = o->eval_batches ? o->eval_batches : e->R * nmb; /* held-out microbatches */
    e->ev = e->p && o->eval_every ? app_eval_inputs(m, o, e->p, e->K) : NULL;
    if (!re->r || !e->in || (o->eval_every && !e->ev))
        return refuse(re, m->name, st ? sp_last_error() : "out of memory", 1, code);
    e->io = app_ref_io(re->r, 1);
    e->io.layout = m->ckpt_layout, e->io.layout_ctx = m->cfg;
    if (app_check_run_outputs(m, o, env->trace) != SP_OK)
        return refuse(re, m->name, sp_last_error(), 1, code);
    char group[64] = "";
    if (e->T > 1) snprintf(group, sizeof group, ", a tensor group of %d in threads", e->T);
    if (e->R > 1)
        snprintf(e->head, sizeof e->head, "%s: reference interpreter, %d stages, %d replicas x "
                 "%d microbatches%s%s", m->name, re->sch->nstages, e->R, nmb,
                 o->bf16 ? ", bf16 matmuls" : "", group);
    else
        snprintf(e->head, sizeof e->head, "%s: reference interpreter, %d stages, %d "
                 "microbatches%s%s", m->name, re->sch->nstages, nmb,
                 o->bf16 ? ", bf16 matmuls" : "", group);
    if (o->steps > 0 && o->peak_tflops <= 0) app_peak_cpu(&e->cpu_peak);
    return e;
}
