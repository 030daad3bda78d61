/* Which GPU each rank of a host uses and which cores are near it (runtime/gpumap.h). */
#define _GNU_SOURCE
#include "runtime/gpumap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/files.h"

/* The physical name of visible device d: entry d of CUDA_VISIBLE_DEVICES, or d. */
static void device_name(const char *visible, int d, char *out, size_t len)
{
    snprintf(out, len, "%d", d);
    if (!visible || !*visible) return;
    const char *p = visible;
    for (int i = 0; i < d && p; i++) {
        p = strchr(p, ',');
        if (p) p++;
    }
    if (!p || !*p) return;
    size_t n = strcspn(p, ",");
    snprintf(out, len, "%.*s (CUDA_VISIBLE_DEVICES entry %d)", (int)(n < 64 ? n : 64), p, d);
}

sp_status sp_gpu_choose(int local_rank, int local_size, int ngpus, const char *override,
                        const char *visible, sp_gpu_choice *out)
{
    memset(out, 0, sizeof *out);
    out->device = -1;
    snprintf(out->ncuda, sizeof out->ncuda, "0");
    if (ngpus < 0) ngpus = 0;
    if (override && !strcmp(override, "none")) {
        snprintf(out->line, sizeof out->line, "CPU only (STARPIPE_GPU=none)");
        return SP_OK;
    }
    int list[256], n = 0; /* STARPIPE_GPU's numbers */
    if (override && *override) {
        const char *p = override;
        while (*p) {
            size_t k = strcspn(p, ",");
            char buf[32];
            int64_t v;
            if (k == 0 || k >= sizeof buf || n == 256)
                return sp_set_error(SP_ERR_ARG, "STARPIPE_GPU='%s': expected none, a device "
                                    "number, or one number per local rank separated by commas",
                                    override);
            memcpy(buf, p, k);
            buf[k] = '\0';
            if (sp_parse_int(buf, 0, 1 << 20, &v))
                return sp_set_error(SP_ERR_ARG, "STARPIPE_GPU='%s': '%s' is not a device number",
                                    override, buf);
            list[n++] = (int)v;
            p += k;
            if (*p == ',' && !*++p)
                return sp_set_error(SP_ERR_ARG, "STARPIPE_GPU='%s': a trailing comma", override);
        }
        if (n > 1 && n < local_size)
            return sp_set_error(SP_ERR_ARG, "STARPIPE_GPU='%s' lists %d devices for %d ranks on "
                                "this host", override, n, local_size);
        out->device = list[n > 1 ? local_rank : 0];
        if (out->device >= ngpus)
            return sp_set_error(SP_ERR_ARG, "STARPIPE_GPU='%s': device %d, but this process "
                                "sees %d GPU%s", override, out->device, ngpus,
                                ngpus == 1 ? "" : "s");
    } else if (ngpus == 0) {
        snprintf(out->line, sizeof out->line, "CPU only (no GPU visible)");
        return SP_OK;
    } else {
        out->device = local_rank % ngpus;
    }
    /* how many local ranks end on the same device */
    for (int r = 0; r < local_size; r++) {
        int d = n == 0 ? r % ngpus : list[n > 1 ? r : 0];
        out->sharing += d == out->device;
    }
    snprintf(out->ncuda, sizeof out->ncuda, "1");
    snprintf(out->cudaid, sizeof out->cudaid, "%d", out->device);
    char name[96];
    device_name(visible, out->device, name, sizeof name);
    int k = snprintf(out->line, sizeof out->line, "GPU %s", name);
    if (out->sharing > 1)
        snprintf(out->line + k, sizeof out->line - (size_t)k, ", shared by %d ranks of this host "
                 "(%d ranks, %d GPUs): NCCL stays off, GPU transfers go through host memory",
                 out->sharing, local_size, ngpus);
    else if (local_size < ngpus && local_rank == 0)
        snprintf(out->line + k, sizeof out->line - (size_t)k, " (%d of the host's %d GPUs in use)",
                 local_size, ngpus);
    return SP_OK;
}

sp_status sp_parse_cpulist(const char *text, cpu_set_t *set)
{
    CPU_ZERO(set);
    const char *p = text;
    while (*p && *p != '\n') {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 0 || a >= CPU_SETSIZE) goto bad;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1 || b < a || b >= CPU_SETSIZE) goto bad;
            p = end;
        }
        for (long c = a; c <= b; c++) CPU_SET((int)c, set);
        if (*p == ',') p++;
        else if (*p && *p != '\n') goto bad;
    }
    return SP_OK;
bad:
    return sp_set_error(SP_ERR_FORMAT, "bad CPU list '%s'", text);
}

static int disjoint(const cpu_set_t *all, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            cpu_set_t both;
            CPU_AND(&both, &all[i], &all[j]);
            if (CPU_COUNT(&both)) return 0;
        }
    return 1;
}

/* Entry k of `n` equal parts of set (in CPU order) into cpus; returns the count. */
static int part_of(const cpu_set_t *set, int k, int n, int *cpus)
{
    int total = CPU_COUNT(set), per = n > 0 ? total / n : 0, seen = 0, got = 0;
    for (int c = 0; c < CPU_SETSIZE && per > 0; c++)
        if (CPU_ISSET(c, set)) {
            if (seen >= k * per && seen < (k + 1) * per) cpus[got++] = c;
            seen++;
        }
    return got;
}

int sp_binding_split(const cpu_set_t *all, int lsize, int lrank, const cpu_set_t *near,
                     int *cpus)
{
    int n = 0;
    if (disjoint(all, lsize)) { /* the launcher split them: each keeps its own */
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &all[lrank])) cpus[n++] = c;
        return n;
    }
    cpu_set_t uni;
    CPU_ZERO(&uni);
    for (int i = 0; i < lsize; i++) CPU_OR(&uni, &uni, &all[i]);
    if (near && CPU_COUNT(&near[lrank])) {
        /* the ranks whose GPUs are near the same CPUs share those CPUs */
        cpu_set_t mine;
        CPU_AND(&mine, &uni, &near[lrank]);
        int group = 0, pos = 0;
        for (int i = 0; i < lsize; i++)
            if (CPU_EQUAL(&near[i], &near[lrank])) {
                if (i < lrank) pos++;
                group++;
            }
        if (CPU_COUNT(&mine) >= group && (n = part_of(&mine, pos, group, cpus)) > 0) return n;
    }
    return part_of(&uni, lrank, lsize, cpus);
}
