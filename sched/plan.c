/* Lowering a valid schedule to per-actor programs. One dry run in time order (costs from
 * the stage model, free links) merges all actors into a single global order G; every
 * message is numbered in G when its producer finishes, its SEND goes right after the
 * producer and its RECV at the consumer's current end, then sinks towards its first
 * reader without passing another message. Shared-weight combines and optimizer updates
 * are placed the same way when their inputs are done. Liveness then adds FREEs and the
 * memory peaks. Why this cannot deadlock: docs/planner.md. */
#include "sched/sched_impl.h"

#include <string.h>

typedef struct {
    sp_instr *v;
    int n, cap;
} ivec;

static int ivec_push(ivec *x, const sp_instr *in)
{
    if (x->n == x->cap) {
        int cap = x->cap ? 2 * x->cap : 256;
        sp_instr *v = realloc(x->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        x->v = v;
        x->cap = cap;
    }
    x->v[x->n++] = *in;
    return 0;
}

typedef struct {
    double t;
    int64_t order; /* finish events (even) before start events (odd) at equal times */
    int id;
} event;

typedef struct {
    event *v;
    int n, cap;
} heap;

static int ev_less(const event *a, const event *b)
{
    return a->t < b->t || (a->t == b->t && a->order < b->order);
}

static int heap_push(heap *h, event e)
{
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 1024;
        event *v = realloc(h->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        h->v = v;
        h->cap = cap;
    }
    int i = h->n++;
    while (i > 0 && ev_less(&e, &h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = e;
    return 0;
}

static event heap_pop(heap *h)
{
    event top = h->v[0], last = h->v[--h->n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && ev_less(&h->v[c + 1], &h->v[c])) c++;
        if (!ev_less(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    h->v[i] = last;
    return top;
}

typedef struct {
    const sp_stage_model *model;
    const sp_schedule *sched;
    sp_tgraph g;
    int p, S, m, E, K;
    int *sh_off, *sh_k;  /* CSR: stage -> shared parameters (with >= 2 stages) using it */
    int *deferred;       /* [K] */
    int *comb_def;       /* [K]: stages whose last W is still to come (deferred form) */
    int *comb_mb;        /* [K m]: stages whose W(mb) is still to come (per microbatch) */
    int *opt_cnt;        /* [S] */
    ivec *prog;          /* [p] */
    int64_t nmsg;
    int64_t evorder;
    int nomem;
    int maxacc;
} ctx;

size_t sp_buf_bytes(const sp_stage_model *model, sp_buf b)
{
    switch (b.cls) {
    case SP_BUF_ACT: return model->stage[b.idx].act_bytes;
    case SP_BUF_BGRAD: return model->stage[b.idx].bgrad_bytes;
    case SP_BUF_EDGE_FWD: case SP_BUF_EDGE_GRAD: return model->edge[b.idx].bytes;
    case SP_BUF_PARAMS: case SP_BUF_GRADS: return model->stage[b.idx].param_bytes;
    case SP_BUF_OPT: return model->stage[b.idx].opt_bytes;
    case SP_BUF_SHARED_PARAM: case SP_BUF_SHARED_GRAD: return model->shared[b.idx].bytes;
    default: return 0;
    }
}

void sp_mem_add(sp_mem_peak *peak, size_t cur[5], int *act_count, sp_buf b, size_t bytes,
                int sign)
{
    int c = sp_buf_category(b);
    if (sign > 0) cur[c] += bytes;
    else cur[c] -= bytes;
    if (b.cls == SP_BUF_ACT) *act_count += sign > 0 ? 1 : -1;
    size_t *pk[5] = { &peak->params, &peak->grads, &peak->opt, &peak->acts, &peak->boundary };
    if (cur[c] > *pk[c]) *pk[c] = cur[c];
    size_t tot = cur[0] + cur[1] + cur[2] + cur[3] + cur[4];
    if (tot > peak->total) peak->total = tot;
    if (cur[3] + cur[4] > peak->transient) peak->transient = cur[3] + cur[4];
    if (*act_count > peak->act_units) peak->act_units = *act_count;
}

static sp_buf mkbuf(int cls, int idx, int mb, int stage)
{
    return (sp_buf){ cls, idx, mb, stage };
}

static const sp_instr blank = { .peer = -1, .task = { -1, -1, -1 }, .stage = -1,
                                .buf = { -1, -1, -1, -1 }, .seq = -1 };

static void push(ctx *c, int actor, const sp_instr *in)
{
    if (ivec_push(&c->prog[actor], in)) c->nomem = 1;
}

static int actor_of(const ctx *c, int stage) { return c->sched->stage_actor[stage]; }

static void message(ctx *c, int from, int to, sp_buf b)
{
    sp_instr s = blank;
    s.op = SP_OP_SEND;
    s.peer = to;
    s.buf = b;
    s.seq = c->nmsg++;
    s.bytes = sp_buf_bytes(c->model, b);
    push(c, from, &s);
    s.op = SP_OP_RECV;
    s.peer = from;
    push(c, to, &s);
}

static void optimizer(ctx *c, int s)
{
    sp_instr o = blank;
    o.op = SP_OP_OPTIMIZER;
    o.stage = s;
    int a = actor_of(c, s);
    push(c, a, &o);
    /* The updated shared parameters go back to every other actor that uses them. */
    for (int j = c->sh_off[s]; j < c->sh_off[s + 1]; j++) {
        const sp_stage_shared *sh = &c->model->shared[c->sh_k[j]];
        if (sh->stages[0] != s) continue;
        for (int b = 0; b < c->p; b++) {
            if (b == a) continue;
            int uses = 0;
            for (int q = 0; q < sh->nstages; q++) uses |= actor_of(c, sh->stages[q]) == b;
            if (uses) message(c, a, b, mkbuf(SP_BUF_SHARED_PARAM, c->sh_k[j], -1, -1));
        }
    }
}

static void combine(ctx *c, int k, int mb)
{
    const sp_stage_shared *sh = &c->model->shared[k];
    int owner = sh->stages[0];
    sp_instr x = blank;
    x.op = SP_OP_COMBINE;
    x.stage = owner;
    x.task.mb = mb;
    x.buf = mkbuf(SP_BUF_SHARED_GRAD, k, -1, owner);
    push(c, actor_of(c, owner), &x);
    if ((mb < 0 || mb == c->m - 1) && --c->opt_cnt[owner] == 0) optimizer(c, owner);
}

/* What happens when task `slot` finishes: its outgoing messages, and whatever it was
 * the last input of. */
static void on_finish(ctx *c, int slot)
{
    const sp_stage_model *model = c->model;
    const sp_tgraph *g = &c->g;
    sp_task t = sp_slot_task(slot, c->S);
    int s = t.stage, i = t.mb, a = actor_of(c, s);
    if (t.kind == SP_TASK_F) {
        for (int j = g->out_off[s]; j < g->out_off[s + 1]; j++) {
            int e = g->out_e[j], b = actor_of(c, model->edge[e].dst_stage);
            if (b != a) message(c, a, b, mkbuf(SP_BUF_EDGE_FWD, e, i, -1));
        }
        return;
    }
    if (t.kind == SP_TASK_B || t.kind == SP_TASK_BW)
        for (int j = g->in_off[s]; j < g->in_off[s + 1]; j++) {
            int e = g->in_e[j], b = actor_of(c, model->edge[e].src_stage);
            if (model->edge[e].needs_grad && b != a)
                message(c, a, b, mkbuf(SP_BUF_EDGE_GRAD, e, i, -1));
        }
    if (t.kind == SP_TASK_B) return;
    for (int j = c->sh_off[s]; j < c->sh_off[s + 1]; j++) {
        int k = c->sh_k[j], owner = model->shared[k].stages[0], oa = actor_of(c, owner);
        if (c->deferred[k]) {
            if (i != c->m - 1) continue;
            if (s != owner && a != oa) message(c, a, oa, mkbuf(SP_BUF_SHARED_GRAD, k, -1, s));
            if (--c->comb_def[k] == 0) combine(c, k, -1);
        } else {
            if (a != oa) message(c, a, oa, mkbuf(SP_BUF_SHARED_GRAD, k, i, s));
            if (--c->comb_mb[k * c->m + i] == 0) combine(c, k, i);
        }
    }
    if (i == c->m - 1 && --c->opt_cnt[s] == 0) optimizer(c, s);
}

/* The dry run: list scheduling in time order, each actor in its schedule's order. */
static sp_status merge(ctx *c)
{
    const sp_schedule *sch = c->sched;
    const sp_tgraph *g = &c->g;
    int p = c->p, S = c->S;
    int *rem = malloc((size_t)g->nslots * sizeof *rem);
    double *ready = calloc((size_t)g->nslots, sizeof *ready);
    double *afree = calloc((size_t)p, sizeof *afree);
    int *head = calloc((size_t)p, sizeof *head);
    char *busy = calloc((size_t)p, 1);
    int *buf = malloc((size_t)g->maxdeg * sizeof *buf);
    heap h = { 0 };
    sp_status st = SP_OK;
    if (!rem || !ready || !afree || !head || !busy || !buf) {
        st = sp_set_error(SP_ERR_NOMEM, "out of memory planning");
        goto out;
    }
    for (int sl = 0; sl < g->nslots; sl++)
        if (g->pos[sl] >= 0) rem[sl] = sp_tgraph_preds(g, sl, buf, NULL);

#define HEAD_SLOT(a) sp_slot(sch->tasks[a][head[a]].kind, sch->tasks[a][head[a]].mb, \
                             sch->tasks[a][head[a]].stage, S)
#define TRY_START(a)                                                                  \
    do {                                                                              \
        if (!busy[a] && head[a] < sch->ntasks[a] && rem[HEAD_SLOT(a)] == 0) {         \
            int hs_ = HEAD_SLOT(a);                                                   \
            double t0_ = ready[hs_] > afree[a] ? ready[hs_] : afree[a];               \
            busy[a] = 1;                                                              \
            if (heap_push(&h, (event){ t0_, 2 * c->evorder++ + 1, a })) c->nomem = 1; \
        }                                                                             \
    } while (0)

    for (int a = 0; a < p; a++) TRY_START(a);
    int done = 0;
    while (h.n && !c->nomem) {
        event e = heap_pop(&h);
        if (e.order & 1) { /* start of the head task of actor e.id */
            int a = e.id, sl = HEAD_SLOT(a);
            sp_task t = sp_slot_task(sl, S);
            sp_instr r = blank;
            r.op = SP_OP_RUN;
            r.task = t;
            r.stage = t.stage;
            push(c, a, &r);
            double t1 = e.t + c->model->stage[t.stage].cost[t.kind];
            if (heap_push(&h, (event){ t1, 2 * c->evorder++, sl })) c->nomem = 1;
        } else { /* finish of task e.id */
            int sl = e.id;
            sp_task t = sp_slot_task(sl, S);
            int a = actor_of(c, t.stage);
            on_finish(c, sl);
            done++;
            busy[a] = 0;
            afree[a] = e.t;
            head[a]++;
            int n = sp_tgraph_succs(g, sl, buf);
            for (int j = 0; j < n; j++) {
                int u = buf[j];
                if (e.t > ready[u]) ready[u] = e.t;
                if (--rem[u] == 0) {
                    int b = actor_of(c, sp_slot_task(u, S).stage);
                    TRY_START(b);
                }
            }
            TRY_START(a);
        }
    }
#undef TRY_START
#undef HEAD_SLOT
    if (c->nomem) st = sp_set_error(SP_ERR_NOMEM, "out of memory planning");
    else if (done != g->ntasks) /* cannot happen after validation; never hang regardless */
        st = sp_set_error(SP_ERR_SCHEDULE, "internal: dry run stopped after %d of %d tasks",
                          done, g->ntasks);
out:
    free(rem), free(ready), free(afree), free(head), free(busy), free(buf), free(h.v);
    return st;
}

/* Accesses of one instruction (RUN, COMBINE, OPTIMIZER; SEND reads and RECV writes its
 * buffer). The buffer rules of plan.h, in one place. */
static int accesses(const ctx *c, const sp_instr *in, sp_access *out)
{
    const sp_stage_model *model = c->model;
    const sp_tgraph *g = &c->g;
    int n = 0;
#define ACC(cls_, idx_, mb_, st_, mode_) \
    (out[n++] = (sp_access){ mkbuf(cls_, idx_, mb_, st_), mode_ })
    switch (in->op) {
    case SP_OP_SEND:
        ACC(in->buf.cls, in->buf.idx, in->buf.mb, in->buf.stage, SP_ACCESS_R);
        return n;
    case SP_OP_RECV:
        ACC(in->buf.cls, in->buf.idx, in->buf.mb, in->buf.stage, SP_ACCESS_W);
        return n;
    case SP_OP_FREE:
        return 0;
    case SP_OP_COMBINE: {
        const sp_stage_shared *sh = &model->shared[in->buf.idx];
        int mb = in->task.mb;
        for (int q = mb < 0 ? 1 : 0; q < sh->nstages; q++)
            ACC(SP_BUF_SHARED_GRAD, in->buf.idx, mb, sh->stages[q], SP_ACCESS_R);
        ACC(SP_BUF_SHARED_GRAD, in->buf.idx, -1, in->stage, SP_ACCESS_RW);
        return n;
    }
    case SP_OP_OPTIMIZER: {
        int s = in->stage;
        ACC(SP_BUF_PARAMS, s, -1, -1, SP_ACCESS_RW);
        ACC(SP_BUF_GRADS, s, -1, -1, SP_ACCESS_RW);
        ACC(SP_BUF_OPT, s, -1, -1, SP_ACCESS_RW);
        for (int j = c->sh_off[s]; j < c->sh_off[s + 1]; j++) {
            int k = c->sh_k[j];
            if (model->shared[k].stages[0] != s) continue;
            ACC(SP_BUF_SHARED_PARAM, k, -1, -1, SP_ACCESS_RW);
            ACC(SP_BUF_SHARED_GRAD, k, -1, s, SP_ACCESS_RW);
        }
        return n;
    }
    default:
        break;
    }
    sp_task t = in->task;
    int s = t.stage, i = t.mb, S = c->S;
    int isf = t.kind == SP_TASK_F, isb = t.kind == SP_TASK_B || t.kind == SP_TASK_BW;
    int isw = t.kind == SP_TASK_W || t.kind == SP_TASK_BW;
    /* recompute: F's activations die with F; the first backward task writes them again
     * (as microbatch i + m, a buffer of its own) from the stage's inputs, which every
     * backward task reads anyway */
    int rec = model->stage[s].recompute;
    if (!isf) ACC(SP_BUF_ACT, s, rec ? i + c->m : i, -1,
                  rec && isb ? SP_ACCESS_W : SP_ACCESS_R);
    if (t.kind == SP_TASK_W) ACC(SP_BUF_BGRAD, s, i, -1, SP_ACCESS_R);
    for (int j = g->in_off[s]; j < g->in_off[s + 1]; j++)
        ACC(SP_BUF_EDGE_FWD, g->in_e[j], i, -1, SP_ACCESS_R); /* B and W read them too */
    if (isb)
        for (int j = g->out_off[s]; j < g->out_off[s + 1]; j++)
            if (model->edge[g->out_e[j]].needs_grad)
                ACC(SP_BUF_EDGE_GRAD, g->out_e[j], i, -1, SP_ACCESS_R);
    if (isf || isb) {
        ACC(SP_BUF_PARAMS, s, -1, -1, SP_ACCESS_R);
        for (int j = c->sh_off[s]; j < c->sh_off[s + 1]; j++)
            ACC(SP_BUF_SHARED_PARAM, c->sh_k[j], -1, -1, SP_ACCESS_R);
    }
    if (isf) {
        ACC(SP_BUF_ACT, s, i, -1, SP_ACCESS_W);
        for (int j = g->out_off[s]; j < g->out_off[s + 1]; j++)
            ACC(SP_BUF_EDGE_FWD, g->out_e[j], i, -1, SP_ACCESS_W);
        if (s == S - 1) ACC(SP_BUF_LOSS, s, i, -1, SP_ACCESS_W);
    }
    /* B keeps its activation gradients for W; BW needs the same space inside the task */
    if (t.kind == SP_TASK_B || t.kind == SP_TASK_BW) ACC(SP_BUF_BGRAD, s, i, -1, SP_ACCESS_W);
    if (isb)
        for (int j = g->in_off[s]; j < g->in_off[s + 1]; j++)
            if (model->edge[g->in_e[j]].needs_grad)
                ACC(SP_BUF_EDGE_GRAD, g->in_e[j], i, -1, SP_ACCESS_W);
    if (isw) {
        ACC(SP_BUF_GRADS, s, -1, -1, SP_ACCESS_RW);
        for (int j = c->sh_off[s]; j < c->sh_off[s + 1]; j++) {
            int k = c->sh_k[j];
            if (c->deferred[k]) ACC(SP_BUF_SHARED_GRAD, k, -1, s, SP_ACCESS_RW);
            else ACC(SP_BUF_SHARED_GRAD, k, i, s, SP_ACCESS_W);
        }
    }
#undef ACC
    return n;
}

/* Buffers that outlive the step on an actor: parameters, accumulators, optimizer state,
 * the loss. A received copy of another stage's accumulator is transient. */
static int persistent_on(const ctx *c, sp_buf b, int actor)
{
    if (b.cls == SP_BUF_SHARED_GRAD && b.mb < 0) return actor_of(c, b.stage) == actor;
    return sp_buf_persistent(b);
}

/* RECVs move later, past compute, up to their first reader; never past another SEND or
 * RECV, so the global message order on the actor is unchanged, and never between a
 * producer and its SENDs. */
static sp_status sink_recvs(ctx *c, sp_access *acc)
{
    int *pend = NULL, npend = 0, cappend = 0;
    for (int a = 0; a < c->p; a++) {
        ivec *x = &c->prog[a];
        ivec out = { malloc((size_t)(x->n ? x->n : 1) * sizeof(sp_instr)), 0, x->n };
        if (!out.v) goto nomem;
        npend = 0;
        for (int j = 0; j < x->n; j++) {
            sp_instr *in = &x->v[j];
            if (in->op == SP_OP_RECV) {
                if (npend == cappend) {
                    cappend = cappend ? 2 * cappend : 64;
                    int *np = realloc(pend, (size_t)cappend * sizeof *np);
                    if (!np) {
                        free(out.v);
                        goto nomem;
                    }
                    pend = np;
                }
                pend[npend++] = j;
                continue;
            }
            int upto = 0;
            /* Nothing sinks between a producer and its SENDs: a SEND stays right after
             * the instruction that made its buffer. */
            if (in->op == SP_OP_SEND || (j + 1 < x->n && x->v[j + 1].op == SP_OP_SEND)) {
                upto = npend;
            } else if (npend) {
                int n = accesses(c, in, acc);
                for (int q = 0; q < n; q++) {
                    if (!(acc[q].mode & SP_ACCESS_R)) continue;
                    uint64_t key = sp_buf_key(acc[q].buf);
                    for (int r = npend - 1; r >= upto; r--)
                        if (sp_buf_key(x->v[pend[r]].buf) == key) {
                            upto = r + 1;
                            break;
                        }
                }
            }
            if (upto) {
                for (int r = 0; r < upto; r++) out.v[out.n++] = x->v[pend[r]];
                memmove(pend, pend + upto, (size_t)(npend - upto) * sizeof *pend);
                npend -= upto;
            }
            out.v[out.n++] = *in;
        }
        for (int r = 0; r < npend; r++) out.v[out.n++] = x->v[pend[r]];
        free(x->v);
        *x = out;
    }
    free(pend);
    return SP_OK;
nomem:
    free(pend);
    return sp_set_error(SP_ERR_NOMEM, "out of memory planning");
}

/* Liveness: a FREE right after each transient buffer's last use on each actor; accesses
 * copied into the plan; memory peaks from the final order. */
static sp_status finish_plan(ctx *c, sp_plan *plan, sp_access *acc)
{
    const sp_stage_model *model = c->model;
    sp_bufset last;
    size_t naccess = 0, capaccess = 1024;
    plan->access = malloc(capaccess * sizeof *plan->access);
    if (!plan->access || sp_bufset_init(&last, 1024)) {
        free(plan->access);
        plan->access = NULL;
        return sp_set_error(SP_ERR_NOMEM, "out of memory planning");
    }
    sp_status st = SP_OK;
    for (int a = 0; a < c->p && st == SP_OK; a++) {
        ivec *x = &c->prog[a];
        last.n = 0;
        memset(last.key, 0, last.cap * sizeof *last.key);
        for (int j = 0; j < x->n; j++) {
            int n = accesses(c, &x->v[j], acc);
            for (int q = 0; q < n; q++)
                if (!persistent_on(c, acc[q].buf, a)
                    && sp_bufset_put(&last, sp_buf_key(acc[q].buf), j)) {
                    st = sp_set_error(SP_ERR_NOMEM, "out of memory planning");
                    goto done;
                }
        }
        /* Count the instructions with the FREEs, then write them. */
        int nfree = (int)last.n;
        sp_instr *v = malloc((size_t)(x->n + nfree + 1) * sizeof *v);
        if (!v) {
            st = sp_set_error(SP_ERR_NOMEM, "out of memory planning");
            goto done;
        }
        sp_mem_peak pk = { 0 };
        size_t cur[5] = { 0 };
        int acts = 0;
        /* Persistent buffers exist from the start: own parameters, gradients, optimizer
         * state, shared parameter copies and per-step accumulators (a forward-only plan:
         * the parameters alone). */
        int fwd = c->g.fwd;
        for (int s = 0; s < c->S; s++) {
            if (actor_of(c, s) != a) continue;
            sp_mem_add(&pk, cur, &acts, mkbuf(SP_BUF_PARAMS, s, -1, -1),
                       model->stage[s].param_bytes, 1);
            if (fwd) continue;
            sp_mem_add(&pk, cur, &acts, mkbuf(SP_BUF_GRADS, s, -1, -1),
                       model->stage[s].param_bytes, 1);
            sp_mem_add(&pk, cur, &acts, mkbuf(SP_BUF_OPT, s, -1, -1), model->stage[s].opt_bytes,
                       1);
        }
        for (int k = 0; k < c->K; k++) {
            const sp_stage_shared *sh = &model->shared[k];
            if (sh->nstages < 2) continue; /* used by one stage: just that stage's parameter */
            int here = 0;
            for (int q = 0; q < sh->nstages; q++) {
                if (actor_of(c, sh->stages[q]) != a) continue;
                here = 1;
                if (!fwd && (c->deferred[k] || q == 0))
                    sp_mem_add(&pk, cur, &acts, mkbuf(SP_BUF_SHARED_GRAD, k, -1, sh->stages[q]),
                               sh->bytes, 1);
            }
            if (here)
                sp_mem_add(&pk, cur, &acts, mkbuf(SP_BUF_SHARED_PARAM, k, -1, -1), sh->bytes, 1);
        }
        int nv = 0;
        for (int j = 0; j < x->n; j++) {
            sp_instr in = x->v[j];
            int n = accesses(c, &in, acc);
            if (in.op == SP_OP_RUN || in.op == SP_OP_COMBINE || in.op == SP_OP_OPTIMIZER) {
                if (naccess + (size_t)n > capaccess) {
                    while (naccess + (size_t)n > capaccess) capaccess *= 2;
                    sp_access *na = realloc(plan->access, capaccess * sizeof *na);
                    if (!na) {
                        free(v);
                        st = sp_set_error(SP_ERR_NOMEM, "out of memory planning");
                        goto done;
                    }
                    plan->access = na;
                }
                in.acc = (uint32_t)naccess;
                in.nacc = (uint32_t)n;
                memcpy(plan->access + naccess, acc, (size_t)n * sizeof *acc);
                naccess += (size_t)n;
            }
            v[nv++] = in;
            /* Allocation: the first write of a transient buffer on this actor. The last
             * table doubles as "is live": value >= 0 last use, and -1 - lastuse once live. */
            for (int q = 0; q < n; q++) {
                if (persistent_on(c, acc[q].buf, a)) continue;
                int64_t *lu = sp_bufset_find(&last, sp_buf_key(acc[q].buf));
                if (*lu >= 0) {
                    *lu = -1 - *lu;
                    sp_mem_add(&pk, cur, &acts, acc[q].buf, sp_buf_bytes(model, acc[q].buf), 1);
                }
            }
            for (int q = 0; q < n; q++) {
                if (persistent_on(c, acc[q].buf, a)) continue;
                uint64_t key = sp_buf_key(acc[q].buf);
                int64_t *lu = sp_bufset_find(&last, key);
                if (lu && -1 - *lu == j) {
                    sp_instr f = blank;
                    f.op = SP_OP_FREE;
                    f.buf = acc[q].buf;
                    f.bytes = sp_buf_bytes(model, f.buf);
                    v[nv++] = f;
                    sp_mem_add(&pk, cur, &acts, f.buf, f.bytes, -1);
                    sp_bufset_del(&last, key);
                }
            }
        }
        free(x->v);
        x->v = v;
        x->n = nv;
        x->cap = x->n + nfree + 1;
        plan->peak[a] = pk;
    }
done:
    sp_bufset_release(&last);
    plan->naccess = naccess;
    return st;
}

void sp_plan_free(sp_plan *plan)
{
    if (!plan) return;
    if (plan->instr)
        for (int a = 0; a < plan->nactors; a++) free(plan->instr[a]);
    free(plan->instr);
    free(plan->ninstr);
    free(plan->stage_actor);
    free(plan->access);
    free(plan->shared_deferred);
    free(plan->peak);
    free(plan);
}

sp_status sp_plan_build(const sp_stage_model *model, const sp_schedule *sched, sp_plan **out)
{
    *out = NULL;
    ctx c = { 0 };
    sp_plan *plan = NULL;
    sp_access *acc = NULL;
    sp_status st = sp_tgraph_build(&c.g, model, sched);
    if (st) return st;
    st = sp_tgraph_acyclic(&c.g, NULL, 0, NULL);
    if (st) {
        sp_tgraph_release(&c.g);
        return st;
    }
    c.model = model;
    c.sched = sched;
    c.p = sched->nactors, c.S = sched->nstages, c.m = sched->nmicro, c.E = model->nedges;
    c.K = model->nshared;
    int S = c.S, m = c.m, K = c.K;

    c.sh_off = calloc((size_t)S + 1, sizeof *c.sh_off);
    c.sh_k = malloc((size_t)(8 * K + 1) * sizeof *c.sh_k);
    c.deferred = calloc((size_t)K + 1, sizeof *c.deferred);
    c.comb_def = calloc((size_t)K + 1, sizeof *c.comb_def);
    c.comb_mb = calloc((size_t)K * m + 1, sizeof *c.comb_mb);
    c.opt_cnt = malloc((size_t)S * sizeof *c.opt_cnt);
    c.prog = calloc((size_t)c.p, sizeof *c.prog);
    plan = calloc(1, sizeof *plan);
    if (!c.sh_off || !c.sh_k || !c.deferred || !c.comb_def || !c.comb_mb || !c.opt_cnt || !c.prog || !plan) {
        st = sp_set_error(SP_ERR_NOMEM, "out of memory planning");
        goto out;
    }
    /* Shared parameters used by one stage only need nothing: no accumulator, no combine. */
    for (int k = 0; k < K; k++)
        if (model->shared[k].nstages >= 2)
            for (int q = 0; q < model->shared[k].nstages; q++)
                c.sh_off[model->shared[k].stages[q] + 1]++;
    for (int s = 0; s < S; s++) c.sh_off[s + 1] += c.sh_off[s];
    {
        int *fill = malloc((size_t)S * sizeof *fill);
        if (!fill) {
            st = sp_set_error(SP_ERR_NOMEM, "out of memory planning");
            goto out;
        }
        memcpy(fill, c.sh_off, (size_t)S * sizeof *fill);
        for (int k = 0; k < K; k++)
            if (model->shared[k].nstages >= 2)
                for (int q = 0; q < model->shared[k].nstages; q++)
                    c.sh_k[fill[model->shared[k].stages[q]]++] = k;
        free(fill);
    }
    for (int s = 0; s < S; s++) c.opt_cnt[s] = 1;
    for (int k = 0; k < K; k++) {
        const sp_stage_shared *sh = &model->shared[k];
        c.deferred[k] = sh->single_use != 0;
        if (sh->nstages < 2) continue;
        c.opt_cnt[sh->stages[0]]++;
        if (c.deferred[k]) c.comb_def[k] = sh->nstages;
        else
            for (int i = 0; i < m; i++) c.comb_mb[k * m + i] = sh->nstages;
    }
    st = merge(&c);
    if (st) goto out;

    {
        int maxdeg = c.g.maxdeg, maxsh = 0;
        for (int s = 0; s < S; s++)
            if (c.sh_off[s + 1] - c.sh_off[s] > maxsh) maxsh = c.sh_off[s + 1] - c.sh_off[s];
        acc = malloc((size_t)(2 * maxdeg + 3 * maxsh + 16) * sizeof *acc);
        if (!acc) {
            st = sp_set_error(SP_ERR_NOMEM, "out of memory planning");
            goto out;
        }
    }
    st = sink_recvs(&c, acc);
    if (st) goto out;

    plan->nactors = c.p, plan->nstages = S, plan->nmicro = m;
    plan->nshared = K;
    plan->nmessages = c.nmsg;
    plan->ntasks = c.g.ntasks;
    plan->stage_actor = malloc((size_t)S * sizeof *plan->stage_actor);
    plan->ninstr = calloc((size_t)c.p, sizeof *plan->ninstr);
    plan->instr = calloc((size_t)c.p, sizeof *plan->instr);
    plan->shared_deferred = calloc((size_t)K + 1, sizeof *plan->shared_deferred);
    plan->peak = calloc((size_t)c.p, sizeof *plan->peak);
    if (!plan->stage_actor || !plan->ninstr || !plan->instr || !plan->shared_deferred
        || !plan->peak) {
        st = sp_set_error(SP_ERR_NOMEM, "out of memory planning");
        goto out;
    }
    memcpy(plan->stage_actor, sched->stage_actor, (size_t)S * sizeof *plan->stage_actor);
    memcpy(plan->shared_deferred, c.deferred, (size_t)K * sizeof *c.deferred);
    st = finish_plan(&c, plan, acc);
    if (st) goto out;
    for (int a = 0; a < c.p; a++) {
        plan->instr[a] = c.prog[a].v;
        plan->ninstr[a] = c.prog[a].n;
        c.prog[a].v = NULL;
    }
    *out = plan;
    plan = NULL;
out:
    if (c.prog)
        for (int a = 0; a < c.p; a++) free(c.prog[a].v);
    free(c.prog), free(c.sh_off), free(c.sh_k), free(c.deferred), free(c.comb_def);
    free(c.comb_mb);
    free(c.opt_cnt), free(acc);
    sp_tgraph_release(&c.g);
    sp_plan_free(plan);
    return st;
}
