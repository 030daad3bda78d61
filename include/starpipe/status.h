/* starpipe status codes and the last-error message.
 * Library functions return an sp_status (or a negative id) and never exit; the message
 * of the most recent failure on this thread is kept for sp_last_error(). */
#ifndef STARPIPE_STATUS_H
#define STARPIPE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    SP_OK = 0,
    SP_ERR_ARG = 1,     /* a bad argument: unknown name, out-of-range number */
    SP_ERR_SHAPE = 2,   /* tensor shapes do not fit the op */
    SP_ERR_GRAPH = 3,   /* the graph is malformed: no loss, a cycle, an unused stage */
    SP_ERR_SCHEDULE = 4,/* the schedule is invalid (a task missing, a cycle, ...) */
    SP_ERR_IO = 5,      /* a file could not be read or written */
    SP_ERR_NOMEM = 6,   /* an allocation failed */
    SP_ERR_RUNTIME = 7, /* StarPU, MPI, CUDA or NCCL reported a failure */
    SP_ERR_FORMAT = 8,  /* a file is malformed (schedule text, checkpoint) */
    SP_ERR_NUMERIC = 9, /* a loss or gradient is not finite */
    SP_ERR_TIMEOUT = 10 /* the watchdog saw no progress: a hung task or a lost peer */
} sp_status;

/* Bytes of the last-error message, its NUL included: longer messages are cut. */
#define SP_ERROR_MAX 1024

/* Message of the last failure on this thread ("" if none). */
const char *sp_last_error(void);

/* Records a failure: formats the message, returns code. For library internals. */
sp_status sp_set_error(sp_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Adds context to the failure recorded last: the message becomes "<context>: <previous
 * message>" (the context alone if there was none), formatted without reading and writing
 * the message at once, so that the cause survives any number of contexts. Too long, the
 * context is cut first, then the middle of the previous message, never its end (the
 * lowest cause). Returns code. Never pass sp_last_error() to sp_set_error: use this. */
sp_status sp_error_context(sp_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

void sp_clear_error(void);

/* Short name of a status ("SP_ERR_SHAPE"). */
const char *sp_status_name(sp_status s);

#ifdef __cplusplus
}
#endif
#endif
