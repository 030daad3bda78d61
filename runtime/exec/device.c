/* Everything of the executor that names CUDA (device.h): the rank's device memory
 * (zeroing, the host's bounded copies), the worker's sp_device, the codelets' CUDA
 * implementation, cuBLAS and TF32, the host's GPUs. Relies on StarPU, the CUDA runtime and
 * the CUDA backend's device (codelets/cuda/backend.h), on nothing else of the executor. */
#include <stdint.h>

#include <starpu.h>
#ifdef STARPU_USE_CUDA
#include <starpu_cublas_v2.h>
#endif
#ifdef STARPIPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "codelets/cuda/backend.h"
#ifdef STARPIPE_HAVE_CUDA
#include "codelets/cuda/kernels_cuda.h" /* sp_cuda_set_tf32 */
#endif
#include "runtime/exec/device.h"

/* ---- what was built ---- */

int sp_exec_dev_starpu_cuda(void)
{
#ifdef STARPU_USE_CUDA
    return 1;
#else
    return 0;
#endif
}

int sp_exec_dev_cuda(void)
{
#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
    return 1;
#else
    return 0;
#endif
}

/* ---- the host's GPUs (the GPU choice, runtime/exec/startup.c) ---- */

int sp_exec_dev_count(void)
{
    int ngpus = 0;
#ifdef STARPIPE_HAVE_CUDA
    if (cudaGetDeviceCount(&ngpus) != cudaSuccess) ngpus = 0;
#endif
    return ngpus;
}

int sp_exec_dev_pci(int dev, char *bus, size_t len)
{
#ifdef STARPIPE_HAVE_CUDA
    return cudaDeviceGetPCIBusId(bus, (int)len, dev) == cudaSuccess;
#else
    (void)dev, (void)bus, (void)len;
    return 0;
#endif
}

/* ---- the workers ---- */

int sp_exec_dev_nworkers(void)
{
#ifdef STARPU_USE_CUDA
    return (int)starpu_cuda_worker_get_count();
#else
    return 0;
#endif
}

/* The worker's device (starpipe/backend.h): the one case per kind of worker. */
sp_device sp_exec_dev_of_worker(sp_cuda_ctx *c)
{
#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
    if (starpu_worker_get_type(starpu_worker_get_id()) == STARPU_CUDA_WORKER)
        return sp_device_cuda(c, (void *)starpu_cuda_get_local_stream(),
                              starpu_cublas_get_local_handle());
#endif
    (void)c;
    return sp_device_cpu();
}

void sp_exec_dev_codelet(struct starpu_codelet *cl, starpu_cuda_func_t run)
{
#ifdef STARPU_USE_CUDA
    cl->cuda_funcs[0] = run;
    cl->cuda_flags[0] = STARPU_CUDA_ASYNC;
#else
    (void)cl, (void)run;
#endif
}

#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
static void set_tf32(void *on)
{
    sp_cuda_set_tf32(starpu_cublas_get_local_handle(), *(const int *)on);
}
#endif

void sp_exec_dev_start(int tf32)
{
#ifdef STARPU_USE_CUDA
    starpu_cublas_init(); /* one handle per CUDA worker, bound to its stream */
#ifdef STARPIPE_HAVE_CUDA
    /* exact fp32 products unless STARPIPE_TF32=1 asks for TF32 tensor cores */
    starpu_execute_on_each_worker(set_tf32, &tf32, STARPU_CUDA);
#endif
#endif
}

/* ---- device memory ---- */

/* Device memory on the main thread: zeroing and the host's bounded copies go on a
 * stream of their own (non-blocking: it never waits for the workers' kernels, nor they
 * for it), synchronised before the call returns. */
#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
static cudaStream_t host_stream;
static int host_stream_dev = -1;

/* The CUDA worker's memory node, -1 on a rank without one. */
int sp_exec_dev_node(int *devid)
{
    if (starpu_cuda_worker_get_count() == 0)
        return -1;
    int w = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
    *devid = starpu_worker_get_devid(w);
    return (int)starpu_worker_get_memory_node((unsigned)w);
}

static sp_status device_stream(int devid)
{
    if (cudaSetDevice(devid) != cudaSuccess)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: cudaSetDevice(%d) failed", __FILE__, __LINE__,
                            devid);
    if (host_stream_dev == devid)
        return SP_OK;
    if (cudaStreamCreateWithFlags(&host_stream, cudaStreamNonBlocking) != cudaSuccess)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: no CUDA stream for host copies", __FILE__,
                            __LINE__);
    host_stream_dev = devid;
    return SP_OK;
}

static sp_status device_done(const char *what, cudaError_t e)
{
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(host_stream);
    return e == cudaSuccess ? SP_OK
                            : sp_set_error(SP_ERR_RUNTIME, "%s on the rank's GPU failed: %s", what,
                                           cudaGetErrorString(e));
}

static void device_shutdown(void)
{
    if (host_stream_dev >= 0) cudaStreamDestroy(host_stream);
    host_stream_dev = -1;
}
#else
int sp_exec_dev_node(int *devid) { *devid = -1; return -1; }
static void device_shutdown(void) {}
#endif

/* Pieces of host copies of device buffers: a checkpoint of a large stage never needs
 * the whole slab on the host (the copy functions stage nothing themselves; the caller's
 * destination is the only host memory). */
#define SP_EXEC_COPY_PIECE ((size_t)64 << 20)

sp_status sp_exec_dev_alloc(int node, int devid, size_t bytes, void **mem)
{
#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
    sp_status st;
    if ((st = device_stream(devid)))
        return st;
    void *p = (void *)starpu_malloc_on_node((unsigned)node, bytes);
    if (!p)
        return sp_set_error(SP_ERR_NOMEM, "out of GPU memory on device %d (a buffer of %zu "
                            "bytes)", devid, bytes);
    if ((st = device_done("zeroing a buffer", cudaMemsetAsync(p, 0, bytes, host_stream)))) {
        starpu_free_on_node((unsigned)node, (uintptr_t)p, bytes);
        return st;
    }
    *mem = p;
#else
    (void)node, (void)devid, (void)bytes, (void)mem;
#endif
    return SP_OK;
}

void sp_exec_dev_free(int node, void *mem, size_t bytes)
{
#ifdef STARPU_USE_CUDA
    starpu_free_on_node((unsigned)node, (uintptr_t)mem, bytes);
#else
    (void)node, (void)mem, (void)bytes;
#endif
}

sp_status sp_exec_dev_copy(int node, void *dev, void *host, size_t len, int to_host)
{
    sp_status st = SP_OK;
#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
    if (!(st = device_stream(starpu_memory_node_get_devid((unsigned)node)))) {
        for (size_t done = 0; done < len && !st; done += SP_EXEC_COPY_PIECE) {
            size_t n = len - done < SP_EXEC_COPY_PIECE ? len - done : SP_EXEC_COPY_PIECE;
            char *h = (char *)host + done, *d = (char *)dev + done;
            st = device_done(to_host ? "a copy to the host" : "a copy from the host",
                             cudaMemcpyAsync(to_host ? h : d, to_host ? d : h, n,
                                             to_host ? cudaMemcpyDeviceToHost
                                                     : cudaMemcpyHostToDevice, host_stream));
        }
    }
#else
    (void)node, (void)dev, (void)host, (void)len, (void)to_host;
#endif
    return st;
}

void sp_exec_dev_stop(void)
{
#ifdef STARPU_USE_CUDA
    starpu_cublas_shutdown();
#endif
    device_shutdown();
}
