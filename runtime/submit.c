/* How the trainer's walks (train.c: the pipeline, the update, evaluation; replicas.c: the
 * replicas' reductions) reach the executor: each task or group takes the next place of
 * this rank's order, recorded for the trace, and runs on the rank's device; a send or a
 * receive goes through the host transport. In a dry walk (planning the pool) nothing is
 * submitted. */
#include <stdlib.h>
#include <string.h>

#include "codelets/tasks.h"
#include "runtime/trainer_impl.h"

/* The next place of this rank's order, for id; -1 when out of memory. */
static int64_t next_seq(sp_trainer *t, task_id id)
{
    if (t->seq == t->seq_cap) {
        size_t cap = t->seq_cap ? 2 * t->seq_cap : 256;
        task_id *q = realloc(t->seq_task, cap * sizeof *q);
        if (!q) return -1;
        t->seq_task = q;
        t->seq_cap = cap;
    }
    t->seq_task[t->seq] = id;
    return t->seq++;
}

sp_status sp_tr_submit(sp_trainer *t, const char *name, sp_task_fn fn, int nbufs,
                       sp_exec_buf *const *bufs, const sp_access_mode *modes, const void *args,
                       size_t args_size, task_id id)
{
    if (t->pool.dry) return SP_OK; /* planning the pool: nothing runs */
    /* the StarPU codelet of the task: a stage program's kind, else the helper's name */
    const char *cls = id.kind >= 0 ? sp_task_kind_name((sp_task_kind)id.kind)
                    : !strncmp(name, "AdamW tied", 10) ? "AdamW tied" /* a size of its own */
                    : !strncmp(name, "AdamW", 5) ? "AdamW"
                    : !strncmp(name, "reduce", 6) ? "reduce"
                    : fn == sp_copy_task ? "copy" : fn == sp_gather_task ? "gather" : name;
    int64_t seq = next_seq(t, id);
    if (seq < 0) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    /* on a rank with a GPU every task runs there (the data stays on it) */
    unsigned where = sp_exec_num_devices() > 0 ? SP_EXEC_ON_DEVICE : SP_EXEC_ON_CPU;
    uint32_t key = id.kind >= 0 ? t->footprint[id.stage * SP_NUM_TASK_KINDS + id.kind] : 0;
    sp_exec_task task = { .name = name, .fn = fn, .where = where, .nbufs = nbufs, .bufs = bufs,
                          .modes = modes, .args = args, .args_size = args_size, .codelet = cls,
                          .footprint = key, .seq = (uint32_t)seq,
                          /* stage programs of T > 1 and scatter-gather's gathers meet
                           * their group inside the task */
                          .group = id.kind >= 0 || fn == sp_gather_task ? t->tgroup : NULL };
    return sp_exec_submit(&task);
}

sp_status sp_tr_submit_copy(sp_trainer *t, sp_exec_buf *dst, int64_t dst_off, sp_exec_buf *src,
                            int64_t src_off, int64_t n, const char *name, task_id id)
{
    if (t->pool.dry) return SP_OK; /* dst may be a token */
    sp_exec_buf *bufs[2] = { dst, src };
    sp_access_mode modes[2] = { dst_off == 0 && (size_t)n == sp_exec_buf_count(dst)
                                    ? SP_ACCESS_W : SP_ACCESS_RW,
                                SP_ACCESS_R };
    sp_copy_task_args a = { .dst_off = dst_off, .src_off = src_off, .n = n };
    return sp_tr_submit(t, name, sp_copy_task, 2, bufs, modes, &a, sizeof a, id);
}

sp_status sp_tr_submit_group(sp_trainer *t, const char *name, const sp_exec_xfer *x, int n,
                             task_id id)
{
    if (t->pool.dry) return SP_OK; /* planning the pool: nothing moves */
    int64_t seq = next_seq(t, id);
    if (seq < 0) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    return sp_exec_group(x, n, name, (uint32_t)seq);
}

sp_status sp_tr_send(sp_trainer *t, sp_exec_buf *x, int peer, uint32_t msg)
{
    return t->pool.dry ? SP_OK : sp_exec_send(x, peer, msg);
}

sp_status sp_tr_recv(sp_trainer *t, sp_exec_buf *x, int peer, uint32_t msg)
{
    return t->pool.dry ? SP_OK : sp_exec_recv(x, peer, msg);
}
