/* Internals of the executor (runtime/exec.c, runtime/binding.c): the error-check macros
 * and the buffer struct. comm/ and sched/policy.c sit below and never include it. */
#ifndef STARPIPE_EXEC_IMPL_H
#define STARPIPE_EXEC_IMPL_H

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <mpi.h>
#include <starpu.h>

#include "comm/transport.h" /* sp_comm_mpi_error */
#include "starpipe/exec.h"

/* Every StarPU call that can fail goes through these: the message names the call and
 * where it was made, the function returns SP_ERR_RUNTIME. StarPU returns -errno. */
#define SP_STARPU_CHECK(call)                                                          \
    do {                                                                               \
        int sp_rc_ = (call);                                                           \
        if (sp_rc_ < 0)                                                                \
            return sp_set_error(SP_ERR_RUNTIME, "%s:%d: %s failed: %s", __FILE__,      \
                                __LINE__, #call, strerror(-sp_rc_));                   \
    } while (0)

#define SP_MPI_CHECK(call)                                                             \
    do {                                                                               \
        int sp_rc_ = (call);                                                           \
        if (sp_rc_ != MPI_SUCCESS)                                                     \
            return sp_comm_mpi_error(__FILE__, __LINE__, #call, sp_rc_);               \
    } while (0)

struct sp_exec_buf {
    starpu_data_handle_t handle;
    size_t count, elemsize;
    /* The last task submitted that writes it, and the step of that submission: a send of
     * it is posted by that task's wrapper when its data is ready (exec.c, send_early). */
    struct task_args *writer;
    uint64_t writer_step;
};

/* Set by sp_exec_init. */
extern int sp_exec_rank_, sp_exec_size_;
/* The step counter: message tags of step k live in their own range. */
extern uint64_t sp_exec_step_;

#endif
