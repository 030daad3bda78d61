/* What comm/ offers the executor (runtime/exec.c): point-to-point transfers of StarPU
 * data, direct (MPI requests driven by the rank's own workers) or over StarPU-MPI, and
 * the NCCL transport. comm/ sits below the runtime: it
 * uses StarPU, StarPU-MPI, MPI and NCCL, never a runtime header. */
#ifndef STARPIPE_COMM_H
#define STARPIPE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include <mpi.h>
#include <starpu.h>

#include "starpipe/status.h"

/* The StarPU-MPI tag of message msg of step `step`; and a check, once StarPU-MPI runs,
 * that every tag starpipe can make fits its bound. */
int64_t sp_comm_tag(uint64_t step, uint32_t msg);
sp_status sp_comm_check_tag_space(void);

/* A detached send (is_send) or receive of h to or from rank peer with this tag; done(arg)
 * runs at completion. done must not be NULL: a callback is what keeps StarPU-MPI's
 * cooperative sends off (transfer.c). */
sp_status sp_comm_post(starpu_data_handle_t h, int peer, int64_t tag, int is_send,
                       void (*done)(void *), void *arg);

/* ---- direct transfers (direct.c) ----
 * done(arg, err) runs once per request, on the thread that completed it: err is NULL, or
 * one line saying what failed (the buffer is released either way). */
typedef void (*sp_comm_done)(void *arg, const char *err);
/* Collective over world (duplicates it). pieces: cut large transfers between ranks of
 * one node into eager pieces (direct.c; else they go as between nodes). poke: called
 * after a request is handed to MPI, to wake workers parked while none was in flight. */
sp_status sp_comm_direct_init(MPI_Comm world, int pieces, void (*poke)(void));
void sp_comm_direct_shutdown(void);
/* Collective, with nothing in flight: later transfers go on a fresh communicator, where no
 * message left over from a failed step (pieces that ranks of different sizes sent and no
 * receive took) can meet them. */
sp_status sp_comm_direct_renew(void);
/* A send (is_send) of h's count elements of elemsize bytes to peer, or a receive from it,
 * as message msg (the MPI tag: at most the library's MPI_TAG_UB, checked here). Starts
 * once h's earlier tasks are done, holds h until complete. With held, *held is the
 * transfer, kept alive until the caller's sp_comm_direct_drop: meanwhile the task that
 * writes the data of a send may post it itself, sooner than StarPU ends that task. */
typedef struct sp_comm_req sp_comm_req;
sp_status sp_comm_direct_post(starpu_data_handle_t h, size_t count, size_t elemsize, int peer,
                              uint32_t msg, int is_send, sp_comm_done done, void *arg,
                              sp_comm_req **held);
void sp_comm_direct_drop(sp_comm_req *r);
/* Posts send r now from ptr, h's host memory, which the calling task has just finished
 * writing (it must be the last task writing h that was submitted before the send). At most
 * once, and only before StarPU ends that task; r still holds h until MPI is done. */
void sp_comm_direct_send_from(sp_comm_req *r, void *ptr);
/* Tests the requests in flight and finishes those complete; returns how many. Safe from
 * any thread; StarPU's drivers call it on each turn of their loop. */
int sp_comm_direct_progress(void);
/* MPI requests in flight (a transfer may be several); and the transfers posted and not
 * yet finished (0 when every done callback has returned). */
int sp_comm_direct_inflight(void);
int sp_comm_direct_pending(void);
/* Messages up to this size go eagerly through shared memory (the executor raises
 * OpenMPI's limit to SP_COMM_EAGER_LIMIT, which counts its header): their sends complete
 * at once. Larger transfers go as pieces of this size within a node, and from a private
 * copy to another node (direct.c); the copies' bytes (the most ever in flight at once,
 * kept for reuse) are what sp_comm_direct_staging_bytes returns. */
#define SP_COMM_EAGER_BYTES 131072
#define SP_COMM_EAGER_LIMIT (SP_COMM_EAGER_BYTES + 1024)
size_t sp_comm_direct_staging_bytes(void);
/* Transfers since init: sends, receives, those in pieces, sends posted by their producer. */
void sp_comm_direct_counts(unsigned long long out[4]);

/* NCCL over the ranks of comm (collective; once per process; see nccl.c). ncuda: this
 * rank's CUDA workers. notice gets one line saying what carries GPU transfers. */
sp_status sp_comm_nccl_init(MPI_Comm comm, int ncuda, char *notice, size_t len);
int sp_comm_nccl_active(void);
void sp_comm_nccl_shutdown(void);
/* Collective among the listed peers: connects to each now (one float each way), so that
 * the first step does not set up connections inside a group. peers must be symmetric (a
 * lists b exactly when b lists a), as the plan's NCCL messages are. */
sp_status sp_comm_nccl_connect(const int *peers, int n);
/* The asynchronous NCCL error seen by the completion thread, or NULL: the executor's wait
 * loop polls it. After one, the communicator is aborted. */
const char *sp_comm_nccl_error(void);
/* A group of NCCL calls as one task's CUDA function: call i sends (is_send) the task's
 * buffer `buf` to peer, or receives it from peer, all between ncclGroupStart and
 * ncclGroupEnd on NCCL's own stream (never the worker's compute stream); the task ends
 * when the group has (StarPU end dependency, released by nccl.c's completion thread).
 * Submit it as an ordered task (modes R for sends, W for receives), in the plan's message
 * order (sp_nccl_calls); a buffer may be sent to several peers in one group. The args are
 * SP_COMM_NCCL_GROUP_ARGS_SIZE(n) bytes. */
typedef struct {
    int is_send, peer, buf;
} sp_comm_nccl_call;
typedef struct {
    int n;
    sp_comm_nccl_call call[];
} sp_comm_nccl_group_args;
#define SP_COMM_NCCL_GROUP_ARGS_SIZE(n) \
    (sizeof(sp_comm_nccl_group_args) + (size_t)(n) * sizeof(sp_comm_nccl_call))
int sp_comm_nccl_group(void *const *bufs, const size_t *counts, int nbufs, const void *args,
                       void *stream);

#endif
