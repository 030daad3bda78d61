/* On the fake device (README.md): the ordered policy prefetches a GPU task's inputs when
 * it becomes ready, not when its turn comes (sched/policy.c). Seq 0 reads a gate buffer
 * the host holds (acquired for writing), so it cannot start; seq 1 reads 4 MiB of host
 * memory and is ready at once, held behind seq 0. While both wait, those 4 MiB must
 * already have crossed to the device (the device's own count of host-to-device bytes),
 * and nothing may have run; once the host lets the gate go, both run in order and seq 1
 * sees its data. Exits 77 when the fake device is not loaded. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "tests/runtime/rt_check.h"

enum { H2D, D2H, D2D, NCCL_SENT, NCCL_RECV, KERNELS, GEMMS, NCOUNTS };
typedef int (*stats_fn)(int dev, unsigned long long out[NCOUNTS]);

#define N (1 << 20) /* floats: 4 MiB */

static atomic_int ran_n, ran[2];

struct args { int seq; };

static int record(const sp_device *dev, void *const *bufs, const size_t *counts, int nbufs,
                  const void *args)
{
    (void)dev, (void)bufs, (void)counts, (void)nbufs;
    int i = atomic_fetch_add(&ran_n, 1);
    if (i < 2) atomic_store(&ran[i], ((const struct args *)args)->seq);
    return 0;
}

static unsigned long long h2d(stats_fn f)
{
    unsigned long long c[NCOUNTS], sum = 0;
    for (int d = 0; f(d, c) == 0; d++) sum += c[H2D];
    return sum;
}

int main(int argc, char **argv)
{
    stats_fn stats_of = (stats_fn)dlsym(RTLD_DEFAULT, "starpipe_fake_gpu_stats");
    RT_OK(sp_exec_init(&argc, &argv, &(sp_exec_opts){ 0 }));
    if (!stats_of || sp_exec_num_cuda() != 1) {
        printf("SKIP: %s\n", !stats_of ? "not on the fake device" : "no CUDA worker");
        sp_exec_shutdown();
        return 77;
    }
    float gate_mem[4] = { 0 }, *x_mem = calloc(N, sizeof(float));
    RT_CHECK(x_mem != NULL, "out of memory");
    for (int i = 0; i < N; i++) x_mem[i] = (float)i;
    sp_exec_buf *gate, *x;
    RT_OK(sp_exec_buf_register(&gate, gate_mem, 4, sizeof(float)));
    RT_OK(sp_exec_buf_register(&x, x_mem, N, sizeof(float)));
    void *p;
    RT_OK(sp_exec_buf_acquire(gate, SP_ACCESS_W, &p));
    RT_OK(sp_exec_begin_step());
    const unsigned long long before = h2d(stats_of);
    const sp_access_mode r = SP_ACCESS_R;
    struct args a0 = { 0 }, a1 = { 1 };
    RT_OK(sp_exec_submit(&(sp_exec_task){ .name = "gated", .fn = record, .where = SP_EXEC_ON_CUDA,
                                          .nbufs = 1, .bufs = &gate, .modes = &r, .args = &a0,
                                          .args_size = sizeof a0, .seq = 0 }));
    RT_OK(sp_exec_submit(&(sp_exec_task){ .name = "held", .fn = record, .where = SP_EXEC_ON_CUDA,
                                          .nbufs = 1, .bufs = &x, .modes = &r, .args = &a1,
                                          .args_size = sizeof a1, .seq = 1 }));
    /* the prefetch is asynchronous: wait for it, up to 5 s */
    unsigned long long moved = 0;
    for (double t0 = rt_now_s(); rt_now_s() - t0 < 5.0; ) {
        moved = h2d(stats_of) - before;
        if (moved >= (unsigned long long)N * sizeof(float)) break;
        nanosleep(&(struct timespec){ 0, 2000000 }, NULL);
    }
    const int early = atomic_load(&ran_n);
    printf("while seq 1 was held: %llu bytes moved to the device (its input: %zu), %d tasks ran\n",
           moved, (size_t)N * sizeof(float), early);
    RT_CHECK(early == 0, "%d tasks ran while seq 0 waited for the host", early);
    RT_CHECK(moved >= (unsigned long long)N * sizeof(float),
             "the held task's input was not prefetched: %llu of %zu bytes on the device", moved,
             (size_t)N * sizeof(float));
    ((float *)p)[0] = 1.0f;
    RT_OK(sp_exec_buf_release(gate));
    RT_OK(sp_exec_end_step());
    RT_CHECK(atomic_load(&ran_n) == 2 && ran[0] == 0 && ran[1] == 1, "ran %d tasks: %d, %d",
             atomic_load(&ran_n), ran[0], ran[1]);
    RT_OK(sp_exec_buf_unregister(gate));
    RT_OK(sp_exec_buf_unregister(x));
    free(x_mem);
    RT_OK(sp_exec_shutdown());
    printf("PASS\n");
    return 0;
}
