/* The apps' shared options (options.c) and their parser. */
#ifndef STARPIPE_APP_OPTIONS_H
#define STARPIPE_APP_OPTIONS_H

#include "apps/driver.h"

typedef struct {
    int steps, microbatches, chunks, actors, seed, reference, check, save_every, skip_nonfinite;
    float lr, clip;
    const char *schedule, *save, *load, *dump_grads;
} sp_app_opts;

/* The rank as the launcher tells it, before MPI is up (0 when not under mpirun). */
int sp_app_launcher_rank(void);

/* Parses argv into o and the model's configuration. 1: run; 0: exit 0 (--help printed);
 * -1: a bad command line (one message printed on rank 0). */
int sp_app_parse(int argc, char **argv, const sp_app_model *m, sp_app_opts *o);

#endif
