/* Groups of ranks: the group transport's message groups (NCCL) submitted as tasks, and
 * the tensor-parallel groups (runtime/group.c) made on the executor's communicator.
 * Relies on state.c, tasks.c (a group is a task), collectives.c, watchdog.c (the
 * collective a tensor group runs by) and device.c (the rank's GPU). */
#include <stdlib.h>

#include "runtime/exec/device.h"
#include "runtime/group.h"
#include "runtime/exec/exec_int.h"

/* ---- groups (the group transport: NCCL) ---- */

sp_status sp_exec_groups_init(char *notice, size_t len)
{
    sp_status st = sp_exec_between_steps("sp_exec_groups_init");
    if (st)
        return st;
    sp_transport_config c = { .world = X.comm, .ncuda = sp_exec_num_cuda(), .host = X.host->name };
    int active = 0;
    if ((st = sp_transport_nccl.init(&c, &active, notice, len)))
        return st;
    X.group = active ? &sp_transport_nccl : NULL;
    return SP_OK;
}

int sp_exec_groups_active(void) { return X.started && X.group != NULL; }

size_t sp_exec_group_threshold(void) { return X.group_threshold; }

sp_status sp_exec_groups_connect(const int *peers, int n)
{
    sp_status st = sp_exec_between_steps("sp_exec_groups_connect");
    if (st)
        return st;
    return X.group && X.group->connect ? X.group->connect(peers, n) : SP_OK;
}

sp_status sp_exec_group(const sp_exec_xfer *x, int n, const char *name, uint32_t seq)
{
    if (!X.started || !X.in_step)
        return sp_set_error(SP_ERR_ARG, "sp_exec_group: not inside a step");
    if (!X.group)
        return sp_set_error(SP_ERR_ARG, "sp_exec_group: no group transport (sp_exec_groups_init)");
    if (!x || n <= 0)
        return sp_set_error(SP_ERR_ARG, "sp_exec_group: no messages");
    sp_xfer *m = malloc((size_t)n * sizeof *m);
    if (!m)
        return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
    sp_status st = SP_OK;
    for (int k = 0; k < n && st == SP_OK; k++) {
        if (!x[k].buf || x[k].peer < 0 || x[k].peer >= sp_exec_size_ || x[k].peer == sp_exec_rank_)
            st = sp_set_error(SP_ERR_ARG, "sp_exec_group '%s': message %d has no buffer or "
                              "a bad peer (%d)", name ? name : "", k, x[k].peer);
        else
            m[k] = (sp_xfer){ x[k].buf->handle, x[k].buf->count, x[k].buf->elemsize, x[k].peer,
                              x[k].is_send, 0 };
    }
    sp_xfer_group g = { 0 };
    if (st == SP_OK)
        st = X.group->group(m, n, &g);
    if (st == SP_OK) {
        sp_exec_buf **bufs = malloc((size_t)g.nbufs * sizeof *bufs);
        if (!bufs)
            st = sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
        for (int j = 0; bufs && j < g.nbufs; j++)
            bufs[j] = x[g.xfer[j]].buf;
        if (st == SP_OK)
            st = sp_exec_submit(&(sp_exec_task){ .name = name, .fn = g.fn,
                                                 .where = SP_EXEC_ON_CUDA, .nbufs = g.nbufs,
                                                 .bufs = bufs, .modes = g.mode, .args = g.args,
                                                 .args_size = g.args_size, .seq = seq,
                                                 .codelet = X.group->name });
        free(bufs);
    }
    free(g.args), free(g.xfer), free(g.mode);
    free(m);
    return st;
}

/* ---- tensor-parallel groups (runtime/group.c) ---- */

sp_status sp_exec_tensor_group_create(int color, int key, int size, int64_t max_floats,
                                      sp_exec_tensor_group **out)
{
    *out = NULL;
    if (!sp_exec_usable())
        return sp_set_error(SP_ERR_ARG, "sp_exec_tensor_group_create: the executor is not usable");
    MPI_Comm c;
    SP_MPI_CHECK(MPI_Comm_split(X.comm, color, key, &c));
    int devid = -1;
    if (sp_exec_dev_node(&devid) < 0) devid = -1; /* a CPU rank: MPI between its members */
    return sp_exec_tensor_group_wrap(c, size, devid, max_floats, sp_exec_collective,
                                     out); /* group.c */
}
