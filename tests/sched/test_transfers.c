/* Transfers, buffers and shared weights in plans: skip connections across actors, local
 * edges of stages on one actor, the per-step versus per-microbatch shared-weight combine,
 * SEND right after its producer, FREE after last use; a corrupted plan is refused by
 * sp_plan_check and by the simulator (an error, never a hang); link costs, scatter-gathered
 * too; the trace and
 * SVG outputs. */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

static int count(const sp_plan *pl, int op, int cls)
{
    int n = 0;
    for (int a = 0; a < pl->nactors; a++)
        for (int j = 0; j < pl->ninstr[a]; j++)
            n += pl->instr[a][j].op == op && (cls < 0 || pl->instr[a][j].buf.cls == cls);
    return n;
}

static int writes(const sp_plan *pl, const sp_instr *in, sp_buf b)
{
    for (uint32_t q = 0; q < in->nacc; q++) {
        const sp_access *x = &pl->access[in->acc + q];
        if ((x->mode & SP_ACCESS_W) && !memcmp(&x->buf, &b, sizeof b)) return 1;
    }
    return 0;
}

static int touches(const sp_plan *pl, const sp_instr *in, sp_buf b)
{
    if (in->op == SP_OP_SEND || in->op == SP_OP_RECV || in->op == SP_OP_FREE)
        return !memcmp(&in->buf, &b, sizeof b);
    for (uint32_t q = 0; q < in->nacc; q++)
        if (!memcmp(&pl->access[in->acc + q].buf, &b, sizeof b)) return 1;
    return 0;
}

/* Structural properties every plan must have, checked from its instructions. */
static void check_shape(const sp_plan *pl, const char *what)
{
    MUST(sp_plan_check(pl));
    for (int a = 0; a < pl->nactors; a++) {
        const sp_instr *v = pl->instr[a];
        for (int j = 0; j < pl->ninstr[a]; j++) {
            if (v[j].op == SP_OP_SEND) {
                /* right after its producer: only other messages and FREEs in between (a
                 * RECV earlier in the global order must come first, or rendezvous channels
                 * criss-cross: docs/planner.md) */
                int k = j - 1;
                while (k >= 0 && (v[k].op == SP_OP_SEND || v[k].op == SP_OP_FREE
                                  || (v[k].op == SP_OP_RECV && v[k].seq < v[j].seq)))
                    k--;
                char s1[160];
                CHECK(k >= 0 && writes(pl, &v[k], v[j].buf), "%s actor %d: %s is not right "
                      "after its producer", what, a, sp_instr_format(&v[j], s1, sizeof s1));
            }
            if (v[j].op == SP_OP_FREE)
                for (int k = j + 1; k < pl->ninstr[a]; k++) {
                    char s1[160];
                    CHECK(!touches(pl, &v[k], v[j].buf), "%s actor %d: buffer used after %s",
                          what, a, sp_instr_format(&v[j], s1, sizeof s1));
                }
        }
    }
}

static sp_plan *plan_of(const sp_stage_model *md, const char *name, int p, int m, int v)
{
    sp_schedule *s;
    sp_plan *pl;
    MUST(sp_schedule_builtin(name, p, m, v, &s));
    MUST(sp_plan_build(md, s, &pl));
    sp_schedule_free(s);
    sp_sim_result *r;
    sp_sim_config cfg = { .rendezvous = 1, .latency = 0.1 };
    MUST(sp_simulate(pl, md, &cfg, &r));
    sp_sim_result_free(r);
    check_shape(pl, name);
    return pl;
}

static void add_shared(sp_stage_model *md, int single_use, int n, const int *stages)
{
    md->shared = realloc(md->shared, (size_t)(md->nshared + 1) * sizeof *md->shared);
    sp_stage_shared *sh = &md->shared[md->nshared++];
    memset(sh, 0, sizeof *sh);
    sh->bytes = 1000;
    sh->single_use = single_use;
    sh->nstages = n;
    memcpy(sh->stages, stages, (size_t)n * sizeof *stages);
}

int main(void)
{
    const int m = 6;
    /* 1. Tied weight on stages 0 and 3 of a 4-actor 1F1B. Single use: accumulate per
     * stage through the loop, one transfer each way per step. */
    for (int single = 1; single >= 0; single--) {
        sp_stage_model *md = sp_stage_model_chain(4, 1, 1, 1, 64);
        add_shared(md, single, 2, (int[]){ 0, 3 });
        sp_plan *pl = plan_of(md, "1f1b", 4, m, 0);
        int grads = count(pl, SP_OP_SEND, SP_BUF_SHARED_GRAD);
        int params = count(pl, SP_OP_SEND, SP_BUF_SHARED_PARAM);
        int comb = count(pl, SP_OP_COMBINE, -1);
        CHECK(pl->shared_deferred[0] == single, "deferred flag");
        CHECK(grads == (single ? 1 : m) && comb == (single ? 1 : m) && params == 1,
              "single_use=%d: %d gradient sends, %d combines, %d parameter sends", single, grads,
              comb, params);
        /* On the owner: COMBINE(s) before OPTIMIZER(0); the optimizer sends the parameter. */
        int last_comb = -1, opt = -1;
        for (int j = 0; j < pl->ninstr[0]; j++) {
            if (pl->instr[0][j].op == SP_OP_COMBINE) last_comb = j;
            if (pl->instr[0][j].op == SP_OP_OPTIMIZER && pl->instr[0][j].stage == 0) opt = j;
        }
        CHECK(last_comb >= 0 && opt > last_comb, "optimizer of the owner after its combine");
        sp_plan_free(pl);
        sp_stage_model_free(md);
    }
    /* V placement: stages 0 and 7 share actor 0, so the tie costs no transfer at all. */
    {
        sp_stage_model *md = sp_stage_model_chain(8, 1, 1, 1, 64);
        add_shared(md, 1, 2, (int[]){ 0, 7 });
        sp_plan *pl = plan_of(md, "zb-v", 4, m, 2);
        CHECK(count(pl, SP_OP_SEND, SP_BUF_SHARED_GRAD) == 0
                  && count(pl, SP_OP_SEND, SP_BUF_SHARED_PARAM) == 0
                  && count(pl, SP_OP_COMBINE, -1) == 1, "V-shaped tie is local");
        sp_plan_free(pl);
        sp_stage_model_free(md);
    }
    /* Three stages; the combine adds partials in ascending stage order. */
    {
        sp_stage_model *md = sp_stage_model_chain(4, 1, 1, 1, 64);
        add_shared(md, 0, 3, (int[]){ 0, 2, 3 });
        sp_plan *pl = plan_of(md, "gpipe", 4, m, 0);
        CHECK(count(pl, SP_OP_SEND, SP_BUF_SHARED_GRAD) == 2 * m
                  && count(pl, SP_OP_SEND, SP_BUF_SHARED_PARAM) == 2, "three-stage tie");
        for (int j = 0; j < pl->ninstr[0]; j++) {
            const sp_instr *in = &pl->instr[0][j];
            if (in->op != SP_OP_COMBINE) continue;
            int prev = -1, ok = 1;
            for (uint32_t q = 0; q < in->nacc; q++) {
                const sp_access *x = &pl->access[in->acc + q];
                if (x->mode != SP_ACCESS_R) continue;
                ok &= x->buf.cls == SP_BUF_SHARED_GRAD && x->buf.stage > prev
                      && x->buf.mb == in->task.mb;
                prev = x->buf.stage;
            }
            CHECK(ok && prev == 3, "combine reads partials in ascending stage order");
        }
        sp_plan_free(pl);
        sp_stage_model_free(md);
    }

    /* 2. Skip connections: 0 -> 2 with a gradient, 1 -> 3 without. */
    {
        sp_stage_model *md = sp_stage_model_chain(4, 1, 1, 1, 64);
        md->edge = realloc(md->edge, 5 * sizeof *md->edge);
        md->edge[3] = (sp_stage_edge){ 0, 2, 32, 1 };
        md->edge[4] = (sp_stage_edge){ 1, 3, 16, 0 };
        md->nedges = 5;
        sp_plan *pl = plan_of(md, "zb-h1", 4, m, 0);
        int fwd[5] = { 0 }, grd[5] = { 0 };
        for (int a = 0; a < 4; a++)
            for (int j = 0; j < pl->ninstr[a]; j++) {
                const sp_instr *in = &pl->instr[a][j];
                if (in->op == SP_OP_SEND && in->buf.cls == SP_BUF_EDGE_FWD) fwd[in->buf.idx]++;
                if (in->op == SP_OP_SEND && in->buf.cls == SP_BUF_EDGE_GRAD) grd[in->buf.idx]++;
                if (in->op == SP_OP_SEND && in->buf.idx == 3)
                    CHECK(in->bytes == 32, "skip edge bytes %zu", in->bytes);
            }
        for (int e = 0; e < 5; e++)
            CHECK(fwd[e] == m && grd[e] == (e == 4 ? 0 : m), "edge %d: %d fwd %d grad sends", e,
                  fwd[e], grd[e]);
        /* B of stage 0 reads the gradients of both outgoing edges; W of stage 2 reads both
         * of its incoming tensors. */
        for (int a = 0; a < 4; a++)
            for (int j = 0; j < pl->ninstr[a]; j++) {
                const sp_instr *in = &pl->instr[a][j];
                if (in->op != SP_OP_RUN) continue;
                int i = in->task.mb;
                if (in->task.stage == 0 && in->task.kind != SP_TASK_F
                    && in->task.kind != SP_TASK_W)
                    CHECK(touches(pl, in, (sp_buf){ SP_BUF_EDGE_GRAD, 0, i, -1 })
                              && touches(pl, in, (sp_buf){ SP_BUF_EDGE_GRAD, 3, i, -1 })
                              && touches(pl, in, (sp_buf){ SP_BUF_ACT, 0, i, -1 }),
                          "B(%d,0) accesses", i);
                if (in->task.stage == 2 && in->task.kind == SP_TASK_W)
                    CHECK(touches(pl, in, (sp_buf){ SP_BUF_EDGE_FWD, 1, i, -1 })
                              && touches(pl, in, (sp_buf){ SP_BUF_EDGE_FWD, 3, i, -1 })
                              && touches(pl, in, (sp_buf){ SP_BUF_BGRAD, 2, i, -1 })
                              && touches(pl, in, (sp_buf){ SP_BUF_ACT, 2, i, -1 }),
                          "W(%d,2) accesses", i);
            }
        sp_plan_free(pl);
        sp_stage_model_free(md);
    }

    /* 3. Stages on one actor exchange locally: in ZB-V, stages p-1 and p share an actor. */
    {
        sp_stage_model *md = sp_stage_model_chain(6, 1, 1, 1, 64);
        sp_plan *pl = plan_of(md, "zb-v", 3, m, 2);
        int sends_e2 = 0, frees_e2 = 0, writes_e2 = 0;
        for (int a = 0; a < 3; a++)
            for (int j = 0; j < pl->ninstr[a]; j++) {
                const sp_instr *in = &pl->instr[a][j];
                if (in->op == SP_OP_SEND && in->buf.idx == 2) sends_e2++;
                if (in->op == SP_OP_FREE && in->buf.cls == SP_BUF_EDGE_FWD && in->buf.idx == 2)
                    frees_e2++;
                if (in->op == SP_OP_RUN
                    && writes(pl, in, (sp_buf){ SP_BUF_EDGE_FWD, 2, in->task.mb, -1 })) {
                    writes_e2++;
                    CHECK(a == 2, "edge 2 written on actor %d", a);
                }
            }
        CHECK(sends_e2 == 0 && frees_e2 == m && writes_e2 == m, "local edge: %d sends, %d frees, "
              "%d writes", sends_e2, frees_e2, writes_e2);
        sp_plan_free(pl);
        sp_stage_model_free(md);
    }

    /* 4. Link costs: 1F1B, p = 2, m = 1, F = 1, BW = 2, latency L, x = bytes / bandwidth:
     * F, message, F, BW, message, BW = 6 + 2 (L + x). FLOPs-derived costs scale it. */
    {
        sp_stage_model *md = sp_stage_model_chain(2, 1, 1, 1, 500);
        sp_schedule *s;
        sp_plan *pl;
        sp_sim_result *r;
        MUST(sp_schedule_builtin("1f1b", 2, 1, 0, &s));
        MUST(sp_plan_build(md, s, &pl));
        sp_sim_config cfg = { .latency = 0.5, .bandwidth = 1000 };
        MUST(sp_simulate(pl, md, &cfg, &r));
        CHECK(fabs(r->step_time - 8.0) < 1e-12, "step %g, want 8", r->step_time);
        sp_sim_result_free(r);
        /* scatter-gathered at T = 2: each message L + x / 2 on the link, then the group's
         * all-gather on the tensor link (alpha 0.25, 2000 bytes per unit): 0.25 + 250 /
         * 2000; 6 + 2 (0.5 + 0.25 + 0.375) = 8.25. Without the flag the tensor link adds
         * nothing to a chain (no all-reduces in its tasks). */
        sp_tensor_link tl = { .tensor = 2, .alpha = 0.25, .bw = 2000 };
        sp_sim_config sg = { .latency = 0.5, .bandwidth = 1000, .tensor = &tl };
        MUST(sp_simulate(pl, md, &sg, &r));
        CHECK(fabs(r->step_time - 8.0) < 1e-12, "T = 2 whole: step %g, want 8", r->step_time);
        sp_sim_result_free(r);
        sg.scatter_gather = 1;
        MUST(sp_simulate(pl, md, &sg, &r));
        CHECK(fabs(r->step_time - 8.25) < 1e-12, "scatter-gathered: step %g, want 8.25",
              r->step_time);
        sp_sim_result_free(r);
        double flops[2 * SP_NUM_TASK_KINDS];
        for (int q = 0; q < 2 * SP_NUM_TASK_KINDS; q++) flops[q] = (q % 4 == 3 ? 4e9 : 2e9);
        sp_sim_config fc = { .flops = flops, .device_flops = 1e9 };
        MUST(sp_simulate(pl, md, &fc, &r));
        CHECK(fabs(r->step_time - 12.0) < 1e-12, "flops step %g, want 12", r->step_time);

        /* 5. Outputs. */
        char tpath[] = "/tmp/sp_trace_XXXXXX", spath[] = "/tmp/sp_svg_XXXXXX";
        close(mkstemp(tpath));
        close(mkstemp(spath));
        MUST(sp_sim_write_trace(pl, r, tpath));
        MUST(sp_sim_write_svg(pl, r, spath));
        char text[8192] = { 0 };
        FILE *f = fopen(tpath, "r");
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = 0;
        CHECK(strstr(text, "\"traceEvents\"") && strstr(text, "\"ph\":\"X\"")
                  && strstr(text, "\"name\":\"BW mb0 s1\""), "trace content");
        f = fopen(spath, "r");
        n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = 0;
        int boxes = 0;
        for (char *c = text; (c = strstr(c, "<title>RUN")); c++) boxes++;
        CHECK(strstr(text, "<svg") && boxes == 4, "svg has %d task boxes", boxes);
        unlink(tpath), unlink(spath);
        sp_sim_result_free(r);
        sp_plan_free(pl);
        sp_schedule_free(s);
        sp_stage_model_free(md);
    }

    /* 6. Corrupted plans are refused, by the checker and by the simulator, with messages. */
    {
        sp_stage_model *md = sp_stage_model_chain(3, 1, 1, 1, 8);
        sp_plan *pl = plan_of(md, "1f1b", 3, 4, 0);
        sp_sim_result *r = NULL;
        sp_sim_config cfg = { 0 };
        /* Swap the first two RECVs of actor 1 (from different microbatches): the channel
         * order no longer agrees. */
        sp_instr *v = pl->instr[1];
        int r1 = -1, r2 = -1;
        for (int j = 0; j < pl->ninstr[1] && r2 < 0; j++)
            if (v[j].op == SP_OP_RECV && v[j].peer == 0) {
                if (r1 < 0) r1 = j;
                else r2 = j;
            }
        sp_instr t = v[r1];
        v[r1] = v[r2], v[r2] = t;
        CHECK(sp_plan_check(pl) == SP_ERR_SCHEDULE && sp_last_error()[0], "swapped recvs");
        CHECK(sp_simulate(pl, md, &cfg, &r) == SP_ERR_SCHEDULE
                  && strstr(sp_last_error(), "wrong message"), "sim: %s", sp_last_error());
        v[r2] = v[r1], v[r1] = t;
        MUST(sp_plan_check(pl));
        /* Drop a RECV: unmatched SEND; the simulator reports it instead of hanging. */
        sp_instr keep = v[r1];
        v[r1].op = SP_OP_FREE;
        CHECK(sp_plan_check(pl) == SP_ERR_SCHEDULE && strstr(sp_last_error(), "no matching"),
              "dropped recv: %s", sp_last_error());
        CHECK(sp_simulate(pl, md, &cfg, &r) == SP_ERR_SCHEDULE, "sim dropped recv");
        v[r1] = keep;
        /* Criss-cross: move actor 1's first SEND before its first RECV from actor 0. With
         * rendezvous channels both actors would wait for each other. */
        int s1 = -1;
        for (int j = 0; j < pl->ninstr[1] && s1 < 0; j++)
            if (v[j].op == SP_OP_SEND && v[j].peer == 0) s1 = j;
        sp_instr snd = v[s1];
        memmove(v + r1 + 1, v + r1, (size_t)(s1 - r1) * sizeof *v);
        v[r1] = snd;
        CHECK(sp_plan_check(pl) == SP_ERR_SCHEDULE, "criss-cross accepted");
        cfg.rendezvous = 1;
        CHECK(sp_simulate(pl, md, &cfg, &r) == SP_ERR_SCHEDULE
                  && strstr(sp_last_error(), "deadlock"), "rendezvous sim: %s", sp_last_error());
        sp_plan_free(pl);
        sp_stage_model_free(md);
    }
    return test_done("test_transfers");
}
