/* How much memory a job may still take on this host (base/hostmem.h): MemAvailable, the
 * cgroup limits up this process's hierarchy, RLIMIT_AS; and huge pages for large buffers. */
#include "base/hostmem.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

/* The first number in the file at path (a cgroup's "max" or a missing file: -1). */
static double read_number(const char *path)
{
    FILE *f = fopen(path, "r");
    char buf[64] = "";
    if (!f) return -1;
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    char *end;
    double v = ok ? strtod(buf, &end) : -1;
    return ok && end != buf && v >= 0 ? v : -1;
}

/* Where the hierarchy of this cgroup line lives: the mount of cgroup2 (v2) or of v1's
 * memory controller, from mountinfo; the mount's root into root, its point into point. */
static int find_mount(const char *mountinfo_file, int v2, char *root, char *point, size_t len)
{
    FILE *f = fopen(mountinfo_file, "r");
    char line[4096];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        char r[PATH_MAX], p[PATH_MAX], *sep = strstr(line, " - ");
        if (!sep || sscanf(line, "%*s %*s %*s %4095s %4095s", r, p) != 2) continue;
        char type[64], src[256], opts[1024] = "";
        if (sscanf(sep + 3, "%63s %255s %1023s", type, src, opts) < 2) continue;
        int is_v2 = !strcmp(type, "cgroup2");
        int is_mem = !strcmp(type, "cgroup") && (strstr(opts, ",memory") ||
                                                 !strncmp(opts, "memory", 6));
        if ((v2 && is_v2) || (!v2 && is_mem)) {
            snprintf(root, len, "%s", r);
            snprintf(point, len, "%s", p);
            found = 1;
        }
    }
    if (f) fclose(f);
    return found;
}

/* The least limit-less-usage of the cgroup at path and its ancestors up to the mount. */
static double hierarchy_left(const char *point, const char *rel, int v2, char *why, size_t len)
{
    char dir[2 * PATH_MAX], file[2 * PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s%s", point, rel);
    size_t stop = strlen(point);
    double best = -1;
    for (;;) {
        snprintf(file, sizeof file, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
        double limit = read_number(file);
        snprintf(file, sizeof file, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
        double used = read_number(file);
        /* v1 says "no limit" with a number near 2^63 */
        if (limit >= 0 && limit < 9e18 && used >= 0) {
            double left = limit > used ? limit - used : 0;
            if (best < 0 || left < best) {
                best = left;
                snprintf(why, len, "the cgroup limit of %s (%s) less its usage", dir,
                         v2 ? "memory.max" : "memory.limit_in_bytes");
            }
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < stop || strlen(dir) <= stop) break;
        *slash = 0;
    }
    return best;
}

double sp_mem_cgroup_left(const char *cgroup_file, const char *mountinfo_file, char *why,
                          size_t len)
{
    FILE *f = fopen(cgroup_file, "r");
    char line[4096];
    double best = -1;
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = 0, *c2 = 0;
        const char *ctrl = c1 + 1, *path = c2 + 1;
        int v2 = !strcmp(line, "0") && !*ctrl;
        int mem = !v2 && (!strcmp(ctrl, "memory") || strstr(ctrl, ",memory") ||
                          !strncmp(ctrl, "memory,", 7));
        if (!v2 && !mem) continue;
        char root[PATH_MAX], point[PATH_MAX], w[3 * PATH_MAX];
        if (!find_mount(mountinfo_file, v2, root, point, sizeof root)) continue;
        /* the path inside the mount: less the mount's own root ("/" mostly) */
        size_t rl = strcmp(root, "/") ? strlen(root) : 0;
        if (rl && strncmp(path, root, rl)) continue;
        double left = hierarchy_left(point, path + rl, v2, w, sizeof w);
        if (left >= 0 && (best < 0 || left < best)) {
            best = left;
            snprintf(why, len, "%s", w);
        }
    }
    if (f) fclose(f);
    return best;
}

double sp_mem_available(char *why, size_t len)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0, avail;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "MemAvailable:", 13)) {
            kb = strtod(line + 13, NULL);
            break;
        }
    if (f) fclose(f);
    if (kb > 0) {
        avail = kb * 1024;
    } else {
        long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
        avail = pages > 0 && size > 0 ? (double)pages * size : 0;
    }
    snprintf(why, len, "MemAvailable");
    char w[3 * PATH_MAX];
    double cg = sp_mem_cgroup_left("/proc/self/cgroup", "/proc/self/mountinfo", w, sizeof w);
    if (cg >= 0 && (avail <= 0 || cg < avail)) {
        avail = cg;
        snprintf(why, len, "%s", w);
    }
    return avail;
}

double sp_mem_process_left(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY) return -1;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmSize:", 7)) {
            kb = strtod(line + 7, NULL);
            break;
        }
    if (f) fclose(f);
    double left = (double)rl.rlim_cur - kb * 1024;
    return left > 0 ? left : 0;
}

void sp_mem_want_huge_pages(void *p, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t lo = ((uintptr_t)p + SP_MEM_HUGE_PAGE - 1) & ~(SP_MEM_HUGE_PAGE - 1);
    const uintptr_t hi = ((uintptr_t)p + bytes) & ~(SP_MEM_HUGE_PAGE - 1);
    if (p && bytes >= SP_MEM_HUGE_MIN && hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p, (void)bytes;
#endif
}
