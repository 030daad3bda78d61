/* The --log file, the model FLOPs of a step, and device peaks (see metrics.h). */
#include "apps/metrics.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/files.h"
#include "codelets/cpu/kernels.h"
#include "starpipe/backend.h"

/* ---- the --log file ---- */

const char *app_float_str(float x, char *buf, size_t len)
{
    for (int digits = 6; digits <= 9; digits++) { /* the shortest that reads back */
        snprintf(buf, len, "%.*g", digits, (double)x);
        if (strtof(buf, NULL) == x) break;
    }
    return buf;
}

/* The lines of steps up to `last` that the file starts with, as the byte count they take:
 * each "{"step":N,..." with N <= last and a newline at its end. */
static off_t kept_bytes(int fd, int last)
{
    int dfd = dup(fd);
    FILE *f = dfd >= 0 ? fdopen(dfd, "r") : NULL;
    if (!f) {
        if (dfd >= 0) close(dfd);
        return 0;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    off_t keep = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        int step, used = 0;
        if (line[n - 1] != '\n' || sscanf(line, "{\"step\":%d,%n", &step, &used) != 1 || !used ||
            step > last)
            break;
        keep += n;
    }
    free(line);
    fclose(f);
    return keep;
}

sp_status app_log_open(app_log *l, const char *path, int resume_step)
{
    l->fd = -1;
    sp_status st = sp_output_target(path, "--log file", l->path, sizeof l->path);
    if (st) return st;
    int fd = open(l->path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0666);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        int e = fd < 0 ? errno : EINVAL;
        if (fd >= 0) close(fd);
        return sp_set_error(SP_ERR_IO, "cannot write --log file '%s': %s", path,
                            e == EINVAL ? "not a regular file" : strerror(e));
    }
    off_t keep = resume_step < 0 ? 0 : kept_bytes(fd, resume_step);
    if (keep < sb.st_size && ftruncate(fd, keep)) {
        int e = errno;
        close(fd);
        return sp_set_error(SP_ERR_IO, "cannot write --log file '%s': %s", path, strerror(e));
    }
    l->fd = fd;
    return SP_OK;
}

/* ",\"key\":value" of a number (fmt NULL: a float, its shortest exact form), null when it
 * is not finite (JSON has no NaN). */
static size_t put_num(char *b, size_t len, size_t k, const char *key, const char *fmt, double x)
{
    char f[32];
    if (k >= len) return k;
    k += (size_t)snprintf(b + k, len - k, ",\"%s\":", key);
    if (k >= len) return k;
    if (!isfinite(x)) return k + (size_t)snprintf(b + k, len - k, "null");
    if (!fmt) return k + (size_t)snprintf(b + k, len - k, "%s", app_float_str((float)x, f, sizeof f));
    return k + (size_t)snprintf(b + k, len - k, fmt, x);
}

sp_status app_log_write(app_log *l, const app_log_line *x)
{
    if (!l || l->fd < 0) return SP_OK;
    char b[1024];
    size_t len = sizeof b, k = (size_t)snprintf(b, len, "{\"step\":%d", x->step);
    k = put_num(b, len, k, "loss", NULL, x->loss);
    if (x->has_eval_loss) k = put_num(b, len, k, "eval_loss", NULL, x->eval_loss);
    k = put_num(b, len, k, "lr", NULL, x->lr);
    k = put_num(b, len, k, x->rate_key ? x->rate_key : "samples_per_s", "%.1f", x->rate);
    k = put_num(b, len, k, "flops_per_s", "%.6g", x->flops_per_s);
    if (x->mfu >= 0) k = put_num(b, len, k, "mfu", "%.6g", x->mfu);
    k = put_num(b, len, k, "step_ms", "%.3f", 1e3 * x->step_s);
    if (x->bubble >= 0) k = put_num(b, len, k, "bubble", "%.6g", x->bubble);
    if (x->plan_bubble >= 0) k = put_num(b, len, k, "plan_bubble", "%.6g", x->plan_bubble);
    k = put_num(b, len, k, "grad_norm", "%.9g", x->grad_norm);
    if (x->skipped && k < len) k += (size_t)snprintf(b + k, len - k, ",\"skipped\":true");
    if (k + 3 > len) return sp_set_error(SP_ERR_IO, "--log: a line of step %d is too long", x->step);
    k += (size_t)snprintf(b + k, len - k, "}\n");
    /* one write of the whole line (O_APPEND, one writer): a crash leaves it or nothing,
     * at worst a partial last line that a resumed run cuts off */
    for (size_t done = 0; done < k;) {
        ssize_t w = write(l->fd, b + done, k - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return sp_set_error(SP_ERR_IO, "writing --log file '%s' failed: %s", l->path,
                                w < 0 ? strerror(errno) : "no progress");
        done += (size_t)w;
    }
    if (fdatasync(l->fd) && errno != EINVAL && errno != EROFS)
        return sp_set_error(SP_ERR_IO, "writing --log file '%s' failed: %s", l->path,
                            strerror(errno));
    return SP_OK;
}

void app_log_close(app_log *l)
{
    if (l && l->fd >= 0) close(l->fd);
    if (l) l->fd = -1;
}

/* ---- FLOPs and peaks ---- */

double app_step_flops(const sp_program *p, const sp_schedule *sch, int replicas)
{
    double f = 0;
    for (int a = 0; a < sch->nactors; a++)
        for (int i = 0; i < sch->ntasks[a]; i++)
            f += sp_program_flops(p, sch->tasks[a][i].stage, sch->tasks[a][i].kind);
    return f * (replicas > 0 ? replicas : 1);
}

/* MFU's denominator on a CPU rank: the hardware's peak, one core's fused multiply-adds
 * measured now (codelets/cpu/peak.c), not the library's sgemm rate (which would flatter
 * MFU by the sgemm's own distance from the peak). */
void app_peak_cpu(app_peak *pk)
{
    char what[sizeof pk->source - 32];
    pk->flops = sp_cpu_fma_peak(0.02, what, sizeof what);
    snprintf(pk->source, sizeof pk->source, "measured at start-up: %s", what);
}

/* Dense datasheet figures, FLOP/s: fp32 on the CUDA cores, TF32 on the tensor cores
 * (NVIDIA's datasheets quote TF32 with sparsity: half of that). First match wins. */
static const struct {
    const char *model;
    double fp32, tf32;
} gpus[] = {
    { "H200", 67e12, 494.5e12 },      { "H100 PCIe", 51e12, 378e12 },
    { "H100", 67e12, 494.5e12 },      { "A100", 19.5e12, 156e12 },
};

void app_peak_gpu(app_peak *pk, int tf32, const char *gpus_dir, int *ngpus)
{
    pk->flops = 0;
    *ngpus = 0;
    char model[128] = "";
    const char *dir = gpus_dir ? gpus_dir : "/proc/driver/nvidia/gpus";
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        ++*ngpus;
        char path[PATH_MAX + 300], line[256];
        snprintf(path, sizeof path, "%s/%s/information", dir, e->d_name);
        FILE *f = model[0] ? NULL : fopen(path, "r");
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "Model:", 6)) {
                const char *v = line + 6;
                v += strspn(v, " \t");
                snprintf(model, sizeof model, "%.*s", (int)strcspn(v, "\n"), v);
                break;
            }
        if (f) fclose(f);
    }
    if (d) closedir(d);
    for (size_t i = 0; model[0] && i < sizeof gpus / sizeof *gpus; i++)
        if (strstr(model, gpus[i].model)) {
            pk->flops = tf32 ? gpus[i].tf32 : gpus[i].fp32;
            snprintf(pk->source, sizeof pk->source, "%s datasheet, dense %s", model,
                     tf32 ? "TF32 tensor cores (STARPIPE_TF32=1)"
                          : "fp32 without tensor cores (what the kernels run)");
            return;
        }
    snprintf(pk->source, sizeof pk->source, "unknown for GPU '%s': give --peak-tflops",
             model[0] ? model : "?");
}
