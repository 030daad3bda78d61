/* --schedule auto in the apps: the schedule for this run's task times, synthesized for its
 * chain of stages (sp_schedule_auto, docs/planner.md section 1) or a built-in of two
 * stages per actor where that is predicted faster at no more activation memory. */
#ifndef STARPIPE_APP_AUTO_H
#define STARPIPE_APP_AUTO_H

#include <stddef.h>

#include "starpipe/calibrate.h"
#include "starpipe/train.h"

/* The run's model cut into nstages stages: its program and *g, the graph it reads (free
 * both; NULL with *st: it cannot be). */
typedef sp_program *(*app_program_fn)(void *ctx, int nstages, sp_graph **g, sp_status *st);

/* Collective. Op times from calib's profile when given, else from two steps of a probe
 * trainer (probe: ZB-H1 on p's chain, the run's actors and microbatches; opts and R the
 * run's) whose updates are thrown away, so the run starts from step 1, bitwise the
 * reference. Candidates: the schedule synthesized for p's stage costs, holding at most
 * cap microbatches' activations per actor (0: 1F1B's); unless chain_only (a cut or a
 * recomputation the user gave per stage), interleaved-1F1B, ZB-V and DualPipe-V on the
 * model cut into 2P stages by build. Each is simulated at the predicted costs; the
 * fastest with no more activation memory than the synthesized one is *out (every rank
 * rank 0's choice; its nstages says which cut). why: one line, the candidates' times. */
sp_status app_auto_schedule(const sp_program *p, app_program_fn build, void *ctx,
                            const sp_schedule *probe, const sp_train_opts *opts, int R,
                            const sp_profile *calib, int cap, int chain_only,
                            sp_schedule **out, char *why, size_t len);

#endif
