/* The schedule `auto`: synthesized for given stage costs, message time and an activation
 * memory cap per actor (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 4's
 * greedy), instead of written after a published pattern. docs/planner.md, section 1. */
#include "sched/sched_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One greedy pass's knobs: actor s runs at most p - s + extra forwards ahead of its
 * backwards (1F1B's warm-up at extra = 0; no limit but the cap when extra < 0); fit = 1
 * runs a W in an idle slot only when it ends before the next known arrival of a B or F input, 0 whenever nothing else is ready; steady = 1
 * defers at most cap - (p - s + extra) W's, and runs a W before an F beyond that (ZB-H1's
 * F B W cadence once the deferred W's fill the memory the warm-up leaves). */
typedef struct {
    int extra, fit, steady;
} knobs;

typedef struct {
    int p, m;
    const double *cost; /* [p][4] */
    const double *msg;  /* [p]: time of the message over edge s -> s+1 (and back) */
    const int *cap;     /* [p] */
    double *fend, *bend; /* [m][p] end times; < 0: not yet placed */
} synth;

static double ready_f(const synth *y, int s, int i)
{
    if (s == 0) return 0;
    double e = y->fend[i * y->p + s - 1];
    return e < 0 ? INFINITY : e + y->msg[s - 1];
}

static double ready_b(const synth *y, int s, int i)
{
    double f = y->fend[i * y->p + s];
    if (f < 0) return INFINITY;
    if (s == y->p - 1) return f;
    double e = y->bend[i * y->p + s + 1];
    return e < 0 ? INFINITY : fmax(f, e + y->msg[s]);
}

/* One event-by-event pass. Each actor keeps F, B and W in microbatch order (W in order is
 * also the accumulation order), so it only ever chooses among its next F, next B and
 * oldest pending W. The actor that can start something earliest decides first, so every
 * task placed before that moment is known: B if its gradient has arrived (it unblocks the
 * actors upstream), else F if its input has arrived and the in-flight limit allows, else
 * a pending W (it fills the idle slot and frees a unit of activations). */
static sp_status greedy(synth *y, knobs k, sp_schedule *out)
{
    int p = y->p, m = y->m;
    int *nf = calloc((size_t)p, sizeof *nf), *nb = calloc((size_t)p, sizeof *nb);
    int *nw = calloc((size_t)p, sizeof *nw), *lim = calloc((size_t)p, sizeof *lim);
    double *t = calloc((size_t)p, sizeof *t);
    sp_status st = SP_OK;
    if (!nf || !nb || !nw || !lim || !t) {
        st = sp_set_error(SP_ERR_NOMEM, "auto: out of memory");
        goto out;
    }
    for (int i = 0; i < m * p; i++) y->fend[i] = y->bend[i] = -1;
    for (int s = 0; s < p; s++) {
        lim[s] = k.extra < 0 ? m : p - s + k.extra;
    }
    for (int left = 3 * m * p; left > 0 && st == SP_OK; left--) {
        int best = -1, kind = -1;
        double when = INFINITY;
        for (int s = 0; s < p; s++) {
            if (nw[s] == m) continue;
            double rb = nb[s] < nf[s] ? ready_b(y, s, nb[s]) : INFINITY;
            int full = nf[s] - nw[s] >= y->cap[s];
            double rf = nf[s] < m && nf[s] - nb[s] < lim[s] && !full ? ready_f(y, s, nf[s])
                                                                     : INFINITY;
            double rw = nw[s] < nb[s] ? t[s] : INFINITY;
            double sb = fmax(t[s], rb), sf = fmax(t[s], rf);
            int kd = -1;
            double at = INFINITY;
            int defer = y->cap[s] - (p - s + (k.extra > 0 ? k.extra : 0));
            if (sb <= t[s]) kd = SP_TASK_B, at = sb;
            else if (k.steady && rw <= t[s] && nb[s] - nw[s] > (defer > 0 ? defer : 0))
                kd = SP_TASK_W, at = t[s];
            else if (sf <= t[s]) kd = SP_TASK_F, at = sf;
            else if (rw <= t[s]) {
                double next = fmin(sb, sf);
                if (!k.fit || next >= t[s] + y->cost[4 * s + SP_TASK_W] || full || isinf(next))
                    kd = SP_TASK_W, at = t[s];
                else
                    kd = sb <= sf ? SP_TASK_B : SP_TASK_F, at = next;
            } else if (isfinite(fmin(sb, sf))) {
                kd = sb <= sf ? SP_TASK_B : SP_TASK_F, at = fmin(sb, sf);
            }
            if (kd >= 0 && at < when) when = at, best = s, kind = kd;
        }
        if (best < 0) { /* cannot happen with caps >= 1: the oldest microbatch always moves */
            st = sp_set_error(SP_ERR_SCHEDULE, "auto: the greedy pass is stuck");
            break;
        }
        int s = best, i = kind == SP_TASK_F ? nf[s]++ : kind == SP_TASK_B ? nb[s]++ : nw[s]++;
        double end = when + y->cost[4 * s + kind];
        if (kind == SP_TASK_F) y->fend[i * p + s] = end;
        if (kind == SP_TASK_B) y->bend[i * p + s] = end;
        t[s] = end;
        st = sp_schedule_append(out, s, (sp_task_kind)kind, i, s);
    }
out:
    free(nf), free(nb), free(nw), free(lim), free(t);
    return st;
}

/* The simulated step time of a candidate (the planner's own simulator, so the choice is
 * made on the numbers the user sees), INFINITY if its plan holds more than the cap on
 * some actor, or -1 with the error set. */
static double simulate(const sp_stage_model *model, const sp_schedule *s,
                       const sp_auto_config *cfg, const int *cap)
{
    sp_plan *plan = NULL;
    sp_sim_result *r = NULL;
    sp_sim_config sc = { .latency = cfg->latency, .bandwidth = cfg->bandwidth };
    double t = -1;
    if (sp_plan_build(model, s, &plan) == SP_OK && sp_simulate(plan, model, &sc, &r) == SP_OK) {
        t = r->step_time;
        for (int a = 0; a < plan->nactors; a++)
            if (plan->peak[a].act_units > cap[a]) t = INFINITY; /* over the cap: never kept */
    }
    sp_sim_result_free(r);
    sp_plan_free(plan);
    return t;
}

int sp_schedule_auto_default_cap(int nactors, int nmicro)
{
    return nactors < nmicro ? nactors : nmicro;
}

sp_status sp_schedule_auto(const sp_stage_model *model, int p, int m, const sp_auto_config *cfg,
                           sp_schedule **out)
{
    *out = NULL;
    sp_auto_config dflt = { 0 };
    if (!cfg) cfg = &dflt;
    if (!model || p < 1 || m < 1 || p > SP_MAX_INDEX || m > SP_MAX_INDEX)
        return sp_set_error(SP_ERR_ARG, "auto: needs a stage model, p >= 1 and m >= 1 "
                            "(p = %d, m = %d)", p, m);
    /* (a tied weight adds its messages and combine after the loop, and a recomputing
     * stage's first backward its forward: the planner places both, and every candidate
     * is ranked by the plan's simulation) */
    int chain = model->nstages == p && model->nedges == p - 1;
    for (int e = 0; chain && e < model->nedges; e++)
        chain = model->edge[e].src_stage == e && model->edge[e].dst_stage == e + 1 &&
                model->edge[e].needs_grad;
    if (!chain)
        return sp_set_error(SP_ERR_ARG, "auto: synthesizes for a chain of %d stages, one per "
                            "actor (this model has %d stages, %d edges)", p, model->nstages,
                            model->nedges);
    if ((int64_t)p * m > (1 << 22))
        return sp_set_error(SP_ERR_ARG, "auto: %d actors x %d microbatches is too large", p, m);
    if (!isfinite(cfg->latency) || cfg->latency < 0 || !isfinite(cfg->bandwidth) ||
        cfg->bandwidth < 0)
        return sp_set_error(SP_ERR_ARG, "auto: message latency and bandwidth must be finite "
                            "and >= 0");
    int *cap = malloc((size_t)p * sizeof *cap);
    double *cost = malloc((size_t)p * 4 * sizeof *cost), *msg = malloc((size_t)p * sizeof *msg);
    double *fend = malloc((size_t)m * p * sizeof *fend);
    double *bend = malloc((size_t)m * p * sizeof *bend);
    sp_schedule *best = NULL;
    sp_status st = SP_OK;
    if (!cap || !cost || !msg || !fend || !bend) {
        st = sp_set_error(SP_ERR_NOMEM, "auto: out of memory");
        goto out;
    }
    for (int s = 0; s < p; s++) {
        int c = cfg->mem_caps ? cfg->mem_caps[s] : cfg->mem_cap;
        if (c == 0 && !cfg->mem_caps) c = sp_schedule_auto_default_cap(p, m);
        /* one microbatch's activations are the least an actor can run with: F saves them
         * and only its W frees them */
        if (c < 1) {
            st = sp_set_error(SP_ERR_ARG, "auto: memory cap %d on actor %d is below the "
                              "minimum of 1 activation unit (one microbatch's saved "
                              "activations, held from its F to its W)", c, s);
            goto out;
        }
        cap[s] = c > m ? m : c;
        for (int k = 0; k < 4; k++) cost[4 * s + k] = model->stage[s].cost[k];
        if (model->stage[s].recompute) /* the first backward task runs F again */
            cost[4 * s + SP_TASK_B] += cost[4 * s + SP_TASK_F];
        msg[s] = s + 1 < p ? cfg->latency + (cfg->bandwidth > 0
                                                 ? (double)model->edge[s].bytes / cfg->bandwidth
                                                 : 0)
                           : 0;
    }
    synth y = { p, m, cost, msg, cap, fend, bend };
    double best_t = INFINITY;
    /* seeds: the published plain-placement schedules and the default (1F1B split), kept
     * when they fit the cap (the greedy alone trails ZB-H1 at 1F1B's memory on even
     * stages: its W's come in bursts when the memory fills, where ZB-H1 keeps one W after
     * each B) */
    static const char *const seeds[] = { "zb-h1", "1f1b", SP_SCHEDULE_DEFAULT };
    for (int k = 0; k < 3 && st == SP_OK; k++) {
        sp_schedule *s;
        st = sp_schedule_builtin_split(seeds[k], p, m, 1, &s);
        if (st) break;
        snprintf(s->name, sizeof s->name, "auto");
        double t = simulate(model, s, cfg, cap);
        if (t < 0) st = SP_ERR_SCHEDULE; /* error already set */
        if (st == SP_OK && isfinite(t) && (!best || t < best_t * (1 - 1e-9))) {
            best_t = t;
            sp_schedule_free(best);
            best = s;
        } else {
            sp_schedule_free(s);
        }
    }
    /* the knobs tried: the cap itself, then in-flight limits p - s + extra for extra
     * 0, 1, 2, 4, ... (1F1B's warm-up and more), each with W in any idle slot or only
     * where it fits */
    for (int v = 0; v < 4 && st == SP_OK; v++)
        for (int extra = -1; extra <= p && st == SP_OK; extra = extra < 2 ? extra + 1 : 2 * extra) {
            sp_schedule *s = sp_schedule_create(p, p, m);
            if (!s) {
                st = SP_ERR_NOMEM;
                break;
            }
            snprintf(s->name, sizeof s->name, "auto");
            st = greedy(&y, (knobs){ extra, v & 1, v >> 1 }, s);
            double t = st ? -1 : simulate(model, s, cfg, cap);
            if (st == SP_OK && t < 0) st = SP_ERR_SCHEDULE; /* error already set */
            if (st == SP_OK && isinf(t))
                st = sp_set_error(SP_ERR_SCHEDULE, "auto: a greedy pass went over the cap");
            if (st == SP_OK && (!best || t < best_t * (1 - 1e-9))) {
                best_t = t;
                sp_schedule_free(best);
                best = s;
            } else {
                sp_schedule_free(s);
            }
        }
    if (st == SP_OK) *out = best, best = NULL;
out:
    sp_schedule_free(best);
    free(cap), free(cost), free(msg), free(fend), free(bend);
    return st;
}
