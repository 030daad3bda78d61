/* Calibrated costs (starpipe/calibrate.h): a profile read back, stage programs timed op
 * by op from it, and a step predicted by the planner's simulator with those times. */
#include "starpipe/calibrate.h"

#include "starpipe/optim.h"
#include "sched_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char kernel[24];
    int64_t n[5];
    int flag[2], half;
    double work, seconds;
    double hot; /* seconds with its buffers in the hottest cache (the reuse factor out) */
    int count;  /* measurements averaged in */
} op_sample;

struct sp_profile {
    op_sample *op;
    int nop, capop;
    double *msg; /* (bytes, seconds) pairs */
    int nmsg, capmsg;
    double *ar;  /* (bytes, seconds) pairs of the replicas' all-reduces */
    double *link; /* (bytes, seconds) pairs: an all-reduce of two ranks, ascending bytes */
    int nlink, caplink;
    int nar, capar, replicas;
    double upd_seconds, upd_floats; /* AdamW: summed over the profiled stages */
    double step_s, span_s, update_s, other_s;
    double gap_s; /* the runtime's time between two tasks of an actor */
    double send_gap_s; /* the same after a task whose output was sent (< 0: gap_s) */
    double task_flops, task_seconds; /* summed over the task records */
    int have_step;
    double link_lat, link_bw; /* sp_profile_set_link's (bw 0: the messages' fit) */
    double *cache; /* (bytes, seconds per byte) of the cache probe, ascending bytes */
    int ncache, capcache;
    double reuse[4096]; /* the profiled run's mean reuse factor by stage * 4 + kind (0: none) */
};

enum { CLASS_PRODUCT, CLASS_ATTENTION, CLASS_REST, NCLASS };

static int kernel_class(const char *k)
{
    if (!strncmp(k, "matmul", 6)) return CLASS_PRODUCT;
    if (!strncmp(k, "attention", 9) || !strcmp(k, "attn_dqkv")) return CLASS_ATTENTION;
    return CLASS_REST;
}

static int is_allreduce(const char *k) { return !strncmp(k, "allreduce", 9); }

/* The ops whose time follows where their buffers are (the cache or memory): the rest
 * class but the all-reduces, which the link times. */
static int memory_bound(const char *k) { return kernel_class(k) == CLASS_REST && !is_allreduce(k); }

/* value of key in "key=value" tokens of a line; NULL if absent */
static const char *field(char *const *tok, int ntok, const char *key)
{
    size_t n = strlen(key);
    for (int i = 1; i < ntok; i++)
        if (!strncmp(tok[i], key, n) && tok[i][n] == '=') return tok[i] + n + 1;
    return NULL;
}

static int num(char *const *tok, int ntok, const char *key, double *out)
{
    const char *v = field(tok, ntok, key);
    char *end;
    if (!v) return -1;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x) || x < 0) return -1;
    *out = x;
    return 0;
}

/* "a,b,c" into up to n integers (missing ones 0) */
static int ints(char *const *tok, int ntok, const char *key, int64_t *out, int n)
{
    const char *v = field(tok, ntok, key);
    if (!v) return -1;
    for (int i = 0; i < n; i++) out[i] = 0;
    for (int i = 0; i < n && *v; i++) {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (end == v || errno || x < 0) return -1;
        out[i] = x;
        v = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return 0;
}

/* stage= and kind= of a record as stage * SP_NUM_TASK_KINDS + kind; -1 if absent or bad */
static int stage_kind(char *const *tok, int ntok)
{
    const char *kind = field(tok, ntok, "kind");
    int64_t s;
    if (!kind || ints(tok, ntok, "stage", &s, 1) || s >= 1024) return -1;
    for (int k = 0; k < SP_NUM_TASK_KINDS; k++)
        if (!strcmp(kind, sp_task_kind_name((sp_task_kind)k)))
            return (int)s * SP_NUM_TASK_KINDS + k;
    return -1;
}

static int push(double **a, int *n, int *cap, double x, double y)
{
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 64;
        double *b = realloc(*a, (size_t)c * 2 * sizeof *b);
        if (!b) return -1;
        *a = b, *cap = c;
    }
    (*a)[2 * *n] = x, (*a)[2 * *n + 1] = y;
    (*n)++;
    return 0;
}

static int same_op(const op_sample *a, const op_sample *b)
{
    return !strcmp(a->kernel, b->kernel) && !memcmp(a->n, b->n, sizeof a->n) &&
           a->flag[0] == b->flag[0] && a->flag[1] == b->flag[1] && a->half == b->half;
}

static int add_op(sp_profile *pf, const op_sample *s)
{
    for (int i = 0; i < pf->nop; i++)
        if (same_op(&pf->op[i], s)) { /* the same op elsewhere: one mean */
            op_sample *o = &pf->op[i];
            o->seconds = (o->seconds * o->count + s->seconds) / (o->count + 1);
            o->hot = (o->hot * o->count + s->hot) / (o->count + 1);
            o->count++;
            return 0;
        }
    if (pf->nop == pf->capop) {
        int c = pf->capop ? 2 * pf->capop : 64;
        op_sample *b = realloc(pf->op, (size_t)c * sizeof *b);
        if (!b) return -1;
        pf->op = b, pf->capop = c;
    }
    pf->op[pf->nop++] = *s;
    return 0;
}

sp_profile *sp_profile_create(void)
{
    sp_profile *pf = calloc(1, sizeof(sp_profile));
    if (pf) pf->send_gap_s = -1;
    return pf;
}

static sp_status add_timed(sp_profile *pf, const sp_op_desc *d, double seconds, double hot)
{
    if (!pf || !d || !d->kernel || strlen(d->kernel) >= sizeof pf->op->kernel)
        return sp_set_error(SP_ERR_ARG, "sp_profile_add_op: no profile or kernel");
    if (!(seconds > 0) || !isfinite(seconds)) return SP_OK; /* not timed: nothing learnt */
    op_sample s = { .count = 1, .flag = { d->flag[0], d->flag[1] }, .half = d->half,
                    .work = d->work, .seconds = seconds, .hot = hot };
    snprintf(s.kernel, sizeof s.kernel, "%s", d->kernel);
    memcpy(s.n, d->n, sizeof s.n);
    return add_op(pf, &s) ? sp_set_error(SP_ERR_NOMEM, "profile: out of memory") : SP_OK;
}

sp_status sp_profile_add_message(sp_profile *pf, double bytes, double seconds)
{
    if (!pf) return sp_set_error(SP_ERR_ARG, "sp_profile_add_message: no profile");
    if (!(seconds > 0) || !isfinite(seconds) || !(bytes >= 0)) return SP_OK;
    return push(&pf->msg, &pf->nmsg, &pf->capmsg, bytes, seconds)
               ? sp_set_error(SP_ERR_NOMEM, "profile: out of memory") : SP_OK;
}

sp_status sp_profile_add_cache(sp_profile *pf, double bytes, double seconds_per_byte)
{
    if (!pf || !(bytes > 0) || !(seconds_per_byte > 0) || !isfinite(bytes) ||
        !isfinite(seconds_per_byte))
        return sp_set_error(SP_ERR_ARG, "sp_profile_add_cache: sizes and times must be > 0");
    if (pf->ncache && bytes <= pf->cache[2 * (pf->ncache - 1)])
        return sp_set_error(SP_ERR_ARG, "the cache probe's sizes must ascend");
    return push(&pf->cache, &pf->ncache, &pf->capcache, bytes, seconds_per_byte)
               ? sp_set_error(SP_ERR_NOMEM, "profile: out of memory") : SP_OK;
}

sp_status sp_profile_add_op(sp_profile *pf, const sp_op_desc *d, double seconds)
{
    return add_timed(pf, d, seconds, seconds);
}

void sp_profile_set_gap(sp_profile *pf, double seconds)
{
    if (pf && seconds >= 0 && isfinite(seconds)) pf->gap_s = seconds;
}

/* One line's record; 0, or -1 with msg set. */
static int parse_line(sp_profile *pf, char *const *tok, int ntok, char *msg, size_t len)
{
    const char *k = tok[0];
    double a = 0, b = 0, c = 0, d = 0;
    if (!strcmp(k, "op")) {
        sp_op_desc d = { .kernel = field(tok, ntok, "kernel") };
        int64_t fl[2];
        if (!d.kernel || strlen(d.kernel) >= sizeof pf->op->kernel ||
            ints(tok, ntok, "n", d.n, 5) || ints(tok, ntok, "flag", fl, 2) ||
            num(tok, ntok, "half", &a) || num(tok, ntok, "work", &d.work) ||
            num(tok, ntok, "seconds", &b)) {
            snprintf(msg, len, "an op needs kernel=, n=, flag=, half=, work= and seconds=");
            return -1;
        }
        d.flag[0] = (int)fl[0], d.flag[1] = (int)fl[1], d.half = (int)a;
        int sk = stage_kind(tok, ntok); /* its buffers' reuse in the profiled run, out */
        double hot = sk >= 0 && pf->reuse[sk] > 0 && memory_bound(d.kernel) ? b / pf->reuse[sk] : b;
        return add_timed(pf, &d, b, hot) ? (snprintf(msg, len, "%s", sp_last_error()), -1) : 0;
    }
    if (!strcmp(k, "cache")) {
        if (num(tok, ntok, "bytes", &a) || num(tok, ntok, "seconds_per_byte", &b) || !(a > 0) ||
            !(b > 0)) {
            snprintf(msg, len, "a cache record needs bytes= and seconds_per_byte=, both > 0");
            return -1;
        }
        return sp_profile_add_cache(pf, a, b) ? (snprintf(msg, len, "%s", sp_last_error()), -1)
                                              : 0;
    }
    if (!strcmp(k, "reuse")) {
        int sk = stage_kind(tok, ntok);
        if (sk < 0 || num(tok, ntok, "factor", &a) || !(a >= 1)) {
            snprintf(msg, len, "a reuse record needs stage= (below 1024), kind= (F, B, W or "
                     "BW) and factor= (>= 1), before the op records");
            return -1;
        }
        pf->reuse[sk] = a;
        return 0;
    }
    if (!strcmp(k, "message")) {
        if (num(tok, ntok, "bytes", &a) || num(tok, ntok, "seconds", &b)) {
            snprintf(msg, len, "a message needs bytes= and seconds=");
            return -1;
        }
        return sp_profile_add_message(pf, a, b) ? (snprintf(msg, len, "out of memory"), -1) : 0;
    }
    if (!strcmp(k, "allreduce")) {
        if (num(tok, ntok, "bytes", &a) || num(tok, ntok, "seconds", &b) ||
            num(tok, ntok, "replicas", &c)) {
            snprintf(msg, len, "an allreduce needs bytes=, seconds= and replicas=");
            return -1;
        }
        pf->replicas = (int)c;
        return b > 0 && push(&pf->ar, &pf->nar, &pf->capar, a, b)
                   ? (snprintf(msg, len, "out of memory"), -1) : 0;
    }
    if (!strcmp(k, "link")) {
        if (num(tok, ntok, "bytes", &a) || num(tok, ntok, "seconds", &b)) {
            snprintf(msg, len, "a link needs bytes= and seconds=");
            return -1;
        }
        if (pf->nlink && a <= pf->link[2 * (pf->nlink - 1)]) {
            snprintf(msg, len, "link sizes must ascend");
            return -1;
        }
        return b > 0 && push(&pf->link, &pf->nlink, &pf->caplink, a, b)
                   ? (snprintf(msg, len, "out of memory"), -1) : 0;
    }
    if (!strcmp(k, "task")) {
        if (num(tok, ntok, "seconds", &a) || num(tok, ntok, "flops", &b)) {
            snprintf(msg, len, "a task needs seconds= and flops=");
            return -1;
        }
        pf->task_seconds += a, pf->task_flops += b;
        return 0;
    }
    if (!strcmp(k, "update")) {
        if (num(tok, ntok, "seconds", &a) || num(tok, ntok, "floats", &b)) {
            snprintf(msg, len, "an update needs seconds= and floats=");
            return -1;
        }
        if (a > 0) pf->upd_seconds += a, pf->upd_floats += b;
        return 0;
    }
    if (!strcmp(k, "step")) {
        if (num(tok, ntok, "seconds", &a) || num(tok, ntok, "span", &b) ||
            num(tok, ntok, "update", &c) || num(tok, ntok, "other", &d)) {
            snprintf(msg, len, "a step needs seconds=, span=, update= and other=");
            return -1;
        }
        pf->step_s = a, pf->span_s = b, pf->update_s = c, pf->other_s = d;
        if (num(tok, ntok, "gap", &c)) c = 0;
        sp_profile_set_gap(pf, c);
        pf->send_gap_s = num(tok, ntok, "send_gap", &c) ? -1 : c;
        pf->have_step = 1;
        return 0;
    }
    return 0; /* other records (task, memory, layout, ...) are for people and later use */
}

sp_profile *sp_profile_read(const char *path, sp_status *status)
{
    sp_status st = SP_OK;
    sp_profile *pf = NULL;
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) {
        st = sp_set_error(SP_ERR_IO, "profile %s: cannot open: %s", path ? path : "(null)",
                          strerror(errno));
        goto out;
    }
    if (!(pf = sp_profile_create())) {
        st = sp_set_error(SP_ERR_NOMEM, "profile %s: out of memory", path);
        goto out;
    }
    char line[4096], msg[256];
    int ln = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        size_t L = strlen(line);
        if (L == sizeof line - 1 && line[L - 1] != '\n') {
            st = sp_set_error(SP_ERR_FORMAT, "%s:%d: line too long", path, ln);
            goto out;
        }
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *tok[32], *save = NULL;
        int ntok = 0;
        for (char *t = strtok_r(line, " \t\r\n", &save); t && ntok < 32;
             t = strtok_r(NULL, " \t\r\n", &save))
            tok[ntok++] = t;
        if (!ntok) continue;
        if (ln == 1 || (ntok && !strcmp(tok[0], "starpipe-profile"))) {
            if (ln != 1 || strcmp(tok[0], "starpipe-profile") || ntok != 2 || strcmp(tok[1], "1")) {
                st = sp_set_error(SP_ERR_FORMAT, "%s:%d: not a starpipe profile (the first "
                                  "line must be 'starpipe-profile 1'; written by --profile)",
                                  path, ln);
                goto out;
            }
            continue;
        }
        if (!strcmp(tok[0], "command")) continue; /* free text */
        if (parse_line(pf, tok, ntok, msg, sizeof msg)) {
            st = sp_set_error(SP_ERR_FORMAT, "%s:%d: %s", path, ln, msg);
            goto out;
        }
    }
    if (ln == 0)
        st = sp_set_error(SP_ERR_FORMAT, "%s: empty, not a starpipe profile", path);
    else if (!pf->have_step || !pf->nop)
        st = sp_set_error(SP_ERR_FORMAT, "%s: no %s: a profile of a run that made at least "
                          "two steps on CPU ranks has both", path,
                          !pf->have_step ? "step record" : "op timed");
out:
    if (f) fclose(f);
    if (st) {
        sp_profile_free(pf);
        pf = NULL;
    }
    if (status) *status = st;
    return pf;
}

void sp_profile_free(sp_profile *pf)
{
    if (!pf) return;
    free(pf->op), free(pf->msg), free(pf->ar), free(pf->link), free(pf->cache), free(pf);
}

/* latency + bytes / bandwidth, least squares over (bytes, seconds); one size (or sizes
 * too close to tell apart): the median time as latency, no bandwidth term. */
static void fit_link(const double *xy, int n, double *lat, double *bw)
{
    *lat = 0, *bw = 0;
    if (n <= 0) return;
    double sx = 0, sy = 0, sxx = 0, sxy = 0, lo = xy[0], hi = xy[0];
    for (int i = 0; i < n; i++) {
        double x = xy[2 * i], y = xy[2 * i + 1];
        sx += x, sy += y, sxx += x * x, sxy += x * y;
        if (x < lo) lo = x;
        if (x > hi) hi = x;
    }
    double den = n * sxx - sx * sx, slope = den > 0 ? (n * sxy - sx * sy) / den : 0;
    if (hi > 2 * lo && slope > 0) {
        double a = (sy - slope * sx) / n;
        *lat = a > 0 ? a : 0;
        *bw = 1.0 / slope;
        return;
    }
    *lat = sy / n;
}

void sp_profile_link(const sp_profile *pf, double *latency, double *bandwidth)
{
    fit_link(pf->msg, pf->nmsg, latency, bandwidth);
    if (pf->link_bw > 0) {
        *bandwidth = pf->link_bw;
        if (pf->link_lat >= 0) *latency = pf->link_lat;
    }
}

void sp_profile_set_link(sp_profile *pf, double latency, double bandwidth)
{
    if (!pf || !(bandwidth > 0) || !isfinite(bandwidth)) return;
    pf->link_bw = bandwidth;
    pf->link_lat = latency >= 0 && isfinite(latency) ? latency : -1;
    /* the wire's: half the probe's smallest 2-rank all-reduce (its records ascend by
     * bytes): 2 alpha and next to no bytes. Not a line's intercept through all of them,
     * which the largest sizes' cache effects moved by up to a millisecond. */
    if (pf->link_lat < 0 && pf->nlink) pf->link_lat = pf->link[1] / 2;
}

void sp_profile_rates(const sp_profile *pf, sp_profile_rate *out)
{
    memset(out, 0, sizeof *out);
    out->flops = pf->task_seconds > 0 ? pf->task_flops / pf->task_seconds : 0;
    sp_profile_link(pf, &out->latency, &out->bandwidth);
    /* the probe's all-reduce of two ranks: 2 alpha + bytes / bw (sp_tensor_allreduce_time
     * at T = 2), fitted */
    double lat = 0, bw = 0;
    fit_link(pf->link, pf->nlink, &lat, &bw);
    out->tp_alpha = lat / 2, out->tp_bw = bw;
    double bytes = 0, sec = 0;
    for (int i = 0; i < pf->nar; i++) bytes += pf->ar[2 * i], sec += pf->ar[2 * i + 1];
    int R = pf->replicas > 1 ? pf->replicas : 2;
    out->ar_bw = bytes > 0 && sec > 0 ? bytes * 2.0 * (R - 1) / R / sec : 0;
}

static double op_distance(const op_sample *a, const sp_op_desc *d)
{
    double x = 0;
    for (int i = 0; i < 5; i++) x += fabs(log1p((double)a->n[i]) - log1p((double)d->n[i]));
    return x;
}

/* An all-reduce of `bytes` between two ranks by the profile's link probe: interpolated
 * linearly between the measured sizes, extrapolated by the last two; -1 without them. */
static double link_time(const sp_profile *pf, double bytes)
{
    const double *L = pf->link;
    int n = pf->nlink;
    if (n == 0) return -1;
    if (n == 1 || bytes <= L[0]) return L[1] * (n == 1 && bytes > L[0] ? bytes / L[0] : 1);
    int i = 1;
    while (i < n - 1 && L[2 * i] < bytes) i++;
    double x0 = L[2 * (i - 1)], y0 = L[2 * (i - 1) + 1], x1 = L[2 * i], y1 = L[2 * i + 1];
    double y = y0 + (y1 - y0) * (bytes - x0) / (x1 - x0);
    return y > 0 ? y : y0;
}

/* Seconds of one op; the link probe, else link_lat/link_bw, for an all-reduce no sample
 * covers. */
/* How an op's time was found: measured (the same op), scaled (another size of its
 * kernel), guessed (its class's rate, or the link's for an all-reduce). */
enum { HOW_MEASURED, HOW_SCALED, HOW_GUESSED };

static double op_seconds(const sp_profile *pf, const sp_op_desc *d, const double *class_rate,
                         double link_lat, double link_bw, int hot, int *how)
{
    int dummy;
    if (!how) how = &dummy;
    const op_sample *best = NULL;
    double bestd = 0;
    int best_flags = 0;
    for (int i = 0; i < pf->nop; i++) {
        const op_sample *s = &pf->op[i];
        if (strcmp(s->kernel, d->kernel)) continue;
        int flags = s->flag[0] == d->flag[0] && s->flag[1] == d->flag[1] && s->half == d->half;
        double dist = op_distance(s, d);
        if (!best || flags > best_flags || (flags == best_flags && dist < bestd))
            best = s, bestd = dist, best_flags = flags;
    }
    *how = best && bestd == 0 && best_flags ? HOW_MEASURED : best ? HOW_SCALED : HOW_GUESSED;
    double t = best && hot ? best->hot : best ? best->seconds : 0;
    if (best && best->work > 0) return t * d->work / best->work;
    if (best) return t;
    if (is_allreduce(d->kernel)) { /* two ranks' exchange of the buffer (work: in + out) */
        double t = link_time(pf, 2.0 * d->work);
        if (t >= 0) return t;
        return 2 * link_lat + (link_bw > 0 ? 2.0 * d->work : 0) / (link_bw > 0 ? link_bw : 1);
    }
    return d->work * class_rate[kernel_class(d->kernel)];
}

static void class_rates(const sp_profile *pf, double *rate)
{
    double sec[NCLASS] = { 0 }, work[NCLASS] = { 0 }, all_s = 0, all_w = 0;
    for (int i = 0; i < pf->nop; i++) {
        int c = kernel_class(pf->op[i].kernel);
        sec[c] += pf->op[i].seconds, work[c] += pf->op[i].work;
        all_s += pf->op[i].seconds, all_w += pf->op[i].work;
    }
    for (int c = 0; c < NCLASS; c++)
        rate[c] = work[c] > 0 ? sec[c] / work[c] : all_w > 0 ? all_s / all_w : 0;
}

sp_status sp_profile_task_costs(const sp_profile *pf, const sp_program *p, double *cost)
{
    return sp_profile_task_costs_n(pf, p, cost, NULL);
}

/* Stage s's program of kind k: the seconds of its memory-bound ops (their hot times when
 * `hot`: the cache factor out) in *rest, the others' and the runtime's gap in *fixed;
 * found as sp_profile_task_costs_n. */
static void program_cost(const sp_profile *pf, const sp_program *p, int s, int k,
                         const double *rate, double lat, double bw, int hot, double *fixed,
                         double *rest, int *found)
{
    sp_op_desc d;
    int j = 0;
    *fixed = *rest = 0;
    for (; sp_program_op(p, s, (sp_task_kind)k, j, &d) == 0; j++) {
        int how;
        double t = op_seconds(pf, &d, rate, lat, bw, hot, &how);
        *(memory_bound(d.kernel) ? rest : fixed) += t;
        if (found && k != SP_TASK_BW) found[how]++; /* (BW: B's and W's ops again) */
    }
    if (j) *fixed += pf->gap_s;
}

sp_status sp_profile_task_costs_n(const sp_profile *pf, const sp_program *p, double *cost,
                                  int *found)
{
    if (!pf || !p || !cost) return sp_set_error(SP_ERR_ARG, "sp_profile_task_costs: NULL");
    if (found) found[0] = found[1] = found[2] = 0;
    double rate[NCLASS], lat, bw;
    class_rates(pf, rate);
    sp_profile_link(pf, &lat, &bw);
    for (int s = 0; s < sp_program_num_stages(p); s++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++) {
            double fixed, rest;
            program_cost(pf, p, s, k, rate, lat, bw, 0, &fixed, &rest, found);
            cost[s * SP_NUM_TASK_KINDS + k] = fixed + rest;
        }
    return SP_OK;
}

/* ---- the caches: where a task's buffers are when it runs ---- */

/* The probe's seconds per byte at a working set of `bytes` over its least: log-linear
 * between the probed sizes, flat beyond them. 1 without a probe. */
static double cache_cost(const sp_profile *pf, double bytes)
{
    const double *c = pf->cache;
    int n = pf->ncache;
    if (n < 2) return 1;
    double least = c[1];
    for (int i = 1; i < n; i++)
        if (c[2 * i + 1] < least) least = c[2 * i + 1];
    if (bytes <= c[0]) return c[1] / least;
    if (bytes >= c[2 * (n - 1)]) return c[2 * (n - 1) + 1] / least;
    int i = 1;
    while (c[2 * i] < bytes) i++;
    double x = (log(bytes) - log(c[2 * i - 2])) / (log(c[2 * i]) - log(c[2 * i - 2]));
    return (c[2 * i - 1] + x * (c[2 * i + 1] - c[2 * i - 1])) / least;
}

/* f[j] for each RUN j of actor a: its per-microbatch buffers' cache_cost at their reuse
 * distance, weighted by their bytes (1 for other instructions). The reuse distance of a
 * buffer is its own bytes and those of the distinct buffers the actor touched since it
 * last touched it: the per-microbatch ones by the pool slot they land in
 * (sp_plan_pool_map: a slot given back and taken again is the same memory), parameters,
 * gradients and moments by name. The step runs twice and the second is measured: the
 * first touches of a step follow the previous step's last ones, the update included. */
static sp_status reuse_factors(const sp_profile *pf, const sp_plan *plan,
                               const sp_stage_model *model, int a, double *f)
{
    sp_pool_slot *slot;
    int nslot, *at, nkey = 0;
    sp_status st = sp_plan_pool_map(plan, model, a, &slot, &nslot, &at);
    if (st) return st;
    int nacc = 0;
    for (int j = 0; j < plan->ninstr[a]; j++) nacc += sp_instr_naccess(&plan->instr[a][j]);
    /* keys: the slots, then every other buffer the actor touches */
    int cap = nslot + nacc + 1;
    uint64_t *name = malloc(sizeof *name * (size_t)cap);
    double *size = malloc(sizeof *size * (size_t)cap);
    int64_t *last = malloc(sizeof *last * (size_t)cap);
    if (!name || !size || !last) {
        st = sp_set_error(SP_ERR_NOMEM, "profile: out of memory");
        goto out;
    }
    for (int k = 0; k < nslot; k++) name[k] = 0, size[k] = (double)slot[k].size, last[k] = -1;
    nkey = nslot;
    int64_t clock = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0, q0 = 0; j < plan->ninstr[a]; j++) {
            const sp_instr *in = &plan->instr[a][j];
            double w = 0, wc = 0;
            for (int q = 0; q < sp_instr_naccess(in) && in->op != SP_OP_FREE; q++) {
                sp_buf b = sp_instr_buf(plan, in, q);
                int key = at[q0 + q];
                if (key < 0) {
                    uint64_t nm = sp_buf_key(b);
                    key = nslot;
                    while (key < nkey && name[key] != nm) key++;
                    if (key == nkey)
                        name[nkey] = nm, size[nkey] = (double)sp_buf_bytes(model, b),
                        last[nkey++] = -1;
                }
                double d = size[key];
                for (int k = 0; k < nkey; k++)
                    if (k != key && last[k] > last[key]) d += size[k];
                if (last[key] < 0) d = INFINITY; /* never touched: from memory */
                last[key] = clock++;
                if (at[q0 + q] >= 0) {
                    double bytes = (double)sp_buf_bytes(model, b);
                    w += bytes, wc += bytes * cache_cost(pf, d);
                }
            }
            if (pass) f[j] = in->op == SP_OP_RUN && w > 0 ? wc / w : 1;
            q0 += sp_instr_naccess(in);
        }
out:
    free(name), free(size), free(last), free(slot), free(at);
    return st;
}

sp_status sp_profile_reuse(const sp_profile *pf, const sp_plan *plan,
                           const sp_stage_model *model, double *mean)
{
    if (!pf || !plan || !model || !mean) return sp_set_error(SP_ERR_ARG, "sp_profile_reuse: NULL");
    int S = plan->nstages, *count = calloc((size_t)S * SP_NUM_TASK_KINDS, sizeof *count);
    for (int k = 0; k < S * SP_NUM_TASK_KINDS; k++) mean[k] = 0;
    if (!count) return sp_set_error(SP_ERR_NOMEM, "profile: out of memory");
    sp_status st = SP_OK;
    for (int a = 0; a < plan->nactors && st == SP_OK; a++) {
        double *f = malloc(sizeof *f * ((size_t)plan->ninstr[a] + 1));
        st = f ? reuse_factors(pf, plan, model, a, f)
               : sp_set_error(SP_ERR_NOMEM, "profile: out of memory");
        for (int j = 0; st == SP_OK && j < plan->ninstr[a]; j++) {
            const sp_instr *in = &plan->instr[a][j];
            if (in->op != SP_OP_RUN) continue;
            int k = in->task.stage * SP_NUM_TASK_KINDS + in->task.kind;
            mean[k] += f[j], count[k]++;
        }
        free(f);
    }
    for (int k = 0; k < S * SP_NUM_TASK_KINDS; k++) mean[k] = count[k] ? mean[k] / count[k] : 1;
    free(count);
    return st;
}

sp_stage_info *sp_profile_costed_model(const sp_profile *pf, const sp_program *p,
                                      sp_stage_model *out, int *found)
{
    const sp_stage_model *model = sp_program_stage_model(p);
    int S = model->nstages;
    double *cost = calloc((size_t)S * SP_NUM_TASK_KINDS, sizeof *cost);
    sp_stage_info *info = malloc((size_t)S * sizeof *info);
    if (!cost || !info || sp_profile_task_costs_n(pf, p, cost, found) != SP_OK) {
        free(cost), free(info);
        return NULL;
    }
    memcpy(info, model->stage, (size_t)S * sizeof *info);
    for (int s = 0; s < S; s++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++)
            info[s].cost[k] = cost[s * SP_NUM_TASK_KINDS + k];
    *out = *model;
    out->stage = info;
    free(cost);
    return info;
}

double sp_predict_memory(const sp_program *p, const sp_plan *plan, int actor, int replica,
                         int replicas, int sharded)
{
    const sp_stage_model *model = sp_program_stage_model(p);
    int R = replicas > 1 ? replicas : 1, r = replica >= 0 && replica < R ? replica : 0;
    int64_t *bounds = malloc(sizeof *bounds * ((size_t)R + 1));
    double b = 0;
    for (int s = 0; s < plan->nstages; s++) {
        if (plan->stage_actor[s] != actor) continue;
        double pb = (double)sp_program_buf_bytes(p, SP_BUF_PARAMS, s), own = pb;
        if (R > 1 && bounds) { /* this replica's shard (sp_optim_shards: uneven) */
            sp_optim_shards(p, s, R, bounds);
            own = 4.0 * (double)(bounds[r + 1] - bounds[r]);
        }
        b += pb + (double)sp_program_buf_bytes(p, SP_BUF_GRADS, s);
        b += 2 * (sharded && R > 1 ? own : pb); /* the AdamW moments */
        b += (double)sp_program_buf_bytes(p, SP_BUF_SCRATCH, s);
        /* the replicas' exchange: the others' shards out, its own in from each, its sum */
        if (R > 1) b += pb - own + R * own;
    }
    free(bounds);
    /* a tied parameter spread over actors: on each, a buffer its gradient or its value
     * travels in each way */
    for (int k = 0; k < model->nshared; k++) {
        int here = 0, away = 0;
        for (int j = 0; j < model->shared[k].nstages; j++)
            plan->stage_actor[model->shared[k].stages[j]] == actor ? here++ : away++;
        if (here && away) b += 2.0 * (double)model->shared[k].bytes;
    }
    size_t pool = 0;
    if (sp_plan_pool_bytes(plan, model, actor, &pool) == SP_OK) b += (double)pool;
    for (int k = 0; k < sp_program_num_inputs(p); k++)
        b += (double)plan->nmicro * (double)sp_program_buf_bytes(p, SP_BUF_INPUT, k);
    return b;
}

/* [actor][instruction] seconds of plan's instructions on the profile's machine: a RUN its
 * program's ops, the memory-bound ones at their hot time by the task's reuse factor; a
 * COMBINE `combine`; the rest 0 (the update is added after the span). */
static sp_status task_times(const sp_profile *pf, const sp_program *p, const sp_plan *plan,
                            const sp_stage_model *model, double combine, double ***out)
{
    int S = plan->nstages, A = plan->nactors;
    double rate[NCLASS], lat, bw;
    class_rates(pf, rate);
    sp_profile_link(pf, &lat, &bw);
    double *fixed = malloc(sizeof *fixed * (size_t)S * SP_NUM_TASK_KINDS * 2);
    double *rest = fixed ? fixed + S * SP_NUM_TASK_KINDS : NULL;
    double **t = calloc((size_t)A, sizeof *t);
    sp_status st = fixed && t ? SP_OK : sp_set_error(SP_ERR_NOMEM, "profile: out of memory");
    for (int k = 0; st == SP_OK && k < S * SP_NUM_TASK_KINDS; k++)
        program_cost(pf, p, k / SP_NUM_TASK_KINDS, k % SP_NUM_TASK_KINDS, rate, lat, bw, 1,
                     &fixed[k], &rest[k], NULL);
    for (int a = 0; st == SP_OK && a < A; a++) {
        if (!(t[a] = malloc(sizeof **t * ((size_t)plan->ninstr[a] + 1)))) {
            st = sp_set_error(SP_ERR_NOMEM, "profile: out of memory");
            break;
        }
        if ((st = reuse_factors(pf, plan, model, a, t[a]))) break;
        for (int j = 0; j < plan->ninstr[a]; j++) {
            const sp_instr *in = &plan->instr[a][j];
            int k = in->task.stage * SP_NUM_TASK_KINDS + in->task.kind;
            /* a recomputing stage's first backward task runs F again first (sp_simulate) */
            int f = in->task.stage * SP_NUM_TASK_KINDS + SP_TASK_F;
            int again = in->op == SP_OP_RUN && model->stage[in->task.stage].recompute &&
                        (in->task.kind == SP_TASK_B || in->task.kind == SP_TASK_BW);
            t[a][j] = in->op == SP_OP_RUN ? fixed[k] + rest[k] * t[a][j] +
                                                (again ? fixed[f] + rest[f] * t[a][j] : 0)
                    : in->op == SP_OP_COMBINE ? combine : 0;
            /* a task whose output is sent: the runtime's gap after a send (fixed holds the
             * plain gap) */
            int sends = 0;
            for (int q = j + 1; q < plan->ninstr[a] && plan->instr[a][q].op != SP_OP_RUN &&
                                plan->instr[a][q].op != SP_OP_COMBINE; q++)
                sends |= plan->instr[a][q].op == SP_OP_SEND;
            if (in->op == SP_OP_RUN && sends && pf->send_gap_s >= 0)
                t[a][j] += pf->send_gap_s - pf->gap_s;
        }
    }
    free(fixed);
    if (st) {
        for (int a = 0; t && a < A; a++) free(t[a]);
        free(t);
        t = NULL;
    }
    *out = t;
    return st;
}

sp_status sp_profile_predict(const sp_profile *pf, const sp_program *p, const sp_plan *plan,
                             int replicas, int sharded, sp_prediction *out)
{
    if (!pf || !p || !plan || !out) return sp_set_error(SP_ERR_ARG, "sp_profile_predict: NULL");
    memset(out, 0, sizeof *out);
    int S = plan->nstages, A = plan->nactors, R = replicas > 1 ? replicas : 1;
    sp_stage_model m;
    sp_stage_info *info = sp_profile_costed_model(pf, p, &m, out->ops);
    out->mem_bytes = calloc((size_t)A, sizeof(double));
    if (!info || !out->mem_bytes) {
        free(info);
        sp_prediction_free(out);
        return sp_set_error(SP_ERR_NOMEM, "sp_profile_predict: out of memory");
    }
    sp_profile_link(pf, &out->latency, &out->bandwidth);

    /* the replicas' all-reduce: a flat ring whose bandwidth the profile's all-reduces
     * give (bytes x 2 (R-1)/R over their time), else the message link's */
    sp_allreduce_model arm = { 0 };
    if (R > 1) {
        sp_profile_rate rt;
        sp_profile_rates(pf, &rt);
        arm.alpha = out->latency;
        arm.bw_intra = arm.bw_inter = rt.ar_bw > 0 ? rt.ar_bw
                                      : out->bandwidth > 0 ? out->bandwidth : 1e12;
        arm.replicas = R;
        arm.replicas_per_node = R;
    }
    /* a tied gradient's combine: adds of its floats, at the rate of the profile's copies */
    double combine = 0;
    double rate[NCLASS];
    class_rates(pf, rate);
    for (int k = 0; k < m.nshared; k++) {
        int64_t n = (int64_t)(m.shared[k].bytes / 4);
        sp_op_desc d = { .kernel = "scale", .n = { n }, .flag = { 0, 0 }, .work = 3.0 * n };
        combine += op_seconds(pf, &d, rate, out->latency, out->bandwidth, 0, NULL);
    }
    sp_sim_config cfg = { .latency = out->latency, .bandwidth = out->bandwidth,
                          .combine_time = m.nshared ? combine / m.nshared : 0,
                          .allreduce = R > 1 ? &arm : NULL };
    /* each task its own time: the memory-bound ops' hot times by the task's reuse factor
     * (1 without a cache probe), the runtime's gap after it (after a send, or not) */
    double **itime = NULL;
    sp_status st = task_times(pf, p, plan, &m, cfg.combine_time, &itime);
    cfg.instr_time = (const double *const *)itime;
    sp_sim_result *r = NULL;
    if (st == SP_OK) st = sp_simulate(plan, &m, &cfg, &r);
    for (int a = 0; itime && a < A; a++) free(itime[a]);
    free(itime);
    if (st == SP_OK) {
        out->span_s = r->step_time;
        out->bubble = r->bubble_fraction;
        sp_sim_result_free(r);
    }
    /* the update phase: AdamW seconds per float, the slowest rank's share */
    double spf = pf->upd_floats > 0 ? pf->upd_seconds / pf->upd_floats : 0;
    out->nactors = A;
    for (int a = 0; a < A; a++) {
        double floats = 0;
        for (int s = 0; s < S; s++)
            if (plan->stage_actor[s] == a)
                floats += (double)sp_program_owned_floats(p, s);
        double u = spf * floats / (sharded && R > 1 ? R : 1);
        if (u > out->update_s) out->update_s = u;
        out->mem_bytes[a] = sp_predict_memory(p, plan, a, 0, R, sharded);
    }
    out->other_s = pf->other_s;
    out->step_s = out->span_s + out->update_s + out->other_s;
    free(info);
    if (st) sp_prediction_free(out);
    return st;
}

void sp_prediction_free(sp_prediction *pr)
{
    if (!pr) return;
    free(pr->mem_bytes);
    pr->mem_bytes = NULL;
}
