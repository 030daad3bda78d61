/* --profile FILE and --calibrate FILE of a pipelined run (options.h): the cost model of
 * this machine written from what the run measured, and another run's prediction read
 * back and set against what this one measures. The format: docs/planner.md,
 * "Calibration". */
#ifndef STARPIPE_APP_PROFILE_H
#define STARPIPE_APP_PROFILE_H

#include <stddef.h>

#include "starpipe/calibrate.h"
#include "starpipe/train.h"

/* What the run is, for the profile's header and the prediction. */
typedef struct {
    const char *app;      /* the program's name */
    const char *command;  /* its command line, one string */
    const sp_program *p;
    sp_trainer *t;
    const char *schedule;
    int replicas, tensor, sharded, bf16;
} app_profile_run;

/* Collective. Rank 0 writes path atomically from the trainer's profile and the step and
 * pipeline times of each step (step_s, span_s: [nsteps], step 1 first, which is left
 * out). 1 with msg on this rank's failure. */
int app_profile_write(const char *path, const app_profile_run *r, const double *step_s,
                      const double *span_s, int nsteps, char *msg, size_t len);

/* The step this run should take by profile pf: *out (sp_prediction_free it). Rank 0
 * prints it. */
sp_status app_predict(const sp_profile *pf, const app_profile_run *r, sp_prediction *out);

/* Collective, after the run: the measured median step (steps after the first) and each
 * rank's memory against the prediction, as lines for the run's tail on rank 0. */
int app_predict_report(const sp_prediction *pred, const app_profile_run *r,
                       const double *step_s, int nsteps, char *tail, size_t len);

#endif
