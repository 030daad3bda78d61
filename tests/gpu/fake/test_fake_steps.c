/* On the fake device (README.md): what one training step moves across the host-device
 * bus, counted by the device itself. On P ranks (mpiexec -np P), each with one GPU: a
 * GPT pipelined with 1F1B, 6 steps; over steps 4-6 (StarPU has measured the bus and
 * placed every buffer by then) each rank's device must have moved, per step, exactly:
 *   into the device: the inputs its stages read; out of it: the losses (last stage) and
 *   the gradient norm's per-parameter terms (np doubles a stage, as
 *   sp_step_stats.host_bytes counts them);
 *   both ways: each message the plan sends or receives through StarPU-MPI, once;
 * and NCCL exactly the plan's messages of sp_nccl_calls. Nothing else: parameters,
 * gradients and optimizer state stay on the device, and host_bytes stays far below the
 * parameters. argv[1]: "nccl" (run with STARPIPE_NCCL_THRESHOLD=1: every boundary
 * tensor on NCCL, the tied embedding's messages on StarPU-MPI), "mpi" (two ranks on
 * one device: everything on StarPU-MPI), or "replicas" / "replicas-sharded": two
 * replicas of a pipeline of P/2 actors (with --shard-optimizer's ZeRO-1), where NCCL
 * must also move exactly the replicas' collectives, shards of whole tensors
 * (sp_optim_shards): reduce-scatter, then the all-gather of the reduced gradients
 * (or of the updated parameter shards), and none of it through the host.
 * Exits 77 when the fake device is not loaded (a real GPU, or a CPU-only build). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/exec.h"
#include "starpipe/models.h"
#include "starpipe/optim.h"
#include "starpipe/plan.h"
#include "starpipe/program.h"
#include "starpipe/train.h"
#include "tests/runtime/train_check.h"

enum { H2D, D2H, D2D, NCCL_SENT, NCCL_RECV, KERNELS, GEMMS, NCOUNTS };
typedef int (*stats_fn)(int dev, unsigned long long out[NCOUNTS]);
typedef int (*pinned_fn)(unsigned long long chunk, unsigned long long out[3]);

static int bad; /* FAIL (train_check.h) counts here */

/* The counters of every fake device of this process, summed (the rank uses one). */
static void counters(stats_fn f, unsigned long long sum[NCOUNTS])
{
    memset(sum, 0, sizeof(unsigned long long) * NCOUNTS);
    unsigned long long c[NCOUNTS];
    for (int d = 0; f(d, c) == 0; d++)
        for (int i = 0; i < NCOUNTS; i++) sum[i] += c[i];
}

int main(int argc, char **argv)
{
    const int replicated = argc > 1 && !strncmp(argv[1], "replicas", 8),
              sharded = argc > 1 && !strcmp(argv[1], "replicas-sharded"),
              nccl = replicated || (argc > 1 && !strcmp(argv[1], "nccl")), R = 1 + replicated;
    stats_fn stats_of = (stats_fn)dlsym(RTLD_DEFAULT, "starpipe_fake_gpu_stats");
    pinned_fn pinned_of = (pinned_fn)dlsym(RTLD_DEFAULT, "starpipe_fake_gpu_pinned");
    if (sp_exec_init(&argc, &argv, &(sp_exec_opts){ 0 }) != SP_OK) {
        fprintf(stderr, "init: %s\n", sp_last_error());
        return 1;
    }
    const int P = sp_exec_size() / R, me = sp_exec_rank(), m = 2 * P, steps = 6, warm = 3;
    if (!stats_of || !pinned_of || sp_exec_num_cuda() != 1) {
        if (me == 0)
            printf("SKIP: %s\n", !stats_of ? "not on the fake device (starpipe_fake_gpu_stats)"
                                          : "no CUDA worker");
        sp_exec_shutdown();
        return 77;
    }
    sp_status st;
    const char *name = argc > 2 ? argv[2] : "1f1b";
    const int v = !strcmp(name, "interleaved-1f1b") || !strcmp(name, "zb-v") ||
                  !strcmp(name, "dualpipe-v") ? 2 : 1, nstages = sp_schedule_builtin_stages(name, P, v);
    sp_gpt_config c = { .vocab = 256, .context = 16, .layers = 2 * nstages, .heads = 2,
                        .channels = 16, .batch = 2, .stages = nstages };
    sp_graph *g = nstages > 0 ? sp_model_gpt(&c, &st) : NULL;
    sp_program *p = g ? sp_program_build(g, &st) : NULL;
    sp_schedule *sch = NULL;
    if (!p || sp_schedule_builtin(name, P, m, v, &sch) != SP_OK) {
        fprintf(stderr, "setup: %s\n", sp_last_error());
        return 1;
    }
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    /* StarPU 1.3 takes host copies of 4 MiB or less in 16 KiB blocks from pinned chunks
     * of 32 MiB (datawizard/malloc.c: CHUNK_SIZE, CHUNK_ALLOC_MAX, CHUNK_ALLOC_MIN) */
    const unsigned long long chunk = 32ull << 20, chunk_max = chunk / 8, block = 16384;
    unsigned long long pin0[3]; /* before the trainer: what StarPU and MPI pinned */
    pinned_of(chunk, pin0);
    sp_trainer *t = sp_trainer_create(p, sch,
                                      &(sp_train_opts){ .opt = opt, .seed = 5, .replicas = R,
                                                        .shard_optimizer = sharded },
                                      &st);
    if (!t) {
        fprintf(stderr, "trainer: %s\n", sp_last_error());
        return 1;
    }
    if (nccl != sp_exec_groups_active())
        FAIL("NCCL is %s, the test expects it %s (%s)", sp_exec_groups_active() ? "on" : "off",
             nccl ? "on" : "off", sp_trainer_notice(t));
    /* the plan's messages of this rank in a step: on NCCL, and the rest (StarPU-MPI) */
    const sp_plan *pl = sp_trainer_plan(t);
    const sp_layout lay = sp_trainer_layout(t);
    int replica, actor;
    sp_layout_place(&lay, me, &replica, &actor);
    unsigned long long mpi_sent = 0, mpi_recv = 0, nccl_sent = 0, nccl_recv = 0;
    for (int j = 0; j < pl->ninstr[actor]; j++) {
        const sp_instr *in = &pl->instr[actor][j];
        if (in->op == SP_OP_SEND) mpi_sent += in->bytes;
        if (in->op == SP_OP_RECV) mpi_recv += in->bytes;
    }
    sp_nccl_call *calls = NULL;
    int ncalls = 0;
    if (sp_exec_groups_active() && sp_nccl_calls(pl, actor, 1, &calls, &ncalls) != SP_OK) {
        fprintf(stderr, "sp_nccl_calls: %s\n", sp_last_error());
        return 1;
    }
    /* the most host memory StarPU's copies of what StarPU-MPI moves can take: small ones
     * in chunks, large ones on their own */
    unsigned long long small = 0, large = 0;
    for (int j = 0; j < pl->ninstr[actor]; j++) {
        const sp_instr *in = &pl->instr[actor][j];
        int on_nccl = 0;
        for (int k = 0; k < ncalls; k++) on_nccl |= calls[k].instr == j;
        if ((in->op == SP_OP_SEND || in->op == SP_OP_RECV) && !on_nccl)
            *(in->bytes > chunk_max ? &large : &small) +=
                in->bytes > chunk_max ? in->bytes : (in->bytes + block - 1) / block * block;
    }
    const unsigned long long in_chunks = (small + chunk - 1) / chunk * chunk;
    for (int k = 0; k < ncalls; k++) {
        const int send = calls[k].op == SP_OP_SEND;
        *(send ? &nccl_sent : &nccl_recv) += calls[k].bytes;
        *(send ? &mpi_sent : &mpi_recv) -= calls[k].bytes;
    }
    free(calls);
    /* the replicas' collectives of each stage (runtime/replicas.c): this rank's part of
     * every other replica's shard out and their parts of its own in, then its reduced
     * (or updated) shard out to each and theirs in: the same bytes both ways */
    for (int s = 0; R > 1 && s < sp_program_num_stages(p); s++) {
        if (!sp_trainer_owns_stage(t, s)) continue;
        int64_t b[3];
        sp_optim_shards(p, s, R, b);
        int r = replica;
        unsigned long long own = (unsigned long long)(b[r + 1] - b[r]) * 4,
                           all = (unsigned long long)b[R] * 4;
        nccl_sent += (all - own) + (R - 1) * own;
        nccl_recv += (R - 1) * own + (all - own);
    }
    /* the host's share: inputs read by this rank's stages, losses, norm terms */
    const int np = sp_graph_num_params(g), S = sp_program_num_stages(p);
    unsigned long long h2d = 0, d2h = 0;
    size_t params = 0;
    for (int k = 0; k < sp_program_num_inputs(p); k++) {
        int used = 0;
        for (int s = 0; s < S; s++)
            for (int kind = SP_TASK_F; kind <= SP_TASK_BW && sp_trainer_owns_stage(t, s); kind++)
                for (int j = 0; j < sp_program_num_bufs(p, s, (sp_task_kind)kind); j++) {
                    sp_slab_ref r = sp_program_buf(p, s, (sp_task_kind)kind, j);
                    used |= r.cls == SP_BUF_INPUT && r.index == k;
                }
        if (used) h2d += (unsigned long long)m * sp_program_buf_bytes(p, SP_BUF_INPUT, k);
    }
    for (int s = 0; s < S; s++)
        if (sp_trainer_owns_stage(t, s)) {
            d2h += (unsigned long long)np * sizeof(double) +
                   (s == S - 1 ? (unsigned long long)m * sizeof(float) : 0);
            params += sp_program_buf_bytes(p, SP_BUF_PARAMS, s);
        }
    const int nin = sp_program_num_inputs(p);
    void **in = calloc((size_t)R * m * nin, sizeof *in);
    for (int i = 0; i < R * m * nin; i++) {
        in[i] = calloc((size_t)c.batch * c.context, sizeof(int32_t));
        for (int k = 0; k < c.batch * c.context; k++)
            ((int32_t *)in[i])[k] = (int32_t)(sp_mix64((uint64_t)(i * 131 + k)) % 256);
    }
    unsigned long long before[NCOUNTS] = { 0 }, after[NCOUNTS], pin[3];
    size_t host = 0;
    for (int step = 1; step <= steps && !bad; step++) {
        if (step == warm + 1) counters(stats_of, before);
        sp_step_stats s;
        if (sp_trainer_step(t, (const void *const *)in, &s) != SP_OK) {
            FAIL("step %d: %s", step, sp_last_error());
            break;
        }
        if (step > warm) host += s.host_bytes;
        if (step > warm && s.host_bytes * (size_t)(step - warm) != host)
            FAIL("step %d: the host touched %zu bytes, not as many as in step %d", step,
                 s.host_bytes, warm + 1);
    }
    counters(stats_of, after);
    pinned_of(chunk, pin);
    const int n = steps - warm;
    unsigned long long d[NCOUNTS];
    for (int i = 0; i < NCOUNTS; i++) d[i] = (after[i] - before[i]) / (unsigned long long)n;
    printf("rank %d: per step: host to device %llu bytes (inputs %llu, StarPU-MPI %llu), device "
           "to host %llu (losses and norm terms %llu, StarPU-MPI %llu); NCCL sent %llu received "
           "%llu (plan %llu, %llu); %llu kernels, %llu cuBLAS calls; host_bytes %zu, the "
           "rank's parameters %zu\n", me, d[H2D], h2d, mpi_recv, d[D2H], d2h, mpi_sent,
           d[NCCL_SENT], d[NCCL_RECV], nccl_sent, nccl_recv, d[KERNELS], d[GEMMS], host / n,
           params);
    if ((after[H2D] - before[H2D]) % n || (after[D2H] - before[D2H]) % n ||
        d[H2D] != h2d + mpi_recv || d[D2H] != d2h + mpi_sent)
        FAIL("steps %d-%d moved %llu bytes into the device and %llu out of it, expected "
             "%llu and %llu a step", warm + 1, steps, after[H2D] - before[H2D],
             after[D2H] - before[D2H], h2d + mpi_recv, d2h + mpi_sent);
    if (d[NCCL_SENT] != nccl_sent || d[NCCL_RECV] != nccl_recv)
        FAIL("NCCL moved %llu / %llu bytes a step, the plan %llu / %llu", d[NCCL_SENT],
             d[NCCL_RECV], nccl_sent, nccl_recv);
    if (nccl && !nccl_sent && !nccl_recv)
        FAIL("NCCL carries none of the plan's messages");
    if (!d[KERNELS] || !d[GEMMS])
        FAIL("no kernels (%llu) or cuBLAS calls (%llu) ran on the device", d[KERNELS], d[GEMMS]);
    /* Host memory: the buffers the host reads or writes (inputs, losses, the norm's
     * terms) in full, the transport's staging, and at most one host copy of each buffer
     * StarPU-MPI moved (StarPU's, `large` on their own and the small ones in chunks);
     * never the parameters, gradients, moments or activations. */
    unsigned long long host_min = 0;
    for (int k = 0; k < nin; k++)
        host_min += (unsigned long long)m * sp_program_buf_bytes(p, SP_BUF_INPUT, k);
    for (int s = 0; s < S; s++)
        if (sp_trainer_owns_stage(t, s))
            host_min += (unsigned long long)np * sizeof(double) +
                        (s == S - 1 ? (unsigned long long)m * sizeof(float) : 0);
    const unsigned long long host_max = host_min + large + sp_trainer_memory(t).staging,
                             own = (pin[0] - pin[2]) - (pin0[0] - pin0[2]),
                             chunks = pin[2] - pin0[2];
    printf("rank %d: pinned host memory: %llu bytes in blocks of their own (the host's buffers "
           "%llu, with large StarPU-MPI copies and staging at most %llu), %llu in StarPU's "
           "chunks (at most %llu); %llu before the trainer, peak %llu; the rank's slabs %zu\n",
           me, own, host_min, host_max, chunks, in_chunks, pin0[0], pin[1],
           (size_t)sp_trainer_memory(t).persistent);
    if (sp_trainer_memory(t).host != host_min)
        FAIL("the trainer says it holds %zu bytes of host memory, the host's buffers are %llu",
             sp_trainer_memory(t).host, host_min);
    if (own < host_min || own > host_max || chunks > in_chunks)
        FAIL("host memory pinned for the trainer: %llu bytes in blocks of their own and %llu "
             "in chunks, expected %llu to %llu and at most %llu", own, chunks, host_min,
             host_max, in_chunks);
    if (host / n >= params / 4)
        FAIL("the host touches %zu bytes a step, a quarter of the parameters (%zu)", host / n,
             params);
    for (int i = 0; i < R * m * nin; i++) free(in[i]);
    free(in);
    sp_trainer_free(t);
    sp_program_free(p);
    sp_graph_free(g);
    sp_schedule_free(sch);
    double any = bad;
    sp_exec_allreduce_sum(&any, 1, 1);
    sp_exec_shutdown();
    if (me == 0) printf("%s\n", any > 0 ? "FAIL" : "PASS");
    return any > 0;
}
