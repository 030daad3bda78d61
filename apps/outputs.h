/* What a run writes (outputs.c): every output checked before step 1, no two outputs one
 * file and no output an input, and how a signal ends a run without harming them. */
#ifndef STARPIPE_APP_OUTPUTS_H
#define STARPIPE_APP_OUTPUTS_H

#include "apps/options.h"
#include "starpipe/status.h"

/* The run's outputs (--save; with steps to run, --dump-grads, --log, the trace `trace` and
 * its picture) can be written, and no two of them are one file, nor is any of them one of
 * the run's inputs (--load, --init, the schedule file, the data: `data`, a path or a
 * comma-separated list of paths and globs; may be NULL). The one exception is --save onto
 * the --load file: a resumed run writes its checkpoints where it read one, each
 * complete before it replaces the last. SP_ERR_IO with one message naming both. */
sp_status app_check_outputs(const sp_app_opts *o, const char *trace, const char *data);

/* --save-on-signal: the signal's number for "USR1", "SIGUSR1", ... (USR1, USR2, TERM, INT,
 * HUP), or -1. */
int app_signal_parse(const char *name);
const char *app_signal_name(int sig);
/* From now on `sig` (0: none) asks the run to stop at the next step boundary
 * (app_stop_requested), and the signals that end the process remove the temporaries of
 * saves in progress (sp_output_cleanup_on_signals). */
void app_signals_arm(int sig);
/* The signal that asked this process to stop, or 0. */
int app_stop_requested(void);

#endif
