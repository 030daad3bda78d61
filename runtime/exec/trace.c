/* Traces: a record per task and message of the step (sp_exec_trace), when opts.trace
 * asks. Relies on state.c (the step's start). */
#include <stdio.h>
#include <stdlib.h>

#include "runtime/exec/exec_int.h"

static starpu_pthread_mutex_t trace_lock = STARPU_PTHREAD_MUTEX_INITIALIZER;
static sp_exec_record *trace_recs;
static size_t trace_n, trace_cap, trace_dropped;

void sp_exec_trace_add(const char *name, uint32_t seq, double t0, double t1, int transfer,
                              int peer)
{
    STARPU_PTHREAD_MUTEX_LOCK(&trace_lock);
    if (trace_n == trace_cap) {
        size_t cap = trace_cap ? 2 * trace_cap : 256;
        sp_exec_record *r = realloc(trace_recs, cap * sizeof *r);
        if (r) {
            trace_recs = r;
            trace_cap = cap;
        }
    }
    if (trace_n < trace_cap) {
        sp_exec_record *r = &trace_recs[trace_n++];
        snprintf(r->name, sizeof r->name, "%s", name);
        r->seq = seq;
        r->worker = transfer ? -1 : starpu_worker_get_id();
        r->transfer = transfer;
        r->peer = peer;
        r->start_us = t0 - X.step_t0;
        r->end_us = t1 - X.step_t0;
    } else {
        trace_dropped++;
    }
    STARPU_PTHREAD_MUTEX_UNLOCK(&trace_lock);
}

int sp_exec_tracing(void) { return X.opts.trace; }

double sp_exec_step_origin_us(void) { return X.step_t0 - X.epoch; }

static int by_start(const void *a, const void *b)
{
    double x = ((const sp_exec_record *)a)->start_us, y = ((const sp_exec_record *)b)->start_us;
    return (x > y) - (x < y);
}

sp_status sp_exec_trace(const sp_exec_record **records, size_t *n)
{
    if (!records || !n)
        return sp_set_error(SP_ERR_ARG, "sp_exec_trace: NULL argument");
    STARPU_PTHREAD_MUTEX_LOCK(&trace_lock);
    qsort(trace_recs, trace_n, sizeof *trace_recs, by_start);
    *records = trace_recs;
    *n = trace_n;
    size_t dropped = trace_dropped;
    STARPU_PTHREAD_MUTEX_UNLOCK(&trace_lock);
    if (dropped)
        return sp_set_error(SP_ERR_NOMEM, "sp_exec_trace: %zu records lost (out of memory)",
                            dropped);
    return SP_OK;
}

void sp_exec_trace_clear(void)
{
    STARPU_PTHREAD_MUTEX_LOCK(&trace_lock);
    trace_n = 0;
    trace_dropped = 0;
    STARPU_PTHREAD_MUTEX_UNLOCK(&trace_lock);
}

void sp_exec_trace_shutdown(void)
{
    free(trace_recs);
    trace_recs = NULL;
    trace_n = trace_cap = 0;
}
