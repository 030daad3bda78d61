/* What the benchmarks share: a monotonic clock in seconds, and the exit that names the
 * call that failed with the library's message. */
#ifndef STARPIPE_BENCH_UTIL_H
#define STARPIPE_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "starpipe/status.h"

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void bench_die(const char *prog, const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", prog, what, sp_last_error());
    exit(1);
}

#endif
