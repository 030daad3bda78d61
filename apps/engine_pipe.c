/* The pipelined engine (engine.h): StarPU and MPI started, the trainer (starpipe/train.h)
 * built on every rank and stepped; --check runs the reference beside it and compares each
 * step, and STARPIPE_VERBOSE=1 describes the plan, the ranks and the memory. */
#include "apps/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/auto.h"
#include "apps/cut.h"
#include "apps/data.h"
#include "apps/describe.h"
#include "apps/outputs.h"
#include "apps/preflight.h"
#include "apps/profile.h"
#include "apps/reference.h"
#include "starpipe/device.h"
#include "starpipe/exec.h"
#include "starpipe/train.h"

typedef struct {
    app_engine e;
    sp_graph *g;          /* this rank's member of the model */
    sp_program *p;
    sp_schedule *sch;
    sp_layout lay;
    sp_trainer *t;
    app_ref *ref;         /* --check: the reference of the run (its T members) */
    double tol;           /* --check's tolerance; 0: bitwise */
    int me, actor, trank;
    int last_step;        /* the last step that ran */
    double *bound_ratio;  /* each step's pipeline span over what its schedule allows */
    int nratio;
    double *step_s, *span_s; /* each step's time and its pipeline's span (--profile,
                                --calibrate) */
    int ntimes;
    sp_profile *calib;       /* --calibrate's profile, and what it predicts */
    sp_prediction pred;
    int predicted;
    char command[2048];      /* the command line, for --profile's header */
    int auto_sched;          /* --schedule auto: pe->sch is ZB-H1's probe until build */
    char auto_why[1024];
    char cut_why[256];
    double dev_buffers;   /* this GPU rank's buffers as preflight foresaw them */
} pipe_engine;

static sp_status tr_get(void *ctx, sp_tensor p, int what, float *dst)
{
    return sp_trainer_fetch(ctx, p, what, dst);
}
static sp_status tr_set(void *ctx, sp_tensor p, int what, const float *src)
{
    return sp_trainer_store(ctx, p, what, src);
}

/* Collective: 1 if any rank is bad; the lowest bad rank prints its message. */
static int any_failed(int bad, const char *name, const char *msg)
{
    int P = sp_exec_size(), me = sp_exec_rank();
    double *v = calloc((size_t)P, sizeof *v);
    if (!v) sp_exec_abort(1, "out of memory");
    v[me] = bad ? 1.0 : 0.0;
    if (sp_exec_allreduce_sum(v, (size_t)P, 1) != SP_OK) sp_exec_abort(1, "%s", sp_last_error());
    int first = -1;
    for (int r = 0; r < P && first < 0; r++)
        if (v[r] > 0) first = r;
    free(v);
    if (first == me) {
        if (P > 1) fprintf(stderr, "%s: error (rank %d): %s\n", name, me, msg);
        else fprintf(stderr, "%s: error: %s\n", name, msg);
        fflush(stderr);
    }
    return first >= 0;
}

/* ---- the engine's entries ---- */

static int pipe_agree(app_engine *e, int bad, const char *msg)
{
    return any_failed(bad, e->m->name, msg);
}

/* --check: the step against the reference's, this rank against its member; 1 when they
 * differ, with e->msg. */
static int check_step(pipe_engine *pe, int step, float loss)
{
    app_engine *e = &pe->e;
    char where[256] = "";
    float ref_loss = 0;
    if (app_ref_step(pe->ref, (const void *const *)e->in, &ref_loss) != SP_OK) {
        snprintf(e->msg, sizeof e->msg, "reference: %s", sp_last_error());
        return 1;
    }
    double mismatch = sp_trainer_compare(pe->t, app_ref_member(pe->ref, pe->trank), pe->tol,
                                         where, sizeof where);
    if (pe->tol > 0 ? !(fabs(ref_loss - loss) <= pe->tol * (1 + fabs(ref_loss)))
                    : memcmp(&ref_loss, &loss, 4) != 0) {
        snprintf(where, sizeof where, "loss %.9g vs reference %.9g", loss, ref_loss);
        mismatch += 1;
    }
    snprintf(e->msg, sizeof e->msg, "step %d differs from the reference: %s", step, where);
    return mismatch > 0;
}

static sp_status pipe_step(app_engine *e, int step, float lr, app_step_out *out)
{
    pipe_engine *pe = (pipe_engine *)e;
    sp_trainer_set_lr(pe->t, lr);
    if (pe->ref) app_ref_set_lr(pe->ref, lr);
    sp_step_stats s;
    sp_status st = sp_trainer_step(pe->t, (const void *const *)e->in, &s);
    if (st != SP_OK) {
        /* lost on this rank only (watchdog, submission): its peers may be waiting for
         * it, so this rank ends them all with its own message */
        if (!sp_exec_usable())
            sp_exec_abort(1, "%s: error at step %d: %s", e->m->name, step, sp_last_error());
        return st;
    }
    pe->last_step = step;
    if (s.plan_span_s > 0) pe->bound_ratio[pe->nratio++] = s.span_s / s.plan_span_s;
    pe->step_s[pe->ntimes] = s.step_s, pe->span_s[pe->ntimes++] = s.span_s;
    *out = (app_step_out){ .loss = s.loss, .step_s = s.step_s, .grad_norm = s.grad_norm,
                           .skipped = s.skipped, .has_bubble = 1, .bubble = s.bubble,
                           .plan_bubble = s.plan_bubble };
    out->mismatch = pe->ref ? check_step(pe, step, s.loss) : 0;
    return SP_OK;
}

/* Forward only through the pipeline, checked against the reference's under --check. */
static sp_status pipe_eval(app_engine *e, int step, float *loss, int *mismatch)
{
    pipe_engine *pe = (pipe_engine *)e;
    float want = 0;
    *mismatch = 0;
    sp_status st = sp_trainer_eval(pe->t, (const void *const *)e->ev, loss);
    if (st != SP_OK) {
        if (!sp_exec_usable()) /* lost on this rank only: it ends them all */
            sp_exec_abort(1, "%s: error in the evaluation after step %d: %s", e->m->name, step,
                          sp_last_error());
        return st;
    }
    if (pe->ref && app_ref_eval(pe->ref, e->K, (const void *const *)e->ev, &want) != SP_OK) {
        snprintf(e->msg, sizeof e->msg, "reference: %s", sp_last_error());
        *mismatch = 1;
    } else if (pe->ref && (pe->tol > 0 ? !(fabs(want - *loss) <= pe->tol * (1 + fabs(want)))
                                       : memcmp(&want, loss, 4) != 0)) {
        snprintf(e->msg, sizeof e->msg, "the evaluation after step %d differs from the "
                 "reference: loss %.9g vs reference %.9g", step, *loss, want);
        *mismatch = 1;
    }
    return SP_OK;
}

static sp_status pipe_load(app_engine *e, const char *path, const char *sig, int *start)
{
    pipe_engine *pe = (pipe_engine *)e;
    ckpt_io rio = pe->ref ? app_ref_io(pe->ref, 0) : e->io;
    rio.layout = e->m->ckpt_layout, rio.layout_ctx = e->m->cfg;
    const sp_graph *rg = pe->ref ? app_ref_graph(pe->ref, 0) : NULL;
    sp_status st;
    if (!start) {
        st = ckpt_load_values(path, e->g, &e->io);
        if (st == SP_OK && pe->ref) st = ckpt_load_values(path, rg, &rio);
        return st;
    }
    int rstart = 0;
    st = ckpt_load(path, e->g, sig, start, &e->io);
    if (st == SP_OK && pe->ref) st = ckpt_load(path, rg, sig, &rstart, &rio);
    if (st != SP_OK) return st;
    sp_trainer_set_steps_done(pe->t, *start);
    if (pe->ref) app_ref_set_steps_done(pe->ref, *start);
    return SP_OK;
}

static int pipe_stop(app_engine *e, int step)
{
    double v = app_stop_requested() != 0;
    if (sp_exec_allreduce_sum(&v, 1, 1) != SP_OK)
        sp_exec_abort(1, "%s: error at step %d: %s", e->m->name, step, sp_last_error());
    return v > 0 ? e->o->save_on_signal : 0;
}

/* What --profile and --calibrate need of the run. */
static app_profile_run profile_run(pipe_engine *pe)
{
    app_engine *e = &pe->e;
    return (app_profile_run){ .app = e->m->name, .command = pe->command, .p = pe->p,
                              .t = pe->t, .schedule = pe->sch->name, .replicas = e->R,
                              .tensor = e->T, .sharded = e->o->shard_optimizer,
                              .bf16 = e->o->bf16 };
}

static int pipe_describe(app_engine *e)
{
    pipe_engine *pe = (pipe_engine *)e;
    int verbose = e->env->verbose;
    if (pe->calib) { /* every rank predicts (the same numbers), rank 0 says */
        app_profile_run r = profile_run(pe);
        sp_status st = app_predict(pe->calib, &r, &pe->pred);
        pe->predicted = st == SP_OK;
        if (any_failed(st != SP_OK, e->m->name, sp_last_error())) return 1;
    }
    if (pe->me == 0) {
        if (pe->cut_why[0]) fputs(pe->cut_why, stdout);
        if (pe->auto_sched) fputs(pe->auto_why, stdout);
        if (e->cuda) printf("transfers: %s\n", sp_trainer_notice(pe->t));
        if (verbose >= 1) app_describe_plan(sp_trainer_plan(pe->t), pe->p, verbose);
        if (verbose >= 1 && e->R > 1) app_describe_layout(&pe->lay);
        fflush(stdout);
    }
    return verbose >= 1 && e->R > 1 && app_describe_memory(pe->t, pe->p, e->R,
                                                          e->o->shard_optimizer);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int pipe_finish(app_engine *e)
{
    pipe_engine *pe = (pipe_engine *)e;
    const char *trace = e->env->trace;
    if (trace && e->o->steps > 0) {
        char svg[4096];
        snprintf(svg, sizeof svg, "%s.svg", trace);
        sp_status st = sp_trainer_write_timeline(pe->t, trace, svg);
        if (any_failed(st != SP_OK, e->m->name, sp_last_error())) return 1;
    }
    size_t k = 0;
    if (pe->nratio > 0) {
        /* the first step allocates buffers: leave it out when there are others */
        int skip = pe->nratio > 1;
        qsort(pe->bound_ratio + skip, (size_t)(pe->nratio - skip), sizeof *pe->bound_ratio,
              cmp_double);
        k = (size_t)snprintf(e->tail, sizeof e->tail, "pipeline: %.2fx the schedule's bound "
                             "(median step; the bound replays the plan with the run's own "
                             "task times and instant messages)\n",
                             pe->bound_ratio[skip + (pe->nratio - skip) / 2]);
    }
    if (trace && e->o->steps > 0 && k < sizeof e->tail)
        k += (size_t)snprintf(e->tail + k, sizeof e->tail - k, "trace of the last step: %s "
                              "(open in https://ui.perfetto.dev), picture: %s.svg\n", trace,
                              trace);
    app_profile_run r = profile_run(pe);
    if (pe->predicted && k < sizeof e->tail &&
        any_failed(app_predict_report(&pe->pred, &r, pe->step_s, pe->ntimes, e->tail + k,
                                      sizeof e->tail - k), e->m->name, "out of memory"))
        return 1;
    k = strlen(e->tail);
    if (e->o->profile) {
        char msg[SP_ERROR_MAX + 64] = "";
        if (any_failed(app_profile_write(e->o->profile, &r, pe->step_s, pe->span_s, pe->ntimes,
                                         msg, sizeof msg), e->m->name, msg))
            return 1;
        if (k < sizeof e->tail)
            snprintf(e->tail + k, sizeof e->tail - k, "profile: %s (the cost model of this "
                     "machine: --calibrate, starpipe-plan --calibrate)\n", e->o->profile);
    }
    return 0;
}

static int pipe_end(app_engine *e, int code)
{
    pipe_engine *pe = (pipe_engine *)e;
    const char *name = e->m->name;
    if (code == 0 && e->env->verbose >= 1 && e->o->steps > 0)
        app_describe_use(pe->t, pe->p, pe->actor, pe->last_step, pe->dev_buffers);
    app_inputs_free(e->ev, e->K, pe->p);
    free(pe->bound_ratio), free(pe->step_s), free(pe->span_s);
    sp_prediction_free(&pe->pred);
    sp_profile_free(pe->calib);
    if (pe->sch) app_inputs_free(e->in, e->R * pe->sch->nmicro, pe->p);
    app_ref_free(pe->ref);
    sp_trainer_free(pe->t);
    sp_program_free(pe->p);
    sp_graph_free(pe->g);
    sp_schedule_free(pe->sch);
    free(pe);
    /* a peer gone after the last step fails the shutdown's barrier (under a watchdog): a
     * run that had succeeded must not exit 0 and leave the job hanging */
    if (sp_exec_shutdown() != SP_OK && code == 0 && sp_exec_size() > 1)
        sp_exec_abort(1, "%s: %s", name, sp_last_error());
    return code;
}

static const app_engine_ops pipe_ops = {
    .step = pipe_step, .eval = pipe_eval, .load = pipe_load, .agree = pipe_agree,
    .stop = pipe_stop, .describe = pipe_describe, .finish = pipe_finish, .end = pipe_end,
};

/* ---- start-up: StarPU and MPI, the checks every rank agrees on, the trainer ---- */

/* What may stop the run once MPI runs, before the trainer: the layout, the schedule and
 * the flags and variables that name its stages, the outputs, the data. 1 with msg. */
static int check_run(pipe_engine *pe, const sp_app_opts *o, const sp_env *env, char *msg,
                     size_t len)
{
    app_engine *e = &pe->e;
    sp_app_model *m = e->m;
    int P = sp_exec_size(), replica = 0;
    if (sp_layout_from_env(P, o->replicas, o->actors, o->tensor, o->rank_order, &pe->lay)) {
        snprintf(msg, len, "%s", sp_last_error());
        return 1;
    }
    e->R = pe->lay.replicas, P = pe->lay.actors, e->T = sp_layout_tensor(&pe->lay);
    sp_layout_place_t(&pe->lay, pe->me, &replica, &pe->actor, &pe->trank);
    if (o->shard_optimizer && e->R == 1) {
        snprintf(msg, len, "--shard-optimizer needs --replicas R > 1");
        return 1;
    }
    const char *name = o->schedule ? o->schedule : env->schedule;
    pe->auto_sched = name && !strcmp(name, "auto");
    if (pe->auto_sched && (o->chunks > 1 || (!o->chunks && env->chunks > 1))) {
        snprintf(msg, len, "schedule auto places one stage per actor: no --chunks (or "
                 "STARPIPE_CHUNKS) above 1");
        return 1;
    }
    if (o->memory_cap && !pe->auto_sched) {
        snprintf(msg, len, "--memory-cap caps the schedule auto's activations: it needs "
                 "--schedule auto");
        return 1;
    }
    if (sp_schedule_from_env(pe->auto_sched ? "zb-h1" : o->schedule, P, o->microbatches,
                             pe->auto_sched ? 1 : o->chunks, &pe->sch) != SP_OK) {
        snprintf(msg, len, "%s", sp_last_error());
        return 1;
    }
    e->sch = pe->sch;
    for (int k = 0; k < o->nrecompute; k++)
        if (o->recompute_stages[k] >= pe->sch->nstages) {
            snprintf(msg, len, "--recompute-stages: there is no stage %d (the schedule has %d "
                     "stages)", o->recompute_stages[k], pe->sch->nstages);
            return 1;
        }
    if ((env->fault.kind == SP_FAULT_FAIL || env->fault.kind == SP_FAULT_HANG) &&
        env->fault.stage >= pe->sch->nstages) {
        snprintf(msg, len, "STARPIPE_FAULT=%s@%d:%d: there is no stage %d (the schedule has "
                 "%d stages)", env->fault.kind == SP_FAULT_FAIL ? "fail" : "hang",
                 env->fault.step, env->fault.stage, env->fault.stage, pe->sch->nstages);
        return 1;
    }
    /* rank 0 writes checkpoints, dumps and traces: it checks them now, before step 1 */
    if ((pe->me == 0 && app_check_run_outputs(m, o, env->trace) != SP_OK) ||
        app_check_data(m, o) != SP_OK) {
        snprintf(msg, len, "%s", sp_last_error());
        return 1;
    }
    if (o->profile && o->steps < 2) {
        snprintf(msg, len, "--profile needs --steps 2 or more: the first step (first touches, "
                 "lazy loading) is left out of what it measures");
        return 1;
    }
    sp_status st = SP_OK;
    if (o->calibrate && !(pe->calib = sp_profile_read(o->calibrate, &st))) {
        snprintf(msg, len, "--calibrate: %s", sp_last_error());
        return 1;
    }
    if (pe->calib && o->link_bw > 0) sp_profile_set_link(pe->calib, o->link_lat, o->link_bw);
    if (m->prepare(m->cfg, &e->samples, msg, len) || app_hold_out(m, o, msg, len) ||
        app_check_sample(m, o, msg, len))
        return 1;
    return pe->me == 0 && app_scan_data(m, env->verbose, msg, len); /* one reader of the data */
}

/* --schedule auto's other cut: this rank's member of the model in nstages stages. */
static sp_program *cut_program(void *ctx, int nstages, sp_graph **g, sp_status *st)
{
    pipe_engine *pe = ctx;
    app_engine *e = &pe->e;
    int cut[1026];
    if (nstages <= 1024) app_balanced_cut(e->m, e->o, nstages, e->T, pe->trank, pe->calib, cut,
                                          NULL, 0);
    *g = e->m->build(e->m->cfg, nstages, e->T, pe->trank, st);
    return *g ? app_program(*g, e->o, 1, st) : NULL;
}

/* The trainer of this rank's member and what a step needs beside it: the inputs, the
 * held-out ones, --check's reference. Collective: -1 on every rank when the device's
 * memory is short (said); 1 with msg when this rank failed, for the ranks to agree on. */
static int build(pipe_engine *pe, const sp_adamw_config *opt, char *msg, size_t len)
{
    app_engine *e = &pe->e;
    sp_app_model *m = e->m;
    const sp_app_opts *o = e->o;
    int nmb = pe->sch->nmicro;
    e->K = o->eval_every ? (o->eval_batches ? o->eval_batches : e->R * nmb) : 0;
    sp_train_opts to = { .opt = *opt, .seed = (uint64_t)o->seed, .trace = 1, .replicas = e->R,
                         .profile = o->profile != NULL,
                         .rank_order = pe->lay.order, .shard_optimizer = o->shard_optimizer,
                         .eval_microbatches = e->K, .tensor = e->T };
    sp_status st = SP_OK;
    int cut[1026];
    if (pe->sch->nstages <= 1024)
        app_balanced_cut(m, o, pe->sch->nstages, e->T, pe->trank, pe->calib, cut, pe->cut_why,
                         sizeof pe->cut_why);
    pe->g = m->build(m->cfg, pe->sch->nstages, e->T, pe->trank, &st); /* this rank's member */
    pe->p = pe->g ? app_program(pe->g, o, 1, &st) : NULL;
    e->g = pe->g, e->p = pe->p;
    /* collective: every rank takes part, with a GPU or not */
    if (any_failed(app_device_memory_short(m, o, pe->p, pe->sch, &pe->lay, e->K, e->env->verbose,
                                           &pe->dev_buffers, msg, len), m->name, msg))
        return -1;
    if (pe->p && pe->auto_sched) { /* collective: the probe's steps, rank 0's choice */
        sp_schedule *a = NULL;
        int chain_only = o->nrecompute > 0 || sp_app_given(m, o, "--stage-layers");
        if (app_auto_schedule(pe->p, cut_program, pe, pe->sch, &to, e->R, pe->calib,
                              o->memory_cap, chain_only, &a, pe->auto_why,
                              sizeof pe->auto_why) != SP_OK) {
            snprintf(msg, len, "schedule auto: %s", sp_last_error());
            return 1;
        }
        sp_schedule_free(pe->sch);
        e->sch = pe->sch = a;
        /* the cut of the stages that run (auto's candidates set others), which --check's
         * reference is built with too */
        if (a->nstages <= 1024)
            app_balanced_cut(m, o, a->nstages, e->T, pe->trank, pe->calib, cut, pe->cut_why,
                             sizeof pe->cut_why);
        if (a->nstages != sp_program_num_stages(pe->p)) { /* two stages per actor */
            sp_program_free(pe->p);
            sp_graph_free(pe->g);
            pe->g = m->build(m->cfg, a->nstages, e->T, pe->trank, &st);
            pe->p = pe->g ? app_program(pe->g, o, 1, &st) : NULL;
            e->g = pe->g, e->p = pe->p;
        }
    }
    pe->t = pe->p ? sp_trainer_create(pe->p, pe->sch, &to, &st) : NULL;
    e->in = pe->t ? app_inputs_alloc(pe->p, e->R * nmb) : NULL;
    if (e->in && e->K && !(e->ev = app_eval_inputs(m, o, pe->p, e->K)))
        e->in = (app_inputs_free(e->in, e->R * nmb, pe->p), NULL);
    /* the reference runs a program of its own: every activation in fp32 */
    if (pe->t && o->check)
        pe->ref = app_ref_create(m, o, pe->sch->nstages, e->T, nmb, e->R, opt, &st);
    pe->bound_ratio = calloc((size_t)o->steps + 1, sizeof *pe->bound_ratio);
    pe->step_s = calloc((size_t)o->steps + 1, sizeof *pe->step_s);
    pe->span_s = calloc((size_t)o->steps + 1, sizeof *pe->span_s);
    if (!e->in || (o->check && !pe->ref) || !pe->bound_ratio || !pe->step_s || !pe->span_s) {
        snprintf(msg, len, "%s", st ? sp_last_error() : "out of memory");
        return 1;
    }
    return 0;
}

/* The banner's first line and --check's notes. */
static void describe_run(pipe_engine *pe)
{
    app_engine *e = &pe->e;
    const sp_app_opts *o = e->o;
    char reps[128] = "";
    int k = 0;
    if (e->T > 1) k = snprintf(reps, sizeof reps, " of %d ranks (tensor parallelism)", e->T);
    if (e->R > 1)
        snprintf(reps + k, sizeof reps - (size_t)k, " x %d replicas (%s-major ranks%s)", e->R,
                 sp_rank_order_name(pe->lay.order), o->shard_optimizer ? ", sharded AdamW" : "");
    const char *checked = !o->check ? ""
                        : pe->tol > 0 ? (o->bf16 ? ", checked against the reference within 2e-2"
                                                 : ", checked against the reference within 1e-4")
                                      : ", checked against the reference";
    snprintf(e->head, sizeof e->head, "%s: %d actors%s, schedule %s, %d stages, %d "
             "microbatches, %s%s%s", e->m->name, pe->lay.actors, reps, pe->sch->name,
             pe->sch->nstages, pe->sch->nmicro,
             e->cuda ? "CUDA" : sp_exec_device() ? sp_exec_device()->name : "CPU",
             o->bf16 ? ", bf16 matmuls" : "", checked);
    if (!o->check) return;
    e->same_note = pe->tol > 0 ? "  (~ reference)" : "  (= reference)";
    e->done_note = pe->tol > 0 ? (o->bf16 ? ", every step within 2e-2 of the reference"
                                          : ", every step within 1e-4 of the reference")
                               : ", every step bitwise equal to the reference";
}

app_engine *app_engine_pipelined(int argc, char **argv, sp_app_model *m, const sp_app_opts *o,
                                 const sp_env *env, const sp_adamw_config *opt, int *code)
{
    char msg[SP_ERROR_MAX + 64] = "";
    /* a run that cannot fit says so before StarPU and MPI start; every rank sees the
     * same sizes, and one per machine prints */
    /* a layout that does not fit the ranks is reported once MPI runs, by the ranks in
     * agreement (a rank exiting first could take rank 0's message with it) */
    sp_layout lay;
    int fits = sp_layout_from_env(sp_app_launcher_size(), o->replicas, o->actors, o->tensor,
                                  o->rank_order, &lay) == SP_OK;
    if (fits && app_preflight(m, o, lay.actors, lay.replicas, sp_layout_tensor(&lay), 0, msg,
                              sizeof msg)) {
        if (sp_app_launcher_local_rank() == 0) fprintf(stderr, "%s: error: %s\n", m->name, msg);
        *code = 2;
        return NULL;
    }
    /* MFU's CPU peak: one core's FMA peak, timed before StarPU's workers and MPI's progress
     * thread start (a CUDA run does not use it) */
    app_peak cpu_peak = { 0 };
    if (o->steps > 0 && o->peak_tflops <= 0 && sp_app_launcher_rank() == 0) app_peak_cpu(&cpu_peak);
    sp_exec_opts eo = { .trace = 1, .watchdog_s = env->step_timeout, .verbose = env->verbose >= 1 };
    if (sp_exec_init(&argc, &argv, &eo) != SP_OK) {
        if (sp_app_launcher_rank() == 0)
            fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
        *code = 1;
        return NULL;
    }
    pipe_engine *pe = calloc(1, sizeof *pe);
    if (!pe) sp_exec_abort(1, "out of memory");
    app_engine *e = &pe->e;
    *e = (app_engine){ .ops = &pipe_ops, .m = m, .o = o, .env = env, .R = 1, .T = 1,
                       .cpu_peak = cpu_peak, .done_note = "", .per_step_ms = 1 };
    pe->me = sp_exec_rank();
    e->speaks = pe->me == 0;
    for (int i = 0, k = 0; i < argc && k < (int)sizeof pe->command - 1; i++)
        k += snprintf(pe->command + k, sizeof pe->command - (size_t)k, "%s%s", i ? " " : "",
                      argv[i]);
    for (char *c = pe->command; *c; c++) /* one line in the profile */
        if (*c == '\n' || *c == '\r') *c = ' ';
    /* creating the trainer is collective (the NCCL bootstrap): agree first, so that a
     * rank that found bad input does not leave the others in a collective of their own */
    int bad = any_failed(check_run(pe, o, env, msg, sizeof msg), m->name, msg) ? -1 : 0;
    if (!bad) bad = build(pe, opt, msg, sizeof msg);
    if (bad < 0 || any_failed(bad, m->name, msg)) { /* -1: agreed already */
        *code = pipe_end(e, 1);
        return NULL;
    }
    /* a GPU run is checked against the CPU reference within a tolerance, not bitwise; a
     * device whose kernels are the CPU's (the test device) bitwise */
    /* (bf16: a float near a bfloat16 rounding boundary falls on either side depending on
     * the order of summation, and AdamW turns a tiny gradient of the other sign into a
     * step of the other sign: 2e-2 per float; tests/gpu/emu checks bf16 by L2 norm) */
    e->cuda = sp_exec_num_cuda() > 0;
    const sp_device_kind *dk = sp_exec_device();
    pe->tol = dk && !dk->cpu_bits ? (o->bf16 ? 2e-2 : 1e-4) : 0.0;
    e->ranks = sp_exec_size(), e->local = sp_app_launcher_local_size();
    e->io = (ckpt_io){ .ctx = pe->t, .get = tr_get, .set = tr_set, .writer = pe->me == 0,
                       .layout = m->ckpt_layout, .layout_ctx = m->cfg };
    describe_run(pe);
    return e;
}
