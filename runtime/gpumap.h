/* One GPU per rank (runtime/gpumap.c): which CUDA device a rank uses, from its rank among
 * the ranks of its host, the devices it can see and the user's override, as the StarPU
 * variables that make StarPU open that device only; and which cores are near it. Pure C,
 * no StarPU, no CUDA: the executor feeds it what the CUDA runtime and sysfs say, the tests
 * feed it nodes of any shape. Private to runtime/ and its tests. */
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

/* A Linux CPU list ("0-15,32-47", as in /sys/bus/pci/devices/X/local_cpulist). */
sp_status sp_parse_cpulist(const char *text, cpu_set_t *set);

/* The CPUs this local rank may use: when the launcher gave the ranks disjoint masks, its
 * own; else the union of all masks split evenly. near (may be NULL): per local rank, the
 * CPUs near its GPU (empty: unknown); the ranks near the same CPUs then split those CPUs
 * among themselves, so each rank's workers sit on its GPU's socket. cpus: OS numbers. */
int sp_binding_split(const cpu_set_t *all, int lsize, int lrank, const cpu_set_t *near,
                     int *cpus);

#endif
