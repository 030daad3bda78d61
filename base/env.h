/* The STARPIPE_* variables: every one is read here (base/env.c) and nowhere else, parsed
 * as strictly as a flag (garbage, an empty value or one out of range is refused, never
 * ignored), and handed to the layer that acts on it as a value: the planner's selection
 * (sched/schedule.c, sched/layout.c), the executor's options (transport, pieces, GPU,
 * TF32) and the trainer's (NCCL threshold, fault injection). Internal to the project
 * (base/, not installed).
 *
 *   sp_env env;
 *   if (sp_env_read(&env)) fprintf(stderr, "%s\n", sp_last_error());
 */
#ifndef STARPIPE_BASE_ENV_H
#define STARPIPE_BASE_ENV_H

#include <stdint.h>

#include "starpipe/status.h"

/* STARPIPE_FAULT, fault injection for tests: nan@STEP (a NaN in the first float input of
 * microbatch 0), fail@STEP:STAGE (that stage's first task of the step fails),
 * hang@STEP:STAGE (it never finishes), late@RANK (the launcher's rank RANK never starts
 * MPI: the others wait in the start-up), group@STEP:RANK (rank RANK's first tensor-group
 * all-reduce of the step fails there alone, inside the group's code, its members
 * meeting it: stage is the rank). Kinds: */
enum { SP_FAULT_NONE = 0, SP_FAULT_FAIL = 1, SP_FAULT_HANG = 2, SP_FAULT_NAN = 3,
       SP_FAULT_LATE = 4, SP_FAULT_GROUP = 5 };
typedef struct {
    int kind, step, stage; /* stage -1 for nan@ and late@; late@: step is the rank */
} sp_fault;
#define SP_FAULT_FORMS "nan@STEP, fail@STEP:STAGE, hang@STEP:STAGE (STEP >= 1, STAGE >= 0), " \
                       "group@STEP:RANK or late@RANK (RANK >= 0)"

/* STARPIPE_NCCL_THRESHOLD: bytes, at most 1 TiB (above it nothing goes through NCCL). */
#define SP_NCCL_THRESHOLD_MAX ((int64_t)1 << 40)
/* The largest STARPIPE_MICROBATCHES and STARPIPE_CHUNKS (the planner's index limit). */
#define SP_ENV_MAX_COUNT ((1 << 20) - 2)
#define SP_ENV_MAX_CHUNKS 64

typedef struct {
    const char *schedule;   /* STARPIPE_SCHEDULE, or NULL */
    int microbatches;       /* STARPIPE_MICROBATCHES, 1..SP_ENV_MAX_COUNT; 0 unset */
    int chunks;             /* STARPIPE_CHUNKS, 1..SP_ENV_MAX_CHUNKS; 0 unset */
    int replicas;           /* STARPIPE_REPLICAS, 1..65536; 0 unset */
    int tensor;             /* STARPIPE_TENSOR, ranks per actor, 1..64; 0 unset */
    const char *rank_order; /* STARPIPE_RANK_ORDER, or NULL (its words: sched/layout.c) */
    const char *trace;      /* STARPIPE_TRACE: a path, or NULL */
    double step_timeout;    /* STARPIPE_STEP_TIMEOUT: seconds, 0 off */
    int verbose;            /* STARPIPE_VERBOSE: 0, 1, 2 */
    sp_fault fault;         /* STARPIPE_FAULT */
    int64_t nccl_threshold; /* STARPIPE_NCCL_THRESHOLD: bytes; -1 unset */
    int tf32;               /* STARPIPE_TF32: 0 or 1 */
    const char *transport;  /* STARPIPE_TRANSPORT: "starpu-mpi" or "direct", or NULL */
    int shm_pieces;         /* STARPIPE_SHM_PIECES: 0, 1; -1 unset */
    int scatter_gather;     /* STARPIPE_SCATTER_GATHER: 0, 1; -1 unset (between hosts) */
    int allreduce;          /* STARPIPE_ALLREDUCE: 0 auto (hierarchical where it pays), -1
                               flat, K > 0 hosts:K (runs of K replicas, for tests) */
    const char *gpu;        /* STARPIPE_GPU, or NULL (its forms: runtime/gpumap.c) */
    const char *device;     /* STARPIPE_DEVICE: a device kind's name or "cpu", or NULL */
} sp_env;

/* Reads and checks every STARPIPE_* variable; the first bad one fails (SP_ERR_ARG, its
 * name and value in the message) and *e holds the defaults. */
sp_status sp_env_read(sp_env *e);

/* The helpers it is made of, for any variable name. */
/* *out = the value of variable `name`, NULL when unset. Set but empty is an error: an
 * empty value is a mistake, never a way to ask for the default. */
sp_status sp_env_string(const char *name, const char **out);
/* An integer variable in [lo, hi]; *out is left as it is when the variable is unset. */
sp_status sp_env_int(const char *name, int64_t lo, int64_t hi, int64_t *out);
/* A finite number variable in [lo, hi]; *out is left as it is when unset. */
sp_status sp_env_double(const char *name, double lo, double hi, double *out);
/* STARPIPE_FAULT alone. */
sp_status sp_env_fault(sp_fault *f);

#endif
