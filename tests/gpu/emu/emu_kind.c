/* The CUDA table (codelets/cuda/backend.c) on the emulated device, as test_backend_ops's one
 * kind in this build (tests/backend/test_backend_ops.c, OPS_KINDS=ops_emu_kinds): the
 * registry's CUDA kind (codelets/cuda/device.c) needs a StarPU built with CUDA, which the
 * emulation's build lacks. Only the part used outside StarPU, on the emulation's one device
 * (the emulated runtime has no cudaSetDevice): the state is a stream and a cuBLAS handle
 * bound to it, memory the emulation's cudaMalloc (fenced, NaN until written). */
#include <stdlib.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "codelets/cuda/backend.h"
#include "codelets/cuda/kernels_cuda.h"
#include "starpipe/device.h"

static int count(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

static void ctx_destroy(void *ctx)
{
    sp_cuda_ctx *c = ctx;
    if (c && c->cublas) cublasDestroy((cublasHandle_t)c->cublas);
    if (c && c->stream) cudaStreamDestroy((cudaStream_t)c->stream);
    free(c);
}

static int ctx_create(int dev, void **out)
{
    sp_cuda_ctx *c = calloc(1, sizeof *c);
    cublasHandle_t h = NULL;
    cublasStatus_t b = CUBLAS_STATUS_SUCCESS;
    int rc = c ? (int)cudaStreamCreateWithFlags((cudaStream_t *)&c->stream,
                                                cudaStreamNonBlocking)
               : (int)cudaErrorMemoryAllocation;
    if (!rc && ((b = cublasCreate(&h)) || (c->cublas = h, b = cublasSetStream(h, c->stream))))
        rc = SP_CUDA_ERR_CUBLAS_BASE + (int)b;
    if (!rc) rc = sp_cuda_kernels_init(h);
    if (rc) ctx_destroy(c), c = NULL;
    *out = c;
    return rc;
}

static void *alloc(size_t bytes)
{
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

static void release(void *mem) { cudaFree(mem); }

/* on the legacy default stream, which never waits for the test's (non-blocking) one */
static int copy(int dev, void *dst, const void *src, size_t bytes, int to_host)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes,
                                    to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, 0);
    return e ? e : cudaStreamSynchronize(0);
}

static int sync_ctx(void *ctx) { return cudaStreamSynchronize(((sp_cuda_ctx *)ctx)->stream); }

const sp_device_kind *const *ops_emu_kinds(void)
{
    static sp_device_kind emu = { .name = "cuda-emu", .type = SP_DEVICE_CUDA, .async = 1,
                                  .count = count, .ctx_create = ctx_create,
                                  .ctx_destroy = ctx_destroy, .alloc = alloc, .free = release,
                                  .copy = copy, .sync = sync_ctx,
                                  .error = sp_cuda_status_string };
    static const sp_device_kind *kinds[] = { &emu, NULL };
    emu.kernels = sp_backend_cuda();
    return kinds;
}
