/* One GPU per rank (runtime/gpumap.c): which CUDA device a rank uses, from its rank among
 * the ranks of its host, the devices it can see and the user's override, as the StarPU
 * variables that make StarPU open that device only; and which cores are near it. Pure C,
 * no StarPU, no CUDA: the executor feeds it what the CUDA runtime and hwloc say
 * (runtime/topology.c), the tests nodes of any shape and hwloc XML topologies. Private to
 * runtime/ and its tests. */
#ifndef STARPIPE_RUNTIME_GPUMAP_H
#define STARPIPE_RUNTIME_GPUMAP_H

/* cpu_set_t: define _GNU_SOURCE before the first system header of the file */
#include <sched.h>

#include "starpipe/status.h"

typedef struct {
    int device;       /* CUDA device index among the visible ones; -1: this rank uses none */
    int sharing;      /* how many local ranks use this device (1: its own) */
    char ncuda[8];    /* STARPU_NCUDA */
    char cudaid[16];  /* STARPU_WORKERS_CUDAID, "" when no device */
    char line[256];   /* what the rank says about it (STARPIPE_VERBOSE) */
} sp_gpu_choice;

/* local_rank of local_size ranks on this host; ngpus devices visible to the process;
 * override: STARPIPE_GPU (NULL or "": one device per local rank, round robin when ranks
 * outnumber devices; "none": CPU only; "N": device N; "N,M,...": local rank i takes entry
 * i); visible: CUDA_VISIBLE_DEVICES (NULL: unset), to name the physical device. A bad
 * override is SP_ERR_ARG with one message. */
sp_status sp_gpu_choose(int local_rank, int local_size, int ngpus, const char *override,
                        const char *visible, sp_gpu_choice *out);

/* A Linux CPU list ("0-15,32-47", as taskset and sysfs write them). */
sp_status sp_parse_cpulist(const char *text, cpu_set_t *set);

/* One PU of the host as hwloc sees it (runtime/topology.c fills them, the tests too):
 * its OS index, its physical core (any id unique on the host: hyperthreads of one core
 * share it), its NUMA node and its package (OS indexes; -1: unknown). */
typedef struct {
    int os, core, numa, package;
} sp_pu;

/* The CPUs this local rank may use, in the order its threads should take them; returns
 * their count (0: the ranks outnumber the cores). pus[npus]: the host's PUs in hwloc's
 * logical order (NULL: each CPU its own core, nothing known). masks[lsize]: each local
 * rank's launcher mask. near (may be NULL): per local rank, the CPUs near its GPU (empty:
 * unknown).
 * - Masks the launcher made disjoint are kept: each rank has its own (a lone rank is
 *   treated as below, within its mask).
 * - Else the ranks whose GPUs sit under the same NUMA node (or package, when the NUMA node
 *   is unknown) split that node's physical cores evenly, in logical order; ranks without a
 *   GPU split the whole host's cores; more ranks than cores split the hyperthreads.
 * Either way the list holds one PU of each physical core first, then the cores' other
 * hyperthreads: workers take whole cores, and a sibling goes only to a thread left over
 * when no core of the share is (the CUDA driver thread, the StarPU-MPI progress thread,
 * workers beyond the cores). numa (may be NULL): the NUMA node of all the CPUs, else -1. */
int sp_binding_split(const sp_pu *pus, int npus, const cpu_set_t *masks, int lsize, int lrank,
                     const cpu_set_t *near, int *cpus, int *numa);

#endif
