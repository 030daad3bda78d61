/* The model's data as a run takes it (data.c): its file checked against --data-format and
 * scanned before step 1, the held-out part set aside, and the inputs of steps and
 * evaluations; with them the check of every output the run writes. */
#ifndef STARPIPE_APP_DATA_H
#define STARPIPE_APP_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "apps/options.h"
#include "base/env.h"
#include "starpipe/program.h"
#include "starpipe/status.h"

/* Every file the run writes (trace: STARPIPE_TRACE's, or NULL), checked at start-up on
 * the rank that writes it: a path that cannot be written, or that is another output or
 * an input (the model's data among them), is refused before any step, not after the work
 * (app_check_outputs). */
sp_status app_check_run_outputs(const sp_app_model *m, const sp_app_opts *o, const char *trace);

/* The model's data file (its --data, as its settings name it) against --data-format,
 * before prepare loads it. sp_text_load reads a pattern (a list, a glob) or a file that
 * begins with the shard magic as token shards, and anything else as bytes: auto lets
 * bytes through only when they are UTF-8 text (a damaged shard, binary data are refused,
 * naming the file), text and shard insist on one, raw skips the text check. A file that
 * cannot be read is left to prepare, which says why. SP_ERR_FORMAT when refused. */
sp_status app_check_data(const sp_app_model *m, const sp_app_opts *o);

/* The model's scan of its whole data set (scan_data), timed for STARPIPE_VERBOSE=1
 * (verbose): 1 with a message when a value is refused. */
int app_scan_data(const sp_app_model *m, int verbose, char *msg, size_t len);

/* After prepare: the held-out data set aside, when evaluation is asked for (only then:
 * runs without it train on the data as they always did). 0 ok, else a message. */
int app_hold_out(sp_app_model *m, const sp_app_opts *o, char *msg, size_t len);
/* Before step 1, when --sample is asked for: the sampler's model built and freed, so that
 * a model and a --tokenizer that do not fit stop the run now. 0 ok, else a message. */
int app_check_sample(sp_app_model *m, const sp_app_opts *o, char *msg, size_t len);

/* Inputs of n microbatches: [mb * ninputs + k], each sized by the program; NULL when out
 * of memory. app_inputs_free takes the same n. */
void **app_inputs_alloc(const sp_program *p, int n);
void app_inputs_free(void **in, int n, const sp_program *p);
/* The nmb microbatches of a step, and STARPIPE_FAULT=nan@STEP's NaN (fault). */
void app_inputs_fill(sp_app_model *m, const sp_app_opts *o, const sp_program *p, int nmb,
                     int step, const sp_fault *fault, void **in);
/* The K held-out microbatches, filled once: every evaluation reads the same ones. */
void **app_eval_inputs(sp_app_model *m, const sp_app_opts *o, const sp_program *p, int K);

#endif
