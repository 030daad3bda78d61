/* The two ways a run trains, behind one interface: the reference interpreter in this
 * process (engine_ref.c) and the pipelined trainer on StarPU and MPI (engine_pipe.c).
 * loop.c drives either: the steps, evaluations, checkpoints, signals and printed lines. */
#ifndef STARPIPE_APP_ENGINE_H
#define STARPIPE_APP_ENGINE_H

#include <limits.h>

#include "apps/checkpoint.h"
#include "apps/metrics.h"
#include "apps/options.h"
#include "base/env.h"
#include "starpipe/optim.h"
#include "starpipe/plan.h"
#include "starpipe/program.h"

/* What one step gives the loop. */
typedef struct {
    float loss;
    double step_s, grad_norm;
    int skipped;                /* the update was skipped (non-finite) */
    int has_bubble;             /* the pipeline's idle fraction was measured: */
    double bubble, plan_bubble; /* as it ran, and as its plan allows with the same tasks */
    int mismatch;               /* --check: the step differs from the reference (e->msg) */
} app_step_out;

typedef struct app_engine app_engine;

/* Entries marked optional may be NULL: nothing to do. A collective entry is called by
 * every rank; in the reference, one process, collectives are plain calls. */
typedef struct {
    /* One step (collective) at learning rate lr on e->in: its loss and times in *out.
     * Fails with the error set; the loop says it on the rank that speaks. */
    sp_status (*step)(app_engine *e, int step, float lr, app_step_out *out);
    /* Forward only over the K held-out microbatches of e->ev after `step` (collective);
     * *mismatch: --check found another loss than the reference's (e->msg). */
    sp_status (*eval)(app_engine *e, int step, float *loss, int *mismatch);
    /* --init FILE (sig NULL, start NULL: values only, from any file in the model's
     * layout) or --load FILE (values and moments; *start: the checkpoint's step, which the
     * engine's count of steps continues). The --check reference too. Collective. */
    sp_status (*load)(app_engine *e, const char *path, const char *sig, int *start);
    /* Collective: 1 when any rank is bad; the lowest bad rank prints msg. */
    int (*agree)(app_engine *e, int bad, const char *msg);
    /* After a step that is not the last (collective): the --save-on-signal signal that
     * stops the run there, agreed by the ranks, or 0. */
    int (*stop)(app_engine *e, int step);
    /* Optional, collective: the banner's lines after the learning rate's and the peak's
     * (rank 0 prints), and what they need of every rank. 1 on failure (said). */
    int (*describe)(app_engine *e);
    /* Optional, collective, after the last step: what the run writes besides
     * checkpoints (the trace), and in e->tail the lines that follow the "done" line. 1 on
     * failure (said). */
    int (*finish)(app_engine *e);
    /* Ends the run (code: its exit code so far; 0: it succeeded, and the engine's closing
     * report, STARPIPE_VERBOSE's, comes first), frees e and everything it holds, and
     * returns the exit code, which a failed shutdown may turn non-zero. */
    int (*end)(app_engine *e, int code);
} app_engine_ops;

/* An engine as the loop reads it, filled in by its constructor; ops: its entries. */
struct app_engine {
    const app_engine_ops *ops;
    sp_app_model *m;
    const sp_app_opts *o;
    const sp_env *env;
    int speaks;                /* this rank prints the run's lines (rank 0) */
    /* the model as this rank runs it: graph (parameter names, whole shapes), program,
     * schedule; R replicas, tensor degree T; samples (tokens, rows) per microbatch */
    const sp_graph *g;
    const sp_program *p;
    const sp_schedule *sch;
    int R, T;
    double samples;
    /* the step's R x m microbatches and the K held-out ones (NULL, 0 without
     * --eval-every), in sp_program_input order */
    void **in, **ev;
    int K;
    ckpt_io io;                /* checkpoints, dumps and --sample reach the parameters */
    /* MFU's peak: CUDA devices or CPU cores, the ranks and how many share a machine, and
     * the CPU core's peak timed at start-up (a CPU run without --peak-tflops) */
    int cuda, ranks, local;
    app_peak cpu_peak;
    /* what is printed: the banner's first line; --check's note after a step that agrees
     * with the reference (NULL: no --check) and after the "done" line's loss ("" none);
     * per_step_ms: the "done" line gives the mean step time; log_after_sample: the
     * "log:" line comes after --sample's text, not before it */
    char head[512];
    const char *same_note, *done_note;
    int per_step_ms, log_after_sample;
    char tail[2 * PATH_MAX + 512]; /* lines after the "done" line (finish) */
    char msg[SP_ERROR_MAX + 64]; /* why --check found a mismatch */
};

/* The engines. NULL with *code, the process's exit code, when the run cannot start
 * (said on the rank that speaks). The pipelined engine starts StarPU and MPI, with
 * argc and argv. */
app_engine *app_engine_reference(sp_app_model *m, const sp_app_opts *o, const sp_env *env,
                                 const sp_adamw_config *opt, int *code);
app_engine *app_engine_pipelined(int argc, char **argv, sp_app_model *m,
                                 const sp_app_opts *o, const sp_env *env,
                                 const sp_adamw_config *opt, int *code);

/* The run, written once for both (loop.c): checkpoints loaded, the banner, the steps,
 * evaluations, the --log file, checkpoints saved, signals, the last lines, --sample.
 * Ends the engine (e->ops->end) and returns the exit code. */
int app_run(app_engine *e);

#endif
