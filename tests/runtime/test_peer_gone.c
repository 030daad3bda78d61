/* A peer dies while the survivor is in a collective outside any task: run by
 * peer_gone.sh on 2 ranks under a launcher that leaves the survivor running
 * (mpirun --mca orte_abort_on_non_zero_status 0). Rank 0 kills itself (SIGKILL) at the
 * point MODE names, after one good step; rank 1, with a 2 s watchdog, must get
 * SP_ERR_TIMEOUT from the call that waits for it, naming that collective, and then every
 * executor call must fail at once. Rank 1 then ends the run (sp_exec_abort).
 *   agreement: rank 1 in sp_exec_end_step after its own task (the step's end: StarPU-MPI's
 *              drain barrier, or the outcome agreement with direct)
 *   allreduce: rank 1 in sp_exec_allreduce_sum between steps (the loss, the norm)
 *   gather:    rank 1 in sp_exec_gather, its root, waiting for rank 0's part
 *   bcast:     rank 1 in sp_exec_bcast from rank 0 (a parameter's fetch)
 *   shutdown:  rank 1 in sp_exec_shutdown */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "rt_check.h"

static int work(const sp_device *dev, void *const *bufs, const size_t *counts, int nbufs,
                const void *args)
{
    float *x = bufs[0];
    for (size_t i = 0; i < counts[0]; i++)
        x[i] += 1.0f;
    return 0;
}

static void local_task(sp_exec_buf *b)
{
    sp_access_mode m = SP_ACCESS_RW;
    RT_OK(sp_exec_submit(&(sp_exec_task){ .name = "work", .fn = work, .nbufs = 1, .bufs = &b,
                                          .modes = &m, .seq = 0 }));
}

static void die(const char *mode)
{
    fprintf(stderr, "rank 0: dying (SIGKILL) before the %s\n", mode);
    fflush(stderr);
    raise(SIGKILL);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    RT_OK(sp_exec_init(&argc, &argv, &(sp_exec_opts){ .watchdog_s = 2 }));
    int rank = sp_exec_rank();
    RT_CHECK(sp_exec_size() == 2, "run on 2 ranks");
    float mem[7] = { 0 }, sum[2] = { 1, 2 }, all[2];
    sp_exec_buf *b;
    RT_OK(sp_exec_buf_register(&b, mem, 7, sizeof(float)));

    /* one good step and its collectives: the watchdog must not fire on a live run */
    RT_OK(sp_exec_begin_step());
    local_task(b);
    RT_OK(sp_exec_end_step());
    RT_OK(sp_exec_allreduce_sum(sum, 2, 0));
    RT_CHECK(sum[0] == 2 && sum[1] == 4, "all-reduce gave %g %g", sum[0], sum[1]);

    double t0 = rt_now_s();
    sp_status st;
    const char *want;
    if (!strcmp(mode, "agreement")) {
        RT_OK(sp_exec_begin_step());
        local_task(b);
        if (rank == 0) /* its task done or not: rank 1 waits at the step's end */
            die(mode);
        st = sp_exec_end_step();
        want = "the step's";
    } else if (!strcmp(mode, "allreduce")) {
        if (rank == 0) die(mode);
        st = sp_exec_allreduce_sum(sum, 2, 0);
        want = "an all-reduce between steps (sp_exec_allreduce_sum) did not end";
    } else if (!strcmp(mode, "gather")) {
        if (rank == 0) die(mode);
        st = sp_exec_gather(&sum[0], sizeof(float), all, 1); /* rank 1 waits for rank 0's */
        want = "a gather between steps (sp_exec_gather) did not end";
    } else if (!strcmp(mode, "bcast")) {
        if (rank == 0) die(mode);
        st = sp_exec_bcast(sum, sizeof sum, 0);
        want = "a broadcast between steps (sp_exec_bcast) did not end";
    } else if (!strcmp(mode, "shutdown")) {
        RT_OK(sp_exec_buf_unregister(b));
        if (rank == 0) die(mode);
        st = sp_exec_shutdown();
        want = "the shutdown's barrier did not end";
    } else {
        sp_exec_abort(2, "unknown mode '%s'", mode);
    }
    double took = rt_now_s() - t0;
    RT_CHECK(rank == 1, "rank 0 alive after its death");
    fprintf(stderr, "rank 1: after %.1f s: %s: %s\n", took, sp_status_name(st), sp_last_error());
    RT_CHECK(st == SP_ERR_TIMEOUT && strstr(sp_last_error(), want) &&
                 strstr(sp_last_error(), "a peer that died or is stuck"),
             "rank 1 (%s): %s %s", mode, sp_status_name(st), sp_last_error());
    RT_CHECK(!sp_exec_usable(), "executor still usable after the timeout");
    void *ptr;
    double t1 = rt_now_s();
    RT_CHECK(sp_exec_allreduce_sum(sum, 2, 0) != SP_OK && sp_exec_begin_step() != SP_OK &&
                 (!strcmp(mode, "shutdown") || sp_exec_buf_acquire(b, SP_ACCESS_R, &ptr) != SP_OK),
             "calls after the timeout did not fail");
    RT_CHECK(rt_now_s() - t1 < 0.5, "calls after the timeout waited");
    sp_exec_abort(7, "rank 1 gave up in %.1f s as it should; giving up on purpose", took);
}
