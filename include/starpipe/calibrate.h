/* A machine's costs as one run measured them, and what they predict for another run on
 * the same machine: the profile the apps write (--profile FILE; its format in
 * docs/planner.md, "Calibration") read back, each stage program's time predicted op by
 * op, the plan simulated with those times and the fitted message link, the update phase
 * and the rest of a step added. Pure C: no StarPU, no MPI. */
#ifndef STARPIPE_CALIBRATE_H
#define STARPIPE_CALIBRATE_H

#include "starpipe/plan.h"
#include "starpipe/program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sp_profile sp_profile;

/* NULL, with one message naming the file and line, for a file that is not a profile. */
sp_profile *sp_profile_read(const char *path, sp_status *status);
void sp_profile_free(sp_profile *pf);

/* A profile made in memory from what a run measured (the apps' --schedule auto probe):
 * ops timed (the same op again: one mean; untimed, seconds <= 0: ignored), messages
 * (bytes, the time each added to a path), the runtime's gap between tasks. What a file
 * holds besides (the step, updates, the link probe) stays unknown: zero. */
sp_profile *sp_profile_create(void);
sp_status sp_profile_add_op(sp_profile *pf, const sp_op_desc *d, double seconds);
sp_status sp_profile_add_message(sp_profile *pf, double bytes, double seconds);
void sp_profile_set_gap(sp_profile *pf, double seconds);

/* The caches as a probe met them (the profile's `cache` records): seconds per byte of a
 * streaming op (the library's add) over a working set of `bytes`, every rank at once;
 * sizes ascending. With two or more, a prediction times each task by where its buffers
 * are: a memory-bound op's time (every kernel but the products, attention and the
 * all-reduces) scales with the probe's cost at its task's reuse distance. */
sp_status sp_profile_add_cache(sp_profile *pf, double bytes, double seconds_per_byte);

/* The reuse factor of plan's tasks on this profile's caches, mean[stage * 4 + kind] over
 * the stage's tasks of that kind (1 where none ran, and everywhere without a probe): per
 * task, the probe's cost at the reuse distance of each of its per-microbatch buffers (the
 * bytes the actor touched since it last touched that memory), weighted by bytes, over the
 * probe's least. A profile writes its run's (`reuse` records, before its ops), and its
 * reader takes them out of the memory-bound ops' times. */
sp_status sp_profile_reuse(const sp_profile *pf, const sp_plan *plan,
                           const sp_stage_model *model, double *mean);

/* Predicted seconds of every stage program of p, cost[s * SP_NUM_TASK_KINDS + kind], op
 * by op (sp_program_op): an op of the kernel, sizes and flags the profile measured takes
 * its measured time; another size of that kernel, the time of the nearest measured size
 * (in log sizes) scaled by work; a kernel the profile never timed, the profile's seconds
 * per unit of work of its class (products, attention, the rest), and an all-reduce the
 * message link's time. */
sp_status sp_profile_task_costs(const sp_profile *pf, const sp_program *p, double *cost);
/* The same, and found[3]: how many of the ops of the F, B and W programs took a measured
 * time (the same op), a scaled one (another size of the kernel), a guessed one (a kernel
 * the profile never timed: its class's rate, the link's). */
sp_status sp_profile_task_costs_n(const sp_profile *pf, const sp_program *p, double *cost,
                                  int *found);
/* p's stage model with those costs: *out is a copy whose stages are the returned array
 * (free() it; NULL: out of memory). found as above, may be NULL. */
sp_stage_info *sp_profile_costed_model(const sp_profile *pf, const sp_program *p,
                                      sp_stage_model *out, int *found);

/* The message link fitted to the profile's messages (or sp_profile_set_link's): latency
 * (s) and bandwidth (bytes per second, 0: none fitted, one size only). */
void sp_profile_link(const sp_profile *pf, double *latency, double *bandwidth);
/* Another network than the profiled run's: every message from now on at latency (s; < 0:
 * the wire's, half the link probe's 2-rank all-reduce of its smallest sizes, else the
 * messages' fit) + bytes / bandwidth (bytes per second, > 0). */
void sp_profile_set_link(sp_profile *pf, double latency, double bandwidth);

/* The profile as rates, for models known by their shape only (starpipe-plan --gpt,
 * --llama): the stage programs' FLOPs (sp_program_flops) over their measured task time,
 * all ops included; the message link; the tensor group's link (alpha per step, bytes/s)
 * fitted to the all-reduces of the link probe; the replicas' all-reduce bandwidth (0
 * where the profile had no replicas). */
typedef struct {
    double flops;
    double latency, bandwidth;
    double tp_alpha, tp_bw;
    double ar_bw;
} sp_profile_rate;
void sp_profile_rates(const sp_profile *pf, sp_profile_rate *out);

typedef struct {
    double step_s;   /* span + update + other */
    double span_s;   /* the plan simulated: first task to the last */
    double update_s; /* the slowest rank's AdamW updates (its shard under ZeRO-1) */
    double other_s;  /* the rest of a step (norm, losses, barriers), the profile's */
    double bubble;
    double latency, bandwidth; /* the message link, fitted: seconds, bytes per second */
    int ops[3];      /* the ops measured, scaled, guessed (sp_profile_task_costs_n) */
    int nactors;
    double *mem_bytes; /* [nactors]: a rank of replica 0's buffers, persistent and
                          per-microbatch (sp_predict_memory) */
} sp_prediction;

/* The step of plan (of program p, `replicas` copies, ZeRO-1 when sharded, m microbatches
 * per replica) on the profile's machine. */
sp_status sp_profile_predict(const sp_profile *pf, const sp_program *p, const sp_plan *plan,
                             int replicas, int sharded, sp_prediction *out);
void sp_prediction_free(sp_prediction *pr);

/* Memory of the rank of actor a in replica r, predicted as the runtime allocates it
 * (sp_trainer_memory, transient + persistent): parameters, gradients and AdamW moments of
 * its stages (of its shard when sharded: sp_optim_shards), each stage's task scratch, the
 * replicas' exchange buffers, a tied parameter's two transfer buffers where it spans
 * actors, the per-microbatch pool of the plan (sp_plan_pool_bytes) and the step's
 * inputs. */
double sp_predict_memory(const sp_program *p, const sp_plan *plan, int actor, int replica,
                         int replicas, int sharded);

#ifdef __cplusplus
}
#endif
#endif
