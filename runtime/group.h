/* The tensor groups (runtime/group.c, and runtime/group_gpu.c on CUDA workers): a group
 * of T ranks' all-reduces inside tasks (MPI between CPU ranks, NCCL between GPU ranks) and
 * its main-thread gathers between steps. The executor (runtime/exec/) creates a group and
 * hands each task its view; nothing here calls the executor back except through the
 * collective function it hands down. */
#ifndef STARPIPE_RUNTIME_GROUP_H
#define STARPIPE_RUNTIME_GROUP_H

#include "runtime/exec_impl.h"

/* A task's view of its group (sp_tp_group with the task's seq, which
 * tags its all-reduces), on the wrapper's stack while the task runs. */
typedef struct {
    struct sp_tp_group vt;
    sp_exec_tensor_group *g;
    uint32_t seq;
    int k;                /* all-reduces met so far */
    const sp_device *dev; /* the worker's: a CUDA one meets its group over NCCL */
    const char *why;      /* what the last failure was, for status_string */
} sp_exec_task_group;
struct sp_tp_group *sp_exec_tensor_group_of_task(sp_exec_tensor_group *g, uint32_t seq,
                                                 const sp_device *dev, sp_exec_task_group *tg);
/* From 64 KiB a vector's bandwidth outweighs the second round of messages: a tensor
 * group's all-reduce of this many floats or more goes as a reduce-scatter then an
 * all-gather (runtime/group.c), member q combining the chunk [n q / T, n (q + 1) / T). */
#define SP_GROUP_CHUNKED_FLOATS 16384
static inline int64_t sp_exec_group_chunk(int64_t n, int size, int q) { return sp_tp_chunk(n, size, q); }
/* runtime/group_gpu.c, a task's all-reduces on a CUDA worker (device pointers, dev the
 * task's device): 0, or 1 with *why set. m: the member's NCCL communicator and the
 * worker's room on the device, made with the group (sp_exec_gpu_room_floats(size, the
 * largest all-reduce) floats: one round for any all-reduce up to that size); fail: tests
 * (STARPIPE_FAULT=group@), a local failure before the first exchange. */
struct sp_nccl_tp;
typedef struct {
    struct sp_nccl_tp *nc;
    int size;
    float *room;
    int64_t room_floats;
    int fail;
} sp_exec_gpu_member;
int64_t sp_exec_gpu_room_floats(int size, int64_t max_floats);
int sp_exec_gpu_allreduce(const sp_exec_gpu_member *m, const sp_device *dev, float *dst,
                          const float *src, int64_t n, int acc, const char **why);
/* x (n) = the elementwise maximum of every member's x, in rank order (in place). */
int sp_exec_gpu_allreduce_max(const sp_exec_gpu_member *m, const sp_device *dev, float *x,
                              int64_t n, const char **why);
/* x (n): each member's chunk to every member (the all-gather of scatter-gather; in place,
 * no room). */
int sp_exec_gpu_allgather(const sp_exec_gpu_member *m, const sp_device *dev, float *x, int64_t n,
                          const char **why);

/* A tensor group on comm (split from the executor's; the group takes it over); device:
 * the rank's CUDA device, whose NCCL communicator the group makes (and each of its
 * workers' room for all-reduces of up to max_floats), or -1; collective: how
 * its main-thread collectives run (the executor's sp_exec_collective, handed down so that
 * group.c calls nothing of runtime/exec/: the layers point one way). */
sp_status sp_exec_tensor_group_wrap(MPI_Comm comm, int size, int device, int64_t max_floats,
                                     sp_exec_collective_fn collective,
                                     sp_exec_tensor_group **out);

#endif
