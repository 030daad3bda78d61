/* Checks for the runtime tests: a failed check stops every rank at once (a rank that
 * merely returned would leave its peers waiting on its messages). */
#ifndef STARPIPE_RT_CHECK_H
#define STARPIPE_RT_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "starpipe/exec.h"

#define RT_OK(call)                                                                    \
    do {                                                                               \
        sp_status rt_st_ = (call);                                                     \
        if (rt_st_ != SP_OK)                                                           \
            sp_exec_abort(1, "%s:%d: %s returned %s: %s", __FILE__, __LINE__, #call,   \
                          sp_status_name(rt_st_), sp_last_error());                    \
    } while (0)

#define RT_CHECK(cond, ...)                                                            \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            char rt_m_[512];                                                           \
            snprintf(rt_m_, sizeof rt_m_, __VA_ARGS__);                                \
            sp_exec_abort(1, "%s:%d: check failed: %s: %s", __FILE__, __LINE__, #cond, \
                          rt_m_);                                                      \
        }                                                                              \
    } while (0)

static inline double rt_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Keeps a core busy for about us microseconds: stands in for a stage's compute. */
static inline void rt_spin_us(double us)
{
    double end = rt_now_s() + us * 1e-6;
    while (rt_now_s() < end)
        ;
}

#endif
