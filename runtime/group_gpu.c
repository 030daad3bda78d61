/* The tensor group's all-reduce on a GPU rank (runtime/group.c hands it a task's call
 * when the task runs on a CUDA worker): every member's values gathered by NCCL onto the
 * task's own stream (comm/nccl_tp.c), then summed there in the group's one order, member
 * 0's, + member 1's, ... (the backend's scale kernel, f = 1: exact adds, the order of the
 * CPU's sum), into dst (acc: added to it). All of it is stream-ordered: the task's later
 * kernels follow it, and the function returns at once, as the task's do. */
#include "runtime/exec_impl.h"

#include "comm/nccl_tp.h"
#include "starpipe/backend.h"

#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
/* Every member's n floats of src in *all (size rows, stream-ordered scratch on the task's
 * stream: the caller frees it there). */
static int gather(sp_nccl_tp *nc, int size, const sp_device *dev, const float *src, int64_t n,
                  float **all, const char **why)
{
    cudaStream_t s = (cudaStream_t)dev->stream;
    *all = NULL;
    if (!nc || cudaMallocAsync((void **)all, sizeof(float) * (size_t)size * (size_t)n, s) !=
                   cudaSuccess) {
        *why = nc ? "no device memory for the tensor group's all-gather"
                  : "a GPU rank's tensor group has no NCCL communicator";
        return 1;
    }
    int rc = sp_nccl_tp_allgather(nc, src, *all, (size_t)n, s);
    if (rc) *why = sp_nccl_tp_error(rc);
    return rc;
}
#endif

int sp_exec_gpu_allreduce(sp_nccl_tp *nc, int size, const sp_device *dev, float *dst,
                          const float *src, int64_t n, int acc, const char **why)
{
    *why = NULL;
#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
    float *all;
    int rc = gather(nc, size, dev, src, n, &all, why);
    for (int r = 1; r < size && !rc; r++) /* into row 0, in rank order */
        rc = dev->be->scale(dev->ctx, all, all + (int64_t)r * n, 1.0f, n, 1);
    if (!rc) rc = dev->be->scale(dev->ctx, dst, all, 1.0f, n, acc);
    if (rc && !*why) *why = dev->be->status_string(rc);
    if (all) cudaFreeAsync(all, (cudaStream_t)dev->stream);
    return rc ? 1 : 0;
#else
    (void)nc, (void)size, (void)dev, (void)dst, (void)src, (void)n, (void)acc;
    *why = "a GPU all-reduce in a build without CUDA";
    return 1;
#endif
}

int sp_exec_gpu_allreduce_max(sp_nccl_tp *nc, int size, const sp_device *dev, float *x,
                              int64_t n, const char **why)
{
    *why = NULL;
#if defined(STARPU_USE_CUDA) && defined(STARPIPE_HAVE_CUDA)
    float *all;
    int rc = gather(nc, size, dev, x, n, &all, why);
    /* x = member 0's, then the maximum with each next member's, in rank order */
    if (!rc) rc = dev->be->copy(dev->ctx, x, all, n);
    for (int r = 1; r < size && !rc; r++)
        rc = dev->be->maximum(dev->ctx, x, x, all + (int64_t)r * n, n);
    if (rc && !*why) *why = dev->be->status_string(rc);
    if (all) cudaFreeAsync(all, (cudaStream_t)dev->stream);
    return rc ? 1 : 0;
#else
    (void)nc, (void)size, (void)dev, (void)x, (void)n;
    *why = "a GPU all-reduce in a build without CUDA";
    return 1;
#endif
}
