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

/* The host as sp_binding_split sees it: the PUs given, in their order, then any CPU of
 * the masks they miss, each as its own core with nothing known; at: OS index -> entry. */
typedef struct {
    sp_pu pu[CPU_SETSIZE];
    int at[CPU_SETSIZE];
    int n;
} host;

static void host_fill(host *h, const sp_pu *pus, int npus, const cpu_set_t *uni)
{
    h->n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) h->at[c] = -1;
    for (int i = 0; i < npus && h->n < CPU_SETSIZE; i++)
        if (pus[i].os >= 0 && pus[i].os < CPU_SETSIZE && h->at[pus[i].os] < 0) {
            h->at[pus[i].os] = h->n;
            h->pu[h->n++] = pus[i];
        }
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, uni) && h->at[c] < 0) {
            h->at[c] = h->n;
            h->pu[h->n++] = (sp_pu){ .os = c, .core = -1 - c, .numa = -1, .package = -1 };
        }
}

/* The PUs of set in the order threads take them: the first PU of each physical core (in
 * the host's order), then the cores' other hyperthreads. Returns the count; *ncores: how
 * many of them come first, one per core. */
static int ordered(const host *h, const cpu_set_t *set, int *cpus, int *ncores)
{
    int n = 0;
    char taken[CPU_SETSIZE] = { 0 };
    for (int i = 0; i < h->n; i++) {
        if (!CPU_ISSET(h->pu[i].os, set)) continue;
        int first = 1; /* no earlier PU of set on this core */
        for (int j = 0; j < n && first; j++)
            first = h->pu[h->at[cpus[j]]].core != h->pu[i].core;
        if (first) {
            taken[i] = 1;
            cpus[n++] = h->pu[i].os;
        }
    }
    *ncores = n;
    for (int i = 0; i < h->n; i++)
        if (!taken[i] && CPU_ISSET(h->pu[i].os, set)) cpus[n++] = h->pu[i].os;
    return n;
}

/* The NUMA node (else the package) under which the CPUs near a GPU sit, as the set of
 * that node's CPUs within uni; near itself when neither is known or it spans several. */
static void domain_of(const host *h, const cpu_set_t *near, const cpu_set_t *uni, cpu_set_t *dom)
{
    for (int level = 0; level < 2; level++) {
        int id = -2; /* -2: none seen yet; -1: unknown or several */
        for (int i = 0; i < h->n; i++)
            if (CPU_ISSET(h->pu[i].os, near)) {
                int v = level == 0 ? h->pu[i].numa : h->pu[i].package;
                id = id == -2 || id == v ? v : -1;
            }
        if (id < 0) continue;
        CPU_ZERO(dom);
        for (int i = 0; i < h->n; i++)
            if ((level == 0 ? h->pu[i].numa : h->pu[i].package) == id && CPU_ISSET(h->pu[i].os, uni))
                CPU_SET(h->pu[i].os, dom);
        return;
    }
    CPU_AND(dom, near, uni);
}

/* Part k of n of set: an even share of its physical cores, with their hyperthreads; with
 * more parts than cores, an even share of the hyperthreads (first ones first); else
 * nothing. Remainders stay unused, so that every part has the same count. */
static int part_of(const host *h, const cpu_set_t *set, int k, int n, int *cpus)
{
    int order[CPU_SETSIZE], ncores, total = ordered(h, set, order, &ncores);
    if (n <= 0) return 0;
    int per = ncores / n, got = 0;
    if (per > 0) {
        cpu_set_t mine;
        CPU_ZERO(&mine);
        for (int i = k * per; i < (k + 1) * per; i++)
            for (int q = 0; q < h->n; q++)
                if (h->pu[q].core == h->pu[h->at[order[i]]].core && CPU_ISSET(h->pu[q].os, set))
                    CPU_SET(h->pu[q].os, &mine);
        return ordered(h, &mine, cpus, &ncores);
    }
    per = total / n;
    for (int i = k * per; i < (k + 1) * per; i++) cpus[got++] = order[i];
    return got;
}

static int numa_of(const host *h, const int *cpus, int n)
{
    int id = -2;
    for (int i = 0; i < n; i++) {
        int v = h->pu[h->at[cpus[i]]].numa;
        id = id == -2 || id == v ? v : -1;
    }
    return id < 0 ? -1 : id;
}

int sp_binding_split(const sp_pu *pus, int npus, const cpu_set_t *masks, int lsize, int lrank,
                     const cpu_set_t *near, int *cpus, int *numa)
{
    cpu_set_t uni;
    CPU_ZERO(&uni);
    for (int i = 0; i < lsize; i++) CPU_OR(&uni, &uni, &masks[i]);
    host *h = malloc(sizeof *h);
    if (!h) return 0;
    host_fill(h, pus, npus, &uni);
    int n = 0, ncores;
    /* the launcher split them: each keeps its own (one rank: its GPU's node within it) */
    if (lsize > 1 && disjoint(masks, lsize)) {
        n = ordered(h, &masks[lrank], cpus, &ncores);
    } else {
        if (near && CPU_COUNT(&near[lrank])) {
            /* the ranks whose GPUs sit under the same node share its cores */
            cpu_set_t mine, other;
            domain_of(h, &near[lrank], &uni, &mine);
            int group = 0, pos = 0;
            for (int i = 0; i < lsize; i++) {
                if (!CPU_COUNT(&near[i])) continue;
                domain_of(h, &near[i], &uni, &other);
                if (CPU_EQUAL(&other, &mine)) {
                    pos += i < lrank;
                    group++;
                }
            }
            n = part_of(h, &mine, pos, group, cpus);
        }
        if (n == 0)
            n = part_of(h, &uni, lrank, lsize, cpus);
    }
    if (numa) *numa = numa_of(h, cpus, n);
    free(h);
    return n;
}
