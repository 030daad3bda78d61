/* The unrolled training step as a task graph: indexing a schedule's tasks, the dependency
 * rules, and validation (every task once on its stage's actor; dataflow plus actor order
 * acyclic), with a message that names a concrete cycle. */
#include "sched/sched_impl.h"

#include <stdio.h>
#include <string.h>

static sp_status check_model(const sp_stage_model *model)
{
    if (!model || model->nstages < 1)
        return sp_set_error(SP_ERR_ARG, "stage model has no stages");
    if (model->nstages > SP_MAX_INDEX || model->nedges > SP_MAX_INDEX)
        return sp_set_error(SP_ERR_ARG, "stage model too large");
    for (int e = 0; e < model->nedges; e++) {
        const sp_stage_edge *ed = &model->edge[e];
        if (ed->src_stage < 0 || ed->dst_stage >= model->nstages
            || ed->src_stage >= ed->dst_stage)
            return sp_set_error(SP_ERR_ARG, "stage edge %d: %d -> %d must go forward "
                                "between stages 0..%d", e, ed->src_stage, ed->dst_stage,
                                model->nstages - 1);
    }
    for (int k = 0; k < model->nshared; k++) {
        const sp_stage_shared *sh = &model->shared[k];
        if (sh->nstages < 1 || sh->nstages > 8)
            return sp_set_error(SP_ERR_ARG, "shared parameter %d: %d stages (1..8)", k,
                                sh->nstages);
        for (int j = 0; j < sh->nstages; j++)
            if (sh->stages[j] < 0 || sh->stages[j] >= model->nstages
                || (j && sh->stages[j] <= sh->stages[j - 1]))
                return sp_set_error(SP_ERR_ARG, "shared parameter %d: stages must be "
                                    "ascending in 0..%d", k, model->nstages - 1);
    }
    return SP_OK;
}

void sp_tgraph_release(sp_tgraph *g)
{
    free(g->pos);
    free(g->bk);
    free(g->in_off);
    free(g->in_e);
    free(g->out_off);
    free(g->out_e);
    memset(g, 0, sizeof *g);
}

static sp_status fail(sp_tgraph *g, sp_status st)
{
    sp_tgraph_release(g);
    return st;
}

sp_status sp_tgraph_build(sp_tgraph *g, const sp_stage_model *model, const sp_schedule *s)
{
    memset(g, 0, sizeof *g);
    sp_status st = check_model(model);
    if (st) return st;
    if (!s) return sp_set_error(SP_ERR_ARG, "no schedule");
    if (s->nstages != model->nstages)
        return sp_set_error(SP_ERR_SCHEDULE, "schedule '%s' has %d stages but the model has %d",
                            s->name, s->nstages, model->nstages);
    int p = s->nactors, S = s->nstages, m = s->nmicro, E = model->nedges;
    /* Too few tasks to be complete: say so before allocating anything of size m*S (a
     * header of a few bytes can declare millions of slots). */
    int fwd = s->forward_only != 0, per = fwd ? 1 : 2;
    if ((int64_t)sp_schedule_total_tasks(s) < per * (int64_t)m * S)
        return sp_set_error(SP_ERR_SCHEDULE, "schedule '%s' lists %d tasks, but %d stages and "
                            "%d microbatches need at least %lld (%s for each)", s->name,
                            sp_schedule_total_tasks(s), S, m, (long long)per * m * S,
                            fwd ? "an F" : "an F and a BW, or B and W,");
    g->p = p, g->S = S, g->m = m, g->E = E;
    g->fwd = fwd;
    g->model = model;
    g->sched = s;
    g->nslots = 4 * m * S;
    for (int st2 = 0; st2 < S; st2++)
        if (s->stage_actor[st2] < 0 || s->stage_actor[st2] >= p)
            return sp_set_error(SP_ERR_SCHEDULE, "stage %d is placed on actor %d, not in 0..%d",
                                st2, s->stage_actor[st2], p - 1);

    g->pos = malloc((size_t)g->nslots * sizeof *g->pos);
    g->bk = calloc((size_t)m * S, 1);
    g->in_off = calloc((size_t)S + 1, sizeof *g->in_off);
    g->out_off = calloc((size_t)S + 1, sizeof *g->out_off);
    g->in_e = malloc((size_t)(E ? E : 1) * sizeof *g->in_e);
    g->out_e = malloc((size_t)(E ? E : 1) * sizeof *g->out_e);
    if (!g->pos || !g->bk || !g->in_off || !g->out_off || !g->in_e || !g->out_e)
        return fail(g, sp_set_error(SP_ERR_NOMEM, "out of memory indexing the task graph"));
    memset(g->pos, 0xff, (size_t)g->nslots * sizeof *g->pos);

    /* Stage edges as CSR, in edge order, so that every walk over them is deterministic. */
    for (int e = 0; e < E; e++) {
        g->in_off[model->edge[e].dst_stage + 1]++;
        g->out_off[model->edge[e].src_stage + 1]++;
    }
    int maxdeg = 0;
    for (int st2 = 0; st2 < S; st2++) {
        int d = g->in_off[st2 + 1] + g->out_off[st2 + 1];
        if (d > maxdeg) maxdeg = d;
        g->in_off[st2 + 1] += g->in_off[st2];
        g->out_off[st2 + 1] += g->out_off[st2];
    }
    g->maxdeg = maxdeg + 3;
    {
        int *fi = malloc((size_t)S * 2 * sizeof *fi);
        if (!fi) return fail(g, sp_set_error(SP_ERR_NOMEM, "out of memory"));
        memcpy(fi, g->in_off, (size_t)S * sizeof *fi);
        memcpy(fi + S, g->out_off, (size_t)S * sizeof *fi);
        for (int e = 0; e < E; e++) {
            g->in_e[fi[model->edge[e].dst_stage]++] = e;
            g->out_e[fi[S + model->edge[e].src_stage]++] = e;
        }
        free(fi);
    }

    /* Every task once, on its stage's actor; B/W and BW not mixed for one (mb, stage). */
    char t1[48], t2[48];
    for (int a = 0; a < p; a++) {
        for (int j = 0; j < s->ntasks[a]; j++) {
            sp_task t = s->tasks[a][j];
            if (t.kind < 0 || t.kind >= SP_NUM_TASK_KINDS || t.mb < 0 || t.mb >= m
                || t.stage < 0 || t.stage >= S)
                return fail(g, sp_set_error(SP_ERR_SCHEDULE, "actor %d, position %d: task "
                                            "(kind %d, mb %d, stage %d) out of range", a, j,
                                            t.kind, t.mb, t.stage));
            sp_task_format(t, t1, sizeof t1);
            if (fwd && t.kind != SP_TASK_F)
                return fail(g, sp_set_error(SP_ERR_SCHEDULE, "%s is in actor %d's list "
                                            "(position %d) but schedule '%s' is forward-only "
                                            "(F tasks only)", t1, a, j, s->name));
            if (s->stage_actor[t.stage] != a)
                return fail(g, sp_set_error(SP_ERR_SCHEDULE, "%s is in actor %d's list "
                                            "(position %d) but stage %d is placed on actor %d",
                                            t1, a, j, t.stage, s->stage_actor[t.stage]));
            int sl = sp_slot(t.kind, t.mb, t.stage, S);
            if (g->pos[sl] >= 0)
                return fail(g, sp_set_error(SP_ERR_SCHEDULE, "%s appears twice on actor %d "
                                            "(positions %d and %d)", t1, a, g->pos[sl], j));
            g->pos[sl] = j;
            g->ntasks++;
        }
    }
    for (int i = 0; i < m; i++) {
        for (int st2 = 0; st2 < S; st2++) {
            int a = s->stage_actor[st2];
            int f = g->pos[sp_slot(SP_TASK_F, i, st2, S)] >= 0;
            int b = g->pos[sp_slot(SP_TASK_B, i, st2, S)] >= 0;
            int w = g->pos[sp_slot(SP_TASK_W, i, st2, S)] >= 0;
            int bw = g->pos[sp_slot(SP_TASK_BW, i, st2, S)] >= 0;
            sp_task tf = { SP_TASK_F, i, st2 }, tb = { SP_TASK_B, i, st2 },
                    tw = { SP_TASK_W, i, st2 }, tbw = { SP_TASK_BW, i, st2 };
            if (!f)
                return fail(g, sp_set_error(SP_ERR_SCHEDULE, "%s is missing (actor %d)",
                                            sp_task_format(tf, t1, sizeof t1), a));
            g->bk[i * S + st2] = SP_TASK_BW;
            if (fwd) continue; /* no backward to check */
            if (bw && (b || w))
                return fail(g, sp_set_error(SP_ERR_SCHEDULE, "both %s and %s are scheduled "
                                            "(actor %d): use BW, or B and W",
                                            sp_task_format(tbw, t1, sizeof t1),
                                            sp_task_format(b ? tb : tw, t2, sizeof t2), a));
            if (!bw && !b && !w)
                return fail(g, sp_set_error(SP_ERR_SCHEDULE, "%s (or %s and %s) is missing "
                                            "(actor %d)", sp_task_format(tbw, t1, sizeof t1),
                                            sp_task_format(tb, t2, sizeof t2),
                                            sp_task_format(tw, (char[48]){ 0 }, 48), a));
            if (!bw && b != w)
                return fail(g, sp_set_error(SP_ERR_SCHEDULE, "%s is missing (actor %d has "
                                            "%s)", sp_task_format(b ? tw : tb, t1, sizeof t1),
                                            a, sp_task_format(b ? tb : tw, t2, sizeof t2)));
            g->bk[i * S + st2] = (unsigned char)(bw ? SP_TASK_BW : SP_TASK_B);
        }
    }
    return SP_OK;
}

/* Slot of the task that does the weight-gradient part of (mb, stage): W or BW. */
static inline int wslot(const sp_tgraph *g, int mb, int stage)
{
    int k = g->bk[mb * g->S + stage] == SP_TASK_BW ? SP_TASK_BW : SP_TASK_W;
    return sp_slot(k, mb, stage, g->S);
}
/* Slot of the task that does the input-gradient part: B or BW. */
static inline int bslot(const sp_tgraph *g, int mb, int stage)
{
    return sp_slot(g->bk[mb * g->S + stage], mb, stage, g->S);
}

/* The dependency rules of the unrolled step (docs/planner.md, "Task graph"). */
int sp_tgraph_preds(const sp_tgraph *g, int slot, int *out, unsigned char *why)
{
    sp_task t = sp_slot_task(slot, g->S);
    const sp_stage_edge *edge = g->model->edge;
    int n = 0;
#define ADD(x, r) do { if (why) why[n] = (unsigned char)(r); out[n++] = (x); } while (0)
    if (t.kind == SP_TASK_F) {
        for (int j = g->in_off[t.stage]; j < g->in_off[t.stage + 1]; j++)
            ADD(sp_slot(SP_TASK_F, t.mb, edge[g->in_e[j]].src_stage, g->S), SP_DEP_FWD);
        return n;
    }
    if (t.kind == SP_TASK_W) {
        ADD(sp_slot(SP_TASK_B, t.mb, t.stage, g->S), SP_DEP_BW);
    } else { /* B or BW */
        ADD(sp_slot(SP_TASK_F, t.mb, t.stage, g->S), SP_DEP_SAVED);
        for (int j = g->out_off[t.stage]; j < g->out_off[t.stage + 1]; j++) {
            const sp_stage_edge *e = &edge[g->out_e[j]];
            if (e->needs_grad) ADD(bslot(g, t.mb, e->dst_stage), SP_DEP_GRAD);
        }
    }
    if (t.kind != SP_TASK_B && t.mb > 0) ADD(wslot(g, t.mb - 1, t.stage), SP_DEP_ACCUM);
#undef ADD
    return n;
}

int sp_tgraph_succs(const sp_tgraph *g, int slot, int *out)
{
    sp_task t = sp_slot_task(slot, g->S);
    const sp_stage_edge *edge = g->model->edge;
    int n = 0;
    if (t.kind == SP_TASK_F) {
        for (int j = g->out_off[t.stage]; j < g->out_off[t.stage + 1]; j++)
            out[n++] = sp_slot(SP_TASK_F, t.mb, edge[g->out_e[j]].dst_stage, g->S);
        if (!g->fwd) out[n++] = bslot(g, t.mb, t.stage);
        return n;
    }
    if (t.kind == SP_TASK_B || t.kind == SP_TASK_BW)
        for (int j = g->in_off[t.stage]; j < g->in_off[t.stage + 1]; j++) {
            const sp_stage_edge *e = &edge[g->in_e[j]];
            if (e->needs_grad) out[n++] = bslot(g, t.mb, e->src_stage);
        }
    if (t.kind == SP_TASK_B) out[n++] = sp_slot(SP_TASK_W, t.mb, t.stage, g->S);
    else if (t.mb + 1 < g->m) out[n++] = wslot(g, t.mb + 1, t.stage);
    return n;
}

static const char *reason_text(int r)
{
    switch (r) {
    case SP_DEP_ORDER: return "earlier in its actor's order";
    case SP_DEP_FWD: return "forward input";
    case SP_DEP_SAVED: return "saved tensors of its forward";
    case SP_DEP_GRAD: return "output gradient";
    case SP_DEP_BW: return "B before W";
    default: return "gradient accumulation order";
    }
}

sp_status sp_tgraph_acyclic(const sp_tgraph *g, sp_task *cycle, int cap, int *cycle_len)
{
    const sp_schedule *s = g->sched;
    int S = g->S;
    if (cycle_len) *cycle_len = 0;
    int *indeg = malloc((size_t)g->nslots * sizeof *indeg);
    int *queue = malloc((size_t)(g->ntasks ? g->ntasks : 1) * sizeof *queue);
    int *buf = malloc((size_t)g->maxdeg * sizeof *buf);
    unsigned char *why = malloc((size_t)g->maxdeg);
    if (!indeg || !queue || !buf || !why) {
        free(indeg), free(queue), free(buf), free(why);
        return sp_set_error(SP_ERR_NOMEM, "out of memory checking the schedule");
    }
    int qn = 0;
    for (int sl = 0; sl < g->nslots; sl++) {
        if (g->pos[sl] < 0) continue;
        indeg[sl] = sp_tgraph_preds(g, sl, buf, NULL) + (g->pos[sl] > 0);
        if (!indeg[sl]) queue[qn++] = sl;
    }
    for (int qh = 0; qh < qn; qh++) {
        int sl = queue[qh];
        int n = sp_tgraph_succs(g, sl, buf);
        for (int j = 0; j < n; j++)
            if (--indeg[buf[j]] == 0) queue[qn++] = buf[j];
        sp_task t = sp_slot_task(sl, S);
        int a = s->stage_actor[t.stage], next = g->pos[sl] + 1;
        if (next < s->ntasks[a]) {
            sp_task u = s->tasks[a][next];
            int su = sp_slot(u.kind, u.mb, u.stage, S);
            if (--indeg[su] == 0) queue[qn++] = su;
        }
    }
    sp_status st = SP_OK;
    if (qn < g->ntasks) {
        /* Every unprocessed task still waits for an unprocessed one, so walking from any
         * of them along "waits for" must come back to a task already on the walk. */
        int start = -1;
        for (int sl = 0; sl < g->nslots && start < 0; sl++)
            if (g->pos[sl] >= 0 && indeg[sl] > 0) start = sl;
        /* Reuse queue as the walk and indeg as "index on the walk + 1" (negated). */
        int len = 0, x = start;
        unsigned char *wr = malloc((size_t)g->ntasks + 1);
        if (!wr) {
            free(indeg), free(queue), free(buf), free(why);
            return sp_set_error(SP_ERR_NOMEM, "out of memory");
        }
        while (indeg[x] > 0) {
            indeg[x] = -(len + 1);
            queue[len] = x;
            sp_task t = sp_slot_task(x, S);
            int y = -1, r = SP_DEP_ORDER;
            int n = sp_tgraph_preds(g, x, buf, why);
            for (int j = 0; j < n && y < 0; j++)
                if (indeg[buf[j]] != 0) y = buf[j], r = why[j];
            if (y < 0) { /* then it is the actor-order predecessor */
                sp_task u = s->tasks[s->stage_actor[t.stage]][g->pos[x] - 1];
                y = sp_slot(u.kind, u.mb, u.stage, S);
                r = SP_DEP_ORDER;
            }
            wr[len++] = (unsigned char)r;
            x = y;
        }
        int first = -indeg[x] - 1, n = len - first;
        char msg[1000], a1[48], a2[48];
        size_t off = (size_t)snprintf(msg, sizeof msg, "schedule '%s' cannot run: a cycle of "
                                      "%d tasks: ", s->name, n);
        for (int j = 0; j < n; j++) {
            int u = queue[first + j], w = queue[first + (j + 1) % n];
            sp_task tu = sp_slot_task(u, S), tw = sp_slot_task(w, S);
            if (cycle && j < cap) cycle[j] = tu;
            if (off < sizeof msg - 200)
                off += (size_t)snprintf(msg + off, sizeof msg - off, "%s%s on actor %d waits "
                                        "for %s on actor %d (%s)", j ? "; " : "",
                                        sp_task_format(tu, a1, sizeof a1),
                                        s->stage_actor[tu.stage],
                                        sp_task_format(tw, a2, sizeof a2),
                                        s->stage_actor[tw.stage],
                                        reason_text(wr[first + j]));
            else if (off < sizeof msg - 8)
                off += (size_t)snprintf(msg + off, sizeof msg - off, "; ...");
        }
        if (cycle_len) *cycle_len = n;
        free(wr);
        st = sp_set_error(SP_ERR_SCHEDULE, "%s", msg);
    }
    free(indeg), free(queue), free(buf), free(why);
    return st;
}

sp_status sp_schedule_validate(const sp_schedule *s, const sp_stage_model *model)
{
    sp_tgraph g;
    sp_status st = sp_tgraph_build(&g, model, s);
    if (st) return st;
    st = sp_tgraph_acyclic(&g, NULL, 0, NULL);
    sp_tgraph_release(&g);
    return st;
}

int sp_schedule_find_cycle(const sp_schedule *s, const sp_stage_model *model,
                           sp_task *cycle, int cap)
{
    sp_tgraph g;
    if (sp_tgraph_build(&g, model, s)) return -1;
    int len = 0;
    sp_tgraph_acyclic(&g, cycle, cap, &len);
    sp_tgraph_release(&g);
    return len;
}

/* ------------------------------------------------------------------ buffer sets */

static inline size_t hash_key(uint64_t k, size_t mask)
{
    k ^= k >> 29;
    k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 32;
    return (size_t)k & mask;
}

int sp_bufset_init(sp_bufset *h, size_t expect)
{
    size_t cap = 64;
    while (cap < 2 * expect) cap *= 2;
    h->key = calloc(cap, sizeof *h->key);
    h->val = malloc(cap * sizeof *h->val);
    h->cap = cap;
    h->n = 0;
    if (!h->key || !h->val) {
        sp_bufset_release(h);
        return -1;
    }
    return 0;
}

void sp_bufset_release(sp_bufset *h)
{
    free(h->key);
    free(h->val);
    h->key = NULL;
    h->val = NULL;
    h->cap = h->n = 0;
}

int64_t *sp_bufset_find(const sp_bufset *h, uint64_t key)
{
    size_t mask = h->cap - 1;
    for (size_t i = hash_key(key, mask);; i = (i + 1) & mask) {
        if (h->key[i] == key) return &h->val[i];
        if (!h->key[i]) return NULL;
    }
}

int sp_bufset_put(sp_bufset *h, uint64_t key, int64_t val)
{
    if (2 * (h->n + 1) > h->cap) {
        sp_bufset big;
        if (sp_bufset_init(&big, h->cap)) return -1;
        for (size_t i = 0; i < h->cap; i++)
            if (h->key[i]) sp_bufset_put(&big, h->key[i], h->val[i]);
        sp_bufset_release(h);
        *h = big;
    }
    size_t mask = h->cap - 1, i = hash_key(key, mask);
    while (h->key[i] && h->key[i] != key) i = (i + 1) & mask;
    if (!h->key[i]) h->n++;
    h->key[i] = key;
    h->val[i] = val;
    return 0;
}

int sp_bufset_del(sp_bufset *h, uint64_t key)
{
    size_t mask = h->cap - 1, i = hash_key(key, mask);
    while (h->key[i] != key) {
        if (!h->key[i]) return 0;
        i = (i + 1) & mask;
    }
    /* Backward-shift deletion keeps every probe chain unbroken without tombstones. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!h->key[j]) break;
        size_t home = hash_key(h->key[j], mask);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            h->key[i] = h->key[j];
            h->val[i] = h->val[j];
            i = j;
        }
    }
    h->key[i] = 0;
    h->n--;
    return 1;
}
