/* The in-process tensor group (starpipe/reference.h, sp_tp_local): T members, one thread
 * each, that meet at every all-reduce. The sum is the group's one order, member 0's
 * values, then + member 1's, ... in float32 (doubles for sum_f64), whoever computes it,
 * so each member gets the same bits as a run over MPI or NCCL that keeps that order; the
 * maximum (allreduce_max) walks the members in the same order. */
#include "starpipe/reference.h"

#include "codelets/cpu/kernels.h"

#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define TP_ABORTED 1 /* a member gave up (its error is its own): the others stop too */
#define TP_NOMEM 2

typedef struct {
    sp_tp_group group; /* first: the member is its group entry */
    struct sp_tp_local *l;
    int rank;
    void *tmp;         /* this member's copy of the sum */
    size_t tmp_bytes;
} member;

struct sp_tp_local {
    int T;
    pthread_mutex_t lock;
    pthread_cond_t turn;
    int arrived;
    unsigned long generation;
    int aborted;
    int first; /* sp_tp_local_run: the member whose failure aborted the run, or -1 */
    const void **src; /* [T]: what each member brings to the current sum */
    member *m;
};

/* Waits for every member; 1 if the group was aborted meanwhile. */
static int meet(sp_tp_local *l)
{
    pthread_mutex_lock(&l->lock);
    unsigned long gen = l->generation;
    if (++l->arrived == l->T) {
        l->arrived = 0;
        l->generation++;
        pthread_cond_broadcast(&l->turn);
    } else {
        while (gen == l->generation && !l->aborted) pthread_cond_wait(&l->turn, &l->lock);
    }
    int aborted = l->aborted;
    pthread_mutex_unlock(&l->lock);
    return aborted;
}

static void *room(member *m, size_t bytes)
{
    if (m->tmp_bytes < bytes) {
        void *t = realloc(m->tmp, bytes);
        if (!t) return NULL;
        m->tmp = t, m->tmp_bytes = bytes;
    }
    return m->tmp;
}

static int allreduce(sp_tp_group *g, float *dst, const float *src, int64_t n, int acc)
{
    member *m = (member *)g;
    sp_tp_local *l = m->l;
    float *sum = room(m, (size_t)n * sizeof(float));
    if (!sum) {
        sp_tp_local_abort(l);
        return TP_NOMEM;
    }
    l->src[m->rank] = src;
    if (meet(l)) return TP_ABORTED;
    const float *s0 = l->src[0];
    for (int64_t j = 0; j < n; j++) sum[j] = s0[j];
    for (int r = 1; r < l->T; r++) {
        const float *sr = l->src[r];
        for (int64_t j = 0; j < n; j++) sum[j] += sr[j];
    }
    if (meet(l)) return TP_ABORTED; /* nobody reads a source any more */
    if (acc)
        for (int64_t j = 0; j < n; j++) dst[j] += sum[j];
    else
        memcpy(dst, sum, (size_t)n * sizeof(float));
    return 0;
}

/* The same meeting for the maximum, in place: member 0's values, then each later
 * member's where it is larger (program.h: NaN and signed zeros as that order gives) */
static int allreduce_max(sp_tp_group *g, float *x, int64_t n)
{
    member *m = (member *)g;
    sp_tp_local *l = m->l;
    float *mx = room(m, (size_t)n * sizeof(float));
    if (!mx) {
        sp_tp_local_abort(l);
        return TP_NOMEM;
    }
    l->src[m->rank] = x;
    if (meet(l)) return TP_ABORTED;
    const float *s0 = l->src[0];
    for (int64_t j = 0; j < n; j++) mx[j] = s0[j];
    for (int r = 1; r < l->T; r++) sp_maximum_forward(mx, mx, l->src[r], n);
    if (meet(l)) return TP_ABORTED; /* nobody reads a source any more */
    memcpy(x, mx, (size_t)n * sizeof(float));
    return 0;
}

static int sum_f64(sp_tp_group *g, double *x, int64_t n)
{
    member *m = (member *)g;
    sp_tp_local *l = m->l;
    double *sum = room(m, (size_t)n * sizeof(double));
    if (!sum) {
        sp_tp_local_abort(l);
        return TP_NOMEM;
    }
    l->src[m->rank] = x;
    if (meet(l)) return TP_ABORTED;
    for (int64_t j = 0; j < n; j++) {
        double s = ((const double *)l->src[0])[j];
        for (int r = 1; r < l->T; r++) s += ((const double *)l->src[r])[j];
        sum[j] = s;
    }
    if (meet(l)) return TP_ABORTED;
    memcpy(x, sum, (size_t)n * sizeof(double));
    return 0;
}

/* Each member's chunk of its own x into every member's x: a member reads others'
 * chunks, which their owners do not write, and waits for all before returning. */
static int allgather(sp_tp_group *g, float *x, int64_t n)
{
    member *m = (member *)g;
    sp_tp_local *l = m->l;
    l->src[m->rank] = x;
    if (meet(l)) return TP_ABORTED;
    for (int q = 0; q < l->T; q++) {
        int64_t lo = sp_tp_chunk(n, l->T, q), hi = sp_tp_chunk(n, l->T, q + 1);
        if (q != m->rank)
            memcpy(x + lo, (const float *)l->src[q] + lo, sizeof(float) * (size_t)(hi - lo));
    }
    return meet(l) ? TP_ABORTED : 0; /* nobody reads a source any more */
}

static const char *status_string(sp_tp_group *g, int code)
{
    (void)g;
    return code == TP_ABORTED ? "another member of the tensor group failed"
         : code == TP_NOMEM ? "out of memory for the tensor group's sum" : "unknown error";
}

sp_tp_local *sp_tp_local_create(int T)
{
    if (T < 1 || T > SP_MAX_TENSOR) {
        sp_set_error(SP_ERR_ARG, "sp_tp_local_create: %d members (1 to %d)", T, SP_MAX_TENSOR);
        return NULL;
    }
    sp_tp_local *l = calloc(1, sizeof *l);
    if (l) l->src = calloc((size_t)T, sizeof *l->src), l->m = calloc((size_t)T, sizeof *l->m);
    if (!l || !l->src || !l->m) {
        if (l) free(l->src), free(l->m);
        free(l);
        sp_set_error(SP_ERR_NOMEM, "sp_tp_local_create: out of memory");
        return NULL;
    }
    l->T = T;
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->turn, NULL);
    for (int r = 0; r < T; r++)
        l->m[r] = (member){ .group = { .allreduce = allreduce, .allreduce_max = allreduce_max,
                                       .sum_f64 = sum_f64, .allgather = allgather,
                                       .status_string = status_string },
                            .l = l, .rank = r };
    return l;
}

sp_tp_group *sp_tp_local_member(sp_tp_local *l, int rank)
{
    return l && rank >= 0 && rank < l->T ? &l->m[rank].group : NULL;
}

void sp_tp_local_abort(sp_tp_local *l)
{
    if (!l) return;
    pthread_mutex_lock(&l->lock);
    l->aborted = 1;
    pthread_cond_broadcast(&l->turn);
    pthread_mutex_unlock(&l->lock);
}

typedef struct {
    sp_tp_local *l;
    int q;
    sp_status (*fn)(int q, void *arg);
    void *arg;
    sp_status st;
    char err[1024];
} run_slot;

static void *run_one(void *arg)
{
    run_slot *r = arg;
    r->st = r->fn(r->q, r->arg);
    if (r->st) {
        snprintf(r->err, sizeof r->err, "%s", sp_last_error());
        pthread_mutex_lock(&r->l->lock); /* the others fail only after this one has */
        if (!r->l->aborted && r->l->first < 0) r->l->first = r->q;
        pthread_mutex_unlock(&r->l->lock);
        sp_tp_local_abort(r->l);
    }
    return NULL;
}

sp_status sp_tp_local_run(sp_tp_local *l, sp_status (*fn)(int q, void *arg), void *arg)
{
    if (!l || !fn) return sp_set_error(SP_ERR_ARG, "sp_tp_local_run: NULL argument");
    run_slot *slot = calloc((size_t)l->T, sizeof *slot);
    pthread_t *th = calloc((size_t)l->T, sizeof *th);
    if (!slot || !th) {
        free(slot), free(th);
        return sp_set_error(SP_ERR_NOMEM, "sp_tp_local_run: out of memory");
    }
    l->aborted = 0; /* every member of the last run has returned */
    l->arrived = 0;
    l->first = -1;
    int started = 1;
    for (int q = 0; q < l->T; q++) slot[q] = (run_slot){ .l = l, .q = q, .fn = fn, .arg = arg };
    for (int q = 1; q < l->T; q++) /* member 0 runs on the caller's thread */
        if (pthread_create(&th[q], NULL, run_one, &slot[q]) == 0) started++;
        else {
            slot[q].st = sp_set_error(SP_ERR_RUNTIME, "sp_tp_local_run: no thread for member %d", q);
            snprintf(slot[q].err, sizeof slot[q].err, "%s", sp_last_error());
            sp_tp_local_abort(l);
            break;
        }
    run_one(&slot[0]);
    for (int q = 1; q < started; q++) pthread_join(th[q], NULL);
    /* the failure that aborted the others, else the first member's that failed */
    sp_status st = SP_OK;
    if (l->first >= 0) st = sp_set_error(slot[l->first].st, "%s", slot[l->first].err);
    for (int q = 0; q < l->T && st == SP_OK; q++)
        if (slot[q].st) st = sp_set_error(slot[q].st, "%s", slot[q].err);
    free(slot), free(th);
    return st;
}

void sp_tp_local_free(sp_tp_local *l)
{
    if (!l) return;
    for (int r = 0; r < l->T; r++) free(l->m[r].tmp);
    pthread_mutex_destroy(&l->lock);
    pthread_cond_destroy(&l->turn);
    free(l->src), free(l->m);
    free(l);
}
