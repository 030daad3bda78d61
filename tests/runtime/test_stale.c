/* No stale reads when one handle carries many messages. Rank 0 writes message k into H,
 * sends it, and poisons H right away; rank 1 receives into R, checks it, and poisons R.
 * A send that did not hold H until delivered would ship poison; a receive skipped or
 * served from StarPU-MPI's cache would leave poison (or message k-1) for the check.
 * RT_STALE_SKIP=1 drops message 2 on both sides, as a cache hit would: the test must
 * then fail (ctest runtime_stale_detects_skip), which shows it can see stale data.
 * StarPU-MPI's cache is off after sp_exec_init whatever the environment says
 * (runtime_stale_cache_env sets STARPU_MPI_CACHE=1): it serves only task_insert's
 * implicit transfers, which starpipe never makes, so the switch is what can be checked. */
#include <starpu_mpi.h>

#include "rt_check.h"

#define N 19
#define STEPS 3
#define MSGS 5

struct fill_args { float v; };

static int fill(const sp_device *dev, void *const *bufs,
                const size_t *counts, int nbufs, const void *args)
{
    for (size_t i = 0; i < counts[0]; i++)
        ((float *)bufs[0])[i] = ((const struct fill_args *)args)->v + (float)i;
    return 0;
}

/* Returns the number of wrong elements as the task's error code. */
static int check(const sp_device *dev, void *const *bufs,
                 const size_t *counts, int nbufs, const void *args)
{
    int wrong = 0;
    for (size_t i = 0; i < counts[0]; i++)
        wrong += ((const float *)bufs[0])[i] != ((const struct fill_args *)args)->v + (float)i;
    return wrong;
}

static void task(const char *name, sp_task_fn fn, sp_exec_buf *b, sp_access_mode mode,
                 float v, uint32_t seq)
{
    struct fill_args a = {v};
    RT_OK(sp_exec_submit(&(sp_exec_task){.name = name, .fn = fn, .nbufs = 1, .bufs = &b,
                                         .modes = &mode, .args = &a, .args_size = sizeof a,
                                         .seq = seq}));
}

int main(int argc, char **argv)
{
    RT_OK(sp_exec_init(&argc, &argv, &(sp_exec_opts){.watchdog_s = 20}));
    int rank = sp_exec_rank();
    RT_CHECK(sp_exec_size() == 2, "needs 2 ranks, got %d", sp_exec_size());
    RT_CHECK(starpu_mpi_cache_is_enabled() == 0, "StarPU-MPI's cache is on after sp_exec_init "
             "(STARPU_MPI_CACHE=%s)", getenv("STARPU_MPI_CACHE") ? getenv("STARPU_MPI_CACHE") : "");
    float mem[N];
    sp_exec_buf *h;
    RT_OK(sp_exec_buf_register(&h, mem, N, sizeof(float)));
    int skip = getenv("RT_STALE_SKIP") != NULL;
    for (int s = 0; s < STEPS; s++) {
        RT_OK(sp_exec_begin_step());
        for (int k = 0; k < MSGS; k++) {
            float v = (float)(1000 * s + 10 * k);
            uint32_t seq = (uint32_t)(2 * k);
            if (rank == 0) {
                task("write", fill, h, SP_ACCESS_W, v, seq);
                if (!(skip && k == 2))
                    RT_OK(sp_exec_send(h, 1, (uint32_t)k));
                task("poison", fill, h, SP_ACCESS_W, -999.0f, seq + 1);
            } else {
                if (!(skip && k == 2))
                    RT_OK(sp_exec_recv(h, 0, (uint32_t)k));
                task("check", check, h, SP_ACCESS_R, v, seq);
                task("poison", fill, h, SP_ACCESS_W, -777.0f, seq + 1);
            }
        }
        sp_status st = sp_exec_end_step();
        RT_CHECK(st == SP_OK, "step %d: stale or wrong data: %s", s, sp_last_error());
    }
    RT_OK(sp_exec_buf_unregister(h));
    RT_OK(sp_exec_shutdown());
    if (rank == 0)
        printf("test_stale: ok, %d steps x %d messages through one handle\n", STEPS, MSGS);
    return 0;
}
