/* The fake device's own semantics (README.md), through the real CUDA and NCCL headers:
 * devices, memory accounting, the checks of device pointers, and streams as in-order
 * queues that wait for an NCCL transfer while the host thread goes on (events,
 * cudaStreamWaitEvent, host functions and the legacy stream wait behind it, as on a
 * GPU). Two ranks (mpiexec -np 2), STARPIPE_FAKE_GPUS=2: rank r on device r.
 * Exits 77 when the fake device is not loaded. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"

static int me;

#define OK(call) CHECK((call) == 0, "rank %d: %s", me, #call)

#define N 4096 /* floats per transfer */

static void host_fn(void *flag) { *(int *)flag = 1; }

/* Rank 0 queues work behind an NCCL receive and checks that none of it has run (and
 * that the host was not held) until rank 1, told so, sends. */
static void deferred(ncclComm_t comm, float *dsend, float *drecv, float *host)
{
    cudaStream_t s, s2, sb;
    cudaEvent_t ev;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    OK(cudaStreamCreate(&sb)); /* blocking: the legacy stream waits for it */
    OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    int ran = 0;
    if (me == 0) {
        for (int i = 0; i < N; i++) host[i] = -1.0f;
        OK(ncclRecv(drecv, N, ncclFloat32, 1, comm, s));
        OK(cudaMemcpyAsync(host, drecv, N * sizeof(float), cudaMemcpyDeviceToHost, s));
        OK(cudaLaunchHostFunc(s, host_fn, &ran));
        OK(cudaEventRecord(ev, s));
        OK(cudaStreamWaitEvent(s2, ev, 0));
        OK(cudaStreamWaitEvent(sb, ev, 0));
        OK(cudaMemsetAsync(dsend, 0, 4, 0)); /* the legacy stream, behind sb */
        CHECK(cudaEventQuery(ev) == cudaErrorNotReady, "the event completed before the send");
        CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "the stream ran past the receive");
        CHECK(cudaStreamQuery(s2) == cudaErrorNotReady, "cudaStreamWaitEvent did not wait");
        CHECK(cudaStreamQuery(0) == cudaErrorNotReady, "the legacy stream did not wait");
        CHECK(!ran && host[0] == -1.0f, "work behind the receive ran before it");
    }
    MPI_Barrier(MPI_COMM_WORLD); /* rank 0 has checked: now rank 1 sends */
    if (me == 1) {
        OK(ncclSend(dsend, N, ncclFloat32, 0, comm, s));
        OK(cudaStreamSynchronize(s));
    } else {
        OK(cudaStreamSynchronize(s2));
        OK(cudaDeviceSynchronize());
        int wrong = 0;
        for (int i = 0; i < N; i++) wrong += host[i] != (float)(i + 1000);
        CHECK(!wrong && ran, "%d floats wrong after the receive, host function %s", wrong,
              ran ? "ran" : "did not run");
        CHECK(cudaEventQuery(ev) == cudaSuccess && cudaStreamQuery(0) == cudaSuccess,
              "still not ready after the receive");
    }
    OK(cudaEventDestroy(ev));
    OK(cudaStreamDestroy(s));
    OK(cudaStreamDestroy(s2));
    OK(cudaStreamDestroy(sb));
}

/* Both ranks send and receive in one group, twice: messages pair up in order. */
static void exchange(ncclComm_t comm, float *dsend, float *drecv, float *host)
{
    cudaStream_t s;
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int peer = 1 - me;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) host[i] = (float)(me * 100000 + round * 10000 + i);
        OK(cudaMemcpyAsync(dsend, host, N * sizeof(float), cudaMemcpyHostToDevice, s));
        OK(ncclGroupStart());
        OK(ncclSend(dsend, N, ncclFloat32, peer, comm, s));
        OK(ncclRecv(drecv, N, ncclFloat32, peer, comm, s));
        OK(ncclGroupEnd());
        OK(cudaMemcpyAsync(host, drecv, N * sizeof(float), cudaMemcpyDeviceToHost, s));
        OK(cudaStreamSynchronize(s));
        int wrong = 0;
        for (int i = 0; i < N; i++) wrong += host[i] != (float)(peer * 100000 + round * 10000 + i);
        CHECK(!wrong, "round %d: %d floats wrong", round, wrong);
    }
    OK(cudaStreamDestroy(s));
}

int main(int argc, char **argv)
{
    int level = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (!dlsym(RTLD_DEFAULT, "starpipe_fake_gpu_stats")) {
        if (me == 0) printf("SKIP: not on the fake device\n");
        MPI_Finalize();
        return 77;
    }
    int n = 0;
    struct cudaDeviceProp prop;
    OK(cudaGetDeviceCount(&n));
    CHECK(n == 2, "%d devices, STARPIPE_FAKE_GPUS=2 asks for 2", n);
    OK(cudaGetDeviceProperties(&prop, me));
    CHECK(strstr(prop.name, "fake") && prop.major >= 7 && prop.totalGlobalMem > 0,
          "device properties: %s, %d.%d", prop.name, prop.major, prop.minor);
    CHECK(cudaSetDevice(n) == cudaErrorInvalidDevice, "device %d exists", n);
    OK(cudaSetDevice(me));

    /* memory: accounted, and device pointers checked */
    size_t free0, free1, total;
    float *dsend, *drecv, *host = malloc(N * sizeof(float));
    OK(cudaMemGetInfo(&free0, &total));
    OK(cudaMalloc((void **)&dsend, N * sizeof(float)));
    OK(cudaMalloc((void **)&drecv, N * sizeof(float)));
    OK(cudaMemGetInfo(&free1, &total));
    CHECK(free0 - free1 == 2 * N * sizeof(float), "cudaMemGetInfo: %zu bytes went", free0 - free1);
    CHECK(cudaMemcpy(host, host, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "a host pointer taken for device memory");
    CHECK(cudaMemcpy(dsend, host, (N + 1) * sizeof(float), cudaMemcpyHostToDevice) ==
              cudaErrorInvalidValue, "a copy past the end of a block");
    CHECK(cudaMemcpy(dsend, drecv, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "device memory taken for host memory");
    CHECK(cudaStreamQuery((cudaStream_t)host) == cudaErrorInvalidResourceHandle,
          "a stream that does not exist");
    void *huge = NULL;
    CHECK(cudaMalloc(&huge, total) == cudaErrorMemoryAllocation, "more than the device holds");
    for (int i = 0; i < N; i++) host[i] = (float)(i + 1000);
    OK(cudaMemcpy(dsend, host, N * sizeof(float), cudaMemcpyHostToDevice));

    ncclUniqueId id;
    ncclComm_t comm;
    if (me == 0) OK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    OK(ncclCommInitRank(&comm, 2, id, me));
    CHECK(ncclSend(host, N, ncclFloat32, 1 - me, comm, 0) == ncclInvalidArgument,
          "ncclSend from host memory");
    deferred(comm, dsend, drecv, host);
    exchange(comm, dsend, drecv, host);
    OK(ncclCommDestroy(comm));
    OK(cudaFree(dsend));
    OK(cudaFree(drecv));
    OK(cudaMemGetInfo(&free1, &total));
    CHECK(free1 == free0, "cudaFree gave back %zu of %zu bytes", free1 - (free0 - 2 * N * 4),
          (size_t)2 * N * 4);
    free(host);
    int any = 0;
    MPI_Allreduce(&check_failures, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("%s: %d failure(s)\n", any ? "FAIL" : "PASS", any);
    MPI_Finalize();
    return any != 0;
}
