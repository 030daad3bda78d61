/* The thread-local last-error message behind sp_last_error(). */
#include "starpipe/status.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

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
