/* starpipe-mlp: trains an MLP classifier on a synthetic teacher task, pipelined over MPI
 * ranks (mpirun -np P), or with --reference in one process. The smallest model that
 * exercises every part of the runtime; the loop and flags are in driver.c. */
#include <stdio.h>
#include <string.h>

#include "apps/driver.h"
#include "apps/parse.h"
#include "starpipe/data.h"
#include "starpipe/models.h"

static int mlp_flag(void *cfg, const char *a, const char *v)
{
    sp_mlp_config *c = cfg;
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
    *samples = ((sp_mlp_config *)cfg)->batch;
    return 0;
}

static sp_graph *mlp_build(void *cfg, int stages, sp_status *st)
{
    sp_mlp_config *c = cfg;
    c->stages = stages;
    return sp_model_mlp(c, st);
}

static void mlp_batch(void *cfg, uint64_t seed, int step, int mb, void *const *in)
{
    sp_mlp_config *c = cfg;
    sp_mlp_batch(seed, step, mb, c->batch, c->in_dim, c->classes, in[0], in[1]);
}

static void mlp_describe(void *cfg, FILE *f)
{
    sp_mlp_config *c = cfg;
    fprintf(f, "MLP: %d -> %d x %d (relu) -> %d classes, batch %d per microbatch\n", c->in_dim,
            c->depth, c->width, c->classes, c->batch);
}

static void mlp_signature(void *cfg, char *buf, size_t len)
{
    const sp_mlp_config *c = cfg;
    snprintf(buf, len, "mlp in=%d width=%d depth=%d classes=%d", c->in_dim, c->width, c->depth,
             c->classes);
}

int main(int argc, char **argv)
{
    sp_mlp_config cfg = { .in_dim = 32, .width = 128, .depth = 8, .classes = 10, .batch = 32,
                          .stages = 1 };
    static const char *const flags[] = { "--in", "--width", "--depth", "--classes", "--batch",
                                         NULL };
    sp_app_model m = {
        .name = "starpipe-mlp",
        .flags = flags,
        .defaults = "model:\n"
                    "  --in N              input features (32)\n"
                    "  --width N           hidden width (128)\n"
                    "  --depth N           hidden layers, >= stages (8)\n"
                    "  --classes N         classes (10)\n"
                    "  --batch N           rows per microbatch (32)\n",
        .cfg = &cfg, .flag = mlp_flag, .prepare = mlp_prepare, .build = mlp_build,
        .batch = mlp_batch, .describe = mlp_describe, .sample_unit = "rows",
        .signature = mlp_signature,
    };
    return sp_app_main(argc, argv, &m);
}
