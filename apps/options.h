/* The apps' shared options (options.c) and their parser. */
#ifndef STARPIPE_APP_OPTIONS_H
#define STARPIPE_APP_OPTIONS_H

#include "apps/driver.h"

typedef struct {
    int steps, microbatches, chunks, actors, seed, reference, check, save_every, skip_nonfinite;
    int replicas, shard_optimizer;
    int tensor; /* --tensor T: ranks per actor (tensor parallelism); 0: STARPIPE_TENSOR, 1 */
    int bf16; /* --precision bf16 */
    int recompute; /* --recompute: every stage */
    int recompute_stages[1024], nrecompute; /* --recompute-stages */
    float lr, clip;
    /* the learning-rate schedule (sp_lr_schedule): --warmup, --lr-min, --lr-decay, and
     * --decay-steps, its horizon (0: the run's last step, see app_horizon, settings.h) */
    int warmup, lr_decay, decay_steps;
    float lr_min;
    float peak_tflops; /* --peak-tflops: MFU's peak per device; 0: measured or datasheet */
    const char *schedule, *save, *load, *init, *dump_grads, *rank_order, *log;
    /* --profile FILE: write what the run measured; --calibrate FILE: predict this run's
     * step from such a file (apps/profile.c) */
    const char *profile, *calibrate;
    /* --link BW[,LATENCY]: --calibrate's messages at BW bytes/s (and LATENCY s) instead of
     * the profile's link (0: the profile's) */
    double link_bw, link_lat;
    int memory_cap; /* --memory-cap N: the schedule auto's activations per actor (0: 1F1B's) */
    /* evaluation: every N steps and at the end (0: off), on K held-out microbatches (0:
     * R x m, one step's worth) */
    int eval_every, eval_batches;
    /* sampling after training: N bytes (0: off) after the prompt, seeded (-1: --seed) */
    int sample, top_k, sample_seed;
    float temperature;
    const char *prompt;
    /* --tokenizer FILE: a tokenizer.json whose decoder prints the sample (loaded with the
     * options, on every rank, so a bad file stops the run before it starts) */
    const char *tokenizer;
    struct sp_tokenizer *tok;
    /* --data-format: how a model's --data file is read (SP_APP_DATA_*) */
    int data_format;
    /* --save-on-signal SIG: the signal (0: none) that checkpoints at the next step
     * boundary and ends the run; --total-steps N: the run ends at step N (0: --steps) */
    int save_on_signal, total_steps;
    unsigned long long given; /* which flags the command line gave (sp_app_given) */
} sp_app_opts;

/* --data-format: auto reads UTF-8 text as bytes or token shards with a valid header and
 * refuses anything else; text and shard insist on one of them; raw trains on the bytes
 * of a file that is neither (data the user says are bytes). */
enum { SP_APP_DATA_AUTO, SP_APP_DATA_TEXT, SP_APP_DATA_SHARD, SP_APP_DATA_RAW };
const char *sp_app_data_format_name(int format);

/* What the launcher tells, before MPI is up: this process's rank (0 when not under
 * mpirun), the number of ranks (1), the ranks on this machine and the rank among them.
 * Open MPI's variables, PMI's, and under srun Slurm's (SLURM_PROCID, SLURM_STEP_NUM_TASKS,
 * SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID). */
int sp_app_launcher_rank(void);
int sp_app_launcher_size(void);
int sp_app_launcher_local_size(void);
int sp_app_launcher_local_rank(void);
/* Tasks on node (0-based) of a Slurm task count list such as "2(x3),1"; -1 if the list
 * is malformed or has no such node. */
int sp_app_slurm_tasks_on_node(const char *spec, int node);

/* Parses argv into o and the model's configuration. 1: run; 0: exit 0 (--help printed);
 * -1: a bad command line (one message printed on rank 0). */
int sp_app_parse(int argc, char **argv, const sp_app_model *m, sp_app_opts *o);

/* Whether the command line gave `flag` (one that takes a value). */
int sp_app_given(const sp_app_model *m, const sp_app_opts *o, const char *flag);
/* Sets one flag that takes a value, as the command line would: 1 taken, 0 a bad value
 * (one message on rank 0), -1 a flag this app does not have. */
int sp_app_apply(const sp_app_model *m, sp_app_opts *o, const char *flag, const char *value);

#endif
