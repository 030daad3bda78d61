/* Where each rank's StarPU workers and StarPU-MPI progress thread run when several
 * ranks share a host. Left alone, StarPU binds every rank's first worker to the same
 * core and puts the MPI thread on the "next" core, which belongs to another rank. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/binding_impl.h"
#include "runtime/checks.h"
#include "runtime/gpumap.h"
#include "runtime/topology.h"

void sp_binding_near(const char *busid, cpu_set_t *near, char *where, size_t len)
{
    sp_topo *topo;
    CPU_ZERO(near);
    if (where && len) where[0] = '\0';
    if (sp_topo_host(1, &topo) == SP_OK)
        sp_topo_pci_cpus(topo, busid, near, where, len);
}

sp_status sp_binding_plan(MPI_Comm node, int want, const cpu_set_t *near, int gpus,
                          sp_binding *b)
{
    memset(b, 0, sizeof *b);
    b->mpi_cpu = b->cuda_cpu = -1;
    int lrank, lsize;
    SP_MPI_CHECK(MPI_Comm_rank(node, &lrank));
    SP_MPI_CHECK(MPI_Comm_size(node, &lsize));
    b->local_rank = lrank;
    b->local_size = lsize;

    cpu_set_t mine[2]; /* this rank's mask, and the CPUs near its GPU (empty: none known) */
    if (sched_getaffinity(0, sizeof mine[0], &mine[0]) != 0)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: sched_getaffinity failed", __FILE__, __LINE__);
    if (near) mine[1] = *near;
    else CPU_ZERO(&mine[1]);
    cpu_set_t *all = malloc(2 * (size_t)lsize * sizeof *all);
    cpu_set_t *masks = malloc((size_t)lsize * sizeof *masks);
    cpu_set_t *nears = malloc((size_t)lsize * sizeof *nears);
    if (!all || !masks || !nears) {
        free(all), free(masks), free(nears);
        return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
    }
    int rc = MPI_Allgather(mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, node);
    if (rc != MPI_SUCCESS) {
        free(all), free(masks), free(nears);
        return sp_comm_mpi_error(__FILE__, __LINE__, "MPI_Allgather", rc);
    }
    for (int i = 0; i < lsize; i++) masks[i] = all[2 * i], nears[i] = all[2 * i + 1];
    /* The CPUs this rank may use, in OS numbering, one PU per physical core first
     * (runtime/gpumap.c), from the host's cores, NUMA nodes and packages (hwloc: the
     * ranks of a host see the same). StarPU's binding ids are hwloc logical PU indexes. */
    sp_topo *topo = NULL;
    sp_pu *pus = malloc(CPU_SETSIZE * sizeof *pus);
    sp_status st = pus ? sp_topo_host(0, &topo)
                       : sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
    int cpus[CPU_SETSIZE], numa = -1, ncpus = 0, npus = 0;
    if (!st) {
        npus = sp_topo_pus(topo, pus, CPU_SETSIZE);
        ncpus = sp_binding_split(pus, npus, masks, lsize, lrank, nears, cpus, &numa);
    }
    free(all), free(masks), free(nears), free(pus);
    if (st)
        return st;

    b->nworkers = want < 1 ? 1 : want;
    /* mpirun binds each of 2 ranks to one core by default: a GPU rank's CUDA worker (whose
     * driver thread polls), CPU worker and MPI progress thread then share it. Measured on
     * an H200, 2 ranks sharing the GPU: 415-469 ms per step bound so, 145 ms unbound. */
    b->starved = gpus > 0 && ncpus == 1 && npus > lsize;
    if (ncpus == 0) {
        /* More ranks than cores: any fixed binding would stack ranks unevenly; let the
         * kernel balance one unbound worker per rank. */
        b->nobind = 1;
        b->nworkers = 1;
        snprintf(b->desc, sizeof b->desc, "unbound (%d ranks share the host's cores)", lsize);
        return SP_OK;
    }
    if (b->nworkers > ncpus)
        b->nworkers = ncpus;
    /* A CUDA worker's driver thread polls its device all the time: it takes a core of its
     * own when the rank has one to spare, after the CPU workers' (StarPU numbers the CPU
     * workers first and binds workers in the order of STARPU_WORKERS_CPUID); with none to
     * spare it shares the first (StarPU says so once at start-up). */
    int cuda_at = gpus > 0 ? (b->nworkers < ncpus ? b->nworkers : 0) : -1;
    if (b->nworkers > STARPU_MAXCPUS)
        b->nworkers = STARPU_MAXCPUS;
    if (b->nworkers > SP_BINDING_MAXW)
        b->nworkers = SP_BINDING_MAXW;

    int len = snprintf(b->desc, sizeof b->desc, "cpus");
    for (int i = 0; i < b->nworkers; i++) {
        b->worker_cpus[i] = sp_topo_logical(topo, cpus[i]);
        if (len < (int)sizeof b->desc)
            len += snprintf(b->desc + len, sizeof b->desc - (size_t)len, " %d", cpus[i]);
    }
    b->cuda_cpu = cuda_at >= 0 ? sp_topo_logical(topo, cpus[cuda_at]) : -1;
    if (cuda_at >= 0 && len < (int)sizeof b->desc)
        len += snprintf(b->desc + len, sizeof b->desc - (size_t)len, ", CUDA worker cpu %d",
                        cpus[cuda_at]);
    if (len < (int)sizeof b->desc) {
        if (numa >= 0)
            len += snprintf(b->desc + len, sizeof b->desc - (size_t)len, ", NUMA node %d", numa);
        else
            len += snprintf(b->desc + len, sizeof b->desc - (size_t)len,
                            ", NUMA node unknown or several");
    }
    /* The progress thread takes a spare core of this rank if there is one; else it is
     * left unbound (-1): as fast as sharing the worker's core (docs/runtime.md), and
     * StarPU then does not warn on every start about binding two threads to one core. */
    int used = b->nworkers + (cuda_at >= b->nworkers ? 1 : 0);
    b->mpi_cpu = used < ncpus ? sp_topo_logical(topo, cpus[used]) : -1;
    for (int i = 0; i < b->nworkers; i++)
        if (b->worker_cpus[i] < 0)
            return sp_set_error(SP_ERR_RUNTIME, "%s:%d: hwloc does not know CPU %d",
                                __FILE__, __LINE__, cpus[i]);
    return SP_OK;
}

/* Environment variables, not starpu_conf fields, so that a user who sets one by hand
 * (STARPU_NCPU, STARPU_WORKERS_CPUID, STARPU_MPI_THREAD_CPUID, ...) keeps control. */
void sp_binding_apply(const sp_binding *b)
{
    char v[16 * SP_BINDING_MAXW];
    snprintf(v, sizeof v, "%d", b->nworkers);
    setenv("STARPU_NCPU", v, 0);
    /* The plan keeps to the launcher's binding already. StarPU 1.4 reads that binding
     * too (STARPU_WORKERS_GETBIND: default 1 in 1.4, 0 in 1.3) and then warns on every
     * start when it is one core, as with mpirun's default for 2 ranks on 2 cores. The ids
     * of STARPU_WORKERS_CPUID are the host's logical PUs either way (1.4: topology.c,
     * _starpu_initialize_workers_bindid), so only the warning goes. */
    setenv("STARPU_WORKERS_GETBIND", "0", 0);
    if (b->nobind) {
        setenv("STARPU_WORKERS_NOBIND", "1", 0);
        setenv("STARPU_MPI_NOBIND", "1", 0);
        return;
    }
    int len = 0;
    for (int i = 0; i < b->nworkers; i++)
        len += snprintf(v + len, sizeof v - (size_t)len, "%s%d", i ? " " : "", b->worker_cpus[i]);
    if (b->cuda_cpu >= 0) /* the CUDA worker comes after the CPU workers */
        len += snprintf(v + len, sizeof v - (size_t)len, " %d", b->cuda_cpu);
#if STARPU_MAJOR_VERSION > 1 || STARPU_MINOR_VERSION >= 4
    /* StarPU 1.4 reserves the progress thread's PU out of this list before it binds any
     * worker (topology.c, _starpu_init_machine_config, "Reserve thread for MPI"). One not
     * in the list takes the list's first entry instead, with a warning on every start, and
     * each worker then gets the PU planned for the next one (the CUDA worker another
     * core than the one near its GPU). Listed last, it takes its own; 1.3 has no such
     * step, and there the extra entry would be unused. */
    if (b->mpi_cpu >= 0)
        len += snprintf(v + len, sizeof v - (size_t)len, " %d", b->mpi_cpu);
#endif
    setenv("STARPU_WORKERS_CPUID", v, 0);
    if (b->mpi_cpu < 0) {
        setenv("STARPU_MPI_NOBIND", "1", 0);
        return;
    }
    snprintf(v, sizeof v, "%d", b->mpi_cpu);
    setenv("STARPU_MPI_THREAD_CPUID", v, 0);
}
