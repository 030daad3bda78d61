/* Tensor parallelism in the planner: the group's all-reduce time against its alpha-beta
 * closed form, the GPT stage model's per-rank sizes, costs and all-reduce volumes at
 * T = 1..4 against the formulas of stages.h (and GPT-3 175B's numbers written out), and
 * the simulator adding the collectives to the tasks (recomputation runs F's again). */
#include <math.h>
#include <string.h>

#include "test_util.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-12 * (fabs(a) + fabs(b)) + 1e-15; }

static void link_time(void)
{
    sp_tensor_link l = { .tensor = 8, .alpha = 1e-6, .bw = 450e9 };
    /* four all-reduces of 1e8 bytes each: 4 x 2 x 7 alpha + 2 x 7/8 x 4e8 / bw */
    double want = 4 * 14 * 1e-6 + 2.0 * 7 / 8 * 4e8 / 450e9;
    CHECK(near(sp_tensor_allreduce_time(&l, 4, 4e8), want), "T 8: %.17g, want %.17g",
          sp_tensor_allreduce_time(&l, 4, 4e8), want);
    /* one of them is sp_allreduce_time's ring of T ranks inside a node */
    sp_allreduce_model ring = { .replicas = 8, .alpha = 1e-6, .bw_intra = 450e9,
                                .bw_inter = 1, .replicas_per_node = 8 };
    CHECK(near(sp_tensor_allreduce_time(&l, 1, 1e8), sp_allreduce_time(&ring, 1e8)),
          "one all-reduce %g, the ring %g", sp_tensor_allreduce_time(&l, 1, 1e8),
          sp_allreduce_time(&ring, 1e8));
    l.tensor = 3;
    want = 2 * 2 * 2 * 1e-6 + 2.0 * 2 / 3 * 6e6 / 450e9;
    CHECK(near(sp_tensor_allreduce_time(&l, 2, 6e6), want), "T 3: %g, want %g",
          sp_tensor_allreduce_time(&l, 2, 6e6), want);
    l.bw = 0; /* infinite bandwidth: latency alone */
    CHECK(near(sp_tensor_allreduce_time(&l, 5, 1e9), 5 * 4 * 1e-6), "latency only");
    l.tensor = 1;
    CHECK(sp_tensor_allreduce_time(&l, 4, 4e8) == 0, "T 1 costs nothing");
    l.tensor = 4;
    CHECK(sp_tensor_allreduce_time(&l, 0, 4e8) == 0, "no all-reduce costs nothing");
    CHECK(sp_tensor_allreduce_time(NULL, 4, 4e8) == 0, "no link costs nothing");
}

/* The GPT's stages at T: awkward sizes on purpose (8 blocks on 3 stages: 3, 3, 2; a
 * vocabulary of 97, padded to 128 T as the apps pad it). */
static void gpt_model(void)
{
    const int L = 8, C = 48, ctx = 16, V = 97, batch = 2, S = 3;
    const double N = (double)batch * ctx, eb = 2;
    sp_gpt_shape g = { .layers = L, .channels = C, .context = ctx, .vocab = V, .batch = batch,
                       .device_flops = 1e12, .elem_bytes = 2 };
    sp_stage_model *one = sp_stage_model_gpt(&g, S);
    CHECK(one != NULL, "T 1 model");
    for (int T = 1; T <= 4 && one; T++) {
        g.tensor = T;
        sp_stage_model *m = sp_stage_model_gpt(&g, S);
        CHECK(m != NULL, "T %d model", T);
        if (!m) continue;
        const double Vp = (double)sp_padded_vocab(V, SP_VOCAB_PAD, T);
        const double V1 = (double)sp_padded_vocab(V, SP_VOCAB_PAD, 1);
        CHECK(Vp == 128.0 * T, "T %d: the vocabulary of 97 padded to %.0f", T, Vp);
        for (int s = 0; s < S; s++) {
            const sp_stage_info *st = &m->stage[s], *o = &one->stage[s];
            int nl = s < 2 ? 3 : 2, first = s == 0, last = s == S - 1;
            /* a rank's part: split weights, qkv and fc biases, wte and the head; the rest whole */
            double params = nl * ((12.0 * C * C + 7.0 * C) / T + 6.0 * C) +
                            first * (Vp * C / T + (double)ctx * C) +
                            last * (Vp * C / T + 2.0 * C);
            CHECK(st->param_bytes == (size_t)(4 * params), "T %d stage %d params %zu, want %.0f",
                  T, s, st->param_bytes, 4 * params);
            CHECK(st->opt_bytes == 2 * st->param_bytes, "T %d stage %d AdamW", T, s);
            double acts = nl * (10 + 24.0 / T) * N * C * eb / 2;
            CHECK(st->act_bytes == (size_t)acts, "T %d stage %d acts %zu, want %.0f", T, s,
                  st->act_bytes, acts);
            for (int k = 0; k < SP_NUM_TASK_KINDS; k++) { /* T = 1's over T, the head's 2 N C V
                                                           * per F, B, W at this T's padding */
                const double head = (k == SP_TASK_BW ? 2 : 1) * 2 * N * C / 1e12;
                const double want = (o->cost[k] - last * head * V1 + last * head * Vp) / T;
                CHECK(near(st->cost[k], want), "T %d stage %d %s cost %g, want %g", T, s,
                      sp_task_kind_name((sp_task_kind)k), st->cost[k], want);
            }
            /* per block two (N, C) all-reduces in F and two in B; embedding +1 F, head +1 B,
             * the cross-entropy three of N floats in F; none at T = 1 */
            int nf = T > 1 ? 2 * nl + first + 3 * last : 0, nb = T > 1 ? 2 * nl + last : 0;
            double bf = T > 1 ? (2 * nl + first) * N * C * eb + last * 3 * N * 4 : 0;
            double bb = T > 1 ? (2 * nl + last) * N * C * eb : 0;
            CHECK(st->tp_allreduces[SP_TASK_F] == nf && near(st->tp_bytes[SP_TASK_F], bf),
                  "T %d stage %d F: %d all-reduces of %g bytes, want %d of %g", T, s,
                  st->tp_allreduces[SP_TASK_F], st->tp_bytes[SP_TASK_F], nf, bf);
            CHECK(st->tp_allreduces[SP_TASK_B] == nb && near(st->tp_bytes[SP_TASK_B], bb) &&
                      st->tp_allreduces[SP_TASK_BW] == nb && near(st->tp_bytes[SP_TASK_BW], bb),
                  "T %d stage %d B/BW: %d of %g, want %d of %g", T, s,
                  st->tp_allreduces[SP_TASK_B], st->tp_bytes[SP_TASK_B], nb, bb);
            CHECK(st->tp_allreduces[SP_TASK_W] == 0 && st->tp_bytes[SP_TASK_W] == 0,
                  "T %d stage %d: W has no all-reduce", T, s);
        }
        for (int e = 0; e < m->nedges; e++)
            CHECK(m->edge[e].bytes == (size_t)(N * C * eb), "T %d: the boundary is whole", T);
        sp_stage_model_free(m);
    }
    g.tensor = 5; /* 5 does not divide 48 channels */
    CHECK(sp_stage_model_gpt(&g, S) == NULL, "T 5 of 48 channels accepted");
    sp_stage_model_free(one);

    /* GPT-3 175B, 16 stages, T = 8, one sequence: stage 1's six blocks, numbers written out */
    sp_gpt_shape g3 = { .layers = 96, .channels = 12288, .context = 2048, .vocab = 50257,
                        .batch = 1, .device_flops = 1e15, .elem_bytes = 2, .tensor = 8 };
    sp_stage_model *m = sp_stage_model_gpt(&g3, 16);
    CHECK(m != NULL, "GPT-3 175B at T 8");
    if (m) {
        const sp_stage_info *st = &m->stage[1];
        CHECK(st->tp_allreduces[SP_TASK_F] == 12 && st->tp_bytes[SP_TASK_F] == 603979776.0,
              "175B F: %d all-reduces, %.0f bytes", st->tp_allreduces[SP_TASK_F],
              st->tp_bytes[SP_TASK_F]);
        CHECK(st->tp_bytes[SP_TASK_B] == 603979776.0, "175B B: %.0f", st->tp_bytes[SP_TASK_B]);
        CHECK(st->param_bytes == 5437845504u, "175B stage 1 params %zu", st->param_bytes);
        CHECK(st->act_bytes == 1962934272u, "175B stage 1 activations %zu", st->act_bytes);
        sp_stage_model_free(m);
    }
}

static void simulated(void)
{
    const int M = 4;
    sp_tensor_link l = { .tensor = 4, .alpha = 0.01, .bw = 100 };
    /* one actor: the step is M x (F + tpF + BW + tpB) */
    sp_stage_model *m = sp_stage_model_chain(1, 1.0, 2.0, 1.5, 8);
    m->stage[0].tp_allreduces[SP_TASK_F] = 2, m->stage[0].tp_bytes[SP_TASK_F] = 40;
    m->stage[0].tp_allreduces[SP_TASK_B] = m->stage[0].tp_allreduces[SP_TASK_BW] = 3;
    m->stage[0].tp_bytes[SP_TASK_B] = m->stage[0].tp_bytes[SP_TASK_BW] = 60;
    double tf = 2 * 2 * 3 * 0.01 + 2.0 * 3 / 4 * 40 / 100, tb = 3 * 2 * 3 * 0.01 + 2.0 * 3 / 4 * 60 / 100;
    sp_schedule *sch;
    sp_plan *plan;
    sp_sim_result *r;
    MUST(sp_schedule_builtin("gpipe", 1, M, 1, &sch));
    MUST(sp_plan_build(m, sch, &plan));
    MUST(sp_simulate(plan, m, &(sp_sim_config){ .tensor = &l }, &r));
    double want = M * (1.0 + tf + 3.5 + tb);
    CHECK(near(r->step_time, want), "one actor: step %g, want %g", r->step_time, want);
    CHECK(near(r->tp_busy[0], M * (tf + tb)) && near(r->tp_time, M * (tf + tb)),
          "tp time %g, want %g", r->tp_time, M * (tf + tb));
    sp_sim_result_free(r);
    MUST(sp_simulate(plan, m, &(sp_sim_config){ 0 }, &r)); /* no link: no time */
    CHECK(near(r->step_time, M * 4.5) && r->tp_time == 0, "no link: step %g", r->step_time);
    sp_sim_result_free(r);
    sp_plan_free(plan);
    /* recomputation: the first backward runs F again, its all-reduces too */
    m->stage[0].recompute = 1;
    MUST(sp_plan_build(m, sch, &plan));
    MUST(sp_simulate(plan, m, &(sp_sim_config){ .tensor = &l }, &r));
    want = M * (2 * (1.0 + tf) + 3.5 + tb);
    CHECK(near(r->step_time, want), "recompute: step %g, want %g", r->step_time, want);
    CHECK(near(r->tp_time, M * (2 * tf + tb)), "recompute: tp %g", r->tp_time);
    sp_sim_result_free(r);
    sp_plan_free(plan);
    sp_schedule_free(sch);
    sp_stage_model_free(m);

    /* a pipeline: the same as the tasks made longer by hand, for schedules with B and W
     * apart and fused */
    const char *names[] = { "1f1b", "zb-h1", "interleaved-1f1b" };
    for (int k = 0; k < 3; k++) {
        int v = k == 2 ? 2 : 1;
        MUST(sp_schedule_builtin(names[k], 3, 6, v, &sch));
        sp_stage_model *a = sp_stage_model_chain(sch->nstages, 1.0, 1.2, 0.8, 8);
        sp_stage_model *b = sp_stage_model_chain(sch->nstages, 1.0, 1.2, 0.8, 8);
        for (int s = 0; s < sch->nstages; s++) {
            for (int q = 0; q < SP_NUM_TASK_KINDS; q++) {
                a->stage[s].tp_allreduces[q] = q == SP_TASK_W ? 0 : 2 + s;
                a->stage[s].tp_bytes[q] = q == SP_TASK_W ? 0 : 10.0 * (s + 1);
                b->stage[s].cost[q] += sp_tensor_allreduce_time(&l, a->stage[s].tp_allreduces[q],
                                                                a->stage[s].tp_bytes[q]);
            }
        }
        sp_sim_result *ra, *rb;
        MUST(sp_plan_build(a, sch, &plan));
        MUST(sp_simulate(plan, a, &(sp_sim_config){ .tensor = &l }, &ra));
        MUST(sp_simulate(plan, b, &(sp_sim_config){ 0 }, &rb));
        CHECK(near(ra->step_time, rb->step_time), "%s: step %g with the link, %g by hand",
              names[k], ra->step_time, rb->step_time);
        sp_sim_result_free(ra), sp_sim_result_free(rb);
        /* a bad link is refused */
        sp_tensor_link bad = { .tensor = 2, .alpha = -1, .bw = 1 };
        CHECK(sp_simulate(plan, a, &(sp_sim_config){ .tensor = &bad }, &ra) == SP_ERR_ARG,
              "a negative latency accepted");
        sp_plan_free(plan);
        sp_schedule_free(sch);
        sp_stage_model_free(a), sp_stage_model_free(b);
    }
}

int main(void)
{
    link_time();
    gpt_model();
    simulated();
    if (sp_test_failures) return 1;
    printf("ok: tensor-parallel all-reduce costs, the GPT's split stages, simulated groups\n");
    return 0;
}
