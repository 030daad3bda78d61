/* Calibrated costs (starpipe/calibrate.h): a profile whose products run at a known rate
 * per FLOP and attention at another predicts each stage program's time as the GPT's
 * closed-form FLOP counts at those rates, at the profiled shape and at another batch
 * (scaled by work); the prediction is the simulated plan plus the update and the rest;
 * the caches' probe and reuse factors (a flat probe changes nothing, a step makes every
 * task's factor its extreme, a profile's factor comes out of its ops); bad files get one
 * message naming the file and line. */
#include <math.h>
#include <unistd.h>

#include "starpipe/calibrate.h"
#include "starpipe/models.h"
#include "test_util.h"

enum { L = 3, C = 32, H = 2, T = 16, V = 64 };
static const double r_prod = 1e-12, r_attn = 3e-12;
static double r_rest = 1e-16; /* the caches' checks make the memory-bound ops count */

/* The graphs behind the programs (a program reads its graph): freed at the end. */
static sp_graph *graphs[8];
static int ngraphs;

static sp_program *gpt(int batch, int stages)
{
    sp_gpt_config c = { .vocab = V, .context = T, .layers = L, .heads = H, .channels = C,
                        .batch = batch, .stages = stages };
    sp_status st;
    sp_graph *g = sp_model_gpt(&c, &st);
    if (!g) MUST(st);
    if (ngraphs == 8) exit(1);
    graphs[ngraphs++] = g;
    sp_program *p = sp_program_build(g, &st);
    if (!p) MUST(st);
    return p;
}

static double rate_of(const char *k)
{
    if (!strncmp(k, "matmul", 6)) return r_prod;
    if (!strcmp(k, "attention") || !strcmp(k, "attn_dqkv")) return r_attn;
    return r_rest;
}

/* A profile of p: every op at its kernel's rate per unit of work. */
static void write_profile(const char *path, const sp_program *p, const char *before,
                          const char *extra)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) exit(1);
    fprintf(f, "starpipe-profile 1\n# test\ncommand anything at all: free text\n");
    fprintf(f, "step seconds=0.01 span=0.008 update=0.0001 other=0.002 gap=0 steps=3\n");
    if (before) fputs(before, f);
    for (int s = 0; s < sp_program_num_stages(p); s++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++) {
            sp_op_desc d;
            for (int j = 0; sp_program_op(p, s, (sp_task_kind)k, j, &d) == 0; j++)
                fprintf(f, "op stage=%d kind=%s index=%d kernel=%s n=%lld,%lld,%lld,%lld,%lld "
                        "flag=%d,%d half=%d work=%.17g seconds=%.17g\n", s,
                        sp_task_kind_name(k), j, d.kernel, (long long)d.n[0],
                        (long long)d.n[1], (long long)d.n[2], (long long)d.n[3],
                        (long long)d.n[4], d.flag[0], d.flag[1], d.half, d.work,
                        d.work * rate_of(d.kernel));
        }
    fprintf(f, "update stage=0 seconds=0.001 floats=1000\n");
    fprintf(f, "message seq=0 from=0 to=1 bytes=4096 seconds=0.00001\n");
    fprintf(f, "message seq=1 from=0 to=1 bytes=65536 seconds=0.00003\n");
    if (extra) fputs(extra, f);
    fclose(f);
}

/* The GPT's closed forms: stage s with nb blocks (and the head when last), N = B T
 * tokens: F's products 24 N C^2 per block + 2 N C V, attention 2 B T^2 C per block; BW
 * twice the products (both operands' gradients) and 4 B T^2 C of attention. */
static double closed(int batch, int nb, int last, int bw)
{
    double N = (double)batch * T;
    double prod = 24.0 * N * C * C * nb + (last ? 2.0 * N * C * V : 0);
    double attn = 2.0 * batch * (double)T * T * C * nb;
    return bw ? 2 * prod * r_prod + 2 * attn * r_attn : prod * r_prod + attn * r_attn;
}

static void check_costs(const sp_profile *pf, int batch)
{
    sp_program *p = gpt(batch, 2);
    double cost[2 * SP_NUM_TASK_KINDS];
    int found[3];
    MUST(sp_profile_task_costs_n(pf, p, cost, found));
    /* the profiled shape: every op measured; another batch: products and the rest
     * scaled from the profiled sizes, none guessed */
    CHECK(found[2] == 0 && (batch == 2 ? found[1] == 0 && found[0] > 0 : found[1] > 0),
          "batch %d: ops %d measured, %d scaled, %d guessed", batch, found[0], found[1],
          found[2]);
    int nb[2] = { 2, 1 }; /* 3 blocks on 2 stages: the remainder to the first */
    for (int s = 0; s < 2; s++)
        for (int bw = 0; bw < 2; bw++) {
            double want = closed(batch, nb[s], s == 1, bw);
            double got = cost[s * SP_NUM_TASK_KINDS + (bw ? SP_TASK_BW : SP_TASK_F)];
            CHECK(fabs(got - want) <= 2e-3 * want, "batch %d stage %d %s: %.6g s, closed form "
                  "%.6g s", batch, s, bw ? "BW" : "F", got, want);
        }
    /* B and W split BW's work: their sum is BW's */
    for (int s = 0; s < 2; s++) {
        double b = cost[s * 4 + SP_TASK_B], w = cost[s * 4 + SP_TASK_W], f = cost[s * 4 + SP_TASK_BW];
        CHECK(fabs(b + w - f) <= 1e-9 * f, "stage %d: B + W %.9g, BW %.9g", s, b + w, f);
    }
    sp_program_free(p);
}

/* The step of `schedule` (2 actors, m microbatches) predicted from a profile of p with
 * `before` records ahead of its ops and `extra` after them. */
static double predict(const char *path, const sp_program *p, const char *schedule, int m,
                      const char *before, const char *extra)
{
    write_profile(path, p, before, extra);
    sp_status st;
    sp_profile *pf = sp_profile_read(path, &st);
    if (!pf) MUST(st);
    sp_schedule *sch;
    MUST(sp_schedule_from_env(schedule, 2, m, 0, &sch));
    sp_plan *plan;
    MUST(sp_plan_build(sp_program_stage_model(p), sch, &plan));
    sp_prediction pr;
    MUST(sp_profile_predict(pf, p, plan, 1, 0, &pr));
    double t = pr.step_s;
    sp_prediction_free(&pr);
    sp_plan_free(plan);
    sp_schedule_free(sch);
    sp_profile_free(pf);
    return t;
}

/* The mean reuse factors of `schedule`'s tasks (2 actors, m microbatches) on caches whose
 * probe costs 1 up to `edge` bytes and 3 beyond. */
static void reuse_of(const sp_program *p, const char *schedule, int m, double edge, double *mean)
{
    sp_profile *pf = sp_profile_create();
    if (!pf) exit(1);
    MUST(sp_profile_add_cache(pf, edge, 1e-11));
    MUST(sp_profile_add_cache(pf, edge * 1.0001, 3e-11));
    sp_schedule *sch;
    MUST(sp_schedule_from_env(schedule, 2, m, 0, &sch));
    sp_plan *plan;
    MUST(sp_plan_build(sp_program_stage_model(p), sch, &plan));
    MUST(sp_profile_reuse(pf, plan, sp_program_stage_model(p), mean));
    sp_plan_free(plan);
    sp_schedule_free(sch);
    sp_profile_free(pf);
}

static void check_caches(const char *path, const sp_program *p)
{
    double keep = r_rest;
    r_rest = 2e-8; /* the memory-bound ops a good part of the step */
    const char *flat = "cache bytes=1000 seconds_per_byte=1e-11\n"
                       "cache bytes=1000000000 seconds_per_byte=1e-11\n";
    /* a flat probe: every factor 1, the prediction without a probe */
    for (int g = 0; g < 2; g++) {
        const char *sched = g ? "gpipe" : "1f1b";
        double none = predict(path, p, sched, 8, NULL, NULL);
        double with = predict(path, p, sched, 8, NULL, flat);
        CHECK(fabs(with - none) <= 1e-9 * none, "%s: a flat cache probe moved the step %.9g "
              "-> %.9g", sched, none, with);
    }
    /* a profile's reuse factors come out of its memory-bound ops: factor 2 at rate r
     * predicts what rate r / 2 does */
    char before[512] = "";
    for (int st = 0; st < 2; st++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++)
            snprintf(before + strlen(before), sizeof before - strlen(before),
                     "reuse stage=%d kind=%s factor=2\n", st, sp_task_kind_name(k));
    double twice = predict(path, p, "1f1b", 4, before, flat);
    r_rest = 1e-8;
    double half = predict(path, p, "1f1b", 4, NULL, flat);
    r_rest = 2e-8;
    double raw = predict(path, p, "1f1b", 4, NULL, flat);
    /* (the tied embedding's combine keeps its measured time: 1.2% of the difference, now
     * that the bias adds ride on the products and the adds' copies are aliases) */
    CHECK(fabs(twice - half) <= 0.02 * (raw - half) && raw > half * 1.05, "reuse factor 2: "
          "step %.9g, the ops at half their time %.9g (at their time %.9g)", twice, half, raw);
    /* where everything fits, every factor 1; where nothing does, 3 (the bytes' weights
     * sum to one); GPipe's backward reaches further back than 1F1B's */
    double m1[2 * SP_NUM_TASK_KINDS], m2[2 * SP_NUM_TASK_KINDS], m3[2 * SP_NUM_TASK_KINDS];
    reuse_of(p, "gpipe", 8, 1e12, m1);
    reuse_of(p, "gpipe", 8, 1, m2);
    for (int k = 0; k < 2 * SP_NUM_TASK_KINDS; k++) /* (GPipe runs F and BW tasks) */
        CHECK((k % 4 != SP_TASK_F && k % 4 != SP_TASK_BW) ||
                  (fabs(m1[k] - 1) < 1e-9 && fabs(m2[k] - 3) < 1e-9),
              "stage %d %s: factors %.9g (all in cache), %.9g (none)", k / 4,
              sp_task_kind_name(k % 4), m1[k], m2[k]);
    /* an edge between one microbatch's buffers and eight's */
    size_t act = sp_program_buf_bytes(p, SP_BUF_ACT, 0);
    reuse_of(p, "gpipe", 8, 3.0 * (double)act, m1);
    reuse_of(p, "1f1b", 8, 3.0 * (double)act, m3);
    CHECK(m1[SP_TASK_BW] > m3[SP_TASK_BW] + 0.2, "stage 0's backward: reuse factor %.4f under "
          "GPipe, %.4f under 1F1B", m1[SP_TASK_BW], m3[SP_TASK_BW]);
    r_rest = keep;
}

static void check_refused(const char *path, const char *body, sp_status want, const char *msg)
{
    FILE *f = fopen(path, "w");
    if (!f) exit(1);
    fputs(body, f);
    fclose(f);
    sp_status st = SP_OK;
    sp_profile *pf = sp_profile_read(path, &st);
    CHECK(!pf && st == want, "'%s' read (status %d)", body, (int)st);
    CHECK(strstr(sp_last_error(), msg) != NULL, "message '%s' lacks '%s'", sp_last_error(), msg);
    sp_profile_free(pf);
}

int main(void)
{
    char path[] = "/tmp/test_calibrate_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 1;
    close(fd);

    /* the profile of batch 2, read back, predicts batch 2 and batch 4 by closed form */
    sp_program *p = gpt(2, 2);
    write_profile(path, p, NULL, NULL);
    sp_status st;
    sp_profile *pf = sp_profile_read(path, &st);
    if (!pf) MUST(st);
    check_costs(pf, 2);
    check_costs(pf, 4);

    /* the step: the plan simulated with these costs, plus the update and the rest */
    sp_schedule *sch;
    MUST(sp_schedule_from_env("1f1b", 2, 4, 0, &sch));
    sp_plan *plan;
    MUST(sp_plan_build(sp_program_stage_model(p), sch, &plan));
    sp_prediction pr;
    MUST(sp_profile_predict(pf, p, plan, 1, 0, &pr));
    double floats0 = (double)sp_program_buf_bytes(p, SP_BUF_PARAMS, 0) / 4;
    double floats1 = (double)sp_program_buf_bytes(p, SP_BUF_PARAMS, 1) / 4;
    double upd = 1e-6 * (floats0 > floats1 ? floats0 : floats1);
    CHECK(fabs(pr.update_s - upd) <= 1e-12, "update %.9g, want %.9g", pr.update_s, upd);
    CHECK(fabs(pr.other_s - 0.002) <= 1e-12, "other %.9g", pr.other_s);
    CHECK(fabs(pr.step_s - (pr.span_s + pr.update_s + pr.other_s)) <= 1e-12, "step %.9g",
          pr.step_s);
    /* the link: 10 us at 4 KB, 30 us at 64 KB: 8.7 us + bytes at 3.07 GB/s */
    CHECK(fabs(pr.bandwidth - 61440 / 20e-6) <= 1, "bandwidth %.6g", pr.bandwidth);
    CHECK(fabs(pr.latency - (10e-6 - 4096 / pr.bandwidth)) <= 1e-12, "latency %.6g",
          pr.latency);
    /* 1F1B over 2 stages, 4 microbatches: at least F0 + 4 (F1 + BW1) + BW0, at most that
     * with every message on the path */
    double lo = closed(2, 2, 0, 0) + 4 * (closed(2, 1, 1, 0) + closed(2, 1, 1, 1)) +
                closed(2, 2, 0, 1), hi = lo;
    for (int a = 0; a < plan->nactors; a++)
        for (int i = 0; i < plan->ninstr[a]; i++)
            if (plan->instr[a][i].op == SP_OP_SEND)
                hi += pr.latency + (double)plan->instr[a][i].bytes / pr.bandwidth;
    CHECK(pr.span_s >= lo && pr.span_s <= hi, "span %.6g, not in [%.6g, %.6g]", pr.span_s, lo,
          hi);
    sp_prediction_free(&pr);
    sp_plan_free(plan);
    sp_schedule_free(sch);
    sp_profile_free(pf);

    /* a tensor group's all-reduce that no op measured: the link probe's time */
    write_profile(path, p, NULL, "link kind=allreduce ranks=2 bytes=1000 seconds=0.001\n"
                           "link kind=allreduce ranks=2 bytes=3000 seconds=0.003\n");
    MUST(((pf = sp_profile_read(path, &st)) != NULL) ? SP_OK : st);
    sp_profile_free(pf);

    check_caches(path, p);

    /* bad files */
    check_refused(path, "hello\n", SP_ERR_FORMAT, ":1: not a starpipe profile");
    check_refused(path, "", SP_ERR_FORMAT, "empty, not a starpipe profile");
    check_refused(path, "starpipe-profile 2\n", SP_ERR_FORMAT, ":1: not a starpipe profile");
    check_refused(path, "starpipe-profile 1\nstep seconds=1 span=1 update=0 other=0\n"
                        "op kernel=matmul n=1,2,3 flag=0,0 half=0 work=12\n",
                  SP_ERR_FORMAT, ":3: an op needs");
    check_refused(path, "starpipe-profile 1\nstep seconds=1 span=1 update=0\n", SP_ERR_FORMAT,
                  ":2: a step needs");
    check_refused(path, "starpipe-profile 1\nop kernel=add n=4 flag=0,0 half=0 work=12 "
                        "seconds=1e-6\n", SP_ERR_FORMAT, "no step record");
    check_refused(path, "starpipe-profile 1\nstep seconds=1 span=1 update=0 other=0\n"
                        "message bytes=-4 seconds=1\n", SP_ERR_FORMAT, ":3: a message needs");
    check_refused(path, "starpipe-profile 1\nstep seconds=1 span=1 update=0 other=0\n"
                        "op kernel=add n=4 flag=0,0 half=0 work=1 seconds=1\n"
                        "link bytes=100 seconds=1\nlink bytes=10 seconds=1\n",
                  SP_ERR_FORMAT, ":5: link sizes must ascend");
    check_refused(path, "starpipe-profile 1\nstep seconds=1 span=1 update=0 other=0\n"
                        "cache bytes=0 seconds_per_byte=1e-11\n",
                  SP_ERR_FORMAT, ":3: a cache record needs");
    check_refused(path, "starpipe-profile 1\nstep seconds=1 span=1 update=0 other=0\n"
                        "cache bytes=2000 seconds_per_byte=1e-11\n"
                        "cache bytes=1000 seconds_per_byte=1e-11\n",
                  SP_ERR_FORMAT, ":4: the cache probe's sizes must ascend");
    check_refused(path, "starpipe-profile 1\nstep seconds=1 span=1 update=0 other=0\n"
                        "reuse stage=0 kind=F factor=0.5\n",
                  SP_ERR_FORMAT, ":3: a reuse record needs");
    check_refused(path, "starpipe-profile 1\nstep seconds=1 span=1 update=0 other=0\n"
                        "reuse stage=0 kind=X factor=2\n",
                  SP_ERR_FORMAT, ":3: a reuse record needs");
    unlink(path);
    pf = sp_profile_read("/nonexistent/profile", &st);
    CHECK(!pf && st == SP_ERR_IO && strstr(sp_last_error(), "/nonexistent/profile: cannot open"),
          "a missing file: status %d, '%s'", (int)st, sp_last_error());
    sp_program_free(p);
    for (int i = 0; i < ngraphs; i++) sp_graph_free(graphs[i]);
    return test_done("test_calibrate");
}
