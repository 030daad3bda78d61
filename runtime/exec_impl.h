/* Internals of the executor (runtime/exec.c): the buffer struct and the step counter.
 * comm/ and sched/policy.c sit below and never include it. */
#ifndef STARPIPE_EXEC_IMPL_H
#define STARPIPE_EXEC_IMPL_H

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <mpi.h>
#include <starpu.h>

#include "runtime/checks.h"
#include "starpipe/exec.h"

struct sp_exec_buf {
    starpu_data_handle_t handle;
    size_t count, elemsize;
    /* The last task submitted that writes it, and the step of that submission: a send of
     * it is posted by that task's wrapper when its data is ready (exec.c, send_early). */
    struct task_args *writer;
    uint64_t writer_step;
    /* sp_exec_buf_create's: the memory node it lives on and the memory the executor
     * allocated there (freed at unregister); node STARPU_MAIN_RAM and mem NULL for a
     * buffer on the caller's memory */
    int node;
    void *mem;
};

/* Set by sp_exec_init. */
extern int sp_exec_rank_, sp_exec_size_;
/* The step counter: message tags of step k live in their own range. */
extern uint64_t sp_exec_step_;

#endif
