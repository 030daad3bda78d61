/* Replicas in the planner: the rank layout (both orders, a bijection, refusals), the
 * alpha-beta all-reduce cost against its closed forms, and the simulator's collectives:
 * each starts when its stage's last gradient task ends, runs beside compute, and the
 * optimizer waits for it; the exposed time is what they add to the step. */
#include <math.h>
#include <string.h>

#include "test_util.h"

static void layouts(void)
{
    for (int order = 0; order < 2; order++)
        for (int R = 1; R <= 4; R++)
            for (int P = 1; P <= 5; P++) {
                sp_layout l = { .replicas = R, .actors = P, .order = (sp_rank_order)order };
                char seen[64] = { 0 };
                for (int r = 0; r < R; r++)
                    for (int a = 0; a < P; a++) {
                        int k = sp_layout_rank(&l, r, a), rr, aa;
                        CHECK(k >= 0 && k < R * P && !seen[k], "order %d R %d P %d: rank %d",
                              order, R, P, k);
                        seen[k] = 1;
                        sp_layout_place(&l, k, &rr, &aa);
                        CHECK(rr == r && aa == a, "place(%d) = (%d, %d), want (%d, %d)", k, rr,
                              aa, r, a);
                    }
            }
    /* pipeline-major keeps a pipeline consecutive; replica-major a stage's replicas */
    sp_layout pm = { 2, 4, SP_RANK_ORDER_PIPELINE, 1 }, rm = { 2, 4, SP_RANK_ORDER_REPLICA, 1 };
    CHECK(sp_layout_rank(&pm, 1, 0) == 4 && sp_layout_rank(&rm, 1, 0) == 1, "orders");
    sp_layout l;
    CHECK(sp_layout_from_env(6, 3, 0, 0, NULL, &l) == SP_OK && l.actors == 2, "6 ranks, 3 replicas");
    CHECK(sp_layout_from_env(6, 4, 0, 0, NULL, &l) == SP_ERR_ARG &&
              strstr(sp_last_error(), "multiple of 4"), "6 ranks, 4 replicas: %s", sp_last_error());
    CHECK(sp_layout_from_env(6, 2, 2, 0, NULL, &l) == SP_ERR_ARG &&
              strstr(sp_last_error(), "need 4 MPI ranks"), "2 x 2 on 6: %s", sp_last_error());
    CHECK(sp_layout_from_env(4, 2, 0, 0, "ring", &l) == SP_ERR_ARG, "bad order accepted");
    CHECK(sp_layout_from_env(4, 2, 0, 0, "replica", &l) == SP_OK &&
              l.order == SP_RANK_ORDER_REPLICA, "replica order");
    /* tensor parallelism: an actor's T ranks consecutive, innermost, in both orders */
    for (int order = 0; order < 2; order++)
        for (int T = 1; T <= 3; T++) {
            sp_layout t = { .replicas = 2, .actors = 3, .order = (sp_rank_order)order, .tensor = T };
            char seen[64] = { 0 };
            for (int r = 0; r < 2; r++)
                for (int a = 0; a < 3; a++)
                    for (int q = 0; q < T; q++) {
                        int k = sp_layout_rank_t(&t, r, a, q), rr, aa, qq;
                        CHECK(k >= 0 && k < 6 * T && !seen[k], "T %d: rank %d twice", T, k);
                        seen[k] = 1;
                        CHECK(k == sp_layout_rank(&t, r, a) + q, "T %d: the group of (%d, %d) is "
                              "not consecutive", T, r, a);
                        sp_layout_place_t(&t, k, &rr, &aa, &qq);
                        CHECK(rr == r && aa == a && qq == q, "T %d: place(%d) = (%d, %d, %d)", T,
                              k, rr, aa, qq);
                    }
        }
    CHECK(sp_layout_from_env(8, 2, 0, 2, NULL, &l) == SP_OK && l.actors == 2 && l.tensor == 2,
          "8 ranks, 2 replicas, T = 2: %d actors", l.actors);
    CHECK(sp_layout_from_env(6, 1, 0, 4, NULL, &l) == SP_ERR_ARG &&
              strstr(sp_last_error(), "multiple of 4"), "T = 4 on 6 ranks: %s", sp_last_error());
    CHECK(sp_layout_from_env(8, 1, 2, 2, NULL, &l) == SP_ERR_ARG &&
              strstr(sp_last_error(), "need 4 MPI ranks"), "2 actors x T 2 on 8: %s",
          sp_last_error());
}

static void costs(void)
{
    const double B = 1e9;
    sp_allreduce_model m = { .replicas = 8, .alpha = 1e-5, .bw_intra = 400e9, .bw_inter = 40e9,
                             .replicas_per_node = 8 };
    /* all eight in one node: one ring at NVLink speed */
    double want = 2 * 7 * 1e-5 + 2.0 * 7 / 8 * B / 400e9;
    CHECK(fabs(sp_allreduce_time(&m, B) - want) < 1e-12, "ring in a node %g, want %g",
          sp_allreduce_time(&m, B), want);
    /* one per node: a ring over the network */
    m.replicas_per_node = 1;
    want = 2 * 7 * 1e-5 + 2.0 * 7 / 8 * B / 40e9;
    CHECK(fabs(sp_allreduce_time(&m, B) - want) < 1e-12, "ring across nodes");
    /* hierarchical, 2 nodes of 4: in-node reduce-scatter and all-gather, a 2-node ring of B/4 */
    m.replicas_per_node = 4;
    m.hierarchical = 1;
    want = 2 * 3 * 1e-5 + 2.0 * 3 / 4 * B / 400e9 + 2 * 1 * 1e-5 + 2.0 * 1 / 2 * (B / 4) / 40e9;
    CHECK(fabs(sp_allreduce_time(&m, B) - want) < 1e-12, "hierarchical %g, want %g",
          sp_allreduce_time(&m, B), want);
    m.hierarchical = 0; /* the flat ring crosses nodes: network speed */
    CHECK(sp_allreduce_time(&m, B) > want, "flat ring across nodes should be slower");
    m.replicas = 1;
    CHECK(sp_allreduce_time(&m, B) == 0, "one replica reduces nothing");
}

static void simulated(void)
{
    /* 1F1B, 2 actors, 4 microbatches, unit tasks; each stage holds 1000 bytes of
     * parameters, and an all-reduce takes 1000 / bw = D (alpha 0, R = 2: 2 x 1/2 x D) */
    sp_stage_model *model = sp_stage_model_chain(2, 1.0, 1.0, 1.0, 8);
    sp_schedule *sch;
    sp_plan *plan;
    MUST(sp_schedule_builtin("1f1b", 2, 4, 1, &sch));
    MUST(sp_plan_build(model, sch, &plan));
    for (int s = 0; s < 2; s++) model->stage[s].param_bytes = 1000;
    sp_sim_result *base, *with;
    MUST(sp_simulate(plan, model, &(sp_sim_config){ 0 }, &base));
    for (double D = 0.5; D <= 8; D *= 4) {
        sp_allreduce_model m = { .replicas = 2, .bw_intra = 1000 / D, .replicas_per_node = 2 };
        MUST(sp_simulate(plan, model, &(sp_sim_config){ .allreduce = &m }, &with));
        for (int s = 0; s < 2; s++) {
            /* it starts when the stage's last gradient task (BW of microbatch 3) ends */
            int a = plan->stage_actor[s];
            double last = -1;
            for (int i = 0; i < plan->ninstr[a]; i++)
                if (plan->instr[a][i].op == SP_OP_RUN && plan->instr[a][i].task.stage == s)
                    last = with->end[a][i] > last ? with->end[a][i] : last;
            CHECK(fabs(with->ar_start[s] - last) < 1e-12, "D %g stage %d starts %g, last task %g",
                  D, s, with->ar_start[s], last);
            CHECK(fabs(with->ar_end[s] - with->ar_start[s] - D) < 1e-12, "stage %d lasts %g", s,
                  with->ar_end[s] - with->ar_start[s]);
        }
        /* stage 0 finishes last: its all-reduce is exposed in full; stage 1's overlaps
         * actor 0's last backward (1 unit) */
        CHECK(fabs(with->exposed_comm - D) < 1e-12, "D %g: exposed %g", D, with->exposed_comm);
        CHECK(fabs(with->step_time - (base->step_time + D)) < 1e-12, "D %g: step %g vs %g + D",
              D, with->step_time, base->step_time);
        CHECK(fabs(with->comm_time - 2 * D) < 1e-12, "D %g: comm %g", D, with->comm_time);
        sp_sim_result_free(with);
    }
    sp_sim_result_free(base);
    sp_plan_free(plan);
    sp_schedule_free(sch);
    sp_stage_model_free(model);
}

int main(void)
{
    layouts();
    costs();
    simulated();
    if (sp_test_failures) return 1;
    printf("ok: rank layouts, all-reduce costs and simulated collectives\n");
    return 0;
}
