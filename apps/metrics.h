/* What the apps report about a run besides its loss: the --log file (one JSON line per
 * step), the model FLOPs of a step, and the peak FLOP/s of a device that MFU divides by.
 * MFU = model FLOP/s / (peak x devices in use), the model FLOPs being the program's own
 * count of the step's tasks (every F, B, W, BW of every microbatch and stage, summed;
 * not the optimizer, the copies or the transfers). */
#ifndef STARPIPE_APP_METRICS_H
#define STARPIPE_APP_METRICS_H

#include <limits.h>

#include "starpipe/plan.h"
#include "starpipe/program.h"
#include "starpipe/status.h"

/* ---- the --log file ----
 * One line of it. A field to add is a member here and one line in app_log_write; a
 * member that is absent for a step is left out of its line (never written as a
 * placeholder), so a reader sees only values that were measured. */
typedef struct {
    int step;
    float loss, lr;
    double step_s, grad_norm;
    const char *rate_key; /* "tokens_per_s", "rows_per_s" */
    double rate;          /* samples per second */
    double flops_per_s;   /* model FLOP/s */
    double mfu;           /* < 0: no stated peak: left out */
    double bubble, plan_bubble; /* < 0: not measured (the reference): left out */
    int skipped;          /* the update was skipped (non-finite) */
    int has_eval_loss;    /* eval_loss is written only when set */
    float eval_loss;
} app_log_line;

typedef struct {
    int fd; /* -1: no log */
    char path[PATH_MAX];
} app_log;
#define APP_LOG_NONE { .fd = -1 }

/* Opens the log for appending whole lines. resume_step < 0: a new run, the file is
 * emptied; else the lines of steps up to resume_step are kept (a run resumed from a
 * checkpoint of that step continues the log) and the rest, with any partial last line,
 * cut off. The path was checked at start-up (sp_output_check); a symbolic link is
 * followed to the regular file it names, anything else is refused. */
sp_status app_log_open(app_log *l, const char *path, int resume_step);
/* Appends one line with one write and flushes it to the disk (fdatasync), so that a
 * crash at any moment leaves whole lines only. Non-finite numbers are written as null. */
sp_status app_log_write(app_log *l, const app_log_line *x);
void app_log_close(app_log *l);

/* x with the fewest digits (6 to 9) that read back as the same float. */
const char *app_float_str(float x, char *buf, size_t len);

/* ---- FLOPs and peaks ---- */

/* Model FLOPs of one step: sp_program_flops of every task of the schedule, times the
 * replicas. */
double app_step_flops(const sp_program *p, const sp_schedule *sch, int replicas);

typedef struct {
    double flops;      /* per device; 0: unknown (no MFU) */
    char source[160];  /* where the number comes from, for the banner */
} app_peak;

/* A CPU core: the library's own sgemm (sp_backend_cpu()->matmul, the kernel every CPU
 * stage task runs its matrix products on) timed on 256 x 256 x 256, the best of the runs
 * that fit in about 20 ms. */
void app_peak_cpu(app_peak *pk);
/* A GPU: the datasheet's dense figure for this machine's model (the "Model:" line of the
 * first GPU under gpus_dir, NULL: /proc/driver/nvidia/gpus), fp32 without tensor cores,
 * or TF32 tensor cores when tf32 (STARPIPE_TF32=1): what the kernels run. flops stays 0
 * for a model not in the table. *ngpus gets the GPUs listed there. */
void app_peak_gpu(app_peak *pk, int tf32, const char *gpus_dir, int *ngpus);

#endif
