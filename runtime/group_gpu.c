/* The tensor group's all-reduce on a GPU rank (runtime/group.c hands it a task's call
 * when the task runs on a CUDA worker): every member's values gathered by NCCL onto the
 * task's own stream (comm/nccl_tp.c), then summed there in the group's one order, member
 * 0's, + member 1's, ... (the backend's scale kernel, f = 1: exact adds, the order of the
 * CPU's sum), into dst (acc: added to it). From SP_GROUP_CHUNKED_FLOATS, as between CPU
 * ranks, a reduce-scatter then an all-gather: each member gathers and combines only its
 * chunk of every member's values, in the same order, then the members exchange their
 * chunks of the result (2 (T-1)/T of the vector over NCCL per member, not T - 1
 * vectors). All of it is stream-ordered: the task's later kernels follow it, and the
 * function returns at once, as the task's do.
 *
 * NCCL's sends and receives carry no tags: a member that skipped one exchange would pair
 * its peers' calls with its next ones, of other sizes, and every member would spin. So
 * nothing here can fail between one exchange and the next except on every member alike:
 * the scratch is the worker's room, made with the group for its largest all-reduce
 * (sp_exec_gpu_room_floats; a vector too large for it goes through the room in rounds of
 * the gather form, the same bits), and a local failure (a kernel that did not launch, an
 * injected fault) only stops this member's kernels, never its exchanges: it takes part in
 * every one, from whatever its room holds, and reports the failure at the end, as the MPI
 * path does by tag. */
#include "runtime/group.h"

#include "comm/nccl_tp.h"
#include "starpipe/backend.h"
#include "starpipe/device.h"
#include "starpipe/exec.h"

int64_t sp_exec_gpu_room_floats(int size, int64_t max_floats)
{
    const int64_t small = max_floats < SP_GROUP_CHUNKED_FLOATS ? max_floats
                                                               : SP_GROUP_CHUNKED_FLOATS - 1;
    const int64_t gathered = (int64_t)size * small;
    const int64_t chunked = max_floats >= SP_GROUP_CHUNKED_FLOATS
                                ? (int64_t)size * ((max_floats + size - 1) / size) + max_floats
                                : 0;
    int64_t r = gathered > chunked ? gathered : chunked;
    return r > size ? r : size;
}

static const char *injected = "an injected failure of the tensor group's all-reduce "
                              "(STARPIPE_FAULT=group@)";

/* dst (=, or += with acc; the maximum with is_max) over every member's src, through the
 * room in rounds of room / size floats: each round gathers every member's piece into the
 * room's rows and combines them in member order. After a local failure the rounds'
 * exchanges go on, their kernels do not. */
static int gathered(const sp_exec_gpu_member *m, const sp_device *dev, float *dst,
                    const float *src, int64_t n, int acc, int is_max, const char **why)
{
    const int T = m->size;
    const int64_t k = m->room_floats / T;
    float *rows = m->room;
    int rc = m->fail, nr = 0;
    if (rc) *why = injected;
    for (int64_t a = 0; a < n && !nr; a += k) {
        const int64_t len = n - a < k ? n - a : k;
        nr = sp_nccl_tp_allgather(m->nc, src + a, rows, (size_t)len, dev->stream);
        if (nr || rc) continue;
        if (is_max) {
            rc = dev->be->copy(dev->ctx, dst + a, rows, len);
            for (int q = 1; q < T && !rc; q++)
                rc = dev->be->maximum(dev->ctx, dst + a, dst + a, rows + (int64_t)q * len, len);
        } else {
            for (int q = 1; q < T && !rc; q++) /* into row 0, in member order */
                rc = dev->be->scale(dev->ctx, rows, rows + (int64_t)q * len, 1.0f, len, 1);
            if (!rc) rc = dev->be->scale(dev->ctx, dst + a, rows, 1.0f, len, acc);
        }
        if (rc && !*why) *why = dev->be->status_string(rc);
    }
    if (nr) *why = sp_nccl_tp_error(nr);
    return rc || nr ? 1 : 0;
}

/* The chunked all-reduce (sum, or max with is_max) on the task's stream: the room holds
 * size rows of the widest chunk, then the whole result; dst written last. */
static int chunked(const sp_exec_gpu_member *m, const sp_device *dev, float *dst,
                   const float *src, int64_t n, int acc, int is_max, const char **why)
{
    void *s = dev->stream;
    const int T = m->size, me = sp_nccl_tp_rank(m->nc);
    const int64_t widest = (n + T - 1) / T, lo = sp_exec_group_chunk(n, T, me);
    const int64_t len = sp_exec_group_chunk(n, T, me + 1) - lo;
    float *rows = m->room, *out = rows + (int64_t)T * widest;
    const float *send[SP_NCCL_TP_MAX];
    float *recv[SP_NCCL_TP_MAX];
    size_t scount[SP_NCCL_TP_MAX], rcount[SP_NCCL_TP_MAX];
    for (int q = 0; q < T; q++) { /* each member's copy of my chunk in; my copies of theirs out */
        const int64_t qlo = sp_exec_group_chunk(n, T, q);
        send[q] = src + qlo, scount[q] = (size_t)(sp_exec_group_chunk(n, T, q + 1) - qlo);
        recv[q] = rows + (int64_t)q * widest, rcount[q] = (size_t)len;
    }
    int rc = m->fail;
    if (rc) *why = injected;
    if (!rc) rc = dev->be->copy(dev->ctx, rows + (int64_t)me * widest, src + lo, len);
    int nr = sp_nccl_tp_exchange(m->nc, send, scount, recv, rcount, s);
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
    if (!nr) nr = sp_nccl_tp_exchange(m->nc, send, scount, recv, rcount, s);
    if (!rc && !nr)
        rc = is_max ? dev->be->copy(dev->ctx, dst, out, n)
                    : dev->be->scale(dev->ctx, dst, out, 1.0f, n, acc);
    if (nr) *why = sp_nccl_tp_error(nr);
    else if (rc && !*why) *why = dev->be->status_string(rc);
    return rc || nr ? 1 : 0;
}

/* Which form: the same on every member (n, size and the room are alike there). */
static int reduce(const sp_exec_gpu_member *m, const sp_device *dev, float *dst, const float *src,
                  int64_t n, int acc, int is_max, const char **why)
{
    *why = NULL;
    if (!m->nc || m->size > SP_NCCL_TP_MAX || !m->room || m->room_floats < m->size) {
        /* the group was made without these on every member alike: no exchange to skip */
        *why = "a GPU rank's tensor group has no NCCL communicator or no scratch";
        return 1;
    }
    const int64_t widest = (n + m->size - 1) / m->size;
    if (n >= SP_GROUP_CHUNKED_FLOATS && (int64_t)m->size * widest + n <= m->room_floats)
        return chunked(m, dev, dst, src, n, acc, is_max, why);
    return gathered(m, dev, dst, src, n, acc, is_max, why);
}

int sp_exec_gpu_allreduce(const sp_exec_gpu_member *m, const sp_device *dev, float *dst,
                          const float *src, int64_t n, int acc, const char **why)
{
    return reduce(m, dev, dst, src, n, acc, 0, why);
}

int sp_exec_gpu_allreduce_max(const sp_exec_gpu_member *m, const sp_device *dev, float *x,
                              int64_t n, const char **why)
{
    return reduce(m, dev, x, x, n, 0, 1, why);
}

int sp_exec_gpu_allgather(const sp_exec_gpu_member *m, const sp_device *dev, float *x, int64_t n,
                          const char **why)
{
    *why = NULL;
    if (!m->nc || m->size > SP_NCCL_TP_MAX) {
        *why = "a GPU rank's tensor group has no NCCL communicator";
        return 1;
    }
    const int size = m->size, me = sp_nccl_tp_rank(m->nc);
    const int64_t lo = sp_exec_group_chunk(n, size, me);
    const float *send[SP_NCCL_TP_MAX];
    float *recv[SP_NCCL_TP_MAX];
    size_t scount[SP_NCCL_TP_MAX], rcount[SP_NCCL_TP_MAX];
    for (int q = 0; q < size; q++) { /* my chunk out to each member, theirs in */
        const int64_t qlo = sp_exec_group_chunk(n, size, q);
        send[q] = x + lo, scount[q] = (size_t)(sp_exec_group_chunk(n, size, me + 1) - lo);
        recv[q] = x + qlo, rcount[q] = (size_t)(sp_exec_group_chunk(n, size, q + 1) - qlo);
    }
    int rc = sp_nccl_tp_exchange(m->nc, send, scount, recv, rcount, dev->stream);
    if (rc) *why = sp_nccl_tp_error(rc);
    else if (m->fail) *why = injected;
    return rc || m->fail ? 1 : 0;
}
