/* NCCL transfers between GPU actors. One communicator over all ranks, bootstrapped with
 * an MPI broadcast of the unique id. A group of the plan's messages (sp_nccl_calls) is
 * one ordered task on the rank's CUDA worker: ncclGroupStart, ncclSend/ncclRecv, End,
 * enqueued on the worker's stream. NCCL's point-to-point calls block on the device and
 * channels are ordered, so each rank must issue them in the plan's global message order:
 * the ordered policy runs the tasks in that order (tests/sched/test_nccl_order.c checks
 * that the calls pair up). Without NCCL, a GPU, or with two ranks on one GPU (NCCL
 * refuses that), every message stays on StarPU-MPI and sp_exec_nccl_init says why. */
#include <stdio.h>

#include <starpu_mpi.h>

#include "runtime/exec_impl.h"

#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>

static ncclComm_t comm;
static int active, tried;
static char why[256]; /* the notice of the first call: later calls return it again */

int sp_exec_nccl_active(void) { return active; }

/* Collective: 1 on every rank if bad is set on any. */
static int anyone(int bad)
{
    double v = bad ? 1.0 : 0.0;
    if (sp_exec_allreduce_sum(&v, 1, 1) != SP_OK)
        return 1;
    return v > 0;
}

static sp_status nccl_start(char *notice, size_t len);

/* Once per process: every trainer of a run shares the communicator. */
sp_status sp_exec_nccl_init(char *notice, size_t len)
{
    sp_status st = SP_OK;
    if (!tried) {
        st = nccl_start(why, sizeof why);
        tried = st == SP_OK;
    }
    snprintf(notice, len, "%s", why);
    return st;
}

static sp_status nccl_start(char *notice, size_t len)
{
    notice[0] = '\0';
    active = 0;
    int P = sp_exec_size_, me = sp_exec_rank_;
    if (anyone(sp_exec_num_cuda() != 1)) {
        snprintf(notice, len, "NCCL needs one CUDA worker on every rank: transfers use "
                 "StarPU-MPI");
        return SP_OK;
    }
    int worker = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
    int dev = starpu_worker_get_devid(worker);
    char bus[32] = "", *all = me == 0 ? calloc((size_t)P, sizeof bus) : NULL;
    int bad = cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess || (me == 0 && !all);
    sp_status st = sp_exec_gather(bus, sizeof bus, all, 0);
    if (st) {
        free(all);
        return st;
    }
    int shared = 0;
    for (int a = 0; me == 0 && all && a < P; a++)
        for (int b = a + 1; b < P; b++)
            shared |= strcmp(all + a * sizeof bus, all + b * sizeof bus) == 0;
    free(all);
    if ((st = sp_exec_bcast(&shared, sizeof shared, 0)))
        return st;
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
    if ((st = sp_exec_bcast(&id, sizeof id, 0)))
        return st;
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

void sp_exec_nccl_shutdown(void)
{
    if (active)
        ncclCommDestroy(comm);
    active = tried = 0;
}

int sp_exec_nccl_group(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                       void *stream)
{
    const sp_exec_nccl_group_args *a = args;
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
        fprintf(stderr, "starpipe: rank %d: NCCL transfer failed: %s\n", sp_exec_rank_,
                ncclGetErrorString(r));
        return (int)r;
    }
    return 0;
}

#else /* no NCCL in this build */

int sp_exec_nccl_active(void) { return 0; }

sp_status sp_exec_nccl_init(char *notice, size_t len)
{
    snprintf(notice, len, "built without NCCL: transfers use StarPU-MPI");
    return SP_OK;
}

void sp_exec_nccl_shutdown(void) {}

int sp_exec_nccl_group(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                       void *stream)
{
    (void)bufs, (void)counts, (void)nbufs, (void)args, (void)stream;
    return -1;
}

#endif
