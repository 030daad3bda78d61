/* The chain of comm/nccl_chain.h: one event per stream that has carried an NCCL
 * operation (a rank has two: NCCL's own and its CUDA worker's compute stream; a few more
 * with several workers), recorded after each operation, and the stream of the latest. The
 * events live as long as the process (a handful of them). */
#include "comm/nccl_chain.h"

#if defined(STARPIPE_HAVE_CUDA) && defined(STARPIPE_HAVE_NCCL)
#include <pthread.h>

#include <cuda_runtime_api.h>

#define CHAIN_STREAMS 16

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    cudaStream_t stream;
    cudaEvent_t done; /* recorded after the stream's latest NCCL operation */
} link_of[CHAIN_STREAMS];
static int nlinks, last = -1; /* last: the link of the latest operation */

static int find(cudaStream_t s)
{
    for (int i = 0; i < nlinks; i++)
        if (link_of[i].stream == s) return i;
    return -1;
}

/* Holds the lock from enter to leave: the operation in between is the only one issued
 * (by any thread of the rank) until it is enqueued. */
int sp_nccl_chain_enter(void *stream)
{
    pthread_mutex_lock(&lock);
    cudaStream_t s = (cudaStream_t)stream;
    if (last >= 0 && link_of[last].stream != s) {
        cudaError_t e = cudaStreamWaitEvent(s, link_of[last].done, 0);
        if (e != cudaSuccess) {
            pthread_mutex_unlock(&lock);
            return (int)e;
        }
    }
    return 0;
}

int sp_nccl_chain_leave(void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    int i = find(s);
    cudaError_t e = cudaSuccess;
    if (i < 0 && nlinks < CHAIN_STREAMS) {
        i = nlinks;
        e = cudaEventCreateWithFlags(&link_of[i].done, cudaEventDisableTiming);
        if (e == cudaSuccess) link_of[i].stream = s, nlinks++;
        else i = -1;
    }
    if (i < 0 && e == cudaSuccess) e = cudaErrorNotSupported; /* more streams than links */
    if (i >= 0) e = cudaEventRecord(link_of[i].done, s);
    last = e == cudaSuccess ? i : -1;
    pthread_mutex_unlock(&lock);
    return (int)e;
}

#else
int sp_nccl_chain_enter(void *stream) { (void)stream; return 0; }
int sp_nccl_chain_leave(void *stream) { (void)stream; return 0; }
#endif
