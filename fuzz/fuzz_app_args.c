/* Fuzz target: the apps' command line, sp_app_parse (apps/options.c) with the flag
 * handlers of starpipe-gpt and starpipe-mlp (compiled in here with their main renamed;
 * the driver they would call is stubbed in stub_runtime.c). Nothing past parsing runs. Input: byte 0 picks the app, the rest is argv split at NUL bytes.
 * Properties: no crash or sanitizer report; parse() returns -1, 0 or 1; when it accepts,
 * every option lies in the range its --help promises. */
#include "fuzz/fuzz_util.h"

#include "apps/options.h"
#define main starpipe_gpt_main
#include "apps/starpipe-gpt.c"
#undef main
#define main starpipe_mlp_main
#include "apps/starpipe-mlp.c"
#undef main

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    if (n < 1 || n > 4096) return 0;
    char *argv[66], *store = NULL;
    int mlp = data[0] & 1;
    argv[0] = mlp ? "starpipe-mlp" : "starpipe-gpt";
    int argc = 1 + fz_split(data + 1, n - 1, argv + 1, 64, &store);
    if (!store) return 0;
    argv[argc] = NULL;

    gpt_app gcfg = { .data = SP_DEFAULT_CORPUS,
                     .model = { .vocab = 256, .context = 64, .layers = 4, .heads = 4,
                                .channels = 64, .batch = 4, .stages = 1 } };
    sp_mlp_config mcfg = { .in_dim = 32, .width = 128, .depth = 8, .classes = 10, .batch = 32,
                           .stages = 1 };
    static const char *const gflags[] = { "--data", "--layers", "--heads", "--channels",
                                          "--context", "--batch", NULL };
    static const char *const mflags[] = { "--in", "--width", "--depth", "--classes", "--batch",
                                          NULL };
    sp_app_model m = mlp ? (sp_app_model){ .name = "starpipe-mlp", .flags = mflags,
                                           .defaults = "", .cfg = &mcfg, .flag = mlp_flag }
                         : (sp_app_model){ .name = "starpipe-gpt", .flags = gflags,
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
        if (mlp) {
            FZ_CHECK(mcfg.in_dim >= 1 && mcfg.width >= 1 && mcfg.depth >= 1 && mcfg.depth <= 4096
                         && mcfg.classes >= 2 && mcfg.batch >= 1, "mlp config out of range");
        } else {
            const sp_gpt_config *c = &gcfg.model;
            FZ_CHECK(c->layers >= 1 && c->layers <= 1024 && c->heads >= 1 && c->heads <= 1024 &&
                         c->channels >= 1 && c->context >= 1 && c->batch >= 1 && gcfg.data,
                     "gpt config out of range");
        }
        /* every pointer kept must point into the argument strings */
        const char *kept[] = { o.schedule, o.save, o.load, o.dump_grads, mlp ? NULL : gcfg.data };
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
