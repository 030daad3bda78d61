/* Layout search: the best ways to train a GPT or a Llama on a cluster, each layout planned
 * and simulated by the planner (plan.h), plus the device descriptions it runs on. Pure C:
 * no StarPU, no MPI. What is searched and how it is pruned: docs/planner.md, section 10.
 *
 *   sp_search_config c = { .llama = &shape, .devices = 64, .global_batch = 128,
 *                          .device = *sp_device_spec_find("h100") };
 *   sp_search_result *r;
 *   if (sp_search(&c, &r)) die(sp_last_error());     // nothing fits: one message
 *   printf("%d x %d x %d: %g s\n", r->best[0].replicas, r->best[0].actors,
 *          r->best[0].tensor, r->best[0].step_time);
 *   sp_search_result_free(r); */
#ifndef STARPIPE_SEARCH_H
#define STARPIPE_SEARCH_H

#include "starpipe/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A device the planner prices layouts for. Datasheet numbers and the efficiency assumed,
 * each with its source: sched/hardware.c and docs/scaling.md. */
typedef struct {
    const char *name;         /* "h100", "h200" */
    const char *title;        /* "NVIDIA H100 SXM5 80GB" */
    double peak_flops;        /* dense bf16 tensor-core FLOP/s: MFU's denominator */
    double efficiency;        /* fraction of the peak the counted FLOPs (matrix products,
                                 attention) run at: assumed, not measured */
    double memory;            /* bytes per device */
    double memory_bw;         /* HBM bytes/s (stated; the cost model has no HBM term) */
    double nvlink_bw;         /* bytes/s per GPU and direction inside a node */
    double nvlink_alpha;      /* seconds per message step inside a node */
    double network_bw;        /* bytes/s per GPU between nodes */
    double network_alpha;     /* seconds per message step between nodes */
    int gpus_per_node;
} sp_device_spec;

int sp_device_spec_count(void);
const sp_device_spec *sp_device_spec_at(int i);
/* By name, case-insensitive; NULL (and a message listing the names) if unknown. */
const sp_device_spec *sp_device_spec_find(const char *name);

/* How many of a stage's R replicas share a node of g GPUs in layout l (actors of T ranks,
 * the tensor rank innermost): what sp_allreduce_model.replicas_per_node wants. */
int sp_layout_replicas_per_node(const sp_layout *l, int gpus_per_node);
/* One device's peak bytes on actor a of a plan run by R replicas, ZeRO-1 or not (the AdamW
 * state of 1/R of the parameters per replica). */
double sp_plan_device_bytes(const sp_plan *plan, int actor, int replicas, int zero1);

/* What is searched: every R x P x T = devices (T dividing the GPUs of a node and what the
 * model splits), B sequences per microbatch and m = global_batch / (R B) microbatches,
 * every built-in schedule valid for (P, m, v) and `auto`, the even cut of the layers and
 * cuts that move layers off the first and last stage, recomputation none, all or only on
 * the actors whose memory binds, ZeRO-1 where it is needed to fit, both rank orders. */
typedef struct {
    const sp_gpt_shape *gpt;     /* one model: its batch, tensor, stage_layers and */
    const sp_llama_shape *llama; /* device_flops are the search's to choose */
    int gpt_heads;               /* the GPT's heads, which T divides (the apps split by
                                    heads); 0: channels / 128, or / 64, or 1 */
    int devices;
    int global_batch;            /* sequences per optimizer step */
    sp_device_spec device;       /* rates, memory, links, GPUs per node */
    double grad_bytes;           /* bytes per gradient element all-reduced; 0: 2 (bf16) */
    int max_batch;               /* the largest B tried; 0: 8 */
    int max_auto_tasks;          /* `auto` only where P x m <= this; 0: 4096 */
    int top;                     /* how many layouts to keep; 0: 5 */
    int brute_force;             /* 1: simulate every candidate, no bound (the tests) */
} sp_search_config;

typedef struct {
    int replicas, actors, tensor, chunks, micro, batch; /* R P T v m B */
    int stages;                  /* S = v P */
    int *stage_layers;           /* [stages] blocks per stage */
    unsigned char *recompute;    /* [stages] 1: the stage recomputes its activations */
    int nrecompute;              /* how many stages do */
    int zero1;
    sp_rank_order order;
    sp_schedule *schedule;       /* the schedule itself (auto's is synthesized) */
    /* predictions */
    double step_time;            /* seconds */
    double tflops;               /* model FLOPs (no recomputation) per device and second */
    double mfu;                  /* tflops / peak */
    double bubble;               /* the actors' idle share of the step */
    double memory;               /* peak bytes on the busiest device */
    int memory_actor;
    /* where the step goes, as shares of p x step (they add up to 1 with compute) */
    double share_schedule;       /* idle with free links and no replicas' all-reduce */
    double share_p2p;            /* idle the boundary transfers add */
    double share_allreduce;      /* idle the replicas' all-reduce adds (exposed) */
    double share_tensor;         /* the tensor group's all-reduces inside the tasks */
    double share_recompute;      /* the forwards run again */
    char binds[48];              /* the largest loss, and "memory" near the limit */
} sp_search_choice;

typedef struct {
    int n;                       /* best[0..n-1], best first */
    sp_search_choice *best;
    long candidates;             /* layouts enumerated */
    long memory_bounded;         /* refused by a memory bound, never planned */
    long time_bounded;           /* skipped: their step-time bound beat by the n-th best */
    long planned, simulated;     /* plans built; simulations run */
    long refused;                /* planned but over the device's memory */
    double seconds;              /* wall time of the search */
    double flops_per_step;       /* the model's FLOPs of one step (all devices) */
    int heads;                   /* the attention heads T was made to divide */
} sp_search_result;

/* The `top` best layouts by simulated step time (ties: the first enumerated). SP_ERR_ARG
 * with one message when no layout exists (devices that R x P x T cannot make with these
 * constraints) or none fits the device's memory (naming the least any needs). */
sp_status sp_search(const sp_search_config *cfg, sp_search_result **out);
void sp_search_result_free(sp_search_result *r);

/* "2,3x30,2": blocks per stage, runs of equal counts written NxK. */
char *sp_search_format_cut(const int *layers, int n, char *buf, size_t len);
/* "none", "all", "0-3,7": the stages that recompute. */
char *sp_search_format_recompute(const unsigned char *rc, int n, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
