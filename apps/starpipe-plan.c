/* starpipe-plan: plan and simulate a pipeline schedule on synthetic stages, print a
 * summary (or JSON), optionally an SVG timeline and a Chrome trace. Exit 0 for a valid
 * plan, 2 for an invalid one (message on stderr), 1 for a usage error. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "apps/plan_search.h"
#include "starpipe/calibrate.h"
#include "starpipe/models.h"
#include "starpipe/plan.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: starpipe-plan --schedule NAME|file:PATH --actors P [--stages S]\n"
            "                     [--microbatches M] [--chunks V]\n"
            "                     [--cost F=1,B=1,W=1,BW=2,lat=0,bw=0] [--bytes N]\n"
            "                     [--rendezvous] [--json] [--svg FILE] [--trace FILE]\n"
            "                     [--save-schedule FILE] [--print-plan]\n"
            "                     [--stage-costs X0,X1,...] [--memory-cap N[,N,...]]\n"
            "                     [--gpt gpt2|...|gpt3-175b[,B]|L,C,T,V[,B]] [--device-flops X]\n"
            "                     [--llama llama2-7b|llama2-13b|llama2-70b[,B]|L,C,H,Hkv,I,T,V[,B]]\n"
            "                     [--replicas R[,R,...]] [--rank-order pipeline|replica]\n"
            "                     [--allreduce alpha=1e-5,intra=450e9,inter=50e9,node=8,hier=1,\n"
            "                                  tp_alpha=1e-6,tp_bw=450e9]\n"
            "                     [--grad-bytes 4] [--tensor T] [--scatter-gather] [--recompute]\n"
            "                     [--shard-optimizer]\n"
            "                     [--calibrate PROFILE]\n"
            "Stages are a synthetic chain: each stage costs F, B, W (BW defaults to B+W),\n"
            "saves one unit of activations, and sends N bytes to the next (default 1).\n"
            "lat is the per-message latency, bw the bandwidth in bytes per time unit\n"
            "(0: infinite). --stage-costs: stage s's F, B, W and BW times X_s (one factor per\n"
            "stage; 1,1,1,3: a head stage three times a block). --schedule auto synthesizes\n"
            "a schedule for these costs and messages that holds at most --memory-cap\n"
            "activation units per actor (one stage's saved activations of one microbatch;\n"
            "one value for all actors or one each; default 1F1B's peak, min(P, M)).\n"
            "Flags override STARPIPE_SCHEDULE, STARPIPE_MICROBATCHES and\n"
            "STARPIPE_CHUNKS. --schedule help lists the schedules.\n"
            "--gpt: stages of a GPT of L layers, C channels, context T, vocabulary V, B\n"
            "sequences per microbatch, or a known shape and B = 1 unless given (gpt2,\n"
            "gpt2-medium, gpt2-large, gpt2-xl, gpt3-175b: 96,12288,2048,50257, gpt-small:\n"
            "the apps' --model table), costs in seconds at --device-flops FLOP/s (457e12,\n"
            "JaxPP's measured bf16 rate per GPU).\n"
            "--calibrate PROFILE (with --gpt or --llama): the rates of the machine an app's\n"
            "--profile measured, where no flag gives them: the FLOP rate of its stage\n"
            "programs, its message latency and bandwidth, its tensor group's link and the\n"
            "replicas' all-reduce. An app run with --calibrate predicts its own step op by op.\n"
            "--llama: stages of a Llama of L layers, C channels, H query heads, Hkv KV heads\n"
            "(grouped-query attention), I SwiGLU hidden units, context T, vocabulary V, B\n"
            "sequences per microbatch (llama2-7b: 32,4096,32,32,11008,4096,32000;\n"
            "llama2-13b: 40,5120,40,40,13824,4096,32000; llama2-70b:\n"
            "80,8192,64,8,28672,4096,32000; llama-small; B = 1 unless given, as in\n"
            "llama2-70b,2). Everything below that takes --gpt takes --llama.\n"
            "--replicas: R copies of the pipeline whose stage gradients are all-reduced\n"
            "(--grad-bytes per element) beside compute, alpha-beta cost (--allreduce:\n"
            "seconds per message, bytes/s per rank inside and between nodes, GPUs per\n"
            "node, 1 for the hierarchical form); several values print a weak-scaling table.\n"
            "--tensor T (with --gpt or --llama): each actor a group of T ranks (tensor\n"
            "parallelism, Megatron's layout; a Llama's T divides Hkv, I and V), innermost,\n"
            "so T <= GPUs per node; per block two all-reduces of (N, C) in F and two in\n"
            "B among the group, tp_alpha s per step and tp_bw bytes/s per rank (NVLink),\n"
            "added to the tasks; with --scatter-gather each boundary message goes as 1/T\n"
            "per rank on the --cost link, then an all-gather on the group's (the runtime's\n"
            "default between hosts). --recompute: every stage recomputes its activations;\n"
            "--shard-optimizer: ZeRO-1, the AdamW state of 1/R per replica. Memory is\n"
            "per device (one rank of a group).\n"
            "\n"
            "       starpipe-plan --search --gpt ...|--llama ... --devices N --global-batch G\n"
            "                     [--device h100|h200] [--device-memory BYTES] [--efficiency X]\n"
            "                     [--gpus-per-node N] [--heads H] [--max-batch B] [--top K]\n"
            "                     [--links nvlink=450e9,network=50e9,nvlink_alpha=1e-6,\n"
            "                              network_alpha=1e-5] [--grad-bytes 2]\n"
            "                     [--brute-force] [--save-schedule FILE]\n"
            "--search: the K (5) best layouts of the model on N devices for a global batch of\n"
            "G sequences: replicas x actors x tensor = N, sequences per microbatch B (up to\n"
            "--max-batch, 8) and G / (R B) microbatches, every schedule (auto too), cuts of\n"
            "the layers, recomputation, ZeRO-1 and rank order, each planned and simulated on\n"
            "the device (--device: its datasheet peak, memory, links, GPUs per node; tasks\n"
            "at --efficiency of the peak, assumed 0.75), pruned by bounds (--brute-force:\n"
            "none). Prints each one's step time, TFLOP/s per device, MFU, bubble, memory and\n"
            "what binds it, and the best as the app's command line; --save-schedule writes\n"
            "its schedule. --heads: a --gpt shape's heads (gpt3-175b: 96; else C/128).\n");
}

static int to_int(const char *flag, const char *v, int *out)
{
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || errno || x < 1 || x > 1000000) {
        fprintf(stderr, "starpipe-plan: %s needs a positive integer, got '%s'\n", flag,
                v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* A "key=value,..." list of finite numbers in [0, 1e100] (a nan or inf cost would give a
 * nan or inf step time), each handed to set, which prints its own message for a key or
 * value it does not take. 0, or -1 after one message (none for an item without '='). */
static int parse_pairs(const char *spec, const char *flag, const char *hint,
                       int (*set)(void *ctx, const char *key, double v), void *ctx)
{
    char *copy = strdup(spec), *save = NULL;
    int bad = !copy;
    for (char *t = copy ? strtok_r(copy, ",", &save) : NULL; t && !bad;
         t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '='), *end;
        if (!eq) {
            bad = 1;
            break;
        }
        *eq = 0;
        errno = 0;
        double v = strtod(eq + 1, &end);
        if (end == eq + 1 || *end || errno || !isfinite(v) || v < 0 || v > 1e100) {
            fprintf(stderr, "starpipe-plan: %s: bad value '%s' for %s%s\n", flag, eq + 1, t, hint);
            bad = 1;
        } else {
            bad = set(ctx, t, v) != 0;
        }
    }
    free(copy);
    return bad ? -1 : 0;
}

/* --cost "F=1,B=1,W=1,BW=2,lat=0,bw=0" */
typedef struct {
    double *kind, *lat, *bw;
    int *bw_given;
} cost_spec;

static int set_cost(void *ctx, const char *t, double v)
{
    cost_spec *c = ctx;
    if (!strcmp(t, "F")) c->kind[SP_TASK_F] = v;
    else if (!strcmp(t, "B")) c->kind[SP_TASK_B] = v;
    else if (!strcmp(t, "W")) c->kind[SP_TASK_W] = v;
    else if (!strcmp(t, "BW")) c->kind[SP_TASK_BW] = v, *c->bw_given = 1;
    else if (!strcmp(t, "lat")) *c->lat = v;
    else if (!strcmp(t, "bw")) *c->bw = v;
    else {
        fprintf(stderr, "starpipe-plan: --cost: unknown key '%s' (F, B, W, BW, lat, bw)\n", t);
        return -1;
    }
    return 0;
}

static int parse_cost(const char *spec, double kind[4], int *bw_given, double *lat, double *bw)
{
    cost_spec c = { kind, lat, bw, bw_given };
    return parse_pairs(spec, "--cost", " (a finite number in [0, 1e100])", set_cost, &c);
}

/* --allreduce "alpha=1e-5,intra=450e9,inter=50e9,node=8,hier=1" */
typedef struct {
    sp_allreduce_model *m;
    int *node;
    sp_tensor_link *tp;
} allreduce_spec;

static int set_allreduce(void *ctx, const char *t, double v)
{
    allreduce_spec *a = ctx;
    if (!strcmp(t, "alpha")) a->m->alpha = v;
    else if (!strcmp(t, "intra")) a->m->bw_intra = v;
    else if (!strcmp(t, "inter")) a->m->bw_inter = v;
    else if (!strcmp(t, "node") && v >= 1 && v <= 1 << 20 && v == (int)v) *a->node = (int)v;
    else if (!strcmp(t, "hier") && (v == 0 || v == 1)) a->m->hierarchical = (int)v;
    else if (!strcmp(t, "tp_alpha")) a->tp->alpha = v;
    else if (!strcmp(t, "tp_bw")) a->tp->bw = v;
    else {
        fprintf(stderr, "starpipe-plan: --allreduce: bad key or value '%s' (alpha, intra, "
                "inter, node a count, hier 0 or 1, tp_alpha, tp_bw)\n", t);
        return -1;
    }
    return 0;
}

static int parse_allreduce(const char *spec, sp_allreduce_model *m, int *node, sp_tensor_link *tp)
{
    allreduce_spec a = { m, node, tp };
    return parse_pairs(spec, "--allreduce", "", set_allreduce, &a);
}

/* Up to max positive integers separated by commas, the whole of p: how many, or -1. */
static int parse_ints(const char *p, int *v, int max)
{
    int n = 0;
    while (n < max) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 1 || x > 1 << 24) return -1;
        v[n++] = (int)x;
        if (!*end) return n;
        if (*end != ',') return -1;
        p = end + 1;
    }
    return -1;
}

/* spec is "NAME" or "NAME,B" for a preset of the architecture (starpipe/models.h, the
 * apps' --model table): 1 with *p and *batch (1 unless given), 0 for no preset's name, -1
 * for NAME followed by anything but one positive integer. */
static int preset(const char *spec, int llama, const sp_model_preset **p, int *batch)
{
    char name[64];
    size_t k = strcspn(spec, ",");
    snprintf(name, sizeof name, "%.*s", (int)(k < sizeof name ? k : sizeof name - 1), spec);
    if (!(*p = sp_model_preset_find(name)) || (*p)->llama != llama) return 0;
    *batch = 1;
    return !spec[k] || parse_ints(spec + k + 1, batch, 1) == 1 ? 1 : -1;
}

/* "NAME[,B]" (a GPT preset) or "L,C,T,V,B"; *heads: the preset's (0 for numbers) */
static int parse_gpt(const char *spec, sp_gpt_shape *g, int *heads)
{
    const sp_model_preset *p;
    int v[5] = { 0, 0, 0, 0, 1 }, k = preset(spec, 0, &p, &g->batch), n = 0;
    *heads = 0;
    if (k == 1) {
        g->layers = p->layers, g->channels = p->channels, g->context = p->context;
        g->vocab = p->vocab, *heads = p->heads;
        return 0;
    }
    if (k < 0 || ((n = parse_ints(spec, v, 5)) != 5 && n != 4)) {
        fprintf(stderr, "starpipe-plan: --gpt: expected gpt2, gpt2-medium, gpt2-large, gpt2-xl, "
                "gpt3-175b or gpt-small [,B], or L,C,T,V[,B] (four or five positive integers), "
                "got '%s'\n", spec);
        return -1;
    }
    g->layers = v[0], g->channels = v[1], g->context = v[2], g->vocab = v[3], g->batch = v[4];
    return 0;
}

/* "NAME[,B]" (a Llama preset) or "L,C,H,Hkv,I,T,V,B" */
static int parse_llama(const char *spec, sp_llama_shape *l)
{
    const sp_model_preset *p;
    int v[8], n = 0, k = preset(spec, 1, &p, &v[7]);
    if (k == 1) {
        int hidden = p->hidden ? p->hidden : (8 * p->channels / 3 + 31) / 32 * 32; /* the apps' */
        const int w[7] = { p->layers, p->channels, p->heads, p->kv_heads, hidden, p->context,
                           p->vocab };
        memcpy(v, w, sizeof w);
    }
    if (!k) v[7] = 1;
    if (k < 0 || (!k && (n = parse_ints(spec, v, 8)) != 8 && n != 7)) {
        fprintf(stderr, "starpipe-plan: --llama: expected llama2-7b, llama2-13b, llama2-70b or "
                "llama-small [,B], or L,C,H,Hkv,I,T,V[,B] (seven or eight positive integers), "
                "got '%s'\n", spec);
        return -1;
    }
    l->layers = v[0], l->channels = v[1], l->heads = v[2], l->kv_heads = v[3];
    l->hidden = v[4], l->context = v[5], l->vocab = v[6], l->batch = v[7];
    return 0;
}

/* One device's peak bytes on the largest actor (ZeRO-1: the AdamW state of 1/R). */
static double max_device_bytes(const sp_plan *plan, int R, int zero1, int *actor)
{
    double x = -1;
    for (int a = 0; a < plan->nactors; a++)
        if (sp_plan_device_bytes(plan, a, R, zero1) > x)
            x = sp_plan_device_bytes(plan, a, R, zero1), *actor = a;
    return x;
}

/* The rank order's replicas of a stage per node (node GPUs; 0: one node). */
static int replicas_per_node(int R, int P, int node, int T, int replica_major)
{
    sp_layout l = { .replicas = R, .actors = P, .tensor = T,
                    .order = replica_major ? SP_RANK_ORDER_REPLICA : SP_RANK_ORDER_PIPELINE };
    return sp_layout_replicas_per_node(&l, node);
}

/* --links "nvlink=450e9,network=50e9,nvlink_alpha=1e-6,network_alpha=1e-5" */
static int set_link(void *ctx, const char *t, double v)
{
    sp_device_spec *d = ctx;
    if (!strcmp(t, "nvlink") && v > 0) d->nvlink_bw = v;
    else if (!strcmp(t, "network") && v > 0) d->network_bw = v;
    else if (!strcmp(t, "nvlink_alpha")) d->nvlink_alpha = v;
    else if (!strcmp(t, "network_alpha")) d->network_alpha = v;
    else {
        fprintf(stderr, "starpipe-plan: --links: bad key or value '%s' (nvlink, network: "
                "bytes/s above 0; nvlink_alpha, network_alpha: seconds)\n", t);
        return -1;
    }
    return 0;
}

/* --search: the model and the links, then the search and its report. */
static int search_main(plan_search_args *sa, const char *gpt, const char *llama,
                       const char *links)
{
    sp_gpt_shape g = { .elem_bytes = 2 };
    sp_llama_shape l = { .elem_bytes = 2 };
    if (!gpt == !llama) {
        fprintf(stderr, "starpipe-plan: --search needs one model, --gpt or --llama\n");
        return 1;
    }
    if (!sa->cfg.devices || !sa->cfg.global_batch) {
        fprintf(stderr, "starpipe-plan: --search needs --devices N and --global-batch G "
                "(sequences per step)\n");
        return 1;
    }
    int heads = 0;
    if ((gpt && parse_gpt(gpt, &g, &heads)) || (llama && parse_llama(llama, &l)) ||
        (links && parse_pairs(links, "--links", "", set_link, &sa->cfg.device)))
        return 1;
    if (gpt && !sa->cfg.gpt_heads) sa->cfg.gpt_heads = heads; /* a preset's; 0: C/128 */
    sa->cfg.gpt = gpt ? &g : NULL;
    sa->cfg.llama = llama ? &l : NULL;
    return plan_search(sa);
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static int invalid(int json, const char *msg)
{
    fprintf(stderr, "starpipe-plan: %s\n", msg);
    if (json) {
        printf("{\"valid\":false,\"error\":");
        json_string(stdout, msg);
        printf("}\n");
    }
    return 2;
}

int main(int argc, char **argv)
{
    const char *name = NULL, *svg = NULL, *trace = NULL, *save = NULL;
    int p = 0, S = 0, m = 0, v = 0, json = 0, print_plan = 0, rendezvous = 0, bytes = 1;
    int scatter_gather = 0;
    double kind[4] = { 1, 1, 1, -1 }, lat = 0, bw = 0;
    int bw_given = 0;
    const char *gpt = NULL, *llama = NULL, *reps = NULL, *order = "pipeline";
    double device_flops = 457e12, grad_bytes = 4;
    sp_allreduce_model arm = { .alpha = 1e-5, .bw_intra = 450e9, .bw_inter = 50e9,
                               .hierarchical = 1 };
    int node = 8, T = 1, recompute = 0, zero1 = 0;
    const char *stage_costs = NULL, *memory_cap = NULL;
    /* the tensor group's link: NVLink 4 (H100/H200), 450 GB/s per GPU and direction */
    sp_tensor_link tpl = { .alpha = 1e-6, .bw = 450e9 };
    /* --search: the layout search (apps/plan_search.c) */
    int search = 0, grad_given = 0;
    plan_search_args sa = { .cfg = { .device = *sp_device_spec_find("h100") } };
    double dev_memory = 0, efficiency = 0;
    int per_node = 0;
    const char *links = NULL, *calibrate = NULL;
    int flops_given = 0, cost_given = 0, allreduce_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 0;
        if (!strcmp(a, "--schedule") && val) name = val, i++, ok = 1;
        else if (!strcmp(a, "--actors")) ok = !to_int(a, val, &p), i++;
        else if (!strcmp(a, "--stages")) ok = !to_int(a, val, &S), i++;
        else if (!strcmp(a, "--microbatches")) ok = !to_int(a, val, &m), i++;
        else if (!strcmp(a, "--chunks")) ok = !to_int(a, val, &v), i++;
        else if (!strcmp(a, "--bytes")) ok = !to_int(a, val, &bytes), i++;
        else if (!strcmp(a, "--cost") && val)
            ok = !parse_cost(val, kind, &bw_given, &lat, &bw), cost_given = 1, i++;
        else if (!strcmp(a, "--calibrate") && val) calibrate = val, i++, ok = 1;
        else if (!strcmp(a, "--svg") && val) svg = val, i++, ok = 1;
        else if (!strcmp(a, "--trace") && val) trace = val, i++, ok = 1;
        else if (!strcmp(a, "--save-schedule") && val) save = val, i++, ok = 1;
        else if (!strcmp(a, "--json")) json = ok = 1;
        else if (!strcmp(a, "--print-plan")) print_plan = ok = 1;
        else if (!strcmp(a, "--rendezvous")) rendezvous = ok = 1;
        else if (!strcmp(a, "--scatter-gather")) scatter_gather = ok = 1;
        else if (!strcmp(a, "--gpt") && val) gpt = val, i++, ok = 1;
        else if (!strcmp(a, "--llama") && val) llama = val, i++, ok = 1;
        else if (!strcmp(a, "--replicas") && val) reps = val, i++, ok = 1;
        else if (!strcmp(a, "--rank-order") && val && (!strcmp(val, "pipeline") || !strcmp(val, "replica")))
            order = val, i++, ok = 1;
        else if (!strcmp(a, "--allreduce") && val)
            ok = !parse_allreduce(val, &arm, &node, &tpl), allreduce_given = 1, i++;
        else if (!strcmp(a, "--tensor")) ok = !to_int(a, val, &T), i++;
        else if (!strcmp(a, "--stage-costs") && val) stage_costs = val, i++, ok = 1;
        else if (!strcmp(a, "--memory-cap") && val) memory_cap = val, i++, ok = 1;
        else if (!strcmp(a, "--recompute")) recompute = ok = 1;
        else if (!strcmp(a, "--shard-optimizer")) zero1 = ok = 1;
        else if (!strcmp(a, "--search")) search = ok = 1;
        else if (!strcmp(a, "--brute-force")) sa.cfg.brute_force = ok = 1;
        else if (!strcmp(a, "--devices")) ok = !to_int(a, val, &sa.cfg.devices), i++;
        else if (!strcmp(a, "--global-batch")) ok = !to_int(a, val, &sa.cfg.global_batch), i++;
        else if (!strcmp(a, "--gpus-per-node")) ok = !to_int(a, val, &per_node), i++;
        else if (!strcmp(a, "--heads")) ok = !to_int(a, val, &sa.cfg.gpt_heads), i++;
        else if (!strcmp(a, "--max-batch")) ok = !to_int(a, val, &sa.cfg.max_batch), i++;
        else if (!strcmp(a, "--top")) ok = !to_int(a, val, &sa.cfg.top), i++;
        else if (!strcmp(a, "--links") && val) links = val, i++, ok = 1;
        else if (!strcmp(a, "--device") && val) {
            const sp_device_spec *d = sp_device_spec_find(val);
            if (d) sa.cfg.device = *d;
            else fprintf(stderr, "starpipe-plan: --device: %s\n", sp_last_error());
            ok = d != NULL, i++;
        } else if ((!strcmp(a, "--device-flops") || !strcmp(a, "--grad-bytes") ||
                    !strcmp(a, "--device-memory") || !strcmp(a, "--efficiency")) && val) {
            char *end;
            errno = 0;
            double x = strtod(val, &end);
            ok = end != val && !*end && !errno && isfinite(x) && x > 0 && x < 1e30 &&
                 (strcmp(a, "--efficiency") || x <= 1);
            if (!ok) fprintf(stderr, "starpipe-plan: %s needs a positive number%s, got '%s'\n", a,
                             strcmp(a, "--efficiency") ? "" : " up to 1", val);
            else if (!strcmp(a, "--device-flops")) device_flops = x, flops_given = 1;
            else if (!strcmp(a, "--device-memory")) dev_memory = x;
            else if (!strcmp(a, "--efficiency")) efficiency = x;
            else grad_bytes = x, grad_given = 1;
            i++;
        }
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "starpipe-plan: unknown or incomplete option '%s'\n", a);
        }
        if (!ok) {
            usage(stderr);
            return 1;
        }
    }
    sp_env env;
    if (sp_env_read(&env) != SP_OK) {
        fprintf(stderr, "starpipe-plan: %s\n", sp_last_error());
        return 1;
    }
    if ((name && !strcmp(name, "help")) || (!name && env.schedule && !strcmp(env.schedule, "help"))) {
        printf("schedules (--schedule or STARPIPE_SCHEDULE):\n%s", sp_schedule_help());
        return 0;
    }
    if (search && (p || S || m || v || name || reps || T > 1 || recompute || zero1 ||
                   stage_costs || memory_cap)) {
        fprintf(stderr, "starpipe-plan: --search chooses the actors, tensor degree, replicas, "
                "schedule, chunks, microbatches, recomputation and ZeRO-1 itself: leave those "
                "flags out\n");
        return 1;
    }
    if (calibrate && (search || !(gpt || llama))) {
        fprintf(stderr, "starpipe-plan: --calibrate prices a model given by its shape (--gpt "
                "or --llama) on the machine of the profile%s\n",
                search ? "; --search prices a --device" : "");
        return 1;
    }
    if (calibrate) { /* this machine's rates, where no flag gave them */
        sp_status st;
        sp_profile *pf = sp_profile_read(calibrate, &st);
        if (!pf) {
            fprintf(stderr, "starpipe-plan: --calibrate: %s\n", sp_last_error());
            return 1;
        }
        sp_profile_rate rt;
        sp_profile_rates(pf, &rt);
        sp_profile_free(pf);
        if (!flops_given && rt.flops > 0) device_flops = rt.flops;
        if (!cost_given) lat = rt.latency, bw = rt.bandwidth;
        if (!allreduce_given) {
            if (rt.tp_bw > 0) tpl.alpha = rt.tp_alpha, tpl.bw = rt.tp_bw;
            arm.alpha = rt.latency;
            arm.bw_intra = arm.bw_inter = rt.ar_bw > 0 ? rt.ar_bw : rt.tp_bw > 0 ? rt.tp_bw : 0;
        }
        if (!json)
            printf("calibrated by %s: %.3g GFLOP/s of the programs' FLOPs (all ops' time "
                   "included), messages %.0f us%s, tensor group %.1f us per step + %.3g GB/s\n",
                   calibrate, device_flops / 1e9, 1e6 * lat,
                   bw > 0 ? "" : " (one size: no bandwidth term)", 1e6 * tpl.alpha,
                   tpl.bw / 1e9);
    }
    if (search) {
        if (dev_memory > 0) sa.cfg.device.memory = dev_memory;
        if (per_node) sa.cfg.device.gpus_per_node = per_node;
        if (efficiency > 0) sa.cfg.device.efficiency = efficiency;
        sa.cfg.grad_bytes = grad_given ? grad_bytes : 0;
        sa.save = save;
        return search_main(&sa, gpt, llama, links);
    }
    if (!p) {
        fprintf(stderr, "starpipe-plan: --actors P is required\n");
        usage(stderr);
        return 1;
    }
    if (kind[SP_TASK_BW] < 0) kind[SP_TASK_BW] = kind[SP_TASK_B] + kind[SP_TASK_W];
    if (gpt && llama) {
        fprintf(stderr, "starpipe-plan: --gpt and --llama: one model at a time\n");
        return 1;
    }
    /* the model given by its shape, if any: --gpt or --llama */
    const char *shaped = gpt ? gpt : llama;
    if (T > 1 && !shaped) {
        fprintf(stderr, "starpipe-plan: --tensor needs --gpt or --llama (the group's "
                "all-reduces and the split sizes come from a model's shape)\n");
        return 1;
    }
    if (T > 1 && node > 0 && (T > node || node % T)) {
        fprintf(stderr, "starpipe-plan: --tensor %d: an actor's group of %d ranks must sit "
                "inside one node of %d GPUs (--allreduce node=%d), so T must be at most %d "
                "and divide it\n", T, T, node, node, node);
        return 1;
    }
    tpl.tensor = T;

    sp_schedule *sch = NULL;
    /* auto is made for the model's costs, so the model (S = p) comes first */
    int is_auto = !strcmp(name ? name : env.schedule ? env.schedule : "", "auto");
    if (memory_cap && !is_auto) {
        fprintf(stderr, "starpipe-plan: --memory-cap applies to --schedule auto\n");
        return 1;
    }
    if (is_auto) {
        if (!m) m = env.microbatches > 0 ? env.microbatches : 2 * p;
        if (v > 1 || (S && S != p))
            return invalid(json, "schedule 'auto' places one stage per actor: no --chunks, "
                                 "--stages equal to --actors");
        S = p;
    } else if (sp_schedule_from_env(name, p, m, v, &sch)) {
        return invalid(json, sp_last_error());
    }
    if (is_auto) {
        /* made below, once the model is */
    } else if (S && S != sch->nstages) {
        char msg[256];
        snprintf(msg, sizeof msg, "schedule '%s' with %d actors has %d stages, but --stages "
                 "says %d", sch->name, p, sch->nstages, S);
        sp_schedule_free(sch);
        return invalid(json, msg);
    }
    if (sch) S = sch->nstages;
    if (sch && save && sp_schedule_save(sch, save)) {
        fprintf(stderr, "starpipe-plan: %s\n", sp_last_error());
        sp_schedule_free(sch);
        return 1;
    }
    sp_gpt_shape shape = { .device_flops = device_flops, .elem_bytes = 2, .tensor = T };
    sp_llama_shape lshape = { .device_flops = device_flops, .elem_bytes = 2, .tensor = T };
    int heads; /* (no cost of the plain planner depends on them) */
    if ((gpt && parse_gpt(gpt, &shape, &heads)) || (llama && parse_llama(llama, &lshape))) {
        sp_schedule_free(sch);
        return 1;
    }
    if (gpt && shape.channels % T) {
        fprintf(stderr, "starpipe-plan: --tensor %d does not divide the %d channels of --gpt "
                "%s\n", T, shape.channels, gpt);
        sp_schedule_free(sch);
        return 1;
    }
    /* tokens per microbatch, for tokens/s */
    double mb_tokens = gpt ? (double)shape.batch * shape.context
                           : llama ? (double)lshape.batch * lshape.context : 1;
    sp_stage_model *model = gpt     ? sp_stage_model_gpt(&shape, S)
                            : llama ? sp_stage_model_llama(&lshape, S)
                                    : sp_stage_model_chain(S, kind[0], kind[1], kind[2], (size_t)bytes);
    if (!model) {
        if (gpt) fprintf(stderr, "starpipe-plan: --gpt %s cannot be cut into %d stages\n", gpt, S);
        else if (llama) fprintf(stderr, "starpipe-plan: --llama %s: %s\n", llama, sp_last_error());
        else fprintf(stderr, "starpipe-plan: out of memory\n");
        sp_schedule_free(sch);
        return 1;
    }
    for (int s = 0; !shaped && s < S; s++) model->stage[s].cost[SP_TASK_BW] = kind[SP_TASK_BW];
    for (int s = 0; recompute && s < S; s++) model->stage[s].recompute = 1;
    if (stage_costs) {
        double x[1024];
        int n = 0, bad = shaped != NULL;
        for (const char *q = stage_costs; !bad && *q && n < 1024;) {
            char *end;
            errno = 0;
            x[n] = strtod(q, &end);
            bad = end == q || errno || !isfinite(x[n]) || x[n] < 0 || x[n] > 1e100 ||
                  (*end && *end != ',');
            n++;
            q = *end ? end + 1 : end;
        }
        if (bad || n != S) {
            fprintf(stderr, "starpipe-plan: --stage-costs: expected %d non-negative factors "
                    "separated by commas, one per stage of the synthetic chain (not with "
                    "--gpt or --llama), got '%s'\n", S, stage_costs);
            sp_stage_model_free(model);
            sp_schedule_free(sch);
            return 1;
        }
        for (int s = 0; s < S; s++)
            for (int k = 0; k < SP_NUM_TASK_KINDS; k++) model->stage[s].cost[k] *= x[s];
    }
    if (is_auto) {
        int caps[1024], ncap = 0;
        if (memory_cap) {
            ncap = parse_ints(memory_cap, caps, p < 1024 ? p : 1024);
            if (ncap != 1 && ncap != p) {
                fprintf(stderr, "starpipe-plan: --memory-cap: expected one positive integer "
                        "or %d of them separated by commas (activation units per actor), got "
                        "'%s'\n", p, memory_cap);
                sp_stage_model_free(model);
                return 1;
            }
        }
        for (int a = ncap; ncap == 1 && a < p; a++) caps[a] = caps[0];
        sp_auto_config acfg = { .latency = lat, .bandwidth = bw, .mem_caps = ncap ? caps : NULL };
        if (sp_schedule_auto(model, p, m, &acfg, &sch)) {
            int r = invalid(json, sp_last_error());
            sp_stage_model_free(model);
            return r;
        }
        if (save && sp_schedule_save(sch, save)) {
            fprintf(stderr, "starpipe-plan: %s\n", sp_last_error());
            sp_schedule_free(sch);
            sp_stage_model_free(model);
            return 1;
        }
    }
    /* the model's FLOPs of one replica's step (no recomputation), for TFLOP/s per device */
    double step_flops = 0;
    for (int s = 0; shaped && s < S; s++)
        step_flops += (model->stage[s].cost[SP_TASK_F] + model->stage[s].cost[SP_TASK_B] +
                       model->stage[s].cost[SP_TASK_W]) * device_flops * T * sch->nmicro;
    /* --replicas R[,R...]: each a simulation of one replica with its all-reduces */
    int nrep = 0, rlist[64];
    for (const char *q = reps; q && *q && nrep < 64;) {
        char *end;
        errno = 0;
        long x = strtol(q, &end, 10);
        if (end == q || errno || x < 1 || x > 1 << 20 || (*end && *end != ',')) {
            fprintf(stderr, "starpipe-plan: --replicas: expected positive integers separated "
                    "by commas, got '%s'\n", reps);
            sp_stage_model_free(model);
            sp_schedule_free(sch);
            return 1;
        }
        rlist[nrep++] = (int)x;
        q = *end ? end + 1 : end;
    }

    sp_plan *plan = NULL;
    sp_sim_result *res = NULL;
    int rc = 0;
    sp_sim_config cfg = { .latency = lat, .bandwidth = bw, .rendezvous = rendezvous,
                          .grad_bytes_per_param = grad_bytes, .tensor = T > 1 ? &tpl : NULL,
                          .scatter_gather = scatter_gather };
    if (nrep == 1) {
        arm.replicas = rlist[0];
        arm.replicas_per_node = replicas_per_node(rlist[0], p, node, T, !strcmp(order, "replica"));
        cfg.allreduce = &arm;
    }
    if (sp_plan_build(model, sch, &plan) || sp_simulate(plan, model, &cfg, &res)) {
        rc = invalid(json, sp_last_error());
        goto out;
    }
    if (nrep > 1) { /* the weak-scaling table: one replica simulated per R, m fixed */
        double tokens = mb_tokens * sch->nmicro;
        printf("weak scaling: %s, %d actors, %d microbatches per replica, %s-major ranks, "
               "%s all-reduce (alpha %g s, %g GB/s in a node, %g GB/s between nodes, %d per "
               "node), gradients %g bytes per element\n", sch->name, p, sch->nmicro, order,
               arm.hierarchical ? "hierarchical" : "ring", arm.alpha, arm.bw_intra / 1e9,
               arm.bw_inter / 1e9, node, grad_bytes);
        if (T > 1)
            printf("tensor parallelism: %d ranks per actor (%d devices per replica), group "
                   "all-reduces at %g GB/s per rank, alpha %g s, exposed in the tasks\n", T,
                   p * T, tpl.bw / 1e9, tpl.alpha);
        printf("%8s %8s %12s %14s %10s %13s %11s %9s %8s %8s %11s %9s\n", "devices", "replicas",
               "step_s", shaped ? "tokens/s" : "mb/s", "weak_eff", "allreduce_s", "exposed_s",
               "exposed", "bubble", "tp_s", "TFLOP/s/dev", "mem_GB");
        double t0 = 0;
        for (int k = 0; k < nrep && rc == 0; k++) {
            sp_sim_result *rr = NULL;
            arm.replicas = rlist[k];
            arm.replicas_per_node = replicas_per_node(rlist[k], p, node, T, !strcmp(order, "replica"));
            cfg.allreduce = &arm;
            if (sp_simulate(plan, model, &cfg, &rr)) {
                rc = invalid(0, sp_last_error());
                break;
            }
            if (k == 0) t0 = rr->step_time;
            /* per-replica work is fixed: efficiency = first step time / this one */
            double comm = 0;
            for (int st = 0; st < S; st++) comm = rr->ar_end[st] - rr->ar_start[st] > comm
                                                     ? rr->ar_end[st] - rr->ar_start[st] : comm;
            int am = 0;
            printf("%8d %8d %12.4f %14.4g %9.2f%% %13.4f %11.4f %8.2f%% %7.2f%% %8.4f %11.1f "
                   "%9.2f\n", rlist[k] * p * T, rlist[k], rr->step_time,
                   tokens * rlist[k] / rr->step_time, 100 * t0 / rr->step_time, comm,
                   rr->exposed_comm, 100 * rr->exposed_comm / rr->step_time,
                   100 * rr->bubble_fraction, rr->tp_time,
                   step_flops / ((double)p * T * rr->step_time) / 1e12,
                   max_device_bytes(plan, rlist[k], zero1, &am) / 1e9);
            sp_sim_result_free(rr);
        }
        goto out;
    }
    if (print_plan) sp_plan_write(plan, stdout);
    if (svg && sp_sim_write_svg(plan, res, svg)) rc = 1;
    if (trace && sp_sim_write_trace(plan, res, trace)) rc = 1;
    if (rc) {
        fprintf(stderr, "starpipe-plan: %s\n", sp_last_error());
        goto out;
    }
    /* JSON has no nan or inf: every number printed below is checked first */
    int finite = isfinite(res->step_time) && isfinite(res->bubble_fraction);
    for (int a = 0; a < p; a++) finite &= isfinite(res->busy[a]) && isfinite(res->idle[a]);
    if (!finite) {
        rc = invalid(json, "the simulated times are not finite numbers (costs too large?)");
        goto out;
    }
    if (json) {
        printf("{\"valid\":true,\"error\":null,\"schedule\":");
        json_string(stdout, sch->name);
        printf(",\"actors\":%d,\"stages\":%d,\"microbatches\":%d,\"tasks\":%d,"
               "\"messages\":%lld,\"step_time\":%.17g,\"bubble_fraction\":%.17g,"
               "\"replicas\":%d,\"comm_time\":%.17g,\"exposed_comm\":%.17g",
               p, S, sch->nmicro, plan->ntasks, (long long)plan->nmessages, res->step_time,
               res->bubble_fraction, cfg.allreduce ? arm.replicas : 1, res->comm_time,
               res->exposed_comm);
        printf(",\"tensor\":%d,\"tp_time\":%.17g", T, res->tp_time);
        const char *keys[] = { "peak_activations", "busy", "idle", "peak_bytes" };
        for (int k = 0; k < 4; k++) {
            printf(",\"%s\":[", keys[k]);
            for (int a = 0; a < p; a++) {
                if (a) putchar(',');
                if (k == 0) printf("%d", plan->peak[a].act_units);
                else if (k == 1) printf("%.17g", res->busy[a]);
                else if (k == 2) printf("%.17g", res->idle[a]);
                else printf("%zu", plan->peak[a].total);
            }
            putchar(']');
        }
        printf("}\n");
    } else {
        printf("schedule %s: %d actors, %d stages, %d microbatches, %d tasks, %lld messages\n",
               sch->name, p, S, sch->nmicro, plan->ntasks, (long long)plan->nmessages);
        printf("step time %.6g   bubble %.2f%%   (%s channels)\n", res->step_time,
               100 * res->bubble_fraction, rendezvous ? "rendezvous" : "buffered");
        double pct = res->step_time > 0 ? 100 / res->step_time : 0;
        if (T > 1)
            printf("tensor parallelism %d: group all-reduces %.6g per step on the busiest actor "
                   "(%.2f%% of the step), inside its tasks\n", T, res->tp_time, pct * res->tp_time);
        if (cfg.allreduce)
            printf("replicas %d (%d devices): gradient all-reduces %.6g in all, exposed %.6g "
                   "(%.2f%% of the step)\n", arm.replicas, arm.replicas * p * T, res->comm_time,
                   res->exposed_comm, pct * res->exposed_comm);
        if (shaped) {
            int R = cfg.allreduce ? arm.replicas : 1, am = 0;
            double dev = max_device_bytes(plan, R, zero1, &am);
            const sp_mem_peak *pk = &plan->peak[am];
            double opt = zero1 && R > 1 ? (double)pk->opt / R : (double)pk->opt;
            printf("model %.4g TFLOP/s per device (%d devices)\n",
                   step_flops / ((double)p * T * res->step_time) / 1e12, R * p * T);
            printf("memory per device, GB (actor %d, the largest): parameters %.2f, gradients "
                   "%.2f, AdamW %.2f%s, activations %.2f, boundary %.2f; peak %.2f%s\n", am,
                   pk->params / 1e9, pk->grads / 1e9, opt / 1e9, zero1 && R > 1 ? " (ZeRO-1)" : "",
                   pk->acts / 1e9, pk->boundary / 1e9, dev / 1e9,
                   recompute ? " (recomputation)" : "");
        }
        printf("%5s %12s %12s %8s %9s %12s %12s %12s%s\n", "actor", "busy", "idle", "bubble",
               "peak_act", "act_bytes", "bdry_bytes", "peak_bytes", T > 1 ? "           tp" : "");
        for (int a = 0; a < p; a++) {
            printf("%5d %12.6g %12.6g %7.2f%% %9d %12zu %12zu %12zu", a, res->busy[a],
                   res->idle[a], pct * res->idle[a], plan->peak[a].act_units,
                   plan->peak[a].acts, plan->peak[a].boundary, plan->peak[a].total);
            if (T > 1) printf(" %12.6g", res->tp_busy[a]);
            putchar('\n');
        }
    }
out:
    sp_sim_result_free(res);
    sp_plan_free(plan);
    sp_stage_model_free(model);
    sp_schedule_free(sch);
    return rc;
}
