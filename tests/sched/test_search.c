/* The layout search (sched/search.c): on small grids its best layouts equal a brute force
 * over the same simulator (every candidate planned and simulated, no bound); its
 * prediction equals the planner's own simulation of the layout; the memory limit is kept,
 * and changes the choice when it binds; what has no layout, or fits nowhere, is refused
 * with one message; the device table holds the H100 and the H200. */
#include <math.h>

#include "starpipe/search.h"
#include "test_util.h"

static sp_search_config config(const sp_gpt_shape *g, const sp_llama_shape *l, int D, int G,
                               double mem)
{
    sp_search_config c = { .gpt = g, .llama = l, .devices = D, .global_batch = G,
                           .device = *sp_device_spec_find("h100") };
    c.device.memory = mem;
    return c;
}

static int same_choice(const sp_search_choice *a, const sp_search_choice *b)
{
    if (a->replicas != b->replicas || a->actors != b->actors || a->tensor != b->tensor ||
        a->chunks != b->chunks || a->micro != b->micro || a->batch != b->batch ||
        a->stages != b->stages || a->zero1 != b->zero1 || a->order != b->order ||
        strcmp(a->schedule->name, b->schedule->name) || a->step_time != b->step_time)
        return 0;
    return !memcmp(a->stage_layers, b->stage_layers, (size_t)a->stages * sizeof(int)) &&
           !memcmp(a->recompute, b->recompute, (size_t)a->stages);
}

static void describe(const char *what, const sp_search_choice *x)
{
    char cut[128], rc[128];
    fprintf(stderr, "  %s: R %d P %d T %d v %d m %d B %d %s cut %s recompute %s zero1 %d "
            "order %d step %.9g\n", what, x->replicas, x->actors, x->tensor, x->chunks,
            x->micro, x->batch, x->schedule->name,
            sp_search_format_cut(x->stage_layers, x->stages, cut, sizeof cut),
            sp_search_format_recompute(x->recompute, x->stages, rc, sizeof rc), x->zero1,
            x->order, x->step_time);
}

/* Every layout the search reports is within its limits and in order. */
static void check_sane(const sp_search_config *c, const sp_search_result *r, const char *name)
{
    for (int i = 0; i < r->n; i++) {
        const sp_search_choice *x = &r->best[i];
        int layers = 0, rc = 0;
        for (int s = 0; s < x->stages; s++) layers += x->stage_layers[s], rc += x->recompute[s];
        CHECK(x->replicas * x->actors * x->tensor == c->devices, "%s #%d: %d x %d x %d devices",
              name, i, x->replicas, x->actors, x->tensor);
        CHECK(x->replicas * x->micro * x->batch == c->global_batch, "%s #%d: batch", name, i);
        CHECK(layers == (c->gpt ? c->gpt->layers : c->llama->layers), "%s #%d: %d layers", name,
              i, layers);
        CHECK(rc == x->nrecompute, "%s #%d: %d recomputing stages, says %d", name, i, rc,
              x->nrecompute);
        CHECK(x->memory <= c->device.memory, "%s #%d: %.4g bytes over the %.4g of a device",
              name, i, x->memory, c->device.memory);
        CHECK(i == 0 || x->step_time >= r->best[i - 1].step_time, "%s #%d: out of order", name, i);
        CHECK(x->step_time > 0 && x->mfu > 0 && x->mfu < 1, "%s #%d: step %g, MFU %g", name, i,
              x->step_time, x->mfu);
        double sum = x->share_schedule + x->share_p2p + x->share_allreduce + x->share_tensor +
                     x->share_recompute;
        CHECK(sum > 0 && sum < 1, "%s #%d: losses add up to %g", name, i, sum);
    }
}

/* The search against brute force on one grid: the same best layouts in the same order. */
static void versus_brute_force(sp_search_config c, const char *name)
{
    sp_search_result *fast, *slow;
    MUST(sp_search(&c, &fast));
    c.brute_force = 1;
    MUST(sp_search(&c, &slow));
    CHECK(fast->n == slow->n, "%s: %d layouts, brute force %d", name, fast->n, slow->n);
    for (int i = 0; i < fast->n && i < slow->n; i++)
        if (!same_choice(&fast->best[i], &slow->best[i])) {
            CHECK(0, "%s: #%d differs from brute force", name, i + 1);
            describe("search", &fast->best[i]);
            describe("brute force", &slow->best[i]);
        }
    /* the bounds did prune: otherwise this test would not test them */
    CHECK(fast->simulated < slow->simulated && fast->memory_bounded + fast->time_bounded > 0,
          "%s: the search simulated %ld, brute force %ld", name, fast->simulated, slow->simulated);
    CHECK(slow->memory_bounded == 0 && slow->time_bounded == 0, "%s: brute force bounded", name);
    check_sane(&c, fast, name);
    printf("%s: %ld candidates, %ld simulated (brute force %ld), best %s R %d P %d T %d v %d "
           "m %d B %d, %.6g s\n", name, fast->candidates, fast->simulated, slow->simulated,
           fast->best[0].schedule->name, fast->best[0].replicas, fast->best[0].actors,
           fast->best[0].tensor, fast->best[0].chunks, fast->best[0].micro, fast->best[0].batch,
           fast->best[0].step_time);
    sp_search_result_free(fast);
    sp_search_result_free(slow);
}

/* The best layout simulated again the planner's usual way (the tensor group's all-reduces
 * on sp_sim_config.tensor, not folded into the costs): the same step. */
static void versus_planner(const sp_search_config *c, const sp_search_choice *x)
{
    sp_gpt_shape g = *c->gpt;
    g.batch = x->batch, g.tensor = x->tensor, g.stage_layers = x->stage_layers;
    g.device_flops = c->device.peak_flops * c->device.efficiency, g.elem_bytes = 2;
    sp_stage_model *md = sp_stage_model_gpt(&g, x->stages);
    CHECK(md != NULL, "stage model: %s", sp_last_error());
    if (!md) return;
    for (int s = 0; s < x->stages; s++) md->stage[s].recompute = x->recompute[s];
    sp_layout l = { .replicas = x->replicas, .actors = x->actors, .order = x->order,
                    .tensor = x->tensor };
    int rpn = sp_layout_replicas_per_node(&l, c->device.gpus_per_node);
    sp_allreduce_model ar = { .replicas = x->replicas, .bw_intra = c->device.nvlink_bw,
                              .bw_inter = c->device.network_bw, .replicas_per_node = rpn,
                              .hierarchical = 1,
                              .alpha = rpn < x->replicas ? c->device.network_alpha
                                                         : c->device.nvlink_alpha };
    sp_tensor_link tl = { .tensor = x->tensor, .alpha = c->device.nvlink_alpha,
                          .bw = c->device.nvlink_bw };
    int g8 = c->device.gpus_per_node, PT = x->actors * x->tensor;
    int inside = x->order == SP_RANK_ORDER_PIPELINE ? g8 % PT == 0 : x->replicas * PT <= g8;
    sp_sim_config sc = { .latency = inside ? c->device.nvlink_alpha : c->device.network_alpha,
                         .bandwidth = inside ? c->device.nvlink_bw : c->device.network_bw,
                         .grad_bytes_per_param = 2, .tensor = &tl,
                         .scatter_gather = !inside && x->tensor > 1, /* as the runtime */
                         .allreduce = x->replicas > 1 ? &ar : NULL };
    sp_plan *plan;
    sp_sim_result *r;
    MUST(sp_plan_build(md, x->schedule, &plan));
    MUST(sp_simulate(plan, md, &sc, &r));
    CHECK(fabs(r->step_time - x->step_time) <= 1e-9 * x->step_time,
          "the planner simulates %.9g s, the search said %.9g", r->step_time, x->step_time);
    double top = 0;
    for (int a = 0; a < plan->nactors; a++) {
        double b = sp_plan_device_bytes(plan, a, x->replicas, x->zero1);
        top = b > top ? b : top;
    }
    CHECK(top == x->memory, "the plan's largest device holds %.6g bytes, the search said %.6g",
          top, x->memory);
    sp_sim_result_free(r);
    sp_plan_free(plan);
    sp_stage_model_free(md);
}

int main(void)
{
    /* the device table */
    const sp_device_spec *h100 = sp_device_spec_find("H100"), *h200 = sp_device_spec_find("h200");
    CHECK(h100 && h100->peak_flops == 989e12 && h100->memory == 80e9 && h100->gpus_per_node == 8,
          "h100");
    CHECK(h200 && h200->peak_flops == 989e12 && h200->memory == 141e9, "h200");
    CHECK(!sp_device_spec_find("a100") && strstr(sp_last_error(), "known: h100, h200"),
          "unknown device: %s", sp_last_error());
    CHECK(sp_device_spec_count() == 2 && sp_device_spec_at(2) == NULL, "table size");

    /* a GPT cut by hand: stage 0 the embedding alone, the rest as given */
    sp_gpt_shape cg = { .layers = 8, .channels = 64, .context = 16, .vocab = 96, .batch = 1,
                        .device_flops = 1e12, .elem_bytes = 2,
                        .stage_layers = (const int[]){ 0, 3, 3, 2 } };
    sp_stage_model *cm = sp_stage_model_gpt(&cg, 4);
    CHECK(cm && cm->stage[0].cost[SP_TASK_F] == 0 && cm->stage[0].param_bytes > 0 &&
              cm->stage[1].cost[SP_TASK_F] == cm->stage[2].cost[SP_TASK_F] &&
              cm->stage[3].cost[SP_TASK_F] > cm->stage[1].cost[SP_TASK_F] * 2 / 3,
          "cut 0,3,3,2");
    sp_stage_model_free(cm);
    cg.stage_layers = (const int[]){ 4, 0, 4 };
    CHECK(!sp_stage_model_gpt(&cg, 3) && strstr(sp_last_error(), "stage 1 of 3 would have 0"),
          "an empty middle stage: %s", sp_last_error());

    char buf[128];
    CHECK(!strcmp(sp_search_format_cut((int[]){ 1, 3, 3, 3, 2 }, 5, buf, sizeof buf), "1,3x3,2"),
          "cut '%s'", buf);
    CHECK(!strcmp(sp_search_format_recompute((unsigned char[]){ 1, 1, 0, 1, 0 }, 5, buf,
                                             sizeof buf), "0-1,3"), "recompute '%s'", buf);

    /* brute force: a GPT whose state needs most of the devices (T > 1 pays), a small one
     * with replicas, a Llama, and one where memory forces recomputation */
    sp_gpt_shape big = { .layers = 16, .channels = 4096, .context = 512, .vocab = 8192 };
    sp_gpt_shape small = { .layers = 12, .channels = 1024, .context = 256, .vocab = 4096 };
    sp_llama_shape llama = { .layers = 8, .channels = 1024, .heads = 8, .kv_heads = 4,
                             .hidden = 2816, .context = 512, .vocab = 4096 };
    sp_search_config c = config(&big, NULL, 16, 32, 6e9);
    versus_brute_force(c, "gpt 16x4096 on 16, 6 GB");
    sp_search_result *r;
    MUST(sp_search(&c, &r));
    versus_planner(&c, &r->best[0]);
    sp_search_result_free(r);
    versus_brute_force(config(&small, NULL, 16, 64, 2e9), "gpt 12x1024 on 16, 2 GB");
    versus_brute_force(config(NULL, &llama, 8, 32, 1e9), "llama 8x1024 on 8, 1 GB");
    sp_search_config tight = config(&small, NULL, 8, 32, 0.55e9);
    tight.device = *h200, tight.device.memory = 0.55e9;
    versus_brute_force(tight, "gpt 12x1024 on 8 h200, 0.55 GB");

    /* memory: the loose choice does not fit a tighter limit, which changes it and is kept */
    sp_search_result *loose, *less;
    sp_search_config lc = config(&small, NULL, 8, 32, 80e9), tc = config(&small, NULL, 8, 32, 0);
    MUST(sp_search(&lc, &loose));
    tc.device.memory = 0.8 * loose->best[0].memory;
    MUST(sp_search(&tc, &less));
    CHECK(!same_choice(&loose->best[0], &less->best[0]) &&
              less->best[0].step_time >= loose->best[0].step_time,
          "a limit below the best's %.4g bytes kept it", loose->best[0].memory);
    check_sane(&tc, less, "tight");
    sp_search_result_free(loose);
    sp_search_result_free(less);

    /* refusals, one message each */
    sp_search_config none = config(&small, NULL, 8, 32, 1e6);
    CHECK(sp_search(&none, &r) == SP_ERR_ARG && !r &&
              strstr(sp_last_error(), "no layout of 8 devices fits 0.001 GB per device: the "
                                      "least any needs is"),
          "nothing fits: %s", sp_last_error());
    sp_gpt_shape four = { .layers = 4, .channels = 256, .context = 128, .vocab = 512 };
    sp_search_config seven = config(&four, NULL, 7, 8, 80e9);
    CHECK(sp_search(&seven, &r) == SP_ERR_ARG &&
              strstr(sp_last_error(), "no layout of 7 devices: replicas x actors x tensor"),
          "7 devices: %s", sp_last_error());
    sp_search_config bad = config(&four, NULL, 8, 8, 80e9);
    bad.device.efficiency = 0;
    CHECK(sp_search(&bad, &r) == SP_ERR_ARG && strstr(sp_last_error(), "efficiency"),
          "efficiency 0: %s", sp_last_error());
    bad = config(&four, &llama, 8, 8, 80e9);
    CHECK(sp_search(&bad, &r) == SP_ERR_ARG && strstr(sp_last_error(), "one model"),
          "two models: %s", sp_last_error());
    return test_done("test_search");
}
