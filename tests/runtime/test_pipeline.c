/* A pipeline over all ranks: rank 0 makes each microbatch, every rank transforms it and
 * sends it on, the last rank stores it. Two activation buffers per rank, reused every
 * other microbatch and every step. Values are exact, so any wrong, stale or reordered
 * message shows up. Optional: test_pipeline TASK_US [M] [STEPS] prints the step time
 * against the ideal (M + p - 1) * TASK_US, to measure the progress-thread setups. */
#include <string.h>

#include "rt_check.h"

#define N 37 /* an awkward length on purpose */

struct stage_args {
    int rank, step, mb;
    double spin_us;
};

/* act = f(step, mb) on rank 0; act = 2 * act + rank downstream (exact in float). */
static float expected(int last_rank, int step, int mb, int i)
{
    double v = step * 1000 + mb * 100 + i;
    for (int r = 1; r <= last_rank; r++)
        v = 2 * v + r;
    return (float)v;
}

static int stage(const sp_device *dev, void *const *bufs,
                 const size_t *counts, int nbufs, const void *args)
{
    const struct stage_args *a = args;
    float *act = bufs[0];
    rt_spin_us(a->spin_us);
    for (size_t i = 0; i < counts[0]; i++)
        act[i] = a->rank == 0 ? (float)(a->step * 1000 + a->mb * 100 + (int)i)
                              : 2 * act[i] + (float)a->rank;
    if (nbufs == 2) /* the last rank keeps every microbatch */
        memcpy((float *)bufs[1] + (size_t)a->mb * N, act, N * sizeof(float));
    return 0;
}

int main(int argc, char **argv)
{
    double spin_us = argc > 1 ? atof(argv[1]) : 200;
    int M = argc > 2 ? atoi(argv[2]) : 6, steps = argc > 3 ? atoi(argv[3]) : 3;
    double t_start = rt_now_s();
    RT_OK(sp_exec_init(&argc, &argv,
                       &(sp_exec_opts){.trace = 1, .watchdog_s = 20,
                                       .verbose = getenv("RT_VERBOSE") != NULL}));
    int rank = sp_exec_rank(), p = sp_exec_size(), last = rank == p - 1;
    RT_CHECK(p >= 2, "needs at least 2 ranks, got %d", p);

    float act_mem[2][N], *out_mem = calloc((size_t)M * N, sizeof(float));
    sp_exec_buf *act[2], *out;
    for (int k = 0; k < 2; k++)
        RT_OK(sp_exec_buf_register(&act[k], act_mem[k], N, sizeof(float)));
    RT_OK(sp_exec_buf_register(&out, out_mem, (size_t)M * N, sizeof(float)));

    double best = 1e30;
    for (int s = 0; s < steps; s++) {
        double t0 = rt_now_s();
        RT_OK(sp_exec_begin_step());
        for (int m = 0; m < M; m++) {
            sp_exec_buf *bufs[2] = {act[m % 2], out};
            sp_access_mode modes[2] = {rank == 0 ? SP_ACCESS_W : SP_ACCESS_RW, SP_ACCESS_RW};
            /* message number: one per (microbatch, hop), the same on both sides */
            if (rank > 0)
                RT_OK(sp_exec_recv(act[m % 2], rank - 1, (uint32_t)(m * p + rank - 1)));
            char name[32];
            snprintf(name, sizeof name, "F%d.%d", m, rank);
            struct stage_args a = {rank, s, m, spin_us};
            RT_OK(sp_exec_submit(&(sp_exec_task){.name = name, .fn = stage,
                                                 .nbufs = last ? 2 : 1, .bufs = bufs,
                                                 .modes = modes, .args = &a,
                                                 .args_size = sizeof a, .seq = (uint32_t)m}));
            if (!last)
                RT_OK(sp_exec_send(act[m % 2], rank + 1, (uint32_t)(m * p + rank)));
        }
        RT_OK(sp_exec_end_step());
        double dt = rt_now_s() - t0;
        if (dt < best)
            best = dt;

        const sp_exec_record *all;
        size_t nall, n = 0, nsend = 0, nrecv = 0;
        RT_OK(sp_exec_trace(&all, &nall));
        sp_exec_record *rec = malloc((nall + 1) * sizeof *rec);
        RT_CHECK(rec != NULL, "out of memory");
        for (size_t j = 0; j < nall; j++) { /* tasks in start order; transfers counted */
            if (all[j].transfer == 1) nsend++;
            else if (all[j].transfer == 2) nrecv++;
            else rec[n++] = all[j];
        }
        RT_CHECK(n == (size_t)M, "step %d: %zu tasks ran, expected %d", s, n, M);
        RT_CHECK(nsend == (last ? 0u : (size_t)M) && nrecv == (rank ? (size_t)M : 0u),
                 "step %d: %zu sends and %zu receives traced", s, nsend, nrecv);
        for (int m = 0; m < M && m < (int)n; m++)
            RT_CHECK(rec[m].seq == (uint32_t)m, "step %d: position %d ran seq %u", s, m,
                     rec[m].seq);
        free(rec);
        if (last) {
            float *o;
            RT_OK(sp_exec_buf_acquire(out, SP_ACCESS_R, (void **)&o));
            int wrong = 0;
            for (int m = 0; m < M; m++)
                for (int i = 0; i < N; i++)
                    wrong += o[m * N + i] != expected(rank, s, m, i);
            RT_CHECK(wrong == 0, "step %d: %d of %d values wrong (e.g. mb 0: %g vs %g)", s,
                     wrong, M * N, o[0], expected(rank, s, 0, 0));
            RT_OK(sp_exec_buf_release(out));
        }
    }
    for (int k = 0; k < 2; k++)
        RT_OK(sp_exec_buf_unregister(act[k]));
    RT_OK(sp_exec_buf_unregister(out));
    RT_OK(sp_exec_shutdown());
    free(out_mem);
    if (rank == 0 && argc > 1) {
        double ideal = (M + p - 1) * spin_us * 1e-6;
        printf("p=%d M=%d task=%.0fus: best step %.2f ms, ideal %.2f ms, ratio %.2f\n", p, M,
               spin_us, best * 1e3, ideal * 1e3, best / ideal);
    }
    if (rank == 0)
        printf("test_pipeline: ok, %d ranks, %d steps x %d microbatches (%.2f s)\n", p,
               steps, M, rt_now_s() - t_start);
    return 0;
}
