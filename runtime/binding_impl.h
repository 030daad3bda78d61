/* Per-rank core sets for several ranks on one host (runtime/binding.c). */
#ifndef STARPIPE_BINDING_IMPL_H
#define STARPIPE_BINDING_IMPL_H

#include <sched.h> /* cpu_set_t: the including file defines _GNU_SOURCE first */
#include <stddef.h>

#include <mpi.h>

#include "starpipe/status.h"

#define SP_BINDING_MAXW 64

typedef struct sp_binding {
    int local_rank, local_size;
    int nworkers;                     /* CPU workers of this rank */
    int nobind;                       /* 1: ranks outnumber cores, nothing is bound */
    int worker_cpus[SP_BINDING_MAXW]; /* hwloc logical PU ids */
    int mpi_cpu;                      /* where the StarPU-MPI progress thread goes */
    int cuda_cpu;                     /* the CUDA worker's core; -1 without a GPU */
    int starved;                      /* 1: a GPU rank the launcher bound to one core while
                                         the host has cores to spare */
    char desc[256];                   /* for the verbose line */
} sp_binding;

/* Collective over node (the ranks of this host). want: CPU workers asked for. near
 * (may be NULL): the CPUs near this rank's GPU, where its workers should sit. gpus: CUDA
 * workers of this rank (0 or 1), whose driver thread gets a core of its own if one is
 * spare. */
sp_status sp_binding_plan(MPI_Comm node, int want, const cpu_set_t *near, int gpus,
                          sp_binding *b);
/* The CPUs near the PCI device busid (as a device kind's bus_id writes it), from the
 * host's hwloc topology (loaded once for the process, runtime/topology.c); empty when
 * unknown. where: the hwloc object they belong to, e.g. "Package L#1" ("" when unknown). */
void sp_binding_near(const char *busid, cpu_set_t *near, char *where, size_t len);
/* Exports the plan as StarPU variables; ones the user already set are kept. */
void sp_binding_apply(const sp_binding *b);

#endif
