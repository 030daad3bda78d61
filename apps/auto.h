/* --schedule auto in the apps: the schedule synthesized for this run's task times
 * (sp_schedule_auto, docs/planner.md section 1). */
#ifndef STARPIPE_APP_AUTO_H
#define STARPIPE_APP_AUTO_H

#include <stddef.h>

#include "starpipe/calibrate.h"
#include "starpipe/train.h"

/* Collective. The costs of p's stages come from calib's profile when given, else from
 * two steps of a probe trainer (probe: ZB-H1 on the run's actors and microbatches, opts
 * and R the run's) whose updates are thrown away: the run itself then starts from step 1,
 * bitwise the reference. *out: the schedule for rank 0's costs (every rank the same),
 * holding at most cap microbatches' activations per actor (0: 1F1B's); why: one line
 * saying the costs and the predicted pipeline against 1F1B's and ZB-H1's. */
sp_status app_auto_schedule(const sp_program *p, const sp_schedule *probe,
                            const sp_train_opts *opts, int R, const sp_profile *calib, int cap,
                            sp_schedule **out, char *why, size_t len);

#endif
