/* Before the first step: whether the run fits (preflight.c), so that a run too large for
 * its machine, its job's limits or its GPUs says so before any work, naming the part, the
 * bytes, the limit that binds and the flag that lowers it. */
#ifndef STARPIPE_APP_PREFLIGHT_H
#define STARPIPE_APP_PREFLIGHT_H

#include <stddef.h>

#include "apps/options.h"
#include "starpipe/plan.h"
#include "starpipe/program.h"

/* Before MPI and StarPU start (every rank the same): every tensor within the kernels'
 * limits, and the memory the run will hold (P actors, R replicas, tensor degree T; the
 * reference interpreter's when `reference`) within what this host can give the job and
 * each process its RLIMIT_AS. 1 with a message when it cannot fit; 0 when it fits, or
 * when something else is wrong (a schedule, a data file, a cut), which the run reports
 * the usual way. */
int app_preflight(sp_app_model *m, const sp_app_opts *o, int P, int R, int T, int reference,
                  char *msg, size_t len);

/* After the executor starts, before the trainer places anything: this GPU rank's
 * buffers at their peak (program p, schedule sch, layout lay, K held-out microbatches)
 * and what StarPU, cuBLAS and NCCL take beside them, against its device's free memory
 * (shared by the ranks on one GPU). Collective (every rank calls it, with a GPU or not).
 * 1 when this rank is short, with msg; *buffers: its estimate (0 without a GPU);
 * verbose >= 1 prints it. */
int app_device_memory_short(const sp_app_model *m, const sp_app_opts *o, const sp_program *p,
                            const sp_schedule *sch, const sp_layout *lay, int K, int verbose,
                            double *buffers, char *msg, size_t len);

/* After the run (STARPIPE_VERBOSE=1): what the device holds now, against the estimate. */
void app_device_memory_used(int step, double buffers);

#endif
