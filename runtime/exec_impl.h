/* Internals of the executor (runtime/exec/) for the rest of runtime/: the buffer struct,
 * the step counter and the collectives of the main thread. comm/ and sched/policy.c sit
 * below and never include it; the tensor groups' functions are in runtime/group.h. */
#ifndef STARPIPE_EXEC_IMPL_H
#define STARPIPE_EXEC_IMPL_H

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <mpi.h>
#include <starpu.h>

#include "runtime/checks.h"
#include "starpipe/exec.h"
#include "starpipe/program.h" /* sp_tp_group */

struct sp_exec_buf {
    starpu_data_handle_t handle;
    size_t count, elemsize;
    /* The last task submitted that writes it, and the step of that submission: a send of
     * it is posted by that task's wrapper when its data is ready (runtime/exec/sends.c). */
    struct task_args *writer;
    uint64_t writer_step;
    /* sp_exec_buf_create's: the memory node it lives on and the memory the executor
     * allocated there (freed at unregister); node STARPU_MAIN_RAM and mem NULL for a
     * buffer on the caller's memory */
    int node;
    void *mem;
};

/* A collective of the main thread, outside tasks (runtime/exec/watchdog.c): with a watchdog
 * (opts.watchdog_s) posted nonblocking and tested until it ends, or given up with
 * SP_ERR_TIMEOUT (the executor unusable, a line on stderr naming what) when it has not
 * ended after watchdog_s; without one, the blocking call. The one way the runtime runs
 * them. */
typedef enum {
    SP_COLL_ALLREDUCE, SP_COLL_BCAST, SP_COLL_GATHER, SP_COLL_ALLGATHER, SP_COLL_BARRIER
} sp_exec_coll_kind;
typedef struct {
    sp_exec_coll_kind kind;
    const void *send;  /* allreduce (MPI_IN_PLACE: in recv), gather, allgather */
    void *recv;        /* bcast: the buffer */
    int count;         /* elements, per rank */
    MPI_Datatype type;
    MPI_Op op;         /* allreduce */
    int root;          /* bcast, gather */
    MPI_Comm comm;
    const char *what;  /* for the timeout's message: "the step's loss all-reduce" */
} sp_exec_coll;
sp_status sp_exec_collective(const sp_exec_coll *c);
typedef sp_status (*sp_exec_collective_fn)(const sp_exec_coll *c);
/* sp_exec_allreduce_sum and sp_exec_bcast, named in a timeout's message. */
sp_status sp_exec_allreduce_sum_named(void *buf, size_t count, int is_double, const char *what);
sp_status sp_exec_bcast_named(void *buf, size_t bytes, int root, const char *what);
/* The caller's number of the step under way (the trainer's), for those messages. */
void sp_exec_label_step(long step);

/* Set by sp_exec_init. */
extern int sp_exec_rank_, sp_exec_size_;
/* The step counter: message tags of step k live in their own range. */
extern uint64_t sp_exec_step_;

#endif
