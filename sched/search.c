/* Layout search (include/starpipe/search.h; docs/planner.md, section 11). A layout is a
 * group (T, P, R, B, m, v, schedule, cut) tried with three recomputation modes. Each gets
 * a step-time and a memory bound from its stage model alone; groups are taken best bound
 * first, their schedules run dry on the task lists for tighter bounds of both, and only
 * those whose bounds beat the n-th best so far are planned and simulated. brute_force
 * plans and simulates every one; ties go to the first enumerated either way. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched/sched_impl.h"
#include "starpipe/search.h"

enum { RC_NONE, RC_BINDING, RC_ALL, NRC };

/* Enumeration order, which is also the order of ties: the plainest first; the "+split"
 * forms (sp_schedule_split_backward, the apps' default among them) after the published
 * ones. */
static const char *const scheds[] = { "1f1b", "gpipe", "eager-1f1b", "zb-h1",
                                      "interleaved-1f1b", "zb-v", "dualpipe-v",
                                      "1f1b+split", "gpipe+split", "eager-1f1b+split", "auto" };
enum { SCHED_INTERLEAVED = 4, SCHED_ZBV = 5, SCHED_DUALPIPEV = 6, SCHED_AUTO = 10,
       NSCHED = 11 };

/* Layers taken off the first and the last stage (the middle ones share them): the
 * embedding's memory and the head's work sit there. */
static const int trims[][2] = { { 0, 0 }, { 1, 0 }, { 0, 1 }, { 1, 1 }, { 2, 0 }, { 2, 1 },
                                { 2, 2 } };
#define NCUTS ((int)(sizeof trims / sizeof *trims))

/* Relative slack on bounds against the simulator's sums (rounding only). */
#define SLACK 1e-9

typedef struct {
    int T, P, R, B, m, v, sched, cut;
    long index;        /* canonical: enumeration order */
    double lb[NRC];    /* step-time bound per mode (RC_BINDING: RC_NONE's) */
    double mem_lb;     /* bytes any mode needs on some device */
} group;

typedef struct {
    const sp_search_config *cfg;
    sp_device_spec dev;
    int L, D, G, top, heads;
    double rate, gb, mem;
    sp_search_choice *best; /* [top], sorted */
    long *key;              /* [top] the tie order of each */
    int nbest;
    sp_search_result *res;
    double least_mem;       /* the least memory any layout was seen to need */
    int *cut;               /* scratch [L + 2] */
} ctx;

typedef struct {
    double lat, bw;          /* a boundary message: latency, bandwidth */
    int sg;                  /* scatter-gathered (sp_sim_config.scatter_gather) on tl */
    sp_tensor_link tl;
    sp_allreduce_model ar;   /* the replicas' all-reduce */
} links;

/* ------------------------------------------------------------------ small helpers */

int sp_layout_replicas_per_node(const sp_layout *l, int node)
{
    int R = l->replicas, T = sp_layout_tensor(l);
    if (node <= 0) return R;
    node /= T; /* a node holds node / T groups */
    int g = l->order == SP_RANK_ORDER_REPLICA ? node : (l->actors <= node ? node / l->actors : 1);
    if (g < 1) g = 1;
    return g > R ? R : g;
}

double sp_plan_device_bytes(const sp_plan *plan, int a, int R, int zero1)
{
    const sp_mem_peak *pk = &plan->peak[a];
    double opt = (double)pk->opt;
    return (double)pk->total - opt + (zero1 && R > 1 ? opt / R : opt);
}

char *sp_search_format_cut(const int *layers, int n, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < n && k < len;) {
        int j = i;
        while (j < n && layers[j] == layers[i]) j++;
        const char *sep = i ? "," : "";
        k += (size_t)(j - i > 1 ? snprintf(buf + k, len - k, "%s%dx%d", sep, layers[i], j - i)
                                : snprintf(buf + k, len - k, "%s%d", sep, layers[i]));
        i = j;
    }
    return buf;
}

char *sp_search_format_recompute(const unsigned char *rc, int n, char *buf, size_t len)
{
    int on = 0;
    for (int s = 0; s < n; s++) on += rc[s] != 0;
    snprintf(buf, len, "%s", on == 0 ? "none" : "all");
    if (on == 0 || on == n) return buf;
    size_t k = 0;
    for (int s = 0; s < n && k < len;) {
        if (!rc[s]) {
            s++;
            continue;
        }
        int e = s;
        while (e + 1 < n && rc[e + 1]) e++;
        k += (size_t)(e > s ? snprintf(buf + k, len - k, "%s%d-%d", k ? "," : "", s, e)
                            : snprintf(buf + k, len - k, "%s%d", k ? "," : "", s));
        s = e + 1;
    }
    return buf;
}

/* The built-ins' placements: V-shaped, or stage s on actor s mod P. */
static int actor_of(int sched, int P, int s)
{
    if (sched == SCHED_ZBV || sched == SCHED_DUALPIPEV) return s < P ? s : 2 * P - 1 - s;
    return s % P;
}

/* Whether the schedule takes (P, m, v), and `auto` its size. */
static int sched_fits(const ctx *c, int k, int P, int m, int v)
{
    int max_auto = c->cfg->max_auto_tasks > 0 ? c->cfg->max_auto_tasks : 4096;
    switch (k) {
    case SCHED_INTERLEAVED: return v >= 2 && P >= 2 && m >= P && m % P == 0;
    case SCHED_ZBV: return v == 2;
    case SCHED_DUALPIPEV: return v == 2 && m >= 2 * P;
    case SCHED_AUTO: return v == 1 && P >= 2 && (long)P * m <= max_auto;
    default: return v == 1;
    }
}

/* The tensor degrees the model splits: T divides what the apps split by T (the vocabulary
 * is padded to a multiple of T, sp_padded_vocab). */
static int splits(const ctx *c, int T)
{
    if (c->cfg->gpt) return c->cfg->gpt->channels % T == 0 && c->heads % T == 0;
    const sp_llama_shape *l = c->cfg->llama;
    return l->kv_heads % T == 0 && l->hidden % T == 0;
}

/* Cut number k of L layers into S stages: k's layers off the first and the last stage,
 * the rest even over the middle ones (any remainder to the later ones, which hold fewer
 * microbatches). 0, or -1 when it is no cut (a middle stage empty, a count below 0). */
static int make_cut(int L, int S, int k, int *out)
{
    if (S == 1) {
        out[0] = L;
        return k == 0 ? 0 : -1;
    }
    int e = L / S, first = e - trims[k][0], last = e - trims[k][1];
    if (S == 2) {
        if (trims[k][1]) return -1; /* two stages: the first's trim says it all */
        first = (L + 1) / 2 - trims[k][0];
        last = L - first;
        if (first < 0 || last < 0) return -1;
        out[0] = first, out[1] = last;
        return 0;
    }
    int mid = L - first - last, nm = S - 2;
    if (first < 0 || last < 0 || mid < nm) return -1;
    out[0] = first, out[S - 1] = last;
    for (int s = 1; s <= nm; s++) out[s] = mid / nm + (s > nm - mid % nm);
    return 0;
}

static int same_cut(const int *a, const int *b, int S)
{
    return !memcmp(a, b, (size_t)S * sizeof *a);
}

static sp_tensor_link tensor_link(const ctx *c, int T)
{
    return (sp_tensor_link){ .tensor = T, .alpha = c->dev.nvlink_alpha, .bw = c->dev.nvlink_bw };
}

/* The stage model of (T, B, cut over S); tt[s * 4 + kind]: each task's time as the
 * simulator takes it, its cost and its tensor group's all-reduces (sp_tensor_allreduce_time
 * on NVLink), for the bounds and `auto`; tp, when given: the all-reduces' part. */
static sp_stage_model *stages(const ctx *c, int T, int B, int S, const int *cut, double *tt,
                              double *tp)
{
    sp_stage_model *md;
    if (c->cfg->gpt) {
        sp_gpt_shape g = *c->cfg->gpt;
        g.batch = B, g.tensor = T, g.device_flops = c->rate, g.stage_layers = cut;
        if (g.elem_bytes <= 0) g.elem_bytes = 2;
        md = sp_stage_model_gpt(&g, S);
    } else {
        sp_llama_shape l = *c->cfg->llama;
        l.batch = B, l.tensor = T, l.device_flops = c->rate, l.stage_layers = cut;
        if (l.elem_bytes <= 0) l.elem_bytes = 2;
        md = sp_stage_model_llama(&l, S);
    }
    sp_tensor_link tl = tensor_link(c, T);
    for (int s = 0; md && s < S; s++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++) {
            const sp_stage_info *st = &md->stage[s];
            double x = sp_tensor_allreduce_time(&tl, st->tp_allreduces[k], st->tp_bytes[k]);
            tt[s * SP_NUM_TASK_KINDS + k] = st->cost[k] + x;
            if (tp) tp[s * SP_NUM_TASK_KINDS + k] = x;
        }
    return md;
}

/* Where a layout's messages go: a pipeline inside one node talks over NVLink, else every
 * boundary message is priced at the network's rate (the slowest of its edges), 1/T of it
 * at T > 1 (scatter-gather); the
 * replicas' all-reduce by sp_allreduce_time on the layout's replicas per node. */
static void layout_links(const ctx *c, int R, int P, int T, sp_rank_order o, links *k)
{
    sp_layout l = { .replicas = R, .actors = P, .order = o, .tensor = T };
    int g = c->dev.gpus_per_node;
    int inside = o == SP_RANK_ORDER_PIPELINE ? g % (P * T) == 0 : R * P * T <= g;
    k->lat = inside ? c->dev.nvlink_alpha : c->dev.network_alpha;
    k->bw = inside ? c->dev.nvlink_bw : c->dev.network_bw;
    k->sg = !inside && T > 1; /* scatter-gather, as the runtime does between nodes */
    k->tl = tensor_link(c, T);
    int rpn = sp_layout_replicas_per_node(&l, g);
    k->ar = (sp_allreduce_model){ .replicas = R, .bw_intra = c->dev.nvlink_bw,
                                  .bw_inter = c->dev.network_bw, .replicas_per_node = rpn,
                                  .hierarchical = 1,
                                  .alpha = rpn < R ? c->dev.network_alpha : c->dev.nvlink_alpha };
}

/* The rank orders worth simulating: replica-major only where it changes a link. */
static int norders(const links *lk, int R)
{
    const links *a = &lk[0], *b = &lk[1];
    return R > 1 && (a->lat != b->lat || a->bw != b->bw || a->ar.alpha != b->ar.alpha ||
                     a->ar.replicas_per_node != b->ar.replicas_per_node) ? 2 : 1;
}

/* ------------------------------------------------------------------ bounds */

/* A lower bound on the simulated step of any schedule with this placement (stage s on
 * actor_of(s)), m microbatches, recomputation rc, boundary messages of `msg` seconds and
 * all-reduces of ar[s] (NULL: no replicas). Per actor: it cannot start before its first
 * stage's input arrives (the forwards before it), then runs all its tasks, and its last
 * stage's all-reduce follows them. Per stage: its last forward ends no earlier than its m
 * forwards after that start; the backward of that microbatch waits for the forwards and
 * backwards of the stages after it; its W, then its all-reduce, come after. */
static double step_bound(const sp_stage_model *md, const double *tt, int sched, int P, int m,
                         const unsigned char *rc, double msg, const double *ar, double *scratch)
{
    int S = md->nstages;
    double *e = scratch, *d = scratch + S, *busy = scratch + 2 * S, *t0 = scratch + 2 * S + P;
    double *armin = t0 + P, lb = 0;
    for (int a = 0; a < P; a++) busy[a] = 0, t0[a] = INFINITY, armin[a] = INFINITY;
#define F(s) tt[(s) * SP_NUM_TASK_KINDS + SP_TASK_F]
#define BX(s) (tt[(s) * SP_NUM_TASK_KINDS + SP_TASK_B] + (rc && rc[s] ? F(s) : 0))
#define CROSS(s) (actor_of(sched, P, s) != actor_of(sched, P, (s) + 1) ? msg : 0)
    e[0] = 0;
    for (int s = 1; s < S; s++) e[s] = e[s - 1] + F(s - 1) + CROSS(s - 1);
    d[S - 1] = 0;
    for (int s = S - 2; s >= 0; s--) d[s] = 2 * CROSS(s) + F(s + 1) + d[s + 1] + BX(s + 1);
    for (int s = 0; s < S; s++) {
        int a = actor_of(sched, P, s);
        double w = tt[s * SP_NUM_TASK_KINDS + SP_TASK_W], x = ar ? ar[s] : 0;
        busy[a] += m * (F(s) + BX(s) + w);
        if (e[s] < t0[a]) t0[a] = e[s];
        if (x < armin[a]) armin[a] = x;
        double tail = e[s] + m * F(s) + d[s] + BX(s) + w + x;
        if (tail > lb) lb = tail;
    }
#undef F
#undef BX
#undef CROSS
    for (int a = 0; a < P; a++)
        if (t0[a] + busy[a] + armin[a] > lb) lb = t0[a] + busy[a] + armin[a];
    return lb;
}

/* Per-device bytes no mode can go below on actor a: its stages' parameters, gradients and
 * AdamW state (ZeRO-1's share when R > 1), and one microbatch of one stage's activations. */
static double memory_bound(const sp_stage_model *md, int sched, int P, int R)
{
    double worst = 0;
    for (int a = 0; a < P; a++) {
        double pers = 0, act = INFINITY;
        for (int s = 0; s < md->nstages; s++) {
            if (actor_of(sched, P, s) != a) continue;
            const sp_stage_info *st = &md->stage[s];
            pers += 2.0 * st->param_bytes + (R > 1 ? (double)st->opt_bytes / R : st->opt_bytes);
            if ((double)st->act_bytes < act) act = (double)st->act_bytes;
        }
        if (isfinite(act) && pers + act > worst) worst = pers + act;
    }
    return worst;
}

static double boundary_msg(const sp_stage_model *md, const links *k)
{
    double bytes = md->nedges ? (double)md->edge[0].bytes : 0, gather;
    sp_sim_config sc = { .latency = k->lat, .bandwidth = k->bw, .tensor = &k->tl,
                         .scatter_gather = k->sg };
    double xfer = sp_sim_msg_time(&sc, bytes, &gather);
    return k->lat + xfer + gather;
}

/* ------------------------------------------------------------------ the best so far */

static double kth(const ctx *c)
{
    return c->nbest < c->top ? INFINITY : c->best[c->top - 1].step_time;
}

static void choice_free(sp_search_choice *x)
{
    free(x->stage_layers);
    free(x->recompute);
    sp_schedule_free(x->schedule);
    memset(x, 0, sizeof *x);
}

/* Keeps x if it is among the best (step time, then the enumeration order key). Takes a
 * copy of the schedule, layers and flags. */
static sp_status offer(ctx *c, const sp_search_choice *x, long key, const sp_schedule *sch,
                       const int *layers, const unsigned char *rc)
{
    int at = c->nbest;
    while (at > 0 && (x->step_time < c->best[at - 1].step_time ||
                      (x->step_time == c->best[at - 1].step_time && key < c->key[at - 1])))
        at--;
    if (at >= c->top) return SP_OK;
    sp_search_choice y = *x;
    y.schedule = sp_schedule_clone(sch);
    y.stage_layers = malloc((size_t)x->stages * sizeof *y.stage_layers);
    y.recompute = malloc((size_t)x->stages);
    if (!y.schedule || !y.stage_layers || !y.recompute) {
        choice_free(&y);
        return sp_set_error(SP_ERR_NOMEM, "search: out of memory");
    }
    memcpy(y.stage_layers, layers, (size_t)x->stages * sizeof *layers);
    memcpy(y.recompute, rc, (size_t)x->stages);
    if (c->nbest == c->top) choice_free(&c->best[--c->nbest]);
    memmove(&c->best[at + 1], &c->best[at], (size_t)(c->nbest - at) * sizeof *c->best);
    memmove(&c->key[at + 1], &c->key[at], (size_t)(c->nbest - at) * sizeof *c->key);
    c->best[at] = y;
    c->key[at] = key;
    c->nbest++;
    return SP_OK;
}

/* ------------------------------------------------------------------ the dry run */

/* A schedule run on its task lists alone: each task starts when its actor's previous task
 * and its inputs are done (a message `msg` later across actors), each stage's all-reduce
 * follows its last W on the actor's network, one at a time. The simulator runs the same
 * tasks with the plan's messages in FIFO order on links that serialise them, which can only
 * delay them: so the dry step is a lower bound of the simulated one, and tight where
 * links are idle. On the way, each actor's peak of live activations (F to its last
 * backward; with recomputation from the first backward), which the plan's memory peak
 * holds at least, with the persistent state. */
typedef struct {
    double step;
    double *acts;     /* [P] peak bytes of activations */
    /* scratch */
    double *end;      /* [4 m S] task end times, < 0: not run */
    int *waiter;      /* [4 m S] the actor waiting for that task, -1 */
    unsigned char *bk;/* [m S] the backward's kind of (mb, stage) */
    int *pos, *work, *lastw;
    double *clock, *net, *live;
    size_t cap_slots;
    int cap_p, cap_s;
} dry;

static void dry_release(dry *d)
{
    free(d->acts), free(d->end), free(d->waiter), free(d->bk), free(d->pos), free(d->work);
    free(d->lastw), free(d->clock), free(d->net), free(d->live);
    memset(d, 0, sizeof *d);
}

static sp_status dry_reserve(dry *d, int P, int S, int m)
{
    size_t slots = (size_t)4 * m * S;
    if (slots > d->cap_slots) {
        free(d->end), free(d->waiter), free(d->bk);
        d->end = malloc(slots * sizeof *d->end);
        d->waiter = malloc(slots * sizeof *d->waiter);
        d->bk = malloc(slots / 4);
        d->cap_slots = slots;
        if (!d->end || !d->waiter || !d->bk) goto nomem;
    }
    if (P > d->cap_p || S > d->cap_s) {
        int p = P > d->cap_p ? P : d->cap_p, n = S > d->cap_s ? S : d->cap_s;
        free(d->acts), free(d->pos), free(d->work), free(d->lastw), free(d->clock);
        free(d->net), free(d->live);
        d->acts = malloc((size_t)p * sizeof *d->acts);
        d->pos = malloc((size_t)p * sizeof *d->pos);
        d->work = malloc((size_t)p * sizeof *d->work);
        d->clock = malloc((size_t)p * sizeof *d->clock);
        d->net = malloc((size_t)p * sizeof *d->net);
        d->live = malloc((size_t)p * sizeof *d->live);
        d->lastw = malloc((size_t)n * sizeof *d->lastw);
        d->cap_p = p, d->cap_s = n;
        if (!d->acts || !d->pos || !d->work || !d->clock || !d->net || !d->live || !d->lastw)
            goto nomem;
    }
    return SP_OK;
nomem:
    dry_release(d);
    return sp_set_error(SP_ERR_NOMEM, "search: out of memory");
}

static sp_status dry_run(dry *d, const sp_stage_model *md, const double *tt,
                         const sp_schedule *sch, const unsigned char *rc, double msg,
                         const double *ar)
{
    int P = sch->nactors, S = sch->nstages, m = sch->nmicro, nw = 0, left = 0;
    sp_status st = dry_reserve(d, P, S, m);
    if (st) return st;
    for (size_t i = 0; i < (size_t)4 * m * S; i++) d->end[i] = -1, d->waiter[i] = -1;
    for (int s = 0; s < S; s++) d->lastw[s] = -1;
    for (int a = 0; a < P; a++) {
        d->pos[a] = 0, d->clock[a] = d->net[a] = d->live[a] = d->acts[a] = 0;
        d->work[nw++] = a;
        left += sch->ntasks[a];
        for (int j = 0; j < sch->ntasks[a]; j++) {
            sp_task t = sch->tasks[a][j];
            if (t.kind == SP_TASK_B || t.kind == SP_TASK_BW)
                d->bk[t.mb * S + t.stage] = (unsigned char)t.kind;
            if (t.kind == SP_TASK_W || t.kind == SP_TASK_BW) d->lastw[t.stage] = j;
        }
    }
    while (nw) {
        int a = d->work[--nw];
        while (d->pos[a] < sch->ntasks[a]) {
            sp_task t = sch->tasks[a][d->pos[a]];
            int s = t.stage, i = t.mb, dep[2], nd = 0;
            if (t.kind == SP_TASK_F && s > 0) dep[nd++] = sp_slot(SP_TASK_F, i, s - 1, S);
            if (t.kind == SP_TASK_B || t.kind == SP_TASK_BW) {
                dep[nd++] = sp_slot(SP_TASK_F, i, s, S);
                if (s + 1 < S) dep[nd++] = sp_slot(d->bk[i * S + s + 1], i, s + 1, S);
            }
            if (t.kind == SP_TASK_W) dep[nd++] = sp_slot(SP_TASK_B, i, s, S);
            double start = d->clock[a];
            int blocked = 0;
            for (int k = 0; k < nd && !blocked; k++) {
                double e = d->end[dep[k]];
                if (e < 0) {
                    d->waiter[dep[k]] = a;
                    blocked = 1;
                    break;
                }
                int src = sch->stage_actor[(dep[k] >> 2) % S];
                if (src != a) e += msg;
                if (e > start) start = e;
            }
            if (blocked) break;
            const sp_stage_info *si = &md->stage[s];
            const double *ts = tt + s * SP_NUM_TASK_KINDS;
            int again = rc[s] && (t.kind == SP_TASK_B || t.kind == SP_TASK_BW);
            double end = start + ts[t.kind] + (again ? ts[SP_TASK_F] : 0);
            int slot = sp_slot(t.kind, i, s, S);
            d->end[slot] = end;
            d->clock[a] = end;
            double act = (double)si->act_bytes;
            if ((t.kind == SP_TASK_F && !rc[s]) || again) d->live[a] += act;
            if (d->live[a] > d->acts[a]) d->acts[a] = d->live[a];
            if (t.kind == SP_TASK_W || t.kind == SP_TASK_BW) d->live[a] -= act;
            if (ar && d->pos[a] == d->lastw[s]) {
                double t0 = end > d->net[a] ? end : d->net[a];
                d->net[a] = t0 + ar[s];
            }
            if (d->waiter[slot] >= 0) d->work[nw++] = d->waiter[slot], d->waiter[slot] = -1;
            d->pos[a]++;
            left--;
        }
    }
    if (left) return sp_set_error(SP_ERR_SCHEDULE, "search: schedule '%s' does not run", sch->name);
    d->step = 0;
    for (int a = 0; a < P; a++) {
        double t = d->clock[a] > d->net[a] ? d->clock[a] : d->net[a];
        if (t > d->step) d->step = t;
    }
    return SP_OK;
}

/* Per device on actor a, at least: its persistent state (ZeRO-1's share of AdamW where
 * R > 1) and the dry run's activations. */
static double dry_bytes(const sp_stage_model *md, const sp_schedule *sch, const dry *d, int a,
                        int R)
{
    double x = d->acts[a];
    for (int s = 0; s < sch->nstages; s++)
        if (sch->stage_actor[s] == a) {
            const sp_stage_info *st = &md->stage[s];
            x += 2.0 * st->param_bytes + (R > 1 ? (double)st->opt_bytes / R : st->opt_bytes);
        }
    return x;
}

/* ------------------------------------------------------------------ one group */

/* 1: every actor's device fits the memory (with ZeRO-1 when zero1); bytes[a] the peaks. */
static int fits(const ctx *c, const sp_plan *plan, int R, int zero1, double *bytes)
{
    int ok = 1;
    for (int a = 0; a < plan->nactors; a++) {
        double b = sp_plan_device_bytes(plan, a, R, zero1);
        if (bytes) bytes[a] = b;
        ok &= b <= c->mem;
    }
    return ok;
}

/* The ZeRO-1 setting that fits (off when both do: the same time in this model, and the
 * plainer run), or -1; least: the largest device's bytes of the better one. */
static int choose_zero1(const ctx *c, const sp_plan *plan, int R, double *bytes, double *least)
{
    int z = fits(c, plan, R, 0, bytes) ? 0 : R > 1 && fits(c, plan, R, 1, bytes) ? 1 : -1;
    if (z < 0 && R > 1) fits(c, plan, R, 1, bytes);
    double top = 0;
    for (int a = 0; a < plan->nactors; a++) top = bytes[a] > top ? bytes[a] : top;
    *least = top;
    return z;
}

/* `auto` for this layout: a cap per actor of the activations the memory left after its
 * persistent state holds, lowered where the dry run still holds too much. NULL and SP_OK
 * when not one microbatch fits. */
static sp_status make_auto(const ctx *c, sp_stage_model *md, const double *tt, const group *g,
                           const links *k, const unsigned char *rc, dry *d, sp_schedule **out)
{
    int P = g->P, *cap = malloc((size_t)P * sizeof *cap);
    double *cost = malloc((size_t)P * SP_NUM_TASK_KINDS * sizeof *cost);
    sp_status st = SP_OK;
    *out = NULL;
    if (!cap || !cost) {
        free(cap), free(cost);
        return sp_set_error(SP_ERR_NOMEM, "search: out of memory");
    }
    /* auto sees the tasks' whole times (the simulator it runs has no tensor link) */
    for (int s = 0; s < P; s++)
        for (int j = 0; j < SP_NUM_TASK_KINDS; j++) {
            cost[s * SP_NUM_TASK_KINDS + j] = md->stage[s].cost[j];
            md->stage[s].cost[j] = tt[s * SP_NUM_TASK_KINDS + j];
        }
    for (int a = 0; a < P; a++) {
        const sp_stage_info *s = &md->stage[a];
        double left = c->mem - 2.0 * s->param_bytes -
                      (g->R > 1 ? (double)s->opt_bytes / g->R : (double)s->opt_bytes);
        double n = s->act_bytes ? floor(left / (double)s->act_bytes) : g->m;
        cap[a] = n > g->m ? g->m : n < 1 ? 0 : (int)n;
        if (!cap[a]) goto done; /* not one microbatch's activations fit */
    }
    for (int tries = 0; tries < 4 && st == SP_OK; tries++) {
        sp_auto_config ac = { .latency = k->lat, .bandwidth = k->bw, .mem_caps = cap };
        sp_schedule *s = NULL;
        if ((st = sp_schedule_auto(md, P, g->m, &ac, &s)) ||
            (st = dry_run(d, md, tt, s, rc, 0, NULL))) {
            sp_schedule_free(s);
            break;
        }
        int again = 0;
        for (int a = 0; a < P; a++) {
            double over = dry_bytes(md, s, d, a, g->R) - c->mem;
            if (over <= 0) continue;
            double act = md->stage[a].act_bytes ? (double)md->stage[a].act_bytes : 1;
            int less = (int)ceil(over / act);
            cap[a] -= less < 1 ? 1 : less;
            again = 1;
        }
        if (!again) {
            *out = s;
            break;
        }
        sp_schedule_free(s);
        for (int a = 0; a < P; a++)
            if (cap[a] < 1) goto done;
    }
done:
    for (int s = 0; s < P; s++)
        for (int j = 0; j < SP_NUM_TASK_KINDS; j++)
            md->stage[s].cost[j] = cost[s * SP_NUM_TASK_KINDS + j];
    free(cap), free(cost);
    return st;
}

/* The stages of the actors whose dry bytes are over the memory recompute; 0 when none is
 * over or all of theirs already do. */
static int recompute_over(const ctx *c, const sp_stage_model *md, const sp_schedule *sch,
                          const dry *d, int R, unsigned char *rc)
{
    int changed = 0;
    for (int s = 0; s < sch->nstages; s++) {
        int a = sch->stage_actor[s];
        if (!rc[s] && dry_bytes(md, sch, d, a, R) > c->mem) rc[s] = 1, changed = 1;
    }
    return changed;
}

/* Simulates a fitting plan in each rank order and offers the results. */
static sp_status simulate_orders(ctx *c, const group *g, int mode, const sp_stage_model *md,
                                 const sp_schedule *sch, const sp_plan *plan, const links *lk,
                                 const int *cut, const unsigned char *rc, int zero1,
                                 const double *bytes)
{
    int P = g->P, R = g->R, S = md->nstages, n_rc = 0, am = 0;
    for (int s = 0; s < S; s++) n_rc += rc[s];
    for (int a = 1; a < P; a++) am = bytes[a] > bytes[am] ? a : am;
    sp_status st = SP_OK;
    for (int o = 0; o < norders(lk, R) && st == SP_OK; o++) {
        sp_tensor_link tl = tensor_link(c, g->T);
        sp_sim_config sc = { .latency = lk[o].lat, .bandwidth = lk[o].bw, .scatter_gather = lk[o].sg,
                             .grad_bytes_per_param = c->gb, .skip_exposed = 1, .tensor = &tl,
                             .allreduce = R > 1 ? &lk[o].ar : NULL };
        sp_sim_result *r = NULL;
        if ((st = sp_simulate(plan, md, &sc, &r))) break;
        c->res->simulated++;
        sp_search_choice x = { .replicas = R, .actors = P, .tensor = g->T, .chunks = g->v,
                               .micro = g->m, .batch = g->B, .stages = S, .nrecompute = n_rc,
                               .zero1 = zero1, .order = (sp_rank_order)o,
                               .step_time = r->step_time, .bubble = r->bubble_fraction,
                               .memory = bytes[am], .memory_actor = am };
        st = offer(c, &x, (g->index * NRC + mode) * 2 + o, sch, cut, rc);
        sp_sim_result_free(r);
    }
    return st;
}

/* Group g in every mode its bounds leave (all of them when brute force): the schedule,
 * its dry run (a step and a memory bound of its own), then the plan and the simulations.
 * RC_BINDING recomputes on the actors whose activations do not fit in RC_NONE's dry run,
 * then on those still over, and is no layout of its own when that ends with none or all. */
static sp_status run_group(ctx *c, const group *g, dry *d)
{
    int P = g->P, S = g->v * P, R = g->R, brute = c->cfg->brute_force;
    sp_search_result *res = c->res;
    int *cut = c->cut;
    if (make_cut(c->L, S, g->cut, cut)) return sp_set_error(SP_ERR_ARG, "search: bad cut");
    double *tt = malloc((size_t)S * SP_NUM_TASK_KINDS * sizeof *tt);
    sp_stage_model *md = tt ? stages(c, g->T, g->B, S, cut, tt, NULL) : NULL;
    if (!md) {
        free(tt);
        return tt ? sp_error_context(SP_ERR_ARG, "search")
                  : sp_set_error(SP_ERR_NOMEM, "search: out of memory");
    }
    unsigned char *rc = calloc((size_t)S, 1), *none_rc = calloc((size_t)S, 1);
    double *bytes = malloc((size_t)P * sizeof *bytes), *ar = malloc((size_t)S * sizeof *ar);
    sp_status st = SP_OK;
    int none_over = -1; /* RC_NONE's dry run: 1 some actor over the memory, -1 not run */
    if (!rc || !none_rc || !bytes || !ar) {
        st = sp_set_error(SP_ERR_NOMEM, "search: out of memory");
        goto out;
    }
    links lk[2];
    for (int o = 0; o < 2; o++) layout_links(c, R, P, g->T, (sp_rank_order)o, &lk[o]);
    /* the dry run's links: the faster order's, a bound for both */
    int fast = norders(lk, R) > 1 && boundary_msg(md, &lk[1]) < boundary_msg(md, &lk[0]);
    double msg = boundary_msg(md, &lk[fast]);
    for (int s = 0; s < S; s++) {
        double x = sp_allreduce_time(&lk[0].ar, c->gb / 4 * (double)md->stage[s].param_bytes);
        double y = sp_allreduce_time(&lk[1].ar, c->gb / 4 * (double)md->stage[s].param_bytes);
        ar[s] = norders(lk, R) > 1 && y < x ? y : x;
    }
    for (int mode = 0; mode < NRC && st == SP_OK; mode++) {
        if (g->sched == SCHED_AUTO && mode != RC_NONE) break; /* auto takes no recompute */
        if (!brute && g->lb[mode] > kth(c) * (1 + SLACK)) {
            res->time_bounded++;
            continue;
        }
        if (mode == RC_BINDING && none_over != 1) continue; /* it would be RC_NONE */
        sp_schedule *sch = NULL;
        sp_plan *plan = NULL;
        memset(rc, mode == RC_ALL, (size_t)S);
        if (mode == RC_BINDING) memcpy(rc, none_rc, (size_t)S);
        for (int s = 0; s < S; s++) md->stage[s].recompute = rc[s];
        if (g->sched == SCHED_AUTO) st = make_auto(c, md, tt, g, &lk[0], rc, d, &sch);
        else st = sp_schedule_builtin_split(scheds[g->sched], P, g->m, g->v, &sch);
        if (st == SP_OK && !sch) res->refused++; /* auto: not one microbatch fits */
        if (st || !sch) goto next;
        if ((st = dry_run(d, md, tt, sch, rc, msg, R > 1 ? ar : NULL))) goto next;
        if (mode == RC_NONE) {
            none_over = recompute_over(c, md, sch, d, R, none_rc);
        } else if (mode == RC_BINDING) {
            while (st == SP_OK && recompute_over(c, md, sch, d, R, rc))
                st = dry_run(d, md, tt, sch, rc, msg, R > 1 ? ar : NULL);
            int n_rc = 0;
            for (int s = 0; s < S; s++) n_rc += rc[s];
            if (st || n_rc == S) goto next; /* all: RC_ALL's layout */
            for (int s = 0; s < S; s++) md->stage[s].recompute = rc[s];
        }
        int over = 0;
        for (int a = 0; a < P; a++) over |= dry_bytes(md, sch, d, a, R) > c->mem;
        if (!brute && over) {
            res->memory_bounded++;
            double top = 0;
            for (int a = 0; a < P; a++) top = fmax(top, dry_bytes(md, sch, d, a, R));
            if (top < c->least_mem) c->least_mem = top;
            goto next;
        }
        if (!brute && d->step > kth(c) * (1 + SLACK)) {
            res->time_bounded++;
            goto next;
        }
        if ((st = sp_plan_build(md, sch, &plan))) goto next;
        res->planned++;
        double least;
        int zero1 = choose_zero1(c, plan, R, bytes, &least);
        if (least < c->least_mem) c->least_mem = least;
        if (zero1 < 0) res->refused++;
        else st = simulate_orders(c, g, mode, md, sch, plan, lk, cut, rc, zero1, bytes);
    next:
        sp_plan_free(plan);
        sp_schedule_free(sch);
    }
out:
    free(rc), free(none_rc), free(bytes), free(ar), free(tt);
    sp_stage_model_free(md);
    return st;
}

/* ------------------------------------------------------------------ enumeration */

typedef struct {
    group *g;
    long n, cap;
} groups;

/* Every group, with its bounds. Counts what the model cannot cut. */
static sp_status enumerate(ctx *c, groups *out)
{
    int L = c->L, D = c->D, G = c->G, maxB = c->cfg->max_batch > 0 ? c->cfg->max_batch : 8;
    int node = c->dev.gpus_per_node;
    int *prev = malloc((size_t)NCUTS * (L + 1) * sizeof *prev);
    double *scratch = malloc((size_t)(2 * L + 3 * D + 8) * sizeof *scratch);
    double *ar[2] = { malloc((size_t)L * sizeof(double)), malloc((size_t)L * sizeof(double)) };
    unsigned char *all = malloc((size_t)L);
    double *tt = malloc((size_t)L * SP_NUM_TASK_KINDS * sizeof *tt);
    sp_status st = SP_OK;
    long index = 0;
    if (!prev || !scratch || !ar[0] || !ar[1] || !all || !tt) {
        st = sp_set_error(SP_ERR_NOMEM, "search: out of memory");
        goto out;
    }
    memset(all, 1, (size_t)L);
    for (int T = 1; T <= node && T <= D; T++) {
        if (node % T || D % T || !splits(c, T)) continue;
        for (int P = 1; P <= D / T && P <= L; P++) {
            if ((D / T) % P) continue;
            int R = D / T / P;
            if (G % R) continue;
            links lk[2];
            for (int o = 0; o < 2; o++) layout_links(c, R, P, T, (sp_rank_order)o, &lk[o]);
            for (int B = 1; B <= maxB && B <= G / R; B++) {
                if ((G / R) % B) continue;
                int m = G / R / B;
                for (int v = 1; v * P <= L; v++) {
                    int S = v * P, any = 0;
                    for (int k = 0; k < NSCHED; k++) any |= sched_fits(c, k, P, m, v);
                    if (!any) continue;
                    int valid[NCUTS];
                    for (int k = 0; k < NCUTS && st == SP_OK; k++) {
                        int *cut = prev + k * (L + 1), dup = make_cut(L, S, k, cut) != 0;
                        valid[k] = !dup;
                        for (int j = 0; j < k && !dup; j++)
                            dup = valid[j] && same_cut(cut, prev + j * (L + 1), S);
                        if (dup) {
                            valid[k] = 0;
                            continue;
                        }
                        sp_stage_model *md = stages(c, T, B, S, cut, tt, NULL);
                        if (!md) {
                            st = sp_error_context(SP_ERR_ARG, "search");
                            break;
                        }
                        /* the all-reduce of each stage's gradients, per rank order */
                        for (int o = 0; o < norders(lk, R); o++)
                            for (int s = 0; s < S; s++)
                                ar[o][s] = sp_allreduce_time(&lk[o].ar, c->gb / 4 *
                                                             (double)md->stage[s].param_bytes);
                        for (int sk = 0; sk < NSCHED; sk++) {
                            if (!sched_fits(c, sk, P, m, v)) continue;
                            group g = { .T = T, .P = P, .R = R, .B = B, .m = m, .v = v,
                                        .sched = sk, .cut = k, .index = index++ };
                            g.mem_lb = memory_bound(md, sk, P, R);
                            for (int mode = 0; mode < NRC; mode++) {
                                double best = INFINITY;
                                for (int o = 0; o < norders(lk, R); o++) {
                                    double x = step_bound(md, tt, sk, P, m,
                                                          mode == RC_ALL ? all : NULL,
                                                          boundary_msg(md, &lk[o]),
                                                          R > 1 ? ar[o] : NULL, scratch);
                                    best = x < best ? x : best;
                                }
                                g.lb[mode] = best;
                            }
                            group *x = out->n < out->cap ? out->g
                                       : realloc(out->g, (size_t)(out->cap += 4096) * sizeof *x);
                            if (!x) {
                                st = sp_set_error(SP_ERR_NOMEM, "search: out of memory");
                                break;
                            }
                            out->g = x;
                            out->g[out->n++] = g;
                        }
                        sp_stage_model_free(md);
                    }
                }
            }
        }
    }
out:
    free(prev), free(scratch), free(ar[0]), free(ar[1]), free(all), free(tt);
    return st;
}

static int by_bound(const void *x, const void *y)
{
    const group *a = x, *b = y;
    if (a->lb[RC_NONE] != b->lb[RC_NONE]) return a->lb[RC_NONE] < b->lb[RC_NONE] ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* ------------------------------------------------------------------ the report */

/* Where the step of choice x goes (search.h's shares), by two more simulations of its
 * plan: free links without the all-reduce, and the layout's own. */
static sp_status explain(ctx *c, sp_search_choice *x)
{
    int S = x->stages, P = x->actors;
    double *tp = malloc((size_t)S * SP_NUM_TASK_KINDS * 2 * sizeof *tp);
    sp_stage_model *md = tp ? stages(c, x->tensor, x->batch, S, x->stage_layers,
                                     tp + S * SP_NUM_TASK_KINDS, tp) : NULL;
    sp_plan *plan = NULL;
    sp_sim_result *r = NULL, *r0 = NULL;
    sp_status st = SP_OK;
    if (!md) {
        st = tp ? sp_error_context(SP_ERR_ARG, "search")
                : sp_set_error(SP_ERR_NOMEM, "search: out of memory");
        goto out;
    }
    for (int s = 0; s < S; s++) md->stage[s].recompute = x->recompute[s];
    links k;
    layout_links(c, x->replicas, P, x->tensor, x->order, &k);
    sp_tensor_link tl = tensor_link(c, x->tensor);
    sp_sim_config sc = { .latency = k.lat, .bandwidth = k.bw, .scatter_gather = k.sg,
                         .grad_bytes_per_param = c->gb,
                         .tensor = &tl, .allreduce = x->replicas > 1 ? &k.ar : NULL };
    sp_sim_config free_links = { .grad_bytes_per_param = c->gb, .tensor = &tl };
    if ((st = sp_plan_build(md, x->schedule, &plan)) || (st = sp_simulate(plan, md, &sc, &r)) ||
        (st = sp_simulate(plan, md, &free_links, &r0)))
        goto out;
    double span = P * r->step_time, tens = 0, again = 0, work = 0;
    for (int s = 0; s < S; s++) {
        const double *t = tp + s * SP_NUM_TASK_KINDS, *cost = md->stage[s].cost;
        tens += x->micro * (t[SP_TASK_F] * (1 + x->recompute[s]) + t[SP_TASK_B] + t[SP_TASK_W]);
        again += x->recompute[s] ? x->micro * cost[SP_TASK_F] : 0;
        work += x->micro * (cost[SP_TASK_F] + cost[SP_TASK_B] + cost[SP_TASK_W]);
    }
    x->share_tensor = tens / span;
    x->share_recompute = again / span;
    x->share_schedule = (P * r0->step_time - (tens + again + work)) / span;
    x->share_allreduce = r->exposed_comm / r->step_time;
    x->share_p2p = x->bubble - x->share_schedule - x->share_allreduce;
    if (x->share_p2p < 0) x->share_p2p = 0;
    x->tflops = c->res->flops_per_step / ((double)c->D * x->step_time);
    x->mfu = x->tflops / c->dev.peak_flops;
    const struct { const char *what; double v; } loss[] = {
        { "bubble", x->share_schedule }, { "p2p", x->share_p2p },
        { "replica all-reduce", x->share_allreduce }, { "tensor all-reduce", x->share_tensor },
        { "recompute", x->share_recompute } };
    int w = 0;
    for (int i = 1; i < 5; i++) w = loss[i].v > loss[w].v ? i : w;
    snprintf(x->binds, sizeof x->binds, "%s %.0f%%%s", loss[w].what, 100 * loss[w].v,
             x->memory > 0.9 * c->mem ? ", memory" : "");
out:
    sp_sim_result_free(r), sp_sim_result_free(r0);
    sp_plan_free(plan);
    sp_stage_model_free(md);
    free(tp);
    return st;
}

/* The model's FLOPs of one step on all devices (no recomputation). */
static double step_flops(const ctx *c)
{
    int *cut = c->cut;
    double tt[SP_NUM_TASK_KINDS];
    make_cut(c->L, 1, 0, cut);
    sp_stage_model *md = stages(c, 1, 1, 1, cut, tt, NULL);
    if (!md) return 0;
    double *k = md->stage[0].cost, f = (k[SP_TASK_F] + k[SP_TASK_B] + k[SP_TASK_W]) * c->rate;
    sp_stage_model_free(md);
    return f * c->G;
}

void sp_search_result_free(sp_search_result *r)
{
    if (!r) return;
    for (int i = 0; i < r->n; i++) choice_free(&r->best[i]);
    free(r->best);
    free(r);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static sp_status check_config(const sp_search_config *cfg)
{
    const sp_device_spec *d = &cfg->device;
    if (!cfg->gpt == !cfg->llama)
        return sp_set_error(SP_ERR_ARG, "search: one model, a GPT or a Llama");
    if (cfg->devices < 1 || cfg->global_batch < 1)
        return sp_set_error(SP_ERR_ARG, "search: --devices and --global-batch must be at least 1 "
                            "(got %d and %d)", cfg->devices, cfg->global_batch);
    if (!(d->peak_flops > 0) || !(d->efficiency > 0) || d->efficiency > 1 || !(d->memory > 0) ||
        d->gpus_per_node < 1 || !(d->nvlink_bw > 0) || !(d->network_bw > 0) ||
        !(d->nvlink_alpha >= 0) || !(d->network_alpha >= 0) || !isfinite(d->peak_flops * d->memory))
        return sp_set_error(SP_ERR_ARG, "search: the device needs a peak rate, an efficiency in "
                            "(0, 1], memory, GPUs per node and link rates above 0");
    return SP_OK;
}

sp_status sp_search(const sp_search_config *cfg, sp_search_result **out)
{
    *out = NULL;
    sp_status st = check_config(cfg);
    if (st) return st;
    double t_start = now();
    ctx c = { .cfg = cfg, .dev = cfg->device, .D = cfg->devices, .G = cfg->global_batch,
              .top = cfg->top > 0 ? cfg->top : 5, .least_mem = INFINITY };
    c.L = cfg->gpt ? cfg->gpt->layers : cfg->llama->layers;
    c.rate = c.dev.peak_flops * c.dev.efficiency;
    c.gb = cfg->grad_bytes > 0 ? cfg->grad_bytes : 2;
    c.mem = c.dev.memory;
    c.heads = cfg->llama ? cfg->llama->heads : 0;
    if (cfg->gpt) {
        int C = cfg->gpt->channels;
        c.heads = cfg->gpt_heads > 0 ? cfg->gpt_heads
                  : C % 128 == 0     ? C / 128
                  : C % 64 == 0      ? C / 64
                                     : 1;
    }
    groups gs = { 0 };
    dry dr = { 0 };
    c.res = calloc(1, sizeof *c.res);
    c.best = calloc((size_t)c.top, sizeof *c.best);
    c.key = calloc((size_t)c.top, sizeof *c.key);
    c.cut = malloc(((size_t)c.L + 2) * sizeof *c.cut);
    if (!c.res || !c.best || !c.key || !c.cut) {
        st = sp_set_error(SP_ERR_NOMEM, "search: out of memory");
        goto fail;
    }
    if (c.L < 1) {
        st = sp_set_error(SP_ERR_ARG, "search: the model has no layers");
        goto fail;
    }
    if ((st = enumerate(&c, &gs))) goto fail;
    c.res->flops_per_step = step_flops(&c);
    if (!gs.n) {
        st = sp_set_error(SP_ERR_ARG, "search: no layout of %d devices: replicas x actors x "
                          "tensor must make %d with the tensor degree dividing the %d GPUs of a "
                          "node and what the model splits by it, at most %d actors (the layers), "
                          "and the replicas dividing the global batch of %d",
                          c.D, c.D, c.dev.gpus_per_node, c.L, c.G);
        goto fail;
    }
    for (long i = 0; i < gs.n; i++) {
        const group *g = &gs.g[i];
        c.res->candidates += g->sched == SCHED_AUTO ? 1 : NRC;
    }
    if (!cfg->brute_force) { /* memory bounds first, then the best bound first */
        long n = 0;
        for (long i = 0; i < gs.n; i++) {
            if (gs.g[i].mem_lb > c.mem) {
                c.res->memory_bounded += gs.g[i].sched == SCHED_AUTO ? 1 : NRC;
                if (gs.g[i].mem_lb < c.least_mem) c.least_mem = gs.g[i].mem_lb;
            } else {
                gs.g[n++] = gs.g[i];
            }
        }
        gs.n = n;
        qsort(gs.g, (size_t)gs.n, sizeof *gs.g, by_bound);
    }
    for (long i = 0; i < gs.n && st == SP_OK; i++) {
        if (!cfg->brute_force && gs.g[i].lb[RC_NONE] > kth(&c) * (1 + SLACK)) {
            for (long j = i; j < gs.n; j++)
                c.res->time_bounded += gs.g[j].sched == SCHED_AUTO ? 1 : NRC;
            break;
        }
        st = run_group(&c, &gs.g[i], &dr);
    }
    if (st) goto fail;
    if (!c.nbest) {
        char ts[64] = "";
        for (int T = 1, k = 0; T <= c.dev.gpus_per_node; T++)
            if (c.dev.gpus_per_node % T == 0 && c.D % T == 0 && splits(&c, T))
                k += snprintf(ts + k, sizeof ts - (size_t)k, "%s%d", k ? ", " : "", T);
        st = sp_set_error(SP_ERR_ARG, "search: no layout of %d devices fits %.4g GB per device: "
                          "the least any needs is %.4g GB (tensor degrees tried: %s, those "
                          "that divide the %s and a node)", c.D, c.mem / 1e9, c.least_mem / 1e9,
                          ts, cfg->gpt ? "heads and the channels" : "KV heads and the MLP's width");
        goto fail;
    }
    for (int i = 0; i < c.nbest && st == SP_OK; i++) st = explain(&c, &c.best[i]);
    if (st) goto fail;
    c.res->n = c.nbest;
    c.res->heads = c.heads;
    c.res->best = c.best;
    c.res->seconds = now() - t_start;
    *out = c.res;
    free(gs.g), free(c.key), free(c.cut);
    dry_release(&dr);
    return SP_OK;
fail:
    free(gs.g), free(c.key), free(c.cut);
    dry_release(&dr);
    for (int i = 0; i < c.nbest; i++) choice_free(&c.best[i]);
    free(c.best), free(c.res);
    return st;
}
