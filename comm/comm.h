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
/* Collective over world (duplicates it). poke: called after a request is handed to MPI,
 * to wake workers parked while none was in flight. */
sp_status sp_comm_direct_init(MPI_Comm world, void (*poke)(void));
void sp_comm_direct_shutdown(void);
/* A send (is_send) of h's count elements of elemsize bytes to peer, or a receive from it,
 * as message msg (the MPI tag: at most the library's MPI_TAG_UB, checked here). Starts
 * once h's earlier tasks are done, holds h until complete. */
sp_status sp_comm_direct_post(starpu_data_handle_t h, size_t count, size_t elemsize, int peer,
                              uint32_t msg, int is_send, sp_comm_done done, void *arg);
/* Tests the requests in flight and finishes those complete; returns how many. Safe from
 * any thread; StarPU's drivers call it on each turn of their loop. */
int sp_comm_direct_progress(void);
/* Requests handed to MPI and not complete; and those plus the ones waiting for their
 * buffer (0 when everything posted has finished). */
int sp_comm_direct_inflight(void);
int sp_comm_direct_pending(void);
/* The shared-memory eager limit the executor asks of OpenMPI: sends up to this size
 * complete at once; larger ones are sent from a private copy (direct.c), whose bytes
 * (the most ever in flight at once, kept for reuse) this returns. */
#define SP_COMM_EAGER_BYTES 131072
size_t sp_comm_direct_staging_bytes(void);

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
