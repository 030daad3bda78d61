/* The training driver behind starpipe-gpt and starpipe-mlp (see driver.h).
 * Errors: before MPI starts every rank parses the same argv, so only rank 0 prints and
 * every rank exits 2. After, a failure seen by some ranks is agreed on (one allreduce),
 * the lowest failing rank prints, and every rank shuts down and exits non-zero. */
#include "apps/driver.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "apps/checkpoint.h"
#include "apps/options.h"
#include "starpipe/exec.h"
#include "starpipe/plan.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"
#include "starpipe/train.h"



static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Per-step inputs: [mb * ninputs + k], each sized by the program. */
static void **alloc_inputs(const sp_program *p, int m)
{
    int nin = sp_program_num_inputs(p);
    void **in = calloc((size_t)m * nin, sizeof *in);
    for (int i = 0; in && i < m * nin; i++)
        if (!(in[i] = malloc(sp_program_buf_bytes(p, SP_SLAB_INPUT, i % nin) + 4))) return NULL;
    return in;
}

static void fill_inputs(sp_app_model *m, const sp_app_opts *o, const sp_program *p, int nmb,
                        int step, void **in)
{
    int nin = sp_program_num_inputs(p);
    for (int i = 0; i < nmb; i++) m->batch(m->cfg, (uint64_t)o->seed, step, i, in + (size_t)i * nin);
    /* STARPIPE_FAULT=nan@STEP: a NaN in microbatch 0's first float input */
    const char *fault = getenv("STARPIPE_FAULT");
    int at;
    if (fault && sscanf(fault, "nan@%d", &at) == 1 && at == step)
        for (int k = 0; k < nin; k++)
            if (sp_tensor_dtype(sp_program_graph(p), sp_program_input(p, k)) == SP_F32) {
                ((float *)in[k])[0] = NAN;
                break;
            }
}

/* ---- checkpoint access to the reference and to the trainer ---- */
static sp_status ref_get(void *ctx, sp_tensor p, int what, float *dst)
{
    const sp_reference *r = ctx;
    const float *src = what == 0 ? sp_reference_param(r, p) : what == 1 ? sp_reference_grad(r, p)
                                 : sp_reference_param_moment(r, p, what - 2);
    if (!src) return sp_set_error(SP_ERR_ARG, "reference: no such parameter");
    memcpy(dst, src, (size_t)sp_tensor_numel(sp_program_graph(sp_reference_program(r)), p) * sizeof(float));
    return SP_OK;
}
static sp_status ref_set(void *ctx, sp_tensor p, int what, const float *src)
{
    return sp_reference_store(ctx, p, what, src);
}
static sp_status tr_get(void *ctx, sp_tensor p, int what, float *dst)
{
    return sp_trainer_fetch(ctx, p, what, dst);
}
static sp_status tr_set(void *ctx, sp_tensor p, int what, const float *src)
{
    return sp_trainer_store(ctx, p, what, src);
}

/* ---- the reference interpreter alone ---- */
static int run_reference(sp_app_model *m, const sp_app_opts *o, sp_adamw_config *opt)
{
    sp_schedule *sch = NULL;
    char msg[512];
    double samples = 0;
    if (sp_schedule_from_env(o->schedule, o->actors ? o->actors : 1, o->microbatches, o->chunks,
                             &sch) != SP_OK) {
        fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
        return 2;
    }
    if (m->prepare(m->cfg, &samples, msg, sizeof msg)) {
        fprintf(stderr, "%s: error: %s\n", m->name, msg);
        return 1;
    }
    sp_status st;
    int nmb = sch->nmicro;
    sp_graph *g = m->build(m->cfg, sch->nstages, &st);
    sp_program *p = g ? sp_program_build(g, &st) : NULL;
    sp_reference *r = p ? sp_reference_create(p, nmb, opt, (uint64_t)o->seed, &st) : NULL;
    void **in = p ? alloc_inputs(p, nmb) : NULL;
    if (!r || !in) {
        fprintf(stderr, "%s: error: %s\n", m->name, st ? sp_last_error() : "out of memory");
        return 1;
    }
    char sig[256];
    m->signature(m->cfg, sig, sizeof sig);
    ckpt_io io = { .ctx = r, .get = ref_get, .set = ref_set, .writer = 1 };
    int start = 0;
    if (o->load) {
        if (ckpt_load(o->load, g, sig, &start, &io) != SP_OK) {
            fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
            return 1;
        }
        sp_reference_set_steps_done(r, start);
    }
    printf("%s: reference interpreter, %d stages, %d microbatches\n", m->name, sch->nstages, nmb);
    if (m->describe) m->describe(m->cfg, stdout);
    if (o->load) printf("resumed from %s after step %d\n", o->load, start);
    fflush(stdout);
    double t_start = now();
    float first = 0, last = 0;
    for (int step = start + 1; step <= start + o->steps; step++) {
        fill_inputs(m, o, p, nmb, step, in);
        double t0 = now();
        float loss;
        if (sp_reference_step(r, (const void *const *)in, &loss) != SP_OK) {
            fprintf(stderr, "%s: error at step %d: %s\n", m->name, step, sp_last_error());
            return 1;
        }
        double dt = now() - t0;
        if (step == start + 1) first = loss;
        last = loss;
        printf("step %d loss %.6f  %.0f %s/s  %.1f ms%s\n", step, loss, samples * nmb / dt,
               m->sample_unit, 1e3 * dt,
               sp_reference_last_skipped(r) ? "  update skipped: non-finite loss or gradients" : "");
        fflush(stdout);
        sp_status cst = SP_OK;
        if (o->dump_grads && step == start + 1)
            cst = ckpt_dump_grads(o->dump_grads, g, sig, step, &io);
        if (cst == SP_OK && o->save && (step == start + o->steps ||
                                        (o->save_every && step % o->save_every == 0)))
            cst = ckpt_save(o->save, g, sig, step, &io);
        if (cst != SP_OK) {
            fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
            return 1;
        }
    }
    printf("done: %d steps in %.1f s, loss %.6f -> %.6f\n", o->steps, now() - t_start, first, last);
    for (int i = 0; i < nmb * sp_program_num_inputs(p); i++) free(in[i]);
    free(in);
    sp_reference_free(r);
    sp_program_free(p);
    sp_graph_free(g);
    sp_schedule_free(sch);
    return 0;
}

/* STARPIPE_VERBOSE=1: what the planner predicts, per actor; 2 adds every instruction. */
static void describe_plan(const sp_plan *pl, const sp_stage_model *model)
{
    sp_sim_result *r = NULL;
    sp_sim_config cfg = { 0 };
    int simulated = sp_simulate(pl, model, &cfg, &r) == SP_OK;
    printf("plan: %d tasks, %lld messages per step; with FLOP-proportional task times the "
           "simulated bubble is %.1f%%\n", pl->ntasks, (long long)pl->nmessages,
           simulated ? 100 * r->bubble_fraction : 0.0);
    for (int a = 0; a < pl->nactors; a++)
        printf("  actor %d: %d instructions, peak %.2f MiB (activations %.2f, boundary %.2f, "
               "parameters %.2f, %d stage activations live)\n", a, pl->ninstr[a],
               pl->peak[a].total / 1048576.0, pl->peak[a].acts / 1048576.0,
               pl->peak[a].boundary / 1048576.0, pl->peak[a].params / 1048576.0,
               pl->peak[a].act_units);
    if (simulated) sp_sim_result_free(r);
    const char *v = getenv("STARPIPE_VERBOSE");
    if (v && atoi(v) >= 2) sp_plan_write(pl, stdout);
}

/* ---- the pipelined run ---- */

static int nmb_or_zero(const sp_schedule *s) { return s ? s->nmicro : 0; }

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

/* This rank's stages against the reference: the count of differing floats. tol 0 asks
 * for identical bits (the CPU kernels are the reference's); on a GPU, other kernels sum
 * in other orders, so a float differs when |a - b| > tol (1 + |b|). */
static double compare_with_reference(sp_trainer *t, sp_reference *r, const sp_program *p,
                                     double tol, char *where, size_t len)
{
    double bad = 0;
    const char *names[4] = { "parameters", "gradients", "AdamW m", "AdamW v" };
    for (int s = 0; s < sp_program_num_stages(p); s++) {
        if (!sp_trainer_owns_stage(t, s)) continue;
        size_t n = sp_program_buf_bytes(p, SP_SLAB_PARAMS, s) / 4;
        const float *mine[4] = { sp_trainer_slab(t, SP_SLAB_PARAMS, s),
                                 sp_trainer_slab(t, SP_SLAB_GRADS, s),
                                 sp_trainer_moment(t, 0, s), sp_trainer_moment(t, 1, s) };
        const float *ref[4] = { sp_reference_slab(r, SP_SLAB_PARAMS, s),
                                sp_reference_slab(r, SP_SLAB_GRADS, s),
                                sp_reference_moment(r, 0, s), sp_reference_moment(r, 1, s) };
        for (int k = 0; k < 4; k++) {
            if (!mine[k] || !ref[k]) continue;
            size_t diff = 0;
            for (size_t j = 0; j < n; j++)
                diff += tol > 0 ? !(fabs(mine[k][j] - ref[k][j]) <= tol * (1 + fabs(ref[k][j])))
                                : memcmp(&mine[k][j], &ref[k][j], 4) != 0;
            if (diff && bad == 0) snprintf(where, len, "%s of stage %d (%zu of %zu floats)",
                                           names[k], s, diff, n);
            bad += (double)diff;
        }
    }
    return bad;
}

static int run_pipelined(int argc, char **argv, sp_app_model *m, const sp_app_opts *o,
                         sp_adamw_config *opt)
{
    const char *trace_path = getenv("STARPIPE_TRACE");
    const char *timeout = getenv("STARPIPE_STEP_TIMEOUT");
    const char *verbose_env = getenv("STARPIPE_VERBOSE");
    int verbose = verbose_env ? atoi(verbose_env) : 0;
    sp_exec_opts eo = { .trace = 1, .watchdog_s = timeout ? atof(timeout) : 0,
                        .verbose = verbose >= 1 };
    if (sp_exec_init(&argc, &argv, &eo) != SP_OK) {
        if (sp_app_launcher_rank() == 0) fprintf(stderr, "%s: error: %s\n", m->name, sp_last_error());
        return 1;
    }
    int me = sp_exec_rank(), P = sp_exec_size();
    char msg[1024] = "";
    int bad = 0;
    sp_schedule *sch = NULL;
    if (o->actors && o->actors != P) {
        snprintf(msg, sizeof msg, "--actors %d but %d MPI ranks are running (mpirun -np %d)",
                 o->actors, P, o->actors);
        bad = 1;
    } else if (sp_schedule_from_env(o->schedule, P, o->microbatches, o->chunks, &sch) != SP_OK) {
        snprintf(msg, sizeof msg, "%s", sp_last_error());
        bad = 1;
    }
    double samples = 0;
    if (!bad && m->prepare(m->cfg, &samples, msg, sizeof msg)) bad = 1;
    sp_status st = SP_OK;
    sp_graph *g = NULL;
    sp_program *p = NULL;
    sp_trainer *t = NULL;
    sp_reference *ref = NULL;
    void **in = NULL;
    if (!bad) {
        sp_train_opts to = { .opt = *opt, .seed = (uint64_t)o->seed, .trace = 1 };
        g = m->build(m->cfg, sch->nstages, &st);
        p = g ? sp_program_build(g, &st) : NULL;
        t = p ? sp_trainer_create(p, sch, &to, &st) : NULL;
        in = t ? alloc_inputs(p, sch->nmicro) : NULL;
        if (t && o->check) ref = sp_reference_create(p, sch->nmicro, opt, (uint64_t)o->seed, &st);
        if (!in || (o->check && !ref)) {
            snprintf(msg, sizeof msg, "%s", st ? sp_last_error() : "out of memory");
            bad = 1;
        }
    }
    int code = 0;
    double *bound_ratio = NULL;
    if (any_failed(bad, m->name, msg)) {
        code = 1;
        goto out;
    }
    int nmb = sch->nmicro;
    /* a GPU run is checked against the CPU reference within a tolerance, not bitwise */
    double tol = sp_exec_num_cuda() > 0 ? 1e-4 : 0.0;
    char sig[256];
    m->signature(m->cfg, sig, sizeof sig);
    ckpt_io io = { .ctx = t, .get = tr_get, .set = tr_set, .writer = me == 0 };
    int start = 0;
    if (o->load) {
        int rstart = 0;
        st = ckpt_load(o->load, g, sig, &start, &io);
        if (st == SP_OK && ref)
            st = ckpt_load(o->load, g, sig, &rstart,
                           &(ckpt_io){ .ctx = ref, .get = ref_get, .set = ref_set });
        if (any_failed(st != SP_OK, m->name, sp_last_error())) {
            code = 1;
            goto out;
        }
        sp_trainer_set_steps_done(t, start);
        if (ref) sp_reference_set_steps_done(ref, start);
    }
    if (me == 0) {
        printf("%s: %d actors, schedule %s, %d stages, %d microbatches, %s%s\n", m->name, P,
               sch->name, sch->nstages, nmb,
               sp_exec_num_cuda() > 0 ? "CUDA" : "CPU",
               !o->check ? "" : tol > 0 ? ", checked against the reference within 1e-4"
                                        : ", checked against the reference");
        if (m->describe) m->describe(m->cfg, stdout);
        if (sp_exec_num_cuda() > 0) printf("transfers: %s\n", sp_trainer_notice(t));
        if (verbose >= 1) describe_plan(sp_trainer_plan(t), sp_program_stage_model(p));
        if (o->load) printf("resumed from %s after step %d\n", o->load, start);
        fflush(stdout);
    }
    double t_start = now(), busy_steps = 0;
    float first = 0, last = 0;
    /* each step's pipeline span over what its schedule allows with the same tasks */
    bound_ratio = calloc((size_t)o->steps + 1, sizeof *bound_ratio);
    int nratio = 0;
    if (any_failed(!bound_ratio, m->name, "out of memory")) {
        code = 1;
        goto out;
    }
    for (int step = start + 1; step <= start + o->steps; step++) {
        fill_inputs(m, o, p, nmb, step, in);
        sp_step_stats stats;
        if (sp_trainer_step(t, (const void *const *)in, &stats) != SP_OK) {
            /* lost on this rank only (watchdog, submission): its peers may be waiting for
             * it, so this rank ends them all with its own message */
            if (!sp_exec_usable())
                sp_exec_abort(1, "%s: error at step %d: %s", m->name, step, sp_last_error());
            if (me == 0) fprintf(stderr, "%s: error at step %d: %s\n", m->name, step, sp_last_error());
            code = 1;
            goto out;
        }
        if (step == start + 1) first = stats.loss;
        last = stats.loss;
        busy_steps += stats.step_s;
        if (stats.plan_span_s > 0) bound_ratio[nratio++] = stats.span_s / stats.plan_span_s;
        char where[256] = "";
        double mismatch = 0;
        float ref_loss = 0;
        if (ref) {
            if (sp_reference_step(ref, (const void *const *)in, &ref_loss) != SP_OK) {
                snprintf(msg, sizeof msg, "reference: %s", sp_last_error());
                mismatch = 1;
            } else {
                mismatch = compare_with_reference(t, ref, p, tol, where, sizeof where);
                if (tol > 0 ? !(fabs(ref_loss - stats.loss) <= tol * (1 + fabs(ref_loss)))
                            : memcmp(&ref_loss, &stats.loss, 4) != 0) {
                    snprintf(where, sizeof where, "loss %.9g vs reference %.9g", stats.loss,
                             ref_loss);
                    mismatch += 1;
                }
                snprintf(msg, sizeof msg, "step %d differs from the reference: %s", step, where);
            }
        }
        if (me == 0) {
            printf("step %d loss %.6f  %.0f %s/s  %.1f ms  bubble %.1f%% (plan %.1f%%)%s%s\n",
                   step, stats.loss, samples * nmb / stats.step_s, m->sample_unit,
                   1e3 * stats.step_s, 100 * stats.bubble, 100 * stats.plan_bubble,
                   ref && !mismatch ? (tol > 0 ? "  (~ reference)" : "  (= reference)") : "",
                   stats.skipped ? "  update skipped: non-finite loss or gradients" : "");
            fflush(stdout);
        }
        if (ref && any_failed(mismatch > 0, m->name, msg)) {
            code = 1;
            goto out;
        }
        st = SP_OK;
        if (o->dump_grads && step == start + 1)
            st = ckpt_dump_grads(o->dump_grads, g, sig, step, &io);
        if (st == SP_OK && o->save && (step == start + o->steps ||
                                       (o->save_every && step % o->save_every == 0)))
            st = ckpt_save(o->save, g, sig, step, &io);
        if (any_failed(st != SP_OK, m->name, sp_last_error())) {
            code = 1;
            goto out;
        }
    }
    if (trace_path && o->steps > 0) {
        char svg[4096];
        snprintf(svg, sizeof svg, "%s.svg", trace_path);
        st = sp_trainer_write_timeline(t, trace_path, svg);
        if (any_failed(st != SP_OK, m->name, sp_last_error())) {
            code = 1;
            goto out;
        }
    }
    if (me == 0) {
        printf("done: %d steps in %.1f s (%.1f ms per step), loss %.6f -> %.6f%s\n", o->steps,
               now() - t_start, o->steps ? 1e3 * busy_steps / o->steps : 0.0, first, last,
               !ref ? "" : tol > 0 ? ", every step within 1e-4 of the reference"
                                   : ", every step bitwise equal to the reference");
        if (nratio > 0) {
            /* the first step allocates buffers: leave it out when there are others */
            int skip = nratio > 1;
            qsort(bound_ratio + skip, (size_t)(nratio - skip), sizeof *bound_ratio, cmp_double);
            printf("pipeline: %.2fx the schedule's bound (median step; the bound replays the "
                   "plan with the run's own task times and instant messages)\n",
                   bound_ratio[skip + (nratio - skip) / 2]);
        }
        if (trace_path && o->steps > 0)
            printf("trace of the last step: %s (open in https://ui.perfetto.dev), picture: %s.svg\n",
                   trace_path, trace_path);
        fflush(stdout);
    }
out:
    free(bound_ratio);
    for (int i = 0; in && i < nmb_or_zero(sch) * sp_program_num_inputs(p); i++) free(in[i]);
    free(in);
    sp_reference_free(ref);
    sp_trainer_free(t);
    sp_program_free(p);
    sp_graph_free(g);
    sp_schedule_free(sch);
    sp_exec_shutdown();
    return code;
}

int sp_app_main(int argc, char **argv, sp_app_model *m)
{
    sp_app_opts o;
    int r = sp_app_parse(argc, argv, m, &o);
    if (r <= 0) return r == 0 ? 0 : 2;
    const char *sched = o.schedule ? o.schedule : getenv("STARPIPE_SCHEDULE");
    if (sched && !strcmp(sched, "help")) {
        if (sp_app_launcher_rank() == 0) fputs(sp_schedule_help(), stdout);
        return 0;
    }
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    opt.lr = o.lr;
    opt.grad_clip = o.clip;
    opt.skip_nonfinite = o.skip_nonfinite;
    if (o.reference) return run_reference(m, &o, &opt);
    return run_pipelined(argc, argv, m, &o, &opt);
}
