/* Failure paths that must never hang: run by expect_abort.sh, which wants every rank
 * gone, non-zero, within a few seconds.
 *   task:      rank 1's task fails; all ranks must agree on the error at end of step,
 *              then rank 1 aborts while the others wait for its next message.
 *   abort:     rank 1 aborts mid-step while the others wait for its message.
 *   watchdog:  rank 1's task hangs; the watchdog makes end_step return SP_ERR_TIMEOUT to
 *              the caller (the library does not end the process), later calls fail at
 *              once instead of waiting, and the caller ends every rank itself.
 *   sched-env: STARPU_SCHED names another policy; init must refuse on every rank.
 *   transport-env: STARPIPE_TRANSPORT names no transport; refused the same way.
 *   size:      direct transfers: a message whose two ends registered different sizes
 *              (rank 1's buffer larger: a short message; smaller: a truncated one)
 *              fails its step on every rank with the receiver's message, and the
 *              executor goes on (a step between them, sizes matching, succeeds). The
 *              same for 256 KB, which goes in eager pieces (comm/direct.c): rank 1's
 *              buffer a float short (the sender's last, empty piece left over: the step
 *              after it must match and carry the right values) and 128 KB longer (rank 1
 *              waits for pieces never sent: must fail, not hang). Then rank 1 aborts. */
#include <string.h>
#include <time.h>

#include "rt_check.h"

#define N 23
#define NL 65536 /* floats: 256 KB, two full eager pieces and an empty one */

static int work(const sp_device *dev, void *const *bufs,
                const size_t *counts, int nbufs, const void *args)
{
    float *x = bufs[0];
    for (size_t i = 0; i < counts[0]; i++)
        x[i] += 1.0f;
    return *(const int *)args; /* the failure code asked for */
}

static int hang(const sp_device *dev, void *const *bufs,
                const size_t *counts, int nbufs, const void *args)
{
    nanosleep(&(struct timespec){ 60, 0 }, NULL);
    return 0;
}

static void run_task(sp_exec_buf *b, int code, uint32_t seq)
{
    sp_access_mode m = SP_ACCESS_RW;
    RT_OK(sp_exec_submit(&(sp_exec_task){.name = "work", .fn = work, .nbufs = 1, .bufs = &b,
                                         .modes = &m, .args = &code, .args_size = sizeof code,
                                         .seq = seq}));
}

/* One step of the size mode: rank 0 works on sb and sends it as message 3; rank 1
 * receives it into rb, and works on it if consume. */
static sp_status size_step(sp_exec_buf *sb, sp_exec_buf *rb, int consume)
{
    int rank = sp_exec_rank();
    RT_OK(sp_exec_begin_step());
    if (rank == 0) {
        run_task(sb, 0, 0);
        RT_OK(sp_exec_send(sb, 1, 3));
    }
    if (rank == 1) {
        RT_OK(sp_exec_recv(rb, 0, 3));
        if (consume)
            run_task(rb, 0, 0);
    }
    return sp_exec_end_step();
}

/* Every rank must return rank 1's error about the mismatch, containing want. */
static void expect_mismatch(sp_status st, const char *want, const char *what, int d)
{
    int rank = sp_exec_rank();
    RT_CHECK(st == SP_ERR_RUNTIME && strstr(sp_last_error(), "rank 1: ") &&
                 strstr(sp_last_error(), want),
             "rank %d, %sbuffer %+d: %s %s", rank, what, d, sp_status_name(st), sp_last_error());
    fprintf(stderr, "rank %d agreed: %s\n", rank, sp_last_error());
}

/* One pipeline step: recv from r-1, work, send to r+1. fail_rank's task returns 42. */
static sp_status pipeline_step(sp_exec_buf *b, int fail_rank)
{
    int rank = sp_exec_rank(), p = sp_exec_size();
    RT_OK(sp_exec_begin_step());
    if (rank > 0)
        RT_OK(sp_exec_recv(b, rank - 1, 0));
    run_task(b, rank == fail_rank ? 42 : 0, 0);
    if (rank + 1 < p)
        RT_OK(sp_exec_send(b, rank + 1, 0));
    return sp_exec_end_step();
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int watchdog = strcmp(mode, "watchdog") == 0;
    sp_status st = sp_exec_init(&argc, &argv, &(sp_exec_opts){ .watchdog_s = watchdog ? 2 : 0 });
    const char *env = !strcmp(mode, "sched-env") ? "STARPU_SCHED"
                    : !strcmp(mode, "transport-env") ? "STARPIPE_TRANSPORT" : NULL;
    if (env) {
        char want[64];
        snprintf(want, sizeof want, "%s=", env);
        if (st == SP_ERR_ARG && strstr(sp_last_error(), want)) {
            printf("refused as expected: %s\n", sp_last_error());
            return 0;
        }
        fprintf(stderr, "%s=%s was not refused (%s)\n", env, getenv(env), sp_status_name(st));
        return 1;
    }
    RT_OK(st);
    int rank = sp_exec_rank();
    float mem[N] = {0};
    sp_exec_buf *b;
    RT_OK(sp_exec_buf_register(&b, mem, N, sizeof(float)));

    if (strcmp(mode, "task") == 0) {
        st = pipeline_step(b, 1);
        RT_CHECK(st == SP_ERR_RUNTIME && strstr(sp_last_error(), "rank 1: task 'work'"),
                 "rank %d did not see rank 1's failure: %s %s", rank, sp_status_name(st),
                 sp_last_error());
        fprintf(stderr, "rank %d agreed: %s\n", rank, sp_last_error());
    } else if (watchdog) {
        RT_OK(sp_exec_begin_step());
        sp_access_mode m = SP_ACCESS_RW;
        if (rank > 0)
            RT_OK(sp_exec_recv(b, rank - 1, 0));
        RT_OK(sp_exec_submit(&(sp_exec_task){ .name = "maybe hang", .fn = rank == 1 ? hang : work,
                                              .nbufs = 1, .bufs = &b, .modes = &m,
                                              .args = &(int){ 0 }, .args_size = sizeof(int) }));
        if (rank + 1 < sp_exec_size())
            RT_OK(sp_exec_send(b, rank + 1, 0));
        st = sp_exec_end_step();
        /* rank 0 finishes its work and waits in the step's barrier for rank 1, which
         * never comes: it ends when rank 1 (or 2) aborts below */
        RT_CHECK(st == SP_ERR_TIMEOUT && strstr(sp_last_error(), "no task finished for 2.0 s"),
                 "rank %d: %s %s", rank, sp_status_name(st), sp_last_error());
        RT_CHECK(!sp_exec_usable(), "rank %d: executor still usable after the watchdog", rank);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", sp_last_error());
        void *ptr;
        RT_CHECK(sp_exec_buf_acquire(b, SP_ACCESS_R, &ptr) != SP_OK &&
                     sp_exec_begin_step() != SP_OK && sp_exec_shutdown() != SP_OK,
                 "rank %d: calls after the watchdog did not fail at once", rank);
        sp_exec_abort(7, "alive after the watchdog's status (%s); giving up on purpose", msg);
    } else if (strcmp(mode, "size") == 0) {
        /* ranks 0 and 1: rank 0 sends N floats as message 3; rank 1 receives into N + d */
        for (int d = 5; d >= -5; d -= 5) {
            float big[N + 5] = {0};
            sp_exec_buf *r = b;
            if (rank == 1)
                RT_OK(sp_exec_buf_register(&r, big, (size_t)(N + d), sizeof(float)));
            st = size_step(b, r, 1);
            if (d == 0)
                RT_CHECK(st == SP_OK, "rank %d: matching sizes failed: %s", rank, sp_last_error());
            else
                expect_mismatch(st, d > 0 ? "bytes arrived" : "message #3 from rank 0", "", d);
            RT_CHECK(sp_exec_usable(), "rank %d: executor unusable after a failed step", rank);
            if (rank == 1)
                RT_OK(sp_exec_buf_unregister(r));
        }
        /* the same in pieces; rank 0 adds 1 to its buffer before each send */
        static float big0[NL], big1[NL + 32768];
        for (int i = 0; i < NL; i++)
            big0[i] = (float)i;
        sp_exec_buf *bl = NULL;
        if (rank == 0)
            RT_OK(sp_exec_buf_register(&bl, big0, NL, sizeof(float)));
        const int ds[] = { -1, 0, 32768, 0 };
        for (int k = 0; k < 4; k++) {
            int d = ds[k];
            sp_exec_buf *r = NULL;
            if (rank == 1)
                RT_OK(sp_exec_buf_register(&r, big1, (size_t)(NL + d), sizeof(float)));
            st = size_step(bl, r, 0);
            if (d == 0) {
                RT_CHECK(st == SP_OK, "rank %d: 256 KB, matching sizes failed after a "
                         "mismatch: %s", rank, sp_last_error());
                for (int i = 0; rank == 1 && i < NL; i++)
                    RT_CHECK(big1[i] == (float)i + (float)(k + 1), "rank 1: 256 KB, step %d: "
                             "float %d is %g, sent %g", k, i, big1[i], (float)i + (k + 1));
            } else {
                expect_mismatch(st, d > 0 ? "bytes arrived in piece 3 of 4"
                                          : "message #3 from rank 0", "256 KB, ", d);
            }
            if (rank == 1)
                RT_OK(sp_exec_buf_unregister(r));
        }
        if (rank == 0)
            RT_OK(sp_exec_buf_unregister(bl));
    } else if (strcmp(mode, "abort") != 0) {
        sp_exec_abort(2, "unknown mode '%s'", mode);
    }
    /* Rank 1 gives up; the others block on a message it will never send. */
    RT_OK(sp_exec_begin_step());
    if (rank == 1)
        sp_exec_abort(7, "giving up on purpose (mode %s)", mode);
    if (rank > 0)
        RT_OK(sp_exec_recv(b, rank - 1, 1));
    run_task(b, 0, 0);
    if (rank + 1 < sp_exec_size())
        RT_OK(sp_exec_send(b, rank + 1, 1));
    sp_exec_end_step();
    fprintf(stderr, "rank %d: the step ended although rank 1 aborted\n", rank);
    return 0;
}
