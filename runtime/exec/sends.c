/* Sends posted by their producer: the wrapper (codelet.c) posts the sends of a task's
 * outputs as its function returns. Relies on state.c (the host transport). */
#include <stdlib.h>

#include "runtime/exec/exec_int.h"

/* ---- sends posted by their producer ----
 * StarPU grants a send's buffer (the transport's acquire callback) only once it has
 * ended the producing task: 50-150 us after the task's function returned on the 2-core
 * VM, and more when the worker's caches are cold after a long task. The data is final
 * when the function returns, so the wrapper posts the sends of the task's outputs then
 * and there; StarPU's grant only keeps the buffer from its next writer until MPI is done.
 * A send submitted after its producer reaches the producer's arguments through the
 * buffer (writer); whichever comes second of the send's attach and the wrapper's close
 * decides: attached in time, the wrapper posts it; too late, the grant does. */
struct early_send {
    sp_xfer_req *r;
    starpu_data_handle_t h;
    struct early_send *next;
};
#define EARLY_CLOSED ((struct early_send *)1)

void sp_exec_attach_early(struct task_args *a, sp_xfer_req *r, starpu_data_handle_t h)
{
    struct early_send *e = malloc(sizeof *e);
    if (!e)
        return; /* posted when StarPU grants the buffer, as without */
    e->r = r;
    e->h = h;
    struct early_send *old = atomic_load(&a->early);
    do {
        if (old == EARLY_CLOSED) {
            free(e);
            return;
        }
        e->next = old;
    } while (!atomic_compare_exchange_weak(&a->early, &old, e));
}

/* Closes a's list; posts its sends from the task's buffers when ptrs hold the data in
 * host memory (a CPU task that ran), else leaves them to StarPU's grant. */
void sp_exec_send_early(struct starpu_task *task, struct task_args *a, void *const *ptrs,
                               int n)
{
    struct early_send *e = atomic_exchange(&a->early, EARLY_CLOSED);
    while (e) {
        struct early_send *next = e->next;
        for (int i = 0; ptrs && i < n; i++)
            if (STARPU_TASK_GET_HANDLE(task, i) == e->h &&
                (STARPU_TASK_GET_MODE(task, i) & STARPU_W)) {
                X.host->send_from(e->r, ptrs[i]);
                break;
            }
        free(e);
        e = next;
    }
}
