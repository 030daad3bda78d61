/* Helpers shared by the fuzz targets: a failed property aborts with a message (libFuzzer
 * then saves the input as a crash), inputs are split into NUL-separated fields, and a file
 * path backed by memory (a memfd) lets file readers see the input without touching disk. */
#ifndef STARPIPE_FUZZ_UTIL_H
#define STARPIPE_FUZZ_UTIL_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FZ_CHECK(cond, ...)                                                              \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz property failed at %s:%d: %s: ", __FILE__, __LINE__,  \
                    #cond);                                                              \
            fprintf(stderr, __VA_ARGS__);                                                \
            fputc('\n', stderr);                                                         \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* Splits data into at most max NUL-terminated fields (copies into *store, caller frees). */
static inline int fz_split(const uint8_t *data, size_t n, char **field, int max, char **store)
{
    char *s = malloc(n + 1);
    if (!s) return 0;
    memcpy(s, data, n);
    s[n] = 0;
    *store = s;
    int k = 0;
    size_t start = 0;
    for (size_t i = 0; i <= n && k < max; i++)
        if (i == n || s[i] == 0) {
            field[k++] = s + start;
            start = i + 1;
        }
    return k;
}

/* A path naming a memory file holding exactly data[0..n). Reused between runs. */
static inline const char *fz_memfile(const char *tag, const uint8_t *data, size_t n)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create(tag, 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) || pwrite(fd, data, n, 0) != (ssize_t)n) abort();
    return path;
}

#endif
