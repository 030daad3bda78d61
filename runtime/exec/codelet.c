/* The generic codelet: one wrapper runs every task whatever its worker (the task's
 * function takes the worker's device), one StarPU codelet and performance model per task
 * class. Relies on state.c (failure, counters), trace.c, sends.c (the outputs' sends) and
 * device.c (the worker's device, the CUDA implementation). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec/device.h"
#include "runtime/group.h"
#include "runtime/exec/exec_int.h"

/* Up to this many buffers the wrapper keeps its pointer arrays on the stack. */
#define SP_STACK_BUFS 32

static void run_task(void *descr[], struct task_args *a)
{
    struct starpu_task *task = starpu_task_get_current();
    /* the step is lost already: drain quickly, keep transfers flowing; a task of a group
     * still meets its group's all-reduces (its peers would wait for it forever) */
    const int lost = atomic_load(&sp_exec_step_failed_);
    if (lost && !a->group) {
        sp_exec_send_early(task, a, NULL, 0); /* left to StarPU's grant */
        a->unrun = 1;
        atomic_store(&a->state, TASK_DONE);
        return;
    }
    a->started = seconds_now();
    atomic_store(&a->state, TASK_RUNNING);
    int n = (int)STARPU_TASK_GET_NBUFFERS(task);
    void *ptr_stack[SP_STACK_BUFS], **ptrs = ptr_stack;
    size_t count_stack[SP_STACK_BUFS], *counts = count_stack;
    if (n > SP_STACK_BUFS) {
        ptrs = malloc((size_t)n * sizeof *ptrs);
        counts = malloc((size_t)n * sizeof *counts);
        if (!ptrs || !counts) {
            free(ptrs);
            free(counts);
            sp_exec_fail_step("task '%s' (seq %u): out of memory for %d buffers", a->name,
                              a->seq, n);
            a->unrun = 1;
            sp_exec_send_early(task, a, NULL, 0);
            atomic_store(&a->state, TASK_DONE);
            return;
        }
    }
    for (int i = 0; i < n; i++) {
        ptrs[i] = (void *)STARPU_VECTOR_GET_PTR(descr[i]);
        counts[i] = STARPU_VECTOR_GET_NX(descr[i]);
    }
    double t0 = X.opts.trace ? starpu_timing_now() : 0;
    _Alignas(max_align_t) unsigned char state[SP_DEVICE_CTX_BYTES];
    int async;
    sp_device dev = sp_exec_dev_of_worker(state, &async);
    sp_exec_task_group tg;
    dev.group = a->group ? sp_exec_tensor_group_of_task(a->group, a->seq, &dev, &tg) : NULL;
    dev.meet_only = lost;
    int rc = a->fn(&dev, ptrs, counts, n, a->payload);
    if (lost) rc = 0, a->unrun = 1; /* met its group; the step's failure is reported */
    /* A device's function may only enqueue its kernels (an async kind: STARPU_CUDA_ASYNC):
     * its end is when StarPU sees the stream done and calls the task's callback
     * (cuda_task_done). */
    if (async) {
        a->on_cuda = 1;
        a->t0 = t0;
        sp_exec_send_early(task, a, NULL, 0); /* the data is on the device */
    } else {
        if (X.opts.trace)
            sp_exec_trace_add(a->name, a->seq, t0, starpu_timing_now(), 0, -1);
        sp_exec_send_early(task, a, ptrs, n);
    }
    if (rc) {
        a->unrun = 1;
        sp_exec_fail_step("rank %d: task '%s' (seq %u) failed with code %d", sp_exec_rank_,
                          a->name, a->seq, rc);
    }
    atomic_store(&a->state, TASK_DONE);
    atomic_store(&sp_exec_last_done_, a->seq + 1);
    atomic_fetch_add(&sp_exec_tasks_done_, 1);
    if (ptrs != ptr_stack) {
        free(ptrs);
        free(counts);
    }
}

/* The codelets' implementations: one wrapper, whatever the worker (the task's function
 * takes the worker's device). Named, so that StarPU's tools find them by name
 * (cpu_funcs_name, cuda_funcs_name). */
void sp_exec_run_cpu(void *descr[], void *cl_arg);
void sp_exec_run_cpu(void *descr[], void *cl_arg) { run_task(descr, cl_arg); }
void sp_exec_run_cuda(void *descr[], void *cl_arg);
void sp_exec_run_cuda(void *descr[], void *cl_arg) { run_task(descr, cl_arg); }

/* Per task, not per codelet: one codelet serves tasks held to one kind of worker and
 * tasks that may run on any. */
static int can_execute(unsigned worker, struct starpu_task *task, unsigned nimpl)
{
    const struct task_args *a = task->cl_arg;
    if (sp_exec_dev_is_worker(worker)) return (a->where & SP_EXEC_ON_DEVICE) != 0;
    return starpu_worker_get_type((int)worker) == STARPU_CPU_WORKER &&
           (a->where & SP_EXEC_ON_CPU) != 0;
}

/* One codelet per task class (sp_exec_task.codelet: "F", "B", "W", "BW", "AdamW", ...),
 * all with the same generic wrapper, so StarPU's own tools (statistics, FxT traces)
 * count and time the classes apart. Created on first use, at most SP_MAX_CODELETS. */
#define SP_MAX_CODELETS 16
static struct starpu_codelet codelets[SP_MAX_CODELETS];
static char codelet_names[SP_MAX_CODELETS][16];
static int ncodelets;
/* A history-based performance model per class and rank, named "starpipe_<class>_r<rank>"
 * (what starpu_perfmodel_display -s takes), its entries keyed by the task's footprint:
 * the trainer's stage, so a run leaves each stage's measured F, B, W, BW times behind. */
static struct starpu_perfmodel models[SP_MAX_CODELETS];
static char model_symbols[SP_MAX_CODELETS][32];

/* StarPU asks for the key when it records the task's time, after the task ran (our policy
 * never asks for predictions). A task that failed or was drained after a failure took
 * microseconds: under the stage's key the next run would deviate by orders of magnitude,
 * and StarPU would flush the history and say so on stderr. Such tasks get a key of their
 * own. */
#define SP_FOOTPRINT_UNRUN 0x0badf00du
static uint32_t task_footprint(struct starpu_task *task)
{
    const struct task_args *a = task->cl_arg;
    if (a->unrun)
        return SP_FOOTPRINT_UNRUN;
    return a->footprint ? a->footprint : starpu_task_data_footprint(task);
}

struct starpu_codelet *sp_exec_codelet_for(const char *cls)
{
    if (!cls || !cls[0])
        cls = "starpipe";
    for (int i = 0; i < ncodelets; i++)
        if (!strcmp(codelet_names[i], cls))
            return &codelets[i];
    int i = ncodelets < SP_MAX_CODELETS ? ncodelets++ : SP_MAX_CODELETS - 1; /* last: shared */
    if (codelets[i].name)
        return &codelets[i];
    snprintf(codelet_names[i], sizeof codelet_names[i], "%s", cls);
    /* one file per rank: ranks of one host would overwrite each other's */
    snprintf(model_symbols[i], sizeof model_symbols[i], "starpipe_%s_r%d", cls, sp_exec_rank_);
    for (char *c = model_symbols[i]; *c; c++) /* a file name: "local add" -> "local_add" */
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
            *c = '_';
    models[i] = (struct starpu_perfmodel){ .type = STARPU_HISTORY_BASED,
                                           .symbol = model_symbols[i],
                                           .footprint = task_footprint };
    codelets[i] = (struct starpu_codelet){
        .model = &models[i],
        .can_execute = can_execute,
        .cpu_funcs = {sp_exec_run_cpu},
        .cpu_funcs_name = {"sp_exec_run_cpu"},
        .nbuffers = STARPU_VARIABLE_NBUFFERS,
        .name = codelet_names[i],
    };
    sp_exec_dev_codelet(&codelets[i], sp_exec_run_cuda); /* a device's own worker type */
    return &codelets[i];
}
