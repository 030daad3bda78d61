/* A run's settings as checkpoints keep them (settings.h): the flags a checkpoint stores
 * to continue the run, and the learning-rate schedule's horizon among them. */
#include "apps/settings.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/metrics.h"

int app_horizon(const sp_app_opts *o, int start)
{
    return o->decay_steps > 0 ? o->decay_steps : start + o->steps;
}

sp_lr_schedule app_lr_schedule(const sp_app_opts *o, int start)
{
    return (sp_lr_schedule){ .lr = o->lr, .lr_min = o->lr_min, .warmup = o->warmup,
                             .total = app_horizon(o, start), .decay = o->lr_decay };
}

int app_stored_horizon(const sp_app_opts *o, int start)
{
    return o->lr_decay != SP_LR_DECAY_NONE ? app_horizon(o, start) : o->decay_steps;
}

void app_settings(const sp_app_model *m, const sp_app_opts *o, int nmicro, int horizon,
                  char *buf, size_t len)
{
    char lr[32], clip[32], lr_min[32];
    int k = snprintf(buf, len, "--microbatches %d\n--seed %d\n--lr %s\n--clip %s\n--warmup %d\n"
                     "--lr-decay %s\n--lr-min %s\n", nmicro, o->seed,
                     app_float_str(o->lr, lr, sizeof lr), app_float_str(o->clip, clip, sizeof clip),
                     o->warmup, sp_lr_decay_name(o->lr_decay),
                     app_float_str(o->lr_min, lr_min, sizeof lr_min));
    if (horizon > 0 && k > 0 && (size_t)k < len)
        k += snprintf(buf + k, len - (size_t)k, "--decay-steps %d\n", horizon);
    if (k > 0 && (size_t)k < len)
        k += snprintf(buf + k, len - (size_t)k, "--precision %s\n", o->bf16 ? "bf16" : "fp32");
    /* evaluation holds out data, which changes the training batches: a resume keeps it */
    if (k > 0 && (size_t)k < len && (o->eval_every || sp_app_given(m, o, "--eval-every")))
        k += snprintf(buf + k, len - (size_t)k, "--eval-every %d\n", o->eval_every);
    if (k > 0 && (size_t)k < len && o->eval_every && o->eval_batches)
        k += snprintf(buf + k, len - (size_t)k, "--eval-batches %d\n", o->eval_batches);
    /* how the data is read: a resume must accept the data the run trained on */
    if (k > 0 && (size_t)k < len &&
        (o->data_format != SP_APP_DATA_AUTO || sp_app_given(m, o, "--data-format")))
        k += snprintf(buf + k, len - (size_t)k, "--data-format %s\n",
                      sp_app_data_format_name(o->data_format));
    if (m->settings && k > 0 && (size_t)k < len) m->settings(m->cfg, buf + k, len - k);
}

void app_setting_value(const char *text, const char *flag, char *out, size_t len)
{
    size_t fl = strlen(flag);
    out[0] = 0;
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, flag, fl) && l[fl] == ' ') {
            const char *e = strchr(l, '\n');
            size_t n = e ? (size_t)(e - l - fl - 1) : strlen(l + fl + 1);
            snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), l + fl + 1);
            return;
        }
}

void app_data_path(const sp_app_model *m, char *path, size_t len)
{
    char set[2 * PATH_MAX + 1024];
    path[0] = 0;
    if (!m->settings) return;
    m->settings(m->cfg, set, sizeof set);
    app_setting_value(set, "--data", path, len);
}
