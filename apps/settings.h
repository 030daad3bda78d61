/* A run's settings as checkpoints keep them (settings.c): the flags that continue a run
 * ("--flag value" lines, metadata starpipe.settings; --resume restores them, driver.c),
 * and the learning-rate schedule's horizon that they carry. */
#ifndef STARPIPE_APP_SETTINGS_H
#define STARPIPE_APP_SETTINGS_H

#include <stddef.h>

#include "apps/options.h"
#include "starpipe/optim.h"

/* The learning-rate schedule's horizon: the step at which the decay reaches --lr-min.
 * --decay-steps when given or stored in the checkpoint being resumed (so a resumed run
 * keeps the horizon of the run it continues, however many steps it runs itself), else the
 * last step of this run: its --steps after the checkpoint's step `start`. */
int app_horizon(const sp_app_opts *o, int start);
sp_lr_schedule app_lr_schedule(const sp_app_opts *o, int start);
/* The horizon a checkpoint stores: the run's when it decays, else only a --decay-steps
 * given (a constant rate has none, and runs without a schedule keep equal settings
 * however they are cut into resumed pieces). */
int app_stored_horizon(const sp_app_opts *o, int start);

/* The flags that continue this run from a checkpoint ("--flag value" lines): those that
 * change the computation and are not in the model's signature, the learning-rate
 * schedule with its horizon (app_stored_horizon, or 0 for none) among them. Floats with
 * as many digits as they need to read back as the same float (app_float_str). */
void app_settings(const sp_app_model *m, const sp_app_opts *o, int nmicro, int horizon,
                  char *buf, size_t len);
/* The value of `flag` in a settings text, into out ("" when absent). */
void app_setting_value(const char *text, const char *flag, char *out, size_t len);

/* The model's data file (its --data, as its settings name it) into path; "" for none. */
void app_data_path(const sp_app_model *m, char *path, size_t len);

#endif
