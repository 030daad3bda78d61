/* Large host buffers get transparent huge pages (runtime/exec/buf.c, sp_exec_host_alloc):
 * a 16 MB buffer's mapping must hold some in /proc/self/smaps wherever THP is not
 * "never". Without the madvise, a machine whose THP is "madvise" (these VMs) gives none,
 * and the test fails. Skipped (77) where THP is off or absent, and on a rank with a GPU. */
#include <inttypes.h>
#include <string.h>

#include "rt_check.h"

/* AnonHugePages (kB) of the mappings that overlap [p, p + bytes): the madvise splits the
 * buffer's mapping at its 2 MB-aligned interior. -1 if none is found. */
static long huge_kb(const void *p, size_t bytes)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int inside = 0;
    long total = -1, kb;
    const uintptr_t a = (uintptr_t)p, b = a + bytes;
    while (fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2) /* a mapping's line */
            inside = lo < b && hi > a;
        else if (inside && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1)
            total = (total < 0 ? 0 : total) + kb;
    }
    fclose(f);
    return total;
}

int main(int argc, char **argv)
{
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        if (!fgets(mode, sizeof mode, f)) mode[0] = '\0';
        fclose(f);
    }
    if (!mode[0] || strstr(mode, "[never]")) {
        printf("SKIP: transparent huge pages are off here (%s)\n", mode[0] ? mode : "absent");
        return 77;
    }
    RT_OK(sp_exec_init(&argc, &argv, &(sp_exec_opts){ .watchdog_s = 20 }));
    if (sp_exec_num_devices() > 0) { /* host buffers are the CUDA driver's pinned memory */
        printf("SKIP: this rank has a GPU\n");
        sp_exec_shutdown();
        return 77;
    }
    const size_t bytes = (size_t)16 << 20;
    float *p = sp_exec_host_alloc(bytes);
    RT_CHECK(p != NULL, "no 16 MB buffer");
    const long kb = huge_kb(p, bytes);
    printf("THP %s16 MB host buffer: AnonHugePages %ld kB\n", mode, kb);
    RT_CHECK(kb >= 2048, "a 16 MB host buffer has %ld kB in huge pages (THP: %s)", kb, mode);
    sp_exec_host_free(p, bytes);
    sp_exec_shutdown();
    return 0;
}
