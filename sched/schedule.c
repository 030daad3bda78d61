/* Schedules as data: the C API that builds them and the built-in schedules (each written
 * after its published definition). Choosing one by name is select.c's. */
#include "sched/sched_impl.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A step of more (microbatch, stage) pairs is no pipeline anyone runs, and a header of a
 * few bytes must not make the parser allocate gigabytes. */
#define SP_MAX_SLOTS (1 << 22)

sp_schedule *sp_schedule_create(int nactors, int nstages, int nmicro)
{
    if (nactors < 1 || nstages < 1 || nmicro < 1 || nactors > SP_MAX_INDEX
        || nstages > SP_MAX_INDEX || nmicro > SP_MAX_INDEX
        || (int64_t)nstages * nmicro > SP_MAX_SLOTS) {
        sp_set_error(SP_ERR_ARG, "schedule sizes out of range: actors=%d stages=%d "
                     "microbatches=%d (stages x microbatches at most %d)", nactors, nstages,
                     nmicro, SP_MAX_SLOTS);
        return NULL;
    }
    sp_schedule *s = calloc(1, sizeof *s);
    if (!s) goto nomem;
    s->nactors = nactors;
    s->nstages = nstages;
    s->nmicro = nmicro;
    s->stage_actor = malloc((size_t)nstages * sizeof *s->stage_actor);
    s->ntasks = calloc((size_t)nactors, sizeof *s->ntasks);
    s->cap = calloc((size_t)nactors, sizeof *s->cap);
    s->tasks = calloc((size_t)nactors, sizeof *s->tasks);
    if (!s->stage_actor || !s->ntasks || !s->cap || !s->tasks) goto nomem;
    for (int st = 0; st < nstages; st++) s->stage_actor[st] = st % nactors;
    return s;
nomem:
    sp_schedule_free(s);
    sp_set_error(SP_ERR_NOMEM, "out of memory creating a schedule");
    return NULL;
}

void sp_schedule_free(sp_schedule *s)
{
    if (!s) return;
    if (s->tasks)
        for (int a = 0; a < s->nactors; a++) free(s->tasks[a]);
    free(s->tasks);
    free(s->ntasks);
    free(s->cap);
    free(s->stage_actor);
    free(s);
}

sp_schedule *sp_schedule_clone(const sp_schedule *src)
{
    sp_schedule *s = sp_schedule_create(src->nactors, src->nstages, src->nmicro);
    if (!s) return NULL;
    memcpy(s->name, src->name, sizeof s->name);
    s->forward_only = src->forward_only;
    memcpy(s->stage_actor, src->stage_actor, (size_t)src->nstages * sizeof *s->stage_actor);
    for (int a = 0; a < src->nactors; a++) {
        int n = src->ntasks[a];
        if (!n) continue;
        s->tasks[a] = malloc((size_t)n * sizeof(sp_task));
        if (!s->tasks[a]) {
            sp_schedule_free(s);
            sp_set_error(SP_ERR_NOMEM, "out of memory cloning a schedule");
            return NULL;
        }
        memcpy(s->tasks[a], src->tasks[a], (size_t)n * sizeof(sp_task));
        s->ntasks[a] = s->cap[a] = n;
    }
    return s;
}

sp_status sp_schedule_forward(const sp_schedule *like, int nmicro, sp_schedule **out)
{
    *out = NULL;
    if (!like) return sp_set_error(SP_ERR_ARG, "sp_schedule_forward: no schedule");
    sp_schedule *s = sp_schedule_create(like->nactors, like->nstages, nmicro);
    if (!s) return sp_error_context(SP_ERR_ARG, "evaluation");
    snprintf(s->name, sizeof s->name, "forward");
    s->forward_only = 1;
    memcpy(s->stage_actor, like->stage_actor, (size_t)like->nstages * sizeof *s->stage_actor);
    sp_status st = SP_OK;
    for (int stage = 0; stage < s->nstages && st == SP_OK; stage++)
        for (int i = 0; i < nmicro && st == SP_OK; i++)
            st = sp_schedule_append(s, s->stage_actor[stage], SP_TASK_F, i, stage);
    if (st) {
        sp_schedule_free(s);
        return st;
    }
    *out = s;
    return SP_OK;
}

sp_status sp_schedule_place(sp_schedule *s, int stage, int actor)
{
    if (stage < 0 || stage >= s->nstages || actor < 0 || actor >= s->nactors)
        return sp_set_error(SP_ERR_ARG, "cannot place stage %d on actor %d (%d stages, "
                            "%d actors)", stage, actor, s->nstages, s->nactors);
    s->stage_actor[stage] = actor;
    return SP_OK;
}

sp_status sp_schedule_append(sp_schedule *s, int actor, sp_task_kind kind, int mb, int stage)
{
    if (actor < 0 || actor >= s->nactors)
        return sp_set_error(SP_ERR_ARG, "actor %d out of range 0..%d", actor, s->nactors - 1);
    if ((int)kind < 0 || (int)kind >= SP_NUM_TASK_KINDS)
        return sp_set_error(SP_ERR_ARG, "task kind %d out of range", (int)kind);
    if (mb < 0 || mb >= s->nmicro)
        return sp_set_error(SP_ERR_ARG, "microbatch %d out of range 0..%d", mb, s->nmicro - 1);
    if (stage < 0 || stage >= s->nstages)
        return sp_set_error(SP_ERR_ARG, "stage %d out of range 0..%d", stage, s->nstages - 1);
    if (s->ntasks[actor] == s->cap[actor]) {
        int cap = s->cap[actor] ? 2 * s->cap[actor] : 64;
        sp_task *t = realloc(s->tasks[actor], (size_t)cap * sizeof *t);
        if (!t) return sp_set_error(SP_ERR_NOMEM, "out of memory growing a schedule");
        s->tasks[actor] = t;
        s->cap[actor] = cap;
    }
    s->tasks[actor][s->ntasks[actor]++] = (sp_task){ (int)kind, mb, stage };
    return SP_OK;
}

int sp_schedule_total_tasks(const sp_schedule *s)
{
    int n = 0;
    for (int a = 0; a < s->nactors; a++) n += s->ntasks[a];
    return n;
}

char *sp_task_format(sp_task t, char *buf, size_t n)
{
    snprintf(buf, n, "%s(%d,%d)", sp_task_kind_name((sp_task_kind)t.kind), t.mb, t.stage);
    return buf;
}

/* A fused backward that sends its input gradient to another actor. */
static int sends_back(const sp_schedule *s, sp_task t, int actor)
{
    return t.kind == SP_TASK_BW && t.stage > 0 && s->stage_actor[t.stage - 1] != actor;
}

sp_status sp_schedule_split_backward(sp_schedule *s)
{
    for (int a = 0; a < s->nactors; a++) {
        int extra = 0;
        for (int j = 0; j < s->ntasks[a]; j++)
            extra += sends_back(s, s->tasks[a][j], a);
        if (!extra) continue;
        const int n = s->ntasks[a] + extra;
        sp_task *v = malloc((size_t)n * sizeof *v);
        if (!v) return sp_set_error(SP_ERR_NOMEM, "out of memory splitting backwards");
        int k = 0;
        for (int j = 0; j < s->ntasks[a]; j++) {
            const sp_task t = s->tasks[a][j];
            if (sends_back(s, t, a)) {
                v[k++] = (sp_task){ SP_TASK_B, t.mb, t.stage };
                v[k++] = (sp_task){ SP_TASK_W, t.mb, t.stage };
            } else
                v[k++] = t;
        }
        free(s->tasks[a]);
        s->tasks[a] = v;
        s->ntasks[a] = s->cap[a] = n;
    }
    const size_t len = strlen(s->name);
    if (len + 7 <= sizeof s->name && (len < 6 || strcmp(s->name + len - 6, "+split")))
        memcpy(s->name + len, "+split", 7);
    return SP_OK;
}

/* ------------------------------------------------------------------ built-ins */

/* Each generator appends the tasks of one actor; `st` carries the first error. */
typedef struct {
    sp_schedule *s;
    sp_status st;
} gen;

static void put(gen *g, int actor, sp_task_kind k, int mb, int stage)
{
    if (g->st == SP_OK) g->st = sp_schedule_append(g->s, actor, k, mb, stage);
}

static int imin(int a, int b) { return a < b ? a : b; }

/* GPipe (Huang et al. 2019): all forwards, then all backwards. Backwards run in
 * microbatch order because gradients accumulate in that order (bitwise reproducibility). */
static void gen_gpipe(gen *g, int p, int m, int v)
{
    for (int s = 0; s < p; s++) {
        for (int i = 0; i < m; i++) put(g, s, SP_TASK_F, i, s);
        for (int i = 0; i < m; i++) put(g, s, SP_TASK_BW, i, s);
    }
}

/* 1F1B / PipeDream-Flush (Narayanan et al. 2021): p-s-1 warm-up forwards, then one
 * forward one backward, then the remaining backwards. */
static void gen_1f1b(gen *g, int p, int m, int v)
{
    for (int s = 0; s < p; s++) {
        int w = imin(p - s - 1, m), f = 0, b = 0;
        while (f < w) put(g, s, SP_TASK_F, f++, s);
        while (f < m) {
            put(g, s, SP_TASK_F, f++, s);
            put(g, s, SP_TASK_BW, b++, s);
        }
        while (b < m) put(g, s, SP_TASK_BW, b++, s);
    }
}

/* Eager 1F1B (JaxPP's Eager1F1B): 2(p-s)-1 warm-up forwards so that sends of forward
 * activations overlap compute, then one backward one forward. */
static void gen_eager_1f1b(gen *g, int p, int m, int v)
{
    for (int s = 0; s < p; s++) {
        int w = imin(2 * (p - s) - 1, m), f = 0, b = 0;
        while (f < w) put(g, s, SP_TASK_F, f++, s);
        while (f < m) {
            put(g, s, SP_TASK_BW, b++, s);
            put(g, s, SP_TASK_F, f++, s);
        }
        while (b < m) put(g, s, SP_TASK_BW, b++, s);
    }
}

/* Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM's
 * forward_backward_pipelining_with_interleaving): v chunks per actor, chunk c of actor r
 * is stage c p + r. Forward k of actor r runs chunk (k mod pv) / p on microbatch
 * (k / pv) p + k mod p; backwards walk the chunks in reverse. Warm-up
 * (p - r - 1) 2 + (v - 1) p forwards. */
static void gen_interleaved(gen *g, int p, int m, int v)
{
    int total = m * v, pv = p * v;
    for (int r = 0; r < p; r++) {
        int warm = imin((p - r - 1) * 2 + (v - 1) * p, total);
        int rest = total - warm;
#define IMB(k) (((k) / pv) * p + (k) % p)
#define FSTAGE(k) ((((k) % pv) / p) * p + r)
#define BSTAGE(k) ((v - 1 - ((k) % pv) / p) * p + r)
        for (int k = 0; k < warm; k++) put(g, r, SP_TASK_F, IMB(k), FSTAGE(k));
        for (int k = 0; k < rest; k++) {
            int kf = k + warm;
            put(g, r, SP_TASK_F, IMB(kf), FSTAGE(kf));
            put(g, r, SP_TASK_BW, IMB(k), BSTAGE(k));
        }
        for (int k = rest; k < total; k++) put(g, r, SP_TASK_BW, IMB(k), BSTAGE(k));
#undef IMB
#undef FSTAGE
#undef BSTAGE
    }
}

/* ZB-H1 (Qi et al. 2024), as the authors' DeepSpeed ZeroBubbleH1Pipeline with exact
 * semantics: stage s runs p-s-1 forwards, then s times F B (its W deferred), then
 * F B W until the forwards are done, then B W, then the s deferred W. W always takes the
 * oldest pending microbatch, which keeps the accumulation order. Stage 0 has nothing to
 * defer and runs fused BW. */
static void gen_zb_h1(gen *g, int p, int m, int v)
{
    for (int s = 0; s < p; s++) {
        int f = 0, b = 0, w = 0;
        for (int k = 0; k < p - s - 1 && f < m; k++) put(g, s, SP_TASK_F, f++, s);
        for (int k = 0; k < s && f < m; k++) {
            put(g, s, SP_TASK_F, f++, s);
            put(g, s, SP_TASK_B, b++, s);
        }
        while (f < m || b < m) {
            if (f < m) put(g, s, SP_TASK_F, f++, s);
            if (s == 0) {
                put(g, s, SP_TASK_BW, b++, s);
                w++;
            } else {
                put(g, s, SP_TASK_B, b++, s);
                put(g, s, SP_TASK_W, w++, s);
            }
        }
        while (w < m) put(g, s, SP_TASK_W, w++, s);
    }
}

/* A task buffer for generators whose published form produces microbatches that are then
 * filtered (ZB-V pads m up to 2p-1). */
static void put_lt(gen *g, int m, int actor, sp_task_kind k, int mb, int stage)
{
    if (mb < m) put(g, actor, k, mb, stage);
}

/* ZB-V (Qi et al. 2024, section 6), as torch.distributed.pipelining's
 * ScheduleZBVZeroBubble: V placement, chunk 0 of actor r is stage r, chunk 1 is stage
 * 2p-1-r; built for max(m, 2p-1) microbatches and the extra ones dropped. */
static void gen_zb_v(gen *g, int p, int m, int v)
{
    int n = m > 2 * p - 1 ? m : 2 * p - 1, S = 2 * p;
    for (int r = 0; r < p; r++) {
        int c0 = r, c1 = S - 1 - r, f0 = 0, f1 = 0, b0 = 0, b1 = 0;
        for (int k = 0; k < 2 * (p - r) - 1; k++) put_lt(g, m, r, SP_TASK_F, f0++, c0);
        for (int k = 0; k < r; k++) {
            put_lt(g, m, r, SP_TASK_F, f1++, c1);
            put_lt(g, m, r, SP_TASK_F, f0++, c0);
        }
        for (int k = 0; k < p - r; k++) {
            put_lt(g, m, r, SP_TASK_F, f1++, c1);
            put_lt(g, m, r, SP_TASK_B, b1, c1);
            put_lt(g, m, r, SP_TASK_W, b1++, c1);
        }
        while (f1 < f0 || f0 < n) {
            if (f0 < n) put_lt(g, m, r, SP_TASK_F, f0++, c0);
            put_lt(g, m, r, SP_TASK_B, b0, c0);
            put_lt(g, m, r, SP_TASK_W, b0++, c0);
            put_lt(g, m, r, SP_TASK_F, f1++, c1);
            put_lt(g, m, r, SP_TASK_B, b1, c1);
            put_lt(g, m, r, SP_TASK_W, b1++, c1);
        }
        int w0 = b0, w1 = b1;
        for (int k = 0; k < r; k++) {
            put_lt(g, m, r, SP_TASK_B, b0++, c0);
            put_lt(g, m, r, SP_TASK_B, b1++, c1);
        }
        for (int k = 0; k < p - r; k++) {
            put_lt(g, m, r, SP_TASK_B, b0++, c0);
            put_lt(g, m, r, SP_TASK_W, w0++, c0);
        }
        while (w1 < b1) put_lt(g, m, r, SP_TASK_W, w1++, c1);
        while (w0 < b0) put_lt(g, m, r, SP_TASK_W, w0++, c0);
    }
}

/* DualPipeV (DeepSeek's DualPipe repository, dualpipev.py; the "cut-in-half" DualPipe of
 * the DeepSeek-V3 report). Phase 0 of actor r is stage r, phase 1 is stage 2p-1-r.
 * Backwards with zero bubble enabled run B and queue W (FIFO over both phases); the
 * others run fused BW. An overlapped F&B pair is written F then BW. */
typedef struct {
    gen *g;
    int r, stage[2], f[2], b[2];
    int (*wq)[2]; /* pending W as (stage, mb), FIFO; at most 2m are ever queued */
    int wh, wt;
} dpv;

static void dpv_f(dpv *d, int ph) { put(d->g, d->r, SP_TASK_F, d->f[ph]++, d->stage[ph]); }
static void dpv_b(dpv *d, int ph, int zb)
{
    if (zb) {
        put(d->g, d->r, SP_TASK_B, d->b[ph], d->stage[ph]);
        d->wq[d->wt][0] = d->stage[ph];
        d->wq[d->wt][1] = d->b[ph];
        d->wt++;
    } else {
        put(d->g, d->r, SP_TASK_BW, d->b[ph], d->stage[ph]);
    }
    d->b[ph]++;
}
static void dpv_w(dpv *d)
{
    if (d->wh == d->wt) return;
    int *e = d->wq[d->wh++];
    put(d->g, d->r, SP_TASK_W, e[1], e[0]);
}

static void gen_dualpipe_v(gen *g, int p, int m, int v)
{
    dpv dd, *d = &dd;
    int (*wq)[2] = malloc((size_t)(2 * m + 1) * sizeof *wq);
    if (!wq) {
        g->st = sp_set_error(SP_ERR_NOMEM, "out of memory building dualpipe-v");
        return;
    }
    for (int r = 0; r < p; r++) {
        memset(d, 0, sizeof *d);
        d->wq = wq;
        d->g = g;
        d->r = r;
        d->stage[0] = r;
        d->stage[1] = 2 * p - 1 - r;
        for (int k = 0; k < (p - r - 1) * 2; k++) dpv_f(d, 0);          /* step 1: nF0 */
        for (int k = 0; k < r + 1; k++) { dpv_f(d, 0); dpv_f(d, 1); }   /* step 2: nF0F1 */
        for (int k = 0; k < p - r - 1; k++) {                          /* step 3: nB1W1F1 */
            dpv_b(d, 1, 1);
            dpv_w(d);
            dpv_f(d, 1);
        }
        for (int k = 0; k < m - 2 * p + r + 1; k++) {                  /* step 4: nF0B1F1B0 */
            dpv_f(d, 0);
            dpv_b(d, 1, 0);
            dpv_f(d, 1);
            dpv_b(d, 0, 0);
        }
        for (int k = 0; k < p - r - 1; k++) {                          /* step 5: nB1F1B0 */
            dpv_b(d, 1, 0);
            dpv_f(d, 1);
            dpv_b(d, 0, 0);
        }
        int zb = 0;                                                    /* step 6: nB1B0 */
        for (int k = 0; k < r + 1; k++) {
            if (k == (r + 1) / 2 && r % 2 == 1) zb = 1;
            dpv_b(d, 1, zb);
            if (k == (r + 1) / 2 && r % 2 == 0) zb = 1;
            dpv_b(d, 0, zb);
        }
        for (int k = 0; k < p - r - 1; k++) {                          /* step 7: nWB0 */
            dpv_w(d);
            dpv_b(d, 0, 1);
        }
        for (int k = 0; k < r + 1; k++) dpv_w(d);                      /* step 8: nW */
    }
    free(wq);
}

typedef enum { PLACE_PLAIN, PLACE_INTERLEAVED, PLACE_V } placement;

typedef struct {
    sp_schedule_info info;
    placement place;
    void (*gen)(gen *, int p, int m, int v);
} builtin;

static const builtin builtins[] = {
    { { "gpipe", "GPipe: all forwards, then all backwards (Huang et al. 2019)", "m >= 1" },
      PLACE_PLAIN, gen_gpipe },
    { { "1f1b", "1F1B / PipeDream-Flush: p-s-1 warm-up forwards, then 1F1B (Narayanan "
        "et al. 2021)", "m >= 1" }, PLACE_PLAIN, gen_1f1b },
    { { "eager-1f1b", "1F1B with 2(p-s)-1 warm-up forwards, sends overlap compute (JaxPP)",
        "m >= 1" }, PLACE_PLAIN, gen_eager_1f1b },
    { { "interleaved-1f1b", "Megatron-LM interleaved 1F1B: v chunks per actor, stage s on "
        "actor s mod p", "v >= 2, m >= p, m a multiple of p" },
      PLACE_INTERLEAVED, gen_interleaved },
    { { "zb-h1", "Zero Bubble H1: B/W split, W deferred into the cool-down (Qi et al. "
        "2024)", "m >= 1" }, PLACE_PLAIN, gen_zb_h1 },
    { { "zb-v", "Zero Bubble V: V placement, 2 chunks per actor, B/W split (Qi et al. "
        "2024)", "v = 2, m >= 1" }, PLACE_V, gen_zb_v },
    { { "dualpipe-v", "DualPipeV: V placement, bidirectional F&B pairs (DeepSeek 2024)",
        "v = 2, m >= 2p" }, PLACE_V, gen_dualpipe_v },
};
#define NBUILTINS ((int)(sizeof builtins / sizeof builtins[0]))

int sp_schedule_builtin_count(void) { return NBUILTINS; }

const sp_schedule_info *sp_schedule_builtin_info(int i)
{
    return i >= 0 && i < NBUILTINS ? &builtins[i].info : NULL;
}

const char *sp_schedule_help(void)
{
    static char text[2048];
    if (!text[0]) {
        size_t n = 0;
        for (int i = 0; i < NBUILTINS; i++)
            n += (size_t)snprintf(text + n, sizeof text - n, "  %-17s %s [%s]\n",
                                  builtins[i].info.name, builtins[i].info.summary,
                                  builtins[i].info.constraint);
        n += (size_t)snprintf(text + n, sizeof text - n, "  %-17s %s\n", "auto",
                              "synthesized for the stage costs and a memory cap (Qi et al. "
                              "2024's greedy; the planner only, --memory-cap)");
        n += (size_t)snprintf(text + n, sizeof text - n, "  %-17s %s\n", "file:PATH",
                              "a schedule in the text format of docs/planner.md");
        n += (size_t)snprintf(text + n, sizeof text - n, "  %-17s %s\n", "NAME+split",
                              "NAME (a built-in or file:PATH) with each backward that sends "
                              "its input gradient run as B then W");
        snprintf(text + n, sizeof text - n, "the default: %s\n", SP_SCHEDULE_DEFAULT);
    }
    return text;
}

static const builtin *find_builtin(const char *name)
{
    for (int i = 0; i < NBUILTINS; i++)
        if (!strcmp(builtins[i].info.name, name)) return &builtins[i];
    return NULL;
}

static sp_status unknown_name(const char *name)
{
    char list[256];
    size_t n = 0;
    for (int i = 0; i < NBUILTINS; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "",
                              builtins[i].info.name);
    return sp_set_error(SP_ERR_ARG, "unknown schedule '%s'; valid: %s, auto, file:PATH, help",
                        name, list);
}

int sp_schedule_builtin_stages(const char *name, int nactors, int nchunks)
{
    const builtin *b = find_builtin(name);
    if (!b) {
        unknown_name(name);
        return -1;
    }
    switch (b->place) {
    case PLACE_INTERLEAVED: return nactors * (nchunks > 0 ? nchunks : 2);
    case PLACE_V: return 2 * nactors;
    default: return nactors;
    }
}

sp_status sp_schedule_builtin(const char *name, int p, int m, int v, sp_schedule **out)
{
    *out = NULL;
    const builtin *b = find_builtin(name);
    if (!b) return unknown_name(name);
    if (p < 1) return sp_set_error(SP_ERR_ARG, "%s: need at least one actor (p = %d)", name, p);
    if (m < 1)
        return sp_set_error(SP_ERR_ARG, "%s: need at least one microbatch (m = %d)", name, m);
    int S = p;
    switch (b->place) {
    case PLACE_PLAIN:
        if (v > 1)
            return sp_set_error(SP_ERR_ARG, "%s places one stage per actor; chunks v = %d "
                                "does not apply (use interleaved-1f1b, zb-v or dualpipe-v)",
                                name, v);
        break;
    case PLACE_INTERLEAVED:
        if (v < 1) v = 2;
        if (v < 2)
            return sp_set_error(SP_ERR_ARG, "%s needs v >= 2 chunks per actor (v = 1 is "
                                "1f1b)", name);
        if (m < p || m % p)
            return sp_set_error(SP_ERR_ARG, "%s needs m >= p and m a multiple of p "
                                "(Megatron-LM's constraint): m = %d, p = %d", name, m, p);
        S = v * p;
        break;
    case PLACE_V:
        if (v > 0 && v != 2)
            return sp_set_error(SP_ERR_ARG, "%s is V-shaped: exactly v = 2 chunks per actor, "
                                "not %d", name, v);
        v = 2;
        S = 2 * p;
        if (b->gen == gen_dualpipe_v && m < 2 * p)
            return sp_set_error(SP_ERR_ARG, "%s needs m >= 2p: m = %d, p = %d", name, m, p);
        break;
    }
    if ((int64_t)S * m > (1 << 26))
        return sp_set_error(SP_ERR_ARG, "%s: %d stages x %d microbatches is too large", name,
                            S, m);
    sp_schedule *s = sp_schedule_create(p, S, m);
    if (!s) return SP_ERR_NOMEM;
    snprintf(s->name, sizeof s->name, "%s", name);
    for (int st = 0; st < S; st++)
        s->stage_actor[st] = b->place == PLACE_V ? (st < p ? st : S - 1 - st) : st % p;
    gen g = { s, SP_OK };
    b->gen(&g, p, m, v);
    if (g.st != SP_OK) {
        sp_schedule_free(s);
        return g.st;
    }
    *out = s;
    return SP_OK;
}

sp_status sp_schedule_builtin_split(const char *name, int p, int m, int v, sp_schedule **out)
{
    char base[64];
    const size_t len = strlen(name);
    if (len <= 6 || strcmp(name + len - 6, "+split"))
        return sp_schedule_builtin(name, p, m, v, out);
    if (len - 6 >= sizeof base) return unknown_name(name);
    memcpy(base, name, len - 6);
    base[len - 6] = '\0';
    sp_status st = sp_schedule_builtin(base, p, m, v, out);
    if (st == SP_OK && (st = sp_schedule_split_backward(*out))) {
        sp_schedule_free(*out);
        *out = NULL;
    }
    return st;
}
