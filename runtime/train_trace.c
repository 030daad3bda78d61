/* The trace of a step (sp_train_opts.trace): what ran on this rank, named by the plan's
 * instructions (sp_tr_record_events), every actor's instruction times gathered on every
 * rank (sp_tr_gather_times), and what the host gets of them: the events, the timeline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec_impl.h" /* the all-reduce named for the watchdog */
#include "runtime/trainer_impl.h"

sp_status sp_tr_record_events(sp_trainer *t)
{
    const sp_exec_record *rec;
    size_t n;
    sp_status st = sp_exec_trace(&rec, &n);
    if (st) return st;
    if ((int)n > t->cap_events) {
        sp_train_event *e = realloc(t->events, n * sizeof *e);
        if (!e) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        t->events = e;
        t->cap_events = (int)n;
    }
    t->nevents = (int)n;
    for (size_t i = 0; i < n; i++) {
        sp_train_event *e = &t->events[i];
        snprintf(e->name, sizeof e->name, "%s", rec[i].name);
        e->transfer = rec[i].transfer;
        task_id id = rec[i].seq < t->seq ? t->seq_task[rec[i].seq] : (task_id){ -1, -1, -1, -1 };
        if (rec[i].transfer) /* a message: its plan instruction on this rank, or a replica
                                * collective's (numbered past the plan's, replicas.c) */
            id = (int64_t)rec[i].seq < t->plan->nmessages
                     ? (task_id){ -1, -1, -1, t->msg_instr[rec[i].seq] }
                     : (task_id){ SP_TR_COLLECTIVE, -1,
                                  (int)((rec[i].seq - t->plan->nmessages) / (3 * t->R)), -1 };
        e->instr = id.instr;
        e->kind = id.kind;
        e->mb = id.mb;
        e->stage = id.stage;
        e->start_us = rec[i].start_us;
        e->end_us = rec[i].end_us;
    }
    return SP_OK;
}

/* Every actor's instruction times of the step, on every rank: each rank fills its own
 * row, the others add zeros (exact), so one allreduce gathers them all. After the rows,
 * each stage's collectives (first start, last end; zeros when none). */
sp_status sp_tr_gather_times(sp_trainer *t)
{
    const sp_plan *pl = t->plan;
    size_t cells = (size_t)pl->nactors * (size_t)t->tmax, all = 2 * cells + 2 * (size_t)t->S;
    if (!t->tbuf) {
        t->tbuf = malloc(all * sizeof *t->tbuf + 1);
        t->tstart = malloc((size_t)pl->nactors * sizeof *t->tstart);
        t->tend = malloc((size_t)pl->nactors * sizeof *t->tend);
        if (!t->tbuf || !t->tstart || !t->tend) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        for (int a = 0; a < pl->nactors; a++) {
            t->tstart[a] = t->tbuf + (size_t)a * t->tmax;
            t->tend[a] = t->tbuf + cells + (size_t)a * t->tmax;
        }
    }
    memset(t->tbuf, 0, all * sizeof *t->tbuf);
    /* with replicas, replica 0 speaks for its actor, and tensor rank 0 for its group (the
     * others add zeros) */
    if (t->replica != 0 || t->trank != 0)
        return sp_exec_allreduce_sum_named(t->tbuf, all, 1, "the trace's all-reduce of times");
    double *ar = t->tbuf + 2 * cells; /* [2 s]: start, [2 s + 1]: end */
    double *mine = t->tstart[t->actor], *mine_end = t->tend[t->actor];
    for (int i = 0; i < pl->ninstr[t->actor]; i++) mine[i] = mine_end[i] = -1;
    double origin = sp_exec_step_origin_us();
    for (int e = 0; e < t->nevents; e++) {
        const sp_train_event *ev = &t->events[e];
        double t0 = 1e-6 * (origin + ev->start_us), t1 = 1e-6 * (origin + ev->end_us);
        if (ev->kind == SP_TR_COLLECTIVE && ev->stage >= 0 && ev->stage < t->S) {
            /* from its first task (messages count from their posting, at submission) to
             * its last task or message */
            double *c = ar + 2 * ev->stage;
            if (!ev->transfer && (c[0] == 0 || t0 < c[0])) c[0] = t0;
            if (t1 > c[1]) c[1] = t1;
        }
        if (ev->instr < 0) continue;
        mine[ev->instr] = t0;
        mine_end[ev->instr] = t1;
    }
    return sp_exec_allreduce_sum_named(t->tbuf, all, 1, "the trace's all-reduce of times");
}

sp_status sp_trainer_trace(sp_trainer *t, const sp_train_event **events, int *n)
{
    if (!t || !events || !n) return sp_set_error(SP_ERR_ARG, "sp_trainer_trace: NULL");
    *events = t->events;
    *n = t->nevents;
    return SP_OK;
}

/* ---- timeline of what ran --------------------------------------------------------- */

sp_status sp_trainer_write_timeline(sp_trainer *t, const char *json_path, const char *svg_path)
{
    if (!t) return sp_set_error(SP_ERR_ARG, "sp_trainer_write_timeline: NULL");
    if (!t->tbuf)
        return sp_set_error(SP_ERR_ARG, "sp_trainer_write_timeline: no step was traced");
    if (t->rank != 0) return SP_OK;
    const sp_plan *pl = t->plan;
    sp_status st = SP_OK;
    sp_sim_result r = { .nactors = pl->nactors, .nmessages = pl->nmessages,
                        .async_transfers = 1 };
    r.busy = calloc((size_t)pl->nactors, sizeof(double));
    r.idle = calloc((size_t)pl->nactors, sizeof(double));
    r.start = calloc((size_t)pl->nactors, sizeof(double *));
    r.end = calloc((size_t)pl->nactors, sizeof(double *));
    if (!r.busy || !r.idle || !r.start || !r.end) st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    /* times from the first measured start; instructions not measured drawn as empty */
    double t0 = -1;
    for (int a = 0; st == SP_OK && a < pl->nactors; a++)
        for (int i = 0; i < pl->ninstr[a]; i++)
            if (t->tstart[a][i] >= 0 && (t0 < 0 || t->tstart[a][i] < t0)) t0 = t->tstart[a][i];
    for (int a = 0; st == SP_OK && a < pl->nactors; a++) {
        r.start[a] = calloc((size_t)pl->ninstr[a] + 1, sizeof(double));
        r.end[a] = calloc((size_t)pl->ninstr[a] + 1, sizeof(double));
        if (!r.start[a] || !r.end[a]) {
            st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
            break;
        }
        for (int i = 0; i < pl->ninstr[a]; i++) {
            if (t->tstart[a][i] < 0) continue;
            r.start[a][i] = t->tstart[a][i] - t0;
            r.end[a][i] = t->tend[a][i] - t0;
            int op = pl->instr[a][i].op;
            if (op != SP_OP_SEND && op != SP_OP_RECV) r.busy[a] += r.end[a][i] - r.start[a][i];
            if (r.end[a][i] > r.step_time) r.step_time = r.end[a][i];
        }
    }
    /* the replicas' collectives of each stage, on a row of their own (sp_tr_gather_times) */
    const double *ar = t->tbuf + 2 * (size_t)pl->nactors * (size_t)t->tmax;
    if (st == SP_OK && t->R > 1) {
        r.nstages = t->S;
        r.ar_start = calloc((size_t)t->S, sizeof(double));
        r.ar_end = calloc((size_t)t->S, sizeof(double));
        if (!r.ar_start || !r.ar_end) st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        for (int s = 0; st == SP_OK && s < t->S; s++)
            if (ar[2 * s + 1] > ar[2 * s]) {
                r.ar_start[s] = ar[2 * s] - t0;
                r.ar_end[s] = ar[2 * s + 1] - t0;
                if (r.ar_end[s] > r.step_time) r.step_time = r.ar_end[s];
            }
    }
    double idle = 0;
    for (int a = 0; st == SP_OK && a < pl->nactors; a++) idle += r.idle[a] = r.step_time - r.busy[a];
    r.bubble_fraction = r.step_time > 0 ? idle / (pl->nactors * r.step_time) : 0;
    if (st == SP_OK && json_path) st = sp_sim_write_trace(pl, &r, json_path);
    if (st == SP_OK && svg_path) st = sp_sim_write_svg(pl, &r, svg_path);
    for (int a = 0; a < pl->nactors; a++) {
        if (r.start) free(r.start[a]);
        if (r.end) free(r.end[a]);
    }
    free(r.start), free(r.end), free(r.busy), free(r.idle), free(r.ar_start), free(r.ar_end);
    return st;
}
