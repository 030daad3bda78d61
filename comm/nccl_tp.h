/* Tensor groups over NCCL (comm/nccl_tp.c): one NCCL communicator per tensor group of GPU
 * ranks, for the all-reduces their stage programs meet inside the tasks
 * (runtime/group_gpu.c). Its all-gather runs on the stream it is given, the task's own
 * compute stream, in the task's order: every member issues its group's calls in the
 * plan's task order, so the stream's NCCL calls pair up as the plan's do. Against the
 * pipeline's NCCL transfers (a communicator and a stream of their own) each exchange
 * takes its place in the rank's one order of NCCL operations (comm/nccl_chain.h). Below
 * the runtime: MPI, CUDA and NCCL only. */
#ifndef STARPIPE_COMM_NCCL_TP_H
#define STARPIPE_COMM_NCCL_TP_H

#include <stddef.h>

#include <mpi.h>

#include "starpipe/status.h"

typedef struct sp_nccl_tp sp_nccl_tp;

/* Collective over `group` (the tensor group's MPI communicator; with the fake device over
 * every rank, since each NCCL communicator is split from the world): the group's NCCL
 * communicator on `device`, connected (one all-gather of a float). A build without NCCL
 * or CUDA, or a failure, is SP_ERR_RUNTIME with the reason, on every member. */
sp_status sp_nccl_tp_create(MPI_Comm group, int device, sp_nccl_tp **out);
void sp_nccl_tp_free(sp_nccl_tp *g);
/* all[q n .. (q + 1) n) = member q's src, for every q (this member's too), on stream (a
 * cudaStream_t). 0 or an NCCL/CUDA error code for sp_nccl_tp_error. */
int sp_nccl_tp_allgather(sp_nccl_tp *g, const float *src, float *all, size_t n, void *stream);
/* One NCCL group on stream: to every other member q, send[q] (scount[q] floats), and from
 * it into recv[q] (rcount[q]); the entries of this member are not read. At most
 * SP_NCCL_TP_MAX members (SP_MAX_TENSOR). 0 or a code for sp_nccl_tp_error. */
#define SP_NCCL_TP_MAX 64
int sp_nccl_tp_exchange(sp_nccl_tp *g, const float *const *send, const size_t *scount,
                        float *const *recv, const size_t *rcount, void *stream);
int sp_nccl_tp_rank(const sp_nccl_tp *g);
const char *sp_nccl_tp_error(int code);

#endif
