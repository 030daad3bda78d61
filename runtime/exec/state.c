/* The bottom of the executor: its state X, the rank and size, the step's counters and a
 * task's failure (the first one wins; sp_exec_end_step agrees on it), completions waking
 * the main thread, and the executor given up. Relies on nothing of the folder but
 * device.h (the CUDA workers' count). */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "runtime/exec/device.h"
#include "runtime/exec/exec_int.h"

int sp_exec_rank_ = 0, sp_exec_size_ = 1;
uint64_t sp_exec_step_ = 0;

struct sp_exec_state sp_exec_state_;

/* ---- failure of a task: first one wins, later tasks of the step skip their work ---- */
atomic_int sp_exec_step_failed_;
atomic_ulong sp_exec_tasks_done_;
atomic_uint sp_exec_last_done_;
static starpu_pthread_mutex_t fail_lock = STARPU_PTHREAD_MUTEX_INITIALIZER;
char sp_exec_fail_msg_[512];

void sp_exec_fail_step(const char *fmt, ...)
{
    STARPU_PTHREAD_MUTEX_LOCK(&fail_lock);
    if (!atomic_load(&sp_exec_step_failed_)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sp_exec_fail_msg_, sizeof sp_exec_fail_msg_, fmt, ap);
        va_end(ap);
        atomic_store(&sp_exec_step_failed_, 1);
    }
    STARPU_PTHREAD_MUTEX_UNLOCK(&fail_lock);
}

/* ---- completions wake the main thread (sp_exec_wait_tasks) ----
 * Each task's completion callback and each message's end count here and wake the main
 * thread, so that a watched step ends when its last task or message does, not at the
 * main thread's next look. */
static pthread_once_t progress_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t progress_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t progress_cond;
static unsigned long progress_n; /* completions since init */

static void progress_init(void)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&progress_cond, &ca);
    pthread_condattr_destroy(&ca);
}

void sp_exec_progress(void)
{
    pthread_once(&progress_once, progress_init);
    pthread_mutex_lock(&progress_lock);
    progress_n++;
    pthread_cond_broadcast(&progress_cond);
    pthread_mutex_unlock(&progress_lock);
}

unsigned long sp_exec_progress_wait(unsigned long seen, double timeout)
{
    pthread_once(&progress_once, progress_init);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    long ns = until.tv_nsec + (long)(timeout * 1e9);
    until.tv_sec += ns / 1000000000L;
    until.tv_nsec = ns % 1000000000L;
    pthread_mutex_lock(&progress_lock);
    while (timeout > 0 && progress_n == seen &&
           pthread_cond_timedwait(&progress_cond, &progress_lock, &until) == 0) {}
    seen = progress_n;
    pthread_mutex_unlock(&progress_lock);
    return seen;
}

sp_status sp_exec_broken_error(const char *what)
{
    return sp_set_error(SP_ERR_RUNTIME, "%s: the executor gave up a step%s%s%s and cannot go "
                        "on; end the process (sp_exec_abort)", what,
                        X.broken_why[0] ? " (" : "", X.broken_why, X.broken_why[0] ? ")" : "");
}

sp_status sp_exec_give_up(sp_status st)
{
    X.broken = 1;
    snprintf(X.broken_why, sizeof X.broken_why, "%s", sp_last_error());
    return st;
}

int sp_exec_usable(void) { return X.started && !X.broken; }

int sp_exec_rank(void) { return sp_exec_rank_; }

int sp_exec_num_devices(void) { return X.started ? sp_exec_dev_nworkers() : 0; }

int sp_exec_num_cuda(void)
{
    const sp_device_kind *k = sp_exec_dev_kind();
    return k && k->type == SP_DEVICE_CUDA ? sp_exec_num_devices() : 0;
}

const sp_device_kind *sp_exec_device(void)
{
    return sp_exec_num_devices() > 0 ? sp_exec_dev_kind() : NULL;
}

int sp_exec_size(void) { return sp_exec_size_; }

/* ---- a deadline for the waits nothing else can leave ----
 * MPI's start-up and StarPU-MPI's drain (its progress thread's MPI_Barrier) wait for
 * every rank, and no call can recall them: a thread ends the rank with one line if the
 * wait is not over by then (the launcher then ends the others). No MPI call from it. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int armed, over;
    double seconds;
    void (*more)(char *, size_t);
    char line[768];
    pthread_t thread;
} deadline = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void *deadline_watch(void *arg)
{
    (void)arg;
    struct timespec end;
    clock_gettime(CLOCK_REALTIME, &end);
    double s = deadline.seconds;
    end.tv_sec += (time_t)s;
    end.tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
    if (end.tv_nsec >= 1000000000L) end.tv_sec++, end.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&deadline.lock);
    int rc = 0;
    while (!deadline.over && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&deadline.cond, &deadline.lock, &end);
    int late = !deadline.over;
    pthread_mutex_unlock(&deadline.lock);
    if (!late) return NULL;
    if (deadline.more) {
        size_t n = strlen(deadline.line);
        deadline.more(deadline.line + n, sizeof deadline.line - n);
    }
    fprintf(stderr, "%s\n", deadline.line);
    fflush(stderr);
    _exit(1);
}

void sp_exec_deadline_arm(double seconds, void (*more)(char *, size_t), const char *fmt, ...)
{
    if (seconds <= 0 || deadline.armed) return;
    deadline.more = more;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(deadline.line, sizeof deadline.line, fmt, ap);
    va_end(ap);
    deadline.seconds = seconds;
    deadline.over = 0;
    deadline.armed = pthread_create(&deadline.thread, NULL, deadline_watch, NULL) == 0;
}

void sp_exec_deadline_disarm(void)
{
    if (!deadline.armed) return;
    pthread_mutex_lock(&deadline.lock);
    deadline.over = 1;
    pthread_cond_signal(&deadline.cond);
    pthread_mutex_unlock(&deadline.lock);
    pthread_join(deadline.thread, NULL);
    deadline.armed = 0;
}
