/* Minimal test harness shared by the C tests: CHECK counts failures, and main() ends with
 * `return check_summary(name)`, which fails the test if any CHECK failed. */
#ifndef STARPIPE_TESTS_CHECK_H
#define STARPIPE_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int check_failures, check_count;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        check_count++;                                                                     \
        if (!(cond)) {                                                                     \
            check_failures++;                                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                           \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* Aborts the test at once: for setup failures after which nothing can be checked. */
#define REQUIRE(cond, ...)                                                                 \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "FATAL %s:%d: ", __FILE__, __LINE__);                          \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* "dir/name" in one of eight rotating buffers: eight results stay valid at once. */
static inline const char *check_path(const char *dir, const char *name)
{
    static char buf[8][768];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static inline int check_summary(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, check_count, check_failures);
    return check_failures ? 1 : 0;
}

#endif
