/* One order for every NCCL operation of a rank (comm/nccl_chain.c): the pipeline's
 * groups (comm/nccl.c, on NCCL's own stream) and the tensor group's exchanges
 * (comm/nccl_tp.c, on the task's compute stream) belong to two communicators, and NCCL
 * guarantees progress for concurrent communicators only if their kernels fit on the GPU
 * together and nothing synchronises the device meanwhile. So each operation waits on the
 * GPU for the end of the one issued before it, on whichever stream: a rank's NCCL kernels
 * run one at a time, in the order its worker issued them, which is the plan's order
 * (the ordered policy). Why that cannot deadlock: docs/transports.md, "Two communicators,
 * one order". */
#ifndef STARPIPE_COMM_NCCL_CHAIN_H
#define STARPIPE_COMM_NCCL_CHAIN_H

/* Around each NCCL operation enqueued on stream (a cudaStream_t): enter before its first
 * call (the stream waits for the previous operation's end, when that was on another
 * stream), leave after its ncclGroupEnd (its end becomes the one the next waits for).
 * 0 or a cudaError_t. Thread-safe; a build without CUDA and NCCL does nothing. */
int sp_nccl_chain_enter(void *stream);
int sp_nccl_chain_leave(void *stream);

#endif
