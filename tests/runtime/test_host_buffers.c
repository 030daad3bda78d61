/* The host buffers the kernels work on (runtime/exec/buf.c, sp_exec_host_alloc):
 * - every one starts on a 64-byte cache line, small or large: glibc's large mallocs start
 *   16 bytes into a page, and the kernels' vectors then straddle two lines (7% of the
 *   large GPT config's step on a Xeon). Without starpu_malloc_set_align(64) in
 *   sp_exec_init, the sizes past glibc's mmap threshold fail here;
 * - those of 4 MB and more start on a 2 MB boundary and lie on transparent huge pages
 *   from end to end: a 4 MB buffer's mapping must hold 4096 kB of them in
 *   /proc/self/smaps wherever THP is not "never". Without the madvise, a machine whose THP
 *   is "madvise" (these VMs) gives none; with it on the buffer's 2 MB-aligned interior
 *   alone (as before), 2048 kB; either fails. The huge pages are not checked where THP is
 *   off or absent; the whole test is skipped (77) on a rank with a GPU, whose host buffers
 *   are the CUDA driver's pinned memory. */
#include <inttypes.h>
#include <string.h>

#include "rt_check.h"

/* AnonHugePages (kB) of the mappings that overlap [p, p + bytes): the madvise splits the
 * buffer's mapping at its 2 MB pages. -1 if none is found. */
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
        mode[strcspn(mode, "\n")] = '\0';
        fclose(f);
    }
    if (!mode[0] || strstr(mode, "[never]")) {
        printf("transparent huge pages are off here (%s): not checked\n",
               mode[0] ? mode : "absent");
        sp_exec_shutdown();
        return 0;
    }
    static const size_t large[] = { (size_t)4 << 20, ((size_t)6 << 20) + 64 };
    for (size_t i = 0; i < sizeof large / sizeof *large; i++) {
        const size_t bytes = large[i], whole = bytes >> 21 << 11; /* kB in whole 2 MB pages */
        float *p = sp_exec_host_alloc(bytes);
        RT_CHECK(p != NULL, "no host buffer of %zu bytes", bytes);
        RT_CHECK((uintptr_t)p % ((uintptr_t)2 << 20) == 0,
                 "a host buffer of %zu bytes starts %zu bytes past a 2 MB boundary", bytes,
                 (size_t)((uintptr_t)p % ((uintptr_t)2 << 20)));
        p[bytes / 4 - 1] = 1.0f; /* its last float is its own */
        const long kb = huge_kb(p, bytes);
        printf("THP %s: host buffer of %zu bytes: AnonHugePages %ld kB (its 2 MB pages: %zu)\n",
               mode, bytes, kb, whole);
        RT_CHECK(kb >= (long)whole, "a host buffer of %zu bytes has %ld kB in huge pages, not "
                 "%zu (THP: %s)", bytes, kb, whole, mode);
        sp_exec_host_free(p, bytes);
    }
    sp_exec_shutdown();
    return 0;
}
