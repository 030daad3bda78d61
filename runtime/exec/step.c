/* Steps: a step begun (counters, traces and messages of the last one cleared), its tasks
 * waited for (watchdog.c), and its outcome agreed by every rank: the error of the lowest
 * failing rank. Relies on state.c, trace.c, tasks.c, transfers.c and watchdog.c. */
#include <string.h>

#include "sched/policy.h"
#include "runtime/exec/exec_int.h"


void sp_exec_cancel_step(void)
{
    if (X.started && X.in_step) {
        X.in_step = 0;
        X.broken = 1;
    }
}

sp_status sp_exec_begin_step(void)
{
    if (!X.started)
        return sp_set_error(SP_ERR_ARG, "sp_exec_begin_step: sp_exec_init first");
    if (X.broken)
        return sp_exec_broken_error("sp_exec_begin_step");
    if (X.in_step)
        return sp_set_error(SP_ERR_ARG, "sp_exec_begin_step: step %llu has not ended",
                            (unsigned long long)sp_exec_step_);
    sp_status st = sp_policy_begin_step();
    if (st)
        return st;
    sp_exec_step_++;
    X.host->begin_step(sp_exec_step_);
    if (X.group) X.group->begin_step(sp_exec_step_);
    if (X.seen)
        memset(X.seen, 0, X.seen_cap);
    X.nsubmitted = 0;
    X.max_seq = 0;
    sp_exec_free_transfers(); /* the last step's, all done: it drained */
    atomic_store(&sp_exec_last_done_, 0);
    sp_exec_trace_clear();
    atomic_store(&sp_exec_step_failed_, 0);
    sp_exec_fail_msg_[0] = '\0';
    X.step_t0 = starpu_timing_now();
    X.in_step = 1;
    return SP_OK;
}

/* Which ranks are silent, from the drain's deadline thread (MPI_THREAD_MULTIPLE: the
 * progress thread sits in StarPU-MPI's barrier on its own communicator): the other live
 * ranks, stuck there too, ask and answer at the same time; "; no report from rank 2, 3 on
 * node1 (all its ranks)", then "; leaving". */
static void drain_silent(char *b, size_t len)
{
    static const int in_drain = 1; /* what it waited on: a collective */
    char missing[256] = "";
    if (sp_exec_size_ > 1) {
        sp_exec_tell_all(TAG_STALLED, &in_drain);
        sp_exec_await_reports(X.opts.watchdog_s < 5 ? X.opts.watchdog_s : 5, -1, missing,
                              sizeof missing);
    }
    snprintf(b, len, "%s%s; leaving", missing[0] ? "; no report from rank " : "", missing);
}

sp_status sp_exec_end_step(void)
{
    if (!X.started || !X.in_step)
        return sp_set_error(SP_ERR_ARG, "sp_exec_end_step: not inside a step");
    X.in_step = 0;

    /* Seqs with a gap would be held forever: let them drain and report it. */
    if (X.nsubmitted && (size_t)X.max_seq + 1 != X.nsubmitted) {
        uint32_t hole = 0;
        while (X.seen[hole])
            hole++;
        sp_policy_drain();
        sp_exec_fail_step("rank %d: step %llu: %zu tasks submitted but the largest seq is %u "
                          "(seq %u is missing)", sp_exec_rank_, (unsigned long long)sp_exec_step_,
                          X.nsubmitted, X.max_seq, hole);
    }

    /* All tasks here, then the rest of the step's messages (StarPU-MPI: all its requests,
     * a barrier too in StarPU 1.3, this rank's only in 1.4, mpi/src/starpu_mpi.c; direct:
     * this rank's), and the agreement below is the barrier. A rank whose watchdog fired
     * returns at once: its peers' barrier then waits for a process that is about to end,
     * and the launcher ends them with it. */
    sp_status st = sp_exec_wait_tasks();
    if (st)
        return st; /* tasks may still hold their arguments: kept, the executor is broken */
    sp_exec_free_args();
    /* StarPU-MPI's drain ends in its thread's MPI_Barrier, which no watchdog can leave: with
     * one, every rank first meets here, where a dead peer is seen */
    if (X.opts.watchdog_s > 0 && X.host == &sp_transport_starpu_mpi &&
        (st = sp_exec_collective(&(sp_exec_coll){
             .kind = SP_COLL_BARRIER, .comm = X.comm,
             .what = "the step's end (the barrier before StarPU-MPI's drain)" })))
        return st;
    /* and the drain itself: a peer stopped, killed or cut off after that barrier leaves
     * this rank in StarPU-MPI's MPI_Barrier for good (seen: a host frozen between the
     * two) */
    /* (after the timeout, the collective's second and the reports' grace: a rank whose
     * own watchdog fired speaks first) */
    double s = X.opts.watchdog_s, limit = s + 1.0 + (s < 5 ? s : 5);
    if (X.host == &sp_transport_starpu_mpi)
        sp_exec_deadline_arm(s > 0 ? limit : 0, drain_silent, "starpipe: rank %d on %s: step %lld: "
                             "StarPU-MPI's drain (its MPI_Barrier) did not end in %.1f s after "
                             "every rank met before it: a peer stopped, died or lost its link "
                             "since", sp_exec_rank_, sp_exec_host_of(sp_exec_rank_),
                             X.step_label > 0 ? (long long)X.step_label
                                              : (long long)sp_exec_step_, limit);
    st = X.host->drain();
    sp_exec_deadline_disarm();
    if (st)
        return st;

    /* Agreement: every rank returns the error of the lowest failing rank. */
    int failed = atomic_load(&sp_exec_step_failed_);
    int mine = failed ? sp_exec_rank_ : sp_exec_size_, lowest;
    if ((st = sp_exec_collective(&(sp_exec_coll){
             .kind = SP_COLL_ALLREDUCE, .send = &mine, .recv = &lowest, .count = 1,
             .type = MPI_INT, .op = MPI_MIN, .comm = X.comm,
             .what = "the step's agreement on its outcome" })))
        return st;
    if (lowest == sp_exec_size_)
        return SP_OK;
    if (X.host->renew && (st = X.host->renew()))
        return st;
    char msg[sizeof sp_exec_fail_msg_];
    if (failed)
        memcpy(msg, sp_exec_fail_msg_, sizeof msg);
    if ((st = sp_exec_collective(&(sp_exec_coll){
             .kind = SP_COLL_BCAST, .recv = msg, .count = (int)sizeof msg, .type = MPI_CHAR,
             .root = lowest, .comm = X.comm,
             .what = "the step's agreement (the failing rank's message)" })))
        return st;
    msg[sizeof msg - 1] = '\0';
    /* the message is the failing rank's own ("rank 1: task 'F mb0 s1' ..."): callers
     * number their steps themselves (the trainer runs two executor steps per step) */
    return sp_set_error(SP_ERR_RUNTIME, "%s", msg);
}
