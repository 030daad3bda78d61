/* The host buffers the kernels work on (runtime/exec/buf.c, sp_exec_host_alloc):
 * - every one starts on a 64-byte cache line, small or large: glibc's large mallocs start
 *   16 bytes into a page, and the kernels' vectors then straddle two lines (7% of the
 *   large GPT config's step on a Xeon). Without starpu_malloc_set_align(64) in
 *   sp_exec_init, the sizes past glibc's mmap threshold fail here;
 * - large ones get transparent huge pages: a 16 MB buffer's mapping must hold some in
 *   /proc/self/smaps wherever THP is not "never". Without the madvise, a machine whose THP
 *   is "madvise" (these VMs) gives none, and the test fails. That part is skipped where
 *   THP is off or absent; the whole test (77) on a rank with a GPU, whose host buffers
 *   are the CUDA driver's pinned memory. */
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

/* Buffers of sizes on both sides of glibc's mmap threshold (128 KB, raised as mapped
 * chunks are freed): each must start on a cache line. */
static void check_alignment(void)
{
    static const size_t sizes[] = { 4, 100, 4096 + 4, 200 << 10, (1 << 20) + 12, 3 << 20 };
    void *p[sizeof sizes / sizeof *sizes];
    for (int round = 0; round < 2; round++) { /* the second after frees moved the threshold */
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            p[i] = sp_exec_host_alloc(sizes[i]);
            RT_CHECK(p[i] != NULL, "no host buffer of %zu bytes", sizes[i]);
            RT_CHECK((uintptr_t)p[i] % 64 == 0,
                     "a host buffer of %zu bytes starts %u bytes into a cache line", sizes[i],
                     (unsigned)((uintptr_t)p[i] % 64));
        }
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
            sp_exec_host_free(p[i], sizes[i]);
    }
    printf("host buffers of 4 B to 3 MB start on cache lines\n");
}

int main(int argc, char **argv)
{
    RT_OK(sp_exec_init(&argc, &argv, &(sp_exec_opts){ .watchdog_s = 20 }));
    if (sp_exec_num_devices() > 0) { /* host buffers are the CUDA driver's pinned memory */
        printf("SKIP: this rank has a GPU\n");
        sp_exec_shutdown();
        return 77;
    }
    check_alignment();
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        if (!fgets(mode, sizeof mode, f)) mode[0] = '\0';
        fclose(f);
    }
    if (!mode[0] || strstr(mode, "[never]")) {
        printf("transparent huge pages are off here (%s): not checked\n",
               mode[0] ? mode : "absent");
        sp_exec_shutdown();
        return 0;
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
