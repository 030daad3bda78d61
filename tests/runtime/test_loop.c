/* The apps' step loop (apps/loop.c, app_run) driving a fake engine (apps/engine.h), no MPI:
 * which steps it runs and at which learning rates, when it evaluates (every N-th step and
 * the last, once for --steps 0), that it asks whether to stop only before the last step
 * and stops, saved, where a signal says, that a resume continues the loaded step, and
 * that every way out (a failed step, a mismatch agreed on) ends the engine once with the
 * run's exit code. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apps/checkpoint.h"
#include "apps/engine.h"
#include "starpipe/models.h"
#include "tests/check.h"

/* What the fake engine saw, and what it is told to do. */
typedef struct {
    app_engine e;
    int steps[64], nsteps;   /* the steps asked for */
    float lr[64];
    int evals[64], nevals;   /* the steps after which it evaluated */
    int stops[64], nstops;   /* the steps after which the loop asked whether to stop */
    int ends, end_code;
    /* scripted: */
    int fail_at, mismatch_at, stop_at, loaded_step;
} fake;

static sp_status f_step(app_engine *e, int step, float lr, app_step_out *out)
{
    fake *f = (fake *)e;
    f->lr[f->nsteps] = lr;
    f->steps[f->nsteps++] = step;
    if (step == f->fail_at)
        return sp_set_error(SP_ERR_RUNTIME, "(expected) failure, step %d", step);
    *out = (app_step_out){ .loss = 10.0f / (float)step, .step_s = 1e-3, .grad_norm = 1,
                           .mismatch = step == f->mismatch_at };
    if (out->mismatch) snprintf(e->msg, sizeof e->msg, "step %d differs", step);
    return SP_OK;
}

static sp_status f_eval(app_engine *e, int step, float *loss, int *mismatch)
{
    fake *f = (fake *)e;
    f->evals[f->nevals++] = step;
    *loss = 1.5f, *mismatch = 0;
    return SP_OK;
}

static sp_status f_load(app_engine *e, const char *path, const char *sig, int *start)
{
    if (start) *start = ((fake *)e)->loaded_step;
    return SP_OK;
}

static int f_agree(app_engine *e, int bad, const char *msg)
{
    if (bad) fprintf(stderr, "(expected) %s\n", msg);
    return bad;
}

static int f_stop(app_engine *e, int step)
{
    fake *f = (fake *)e;
    f->stops[f->nstops++] = step;
    return step == f->stop_at ? SIGUSR1 : 0;
}

static int f_end(app_engine *e, int code)
{
    fake *f = (fake *)e;
    f->ends++;
    f->end_code = code;
    return code;
}

static const app_engine_ops fake_ops = { .step = f_step, .eval = f_eval, .load = f_load,
                                         .agree = f_agree, .stop = f_stop, .end = f_end };

/* Checkpoints of the fake: every value 0.25. */
static sp_status f_get(void *ctx, sp_tensor p, int what, float *dst)
{
    const sp_graph *g = ctx;
    for (int64_t i = 0; i < sp_param_whole_numel(g, p); i++) dst[i] = 0.25f;
    return SP_OK;
}

static void f_signature(void *cfg, char *buf, size_t len) { snprintf(buf, len, "fake"); }
static void f_batch(void *cfg, uint64_t seed, int step, int mb, void *const *in) {}

static sp_app_model model = { .name = "test_loop", .sample_unit = "rows",
                              .signature = f_signature, .batch = f_batch };

/* One run of the loop on the fake, with the options o (same_note: --check's). */
static int run(fake *f, const sp_app_opts *o, const sp_graph *g, const sp_program *p,
               const sp_schedule *sch, const char *same_note)
{
    static void *in[64], *ev[64];
    int nin = sp_program_num_inputs(p);
    for (int i = 0; i < 4 * nin; i++)
        if (!in[i]) in[i] = calloc(1, sp_program_buf_bytes(p, SP_BUF_INPUT, i % nin) + 4);
    f->e = (app_engine){ .ops = &fake_ops, .m = &model, .o = o, .speaks = 1, .g = g, .p = p,
                         .sch = sch, .R = 1, .T = 1, .samples = 4, .in = in, .ev = ev, .K = 2,
                         .io = { .ctx = (void *)g, .get = f_get, .writer = 1 }, .ranks = 1,
                         .local = 1, .same_note = same_note, .done_note = "" };
    snprintf(f->e.head, sizeof f->e.head, "test_loop: a fake engine");
    static sp_env env;
    f->e.env = &env;
    return app_run(&f->e);
}

static sp_app_opts opts(int steps)
{
    return (sp_app_opts){ .steps = steps, .seed = 1, .lr = 1e-2f, .peak_tflops = 1 };
}

int main(void)
{
    sp_status st;
    sp_mlp_config mc = { .in_dim = 3, .width = 5, .depth = 2, .classes = 2, .batch = 2,
                         .stages = 1 };
    sp_graph *g = sp_model_mlp(&mc, &st);
    sp_program *p = g ? sp_program_build(g, &st) : NULL;
    sp_schedule *sch = NULL;
    REQUIRE(p && sp_schedule_builtin("1f1b", 1, 2, 1, &sch) == SP_OK, "%s", sp_last_error());
    char dir[] = "/tmp/test_loop.XXXXXX";
    REQUIRE(mkdtemp(dir), "mkdtemp");

    { /* 5 steps, evaluated every 2nd and after the last; asked to stop after 1..4 only */
        fake f = { 0 };
        sp_app_opts o = opts(5);
        o.eval_every = 2, o.save_on_signal = SIGUSR1, o.save = check_path(dir, "a.st");
        o.lr_decay = SP_LR_DECAY_LINEAR, o.lr_min = 0;
        CHECK(run(&f, &o, g, p, sch, NULL) == 0 && f.ends == 1 && f.end_code == 0,
              "the run ends once, 0");
        CHECK(f.nsteps == 5 && f.steps[0] == 1 && f.steps[4] == 5, "steps 1..5: %d", f.nsteps);
        CHECK(f.lr[0] > f.lr[4] && f.lr[4] == 0.0f, "the linear decay reaches 0 at step 5");
        CHECK(f.nevals == 3 && f.evals[0] == 2 && f.evals[1] == 4 && f.evals[2] == 5,
              "evaluations after 2, 4, 5: %d", f.nevals);
        CHECK(f.nstops == 4 && f.stops[3] == 4, "stop asked after steps 1..4: %d", f.nstops);
        char *step = ckpt_read_meta(o.save, "starpipe.step");
        CHECK(step && !strcmp(step, "5"), "saved at step 5: %s", step ? step : "none");
        free(step);
    }
    { /* a signal after step 3 stops there, saved */
        fake f = { .stop_at = 3 };
        sp_app_opts o = opts(6);
        o.save_on_signal = SIGUSR1, o.save = check_path(dir, "b.st");
        CHECK(run(&f, &o, g, p, sch, NULL) == 0 && f.ends == 1, "a stopped run succeeds");
        CHECK(f.nsteps == 3, "stopped after step 3: %d steps", f.nsteps);
        char *step = ckpt_read_meta(o.save, "starpipe.step");
        CHECK(step && !strcmp(step, "3"), "saved at step 3: %s", step ? step : "none");
        free(step);
    }
    { /* a resume continues the checkpoint's step */
        fake f = { .loaded_step = 7 };
        sp_app_opts o = opts(2);
        o.load = check_path(dir, "a.st"); /* the fake's load reads nothing */
        CHECK(run(&f, &o, g, p, sch, NULL) == 0, "resumed run");
        CHECK(f.nsteps == 2 && f.steps[0] == 8 && f.steps[1] == 9, "steps 8, 9 after 7");
        CHECK(f.nstops == 0, "no --save-on-signal: never asked to stop");
    }
    { /* --steps 0: one evaluation of the loaded state, no step */
        fake f = { .loaded_step = 4 };
        sp_app_opts o = opts(0);
        o.eval_every = 3, o.load = check_path(dir, "a.st");
        CHECK(run(&f, &o, g, p, sch, NULL) == 0 && f.nsteps == 0, "--steps 0 runs no step");
        CHECK(f.nevals == 1 && f.evals[0] == 4, "one evaluation, of step 4: %d", f.nevals);
    }
    { /* a failed step ends the run, 1, once */
        fake f = { .fail_at = 2 };
        sp_app_opts o = opts(4);
        o.eval_every = 1;
        CHECK(run(&f, &o, g, p, sch, NULL) == 1 && f.ends == 1 && f.end_code == 1,
              "a failed step: 1");
        CHECK(f.nsteps == 2 && f.nevals == 1, "no step nor evaluation after it");
    }
    { /* --check: a mismatch the ranks agree on ends the run, before its evaluation */
        fake f = { .mismatch_at = 2 };
        sp_app_opts o = opts(4);
        o.eval_every = 2;
        CHECK(run(&f, &o, g, p, sch, "  (= reference)") == 1 && f.end_code == 1, "mismatch: 1");
        CHECK(f.nsteps == 2 && f.nevals == 0, "ended at step 2, not evaluated");
        fake h = { .mismatch_at = 2 }; /* without --check nothing compares */
        CHECK(run(&h, &o, g, p, sch, NULL) == 0 && h.nsteps == 4, "no --check: 4 steps");
    }
    sp_schedule_free(sch);
    sp_program_free(p);
    sp_graph_free(g);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "rm %s", dir);
    return check_summary("test_loop");
}
