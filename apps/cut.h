/* The apps' default cut: balanced by cost, not by block count (cut.c). */
#ifndef STARPIPE_APP_CUT_H
#define STARPIPE_APP_CUT_H

#include <stddef.h>

#include "apps/driver.h"
#include "apps/options.h"
#include "starpipe/calibrate.h"

/* The cut of the model into S stages whose largest stage costs least: the cost of each
 * block, of the embedding (stage 0's) and of the head (the last stage's) from the model
 * cut into L + 2 stages (member trank of T), the stage programs' FLOPs of F and BW, or
 * pf's predicted times. The even cut when it is as good. cut[S] gets it and the model's
 * next build for S stages uses it (m->set_cut); why: one line. 0, or 1: no cut (the
 * model takes none, the user gave --stage-layers, or S < 2). */
int app_balanced_cut(sp_app_model *m, const sp_app_opts *o, int S, int T, int trank,
                     const sp_profile *pf, int *cut, char *why, size_t len);

#endif
