/* What a stalled rank says (STARPIPE_STEP_TIMEOUT): its line (the last task done, the
 * tasks running, the next in order and the messages it waits for), and the requests and
 * answers by which every rank prints its own. Relies on state.c, transfers.c (the step's
 * messages) and the policy's position in the rank's order. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/policy.h"
#include "runtime/exec/exec_int.h"

/* ---- a stalled step: what each rank last did and waits for (STARPIPE_STEP_TIMEOUT) ----
 * The rank whose watchdog fires first prints its line and asks every other rank for
 * theirs (a message on X.comm; point-to-point, it never meets the agreement
 * collectives there), then waits a little for their answers before it gives up the
 * step: the process is about to end, and the launcher takes the others with it. A rank
 * asked prints its line, answers everyone, and gives up too. */

static struct task_args *args_of(uint32_t seq)
{
    for (size_t i = 0; i < X.nargs; i++)
        if (X.args[i]->seq == seq)
            return X.args[i];
    return NULL;
}

static void put(char *b, size_t len, size_t *k, const char *fmt, ...)
{
    if (*k >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b + *k, len - *k, fmt, ap);
    va_end(ap);
    *k = n < 0 ? len : *k + (size_t)n;
}

/* "receive #7 from rank 1 on node1 (tag 0x200000007)" */
static void put_message(char *b, size_t len, size_t *k, const transfer_info *t)
{
    put(b, len, k, "%s #%u %s rank %d on %s", t->is_send ? "send" : "receive", t->msg,
        t->is_send ? "to" : "from", t->peer, sp_exec_host_of(t->peer));
    if (X.host->tag)
        put(b, len, k, " (tag %#" PRIx64 ")", (uint64_t)X.host->tag(t->msg));
}

/* One line: the step, the last task done, the tasks running, the next task of the order
 * and the message it waits for, then the messages pending. Tasks are named with their
 * place in the rank's order (#seq) and messages with the plan's number. */
void sp_exec_report_stall(void)
{
    char b[1024];
    size_t k = 0, len = sizeof b;
    double now = seconds_now();
    /* (no step number: callers number their steps themselves) */
    put(b, len, &k, "starpipe: rank %d: stalled: ", sp_exec_rank_);
    unsigned last = atomic_load(&sp_exec_last_done_);
    struct task_args *a = last ? args_of(last - 1) : NULL;
    if (a)
        put(b, len, &k, "last task done '%s' (#%u)", a->name, a->seq);
    else
        put(b, len, &k, "no task of the step done");
    int running = 0;
    for (size_t i = 0; i < X.nargs; i++) {
        a = X.args[i];
        if (atomic_load(&a->state) == TASK_RUNNING)
            put(b, len, &k, "; running '%s' (#%u) for %.1f s", a->name, a->seq,
                now - a->started), running++;
    }
    uint32_t next;
    int ready;
    sp_policy_position(&next, &ready);
    a = args_of(next);
    if (!a) {
        put(b, len, &k, "; next in order #%u %s", next,
            next >= X.nsubmitted ? "(none: all submitted ran)" : "not submitted");
    } else if (atomic_load(&a->state) == TASK_QUEUED) {
        put(b, len, &k, "; next in order '%s' (#%u) ", a->name, a->seq);
        /* per buffer, the last message on it submitted before the task, if not done: a
         * receive it reads or overwrites, or a send of what it overwrites (StarPU's
         * sequential consistency orders them by submission) */
        int waits = 0;
        for (int j = 0; j < a->nbufs; j++) {
            const transfer_info *last = NULL;
            for (size_t i = 0; i < sp_exec_nxfers_; i++)
                if (sp_exec_xfers_[i]->h == a->handles[j] && sp_exec_xfers_[i]->order < a->order)
                    last = sp_exec_xfers_[i];
            if (last && !atomic_load(&last->done) && (!last->is_send || a->writes[j])) {
                put(b, len, &k, waits++ ? ", " : "waits for ");
                put_message(b, len, &k, last);
            }
        }
        if (!waits)
            put(b, len, &k, ready ? "is ready, no worker free" : "waits for its inputs");
    }
    int pending = 0;
    for (size_t i = 0; i < sp_exec_nxfers_; i++) {
        const transfer_info *t = sp_exec_xfers_[i];
        if (atomic_load(&t->done))
            continue;
        if (pending++ < 4) {
            put(b, len, &k, pending == 1 ? "; pending: " : ", ");
            put_message(b, len, &k, t);
        }
    }
    if (pending > 4)
        put(b, len, &k, " and %d more", pending - 4);
    else if (!pending)
        put(b, len, &k, "; no message pending");
    if (k >= len) /* cut: end it visibly */
        memcpy(b + len - 5, "...", 4);
    fprintf(stderr, "%s\n", b);
    fflush(stderr);
}

/* Sends tag, with *what, to every other rank (not waited for: the sends are eager, and
 * the process ends soon; what must outlive them). */
void sp_exec_tell_all(int tag, const int *what)
{
    for (int r = 0; r < sp_exec_size_; r++) {
        if (r == sp_exec_rank_)
            continue;
        MPI_Request q;
        if (MPI_Isend(what, 1, MPI_INT, r, tag, X.comm, &q) == MPI_SUCCESS)
            MPI_Request_free(&q);
    }
}

/* The rank that asked for reports, if one has, and what it waited on (*on); -1 if none. */
int sp_exec_report_asked(int *on)
{
    int flag = 0;
    MPI_Status stat;
    if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_STALLED, X.comm, &flag, &stat) != MPI_SUCCESS || !flag)
        return -1;
    MPI_Recv(on, 1, MPI_INT, stat.MPI_SOURCE, TAG_STALLED, X.comm, MPI_STATUS_IGNORE);
    return stat.MPI_SOURCE;
}

/* Waits up to grace seconds for every other rank's report (its answer, or its own
 * request: it reported first), asker's excepted (its request was taken already, or -1);
 * writes the ranks that did not answer to missing, if given. */
void sp_exec_await_reports(double grace, int asker, char *missing, size_t len)
{
    unsigned char *seen = calloc((size_t)sp_exec_size_, 1);
    if (!seen) {
        if (missing)
            snprintf(missing, len, "(out of memory)");
        return;
    }
    int left = sp_exec_size_ - 1;
    if (asker >= 0 && asker < sp_exec_size_ && asker != sp_exec_rank_) {
        seen[asker] = 1;
        left--;
    }
    double until = seconds_now() + grace;
    while (left > 0 && seconds_now() < until) {
        int flag = 0, who;
        MPI_Status stat;
        if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, X.comm, &flag, &stat) != MPI_SUCCESS)
            break;
        if (!flag) {
            nanosleep(&(struct timespec){ 0, 2000000 }, NULL);
            continue;
        }
        if (stat.MPI_TAG != TAG_STALLED && stat.MPI_TAG != TAG_REPORTED)
            continue; /* not ours: cannot be, between agreement collectives */
        MPI_Recv(&who, 1, MPI_INT, stat.MPI_SOURCE, stat.MPI_TAG, X.comm, MPI_STATUS_IGNORE);
        if (!seen[stat.MPI_SOURCE]) {
            seen[stat.MPI_SOURCE] = 1;
            left--;
        }
    }
    if (missing) { /* "2, 3 on node1 (all its ranks); 5 on node2" */
        size_t k = 0;
        missing[0] = '\0';
        for (int r = 0; r < sp_exec_size_ && left > 0; r++) {
            if (r == sp_exec_rank_ || seen[r]) /* it answered, or is listed already */
                continue;
            const char *h = sp_exec_host_of(r);
            int all = 1, n = 0;
            for (int q = r; q < sp_exec_size_; q++) {
                if (strcmp(sp_exec_host_of(q), h)) continue;
                if (q == sp_exec_rank_ || seen[q] == 1) all = 0;
                else seen[q] = 2, put(missing, len, &k, "%s%d", n++ ? ", " : k ? "; " : "", q);
            }
            for (int q = 0; q < r; q++)
                if (!strcmp(sp_exec_host_of(q), h) && (q == sp_exec_rank_ || seen[q] == 1))
                    all = 0;
            put(missing, len, &k, " on %s%s", h, all ? " (all its ranks)" : "");
        }
    }
    free(seen);
}
