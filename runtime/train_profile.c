/* What the steps of a run measured, kept for a cost model (sp_train_opts.profile,
 * sp_trainer_profile): each step's gathered instruction times of every actor (the trace's
 * all-reduce puts them on every rank), each owned stage program's per-op seconds (the CPU
 * tasks add them to a clock, codelets/tasks.h) and the AdamW updates' durations. Step 1
 * is left out: it pays first touches and lazy loading. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/tasks.h"
#include "runtime/exec_impl.h" /* the all-reduce named for the watchdog */
#include "runtime/trainer_impl.h"

struct sp_tr_profile {
    sp_op_clock *clock; /* [S * 4]: owned stages' programs */
    double *hist;       /* [nsteps][cells]: t->tbuf of each measured step */
    size_t cells;
    int nsteps, cap;
    double *opt;        /* [nsteps][S]: AdamW seconds of each owned stage */
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* 1 if instruction in reads buffer b */
static int reads(const sp_plan *pl, const sp_instr *in, sp_buf b)
{
    for (uint32_t q = 0; q < in->nacc; q++) {
        sp_buf x = pl->access[in->acc + q].buf;
        if (x.cls == b.cls && x.idx == b.idx && x.mb == b.mb && x.stage == b.stage) return 1;
    }
    return 0;
}

/* Task, message and gap times are means: a step adds up many of them, so its time
 * follows their mean, which on a shared machine sits above their median. */
static double mean(const double *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return n > 0 ? s / n : 0;
}

static double median(double *v, int n)
{
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

sp_status sp_tr_profile_init(sp_trainer *t)
{
    if (!t->o.profile) return SP_OK;
    if (!t->o.trace) return sp_set_error(SP_ERR_ARG, "trainer: profile needs trace");
    sp_tr_profile *pr = calloc(1, sizeof *pr);
    if (!pr || !(pr->clock = calloc((size_t)t->S * SP_NUM_TASK_KINDS, sizeof *pr->clock))) {
        free(pr);
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    }
    t->prof = pr;
    for (int k = 0; k < t->S * SP_NUM_TASK_KINDS; k++) {
        sp_op_clock *c = &pr->clock[k];
        pthread_mutex_init(&c->lock, NULL);
        c->nops = sp_program_num_ops(t->p, k / SP_NUM_TASK_KINDS, k % SP_NUM_TASK_KINDS);
        if (owns(t, k / SP_NUM_TASK_KINDS) && c->nops > 0 &&
            !(c->sum = calloc((size_t)c->nops, sizeof(double))))
            return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    }
    return SP_OK;
}

void sp_tr_profile_free(sp_trainer *t)
{
    sp_tr_profile *pr = t->prof;
    if (!pr) return;
    for (int k = 0; k < t->S * SP_NUM_TASK_KINDS; k++) {
        pthread_mutex_destroy(&pr->clock[k].lock);
        free(pr->clock[k].sum);
    }
    free(pr->clock), free(pr->hist), free(pr->opt), free(pr);
    t->prof = NULL;
}

sp_op_clock *sp_tr_profile_clock(sp_trainer *t, int stage, int kind)
{
    if (!t->prof || t->evaluating) return NULL;
    sp_op_clock *c = &t->prof->clock[stage * SP_NUM_TASK_KINDS + kind];
    return c->sum ? c : NULL;
}

/* After a step's pipelined phase and its gather: step 1 resets the clocks, later steps
 * keep the times. */
sp_status sp_tr_profile_step(sp_trainer *t)
{
    sp_tr_profile *pr = t->prof;
    if (!pr) return SP_OK;
    if (t->steps == 0) {
        for (int k = 0; k < t->S * SP_NUM_TASK_KINDS; k++)
            if (pr->clock[k].sum) {
                memset(pr->clock[k].sum, 0, (size_t)pr->clock[k].nops * sizeof(double));
                pr->clock[k].runs = 0;
            }
        return SP_OK;
    }
    pr->cells = 2 * (size_t)t->plan->nactors * (size_t)t->tmax + 2 * (size_t)t->S;
    if (pr->nsteps == pr->cap) {
        int cap = pr->cap ? 2 * pr->cap : 8;
        double *h = realloc(pr->hist, (size_t)cap * pr->cells * sizeof *h);
        if (h) pr->hist = h;
        double *o = h ? realloc(pr->opt, (size_t)cap * (size_t)t->S * sizeof *o) : NULL;
        if (o) pr->opt = o;
        if (!h || !o) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        pr->cap = cap;
    }
    memcpy(pr->hist + (size_t)pr->nsteps * pr->cells, t->tbuf, pr->cells * sizeof(double));
    memset(pr->opt + (size_t)pr->nsteps * t->S, 0, (size_t)t->S * sizeof(double));
    pr->nsteps++;
    return SP_OK;
}

/* After a step's update phase: its AdamW tasks' durations, by stage (a stage whose tied
 * parameters are sent updates them in a task of their own first: "AdamW tied s<s>"). */
void sp_tr_profile_update(sp_trainer *t)
{
    sp_tr_profile *pr = t->prof;
    const sp_exec_record *rec;
    size_t n;
    if (!pr || !pr->nsteps || t->steps == 0 || sp_exec_trace(&rec, &n)) return;
    double *row = pr->opt + (size_t)(pr->nsteps - 1) * t->S;
    for (size_t i = 0; i < n; i++) {
        int s;
        const char *at = strrchr(rec[i].name, ' '); /* "AdamW[ tied] s<stage>" */
        if (!rec[i].transfer && !strncmp(rec[i].name, "AdamW", 5) && at &&
            sscanf(at, " s%d", &s) == 1 && s >= 0 && s < t->S)
            row[s] += 1e-6 * (rec[i].end_us - rec[i].start_us);
    }
}

/* Whether any rank failed, agreed before the all-reduce of the sums: no rank then waits
 * in it for one that will not come. */
static int any_failed(int bad)
{
    double x = bad;
    return sp_exec_allreduce_sum_named(&x, 1, 1, "the profile's agreement") != SP_OK || x > 0;
}

sp_status sp_trainer_profile(sp_trainer *t, sp_train_profile *out)
{
    if (!t || !out) return sp_set_error(SP_ERR_ARG, "sp_trainer_profile: NULL argument");
    memset(out, 0, sizeof *out);
    sp_tr_profile *pr = t->prof;
    if (!pr || pr->nsteps < 1)
        return sp_set_error(SP_ERR_ARG, "sp_trainer_profile: no step measured (profile is "
                            "off, or the run made fewer than two steps)");
    const sp_plan *pl = t->plan;
    int S = t->S, K = S * SP_NUM_TASK_KINDS, ns = pr->nsteps;
    size_t cells = (size_t)pl->nactors * (size_t)t->tmax;
    out->steps = ns, out->nstages = S, out->nmessages = pl->nmessages;
    out->task_s = calloc((size_t)K, sizeof(double));
    out->op_at = calloc((size_t)K + 1, sizeof(int64_t));
    out->opt_s = calloc((size_t)S, sizeof(double));
    out->msg_s = calloc((size_t)pl->nmessages + 1, sizeof(double));
    out->ar_s = calloc((size_t)S, sizeof(double));
    int64_t maxn = (int64_t)ns * pl->ntasks + ns + K + 1;
    double *v = malloc((size_t)maxn * sizeof *v);
    int64_t *send_at = malloc(2 * ((size_t)pl->nmessages + 1) * sizeof *send_at);
    double *gap = malloc(2 * (size_t)maxn * sizeof *gap), *sgap = gap ? gap + maxn : NULL;
    if (!out->task_s || !out->op_at || !out->opt_s || !out->msg_s || !out->ar_s || !v ||
        !send_at || !gap)
        goto nomem;
    for (int k = 0; k < K; k++)
        out->op_at[k + 1] = out->op_at[k] + sp_program_num_ops(t->p, k / 4, k % 4);
    /* (op sums and AdamW medians: filled by the rank that ran them, summed over ranks) */
    size_t nsum = (size_t)out->op_at[K] + (size_t)S;
    double *sum = calloc(nsum + 1, sizeof *sum);
    if (!sum) goto nomem;
    out->op_s = sum;

    /* tasks: the mean of every RUN of (stage, kind), over actors and steps, in one pass
     * (v holds the counts) */
    memset(v, 0, (size_t)K * sizeof *v);
    for (int st = 0; st < ns; st++) {
        const double *h = pr->hist + (size_t)st * pr->cells;
        for (int a = 0; a < pl->nactors; a++)
            for (int i = 0; i < pl->ninstr[a]; i++) {
                const sp_instr *in = &pl->instr[a][i];
                size_t c = (size_t)a * t->tmax + i;
                int k = in->task.stage * SP_NUM_TASK_KINDS + in->task.kind;
                if (in->op == SP_OP_RUN && h[c] > 0 && h[cells + c] >= h[c])
                    out->task_s[k] += h[cells + c] - h[c], v[k] += 1;
            }
    }
    for (int k = 0; k < K; k++) out->task_s[k] = v[k] > 0 ? out->task_s[k] / v[k] : 0;
    /* messages, as the receiver meets them: from the data's readiness (the end of the
     * last task before the SEND: a SEND follows its producer) to the start of the task
     * that reads it, when the receiver was idle by then (its previous task had ended):
     * the time a message adds to a path. Not seen (-1) when the receiver was always busy. */
    for (int64_t q = 0; q < 2 * pl->nmessages; q++) send_at[q] = -1;
    for (int a = 0; a < pl->nactors; a++)
        for (int i = 0, prod = -1; i < pl->ninstr[a]; i++) {
            const sp_instr *in = &pl->instr[a][i];
            if (in->op == SP_OP_RUN || in->op == SP_OP_COMBINE) prod = i;
            if (in->op == SP_OP_SEND && in->seq >= 0 && in->seq < pl->nmessages && prod >= 0)
                send_at[2 * in->seq] = a, send_at[2 * in->seq + 1] = prod;
        }
    int ngap = 0, nsgap = 0;
    for (int a = 0; a < pl->nactors; a++)
        for (int i = 0, prev = -1, recv = 0, sent = 0; i < pl->ninstr[a]; i++) {
            const sp_instr *in = &pl->instr[a][i];
            if (in->op == SP_OP_RECV) recv = 1;
            if (in->op == SP_OP_SEND) sent = 1;
            if (in->op == SP_OP_RUN || in->op == SP_OP_COMBINE) {
                /* the runtime's gap between two tasks, the second reading nothing
                 * received (a wait for a message is the message's time, below, even where
                 * its RECV came before the first task); apart where the first one's
                 * output was sent (posting sends may cost the actor time) */
                for (int j = 0; j < i && !recv; j++)
                    recv = pl->instr[a][j].op == SP_OP_RECV && reads(pl, in, pl->instr[a][j].buf);
                double *g = sent ? sgap : gap;
                int *n = sent ? &nsgap : &ngap;
                for (int st = 0; !recv && prev >= 0 && st < ns && *n < maxn; st++) {
                    const double *h = pr->hist + (size_t)st * pr->cells;
                    size_t c = (size_t)a * t->tmax, cp = c + (size_t)prev, ci = c + (size_t)i;
                    if (h[ci] > 0 && h[cells + cp] > 0) g[(*n)++] = h[ci] - h[cells + cp];
                }
                prev = i, recv = 0, sent = 0;
            }
            if (in->op != SP_OP_RECV || in->seq < 0 || in->seq >= pl->nmessages ||
                send_at[2 * in->seq] < 0)
                continue;
            int cons = i + 1; /* the first task after the RECV that reads its buffer */
            while (cons < pl->ninstr[a] && !(pl->instr[a][cons].op == SP_OP_RUN &&
                                             reads(pl, &pl->instr[a][cons], in->buf)))
                cons++;
            out->msg_s[in->seq] = -1;
            if (cons >= pl->ninstr[a]) continue;
            size_t cc = (size_t)a * t->tmax + (size_t)cons;
            size_t cp = (size_t)send_at[2 * in->seq] * t->tmax + (size_t)send_at[2 * in->seq + 1];
            int n = 0;
            for (int st = 0; st < ns; st++) {
                const double *h = pr->hist + (size_t)st * pr->cells;
                double ready = h[cells + cp], idle = -1;
                for (int j = cons - 1; j >= 0 && idle < 0; j--)
                    if (pl->instr[a][j].op == SP_OP_RUN || pl->instr[a][j].op == SP_OP_COMBINE)
                        idle = h[cells + (size_t)a * t->tmax + (size_t)j];
                if (h[cc] > 0 && ready > 0 && idle < ready) v[n++] = h[cc] - ready;
            }
            if (n) out->msg_s[in->seq] = mean(v, n);
        }
    out->gap_s = mean(gap, ngap);
    out->send_gap_s = mean(sgap, nsgap);
    /* the replicas' all-reduces: [2 s] start, [2 s + 1] end, after the rows */
    for (int s = 0; s < S; s++) {
        int n = 0;
        for (int st = 0; st < ns; st++) {
            const double *ar = pr->hist + (size_t)st * pr->cells + 2 * cells;
            if (ar[2 * s] > 0 && ar[2 * s + 1] > ar[2 * s]) v[n++] = ar[2 * s + 1] - ar[2 * s];
        }
        out->ar_s[s] = median(v, n);
    }
    /* op means and AdamW medians from the rank that ran them (replica 0, tensor rank 0) */
    if (t->replica == 0 && t->trank == 0)
        for (int s = 0; s < S; s++) {
            if (!owns(t, s)) continue;
            for (int kd = 0; kd < SP_NUM_TASK_KINDS; kd++) {
                sp_op_clock *c = &pr->clock[s * SP_NUM_TASK_KINDS + kd];
                for (int j = 0; c->sum && c->runs && j < c->nops; j++)
                    sum[out->op_at[s * SP_NUM_TASK_KINDS + kd] + j] = c->sum[j] / (double)c->runs;
            }
            for (int st = 0; st < ns; st++) v[st] = pr->opt[(size_t)st * S + s];
            sum[out->op_at[K] + s] = median(v, ns);
        }
    free(v), free(send_at), free(gap);
    v = NULL, send_at = NULL, gap = NULL;
    if (any_failed(0)) {
        sp_train_profile_free(out);
        return sp_set_error(SP_ERR_RUNTIME, "sp_trainer_profile: another rank failed");
    }
    sp_status st = sp_exec_allreduce_sum_named(sum, nsum, 1, "the profile's all-reduce");
    if (st) {
        sp_train_profile_free(out);
        return st;
    }
    memcpy(out->opt_s, sum + out->op_at[K], (size_t)S * sizeof(double));
    /* the op means as shares of the task's mean (the op clock and the trace time the same
     * runs: a program's ops add up to its task within 1% in quiet runs) */
    for (int k = 0; k < K; k++) {
        double tot = 0;
        for (int64_t j = out->op_at[k]; j < out->op_at[k + 1]; j++) tot += sum[j];
        for (int64_t j = out->op_at[k]; tot > 0 && out->task_s[k] > 0 && j < out->op_at[k + 1]; j++)
            sum[j] *= out->task_s[k] / tot;
    }
    return SP_OK;
nomem:
    free(v), free(send_at), free(gap);
    sp_train_profile_free(out);
    any_failed(1);
    return sp_set_error(SP_ERR_NOMEM, "sp_trainer_profile: out of memory");
}

void sp_train_profile_free(sp_train_profile *p)
{
    if (!p) return;
    free(p->task_s), free(p->op_at), free(p->op_s), free(p->opt_s), free(p->msg_s);
    free(p->ar_s);
    memset(p, 0, sizeof *p);
}
