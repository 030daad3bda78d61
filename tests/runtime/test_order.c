/* The ordered policy on one rank: shuffled submission, tasks held behind a blocked one,
 * more buffers than STARPU_NMAXBUFS, a failing task, duplicate and missing seqs; and the
 * codelets as StarPU's tools see them (names that resolve to their functions). */
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

#include <starpu.h>

#include "rt_check.h"

#define NT 300

static atomic_int ran_n;
static uint32_t ran[NT];

struct order_args { uint32_t seq; };

static int record(const sp_device *dev, void *const *bufs,
                  const size_t *counts, int nbufs, const void *args)
{
    const struct order_args *a = args;
    int i = atomic_fetch_add(&ran_n, 1);
    if (i < NT)
        ran[i] = a->seq;
    if (nbufs == 1) /* the tasks that read the gate buffer check what the host wrote */
        return ((const float *)bufs[0])[0] == 42.0f ? 0 : 5;
    return 0;
}

static void check_ran_in_order(int n, const char *what)
{
    RT_CHECK(atomic_load(&ran_n) == n, "%s: %d tasks ran, expected %d", what,
             atomic_load(&ran_n), n);
    for (int i = 0; i < n; i++)
        RT_CHECK(ran[i] == (uint32_t)i, "%s: position %d ran seq %u", what, i, ran[i]);
    const sp_exec_record *rec;
    size_t nrec;
    RT_OK(sp_exec_trace(&rec, &nrec));
    RT_CHECK(nrec == (size_t)n, "%s: %zu trace records, expected %d", what, nrec, n);
    for (int i = 0; i < n; i++) {
        RT_CHECK(rec[i].seq == (uint32_t)i, "%s: trace %d has seq %u", what, i, rec[i].seq);
        RT_CHECK(rec[i].end_us >= rec[i].start_us && rec[i].start_us >= 0,
                 "%s: trace %d times %.1f..%.1f", what, i, rec[i].start_us, rec[i].end_us);
    }
}

static void submit_record(uint32_t seq, int nbufs, sp_exec_buf *const *bufs,
                          const sp_access_mode *modes)
{
    char name[32];
    snprintf(name, sizeof name, "t%u", seq);
    struct order_args a = {seq};
    RT_OK(sp_exec_submit(&(sp_exec_task){.name = name, .fn = record, .nbufs = nbufs,
                                         .bufs = bufs, .modes = modes, .args = &a,
                                         .args_size = sizeof a, .seq = seq}));
}

/* 1. independent tasks submitted in a shuffled order run in seq order. */
static void shuffled(void)
{
    uint32_t perm[NT];
    for (int i = 0; i < NT; i++)
        perm[i] = (uint32_t)i;
    srand(7);
    for (int i = NT - 1; i > 0; i--) {
        int j = rand() % (i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int step = 0; step < 3; step++) { /* seqs restart every step */
        atomic_store(&ran_n, 0);
        RT_OK(sp_exec_begin_step());
        for (int i = 0; i < NT; i++)
            submit_record(perm[i], 0, NULL, NULL);
        RT_OK(sp_exec_end_step());
        check_ran_in_order(NT, "shuffled");
    }
}

/* A plain StarPU task, as StarPU-MPI or a library might submit: it has no seq. */
static atomic_int bypass_ran;
static void bypass_fn(void *descr[], void *arg) { atomic_store(&bypass_ran, 1); }
static struct starpu_codelet bypass_cl = {.cpu_funcs = {bypass_fn}, .nbuffers = 0};

/* 2. seq 0 waits on data the host holds; every later task is ready but must wait,
 * while a task without a seq must not. */
static void held_behind_dependency(void)
{
    float gate_mem[3] = {0};
    sp_exec_buf *gate;
    RT_OK(sp_exec_buf_register(&gate, gate_mem, 3, sizeof(float)));
    void *p;
    RT_OK(sp_exec_buf_acquire(gate, SP_ACCESS_W, &p));
    atomic_store(&ran_n, 0);
    RT_OK(sp_exec_begin_step());
    for (uint32_t s = NT - 1; s >= 1; s--)
        submit_record(s, 0, NULL, NULL);
    sp_access_mode r = SP_ACCESS_R;
    submit_record(0, 1, &gate, &r);
    struct starpu_task *raw = starpu_task_create();
    raw->cl = &bypass_cl;
    raw->detach = 0;
    RT_CHECK(starpu_task_submit(raw) == 0, "plain task not submitted");
    RT_CHECK(starpu_task_wait(raw) == 0, "plain task not waited for");
    RT_CHECK(atomic_load(&bypass_ran), "plain task did not run");
    rt_spin_us(50000);
    RT_CHECK(atomic_load(&ran_n) == 0, "%d tasks overtook the blocked seq 0",
             atomic_load(&ran_n));
    ((float *)p)[0] = 42.0f;
    RT_OK(sp_exec_buf_release(gate));
    RT_OK(sp_exec_end_step());
    check_ran_in_order(NT, "held");
    RT_OK(sp_exec_buf_unregister(gate));
}

/* 3. 20 buffers in one task (Debian's StarPU has 8 slots) plus a scratch. */
#define NB 20
#define NE 37
static int sum_bufs(const sp_device *dev, void *const *bufs,
                    const size_t *counts, int nbufs, const void *args)
{
    float *out = bufs[0], *tmp = bufs[nbufs - 1];
    if (nbufs != NB + 2 || counts[0] != NE || counts[nbufs - 1] != NE)
        return 9;
    for (size_t i = 0; i < NE; i++) {
        tmp[i] = 0;
        for (int b = 1; b <= NB; b++)
            tmp[i] += ((const float *)bufs[b])[i];
        out[i] = tmp[i] + *(const float *)args;
    }
    return 0;
}

static void many_buffers(void)
{
    static float mem[NB + 1][NE];
    sp_exec_buf *bufs[NB + 2];
    sp_access_mode modes[NB + 2];
    for (int b = 0; b <= NB; b++) {
        for (int i = 0; i < NE; i++)
            mem[b][i] = b == 0 ? -1.0f : (float)(b * 1000 + i);
        RT_OK(sp_exec_buf_register(&bufs[b], mem[b], NE, sizeof(float)));
        modes[b] = b == 0 ? SP_ACCESS_W : SP_ACCESS_R;
    }
    RT_OK(sp_exec_buf_register(&bufs[NB + 1], NULL, NE, sizeof(float)));
    modes[NB + 1] = SP_ACCESS_SCRATCH;
    float bias = 0.5f;
    RT_OK(sp_exec_begin_step());
    RT_OK(sp_exec_submit(&(sp_exec_task){.name = "sum20", .fn = sum_bufs, .nbufs = NB + 2,
                                         .bufs = bufs, .modes = modes, .args = &bias,
                                         .args_size = sizeof bias, .seq = 0}));
    RT_OK(sp_exec_end_step());
    float *out;
    RT_OK(sp_exec_buf_acquire(bufs[0], SP_ACCESS_R, (void **)&out));
    for (int i = 0; i < NE; i++) {
        float want = 0.5f;
        for (int b = 1; b <= NB; b++)
            want += (float)(b * 1000 + i);
        RT_CHECK(out[i] == want, "sum20[%d] = %g, expected %g", i, out[i], want);
    }
    RT_OK(sp_exec_buf_release(bufs[0]));
    for (int b = 0; b < NB + 2; b++)
        RT_OK(sp_exec_buf_unregister(bufs[b]));
}

/* 4. a failing task fails the step (not the process); the next step is clean. */
static int fail_if_seq3(const sp_device *dev, void *const *bufs,
                        const size_t *counts, int nbufs, const void *args)
{
    return ((const struct order_args *)args)->seq == 3 ? 17 : 0;
}

static void failing_task(void)
{
    RT_OK(sp_exec_begin_step());
    for (uint32_t s = 0; s < 6; s++) {
        struct order_args a = {s};
        RT_OK(sp_exec_submit(&(sp_exec_task){.name = "maybe", .fn = fail_if_seq3,
                                             .args = &a, .args_size = sizeof a, .seq = s}));
    }
    sp_status st = sp_exec_end_step();
    RT_CHECK(st == SP_ERR_RUNTIME, "failed step returned %s", sp_status_name(st));
    RT_CHECK(strstr(sp_last_error(), "'maybe' (seq 3) failed with code 17") != NULL,
             "message: %s", sp_last_error());
    atomic_store(&ran_n, 0);
    RT_OK(sp_exec_begin_step());
    for (uint32_t s = 0; s < 5; s++)
        submit_record(s, 0, NULL, NULL);
    RT_OK(sp_exec_end_step());
    check_ran_in_order(5, "after failure");
}

/* 5. bad sequence numbers: a duplicate is refused, a gap drains and fails the step. */
static void bad_seqs(void)
{
    RT_OK(sp_exec_begin_step());
    submit_record(0, 0, NULL, NULL);
    struct order_args a = {0};
    sp_status st = sp_exec_submit(&(sp_exec_task){.name = "dup", .fn = record, .args = &a,
                                                  .args_size = sizeof a, .seq = 0});
    RT_CHECK(st == SP_ERR_ARG, "duplicate seq gave %s", sp_status_name(st));
    submit_record(2, 0, NULL, NULL); /* seq 1 never comes */
    st = sp_exec_end_step();
    RT_CHECK(st == SP_ERR_RUNTIME && strstr(sp_last_error(), "seq 1 is missing"),
             "gap gave %s: %s", sp_status_name(st), sp_last_error());
}

/* 6. StarPU's tools find a codelet's functions by name (cpu_funcs_name, looked up with
 * dlsym in the process: this test, like the apps, exports its symbols). Checked from
 * inside a task, on the codelet StarPU runs it with. */
static char names_err[256];

static int check_names(const sp_device *dev, void *const *bufs, const size_t *counts,
                       int nbufs, const void *args)
{
    (void)dev, (void)bufs, (void)counts, (void)nbufs, (void)args;
    const struct starpu_codelet *cl = starpu_task_get_current()->cl;
    const char *fn = cl->cpu_funcs_name[0];
    void *sym = fn ? dlsym(RTLD_DEFAULT, fn) : NULL;
    if (!fn)
        snprintf(names_err, sizeof names_err, "codelet '%s' has no cpu_funcs_name", cl->name);
    else if (sym != (void *)cl->cpu_funcs[0])
        snprintf(names_err, sizeof names_err, "codelet '%s': cpu_funcs_name '%s' resolves to "
                 "%p, its function is %p", cl->name, fn, sym, (void *)cl->cpu_funcs[0]);
    else if (!cl->name || strcmp(cl->name, "W"))
        snprintf(names_err, sizeof names_err, "codelet named '%s', not its class 'W'",
                 cl->name ? cl->name : "(null)");
    return 0;
}

static void codelet_names(void)
{
    RT_OK(sp_exec_begin_step());
    RT_OK(sp_exec_submit(&(sp_exec_task){.name = "names", .fn = check_names, .codelet = "W",
                                         .seq = 0}));
    RT_OK(sp_exec_end_step());
    RT_CHECK(!names_err[0], "%s", names_err);
}

int main(int argc, char **argv)
{
    double t0 = rt_now_s();
    RT_OK(sp_exec_init(&argc, &argv, &(sp_exec_opts){.trace = 1, .watchdog_s = 20}));
    shuffled();
    held_behind_dependency();
    many_buffers();
    failing_task();
    bad_seqs();
    codelet_names();
    RT_OK(sp_exec_shutdown());
    printf("test_order: ok (%.2f s)\n", rt_now_s() - t0);
    return 0;
}
