/* The thread-local last-error message behind sp_last_error(). */
#include "starpipe/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[SP_ERROR_MAX];

const char *sp_last_error(void) { return last_error; }

void sp_clear_error(void) { last_error[0] = '\0'; }

sp_status sp_set_error(sp_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

/* n bytes of s, backed up so that no UTF-8 sequence is cut: a continuation byte
 * (10xxxxxx) at s[n] means s[n-1..] began a character that does not fit. */
static size_t utf8_cut(const char *s, size_t n)
{
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    return n;
}
/* The first byte from s + n on that starts a character. */
static size_t utf8_start(const char *s, size_t n)
{
    while (s[n] && ((unsigned char)s[n] & 0xC0) == 0x80) n++;
    return n;
}

/* "context: cause". Both strings are copied out of last_error first, so the message is
 * never both read and written by one call (sp_set_error("x: %s", sp_last_error()) is
 * undefined, and glibc writes "x: " over the cause before it reads it: "x: x: se"). When
 * the two do not fit, the lowest cause, at the end, is what must survive: a long context
 * keeps at least half of the room (cut with "..."), and a cause longer than what is left
 * keeps its head (its own outer contexts) and its tail (the lowest cause) around "...". */
sp_status sp_error_context(sp_status code, const char *fmt, ...)
{
    char ctx[SP_ERROR_MAX], cause[SP_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    if (n < 0) ctx[0] = '\0';
    memcpy(cause, last_error, sizeof cause);
    cause[sizeof cause - 1] = '\0';
    size_t lc = strlen(ctx), lp = strlen(cause);
    const size_t room = sizeof last_error - 1;
    if (!lp) { /* nothing to add context to */
        memcpy(last_error, ctx, lc + 1);
        return code;
    }
    if (!lc) return code;
    if (lc + 2 + lp <= room) {
        memcpy(last_error, ctx, lc);
        memcpy(last_error + lc, ": ", 2);
        memcpy(last_error + lc + 2, cause, lp + 1);
        return code;
    }
    char *o = last_error;
    size_t keep = lp + 2 < room && room - 2 - lp > room / 2 ? room - 2 - lp : room / 2;
    if (lc > keep) { /* the context: its head, then "..." */
        size_t k = utf8_cut(ctx, keep - 3);
        memcpy(o, ctx, k), o += k;
        memcpy(o, "...", 3), o += 3;
    } else {
        memcpy(o, ctx, lc), o += lc;
    }
    memcpy(o, ": ", 2), o += 2;
    size_t avail = room - (size_t)(o - last_error);
    if (lp <= avail) {
        memcpy(o, cause, lp + 1);
        return code;
    }
    /* the cause: a quarter of what is left from its head, "...", the rest from its tail */
    size_t head = utf8_cut(cause, (avail - 3) / 4);
    size_t tail = utf8_start(cause, lp - (avail - 3 - head));
    memcpy(o, cause, head), o += head;
    memcpy(o, "...", 3), o += 3;
    memcpy(o, cause + tail, lp - tail + 1);
    return code;
}

const char *sp_status_name(sp_status s)
{
    switch (s) {
    case SP_OK: return "SP_OK";
    case SP_ERR_ARG: return "SP_ERR_ARG";
    case SP_ERR_SHAPE: return "SP_ERR_SHAPE";
    case SP_ERR_GRAPH: return "SP_ERR_GRAPH";
    case SP_ERR_SCHEDULE: return "SP_ERR_SCHEDULE";
    case SP_ERR_IO: return "SP_ERR_IO";
    case SP_ERR_NOMEM: return "SP_ERR_NOMEM";
    case SP_ERR_RUNTIME: return "SP_ERR_RUNTIME";
    case SP_ERR_FORMAT: return "SP_ERR_FORMAT";
    case SP_ERR_NUMERIC: return "SP_ERR_NUMERIC";
    case SP_ERR_TIMEOUT: return "SP_ERR_TIMEOUT";
    }
    return "SP_ERR_UNKNOWN";
}
