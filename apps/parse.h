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

#endif
