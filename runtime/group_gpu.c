/* The tensor group's all-reduce on a GPU rank (runtime/group.c hands it a task's call
 * when the task runs on a CUDA worker): every member's values gathered by NCCL onto the
 * task's own stream (comm/nccl_tp.c), then summed there in the group's one order, member
 * 0's, + member 1's, ... (the backend's scale kernel, f = 1: exact adds, the order of the
 * CPU's sum), into dst (acc: added to it). From SP_GROUP_CHUNKED_FLOATS, as between CPU
 * ranks, a reduce-scatter then an all-gather: each member gathers and combines only its
 * chunk of every member's values, in the same order, then the members exchange their
 * chunks of the result (2 (T-1)/T of the vector over NCCL per member, not T - 1
 * vectors). All of it is stream-ordered: the task's later kernels follow it, and the
 * function returns at once, as the task's do. */
#include "runtime/group.h"

#include "comm/nccl_tp.h"
#include "starpipe/backend.h"
#include "starpipe/device.h"
#include "starpipe/exec.h"

/* Stream-ordered scratch on the task's stream (the device's task_alloc): 0 or a code. */
static int scratch(const sp_device *dev, float **p, size_t floats)
{
    const sp_device_kind *k = sp_exec_device();
    *p = NULL;
    return k ? k->task_alloc(dev, (void **)p, sizeof(float) * floats) : 1;
}

static void scratch_free(const sp_device *dev, float *p)
{
    const sp_device_kind *k = sp_exec_device();
    if (k && p) k->task_free(dev, p);
}

/* Every member's n floats of src in *all (size rows, stream-ordered scratch on the task's
 * stream: the caller frees it there). */
static int gather(sp_nccl_tp *nc, int size, const sp_device *dev, const float *src, int64_t n,
                  float **all, const char **why)
{
    void *s = dev->stream;
    *all = NULL;
    if (!nc || scratch(dev, all, (size_t)size * (size_t)n)) {
        *why = nc ? "no device memory for the tensor group's all-gather"
                  : "a GPU rank's tensor group has no NCCL communicator";
        return 1;
    }
    int rc = sp_nccl_tp_allgather(nc, src, *all, (size_t)n, s);
    if (rc) *why = sp_nccl_tp_error(rc);
    return rc;
}

/* The chunked all-reduce (sum, or max with is_max) on the task's stream: stream-ordered
 * scratch of size rows of the widest chunk, then the whole result; dst written last. */
static int chunked(sp_nccl_tp *nc, int T, const sp_device *dev, float *dst, const float *src,
                   int64_t n, int acc, int is_max, const char **why)
{
    void *s = dev->stream;
    const int me = nc ? sp_nccl_tp_rank(nc) : 0;
    const int64_t widest = (n + T - 1) / T, lo = sp_exec_group_chunk(n, T, me);
    const int64_t len = sp_exec_group_chunk(n, T, me + 1) - lo;
    float *rows = NULL;
    if (!nc || T > SP_NCCL_TP_MAX || scratch(dev, &rows, (size_t)T * (size_t)widest + (size_t)n)) {
        *why = !nc ? "a GPU rank's tensor group has no NCCL communicator"
                   : "no device memory for the tensor group's reduce-scatter";
        return 1;
    }
    float *out = rows + (int64_t)T * widest;
    const float *send[SP_NCCL_TP_MAX];
    float *recv[SP_NCCL_TP_MAX];
    size_t scount[SP_NCCL_TP_MAX], rcount[SP_NCCL_TP_MAX];
    for (int q = 0; q < T; q++) { /* each member's copy of my chunk in; my copies of theirs out */
        const int64_t qlo = sp_exec_group_chunk(n, T, q);
        send[q] = src + qlo, scount[q] = (size_t)(sp_exec_group_chunk(n, T, q + 1) - qlo);
        recv[q] = rows + (int64_t)q * widest, rcount[q] = (size_t)len;
    }
    int rc = dev->be->copy(dev->ctx, rows + (int64_t)me * widest, src + lo, len);
    int nr = rc ? 0 : sp_nccl_tp_exchange(nc, send, scount, recv, rcount, s);
    if (!rc && !nr) rc = dev->be->copy(dev->ctx, out + lo, rows, len); /* member 0's, then */
    for (int q = 1; q < T && !rc && !nr; q++) /* each next member's, in rank order */
        rc = is_max ? dev->be->maximum(dev->ctx, out + lo, out + lo,
                                       rows + (int64_t)q * widest, len)
                    : dev->be->scale(dev->ctx, out + lo, rows + (int64_t)q * widest, 1.0f, len, 1);
    for (int q = 0; q < T; q++) { /* my chunk of the result out, theirs in */
        const int64_t qlo = sp_exec_group_chunk(n, T, q);
        send[q] = out + lo, scount[q] = (size_t)len;
        recv[q] = out + qlo, rcount[q] = (size_t)(sp_exec_group_chunk(n, T, q + 1) - qlo);
    }
    if (!rc && !nr) nr = sp_nccl_tp_exchange(nc, send, scount, recv, rcount, s);
    if (!rc && !nr)
        rc = is_max ? dev->be->copy(dev->ctx, dst, out, n)
                    : dev->be->scale(dev->ctx, dst, out, 1.0f, n, acc);
    if (nr) *why = sp_nccl_tp_error(nr);
    else if (rc) *why = dev->be->status_string(rc);
    scratch_free(dev, rows);
    return rc || nr ? 1 : 0;
}

int sp_exec_gpu_allreduce(sp_nccl_tp *nc, int size, const sp_device *dev, float *dst,
                          const float *src, int64_t n, int acc, const char **why)
{
    *why = NULL;
    if (n >= SP_GROUP_CHUNKED_FLOATS) return chunked(nc, size, dev, dst, src, n, acc, 0, why);
    float *all;
    int rc = gather(nc, size, dev, src, n, &all, why);
    for (int r = 1; r < size && !rc; r++) /* into row 0, in rank order */
        rc = dev->be->scale(dev->ctx, all, all + (int64_t)r * n, 1.0f, n, 1);
    if (!rc) rc = dev->be->scale(dev->ctx, dst, all, 1.0f, n, acc);
    if (rc && !*why) *why = dev->be->status_string(rc);
    scratch_free(dev, all);
    return rc ? 1 : 0;
}

int sp_exec_gpu_allreduce_max(sp_nccl_tp *nc, int size, const sp_device *dev, float *x,
                              int64_t n, const char **why)
{
    *why = NULL;
    if (n >= SP_GROUP_CHUNKED_FLOATS) return chunked(nc, size, dev, x, x, n, 0, 1, why);
    float *all;
    int rc = gather(nc, size, dev, x, n, &all, why);
    /* x = member 0's, then the maximum with each next member's, in rank order */
    if (!rc) rc = dev->be->copy(dev->ctx, x, all, n);
    for (int r = 1; r < size && !rc; r++)
        rc = dev->be->maximum(dev->ctx, x, x, all + (int64_t)r * n, n);
    if (rc && !*why) *why = dev->be->status_string(rc);
    scratch_free(dev, all);
    return rc ? 1 : 0;
}

int sp_exec_gpu_allgather(sp_nccl_tp *nc, int size, const sp_device *dev, float *x, int64_t n,
                          const char **why)
{
    *why = NULL;
    if (!nc || size > SP_NCCL_TP_MAX) {
        *why = "a GPU rank's tensor group has no NCCL communicator";
        return 1;
    }
    const int me = sp_nccl_tp_rank(nc);
    const int64_t lo = sp_exec_group_chunk(n, size, me);
    const float *send[SP_NCCL_TP_MAX];
    float *recv[SP_NCCL_TP_MAX];
    size_t scount[SP_NCCL_TP_MAX], rcount[SP_NCCL_TP_MAX];
    for (int q = 0; q < size; q++) { /* my chunk out to each member, theirs in */
        const int64_t qlo = sp_exec_group_chunk(n, size, q);
        send[q] = x + lo, scount[q] = (size_t)(sp_exec_group_chunk(n, size, me + 1) - lo);
        recv[q] = x + qlo, rcount[q] = (size_t)(sp_exec_group_chunk(n, size, q + 1) - qlo);
    }
    int rc = sp_nccl_tp_exchange(nc, send, scount, recv, rcount, dev->stream);
    if (rc) *why = sp_nccl_tp_error(rc);
    return rc ? 1 : 0;
}
