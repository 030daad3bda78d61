/* bench_messages: what one pipeline message costs, next to what the transport allows.
 * Run under mpirun -np 2 with the default launch (the runtime sets what it sets; nothing
 * else). For each message size, one-way latency as half a round trip, median and p90:
 *   - "MPI": MPI_Send / MPI_Recv of the same bytes between the main threads, with the
 *     runtime started and idle (its worker parked, no request in flight): the floor
 *     the transport gives on this machine and launch;
 *   - "runtime": the path every message of a pipelined step takes. A task on rank 0 writes
 *     the buffer, it is sent, a task on rank 1 reads and rewrites it, it is sent back, and
 *     so on, every transfer posted at the step's start as the trainer posts them. One hop
 *     is a producer task's end to its consumer's start (rank 0's gap between its tasks,
 *     less rank 1's task, halved): the producer's termination and the send it posts,
 *     the data, the receiver's test and the consumer's dispatch (direct transfers), or
 *     StarPU-MPI's hand-offs between a rank's worker and its progress thread
 *     (STARPIPE_TRANSPORT=starpu-mpi).
 * bench_runtime's "message wait" is the same quantity inside real steps.
 *
 *   mpirun -np 2 bench_messages [--iters N] [--floats 128,16384,131072] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/exec.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[(int)(q * (n - 1) + 0.5)];
}

/* The consumer's work: enough to depend on the data, nothing to measure. */
static int touch(const sp_device *dev, void *const *bufs,
                 const size_t *counts, int nbufs, const void *args)
{
    (void)counts, (void)nbufs, (void)args;
    ((float *)bufs[0])[0] += 1.0f;
    return 0;
}

/* Half of each of n round trips of `floats` floats between ranks 0 and 1, in us. */
static void mpi_pingpong(MPI_Comm comm, int me, float *buf, int floats, int n, double *out)
{
    for (int i = -5; i < n; i++) { /* five warm-up trips */
        double t = MPI_Wtime();
        if (me == 0) {
            MPI_Send(buf, floats, MPI_FLOAT, 1, 0, comm);
            MPI_Recv(buf, floats, MPI_FLOAT, 1, 0, comm, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, floats, MPI_FLOAT, 0, 0, comm, MPI_STATUS_IGNORE);
            MPI_Send(buf, floats, MPI_FLOAT, 0, 0, comm);
        }
        if (i >= 0) out[i] = 0.5e6 * (MPI_Wtime() - t);
    }
}

/* One step of n round trips through tasks and transfers. Rank 0 gets the hop times
 * (n - 1 of them: between consecutive tasks of its own), the others return 0. */
static int runtime_pingpong(MPI_Comm comm, int me, sp_exec_buf *b, int n, double *out)
{
    sp_access_mode rw = SP_ACCESS_RW;
    if (sp_exec_begin_step() != SP_OK) return -1;
    for (int i = 0; i < n; i++) {
        sp_exec_task t = { .name = "touch", .fn = touch, .nbufs = 1, .bufs = &b,
                           .modes = &rw, .seq = (uint32_t)i, .codelet = "touch" };
        if (me == 1 && sp_exec_recv(b, 0, 2 * (uint32_t)i) != SP_OK) return -1;
        if (sp_exec_submit(&t) != SP_OK) return -1;
        if (sp_exec_send(b, 1 - me, 2 * (uint32_t)i + (me == 1)) != SP_OK) return -1;
        if (me == 0 && sp_exec_recv(b, 1, 2 * (uint32_t)i + 1) != SP_OK) return -1;
    }
    if (sp_exec_end_step() != SP_OK) return -1;

    const sp_exec_record *r;
    size_t nr;
    if (sp_exec_trace(&r, &nr) != SP_OK) return -1;
    double *s = calloc((size_t)n, sizeof *s), *e = calloc((size_t)n, sizeof *e);
    for (size_t q = 0; q < nr; q++)
        if (!r[q].transfer && r[q].seq < (uint32_t)n) {
            s[r[q].seq] = r[q].start_us;
            e[r[q].seq] = r[q].end_us;
        }
    /* rank 1's task durations, to take out of rank 0's gaps */
    double *d = calloc((size_t)n, sizeof *d);
    for (int i = 0; i < n; i++) d[i] = e[i] - s[i];
    if (me == 1) MPI_Send(d, n, MPI_DOUBLE, 0, 1, comm);
    if (me == 0) {
        MPI_Recv(d, n, MPI_DOUBLE, 1, 1, comm, MPI_STATUS_IGNORE);
        for (int i = 0; i + 1 < n; i++) out[i] = 0.5 * (s[i + 1] - e[i] - d[i]);
    }
    free(s), free(e), free(d);
    return 0;
}

int main(int argc, char **argv)
{
    if (sp_exec_init(&argc, &argv, &(sp_exec_opts){ .trace = 1 }) != SP_OK) {
        fprintf(stderr, "bench_messages: %s\n", sp_last_error());
        return 1;
    }
    int me = sp_exec_rank(), iters = 200;
    const char *sizes = "128,16384,131072";
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--floats")) sizes = argv[i + 1];
    }
    int nsizes = 0, floats_of[16], bad = sp_exec_size() != 2 || iters < 2;
    for (const char *p = sizes; !bad && *p; nsizes++) {
        char *end;
        long f = strtol(p, &end, 10);
        bad = nsizes == 16 || end == p || f <= 0 || f > (1L << 26) || (*end && *end != ',');
        floats_of[nsizes] = (int)f;
        p = *end ? end + 1 : end;
    }
    if (bad || !nsizes) {
        if (me == 0)
            fprintf(stderr, "bench_messages: run with mpirun -np 2; --iters N >= 2; --floats "
                            "a list of up to 16 counts in 1..2^26, e.g. 128,16384\n");
        sp_exec_shutdown();
        return 1;
    }
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    if (me == 0)
        printf("one-way latency, us (half a round trip), %d round trips: median / p90\n\n"
               "| floats | bytes | MPI | runtime (task end -> consumer task start) | "
               "runtime / MPI |\n|---|---|---|---|---|\n", iters);
    double *mpi = calloc((size_t)iters, sizeof *mpi);
    double *rt = calloc((size_t)iters + 5, sizeof *rt); /* + 5: the warm-up step's */
    int rc = 0;
    for (int z = 0; z < nsizes && !rc; z++) {
        int floats = floats_of[z];
        float *host = sp_exec_host_alloc(sizeof(float) * (size_t)floats);
        sp_exec_buf *b = NULL;
        int ok = host && sp_exec_buf_register(&b, host, (size_t)floats, sizeof(float)) == SP_OK;
        MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm); /* no rank left waiting */
        if (!ok) {
            if (me == 0) fprintf(stderr, "bench_messages: no room for %d floats\n", floats);
            if (b) sp_exec_buf_unregister(b);
            if (host) sp_exec_host_free(host, sizeof(float) * (size_t)floats);
            rc = 1;
            break;
        }
        memset(host, 0, sizeof(float) * (size_t)floats);
        mpi_pingpong(comm, me, host, floats, iters, mpi);
        runtime_pingpong(comm, me, b, 5, rt); /* warm-up step */
        if (runtime_pingpong(comm, me, b, iters + 1, rt)) {
            fprintf(stderr, "bench_messages: %s\n", sp_last_error());
            rc = 1;
        }
        if (me == 0 && !rc) {
            double mm = pct(mpi, iters, 0.5), m9 = pct(mpi, iters, 0.9);
            double rm = pct(rt, iters, 0.5), r9 = pct(rt, iters, 0.9);
            printf("| %d | %zu | %.1f / %.1f | %.1f / %.1f | %.1f |\n", floats,
                   sizeof(float) * (size_t)floats, mm, m9, rm, r9, mm > 0 ? rm / mm : 0);
            fflush(stdout);
        }
        sp_exec_buf_unregister(b);
        sp_exec_host_free(host, sizeof(float) * (size_t)floats);
    }
    free(mpi), free(rt);
    MPI_Comm_free(&comm);
    sp_exec_shutdown();
    return rc;
}
