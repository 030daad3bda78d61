/* Fuzz target: the apps' command line, sp_app_parse (apps/options.c) with the flag
 * handlers of starpipe-gpt and starpipe-mlp (compiled in here with their main renamed;
 * the driver they would call is stubbed in stub_runtime.c). Nothing past parsing runs. Input: byte 0 picks the app, the rest is argv split at NUL bytes.
 * Properties: no crash or sanitizer report; parse() returns -1, 0 or 1; when it accepts,
 * every option lies in the range its --help promises. */
#include "fuzz/fuzz_util.h"

#include "apps/options.h"
#include "starpipe/optim.h"
#define main starpipe_gpt_main
#include "apps/starpipe-gpt.c"
#undef main
#define main starpipe_mlp_main
#include "apps/starpipe-mlp.c"
#undef main

/* a parsed --stage-layers list: 0..max entries, each in [0, max] */
static int in_range(const int *v, int n, int max)
{
    if (n < 0 || n > max) return 0;
    for (int i = 0; i < n; i++)
        if (v[i] < 0 || v[i] > max) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1 || n > 4096) return 0;
    char *argv[66], *store = NULL;
    int mlp = data[0] & 1;
    argv[0] = mlp ? "starpipe-mlp" : "starpipe-gpt";
    int argc = 1 + fz_split(data + 1, n - 1, argv + 1, 64, &store);
    if (!store) return 0;
    argv[argc] = NULL;

    gpt_app gcfg = GPT_APP_DEFAULTS;
    mlp_app mapp = MLP_APP_DEFAULTS;
    const sp_mlp_config *mc = &mapp.model;
    sp_app_model m = mlp ? (sp_app_model){ .name = "starpipe-mlp", .flags = mlp_flags,
                                           .defaults = "", .cfg = &mapp, .flag = mlp_flag }
                         : (sp_app_model){ .name = "starpipe-gpt", .flags = gpt_flags,
                                           .defaults = "", .cfg = &gcfg, .flag = gpt_flag };
    /* bit 1: parse as a non-zero rank would (quiet); else its messages go to /dev/null */
    static FILE *devnull;
    if (!devnull && !(devnull = fopen("/dev/null", "w"))) abort();
    if (data[0] & 2) setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    else unsetenv("OMPI_COMM_WORLD_RANK");
    FILE *real_out = stdout, *real_err = stderr;
    stdout = stderr = devnull;
    sp_app_opts o;
    int rc = sp_app_parse(argc, argv, &m, &o);
    FILE *left = stderr;
    stdout = real_out, stderr = real_err;
    FZ_CHECK(left == devnull, "sp_app_parse did not restore stderr");
    FZ_CHECK(rc == -1 || rc == 0 || rc == 1, "sp_app_parse returned %d", rc);
    if (rc == 1) {
        FZ_CHECK(o.steps >= 0 && o.steps <= 1 << 30, "steps %d", o.steps);
        FZ_CHECK(o.microbatches >= 0 && o.microbatches <= 1 << 20, "microbatches %d", o.microbatches);
        FZ_CHECK(o.chunks >= 0 && o.chunks <= 64, "chunks %d", o.chunks);
        FZ_CHECK(o.actors >= 0 && o.actors <= 1 << 16, "actors %d", o.actors);
        FZ_CHECK(o.seed >= 0, "seed %d", o.seed);
        FZ_CHECK(o.lr >= 0 && o.lr <= 10, "lr %g", o.lr);
        FZ_CHECK(o.clip >= 0 && o.clip <= 1e30f, "clip %g", o.clip);
        FZ_CHECK(!o.save_every || o.save, "--save-every without --save accepted");
        FZ_CHECK(o.warmup >= 0 && o.warmup <= 1 << 30, "warmup %d", o.warmup);
        FZ_CHECK(o.decay_steps >= 0 && o.decay_steps <= 1 << 30, "decay steps %d", o.decay_steps);
        FZ_CHECK(o.lr_min >= 0 && o.lr_min <= 10, "lr-min %g", o.lr_min);
        FZ_CHECK(o.lr_decay >= SP_LR_DECAY_NONE && o.lr_decay <= SP_LR_DECAY_LINEAR,
                 "lr-decay %d", o.lr_decay);
        FZ_CHECK(o.peak_tflops >= 0 && o.peak_tflops <= 1e9f, "peak %g", o.peak_tflops);
        if (mlp) {
            FZ_CHECK(mc->in_dim >= 1 && mc->width >= 1 && mc->depth >= 1 && mc->depth <= 4096
                         && mc->classes >= 2 && mc->batch >= 1, "mlp config out of range");
            FZ_CHECK(in_range(mapp.stage_layers, mapp.nstage_layers, 4096),
                     "mlp --stage-layers out of range");
        } else {
            const sp_gpt_config *c = &gcfg.model;
            FZ_CHECK(c->layers >= 1 && c->layers <= 1024 && c->heads >= 1 && c->heads <= 1024 &&
                         c->channels >= 1 && c->context >= 1 && c->batch >= 1 && gcfg.data,
                     "gpt config out of range");
            FZ_CHECK(in_range(gcfg.stage_layers, gcfg.nstage_layers, 1024),
                     "gpt --stage-layers out of range");
        }
        /* every pointer kept must point into the argument strings */
        const char *kept[] = { o.schedule, o.save, o.load, o.dump_grads, o.log,
                               mlp ? NULL : gcfg.data };
        for (size_t k = 0; k < sizeof kept / sizeof *kept; k++)
            if (kept[k] && kept[k] != gcfg.data) {
                int found = 0;
                for (int i = 1; i < argc; i++) found |= kept[k] == argv[i];
                FZ_CHECK(found, "option value does not point at an argument");
            }
    }
    free(store);
    return 0;
}
