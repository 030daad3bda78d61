/* Submission: a task checked, its seq claimed in the step's order, its arguments kept
 * for the step, its buffers' writer noted for their sends. Relies on state.c, trace.c,
 * codelet.c (the class's codelet) and device.c (whether StarPU has CUDA workers). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec/device.h"
#include "sched/policy.h"
#include "runtime/exec/exec_int.h"

enum starpu_data_access_mode sp_exec_starpu_mode(sp_access_mode m)
{
    switch (m) {
    case SP_ACCESS_R: return STARPU_R;
    case SP_ACCESS_W: return STARPU_W;
    case SP_ACCESS_RW: return STARPU_RW;
    case SP_ACCESS_SCRATCH: return STARPU_SCRATCH;
    }
    return STARPU_NONE;
}

static sp_status check_task(const sp_exec_task *t)
{
    const char *name = t->name ? t->name : "(unnamed)";
    if (!t->fn)
        return sp_set_error(SP_ERR_ARG, "task '%s': no function", name);
    if (t->where & ~(SP_EXEC_ON_CPU | SP_EXEC_ON_DEVICE))
        return sp_set_error(SP_ERR_ARG, "task '%s': where = %#x names no kind of worker", name,
                            t->where);
    if (t->where == SP_EXEC_ON_DEVICE && !sp_exec_dev_kind())
        return sp_set_error(SP_ERR_ARG, "task '%s': device only, but the rank has no device "
                            "(STARPIPE_DEVICE)", name);
    if (t->nbufs < 0 || (t->nbufs > 0 && (!t->bufs || !t->modes)))
        return sp_set_error(SP_ERR_ARG, "task '%s': bad buffer list (%d)", name, t->nbufs);
    if (t->args_size && !t->args)
        return sp_set_error(SP_ERR_ARG, "task '%s': args_size %zu but no args", name,
                            t->args_size);
    for (int i = 0; i < t->nbufs; i++) {
        if (!t->bufs[i] || sp_exec_starpu_mode(t->modes[i]) == STARPU_NONE)
            return sp_set_error(SP_ERR_ARG, "task '%s': buffer %d is NULL or has mode %d",
                                name, i, (int)t->modes[i]);
        for (int j = 0; j < i; j++)
            if (t->bufs[j] == t->bufs[i])
                return sp_set_error(SP_ERR_ARG, "task '%s': buffers %d and %d are the same",
                                    name, j, i);
    }
    return SP_OK;
}

/* Records seq as submitted in this step; refuses a duplicate. */
static sp_status claim_seq(uint32_t seq, const char *name)
{
    if (seq >= X.seen_cap) {
        size_t cap = X.seen_cap ? X.seen_cap : 1024;
        while (cap <= seq)
            cap *= 2;
        unsigned char *s = realloc(X.seen, cap);
        if (!s)
            return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
        memset(s + X.seen_cap, 0, cap - X.seen_cap);
        X.seen = s;
        X.seen_cap = cap;
    }
    if (X.seen[seq])
        return sp_set_error(SP_ERR_ARG, "task '%s': seq %u used twice in step %llu", name, seq,
                            (unsigned long long)sp_exec_step_);
    X.seen[seq] = 1;
    X.nsubmitted++;
    if (seq > X.max_seq || X.nsubmitted == 1)
        X.max_seq = seq;
    return SP_OK;
}

/* The end of a step whose tasks are all done: their arguments go. */
void sp_exec_free_args(void)
{
    for (size_t i = 0; i < X.nargs; i++)
        free(X.args[i]);
    X.nargs = 0;
}

/* Completion of a task: the end of its trace record if it ran on a CUDA worker, and the
 * main thread woken (a step ends with its last task or message). */
static void task_done(void *arg)
{
    struct task_args *a = arg;
    if (a->on_cuda && X.opts.trace)
        sp_exec_trace_add(a->name, a->seq, a->t0, starpu_timing_now(), 0, -1);
    sp_exec_progress();
}

/* StarPU refuses to destroy a never-submitted task still marked destroy-on-completion. */
static void discard_task(struct starpu_task *task)
{
    task->destroy = 0;
    starpu_task_destroy(task);
}

sp_status sp_exec_submit(const sp_exec_task *t)
{
    if (!X.started || !X.in_step)
        return sp_set_error(SP_ERR_ARG, "sp_exec_submit: not inside a step");
    if (!t)
        return sp_set_error(SP_ERR_ARG, "sp_exec_submit: NULL task");
    sp_status st = check_task(t);
    if (st)
        return st;

    /* the payload, then the task's handles and what it writes (for a stall report) */
    size_t hoff = (t->args_size + sizeof(void *) - 1) / sizeof(void *) * sizeof(void *);
    size_t tail = hoff + (size_t)t->nbufs * (sizeof(starpu_data_handle_t) + 1);
    struct task_args *a = malloc(sizeof *a + tail);
    struct starpu_task *task = starpu_task_create();
    if (!a || !task) {
        free(a);
        if (task)
            discard_task(task);
        return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
    }
    a->fn = t->fn;
    a->where = t->where ? t->where : SP_EXEC_ON_CPU | SP_EXEC_ON_CUDA;
    a->group = t->group;
    a->seq = t->seq;
    a->footprint = t->footprint;
    snprintf(a->name, sizeof a->name, "%s", t->name ? t->name : "task");
    if (t->args_size)
        memcpy(a->payload, t->args, t->args_size);

    task->cl = sp_exec_codelet_for(t->codelet);
    task->cl_arg = a;
    a->on_cuda = 0;
    a->unrun = 0;
    atomic_init(&a->state, TASK_QUEUED);
    a->started = 0;
    a->nbufs = t->nbufs;
    a->handles = (starpu_data_handle_t *)(void *)(a->payload + hoff);
    a->writes = (unsigned char *)(a->handles + t->nbufs);
    for (int i = 0; i < t->nbufs; i++) {
        a->handles[i] = t->bufs[i]->handle;
        a->writes[i] = t->modes[i] != SP_ACCESS_R;
    }
    a->order = X.posted++;
    atomic_init(&a->early, NULL);
    task->callback_func = task_done;
    task->callback_arg = a;
    task->cl_arg_size = sizeof *a + tail;
    task->cl_arg_free = 1;
    task->name = a->name;
    task->nbuffers = t->nbufs;
    if (t->nbufs > STARPU_NMAXBUFS) {
        /* StarPU frees these with the task. */
        task->dyn_handles = malloc((size_t)t->nbufs * sizeof *task->dyn_handles);
        task->dyn_modes = malloc((size_t)t->nbufs * sizeof *task->dyn_modes);
        if (!task->dyn_handles || !task->dyn_modes) {
            discard_task(task);
            return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
        }
    }
    for (int i = 0; i < t->nbufs; i++) {
        STARPU_TASK_SET_HANDLE(task, t->bufs[i]->handle, i);
        STARPU_TASK_SET_MODE(task, sp_exec_starpu_mode(t->modes[i]), i);
    }

    st = claim_seq(t->seq, a->name);
    if (st) {
        discard_task(task);
        return st;
    }
    sp_policy_set_seq(task, t->seq);
    /* Ours to free at the end of the step (sp_exec_send_early); StarPU's if the list is full. */
    int keep = X.nargs < X.args_cap || grow_array((void **)&X.args, &X.args_cap, sizeof *X.args);
    task->cl_arg_free = !keep;
    int rc = starpu_task_submit(task);
    if (rc < 0) {
        X.seen[t->seq] = 0;
        X.nsubmitted--;
        task->cl_arg_free = 1;
        discard_task(task);
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: starpu_task_submit of '%s' failed: %s",
                            __FILE__, __LINE__, t->name ? t->name : "task", strerror(-rc));
    }
    if (keep)
        X.args[X.nargs++] = a;
    /* the task's outputs' sends may be posted by it; not kept (out of memory), by none:
     * an earlier writer must not post data this task has yet to write */
    for (int i = 0; i < t->nbufs; i++)
        if (t->modes[i] == SP_ACCESS_W || t->modes[i] == SP_ACCESS_RW) {
            t->bufs[i]->writer = keep ? a : NULL;
            t->bufs[i]->writer_step = sp_exec_step_;
        }
    return SP_OK;
}
