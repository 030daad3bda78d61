/* The "starpipe" StarPU scheduling policy: hands an actor's tasks to its workers strictly
 * in plan order. A ready task is held until every task with a smaller sequence number
 * of the step has been popped; tasks without a sequence number (StarPU-MPI's or any
 * library's own) go through a FIFO that is always served first, so they never wait. */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <starpu_scheduler.h>

#include "sched/policy.h"

/* How long an idle CPU worker waits inside pop before going back to its driver loop.
 * Pushes wake it at once; the timeout only bounds what nobody signals (shutdown). */
#define SP_IDLE_WAIT_NS 5000000L

struct sp_policy_data {
    pthread_mutex_t lock;
    pthread_cond_t more;            /* broadcast when a task becomes poppable */
    int nidle;                      /* workers waiting on `more` */
    struct starpu_task_list bypass; /* unordered tasks, FIFO */
    /* Ready ordered tasks sorted by seq, threaded through the tasks' own prev/next
     * links: no allocation on the push path, and since tasks mostly become ready in
     * about plan order, inserting from the tail is O(1) in the common case. */
    struct starpu_task_list ready;
    uint32_t next;                  /* the only seq that may be popped now */
    int drain;                      /* 1: hand out held tasks in seq order despite gaps */
};

static inline uint32_t task_seq(const struct starpu_task *t)
{
    return (uint32_t)((uintptr_t)t->sched_data - 1);
}

static inline int is_ordered(const struct starpu_task *t) { return t->sched_data != NULL; }

void sp_policy_set_seq(struct starpu_task *t, uint32_t seq)
{
    t->sched_data = (void *)((uintptr_t)seq + 1);
}

static struct sp_policy_data *policy_data(unsigned ctx)
{
    return starpu_sched_ctx_get_policy_data(ctx);
}

/* The context StarPU created us for at start-up (its id is internal to StarPU): the
 * step hooks below are called from outside any scheduling method. */
static unsigned main_ctx;

static void init_sched(unsigned ctx)
{
    struct sp_policy_data *d = calloc(1, sizeof *d);
    STARPU_ASSERT_MSG(d, "starpipe policy: out of memory"); /* init_sched cannot fail */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    STARPU_ASSERT(pthread_mutex_init(&d->lock, NULL) == 0 && pthread_cond_init(&d->more, &ca) == 0);
    pthread_condattr_destroy(&ca);
    starpu_task_list_init(&d->bypass);
    starpu_task_list_init(&d->ready);
    starpu_sched_ctx_set_policy_data(ctx, d);
    main_ctx = ctx;
    /* the starter's hook (starpu_conf.sched_policy_init): runtime/exec/buslock.c releases its
     * lock on StarPU's bus files here, as StarPU has loaded them by now */
#if STARPU_MAJOR_VERSION > 1 || STARPU_MINOR_VERSION >= 4
    void (*hook)(unsigned) = starpu_sched_ctx_get_sched_policy_callback(ctx);
#else
    void (*hook)(unsigned) = starpu_sched_ctx_get_sched_policy_init(ctx);
#endif
    if (hook)
        hook(ctx);
}

static void deinit_sched(unsigned ctx)
{
    struct sp_policy_data *d = policy_data(ctx);
    pthread_cond_destroy(&d->more);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static void add_workers(unsigned ctx, int *ids, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        starpu_sched_ctx_worker_shares_tasks_lists(ids[i], ctx);
}

/* The task a worker may take now, or NULL. Called with d->lock held. */
static struct starpu_task *head_poppable(struct sp_policy_data *d)
{
    if (!starpu_task_list_empty(&d->bypass))
        return starpu_task_list_front(&d->bypass);
    if (starpu_task_list_empty(&d->ready))
        return NULL;
    struct starpu_task *h = starpu_task_list_front(&d->ready);
    return (task_seq(h) == d->next || d->drain) ? h : NULL;
}

/* Marks the workers (but the caller) that can run t. Called under d->lock, because once
 * the lock is dropped t may be popped, run and freed by another worker. */
static int pick_wakees(unsigned ctx, struct starpu_task *t, char *mask)
{
    int self = starpu_worker_get_id(), any = 0;
    memset(mask, 0, starpu_worker_get_count());
    struct starpu_worker_collection *workers = starpu_sched_ctx_get_worker_collection(ctx);
    struct starpu_sched_ctx_iterator it;
    workers->init_iterator(workers, &it);
    while (workers->has_next(workers, &it)) {
        int w = workers->get_next(workers, &it);
        mask[w] = w != self && starpu_worker_can_execute_task_first_impl(w, t, NULL);
        any |= mask[w];
    }
    return any;
}

/* Wakes the marked workers. Must run without d->lock: waking takes the worker's
 * scheduling mutex, which that worker holds while it pops (and pop takes d->lock).
 * StarPU's "relax" protocol makes this safe from inside pop. A worker woken for
 * nothing just pops NULL again; one not woken cannot miss a task, since a worker
 * holds its own scheduling mutex from its empty pop until it sleeps. */
static void wake(const char *mask)
{
    unsigned n = starpu_worker_get_count();
    for (unsigned w = 0; w < n; w++)
        if (mask[w])
            starpu_wake_worker_relax_light(w);
}

/* A device task's inputs start moving to the device as it becomes ready, not when its
 * turn comes: a task held behind an earlier one (or popped at once) then finds them
 * there, and the copies overlap the task that runs meanwhile. Asked before the task is
 * in a list, so no worker can pop it yet, and without d->lock (the prefetch takes the
 * data's locks, under which StarPU may push). CPU workers read host memory in place:
 * nothing to prefetch for them. STARPU_PREFETCH=0 turns it off, as for StarPU's own
 * policies (tests/gpu/check.sh measures a step both ways). */
static const unsigned char *device_workers; /* the runtime's table; NULL: none */

void sp_policy_set_device_workers(const unsigned char *is_device)
{
    device_workers = NULL;
    for (unsigned w = 0; is_device && w < STARPU_NMAXWORKERS && !device_workers; w++)
        if (is_device[w]) device_workers = is_device;
}

static void prefetch_for_device(unsigned ctx, struct starpu_task *task)
{
    struct starpu_worker_collection *workers = starpu_sched_ctx_get_worker_collection(ctx);
    struct starpu_sched_ctx_iterator it;
    workers->init_iterator(workers, &it);
    while (workers->has_next(workers, &it)) {
        int w = workers->get_next(workers, &it);
        if (device_workers[w] && starpu_worker_can_execute_task_first_impl(w, task, NULL)) {
            starpu_prefetch_task_input_for(task, (unsigned)w);
            return;
        }
    }
}

static int push_task(struct starpu_task *task)
{
    unsigned ctx = task->sched_ctx;
    struct sp_policy_data *d = policy_data(ctx);

    if (is_ordered(task) && device_workers && starpu_get_prefetch_flag())
        prefetch_for_device(ctx, task);
    starpu_worker_relax_on();
    pthread_mutex_lock(&d->lock);
    starpu_worker_relax_off();
    if (!is_ordered(task)) {
        starpu_task_list_push_back(&d->bypass, task);
    } else {
        uint32_t s = task_seq(task);
        struct starpu_task *pos = starpu_task_list_back(&d->ready);
        while (pos && task_seq(pos) > s)
            pos = pos->prev;
        if (!pos) {
            starpu_task_list_push_front(&d->ready, task);
        } else { /* insert after pos */
            task->prev = pos;
            task->next = pos->next;
            if (pos->next)
                pos->next->prev = task;
            else
                d->ready.tail = task;
            pos->next = task;
        }
    }
    /* The task is reachable by workers from here on; StarPU wants this before unlock. */
    starpu_push_task_end(task);
    /* Only a push that makes a task poppable needs a wake-up; a held task is woken for
     * by the pop that releases it. */
    char mask[STARPU_NMAXWORKERS];
    struct starpu_task *h = head_poppable(d);
    int any = h && pick_wakees(ctx, h, mask);
    if (h && d->nidle)
        pthread_cond_broadcast(&d->more);
    pthread_mutex_unlock(&d->lock);
    if (any)
        wake(mask);
    return 0;
}

/* Takes the poppable task if this worker can run it. Called with d->lock held. */
static struct starpu_task *take(struct sp_policy_data *d, int self)
{
    struct starpu_task *t = head_poppable(d);
    if (!t || !starpu_worker_can_execute_task_first_impl(self, t, NULL))
        return NULL; /* another kind of worker must take it; order forbids skipping it */
    if (is_ordered(t)) {
        starpu_task_list_erase(&d->ready, t);
        if (task_seq(t) + 1 > d->next)
            d->next = task_seq(t) + 1;
    } else {
        starpu_task_list_erase(&d->bypass, t);
    }
    return t;
}

/* Debian's StarPU is built with non-blocking drivers: an idle worker never sleeps, its
 * driver calls pop in a loop with sched_yield. Next to other ranks' workers and the
 * StarPU-MPI progress thread on few cores, that spin takes their time (measured in
 * docs/runtime.md). So an idle CPU worker waits here, relaxed (wakers may take its
 * scheduling mutex meanwhile), until a push makes a task poppable. CUDA workers keep
 * polling: their driver loop also completes asynchronous copies and kernels. */
static int may_wait(int self)
{
#ifdef STARPU_NON_BLOCKING_DRIVERS
    return starpu_worker_get_type(self) == STARPU_CPU_WORKER;
#else
    (void)self;
    return 0;
#endif
}

/* Set by the executor when its workers drive the transfers (comm/direct.c): the number of
 * MPI requests in flight. While it is not 0 an idle worker must keep turning its driver
 * loop, which tests them, instead of parking. It yields the core between turns: the
 * rank's main thread (submitting the step) or another rank's threads may want it, and
 * with nothing else runnable the yield returns at once. */
static int (*idle_poll)(void);

void sp_policy_set_idle_poll(int (*inflight)(void)) { idle_poll = inflight; }

void sp_policy_poke(void)
{
    struct sp_policy_data *d = policy_data(main_ctx);
    pthread_mutex_lock(&d->lock);
    if (d->nidle)
        pthread_cond_broadcast(&d->more);
    pthread_mutex_unlock(&d->lock);
}

static struct starpu_task *pop_task(unsigned ctx)
{
    struct sp_policy_data *d = policy_data(ctx);
    int self = starpu_worker_get_id_check();

    starpu_worker_relax_on();
    pthread_mutex_lock(&d->lock);
    struct starpu_task *t = take(d, self);
    /* checked under d->lock: a request posted after this sees nidle and pokes */
    int polling = !t && idle_poll && idle_poll() > 0;
    if (!t && !polling && may_wait(self)) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += SP_IDLE_WAIT_NS;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        d->nidle++;
        pthread_cond_timedwait(&d->more, &d->lock, &until);
        d->nidle--;
        t = take(d, self);
    }
    /* Taking seq k may have released k+1, already waiting: let another worker have it
     * while this one runs k. */
    char mask[STARPU_NMAXWORKERS];
    struct starpu_task *more = t ? head_poppable(d) : NULL;
    int any = more && pick_wakees(ctx, more, mask);
    if (more && d->nidle)
        pthread_cond_broadcast(&d->more);
    pthread_mutex_unlock(&d->lock);
    starpu_worker_relax_off();
    if (any)
        wake(mask);
    if (polling)
        sched_yield();
    return t;
}

/* After a task its outputs are released, and a send waiting for them has become a ready
 * request of StarPU-MPI's progress thread. Where that thread shares the worker's core it
 * polls with sched_yield (docs/runtime.md) and is not woken: the worker would keep the
 * core for the rest of its time slice (up to 4 ms) with the send not even posted, while
 * the peer waits for it. One yield here lets the thread post it now; with nothing else
 * runnable on the core it returns at once. */
static void post_exec_hook(struct starpu_task *task, unsigned ctx)
{
    (void)task, (void)ctx;
    if (!idle_poll) /* direct transfers: the worker posted the send itself */
        sched_yield();
}

sp_status sp_policy_begin_step(void)
{
    struct sp_policy_data *d = policy_data(main_ctx);
    pthread_mutex_lock(&d->lock);
    int held = !starpu_task_list_empty(&d->ready);
    uint32_t first = held ? task_seq(starpu_task_list_front(&d->ready)) : 0;
    if (!held) {
        d->next = 0;
        d->drain = 0;
    }
    pthread_mutex_unlock(&d->lock);
    if (held)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: a new step began while task seq %u of "
                            "the previous step is still held", __FILE__, __LINE__, first);
    return SP_OK;
}

void sp_policy_position(uint32_t *next, int *next_ready)
{
    struct sp_policy_data *d = policy_data(main_ctx);
    pthread_mutex_lock(&d->lock);
    *next = d->next;
    *next_ready = 0;
    for (struct starpu_task *t = starpu_task_list_begin(&d->ready);
         t != starpu_task_list_end(&d->ready); t = starpu_task_list_next(t))
        if (task_seq(t) == d->next) {
            *next_ready = 1;
            break;
        }
    pthread_mutex_unlock(&d->lock);
}

void sp_policy_drain(void)
{
    struct sp_policy_data *d = policy_data(main_ctx);
    pthread_mutex_lock(&d->lock);
    d->drain = 1;
    char mask[STARPU_NMAXWORKERS];
    struct starpu_task *t = head_poppable(d);
    int any = t && pick_wakees(main_ctx, t, mask);
    pthread_cond_broadcast(&d->more);
    pthread_mutex_unlock(&d->lock);
    if (any)
        wake(mask);
}

struct starpu_sched_policy sp_policy = {
    .init_sched = init_sched,
    .deinit_sched = deinit_sched,
    .add_workers = add_workers,
    .push_task = push_task,
    .pop_task = pop_task,
    .post_exec_hook = post_exec_hook,
    .policy_name = "starpipe",
    .policy_description = "starpipe: pops each actor's tasks in plan (sequence) order",
    .worker_type = STARPU_WORKER_LIST,
};
