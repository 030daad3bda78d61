/* The runtime's buffer pool, packed ahead of the step (plan.h, sp_pool_pack). A pool that
 * decides at each take cannot know what comes next; knowing every lifetime, four classic
 * packings run and the smallest wins. All are O(n^2) in the buffers of a step (a few
 * thousand at most). */
#include <stdlib.h>
#include <string.h>

#include "starpipe/plan.h"
#include "sched/sched_impl.h"

typedef struct {
    sp_pool_slot *slot;
    int n;
} packing;

static int new_slot(packing *k, size_t size, int fixed)
{
    sp_pool_slot *s = realloc(k->slot, (size_t)(k->n + 1) * sizeof *s);
    if (!s) return -1;
    k->slot = s;
    s[k->n] = (sp_pool_slot){ size, fixed };
    return k->n++;
}

/* May buffer x take slot s, and by how much must s grow; -1: no. */
static int64_t fit(const packing *k, int s, const sp_lifetime *x)
{
    size_t f = k->slot[s].size;
    if (x->exact) return f == x->size ? 0 : -1;
    if (f >= x->size) return 0;
    return k->slot[s].fixed ? -1 : (int64_t)(x->size - f);
}

/* Largest first (equal sizes in the order taken), each into a slot that is big enough
 * and idle over its lifetime: the first (first-fit decreasing) or the smallest (best-fit
 * decreasing). Grouped (best_fit = 2): first fit, where a size within 1/8 of a larger
 * one that is not exact counts as that one, and a new slot takes the larger size: such
 * buffers go in the order taken, as few slots as are alive at once (two stages'
 * activations of nearly one size, interleaved-1F1B's, would else each have slots of
 * their own: 6 where 5 are alive at once). */
static const sp_lifetime *sort_base;
static const size_t *sort_head;
static int by_size(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    const sp_lifetime *x = &sort_base[i], *y = &sort_base[j];
    size_t hx = sort_head ? sort_head[i] : x->size, hy = sort_head ? sort_head[j] : y->size;
    if (hx != hy) return hx < hy ? 1 : -1;
    return x->from < y->from ? -1 : x->from > y->from;
}

static int decreasing(packing *k, const sp_lifetime *x, int n, int best_fit, int *slot_of)
{
    int *order = malloc(sizeof(int) * (size_t)(n + 1)), ok = order != NULL;
    size_t *head = best_fit == 2 ? malloc(sizeof(size_t) * (size_t)(n + 1)) : NULL;
    unsigned char *busy = NULL;
    ok = ok && (best_fit != 2 || head);
    for (int i = 0; ok && i < n; i++) order[i] = i;
    sort_base = x;
    sort_head = NULL;
    if (ok) qsort(order, (size_t)n, sizeof *order, by_size);
    if (ok && head) { /* each size's group: the largest inexact size within 1/8 above it */
        size_t h = 0;
        for (int j = 0; j < n; j++) {
            const sp_lifetime *b = &x[order[j]];
            if (!b->exact && (h == 0 || 8 * b->size < 7 * h)) h = b->size;
            head[order[j]] = b->exact ? b->size : h;
        }
        sort_head = head;
        qsort(order, (size_t)n, sizeof *order, by_size);
        sort_head = NULL;
        best_fit = 0;
    }
    for (int j = 0; ok && j < n; j++) {
        const sp_lifetime *b = &x[order[j]];
        unsigned char *nb = realloc(busy, (size_t)k->n + 1);
        if (!(ok = nb != NULL)) break;
        busy = nb;
        memset(busy, 0, (size_t)k->n + 1);
        for (int i = 0; i < j; i++) { /* the slots of the larger ones alive meanwhile */
            const sp_lifetime *y = &x[order[i]];
            if (y->from < b->to && b->from < y->to) busy[slot_of[order[i]]] = 1;
        }
        int s = -1;
        for (int c = 0; c < k->n && (s < 0 || best_fit); c++)
            if (!busy[c] && fit(k, c, b) == 0 && (s < 0 || k->slot[c].size < k->slot[s].size))
                s = c;
        if (s < 0) ok = (s = new_slot(k, head ? head[order[j]] : b->size, b->exact)) >= 0;
        slot_of[order[j]] = s;
    }
    free(order), free(busy), free(head);
    return ok;
}

/* In the order taken, each into the idle slot it fits best: the smallest big enough,
 * else the one that grows least; a new slot only when none is idle. */
static int linear_scan(packing *k, const sp_lifetime *x, int n, int *slot_of)
{
    int *order = malloc(sizeof(int) * (size_t)(n + 1)), ok = order != NULL;
    unsigned char *idle = malloc((size_t)k->n + 1);
    ok = ok && idle;
    if (idle) memset(idle, 1, (size_t)k->n + 1);
    for (int i = 0; ok && i < n; i++) order[i] = i;
    for (int j = 1; ok && j < n; j++) /* by take, stable (insertion: mostly sorted) */
        for (int i = j; i > 0 && x[order[i - 1]].from > x[order[i]].from; i--) {
            int t = order[i];
            order[i] = order[i - 1], order[i - 1] = t;
        }
    for (int j = 0; ok && j < n; j++) {
        const sp_lifetime *b = &x[order[j]];
        for (int i = 0; i < j; i++) /* given back by now */
            if (x[order[i]].to <= b->from) idle[slot_of[order[i]]] = 1;
        for (int i = 0; i < j; i++) /* still alive */
            if (x[order[i]].to > b->from) idle[slot_of[order[i]]] = 0;
        int best = -1;
        int64_t best_grow = 0;
        for (int s = 0; s < k->n; s++) {
            int64_t g = idle[s] ? fit(k, s, b) : -1;
            if (g >= 0 && (best < 0 || g < best_grow ||
                           (g == best_grow && k->slot[s].size < k->slot[best].size)))
                best = s, best_grow = g;
        }
        if (best < 0) {
            unsigned char *ni = realloc(idle, (size_t)k->n + 2);
            if (!(ok = ni != NULL)) break;
            idle = ni;
            if (!(ok = (best = new_slot(k, b->size, b->exact)) >= 0)) break;
        }
        if (k->slot[best].size < b->size) k->slot[best].size = b->size;
        k->slot[best].fixed |= b->exact;
        idle[best] = 0;
        slot_of[order[j]] = best;
    }
    free(order), free(idle);
    return ok;
}

static size_t total(const packing *k)
{
    size_t f = 0;
    for (int s = 0; s < k->n; s++) f += k->slot[s].size;
    return f;
}

sp_status sp_pool_pack(const sp_lifetime *x, int n, sp_pool_slot **slots, int *nslots,
                       int *slot_of)
{
    if (n < 0 || (n > 0 && (!x || !slot_of)) || !slots || !nslots)
        return sp_set_error(SP_ERR_ARG, "sp_pool_pack: bad arguments");
    enum { NPACK = 4 };
    packing k[NPACK] = { { NULL, 0 } };
    int *of[NPACK], ok = 1, best = 0;
    for (int j = 0; j < NPACK; j++) ok &= (of[j] = malloc(sizeof(int) * (size_t)(n + 1))) != NULL;
    for (int j = 0; j < NPACK && ok; j++) {
        for (int s = 0; s < *nslots && ok; s++) /* another walk's: at their sizes */
            ok = new_slot(&k[j], (*slots)[s].size, 1) >= 0;
        ok = ok && (j == 2 ? linear_scan(&k[j], x, n, of[j])
                           : decreasing(&k[j], x, n, j == 3 ? 2 : j, of[j]));
        if (ok && total(&k[j]) < total(&k[best])) best = j;
    }
    if (ok) {
        for (int s = 0; s < *nslots; s++) k[best].slot[s].fixed = (*slots)[s].fixed;
        free(*slots);
        *slots = k[best].slot;
        *nslots = k[best].n;
        k[best].slot = NULL;
        memcpy(slot_of, of[best], sizeof(int) * (size_t)n);
    }
    for (int j = 0; j < NPACK; j++) free(k[j].slot), free(of[j]);
    return ok ? SP_OK : sp_set_error(SP_ERR_NOMEM, "sp_pool_pack: out of memory");
}

/* The pool the runtime will register for the plan's actor: the plan's own lifetimes of
 * per-microbatch buffers (activations, their gradients, boundary tensors; taken at the
 * first instruction that touches one, given at its FREE), packed as above. */
sp_status sp_plan_pool_map(const sp_plan *plan, const sp_stage_model *model, int actor,
                           sp_pool_slot **slots, int *nslots, int **at)
{
    *slots = NULL, *nslots = 0, *at = NULL;
    if (!plan || !model || actor < 0 || actor >= plan->nactors)
        return sp_set_error(SP_ERR_ARG, "sp_plan_pool_bytes: bad arguments");
    int cap = 64, n = 0, nlive = 0, nacc = 0, k = 0;
    for (int j = 0; j < plan->ninstr[actor]; j++) nacc += sp_instr_naccess(&plan->instr[actor][j]);
    sp_lifetime *x = malloc(sizeof *x * (size_t)cap);
    struct live { uint64_t key; int at; } *live = malloc(sizeof *live * (size_t)cap);
    int *take = malloc(sizeof *take * (size_t)(nacc + 1));
    sp_status st = x && live && take
                       ? SP_OK : sp_set_error(SP_ERR_NOMEM, "sp_plan_pool_bytes: out of memory");
    int64_t clock = 0;
    for (int j = 0; j < plan->ninstr[actor] && st == SP_OK; j++) {
        const sp_instr *in = &plan->instr[actor][j];
        for (int q = 0; q < sp_instr_naccess(in) && st == SP_OK; q++) {
            sp_buf b = sp_instr_buf(plan, in, q);
            take[k++] = -1;
            if (b.cls != SP_BUF_ACT && b.cls != SP_BUF_BGRAD && b.cls != SP_BUF_EDGE_FWD &&
                b.cls != SP_BUF_EDGE_GRAD)
                continue;
            uint64_t key = sp_buf_key(b);
            int l = 0;
            while (l < nlive && live[l].key != key) l++;
            if (in->op == SP_OP_FREE) { /* given back */
                if (l < nlive) x[live[l].at].to = clock++, live[l] = live[--nlive];
                continue;
            }
            if (l < nlive) { /* alive already */
                take[k - 1] = live[l].at;
                continue;
            }
            if (n == cap) {
                cap *= 2;
                sp_lifetime *nx = realloc(x, sizeof *x * (size_t)cap);
                struct live *nl = nx ? realloc(live, sizeof *live * (size_t)cap) : NULL;
                if (nx) x = nx;
                if (nl) live = nl;
                if (!nx || !nl) {
                    st = sp_set_error(SP_ERR_NOMEM, "sp_plan_pool_bytes: out of memory");
                    break;
                }
            }
            x[n] = (sp_lifetime){ sp_buf_bytes(model, b),
                                  b.cls == SP_BUF_EDGE_FWD || b.cls == SP_BUF_EDGE_GRAD, clock++,
                                  -1 };
            take[k - 1] = n;
            live[nlive++] = (struct live){ key, n++ };
        }
    }
    for (int i = 0; i < n; i++)
        if (x[i].to < 0) x[i].to = clock; /* alive to the end */
    int *of = malloc(sizeof(int) * (size_t)(n + 1));
    if (st == SP_OK && !of) st = sp_set_error(SP_ERR_NOMEM, "sp_plan_pool_bytes: out of memory");
    if (st == SP_OK) st = sp_pool_pack(x, n, slots, nslots, of);
    for (int i = 0; st == SP_OK && i < k; i++)
        if (take[i] >= 0) take[i] = of[take[i]];
    free(x), free(live), free(of);
    if (st) {
        free(take), free(*slots);
        *slots = NULL, *nslots = 0;
    } else {
        *at = take;
    }
    return st;
}

sp_status sp_plan_pool_bytes(const sp_plan *plan, const sp_stage_model *model, int actor,
                             size_t *bytes)
{
    if (!bytes) return sp_set_error(SP_ERR_ARG, "sp_plan_pool_bytes: bad arguments");
    sp_pool_slot *slots;
    int nslots, *at;
    sp_status st = sp_plan_pool_map(plan, model, actor, &slots, &nslots, &at);
    *bytes = 0;
    for (int s = 0; st == SP_OK && s < nslots; s++) *bytes += slots[s].size;
    free(slots), free(at);
    return st;
}
