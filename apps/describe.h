/* What STARPIPE_VERBOSE prints of a pipelined run (describe.c), beside its usual lines:
 * what the planner predicts, which ranks form each pipeline, and each rank's memory and
 * transfers. */
#ifndef STARPIPE_APP_DESCRIBE_H
#define STARPIPE_APP_DESCRIBE_H

#include "starpipe/plan.h"
#include "starpipe/program.h"
#include "starpipe/train.h"

/* STARPIPE_VERBOSE=1: what the planner predicts, per actor; 2 (verbose) adds every
 * instruction. */
void app_describe_plan(const sp_plan *pl, const sp_program *p, int verbose);
/* STARPIPE_VERBOSE=1 with replicas: which ranks form each pipeline. */
void app_describe_layout(const sp_layout *l);
/* STARPIPE_VERBOSE=1 with replicas: each rank's AdamW state, predicted from the stage
 * sizes (2 moments of the parameters it owns, an even 1/R of them when sharded) and as
 * the trainer allocated it, and all its persistent buffers (rank 0 prints). Collective.
 * 1 on failure. */
int app_describe_memory(sp_trainer *t, const sp_program *p, int R, int sharded);
/* STARPIPE_VERBOSE=1 after the run's last step (step): this rank's buffers measured
 * against planned (actor: its place in the pipeline; dev_buffers: its device's estimate
 * before step 1), and its transfers, on stderr. */
void app_describe_use(sp_trainer *t, const sp_program *p, int actor, int step,
                      double dev_buffers);

#endif
