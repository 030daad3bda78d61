/* The end: the executor shut down (StarPU, StarPU-MPI, the transports, MPI if it started
 * it), or the whole job aborted. Relies on state.c, trace.c, tasks.c, transfers.c,
 * watchdog.c (the barrier before) and device.c. */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <starpu_mpi.h>

#include "runtime/exec/device.h"
#include "sched/policy.h"
#include "runtime/exec/exec_int.h"

/* MPI_Abort asks the launcher to end every rank, and waits for it. A launcher this host
 * cannot reach answers late: on a Slurm node cut off from srun, PMIx_Abort waited 20 s for
 * slurmstepd, which waited on srun (tests/hosts/hosts_slurm.sh). After ABORT_WAIT_S the
 * rank ends by itself; its local launcher daemon sees it gone. */
#define ABORT_WAIT_S 5

static void *exit_later(void *code)
{
    nanosleep(&(struct timespec){ ABORT_WAIT_S, 0 }, NULL);
    fprintf(stderr, "starpipe: rank %d: the launcher did not end the job within %d s of "
            "MPI_Abort (unreachable?): leaving\n", sp_exec_rank_, ABORT_WAIT_S);
    _exit((int)(intptr_t)code);
}

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
    if (up && !down) {
        pthread_t t;
        if (pthread_create(&t, NULL, exit_later, (void *)(intptr_t)code) == 0)
            pthread_detach(t);
        MPI_Abort(MPI_COMM_WORLD, code); /* the launcher then kills every rank */
    }
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
