/* --profile and --calibrate (profile.h). */
#include "apps/profile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/files.h"
#include "starpipe/backend.h"
#include "starpipe/exec.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[1..n) (step 1 left out when there are others); v is reordered. */
static double median_after_first(double *v, int n)
{
    int skip = n > 1;
    if (n - skip <= 0) return 0;
    qsort(v + skip, (size_t)(n - skip), sizeof *v, cmp_double);
    int k = n - skip;
    return k % 2 ? v[skip + k / 2] : 0.5 * (v[skip + k / 2 - 1] + v[skip + k / 2]);
}

/* Each rank's measured memory (its trainer's buffers), on every rank: [size]. */
static double *rank_memory(sp_trainer *t)
{
    int P = sp_exec_size();
    double *v = calloc((size_t)P, sizeof *v);
    if (!v) return NULL;
    sp_train_memory m = sp_trainer_memory(t);
    v[sp_exec_rank()] = (double)(m.transient + m.persistent);
    if (sp_exec_allreduce_sum(v, (size_t)P, 1) != SP_OK) {
        free(v);
        return NULL;
    }
    return v;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The link between two ranks as a tensor group meets it (MPI from the main thread, what
 * an all-reduce inside a task costs): ranks paired (0, 1), (2, 3), ... time all-reduces
 * of kLinkSizes floats, the median of kLinkReps. Collective; pair (0, 1)'s times in
 * sec (rank 0's; zeros with one rank). 1 on failure. */
enum { kLinkSizes = 6, kLinkReps = 7 };
static const int64_t link_floats[kLinkSizes] = { 16, 1024, 16384, 131072, 1048576, 4194304 };

static int probe_link(double *sec)
{
    int P = sp_exec_size(), me = sp_exec_rank();
    memset(sec, 0, kLinkSizes * sizeof *sec);
    if (P < 2) return 0;
    int pair = me / 2, size = (pair * 2 + 1 < P) ? 2 : 1;
    sp_exec_tensor_group *g = NULL;
    if (sp_exec_tensor_group_create(pair, me % 2, size, 0, &g) != SP_OK) return 1;
    struct sp_tp_group *h = sp_exec_tensor_group_host(g);
    float *buf = calloc((size_t)link_floats[kLinkSizes - 1], sizeof *buf);
    int bad = !buf;
    for (int k = 0; k < kLinkSizes && !bad && size == 2; k++) {
        double t[kLinkReps];
        for (int r = 0; r < kLinkReps && !bad; r++) {
            double t0 = now_s();
            bad = h->allreduce(h, buf, buf, link_floats[k], 0) != 0;
            t[r] = now_s() - t0;
        }
        qsort(t, kLinkReps, sizeof *t, cmp_double);
        sec[k] = t[kLinkReps / 2];
    }
    free(buf);
    sp_exec_tensor_group_free(g);
    return bad;
}

/* The caches as the tasks meet them: every rank at once (as they train) streams the
 * library's add (out = a + b) over working sets of kCacheSizes sizes from 64 KiB to
 * 256 MiB, the best pass of at least 3 and 20 ms per size; seconds per byte, the ranks'
 * mean, in spb on every rank. 1 on failure. */
enum { kCacheSizes = 13 };

static int probe_cache(double *bytes, double *spb)
{
    int64_t most = (256ll << 20) / 12; /* floats per buffer at the largest size */
    float *buf = malloc(3 * sizeof(float) * (size_t)most);
    int bad = !buf;
    if (buf) memset(buf, 0, 3 * sizeof(float) * (size_t)most); /* its pages, now */
    const sp_backend *be = sp_backend_cpu();
    for (int k = 0; k < kCacheSizes; k++) {
        double x = 0;
        bytes[k] = (double)(64 << 10) * (double)(1 << k);
        if (sp_exec_allreduce_sum(&x, 1, 1) != SP_OK) bad = 1; /* together */
        int64_t n = (int64_t)(bytes[k] / 12);
        double best = INFINITY, stop = now_s() + 0.02;
        for (int rep = 0; !bad && (rep < 3 || now_s() < stop); rep++) {
            double t0 = now_s();
            be->add(NULL, buf + 2 * most, buf, buf + most, n);
            double dt = now_s() - t0;
            if (dt < best) best = dt;
        }
        spb[k] = bad ? 0 : best / (12.0 * (double)n) / sp_exec_size();
    }
    free(buf);
    double b = bad;
    if (sp_exec_allreduce_sum(&b, 1, 1) != SP_OK || b > 0) return 1;
    return sp_exec_allreduce_sum(spb, kCacheSizes, 1) != SP_OK;
}

static void write_body(FILE *f, const app_profile_run *r, const sp_train_profile *pf,
                       const double *mem, const double *link, const double *cache, double step,
                       double span)
{
    const sp_plan *pl = sp_trainer_plan(r->t);
    sp_layout lay = sp_trainer_layout(r->t);
    int S = pf->nstages;
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    fprintf(f, "starpipe-profile 1\n# what steps 2..%d of this run measured on %s, seconds "
            "(docs/planner.md, Calibration)\n", pf->steps + 1, host);
    fprintf(f, "command %s\n", r->command);
    fprintf(f, "layout ranks=%d replicas=%d actors=%d tensor=%d stages=%d microbatches=%d "
            "schedule=%s precision=%s sharded=%d\n", sp_exec_size(), lay.replicas, lay.actors,
            r->tensor, S, pl->nmicro, r->schedule, r->bf16 ? "bf16" : "fp32", r->sharded);
    double update = 0;
    for (int a = 0; a < pl->nactors; a++) {
        double u = 0;
        for (int s = 0; s < S; s++)
            if (pl->stage_actor[s] == a) u += pf->opt_s[s];
        if (u > update) update = u;
    }
    double other = step - span - update;
    fprintf(f, "step seconds=%.9g span=%.9g update=%.9g other=%.9g gap=%.9g send_gap=%.9g "
            "steps=%d\n", step, span, update, other > 0 ? other : 0, pf->gap_s,
            pf->send_gap_s, pf->steps);
    for (int k = 0; k < S * SP_NUM_TASK_KINDS; k++)
        if (pf->task_s[k] > 0)
            fprintf(f, "task stage=%d kind=%s seconds=%.9g flops=%.9g\n", k / 4,
                    sp_task_kind_name(k % 4), pf->task_s[k],
                    sp_program_flops(r->p, k / 4, (sp_task_kind)(k % 4)));
    /* the caches, and where this run's tasks found their buffers: before the ops, whose
     * memory-bound times the reader takes the reuse factor out of */
    sp_profile *probe = sp_profile_create();
    double *reuse = malloc(sizeof *reuse * (size_t)S * SP_NUM_TASK_KINDS);
    for (int k = 0; probe && k < kCacheSizes; k++)
        if (sp_profile_add_cache(probe, cache[k], cache[kCacheSizes + k]) == SP_OK)
            fprintf(f, "cache bytes=%.0f seconds_per_byte=%.9g\n", cache[k],
                    cache[kCacheSizes + k]);
    if (probe && reuse && sp_profile_reuse(probe, pl, sp_program_stage_model(r->p), reuse) == SP_OK)
        for (int k = 0; k < S * SP_NUM_TASK_KINDS; k++)
            if (pf->task_s[k] > 0)
                fprintf(f, "reuse stage=%d kind=%s factor=%.6f\n", k / 4,
                        sp_task_kind_name(k % 4), reuse[k]);
    sp_profile_free(probe);
    free(reuse);
    for (int k = 0; k < S * SP_NUM_TASK_KINDS; k++) /* the programs that ran */
        for (int64_t j = pf->op_at[k]; pf->task_s[k] > 0 && j < pf->op_at[k + 1]; j++) {
            sp_op_desc d;
            if (sp_program_op(r->p, k / 4, (sp_task_kind)(k % 4), (int)(j - pf->op_at[k]), &d))
                continue;
            fprintf(f, "op stage=%d kind=%s index=%d kernel=%s n=%lld,%lld,%lld,%lld,%lld "
                    "flag=%d,%d half=%d work=%.9g seconds=%.9g\n", k / 4,
                    sp_task_kind_name(k % 4), (int)(j - pf->op_at[k]), d.kernel,
                    (long long)d.n[0], (long long)d.n[1], (long long)d.n[2],
                    (long long)d.n[3], (long long)d.n[4], d.flag[0], d.flag[1], d.half, d.work,
                    pf->op_s[j]);
        }
    for (int s = 0; s < S; s++)
        fprintf(f, "update stage=%d seconds=%.9g floats=%.9g\n", s, pf->opt_s[s],
                (double)sp_program_owned_floats(r->p, s) /
                    (r->sharded && r->replicas > 1 ? r->replicas : 1));
    for (int a = 0; a < pl->nactors; a++)
        for (int i = 0; i < pl->ninstr[a]; i++) {
            const sp_instr *in = &pl->instr[a][i];
            if (in->op == SP_OP_RECV && in->seq >= 0 && in->seq < pf->nmessages &&
                pf->msg_s[in->seq] >= 0)
                fprintf(f, "message seq=%lld from=%d to=%d bytes=%zu seconds=%.9g\n",
                        (long long)in->seq, in->peer, a, in->bytes, pf->msg_s[in->seq]);
        }
    for (int s = 0; s < S && lay.replicas > 1; s++)
        if (pf->ar_s[s] > 0)
            fprintf(f, "allreduce stage=%d bytes=%zu seconds=%.9g replicas=%d\n", s,
                    sp_program_buf_bytes(r->p, SP_BUF_GRADS, s), pf->ar_s[s], lay.replicas);
    for (int k = 0; k < kLinkSizes; k++)
        if (link[k] > 0)
            fprintf(f, "link kind=allreduce ranks=2 bytes=%lld seconds=%.9g\n",
                    4 * (long long)link_floats[k], link[k]);
    for (int k = 0; k < sp_exec_size(); k++) {
        int rep, a, tr;
        sp_layout_place_t(&lay, k, &rep, &a, &tr);
        fprintf(f, "memory rank=%d actor=%d measured=%.0f predicted=%.0f\n", k, a, mem[k],
                sp_predict_memory(r->p, pl, a, rep, lay.replicas, r->sharded));
    }
}

int app_profile_write(const char *path, const app_profile_run *r, const double *step_s,
                      const double *span_s, int nsteps, char *msg, size_t len)
{
    sp_train_profile pf;
    sp_status st = sp_trainer_profile(r->t, &pf);
    double *mem = st ? NULL : rank_memory(r->t), link[kLinkSizes], cache[2 * kCacheSizes];
    if (!st && mem && (probe_link(link) || probe_cache(cache, cache + kCacheSizes))) {
        snprintf(msg, len, "--profile: the link's or the caches' probe failed: %s",
                 sp_last_error());
        free(mem);
        sp_train_profile_free(&pf);
        return 1;
    }
    if (st || !mem) {
        snprintf(msg, len, "--profile: %s", st ? sp_last_error() : "out of memory");
        if (!st) sp_train_profile_free(&pf);
        return 1;
    }
    int bad = 0;
    if (sp_exec_rank() == 0) {
        double *v = malloc(2 * ((size_t)nsteps + 1) * sizeof *v);
        sp_output out;
        if (!v || (st = sp_output_open(&out, path, "--profile file"))) {
            snprintf(msg, len, "%s", v ? sp_last_error() : "out of memory");
            bad = 1;
        } else {
            memcpy(v, step_s, (size_t)nsteps * sizeof *v);
            memcpy(v + nsteps + 1, span_s, (size_t)nsteps * sizeof *v);
            double step = median_after_first(v, nsteps);
            double span = median_after_first(v + nsteps + 1, nsteps);
            write_body(out.f, r, &pf, mem, link, cache, step, span);
            if ((st = sp_output_commit(&out, "--profile file"))) {
                snprintf(msg, len, "%s", sp_last_error());
                bad = 1;
            }
        }
        free(v);
    }
    free(mem);
    sp_train_profile_free(&pf);
    return bad;
}

sp_status app_predict(const sp_profile *pf, const app_profile_run *r, sp_prediction *out)
{
    const sp_plan *pl = sp_trainer_plan(r->t);
    sp_status st = sp_profile_predict(pf, r->p, pl, r->replicas, r->sharded, out);
    if (st || sp_exec_rank() != 0) return st;
    char link[64];
    if (out->bandwidth > 0)
        snprintf(link, sizeof link, "+ bytes at %.2f GB/s", out->bandwidth / 1e9);
    else
        snprintf(link, sizeof link, "each (one size: no bandwidth term)");
    printf("prediction: step %.1f ms (pipeline %.1f ms, bubble %.1f%%, update %.1f ms, "
           "other %.1f ms; messages %.0f us %s); memory per rank", 1e3 * out->step_s,
           1e3 * out->span_s, 100 * out->bubble, 1e3 * out->update_s, 1e3 * out->other_s,
           1e6 * out->latency, link);
    for (int a = 0; a < out->nactors; a++)
        printf("%s %.2f MiB", a ? "," : "", out->mem_bytes[a] / 1048576.0);
    printf(" (by actor); ops of the stage programs: %d measured, %d scaled from another "
           "size, %d guessed%s\n", out->ops[0], out->ops[1], out->ops[2],
           out->ops[2] ? " (kernels the profile never ran)" : "");
    fflush(stdout);
    return SP_OK;
}

int app_predict_report(const sp_prediction *pred, const app_profile_run *r,
                       const double *step_s, int nsteps, char *tail, size_t len)
{
    double *mem = rank_memory(r->t);
    if (!mem) return 1;
    if (sp_exec_rank() == 0) {
        double *v = malloc(((size_t)nsteps + 1) * sizeof *v);
        if (!v) {
            free(mem);
            return 1;
        }
        memcpy(v, step_s, (size_t)nsteps * sizeof *v);
        double step = median_after_first(v, nsteps), worst = 0;
        free(v);
        sp_layout lay = sp_trainer_layout(r->t);
        for (int k = 0; k < sp_exec_size(); k++) {
            int rep, a, tr;
            sp_layout_place_t(&lay, k, &rep, &a, &tr);
            double want = sp_predict_memory(r->p, sp_trainer_plan(r->t), a, rep, lay.replicas,
                                            r->sharded);
            double e = mem[k] > 0 ? want / mem[k] - 1 : 0;
            if (e * e > worst * worst) worst = e;
        }
        snprintf(tail, len, "prediction: step %.1f ms predicted, %.1f ms measured (median "
                 "of steps 2..%d): error %+.1f%%; memory per rank: largest error %+.1f%%\n",
                 1e3 * pred->step_s, 1e3 * step, nsteps, step > 0 ? 100 * (pred->step_s / step - 1) : 0,
                 100 * worst);
    }
    free(mem);
    return 0;
}
