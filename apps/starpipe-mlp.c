/* starpipe-mlp: trains an MLP classifier on a synthetic teacher task, pipelined over MPI
 * ranks (mpirun -np P), or with --reference in one process. The smallest model that
 * exercises every part of the runtime; the loop and flags are in the driver (driver.h). */
#include <stdio.h>
#include <string.h>

#include "apps/driver.h"
#include "apps/parse.h"
#include "starpipe/data.h"
#include "starpipe/models.h"

typedef struct {
    sp_mlp_config model;
    int stage_layers[4096], nstage_layers; /* --stage-layers, one count per stage */
} mlp_app;

static int mlp_flag(void *cfg, const char *a, const char *v)
{
    mlp_app *app = cfg;
    sp_mlp_config *c = &app->model;
    if (!strcmp(a, "--stage-layers"))
        return app_parse_int_list(a, v, 0, 4096, app->stage_layers, 4096, &app->nstage_layers)
                   ? 1 : -1;
    struct { const char *flag; int *dst; long lo, hi; } ints[] = {
        { "--in", &c->in_dim, 1, 1 << 20 },    { "--width", &c->width, 1, 1 << 20 },
        { "--depth", &c->depth, 1, 4096 },     { "--classes", &c->classes, 2, 1 << 20 },
        { "--batch", &c->batch, 1, 1 << 20 },
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (!strcmp(a, ints[i].flag))
            return app_parse_int(a, v, ints[i].lo, ints[i].hi, ints[i].dst) ? 1 : -1;
    return -1;
}

static int mlp_prepare(void *cfg, double *samples, char *msg, size_t len)
{
    (void)msg;
    (void)len;
    *samples = ((mlp_app *)cfg)->model.batch;
    return 0;
}

static sp_graph *mlp_build(void *cfg, int stages, int tensor, int tensor_rank, sp_status *st)
{
    mlp_app *app = cfg;
    app->model.stages = stages;
    app->model.tensor = tensor;
    app->model.tensor_rank = tensor_rank;
    if (app_check_stage_layers(app->nstage_layers, stages, st)) return NULL;
    app->model.stage_layers = app->nstage_layers ? app->stage_layers : NULL;
    return sp_model_mlp(&app->model, st);
}

static void mlp_batch(void *cfg, uint64_t seed, int step, int mb, void *const *in)
{
    const sp_mlp_config *c = &((mlp_app *)cfg)->model;
    sp_mlp_batch(seed, step, mb, c->batch, c->in_dim, c->classes, in[0], in[1]);
}

/* Held-out rows: another stream of the same generator and teacher (data.h). */
static void mlp_eval_batch(void *cfg, uint64_t seed, int k, int K, void *const *in)
{
    (void)K;
    const sp_mlp_config *c = &((mlp_app *)cfg)->model;
    sp_mlp_eval_batch(seed, k, c->batch, c->in_dim, c->classes, in[0], in[1]);
}

static void mlp_describe(void *cfg, FILE *f)
{
    const sp_mlp_config *c = &((mlp_app *)cfg)->model;
    fprintf(f, "MLP: %d -> %d x %d (relu) -> %d classes, batch %d per microbatch\n", c->in_dim,
            c->depth, c->width, c->classes, c->batch);
}

static void mlp_signature(void *cfg, char *buf, size_t len)
{
    const sp_mlp_config *c = &((mlp_app *)cfg)->model;
    snprintf(buf, len, "mlp in=%d width=%d depth=%d classes=%d", c->in_dim, c->width, c->depth,
             c->classes);
}

/* What a resume needs besides the signature: the batch. */
static void mlp_settings(void *cfg, char *buf, size_t len)
{
    const sp_mlp_config *c = &((mlp_app *)cfg)->model;
    snprintf(buf, len, "--in %d\n--width %d\n--depth %d\n--classes %d\n--batch %d\n", c->in_dim,
             c->width, c->depth, c->classes, c->batch);
}

/* The defaults and the flags this model takes (also used by fuzz/fuzz_app_args.c). */
#define MLP_APP_DEFAULTS                                                                   \
    { .model = { .in_dim = 32, .width = 128, .depth = 8, .classes = 10, .batch = 32,       \
                 .stages = 1 } }
static const char *const mlp_flags[] = { "--in", "--width", "--depth", "--classes", "--batch",
                                         "--stage-layers", NULL };
static const char *const mlp_settings_flags[] = { "--in", "--width", "--depth", "--classes",
                                                  "--batch", NULL };

int main(int argc, char **argv)
{
    mlp_app cfg = MLP_APP_DEFAULTS;
    sp_app_model m = {
        .name = "starpipe-mlp",
        .flags = mlp_flags,
        .defaults = "model:\n"
                    "  --in N              input features (32)\n"
                    "  --width N           hidden width (128)\n"
                    "  --depth N           hidden layers, >= stages (8)\n"
                    "  --classes N         classes (10)\n"
                    "  --batch N           rows per microbatch (32)\n"
                    "  --stage-layers L    hidden layers per stage, e.g. 3,3,2 (even\n"
                    "                      split); the last may be 0: the head alone\n",
        .cfg = &cfg, .flag = mlp_flag, .prepare = mlp_prepare, .build = mlp_build,
        .batch = mlp_batch, .describe = mlp_describe, .sample_unit = "rows",
        .signature = mlp_signature, .settings = mlp_settings,
        .settings_flags = mlp_settings_flags,
        .param_flags = "--width, --depth or --in", .act_flags = "--batch, --width or --classes",
        .eval_batch = mlp_eval_batch,
    };
    return sp_app_main(argc, argv, &m);
}
