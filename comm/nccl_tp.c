/* Tensor groups over NCCL (comm/nccl_tp.h). The all-gather is grouped sends and receives
 * to and from each other member (what the fake device's NCCL implements too), which NCCL
 * runs as one operation on the stream; the member's own part is a device copy on the same
 * stream. The sum over the parts is the caller's (runtime/group_gpu.c), in the group's
 * one order. */
#include "comm/nccl_tp.h"

#include "comm/nccl_chain.h"

#include <stdlib.h>

#if defined(STARPIPE_HAVE_CUDA) && defined(STARPIPE_HAVE_NCCL)
#include <cuda_runtime_api.h>
#include <nccl.h>

struct sp_nccl_tp {
    ncclComm_t comm;
    int size, rank;
    int chained; /* in the rank's one NCCL order (comm/nccl_chain.h): from the first step */
};

enum { TP_CUDA = 1 << 20 }; /* codes above: a cudaError_t + TP_CUDA; below: ncclResult_t */

const char *sp_nccl_tp_error(int code)
{
    return code >= TP_CUDA ? cudaGetErrorString((cudaError_t)(code - TP_CUDA))
                           : ncclGetErrorString((ncclResult_t)code);
}

int sp_nccl_tp_exchange(sp_nccl_tp *g, const float *const *send, const size_t *scount,
                        float *const *recv, const size_t *rcount, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    int ce = g->chained ? sp_nccl_chain_enter(stream) : 0; /* after the rank's previous one */
    if (ce) return TP_CUDA + ce;
    ncclResult_t r = ncclGroupStart();
    for (int q = 0; q < g->size && r == ncclSuccess; q++) {
        if (q == g->rank) continue;
        r = ncclSend(send[q], scount[q], ncclFloat32, q, g->comm, s);
        if (r == ncclSuccess) r = ncclRecv(recv[q], rcount[q], ncclFloat32, q, g->comm, s);
    }
    ncclResult_t e = ncclGroupEnd();
    ce = g->chained ? sp_nccl_chain_leave(stream) : 0;
    return r != ncclSuccess ? (int)r : e != ncclSuccess ? (int)e : ce ? TP_CUDA + ce : 0;
}

int sp_nccl_tp_allgather(sp_nccl_tp *g, const float *src, float *all, size_t n, void *stream)
{
    cudaError_t ce = cudaMemcpyAsync(all + (size_t)g->rank * n, src, n * sizeof(float),
                                     cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
    if (ce != cudaSuccess) return TP_CUDA + (int)ce;
    const float *send[SP_NCCL_TP_MAX];
    float *recv[SP_NCCL_TP_MAX];
    size_t count[SP_NCCL_TP_MAX];
    for (int q = 0; q < g->size; q++) send[q] = src, recv[q] = all + (size_t)q * n, count[q] = n;
    return sp_nccl_tp_exchange(g, send, count, recv, count, stream);
}

int sp_nccl_tp_rank(const sp_nccl_tp *g) { return g->rank; }

sp_status sp_nccl_tp_create(MPI_Comm group, int device, sp_nccl_tp **out)
{
    *out = NULL;
    sp_nccl_tp *g = calloc(1, sizeof *g);
    int bad = !g;
    if (g) {
        MPI_Comm_size(group, &g->size);
        MPI_Comm_rank(group, &g->rank);
    }
    ncclUniqueId id;
    if (!bad && g->rank == 0) bad = ncclGetUniqueId(&id) != ncclSuccess;
    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, group);
    if (any) {
        free(g);
        return sp_set_error(SP_ERR_RUNTIME, "tensor group: no NCCL id");
    }
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, group);
    ncclResult_t r = cudaSetDevice(device) == cudaSuccess
                         ? ncclCommInitRank(&g->comm, g->size, id, g->rank) : ncclUnhandledCudaError;
    /* connected now: one all-gather of a float, not inside the first step's first task */
    float *d = NULL;
    int rc = r;
    if (rc == ncclSuccess)
        rc = cudaMalloc((void **)&d, sizeof(float) * (size_t)(g->size + 1)) == cudaSuccess ? 0 : TP_CUDA;
    if (rc == 0) rc = sp_nccl_tp_allgather(g, d + g->size, d, 1, NULL);
    if (rc == 0 && cudaStreamSynchronize(NULL) != cudaSuccess) rc = TP_CUDA;
    if (d) cudaFree(d);
    int failed = rc != 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, group);
    if (any) {
        if (r == ncclSuccess) ncclCommDestroy(g->comm);
        free(g);
        return sp_set_error(SP_ERR_RUNTIME, "tensor group: NCCL could not connect its members "
                            "(%s; NCCL refuses two members on one GPU: a group needs a GPU "
                            "per rank)", rc ? sp_nccl_tp_error(rc) : "on another member");
    }
    g->chained = 1;
    *out = g;
    return SP_OK;
}

void sp_nccl_tp_free(sp_nccl_tp *g)
{
    if (!g) return;
    ncclCommDestroy(g->comm);
    free(g);
}

#else /* no NCCL or no CUDA in this build */

struct sp_nccl_tp { int unused; };

sp_status sp_nccl_tp_create(MPI_Comm group, int device, sp_nccl_tp **out)
{
    (void)group, (void)device;
    *out = NULL;
    return sp_set_error(SP_ERR_RUNTIME, "tensor parallelism on GPU ranks needs NCCL, and this "
                        "build has none");
}

void sp_nccl_tp_free(sp_nccl_tp *g) { (void)g; }

int sp_nccl_tp_allgather(sp_nccl_tp *g, const float *src, float *all, size_t n, void *stream)
{
    (void)g, (void)src, (void)all, (void)n, (void)stream;
    return 1;
}

int sp_nccl_tp_exchange(sp_nccl_tp *g, const float *const *send, const size_t *scount,
                        float *const *recv, const size_t *rcount, void *stream)
{
    (void)g, (void)send, (void)scount, (void)recv, (void)rcount, (void)stream;
    return 1;
}

int sp_nccl_tp_rank(const sp_nccl_tp *g)
{
    (void)g;
    return 0;
}

const char *sp_nccl_tp_error(int code)
{
    (void)code;
    return "no NCCL in this build";
}
#endif
