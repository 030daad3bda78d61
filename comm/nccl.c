/* NCCL transfers between GPU actors. One communicator over all ranks, bootstrapped with
 * an MPI broadcast of the unique id. A group of the plan's messages (sp_nccl_calls) is
 * one ordered task on the rank's CUDA worker: ncclGroupStart, ncclSend/ncclRecv, End,
 * enqueued on the worker's stream. NCCL's point-to-point calls block on the device and
 * channels are ordered, so each rank must issue them in the plan's global message order:
 * the ordered policy runs the tasks in that order (tests/sched/test_nccl_order.c checks
 * that the calls pair up). Without NCCL, a GPU, or with two ranks on one GPU (NCCL
 * refuses that), every message stays on StarPU-MPI and sp_comm_nccl_init says why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <starpu_mpi.h>

#include "comm/comm.h"

#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>

static ncclComm_t comm;
static int active, tried, my_rank;
static char why[256]; /* the notice of the first call: later calls return it again */

int sp_comm_nccl_active(void) { return active; }

static MPI_Comm mpi; /* the communicator of the bootstrap */

/* Collective: 1 on every rank if bad is set on any (also when MPI itself fails). */
static int anyone(int bad)
{
    int v = bad, any = 1;
    if (MPI_Allreduce(&v, &any, 1, MPI_INT, MPI_MAX, mpi) != MPI_SUCCESS)
        return 1;
    return any;
}

static sp_status mpi_failed(const char *call)
{
    return sp_set_error(SP_ERR_RUNTIME, "%s:%d: %s failed during the NCCL bootstrap", __FILE__,
                        __LINE__, call);
}

static sp_status nccl_start(int ncuda, char *notice, size_t len);

/* Once per process: every trainer of a run shares the communicator. */
sp_status sp_comm_nccl_init(MPI_Comm c, int ncuda, char *notice, size_t len)
{
    sp_status st = SP_OK;
    mpi = c;
    if (!tried) {
        st = nccl_start(ncuda, why, sizeof why);
        tried = st == SP_OK;
    }
    snprintf(notice, len, "%s", why);
    return st;
}

static sp_status nccl_start(int ncuda, char *notice, size_t len)
{
    notice[0] = '\0';
    active = 0;
    int P, me;
    if (MPI_Comm_size(mpi, &P) != MPI_SUCCESS || MPI_Comm_rank(mpi, &me) != MPI_SUCCESS)
        return mpi_failed("MPI_Comm_size");
    my_rank = me;
    if (anyone(ncuda != 1)) {
        snprintf(notice, len, "NCCL needs one CUDA worker on every rank: transfers use "
                 "StarPU-MPI");
        return SP_OK;
    }
    int worker = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
    int dev = starpu_worker_get_devid(worker);
    char bus[32] = "", *all = me == 0 ? calloc((size_t)P, sizeof bus) : NULL;
    int bad = cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess || (me == 0 && !all);
    if (MPI_Gather(bus, (int)sizeof bus, MPI_BYTE, all, (int)sizeof bus, MPI_BYTE, 0, mpi) !=
        MPI_SUCCESS) {
        free(all);
        return mpi_failed("MPI_Gather");
    }
    int shared = 0;
    for (int a = 0; me == 0 && all && a < P; a++)
        for (int b = a + 1; b < P; b++)
            shared |= strcmp(all + a * sizeof bus, all + b * sizeof bus) == 0;
    free(all);
    if (MPI_Bcast(&shared, 1, MPI_INT, 0, mpi) != MPI_SUCCESS)
        return mpi_failed("MPI_Bcast");
    if (anyone(bad)) {
        snprintf(notice, len, "cannot identify the GPUs: transfers use StarPU-MPI");
        return SP_OK;
    }
    if (shared) {
        snprintf(notice, len, "two ranks share one GPU (NCCL refuses that): transfers use "
                 "StarPU-MPI");
        return SP_OK;
    }
    ncclUniqueId id;
    bad = me == 0 && ncclGetUniqueId(&id) != ncclSuccess;
    if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, mpi) != MPI_SUCCESS)
        return mpi_failed("MPI_Bcast");
    ncclResult_t r = ncclInternalError;
    if (!anyone(bad) && cudaSetDevice(dev) == cudaSuccess)
        r = ncclCommInitRank(&comm, P, id, me);
    if (anyone(r != ncclSuccess)) {
        if (r == ncclSuccess)
            ncclCommDestroy(comm);
        snprintf(notice, len, "NCCL initialisation failed (%s on rank %d): transfers use "
                 "StarPU-MPI", ncclGetErrorString(r), me);
        return SP_OK;
    }
    active = 1;
    return SP_OK;
}

void sp_comm_nccl_shutdown(void)
{
    if (active)
        ncclCommDestroy(comm);
    active = tried = 0;
}

int sp_comm_nccl_group(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                       void *stream)
{
    const sp_comm_nccl_group_args *a = args;
    if (nbufs != a->n)
        return -1;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; r == ncclSuccess && i < a->n; i++)
        r = a->is_send[i] ? ncclSend(bufs[i], counts[i], ncclFloat32, a->peer[i], comm,
                                     (cudaStream_t)stream)
                          : ncclRecv(bufs[i], counts[i], ncclFloat32, a->peer[i], comm,
                                     (cudaStream_t)stream);
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess)
        r = e;
    if (r != ncclSuccess) {
        fprintf(stderr, "starpipe: rank %d: NCCL transfer failed: %s\n", my_rank,
                ncclGetErrorString(r));
        return (int)r;
    }
    return 0;
}

#else /* no NCCL in this build */

int sp_comm_nccl_active(void) { return 0; }

sp_status sp_comm_nccl_init(MPI_Comm c, int ncuda, char *notice, size_t len)
{
    (void)c, (void)ncuda;
    snprintf(notice, len, "built without NCCL: transfers use StarPU-MPI");
    return SP_OK;
}

void sp_comm_nccl_shutdown(void) {}

int sp_comm_nccl_group(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                       void *stream)
{
    (void)bufs, (void)counts, (void)nbufs, (void)args, (void)stream;
    return -1;
}

#endif
