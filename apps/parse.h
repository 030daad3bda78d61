/* Strict number parsing for the apps' flags: the whole string must be a number in range,
 * else one clear line on stderr. Header-only. */
#ifndef STARPIPE_APP_PARSE_H
#define STARPIPE_APP_PARSE_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/status.h"

/* Parses a whole string as an int in [lo, hi]; prints a clear message on failure. */
static inline int app_parse_int(const char *flag, const char *s, long lo, long hi, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "error: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi,
                s ? s : "");
        return 0;
    }
    *out = (int)v;
    return 1;
}

static inline int app_parse_float(const char *flag, const char *s, double lo, double hi,
                                  float *out)
{
    char *end = NULL;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "error: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi,
                s ? s : "");
        return 0;
    }
    *out = (float)v;
    return 1;
}

/* A comma-separated list of at most `max` ints, each in [lo, hi] ("3,3,2"). */
static inline int app_parse_int_list(const char *flag, const char *s, long lo, long hi,
                                     int *out, int max, int *n)
{
    const char *p = s ? s : "";
    *n = 0;
    for (;;) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < lo || v > hi || (*end && *end != ',') || *n == max) {
            fprintf(stderr, "error: %s expects a comma-separated list of at most %d integers "
                    "in [%ld, %ld], got '%s'\n", flag, max, lo, hi, s ? s : "");
            return 0;
        }
        out[(*n)++] = (int)v;
        if (!*end) return 1;
        p = end + 1;
    }
}

/* --stage-layers must list one count per stage of the schedule: 0 when it does (or was
 * not given, n = 0), else an error naming both counts in *st. */
static inline int app_check_stage_layers(int n, int stages, sp_status *st)
{
    if (!n || n == stages) return 0;
    *st = sp_set_error(SP_ERR_ARG, "--stage-layers lists %d stages, but the schedule has %d", n,
                       stages);
    return -1;
}

#endif
