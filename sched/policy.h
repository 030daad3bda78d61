/* The "starpipe" StarPU scheduling policy (policy.c): what the executor (runtime/exec/)
 * uses of it. The only StarPU-facing file of sched/; it includes no runtime header. */
#ifndef STARPIPE_SCHED_POLICY_H
#define STARPIPE_SCHED_POLICY_H

#include <stdint.h>

#include <starpu.h>

#include "starpipe/status.h"

extern struct starpu_sched_policy sp_policy;
/* Marks t as an ordered task with this sequence number (task->sched_data holds seq+1;
 * tasks left at NULL, such as StarPU-MPI's own, bypass the order). */
void sp_policy_set_seq(struct starpu_task *t, uint32_t seq);
/* Restart the order at seq 0. Fails if tasks of the previous step are still held. */
sp_status sp_policy_begin_step(void);
/* Where the order stands (for a report on a stalled step): the seq that may be popped
 * next, and whether a task with that seq is ready (held only for a worker to take it). */
void sp_policy_position(uint32_t *next, int *next_ready);
/* Stop holding tasks: hand the held ones out in seq order despite gaps. Used when the
 * submitted seqs of a step are not 0..n-1, so the step drains instead of hanging. */
void sp_policy_drain(void);
/* When the rank's workers drive its transfers (comm/direct.c): inflight() counts the
 * requests an idle worker must keep testing, so it polls (yielding between polls) instead
 * of parking while that is not 0; poke() wakes parked workers after a request is handed
 * to MPI. */
void sp_policy_set_idle_poll(int (*inflight)(void));
/* The workers of the rank's device (runtime/exec/device.c: its kind's workers), whose
 * tasks' inputs the policy prefetches to their memory node as the task becomes ready:
 * is_device[w] for each of StarPU's workers, read in place (the caller keeps it until it
 * passes NULL: none). */
void sp_policy_set_device_workers(const unsigned char *is_device);
void sp_policy_poke(void);

#endif
