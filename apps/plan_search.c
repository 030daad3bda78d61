/* starpipe-plan --search: the search's report (docs/planner.md, section 11): what was
 * searched on which device, how much of it was bounded away, the best layouts, and the
 * best as the command that runs it. */
#include "apps/plan_search.h"

#include <stdio.h>
#include <string.h>

/* The apps' flags for the model of the search, the batch of layout x. */
static void model_flags(const sp_search_config *c, const sp_search_choice *x, int heads)
{
    if (c->gpt) {
        const sp_gpt_shape *g = c->gpt;
        printf(" --layers %d --channels %d --heads %d --context %d --vocab %d", g->layers,
               g->channels, heads, g->context, g->vocab);
    } else {
        const sp_llama_shape *l = c->llama;
        printf(" --layers %d --channels %d --heads %d --kv-heads %d --hidden %d --context %d "
               "--vocab %d", l->layers, l->channels, l->heads, l->kv_heads, l->hidden,
               l->context, l->vocab);
    }
    printf(" --batch %d", x->batch);
}

static void int_list(const char *flag, const int *v, int n)
{
    printf(" %s ", flag);
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", v[i]);
}

/* The best layout as a run of the app (mpirun over R P T ranks). */
static void print_command(const plan_search_args *a, const sp_search_choice *x, int heads)
{
    const sp_search_config *c = &a->cfg;
    const char *app = c->gpt ? "starpipe-gpt" : "starpipe-llama";
    int auto_sched = !strcmp(x->schedule->name, "auto");
    printf("mpirun -np %d build/apps/%s", x->replicas * x->actors * x->tensor, app);
    model_flags(c, x, heads);
    printf(" --actors %d", x->actors);
    if (x->replicas > 1) printf(" --replicas %d", x->replicas);
    if (x->tensor > 1) printf(" --tensor %d", x->tensor);
    if (auto_sched) printf(" --schedule file:%s", a->save ? a->save : "SCHEDULE");
    else printf(" --schedule %s", x->schedule->name);
    if (x->chunks > 1) printf(" --chunks %d", x->chunks);
    printf(" --microbatches %d", x->micro);
    int_list("--stage-layers", x->stage_layers, x->stages);
    if (x->nrecompute == x->stages) {
        printf(" --recompute");
    } else if (x->nrecompute) {
        printf(" --recompute-stages ");
        for (int s = 0, k = 0; s < x->stages; s++)
            if (x->recompute[s]) printf("%s%d", k++ ? "," : "", s);
    }
    if (x->zero1) printf(" --shard-optimizer");
    if (x->order == SP_RANK_ORDER_REPLICA) printf(" --rank-order replica");
    printf(" --precision bf16 --peak-tflops %g\n", c->device.peak_flops / 1e12);
    if (auto_sched && !a->save)
        printf("  (the schedule is `auto`, made for these costs: --save-schedule FILE writes "
               "it)\n");
}

int plan_search(const plan_search_args *a)
{
    const sp_search_config *c = &a->cfg;
    const sp_device_spec *d = &c->device;
    sp_search_result *r;
    if (c->gpt)
        printf("search: GPT of %d layers, %d channels, context %d, vocabulary %d\n",
               c->gpt->layers, c->gpt->channels, c->gpt->context, c->gpt->vocab);
    else
        printf("search: Llama of %d layers, %d channels, %d heads (%d KV), MLP %d, context %d, "
               "vocabulary %d\n", c->llama->layers, c->llama->channels, c->llama->heads,
               c->llama->kv_heads, c->llama->hidden, c->llama->context, c->llama->vocab);
    printf("on %d x %s: peak %g TFLOP/s, tasks at %.0f%% of it (%g TFLOP/s), %.4g GB each, %d "
           "per node, NVLink %g GB/s, network %g GB/s per GPU; global batch %d sequences\n",
           c->devices, d->title, d->peak_flops / 1e12, 100 * d->efficiency,
           d->peak_flops * d->efficiency / 1e12, d->memory / 1e9, d->gpus_per_node,
           d->nvlink_bw / 1e9, d->network_bw / 1e9, c->global_batch);
    fflush(stdout);
    if (sp_search(c, &r)) {
        fprintf(stderr, "starpipe-plan: %s\n", sp_last_error());
        return 2;
    }
    printf("%ld candidates%s: %ld refused by memory bounds, %ld skipped by step-time bounds, "
           "%ld plans built (%ld over memory), %ld simulations; %.2f s\n", r->candidates,
           c->brute_force ? " (brute force)" : "", r->memory_bounded, r->time_bounded,
           r->planned, r->refused, r->simulated, r->seconds);
    printf("%2s %4s %3s %2s %2s %5s %2s %-16s %-14s %-9s %-5s %-8s %9s %8s %6s %7s %7s  %s\n",
           "#", "R", "P", "T", "v", "m", "B", "schedule", "cut", "recompute", "zero1", "order",
           "step_s", "TFLOP/s", "MFU", "bubble", "mem_GB", "binds");
    for (int i = 0; i < r->n; i++) {
        const sp_search_choice *x = &r->best[i];
        char cut[64], rc[64];
        sp_search_format_cut(x->stage_layers, x->stages, cut, sizeof cut);
        sp_search_format_recompute(x->recompute, x->stages, rc, sizeof rc);
        printf("%2d %4d %3d %2d %2d %5d %2d %-16s %-14s %-9s %-5s %-8s %9.4g %8.1f %5.1f%% "
               "%6.2f%% %7.2f  %s\n", i + 1, x->replicas, x->actors, x->tensor, x->chunks,
               x->micro, x->batch, x->schedule->name, cut, rc,
               x->replicas > 1 ? (x->zero1 ? "on" : "off") : "-", sp_rank_order_name(x->order),
               x->step_time, x->tflops / 1e12, 100 * x->mfu, 100 * x->bubble, x->memory / 1e9,
               x->binds);
    }
    const sp_search_choice *b = &r->best[0];
    printf("where the best's step goes: schedule bubble %.1f%%, boundary transfers %.1f%%, "
           "replicas' all-reduce %.1f%%, tensor all-reduces %.1f%%, recomputation %.1f%%, the "
           "model's FLOPs %.1f%%\n", 100 * b->share_schedule, 100 * b->share_p2p,
           100 * b->share_allreduce, 100 * b->share_tensor, 100 * b->share_recompute,
           100 * (1 - b->share_schedule - b->share_p2p - b->share_allreduce - b->share_tensor -
                  b->share_recompute));
    printf("the best, as a run (add --data and --steps):\n  ");
    print_command(a, b, r->heads);
    int rc = 0;
    if (a->save) {
        if (sp_schedule_save(b->schedule, a->save)) {
            fprintf(stderr, "starpipe-plan: %s\n", sp_last_error());
            rc = 1;
        } else {
            printf("schedule %s written to %s\n", b->schedule->name, a->save);
        }
    }
    sp_search_result_free(r);
    return rc;
}
