/* Tensor parallelism's groups over MPI (starpipe/exec.h, sp_exec_group): the all-reduces
 * of a group's stage programs, met inside the tasks. Each member sends its values to
 * every other one and receives theirs, point to point on the group's own communicator,
 * then sums them in the group's one order (member 0's, + member 1's, ... in float32:
 * program.h), or takes their maximum in that order (allreduce_max), so every member gets
 * the bits the reference's in-process group gives (graph/tensor_group.c). Point to point, not MPI_Allreduce: the tasks of a rank may run
 * at once on several workers, and a collective would need every member to enter the
 * group's collectives in one order; a tag made of the task's seq and the all-reduce's
 * place in its program pairs each message with its own whatever the order. A task of a
 * failed step still meets its group (runtime/exec/codelet.c, meet_only), so no member waits for
 * one that gave up. A vector of SP_GROUP_CHUNKED_FLOATS or more goes as a reduce-scatter
 * then an all-gather instead (task_reduce_chunked): member r sums chunk r of every
 * member's values, in the same member order, and sends the sums to the others, 2 (T-1)/T
 * of the vector per member where the exchange of whole vectors sends T - 1 of them, with
 * the same bits: each element is summed in the same order either way. On a GPU rank the
 * same calls go to the group's NCCL communicator, on the task's stream
 * (runtime/group_gpu.c, comm/nccl_tp.c). */
#include <stdlib.h>
#include <string.h>

#include "codelets/cpu/kernels.h"
#include "comm/nccl_tp.h"
#include "runtime/group.h"
#include "starpipe/device.h"
#include "starpipe/program.h"

/* tag = (seq mod 2^20) << 10 | k: 1024 all-reduces per task, 2^20 tasks of a step apart */
#define SP_GROUP_K_BITS 10
#define SP_GROUP_SEQ_MASK ((1u << 20) - 1)
#define SP_GROUP_MAX_FLOATS ((int64_t)1 << 30) /* one message of at most 4 GiB */

enum { GROUP_MPI = 1, GROUP_NOMEM, GROUP_TOO_MANY, GROUP_TOO_LARGE, GROUP_GPU, GROUP_TIMEOUT,
       GROUP_INJECTED };

struct sp_exec_tensor_group {
    MPI_Comm comm;      /* the tasks' point-to-point messages */
    MPI_Comm host_comm; /* the main thread's collectives */
    sp_exec_collective_fn collective; /* which run them (under the executor's watchdog) */
    int size, rank;
    struct sp_tp_group host;
    sp_nccl_tp *nccl;   /* GPU ranks: the group's NCCL communicator */
    /* each worker's room for the members' values (grown, kept: a fresh multi-MB malloc
     * per all-reduce is a fresh mmap whose pages fault in, on every call) */
    int nworkers;
    float **room;
    size_t *room_floats;
    /* GPU ranks: each device worker's room on its device, made with the group, for every
     * all-reduce of its tasks (group_gpu.c: allocating inside a step could fail between
     * two NCCL exchanges, and a member that skips one hangs the group) */
    float **dev_room;
    int64_t dev_room_floats;
};

static const char *task_status_string(struct sp_tp_group *vt, int code);

static const char *status_string(struct sp_tp_group *g, int code)
{
    (void)g;
    return code == GROUP_MPI ? "an MPI call of the tensor group failed"
         : code == GROUP_NOMEM ? "out of memory for the tensor group's sum"
         : code == GROUP_TOO_MANY ? "more than 1024 tensor-parallel exchanges in one task (an "
                                    "all-reduce of 64 KiB or more takes two)"
         : code == GROUP_TOO_LARGE ? "a tensor-parallel all-reduce of more than 2^30 floats"
         : code == GROUP_TIMEOUT ? "the tensor group's gather between steps did not end in "
                                   "STARPIPE_STEP_TIMEOUT: a member that died or is stuck"
         : code == GROUP_INJECTED ? "an injected failure of the tensor group's all-reduce "
                                    "(STARPIPE_FAULT=group@)"
                                 : "unknown error";
}

/* dst (=, or += with acc) the sum of `all`'s size rows of n floats, in row order: row 0
 * gets ((x_0 + x_1) + x_2) + ... element by element (row after row, so that the adds
 * vectorise), then dst gets it */
static void ordered_sum(float *dst, float *all, int size, int64_t n, int acc)
{
    for (int r = 1; r < size; r++) {
        const float *x = all + (int64_t)r * n;
        for (int64_t j = 0; j < n; j++) all[j] += x[j];
    }
    if (acc)
        for (int64_t j = 0; j < n; j++) dst[j] += all[j];
    else
        memcpy(dst, all, sizeof(float) * (size_t)n);
}

/* dst (n) = the elementwise maximum of `all`'s size rows, in row order (program.h) */
static void ordered_max(float *dst, const float *all, int size, int64_t n)
{
    memmove(dst, all, sizeof(float) * (size_t)n);
    for (int r = 1; r < size; r++) sp_maximum_forward(dst, dst, all + (int64_t)r * n, n);
}

/* The running worker's room for `floats`, kept in the group (grown as needed); NULL when
 * out of memory or not on a worker. */
static float *worker_room(sp_exec_tensor_group *g, size_t floats)
{
    int w = starpu_worker_get_id();
    if (w < 0 || w >= g->nworkers) return NULL;
    if (g->room_floats[w] < floats) {
        float *r = realloc(g->room[w], sizeof(float) * floats);
        if (!r) return NULL;
        g->room[w] = r, g->room_floats[w] = floats;
    }
    return g->room[w];
}

/* Every member's n floats of src into *all (size rows, member q's in row q: the running
 * worker's room, not to be freed), exchanged point to point under the tag of this
 * all-reduce: the task's seq and its place k among the task's all-reduces, sum or max
 * alike. */
static int task_exchange(sp_exec_task_group *tg, const float *src, int64_t n, float **all_out)
{
    sp_exec_tensor_group *g = tg->g;
    *all_out = NULL;
    if (tg->k >= 1 << SP_GROUP_K_BITS) return GROUP_TOO_MANY;
    if (n > SP_GROUP_MAX_FLOATS) return GROUP_TOO_LARGE;
    int tag = (int)(((tg->seq & SP_GROUP_SEQ_MASK) << SP_GROUP_K_BITS) | (uint32_t)tg->k++);
    float *all = worker_room(g, (size_t)g->size * (size_t)(n > 0 ? n : 1));
    MPI_Request req_stack[16], *req = g->size <= 8 ? req_stack
                                                   : malloc(sizeof *req * 2 * (size_t)g->size);
    if (!all || !req) {
        if (req != req_stack) free(req);
        return GROUP_NOMEM;
    }
    memcpy(all + (int64_t)g->rank * n, src, sizeof(float) * (size_t)n);
    int nr = 0, bad = 0;
    for (int q = 0; q < g->size && !bad; q++) {
        if (q == g->rank) continue;
        bad |= MPI_Irecv(all + (int64_t)q * n, (int)n, MPI_FLOAT, q, tag, g->comm, &req[nr++]) !=
               MPI_SUCCESS;
        bad |= !bad && MPI_Isend(src, (int)n, MPI_FLOAT, q, tag, g->comm, &req[nr++]) != MPI_SUCCESS;
    }
    bad |= MPI_Waitall(nr, req, MPI_STATUSES_IGNORE) != MPI_SUCCESS;
    if (req != req_stack) free(req);
    if (bad) return GROUP_MPI;
    *all_out = all;
    return 0;
}

static int64_t chunk_at(int64_t n, int size, int q) { return sp_exec_group_chunk(n, size, q); }

/* Each member's chunk of x (n floats) to every other member, theirs into x: 0, or 1 when
 * an MPI call failed. */
static int gather_chunks(sp_exec_tensor_group *g, float *x, int64_t n, int tag)
{
    const int T = g->size, me = g->rank;
    const int64_t lo = chunk_at(n, T, me), len = chunk_at(n, T, me + 1) - lo;
    MPI_Request req_stack[16], *req = T <= 8 ? req_stack : malloc(sizeof *req * 2 * (size_t)T);
    if (!req) return 1;
    int bad = 0, nr = 0;
    for (int q = 0; q < T && !bad; q++) {
        if (q == me) continue;
        const int64_t qlo = chunk_at(n, T, q), qlen = chunk_at(n, T, q + 1) - qlo;
        bad |= MPI_Irecv(x + qlo, (int)qlen, MPI_FLOAT, q, tag, g->comm, &req[nr++]) != MPI_SUCCESS;
        bad |= !bad && MPI_Isend(x + lo, (int)len, MPI_FLOAT, q, tag, g->comm, &req[nr++]) !=
                           MPI_SUCCESS;
    }
    bad |= MPI_Waitall(nr, req, MPI_STATUSES_IGNORE) != MPI_SUCCESS;
    if (req != req_stack) free(req);
    return bad;
}

/* The all-reduce (sum, or max when is_max) of n floats as a reduce-scatter then an
 * all-gather, each element combined in member order as ordered_sum and ordered_max do:
 * the running worker's room holds the members' copies of this member's chunk (size rows
 * of the largest chunk), then the whole result; dst is written last, so it may be src. */
static int task_reduce_chunked(sp_exec_task_group *tg, float *dst, const float *src,
                               int64_t n, int acc, int is_max)
{
    sp_exec_tensor_group *g = tg->g;
    const int T = g->size, me = g->rank;
    if (tg->k + 1 >= 1 << SP_GROUP_K_BITS) return GROUP_TOO_MANY;
    if (n > SP_GROUP_MAX_FLOATS) return GROUP_TOO_LARGE;
    const uint32_t seq = (tg->seq & SP_GROUP_SEQ_MASK) << SP_GROUP_K_BITS;
    const int tag_scatter = (int)(seq | (uint32_t)tg->k++), tag_gather = (int)(seq | (uint32_t)tg->k++);
    const int64_t widest = (n + T - 1) / T, lo = chunk_at(n, T, me);
    const int64_t len = chunk_at(n, T, me + 1) - lo;
    float *room = worker_room(g, (size_t)T * (size_t)widest + (size_t)n);
    MPI_Request req_stack[16], *req = T <= 8 ? req_stack : malloc(sizeof *req * 2 * (size_t)T);
    if (!room || !req) {
        if (req != req_stack) free(req);
        return GROUP_NOMEM;
    }
    float *rows = room, *out = room + (int64_t)T * widest;
    memcpy(rows + (int64_t)me * widest, src + lo, sizeof(float) * (size_t)len);
    int bad = 0, nr = 0;
    for (int q = 0; q < T && !bad; q++) { /* q's copy of my chunk in; my copy of q's out */
        if (q == me) continue;
        const int64_t qlo = chunk_at(n, T, q), qlen = chunk_at(n, T, q + 1) - qlo;
        bad |= MPI_Irecv(rows + (int64_t)q * widest, (int)len, MPI_FLOAT, q, tag_scatter,
                         g->comm, &req[nr++]) != MPI_SUCCESS;
        bad |= !bad && MPI_Isend(src + qlo, (int)qlen, MPI_FLOAT, q, tag_scatter, g->comm,
                                 &req[nr++]) != MPI_SUCCESS;
    }
    bad |= MPI_Waitall(nr, req, MPI_STATUSES_IGNORE) != MPI_SUCCESS;
    if (req != req_stack) free(req);
    if (!bad) { /* my chunk, combined in member order */
        memcpy(out + lo, rows, sizeof(float) * (size_t)len);
        for (int q = 1; q < T; q++) {
            const float *x = rows + (int64_t)q * widest;
            if (is_max) sp_maximum_forward(out + lo, out + lo, x, len);
            else
                for (int64_t j = 0; j < len; j++) out[lo + j] += x[j];
        }
    }
    if (bad || gather_chunks(g, out, n, tag_gather)) return GROUP_MPI;
    if (acc)
        for (int64_t j = 0; j < n; j++) dst[j] += out[j];
    else
        memmove(dst, out, sizeof(float) * (size_t)n);
    return 0;
}

static int on_gpu(const sp_exec_task_group *tg)
{
    return tg->dev && tg->dev->type == SP_DEVICE_CUDA;
}

/* The running GPU worker's side of the group (group_gpu.c); takes the task's injected
 * failure, once */
static sp_exec_gpu_member gpu_member(sp_exec_task_group *tg)
{
    sp_exec_tensor_group *g = tg->g;
    int w = starpu_worker_get_id();
    sp_exec_gpu_member m = { .nc = g->nccl, .size = g->size, .fail = tg->vt.fail_next,
                             .room = g->dev_room && w >= 0 && w < g->nworkers ? g->dev_room[w]
                                                                              : NULL,
                             .room_floats = g->dev_room_floats };
    tg->vt.fail_next = 0;
    return m;
}

/* A CPU member's injected failure (STARPIPE_FAULT=group@), taken once: reported after the
 * all-reduce's exchanges, as a real failure past them would be. */
static int take_fail(struct sp_tp_group *vt)
{
    const int fail = vt->fail_next;
    vt->fail_next = 0;
    return fail;
}

static int task_allreduce(struct sp_tp_group *vt, float *dst, const float *src, int64_t n,
                          int acc)
{
    sp_exec_task_group *tg = (sp_exec_task_group *)vt;
    if (on_gpu(tg)) {
        sp_exec_gpu_member m = gpu_member(tg);
        return sp_exec_gpu_allreduce(&m, tg->dev, dst, src, n, acc, &tg->why) ? GROUP_GPU : 0;
    }
    const int fail = take_fail(vt);
    int rc;
    if (n >= SP_GROUP_CHUNKED_FLOATS) {
        rc = task_reduce_chunked(tg, dst, src, n, acc, 0);
    } else {
        float *all;
        rc = task_exchange(tg, src, n, &all);
        if (!rc) ordered_sum(dst, all, tg->g->size, n, acc);
    }
    return rc ? rc : fail ? GROUP_INJECTED : 0;
}

static int task_allreduce_max(struct sp_tp_group *vt, float *x, int64_t n)
{
    sp_exec_task_group *tg = (sp_exec_task_group *)vt;
    if (on_gpu(tg)) {
        sp_exec_gpu_member m = gpu_member(tg);
        return sp_exec_gpu_allreduce_max(&m, tg->dev, x, n, &tg->why) ? GROUP_GPU : 0;
    }
    const int fail = take_fail(vt);
    int rc;
    if (n >= SP_GROUP_CHUNKED_FLOATS) {
        rc = task_reduce_chunked(tg, x, x, n, 0, 1);
    } else {
        float *all;
        rc = task_exchange(tg, x, n, &all);
        if (!rc) ordered_max(x, all, tg->g->size, n);
    }
    return rc ? rc : fail ? GROUP_INJECTED : 0;
}

static int task_allgather(struct sp_tp_group *vt, float *x, int64_t n)
{
    sp_exec_task_group *tg = (sp_exec_task_group *)vt;
    if (on_gpu(tg)) {
        const int keep = vt->fail_next; /* the injected failure is an all-reduce's */
        sp_exec_gpu_member m = gpu_member(tg);
        m.fail = 0;
        vt->fail_next = keep;
        return sp_exec_gpu_allgather(&m, tg->dev, x, n, &tg->why) ? GROUP_GPU : 0;
    }
    if (tg->k >= 1 << SP_GROUP_K_BITS) return GROUP_TOO_MANY;
    if (n > SP_GROUP_MAX_FLOATS) return GROUP_TOO_LARGE;
    int tag = (int)(((tg->seq & SP_GROUP_SEQ_MASK) << SP_GROUP_K_BITS) | (uint32_t)tg->k++);
    return gather_chunks(tg->g, x, n, tag) ? GROUP_MPI : 0;
}

static int no_f64(struct sp_tp_group *vt, double *x, int64_t n)
{
    (void)vt, (void)x, (void)n;
    return GROUP_MPI; /* a task never sums doubles: only the host does (the norm) */
}

static const char *task_status_string(struct sp_tp_group *vt, int code)
{
    const sp_exec_task_group *tg = (const sp_exec_task_group *)vt;
    return code == GROUP_GPU && tg->why ? tg->why : status_string(vt, code);
}

struct sp_tp_group *sp_exec_tensor_group_of_task(sp_exec_tensor_group *g, uint32_t seq,
                                                 const sp_device *dev, sp_exec_task_group *tg)
{
    *tg = (sp_exec_task_group){ .vt = { .allreduce = task_allreduce,
                                        .allreduce_max = task_allreduce_max, .sum_f64 = no_f64,
                                        .allgather = task_allgather,
                                        .status_string = task_status_string },
                                .g = g, .seq = seq, .k = 0, .dev = dev };
    return &tg->vt;
}

/* ---- the main thread's view: collectives between steps ---- */

static sp_exec_tensor_group *host_owner(struct sp_tp_group *vt)
{
    return (sp_exec_tensor_group *)((char *)vt - offsetof(sp_exec_tensor_group, host));
}

/* Every member's n elements of x (elem bytes each, MPI type t) into *all, a fresh
 * buffer of size rows the caller frees: the main thread's collective between steps. */
static int host_gather(sp_exec_tensor_group *g, const void *x, int64_t n, MPI_Datatype t,
                       size_t elem, void **all)
{
    *all = NULL;
    if (n > SP_GROUP_MAX_FLOATS / g->size) return GROUP_TOO_LARGE;
    if (!(*all = malloc(elem * (size_t)g->size * (size_t)(n > 0 ? n : 1)))) return GROUP_NOMEM;
    sp_status st = g->collective(&(sp_exec_coll){
        .kind = SP_COLL_ALLGATHER, .send = x, .recv = *all, .count = (int)n, .type = t,
        .comm = g->host_comm, .what = "the tensor group's gather between steps" });
    if (st == SP_OK) return 0;
    free(*all);
    *all = NULL;
    return st == SP_ERR_TIMEOUT ? GROUP_TIMEOUT : GROUP_MPI;
}

static int host_allreduce(struct sp_tp_group *vt, float *dst, const float *src, int64_t n, int acc)
{
    void *all;
    int rc = host_gather(host_owner(vt), src, n, MPI_FLOAT, sizeof(float), &all);
    if (!rc) ordered_sum(dst, all, host_owner(vt)->size, n, acc);
    free(all);
    return rc;
}

static int host_allreduce_max(struct sp_tp_group *vt, float *x, int64_t n)
{
    void *all;
    int rc = host_gather(host_owner(vt), x, n, MPI_FLOAT, sizeof(float), &all);
    if (!rc) ordered_max(x, all, host_owner(vt)->size, n);
    free(all);
    return rc;
}

static int host_allgather(struct sp_tp_group *vt, float *x, int64_t n)
{
    void *all;
    sp_exec_tensor_group *g = host_owner(vt);
    int rc = host_gather(g, x, n, MPI_FLOAT, sizeof(float), &all);
    for (int q = 0; q < g->size && !rc; q++) { /* row q's chunk q */
        const int64_t lo = chunk_at(n, g->size, q), hi = chunk_at(n, g->size, q + 1);
        memcpy(x + lo, (const float *)all + (int64_t)q * n + lo, sizeof(float) * (size_t)(hi - lo));
    }
    free(all);
    return rc;
}

static int host_sum_f64(struct sp_tp_group *vt, double *x, int64_t n)
{
    void *all;
    const int size = host_owner(vt)->size;
    int rc = host_gather(host_owner(vt), x, n, MPI_DOUBLE, sizeof(double), &all);
    for (int64_t j = 0; j < n && !rc; j++) {
        const double *a = all;
        double s = a[j];
        for (int r = 1; r < size; r++) s += a[(int64_t)r * n + j];
        x[j] = s;
    }
    free(all);
    return rc;
}

/* Each device worker's room on its memory node, dev_room_floats floats (StarPU's
 * allocator, so that its memory cap counts them): made now, before any step. */
static sp_status make_dev_rooms(sp_exec_tensor_group *g, int64_t max_floats)
{
    const sp_device_kind *k = sp_exec_device();
    g->dev_room_floats = sp_exec_gpu_room_floats(g->size, max_floats);
    if (!(g->dev_room = calloc((size_t)g->nworkers + 1, sizeof *g->dev_room)))
        return sp_set_error(SP_ERR_NOMEM, "tensor group: out of memory");
    const size_t bytes = sizeof(float) * (size_t)g->dev_room_floats;
    for (int w = 0; k && w < g->nworkers; w++) {
        if (!k->owns_worker((unsigned)w)) continue;
        unsigned node = starpu_worker_get_memory_node((unsigned)w);
        if (!(g->dev_room[w] = (float *)starpu_malloc_on_node(node, bytes)))
            return sp_set_error(SP_ERR_NOMEM, "tensor group: no room on the device for its "
                                "all-reduces (%zu bytes, the largest needs %lld floats)", bytes,
                                (long long)max_floats);
    }
    return SP_OK;
}

sp_status sp_exec_tensor_group_wrap(MPI_Comm comm, int size, int device, int64_t max_floats,
                                     sp_exec_collective_fn collective,
                                     sp_exec_tensor_group **out)
{
    *out = NULL;
    sp_exec_tensor_group *g = calloc(1, sizeof *g);
    if (!g) {
        MPI_Comm_free(&comm);
        return sp_set_error(SP_ERR_NOMEM, "tensor group: out of memory");
    }
    g->comm = comm;
    g->collective = collective;
    g->host_comm = MPI_COMM_NULL;
    g->nworkers = (int)starpu_worker_get_count();
    g->room = calloc((size_t)g->nworkers + 1, sizeof *g->room);
    g->room_floats = calloc((size_t)g->nworkers + 1, sizeof *g->room_floats);
    if (!g->room || !g->room_floats) g->nworkers = 0; /* then every call says out of memory */
    int rc = MPI_Comm_dup(g->comm, &g->host_comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(g->comm, &g->size);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(g->comm, &g->rank);
    int *ub = NULL, flag = 0; /* MPI_TAG_UB is an attribute of the world communicator */
    if (rc == MPI_SUCCESS) rc = MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    sp_status st = rc == MPI_SUCCESS ? SP_OK : sp_comm_mpi_error(__FILE__, __LINE__, "MPI_Comm_dup", rc);
    if (st == SP_OK && g->size != size)
        st = sp_set_error(SP_ERR_ARG, "a tensor group of %d ranks, expected %d", g->size, size);
    if (st == SP_OK && (!flag || *ub < (int)((SP_GROUP_SEQ_MASK << SP_GROUP_K_BITS) | 1023u)))
        st = sp_set_error(SP_ERR_RUNTIME, "this MPI's tags end at %d: the tensor group's need "
                          "30 bits", flag ? *ub : -1);
    if (st) {
        sp_exec_tensor_group_free(g);
        return st;
    }
    /* GPU ranks: the group's NCCL communicator, connected now (collective in the group) */
    if (device >= 0 && (st = sp_nccl_tp_create(g->host_comm, device, &g->nccl))) {
        sp_exec_tensor_group_free(g);
        return st;
    }
    /* ... and its rooms; every member learns whether all made theirs (a member that
     * failed alone would leave the others waiting in their first exchange) */
    if (device >= 0) {
        st = make_dev_rooms(g, max_floats);
        int ok = st == SP_OK, all = 0;
        rc = MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, g->host_comm);
        if (st == SP_OK && (rc != MPI_SUCCESS || !all))
            st = rc != MPI_SUCCESS ? sp_comm_mpi_error(__FILE__, __LINE__, "MPI_Allreduce", rc)
                                   : sp_set_error(SP_ERR_NOMEM, "tensor group: another member "
                                                  "had no room on its device for the group's "
                                                  "all-reduces");
        if (st) {
            sp_exec_tensor_group_free(g);
            return st;
        }
    }
    g->host = (struct sp_tp_group){ .allreduce = host_allreduce,
                                    .allreduce_max = host_allreduce_max,
                                    .sum_f64 = host_sum_f64, .allgather = host_allgather,
                                    .status_string = status_string };
    *out = g;
    return SP_OK;
}

struct sp_tp_group *sp_exec_tensor_group_host(sp_exec_tensor_group *g) { return g ? &g->host : NULL; }

size_t sp_exec_tensor_group_room_bytes(int size, int64_t max_floats)
{
    return size > 1 ? sizeof(float) * (size_t)sp_exec_gpu_room_floats(size, max_floats) : 0;
}

void sp_exec_tensor_group_free(sp_exec_tensor_group *g)
{
    if (!g) return;
    sp_nccl_tp_free(g->nccl);
    for (int w = 0; g->dev_room && w < g->nworkers; w++)
        if (g->dev_room[w])
            starpu_free_on_node(starpu_worker_get_memory_node((unsigned)w),
                                (uintptr_t)g->dev_room[w],
                                sizeof(float) * (size_t)g->dev_room_floats);
    free(g->dev_room);
    for (int w = 0; g->room && w < g->nworkers; w++) free(g->room[w]);
    free(g->room), free(g->room_floats);
    if (g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
    if (g->host_comm != MPI_COMM_NULL) MPI_Comm_free(&g->host_comm);
    free(g);
}
