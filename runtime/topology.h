/* The host's topology from hwloc (runtime/topology.c): its PUs with their physical core,
 * NUMA node and package, for sp_binding_split (runtime/gpumap.h), the CPUs near a PCI
 * device, and hwloc's numbering. No MPI, no StarPU: the tests load hwloc XML exports
 * (tests/runtime/topo/). Private to runtime/ and its tests. */
#ifndef STARPIPE_RUNTIME_TOPOLOGY_H
#define STARPIPE_RUNTIME_TOPOLOGY_H

#include <sched.h> /* cpu_set_t: the including file defines _GNU_SOURCE first */
#include <stddef.h>

#include "runtime/gpumap.h"
#include "starpipe/status.h"

typedef struct sp_topo sp_topo;

/* A topology with its PCI devices: xml, an hwloc XML file (NULL: this machine). */
sp_status sp_topo_load(const char *xml, sp_topo **out);
void sp_topo_free(sp_topo *t);
/* This machine's, loaded on first use and kept for the process (StarPU loads its own);
 * io: with its PCI devices (their scan costs some 50 ms: only for a rank with a GPU). */
sp_status sp_topo_host(int io, sp_topo **out);

/* The PUs in hwloc's logical order into pus[max]; returns their count. */
int sp_topo_pus(const sp_topo *t, sp_pu *pus, int max);
/* The CPUs near the PCI device busid ("0000:1b:00.0", as a device kind's bus_id writes
 * it): the cpuset of its first non-I/O ancestor. Returns 0 with set empty when hwloc does
 * not know the device; where (may be NULL): that ancestor, e.g. "Package L#1". */
int sp_topo_pci_cpus(const sp_topo *t, const char *busid, cpu_set_t *set, char *where,
                     size_t len);
/* hwloc's logical index of the PU with OS index os (StarPU's binding ids); -1: none. */
int sp_topo_logical(const sp_topo *t, int os);

#endif
