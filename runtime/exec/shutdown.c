/* The end: the executor shut down (StarPU, StarPU-MPI, the transports, MPI if it started
 * it), or the whole job aborted. Relies on state.c, trace.c, tasks.c, transfers.c,
 * watchdog.c (the barrier before) and device.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <starpu_mpi.h>

#include "runtime/exec/device.h"
#include "sched/policy.h"
#include "runtime/exec/exec_int.h"

_Noreturn void sp_exec_abort(int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "starpipe: rank %d: %s\n", sp_exec_rank_, msg);
    fflush(stderr);
    if (code == 0)
        code = 1;
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    /* A step given up by the watchdog ends on every rank at about the same time (the same
     * timeout and grace): a second before the launcher kills them, so that the others'
     * last lines (which ranks and hosts did not answer) are out too. */
    if (X.broken)
        nanosleep(&(struct timespec){ 1, 0 }, NULL);
    if (up && !down)
        MPI_Abort(MPI_COMM_WORLD, code); /* the launcher then kills every rank */
    exit(code);
}

sp_status sp_exec_shutdown(void)
{
    if (!X.started)
        return sp_set_error(SP_ERR_ARG, "sp_exec_shutdown: not initialized");
    if (X.broken) /* StarPU would wait forever for the lost step's tasks */
        return sp_exec_broken_error("sp_exec_shutdown");
    /* a peer gone since the last step would hold StarPU-MPI's shutdown and MPI_Finalize */
    sp_status st;
    if (X.opts.watchdog_s > 0 &&
        (st = sp_exec_collective(&(sp_exec_coll){ .kind = SP_COLL_BARRIER, .comm = X.comm,
                                                   .what = "the shutdown's barrier" })))
        return st;
    X.started = 0;
    starpu_task_wait_for_all();
    if (X.group)
        X.group->shutdown();
    X.group = NULL;
    sp_exec_dev_stop();
    /* every request ended with its step */
    sp_policy_set_idle_poll(NULL);
    X.host->shutdown();
    /* Waits for all tasks and MPI requests, then stops StarPU too (it started it). */
    SP_STARPU_CHECK(starpu_mpi_shutdown());
    free(X.seen);
    X.seen = NULL;
    free(X.hosts);
    X.hosts = NULL;
    free(X.sent_to);
    X.sent_to = NULL;
    sp_exec_free_args(); /* a step ended without sp_exec_end_step */
    free(X.args);
    X.args = NULL;
    X.args_cap = 0;
    sp_exec_transfers_shutdown();
    sp_exec_trace_shutdown();
    SP_MPI_CHECK(MPI_Comm_free(&X.comm));
    if (X.mpi_ours)
        SP_MPI_CHECK(MPI_Finalize());
    return SP_OK;
}
