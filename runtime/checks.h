/* The runtime's checks of StarPU and MPI calls (runtime/exec/, runtime/binding.c): the
 * message names the call and where it was made, the function returns SP_ERR_RUNTIME. */
#ifndef STARPIPE_RUNTIME_CHECKS_H
#define STARPIPE_RUNTIME_CHECKS_H

#include <string.h>

#include <mpi.h>

#include "comm/transport.h" /* sp_comm_mpi_error */
#include "starpipe/status.h"

/* StarPU returns -errno; MPI an error code. */
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

#endif
