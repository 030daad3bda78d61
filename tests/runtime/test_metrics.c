/* The apps' metrics (apps/metrics.c), without MPI: the --log writer (its exact lines,
 * fields left out when absent, null for non-finite numbers, eval_loss only when set), a
 * resumed log cut back to the checkpoint's step (later lines and a partial one dropped),
 * the model FLOPs of a step against the program's per-task counts, the CPU peak (a
 * plausible rate within its time budget), and the GPU datasheet table on a fake
 * /proc/driver/nvidia/gpus. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "apps/metrics.h"
#include "starpipe/models.h"
#include "tests/check.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(void)
{
    char dir[] = "/tmp/sp-metrics-XXXXXX", path[256];
    REQUIRE(mkdtemp(dir), "mkdtemp");
    snprintf(path, sizeof path, "%s/run.jsonl", dir);

    /* ---- the writer: exact lines ---- */
    app_log l = APP_LOG_NONE;
    app_log_line x = { .step = 1, .loss = 5.5f, .lr = 1e-3f, .step_s = 0.0125, .grad_norm = 2.5,
                       .rate_key = "tokens_per_s", .rate = 1234.5, .flops_per_s = 2e9,
                       .mfu = 0.25, .bubble = 0.5, .plan_bubble = 0.25 };
    CHECK(app_log_write(&l, &x) == SP_OK, "writing to no log is not a no-op");
    put(path, "stale\n");
    REQUIRE(app_log_open(&l, path, -1) == SP_OK, "open: %s", sp_last_error());
    CHECK(app_log_write(&l, &x) == SP_OK, "write 1");
    x = (app_log_line){ .step = 2, .loss = NAN, .lr = 5e-4f, .step_s = 0.5, .grad_norm = INFINITY,
                        .rate_key = "rows_per_s", .rate = 10, .flops_per_s = 1e6, .mfu = -1,
                        .bubble = -1, .plan_bubble = -1, .skipped = 1, .has_eval_loss = 1,
                        .eval_loss = 4.25f };
    CHECK(app_log_write(&l, &x) == SP_OK, "write 2");
    app_log_close(&l);
    const char *want =
        "{\"step\":1,\"loss\":5.5,\"lr\":0.001,\"tokens_per_s\":1234.5,\"flops_per_s\":2e+09,"
        "\"mfu\":0.25,\"step_ms\":12.500,\"bubble\":0.5,\"plan_bubble\":0.25,\"grad_norm\":2.5}\n"
        "{\"step\":2,\"loss\":null,\"eval_loss\":4.25,\"lr\":0.0005,\"rows_per_s\":10.0,"
        "\"flops_per_s\":1e+06,\"step_ms\":500.000,\"grad_norm\":null,\"skipped\":true}\n";
    const char *got = slurp(path);
    CHECK(got && !strcmp(got, want), "log lines:\n%s\nwant:\n%s", got ? got : "(none)", want);

    /* ---- a resumed log: lines up to the checkpoint's step, then the new ones ---- */
    put(path, "{\"step\":1,\"loss\":1}\n{\"step\":2,\"loss\":2}\n{\"step\":3,\"loss\":3}\n"
              "{\"step\":4,\"loss\":4}\n{\"step\":5,\"lo");
    REQUIRE(app_log_open(&l, path, 2) == SP_OK, "open: %s", sp_last_error());
    x = (app_log_line){ .step = 3, .loss = 3.5f, .lr = 1, .step_s = 1, .rate_key = "tokens_per_s",
                        .mfu = -1, .bubble = -1, .plan_bubble = -1 };
    CHECK(app_log_write(&l, &x) == SP_OK, "write after resume");
    app_log_close(&l);
    got = slurp(path);
    want = "{\"step\":1,\"loss\":1}\n{\"step\":2,\"loss\":2}\n{\"step\":3,\"loss\":3.5,\"lr\":1,"
           "\"tokens_per_s\":0.0,\"flops_per_s\":0,\"step_ms\":1000.000,\"grad_norm\":0}\n";
    CHECK(got && !strcmp(got, want), "resumed log:\n%s\nwant:\n%s", got ? got : "(none)", want);
    /* a partial line at the resume point goes too; a resume past the end keeps all */
    put(path, "{\"step\":1,\"loss\":1}\n{\"step\":2,\"lo");
    REQUIRE(app_log_open(&l, path, 7) == SP_OK, "open: %s", sp_last_error());
    app_log_close(&l);
    got = slurp(path);
    CHECK(got && !strcmp(got, "{\"step\":1,\"loss\":1}\n"), "partial line kept: %s", got);
    /* a directory is refused with the flag's name */
    CHECK(app_log_open(&l, dir, -1) != SP_OK && strstr(sp_last_error(), "--log file"),
          "a directory accepted as a log: %s", sp_last_error());
    unlink(path);

    /* ---- model FLOPs of a step: every task once, times the replicas ---- */
    sp_status st;
    sp_gpt_config gc = { .vocab = 256, .context = 16, .layers = 2, .heads = 2, .channels = 16,
                         .batch = 2, .stages = 2 };
    sp_graph *g = sp_model_gpt(&gc, &st);
    sp_program *p = g ? sp_program_build(g, &st) : NULL;
    sp_schedule *sch = NULL;
    REQUIRE(p && sp_schedule_builtin("zb-h1", 2, 3, 1, &sch) == SP_OK, "setup: %s",
            sp_last_error());
    double per_mb = 0;
    for (int s = 0; s < 2; s++)
        per_mb += sp_program_flops(p, s, SP_TASK_F) + sp_program_flops(p, s, SP_TASK_B) +
                  sp_program_flops(p, s, SP_TASK_W);
    double f1 = app_step_flops(p, sch, 1), f3 = app_step_flops(p, sch, 3);
    CHECK(per_mb > 0 && fabs(f1 - 3 * per_mb) <= 1e-9 * f1, "step FLOPs %.6g, want 3 x %.6g", f1,
          per_mb);
    CHECK(f3 == 3 * f1, "replicas: %.6g, want 3 x %.6g", f3, f1);
    /* a fused BW counts as B + W: 1f1b gives the same */
    sp_schedule *fused = NULL;
    REQUIRE(sp_schedule_builtin("1f1b", 2, 3, 1, &fused) == SP_OK, "1f1b");
    CHECK(fabs(app_step_flops(p, fused, 1) - f1) <= 1e-9 * f1, "BW FLOPs %.6g vs B + W %.6g",
          app_step_flops(p, fused, 1), f1);
    sp_schedule_free(fused);
    sp_schedule_free(sch);
    sp_program_free(p);
    sp_graph_free(g);

    /* ---- the CPU peak: a rate, within its time budget ---- */
    app_peak pk;
    double t0 = now();
    app_peak_cpu(&pk);
    double dt = now() - t0;
    CHECK(pk.flops > 1e8 && pk.flops < 1e13, "CPU peak %.3g FLOP/s", pk.flops);
    CHECK(dt < 0.5, "measuring the CPU peak took %.3f s", dt);
    CHECK(strstr(pk.source, "measured"), "source: %s", pk.source);
    /* the README's banner: a run a VM's clock timed too fast is not the peak */
    CHECK(strstr(pk.source, "the 5th best of"), "source: %s", pk.source);

    /* ---- GPUs: the datasheet by model name, on a fake driver directory ---- */
    char gpus[300], sub[400], info[500];
    snprintf(gpus, sizeof gpus, "%s/gpus", dir);
    mkdir(gpus, 0777);
    int n = -1;
    app_peak_gpu(&pk, 0, gpus, &n);
    CHECK(n == 0 && pk.flops == 0 && strstr(pk.source, "--peak-tflops"), "no GPU: %d %.3g %s", n,
          pk.flops, pk.source);
    for (int k = 0; k < 2; k++) {
        snprintf(sub, sizeof sub, "%s/0000:%02d:00.0", gpus, k);
        mkdir(sub, 0777);
        snprintf(info, sizeof info, "%s/information", sub);
        put(info, "Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\nGPU UUID: \t GPU-x\n");
    }
    app_peak_gpu(&pk, 0, gpus, &n);
    CHECK(n == 2 && pk.flops == 67e12 && strstr(pk.source, "NVIDIA H200 datasheet") &&
          strstr(pk.source, "fp32"), "H200 fp32: %d %.4g %s", n, pk.flops, pk.source);
    app_peak_gpu(&pk, 1, gpus, &n);
    CHECK(pk.flops == 494.5e12 && strstr(pk.source, "TF32"), "H200 TF32: %.4g %s", pk.flops,
          pk.source);
    put(info, "Model: \t\t NVIDIA H100 PCIe\n");
    snprintf(sub, sizeof sub, "%s/0000:00:00.0/information", gpus);
    put(sub, "Model: \t\t NVIDIA H100 PCIe\n");
    app_peak_gpu(&pk, 0, gpus, &n);
    CHECK(pk.flops == 51e12, "H100 PCIe: %.4g %s", pk.flops, pk.source);
    put(info, "Model: \t\t NVIDIA GeForce GTX 1080\n");
    put(sub, "Model: \t\t NVIDIA GeForce GTX 1080\n");
    app_peak_gpu(&pk, 0, gpus, &n);
    CHECK(pk.flops == 0 && strstr(pk.source, "GTX 1080") && strstr(pk.source, "--peak-tflops"),
          "unknown GPU: %.4g %s", pk.flops, pk.source);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
    return check_summary("test_metrics");
}
