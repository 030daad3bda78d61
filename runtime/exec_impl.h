/* Internals shared by runtime/, comm/ and sched/policy.c: the error-check macros,
 * the buffer struct, and the hooks of the ordered scheduling policy. */
#ifndef STARPIPE_EXEC_IMPL_H
#define STARPIPE_EXEC_IMPL_H

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <mpi.h>
#include <starpu.h>

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
            return sp_exec_mpi_error(__FILE__, __LINE__, #call, sp_rc_);               \
    } while (0)

sp_status sp_exec_mpi_error(const char *file, int line, const char *call, int rc);

struct sp_exec_buf {
    starpu_data_handle_t handle;
    size_t count, elemsize;
};

/* Set by sp_exec_init; comm/ and the policy read them. */
extern int sp_exec_rank_, sp_exec_size_;
/* The step counter: message tags of step k live in their own range. */
extern uint64_t sp_exec_step_;

/* ---- sched/policy.c ---- */
extern struct starpu_sched_policy sp_policy;
/* Marks t as an ordered task with this sequence number (task->sched_data holds seq+1;
 * tasks left at NULL, such as StarPU-MPI's own, bypass the order). */
void sp_policy_set_seq(struct starpu_task *t, uint32_t seq);
/* Restart the order at seq 0. Fails if tasks of the previous step are still held. */
sp_status sp_policy_begin_step(void);
/* Stop holding tasks: hand the held ones out in seq order despite gaps. Used when the
 * submitted seqs of a step are not 0..n-1, so the step drains instead of hanging. */
void sp_policy_drain(void);

/* ---- traces ---- */
int sp_exec_tracing(void);
/* Records a transfer from its posting to its completion (starpu_timing_now() times). */
void sp_exec_trace_transfer(int is_send, uint32_t msg, int peer, double posted, double done);

/* ---- comm/transfer.c ---- */
/* The StarPU-MPI tag of message msg of step `step`. */
int64_t sp_comm_tag(uint64_t step, uint32_t msg);
sp_status sp_comm_check_tag_space(void);

#endif
