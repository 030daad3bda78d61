/* The CUDA device (include/starpipe/device.h): the kernels of backend.c and the memory of
 * a GPU that StarPU's CUDA workers run on. The main thread zeroes and copies device memory
 * on a stream of its own, non-blocking (it never waits for the workers' kernels, nor they
 * for it), synchronised before each call returns; a worker's kernels run on the stream
 * and cuBLAS handle StarPU gave that worker. The runtime reaches all of it through the
 * table, so this is the one file that knows how a GPU's memory and streams are driven. */
#include "codelets/cuda/device.h"

#include <stdlib.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <starpu.h>
#include <starpu_cublas_v2.h>

#include "codelets/cuda/backend.h"
#include "codelets/cuda/kernels_cuda.h"

/* The codes of the memory half are cudaError_t values; those of the kernels, the table's
 * own (sp_cuda_status_string names both). */
static const char *error(int code) { return sp_cuda_status_string(code); }

/* CUDA 13 loads a module (starpipe's kernels, each cuBLAS variant) at its first launch,
 * and loading can synchronise the context: in step 1, while NCCL kernels wait for their
 * peers, a first launch could then wait for them, and other threads' CUDA calls behind
 * it (issue 42). So every module is loaded when the context is made, unless the user
 * chose (CUDA_MODULE_LOADING set). The runtime reads the variable once, at its first
 * call; starpipe's first CUDA call is this table's (count, before StarPU starts). */
static void eager_modules(void) { setenv("CUDA_MODULE_LOADING", "EAGER", 0); }

static int count(void)
{
    int n = 0;
    eager_modules();
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

static int bus_id(int dev, char *bus, int len)
{
    eager_modules();
    return cudaDeviceGetPCIBusId(bus, len, dev);
}

/* On dev, leaving the main thread's current device as it was (device 0 by default). */
static int mem_info(int dev, size_t *free_bytes, size_t *total)
{
    eager_modules();
    int prev = 0;
    cudaError_t c = cudaGetDevice(&prev);
    if (c == cudaSuccess) c = cudaSetDevice(dev);
    if (c == cudaSuccess) c = cudaMemGetInfo(free_bytes, total);
    cudaSetDevice(prev);
    return c;
}

/* ---- the workers ---- */

static void set_tf32(void *on) { sp_cuda_set_tf32(starpu_cublas_get_local_handle(), *(int *)on); }

static int start(int tf32)
{
    static int on;
    on = tf32;
    starpu_cublas_init(); /* one handle per CUDA worker, bound to its stream */
    /* exact fp32 products unless tf32 asks for TF32 tensor cores */
    starpu_execute_on_each_worker(set_tf32, &on, STARPU_CUDA);
    return 0;
}

static cudaStream_t host_stream;
static int host_stream_dev = -1;

static void stop(void)
{
    starpu_cublas_shutdown();
    if (host_stream_dev >= 0) cudaStreamDestroy(host_stream);
    host_stream_dev = -1;
}

static int owns_worker(unsigned w) { return starpu_worker_get_type((int)w) == STARPU_CUDA_WORKER; }

static sp_device worker_device(void *ctx_storage)
{
    _Static_assert(sizeof(sp_cuda_ctx) <= SP_DEVICE_CTX_BYTES, "SP_DEVICE_CTX_BYTES");
    return sp_device_cuda((sp_cuda_ctx *)ctx_storage, (void *)starpu_cuda_get_local_stream(),
                          starpu_cublas_get_local_handle());
}

/* ---- memory, from the main thread ---- */

static int on_device(int dev)
{
    cudaError_t c = cudaSetDevice(dev);
    if (c != cudaSuccess || host_stream_dev == dev) return c;
    if (host_stream_dev >= 0) cudaStreamDestroy(host_stream);
    host_stream_dev = -1;
    if ((c = cudaStreamCreateWithFlags(&host_stream, cudaStreamNonBlocking)) == cudaSuccess)
        host_stream_dev = dev;
    return c;
}

static int done(cudaError_t e) { return e != cudaSuccess ? e : cudaStreamSynchronize(host_stream); }

static int zero(int dev, void *mem, size_t bytes)
{
    int c = on_device(dev);
    return c ? c : done(cudaMemsetAsync(mem, 0, bytes, host_stream));
}

static int copy(int dev, void *dst, const void *src, size_t bytes, int to_host)
{
    int c = on_device(dev);
    return c ? c
             : done(cudaMemcpyAsync(dst, src, bytes,
                                    to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                                    host_stream));
}

/* ---- memory inside a task: stream-ordered on the worker's stream ---- */

static int task_alloc(const sp_device *d, void **mem, size_t bytes)
{
    *mem = NULL;
    return cudaMallocAsync(mem, bytes, (cudaStream_t)d->stream);
}

static void task_free(const sp_device *d, void *mem)
{
    if (mem) cudaFreeAsync(mem, (cudaStream_t)d->stream);
}

/* ---- outside StarPU: a stream and a cuBLAS handle of the caller's ---- */

static int ctx_create(int dev, void **out)
{
    sp_cuda_ctx *c = calloc(1, sizeof *c);
    cudaError_t e = c ? cudaSetDevice(dev) : cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags((cudaStream_t *)&c->stream,
                                                        cudaStreamNonBlocking);
    int rc = e;
    cublasHandle_t h = NULL;
    cublasStatus_t b = CUBLAS_STATUS_SUCCESS;
    if (!rc && ((b = cublasCreate(&h)) != CUBLAS_STATUS_SUCCESS ||
                (b = cublasSetStream(h, (cudaStream_t)c->stream)) != CUBLAS_STATUS_SUCCESS))
        rc = SP_CUDA_ERR_CUBLAS_BASE + (int)b;
    if (!rc) rc = sp_cuda_kernels_init(c->cublas = h);
    if (rc && h) cublasDestroy(h);
    if (rc) {
        if (c && c->stream) cudaStreamDestroy((cudaStream_t)c->stream);
        free(c);
        c = NULL;
    }
    *out = c;
    return rc;
}

static void ctx_destroy(void *ctx)
{
    sp_cuda_ctx *c = ctx;
    if (!c) return;
    if (c->stream) cudaStreamSynchronize((cudaStream_t)c->stream);
    if (c->cublas) cublasDestroy((cublasHandle_t)c->cublas);
    if (c->stream) cudaStreamDestroy((cudaStream_t)c->stream);
    free(c);
}

static void *alloc(size_t bytes)
{
    void *p = NULL;
    return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}

static void release(void *mem)
{
    if (mem) cudaFree(mem);
}

static int sync_ctx(void *ctx)
{
    sp_cuda_ctx *c = ctx;
    return cudaStreamSynchronize(c ? (cudaStream_t)c->stream : 0);
}

const sp_device_kind *sp_device_kind_cuda(void)
{
    static sp_device_kind kind;
    if (!kind.name)
        kind = (sp_device_kind){ .name = "cuda", .type = SP_DEVICE_CUDA,
                                 .starpu_arch = STARPU_CUDA_WORKER, .async = 1,
                                 .starpu_count_var = "STARPU_NCUDA",
                                 .starpu_ids_var = "STARPU_WORKERS_CUDAID",
                                 .kernels = sp_backend_cuda(), .owns_worker = owns_worker,
                                 .count = count, .bus_id = bus_id,
                                 .mem_info = mem_info, .start = start, .stop = stop,
                                 .worker_device = worker_device, .zero = zero, .copy = copy,
                                 .task_alloc = task_alloc, .task_free = task_free,
                                 .ctx_create = ctx_create, .ctx_destroy = ctx_destroy,
                                 .alloc = alloc, .free = release, .sync = sync_ctx,
                                 .error = error };
    return &kind;
}
