/* The watchdog (STARPIPE_STEP_TIMEOUT): the main thread's waits, for a step's tasks and
 * for a collective outside tasks, given up when nothing moves for watchdog_s, after each
 * rank has said where it stood (stall.c). Relies on state.c, transfers.c (messages still
 * pending) and stall.c. */
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "runtime/exec/exec_int.h"

/* What a rank asking for reports waited on (the request's payload). */
enum { STALLED_TASKS = 0, STALLED_COLLECTIVE = 1 };
static const int stalled_on[2] = { STALLED_TASKS, STALLED_COLLECTIVE };

/* " saw no task finished": what the asker saw, for the asked rank's message */
static const char *asker_saw(int on)
{
    return on == STALLED_COLLECTIVE ? "waited in a collective" : "saw no task finished";
}

/* How long a stalled step waits for the other ranks' reports. */
static double watchdog_grace(void) { return X.opts.watchdog_s < 5 ? X.opts.watchdog_s : 5; }

/* Whether this MPI lets the main thread call it beside StarPU-MPI's thread. */
static int mpi_multiple(void)
{
    int level = 0;
    return MPI_Query_thread(&level) == MPI_SUCCESS && level >= MPI_THREAD_MULTIPLE;
}

/* Waits for this rank's tasks of the step. With a watchdog, gives up when tasks are
 * pending and none has finished for watchdog_s seconds: a hung task or a message that
 * never comes cannot be recalled, so the step is lost and the executor with it. */
sp_status sp_exec_wait_tasks(void)
{
    /* A group transport may fail asynchronously (NCCL: a dead or unreachable peer, seen
     * by its completion thread): with one, the wait polls for that too */
    int async = X.group && X.group->error;
    if (X.opts.watchdog_s <= 0 && !async) {
        SP_STARPU_CHECK(starpu_task_wait_for_all());
        return SP_OK;
    }
    unsigned long seen = atomic_load(&sp_exec_tasks_done_);
    double quiet_since = seconds_now();
    /* with a watchdog: a stalled rank may ask this one for its report */
    int asking = X.opts.watchdog_s > 0 && sp_exec_size_ > 1 && mpi_multiple(), asker, on;
    int pending;
    unsigned long heard = sp_exec_progress_wait(0, 0); /* completions so far */
    int heard_new = 0;                                 /* the last wait was woken by one */
    while ((pending = starpu_task_nsubmitted() + sp_exec_transfers_pending()) > 0) {
        /* once the tasks are done, the last messages may still be in flight: the main
         * thread, which has nothing else to do, tests them as the idle workers do */
        if (X.host->progress && starpu_task_nsubmitted() == 0) {
            if (!X.host->progress()) sched_yield();
        } else {
            /* the main thread only watches: it sleeps until a task or message completes,
             * or 2 ms. A completion wakes it just before StarPU or the transport counts it
             * done: where that may have been the last, it looks again 50 us later. */
            double nap = pending == 1 && heard_new ? 50e-6 : 2e-3;
            unsigned long n = sp_exec_progress_wait(heard, nap);
            heard_new = n != heard;
            heard = n;
        }
        const char *gerr = async ? X.group->error() : NULL;
        if (gerr) { /* the transport is dead: this step and the executor are lost */
            return sp_exec_give_up(sp_set_error(SP_ERR_RUNTIME, "rank %d: %s", sp_exec_rank_,
                                                gerr));
        }
        unsigned long done = atomic_load(&sp_exec_tasks_done_);
        if (X.opts.watchdog_s <= 0) {
            seen = done;
        } else if (done != seen) {
            seen = done;
            quiet_since = seconds_now();
        } else if (asking && (asker = sp_exec_report_asked(&on)) >= 0) {
            sp_exec_report_stall();
            sp_exec_tell_all(TAG_REPORTED, &sp_exec_rank_);
            X.broken = 1;
            /* the first rank to end aborts the others (the apps' MPI_Abort): not before
             * each has reported, or the grace is over (a rank whose main thread got no core
             * in time lost its line: app_hang_report at 3 ranks under load) */
            char missing[256] = "";
            sp_exec_await_reports(watchdog_grace(), asker, missing, sizeof missing);
            return sp_exec_give_up(sp_set_error(SP_ERR_TIMEOUT, "rank %d: rank %d %s for "
                                                "%.1f s (STARPIPE_STEP_TIMEOUT) and asked for "
                                                "each rank's state (above): the step is "
                                                "lost%s%s%s", sp_exec_rank_, asker,
                                                asker_saw(on), X.opts.watchdog_s,
                                                missing[0] ? "; no report from rank " : "",
                                                missing, missing[0] ? ", gone, stuck, or "
                                                "busy outside the executor" : ""));
        } else if (seconds_now() - quiet_since > X.opts.watchdog_s) {
            X.broken = 1;
            sp_exec_report_stall();
            char missing[256] = "";
            if (asking) {
                sp_exec_tell_all(TAG_STALLED, &stalled_on[STALLED_TASKS]);
                sp_exec_await_reports(watchdog_grace(), -1, missing, sizeof missing);
            }
            return sp_exec_give_up(sp_set_error(SP_ERR_TIMEOUT, "rank %d: no task finished "
                                                "for %.1f s while %d are pending: a message "
                                                "that never arrives, a hung task, or a peer "
                                                "that died (each rank's state is above%s%s%s)",
                                                sp_exec_rank_, X.opts.watchdog_s, pending,
                                                missing[0] ? "; no report from rank " : "",
                                                missing, missing[0] ? ", gone, stuck, or busy "
                                                "outside the executor" : ""));
        }
    }
    SP_STARPU_CHECK(starpu_task_wait_for_all());
    return SP_OK;
}

/* ---- collectives outside tasks, under the watchdog ----
 * The main thread's collectives (the step's agreement, the loss and norm reductions, a
 * checkpoint's broadcasts, the apps' own) wait for every rank: a peer that died or is
 * stuck would hold them forever, where no task watchdog looks. With a watchdog they are
 * posted nonblocking and tested until done, and given up when watchdog_s pass without
 * their end, as a step's tasks are. Without one, the blocking calls of before (the same
 * bits and speed). The main thread may test beside StarPU-MPI's thread only under
 * MPI_THREAD_MULTIPLE; under less the blocking calls stay. */

void sp_exec_label_step(long step) { X.step_label = step; }

/* "step 3" (the caller's numbering), else the executor's own */
static void step_name(char *b, size_t len)
{
    if (X.step_label > 0)
        snprintf(b, len, "step %ld", X.step_label);
    else
        snprintf(b, len, "executor step %llu", (unsigned long long)sp_exec_step_);
}

static int post_collective(const sp_exec_coll *c, MPI_Request *q)
{
    int n = c->count;
    switch (c->kind) {
    case SP_COLL_ALLREDUCE:
        return q ? MPI_Iallreduce(c->send, c->recv, n, c->type, c->op, c->comm, q)
                 : MPI_Allreduce(c->send, c->recv, n, c->type, c->op, c->comm);
    case SP_COLL_BCAST:
        return q ? MPI_Ibcast(c->recv, n, c->type, c->root, c->comm, q)
                 : MPI_Bcast(c->recv, n, c->type, c->root, c->comm);
    case SP_COLL_GATHER:
        return q ? MPI_Igather(c->send, n, c->type, c->recv, n, c->type, c->root, c->comm, q)
                 : MPI_Gather(c->send, n, c->type, c->recv, n, c->type, c->root, c->comm);
    case SP_COLL_ALLGATHER:
        return q ? MPI_Iallgather(c->send, n, c->type, c->recv, n, c->type, c->comm, q)
                 : MPI_Allgather(c->send, n, c->type, c->recv, n, c->type, c->comm);
    case SP_COLL_BARRIER:
        return q ? MPI_Ibarrier(c->comm, q) : MPI_Barrier(c->comm);
    }
    return MPI_ERR_ARG;
}

static const char *const coll_call[] = { "MPI_Allreduce", "MPI_Bcast", "MPI_Gather",
                                         "MPI_Allgather", "MPI_Barrier" };

/* How long a collective waits before it gives up: a second more than a step's tasks, so
 * that where a task hangs or a message is lost, the rank that sees it (whose line says
 * which task and which message) speaks first and asks the others, a rank in a collective
 * knowing only that somebody did not come. */
static double collective_limit(void) { return X.opts.watchdog_s + 1.0; }

sp_status sp_exec_collective(const sp_exec_coll *c)
{
    const char *call = coll_call[c->kind];
    if (X.opts.watchdog_s <= 0 || !mpi_multiple()) {
        int rc = post_collective(c, NULL);
        return rc == MPI_SUCCESS ? SP_OK : sp_comm_mpi_error(__FILE__, __LINE__, call, rc);
    }
    MPI_Request q;
    int rc = post_collective(c, &q), done = 0, asker = -1, on = 0;
    if (rc != MPI_SUCCESS)
        return sp_comm_mpi_error(__FILE__, __LINE__, call, rc);
    double t0 = seconds_now(), now = t0, limit = collective_limit();
    for (;;) {
        if ((rc = MPI_Test(&q, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
            return sp_comm_mpi_error(__FILE__, __LINE__, call, rc);
        if (done)
            return SP_OK;
        /* Polled as the blocking call would for the first milliseconds (a collective
         * between busy ranks ends in microseconds); then a look every millisecond, as a
         * peer may be writing a checkpoint (each test also moves the collective on) */
        now = seconds_now();
        if (now - t0 < 0.02) {
            sched_yield();
            continue;
        }
        if (now - t0 > limit)
            break;
        if (sp_exec_size_ > 1 && (asker = sp_exec_report_asked(&on)) >= 0)
            break;
        nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
    }
    /* The request cannot be recalled (MPI has no cancel for collectives): it stays
     * posted, as a lost step's tasks stay with StarPU, and the executor is given up. */
    char step[48];
    step_name(step, sizeof step);
    X.broken = 1;
    fprintf(stderr, "starpipe: rank %d: stalled: %s: in %s (%s) for %.1f s, which every rank "
            "must join\n", sp_exec_rank_, step, c->what, call, now - t0);
    fflush(stderr);
    if (asker >= 0) { /* a rank whose own wait ran out asked: it ends the run */
        sp_exec_tell_all(TAG_REPORTED, &sp_exec_rank_);
        char missing[256] = "";
        sp_exec_await_reports(watchdog_grace(), asker, missing, sizeof missing);
        return sp_exec_give_up(sp_set_error(SP_ERR_TIMEOUT, "rank %d: %s: in %s when rank "
                                            "%d %s for %.1f s (STARPIPE_STEP_TIMEOUT) and "
                                            "asked for each rank's state (above)%s%s%s",
                                            sp_exec_rank_, step, c->what, asker,
                                            asker_saw(on), X.opts.watchdog_s,
                                            missing[0] ? "; no report from rank " : "",
                                            missing, missing[0] ? ", gone, stuck, or busy "
                                            "outside the executor" : ""));
    }
    char missing[256] = "";
    if (sp_exec_size_ > 1) {
        sp_exec_tell_all(TAG_STALLED, &stalled_on[STALLED_COLLECTIVE]);
        sp_exec_await_reports(watchdog_grace(), -1, missing, sizeof missing);
    }
    return sp_exec_give_up(sp_set_error(SP_ERR_TIMEOUT, "rank %d: %s: %s did not end in "
                                        "%.1f s (STARPIPE_STEP_TIMEOUT + 1 s): a peer that "
                                        "died or is stuck (each rank's state is above%s%s%s)",
                                        sp_exec_rank_, step, c->what, limit,
                                        missing[0] ? "; no report from rank " : "", missing,
                                        missing[0] ? ", gone, stuck, or busy outside the "
                                                     "executor" : ""));
}
