/* Start-up: MPI (tuned before it starts), the rank's GPU and cores, StarPU with the
 * ordered policy, StarPU-MPI and the transport. Relies on state.c, buslock.c, device.c
 * (the host's GPUs, cuBLAS), and runtime/binding.c, gpumap.c and launch.c. */
#define _GNU_SOURCE /* cpu_set_t (runtime/gpumap.h) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <starpu_mpi.h>

#include "base/env.h"
#include "codelets/cpu/kernels.h"
#include "runtime/binding_impl.h"
#include "runtime/exec/device.h"
#include "runtime/gpumap.h"
#include "runtime/launch.h"
#include "sched/policy.h"
#include "runtime/exec/exec_int.h"

/* STARPU_SCHED naming a built-in policy would silently replace ours: StarPU prefers the
 * variable to starpu_conf.sched_policy. Our order is a correctness property (the
 * schedule's memory bound and message order rest on it), so refuse rather than run. */
static sp_status check_sched_env(void)
{
    const char *s = getenv("STARPU_SCHED");
    if (!s)
        return SP_OK;
    if (strcmp(s, sp_policy.policy_name) == 0) {
        unsetenv("STARPU_SCHED"); /* StarPU does not know the name and would warn */
        return SP_OK;
    }
    return sp_set_error(SP_ERR_ARG, "STARPU_SCHED=%s would replace starpipe's ordered "
                        "scheduling policy; unset it or set it to \"starpipe\"", s);
}

/* The transport when STARPIPE_TRANSPORT says nothing (docs/transports.md). */
#define SP_DEFAULT_TRANSPORT "starpu-mpi"

/* STARPIPE_TRANSPORT: how messages travel (docs/transports.md), decided before MPI starts. */
static sp_env env;
static sp_status check_transport_env(void)
{
    sp_status st = sp_env_read(&env);
    if (st) return st;
    X.host = sp_transport_by_name(env.transport ? env.transport : SP_DEFAULT_TRANSPORT);
    X.group_threshold = env.nccl_threshold >= 0 ? (size_t)env.nccl_threshold : 65536;
    /* Large transfers between ranks of one node: eager pieces (1), or one message from a
     * copy as between nodes (0, what tests use to reach that path on one machine); unset,
     * pieces unless ranks share cores: a sender preempted half-way through its pieces
     * would hold the rest back for a time slice (docs/runtime.md, "Transfers"). */
    X.pieces = env.shm_pieces;
    return SP_OK;
}

/* The GPU of local rank lrank of lsize (runtime/gpumap.c), from what the CUDA runtime
 * sees: sp_exec_init's choice and sp_exec_expect_cuda's forecast of it. */
static sp_status pick_gpu(int lrank, int lsize, sp_gpu_choice *gpu)
{
    int ngpus = sp_exec_dev_count();
    return sp_gpu_choose(lrank, lsize, ngpus, env.gpu, getenv("CUDA_VISIBLE_DEVICES"), gpu);
}

/* This rank's GPU (runtime/gpumap.c) from what the CUDA runtime sees, and the CPUs near
 * it (hwloc, by the device's PCI address; empty when unknown). */
static sp_status choose_gpu(MPI_Comm node, sp_gpu_choice *gpu, cpu_set_t *near)
{
    int lrank, lsize;
    CPU_ZERO(near);
    SP_MPI_CHECK(MPI_Comm_rank(node, &lrank));
    SP_MPI_CHECK(MPI_Comm_size(node, &lsize));
    sp_status st = pick_gpu(lrank, lsize, gpu);
    char bus[64], where[64];
    if (st == SP_OK && gpu->device >= 0 && sp_exec_dev_pci(gpu->device, bus, sizeof bus)) {
        sp_binding_near(bus, near, where, sizeof where); /* empty: unknown, the plain split */
        size_t k = strlen(gpu->line);
        snprintf(gpu->line + k, sizeof gpu->line - k, ", PCI %s under %s", bus,
                 where[0] ? where : "an unknown node (hwloc does not list it)");
    }
    return st;
}

int sp_exec_expect_cuda(int local_rank, int local_size)
{
    if (sp_env_read(&env) != SP_OK || sp_exec_dev_select(env.device) != SP_OK) return 0;
    const sp_device_kind *k = sp_exec_dev_kind();
    if (!k || !k->starpu_count_var) return 0; /* the test device keeps all on the host */
    const char *n = getenv(k->starpu_count_var);
    if (n && !strcmp(n, "0")) return 0;
    sp_gpu_choice gpu;
    return pick_gpu(local_rank, local_size, &gpu) == SP_OK && gpu.device >= 0 &&
           strcmp(gpu.ncuda, "0") != 0;
}

/* The launcher's number of this process before MPI starts, or NULL */
static const char *launcher_rank(void)
{
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    if (!r) r = getenv("PMIX_RANK");
    if (!r) r = getenv("SLURM_PROCID");
    return r;
}

static sp_status exec_init(int *argc, char ***argv);

sp_status sp_exec_init(int *argc, char ***argv, const sp_exec_opts *opts)
{
    if (X.started)
        return sp_set_error(SP_ERR_ARG, "sp_exec_init: already initialized");
    memset(&X, 0, sizeof X);
    if (opts)
        X.opts = *opts;
    /* MPI's start-up waits for every rank: where two hosts cannot reach each other over
     * any transport MPI may use (a firewall, TCP left out), Open MPI 4 prints that it will
     * abort and then waits forever in the first communicator's creation (measured:
     * MPI_Comm_dup), and a rank that never starts holds the others in MPI_Init. Under
     * STARPIPE_STEP_TIMEOUT the start-up gets that long. */
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    const char *r = launcher_rank();
    sp_exec_deadline_arm(X.opts.watchdog_s, NULL, "starpipe: rank %s on %s: the start-up (MPI, "
                         "StarPU-MPI) did not end in %.1f s (STARPIPE_STEP_TIMEOUT): some "
                         "ranks cannot reach each other (a network between hosts closed to "
                         "MPI's transports?) or never started; leaving", r ? r : "?", host,
                         X.opts.watchdog_s);
    sp_status st = exec_init(argc, argv);
    sp_exec_deadline_disarm();
    return st;
}

static sp_status exec_init(int *argc, char ***argv)
{
    sp_status st = check_sched_env();
    if (!st)
        st = check_transport_env();
    if (!st) /* STARPIPE_DEVICE: the rank's device kind (codelets/devices.c) */
        st = sp_exec_dev_select(env.device);
    if (st)
        return st;

    int up = 0, level = 0;
    SP_MPI_CHECK(MPI_Initialized(&up));
    /* The library found at run time, not the headers' (Open MPI 4 and 5 share
     * libmpi.so.40): its parameters' names differ (runtime/launch.c), and another MPI,
     * or an Open MPI whose names we do not know, is left as it is. */
    sp_mpi_library mpi;
    sp_ompi_tuning tune;
    sp_launch_mpi_library(&mpi);
    int tuned = !up && sp_launch_ompi_tuning(&mpi, &tune);
    char mpi_line[256];
    if (tuned) {
        /* OpenMPI's polling never yields the core unless the node is oversubscribed, and
         * StarPU-MPI's progress thread polls while any request is pending: on a rank with
         * one core it took half of it from the worker (docs/runtime.md). Yielding costs
         * a system call per idle poll where the thread has a core of its own, and gives
         * the worker the core where it has not. A transport the rank's workers drive
         * (direct) has no such thread: only an idle worker polls, and it yields between
         * polls by itself. Only ours to set before MPI starts; a user's own choice
         * (mpirun --mca, the environment) wins. */
        if (!X.host->progress)
            setenv(tune.yield_when_idle, "1", 0);
        /* A pipeline message is written by the task just before its send, and its
         * receiver is often busy when it arrives. Above OpenMPI's 4 KB shared-memory eager
         * limit the receiver pulls it when it next polls (CMA, a system call pinning
         * every page: 25-45 us for 64 KB on the 2-core VM); eager, the sender copies it
         * into shared memory at once and the receiver only copies it out. Up to 128 KB
         * (the default GPT's 64 KB activations), halving their wait (docs/runtime.md);
         * larger transfers go as pieces of that size with direct (comm/direct.c). The
         * limit counts OpenMPI's header: SP_COMM_EAGER_LIMIT leaves it room beside 128 KB
         * of data. */
        char eager[32];
        snprintf(eager, sizeof eager, "%d", SP_COMM_EAGER_LIMIT);
        if (!tune.eager_alias || !getenv(tune.eager_alias))
            setenv(tune.eager_limit, eager, 0);
        if (!tune.max_send_alias || !getenv(tune.max_send_alias))
            setenv(tune.max_send_size, eager, 0);
        /* Between hosts the same messages go over TCP, whose eager limit is 64 KB with
         * the header: a 64 KB activation went by rendezvous, its first fragment answered
         * by the receiver's progress thread and the rest sent by the sender's, each when
         * it next got its core; raised alone, a 64 KB write did not fit the socket's
         * default buffer and waited for the sender's progress. Eager up to the same
         * limit, into buffers that take a whole message, the kernel carries it without
         * either rank: a 2-actor step between 2 hosts with a core each, 32.3 ms and
         * 1.39x its bound with instant messages, took 24.3 ms and 1.05x
         * (bench/README.md, "Links between hosts"). */
        setenv(tune.tcp_eager_limit, eager, 0);
        setenv(tune.tcp_rndv_eager_limit, eager, 0);
        setenv(tune.tcp_max_send_size, eager, 0); /* its default, 128 KB, is below */
        char sockbuf[32];
        snprintf(sockbuf, sizeof sockbuf, "%d", SP_COMM_TCP_SOCKET_BUFFER);
        setenv(tune.tcp_sndbuf, sockbuf, 0);
        setenv(tune.tcp_rcvbuf, sockbuf, 0);
        const char *lim = getenv(tune.eager_limit);
        if (!lim && tune.eager_alias) lim = getenv(tune.eager_alias);
        snprintf(mpi_line, sizeof mpi_line, "%s tuned (%s eager limit %s B; tcp eager limit "
                 "%s B, socket buffers %s B)", mpi.name, tune.btl, lim ? lim : "?",
                 getenv(tune.tcp_eager_limit), getenv(tune.tcp_sndbuf));
    } else {
        snprintf(mpi_line, sizeof mpi_line, "%s left as it is (%s)", mpi.name,
                 up ? "started before starpipe" : "not Open MPI 4 or 5");
    }
    /* STARPIPE_FAULT=late@RANK: this rank never comes (the tests of the start-up's
     * watchdog): the others wait in MPI's start-up, this one here */
    const char *launched = launcher_rank();
    if (env.fault.kind == SP_FAULT_LATE && launched && atoi(launched) == env.fault.step)
        nanosleep(&(struct timespec){ 3600, 0 }, NULL);
    if (!up) {
        /* srun without PMIx: Open MPI would abort in MPI_Init with its own text */
        if ((st = sp_launch_before_mpi()))
            return st;
        /* StarPU-MPI needs SERIALIZED (its progress thread and ours call MPI); MULTIPLE
         * also covers our agreement collectives while its thread is parked. */
        SP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &level));
        X.mpi_ours = 1;
    } else {
        SP_MPI_CHECK(MPI_Query_thread(&level));
    }
    if (level < MPI_THREAD_SERIALIZED)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: MPI gives thread level %d, StarPU-MPI "
                            "needs MPI_THREAD_SERIALIZED", __FILE__, __LINE__, level);
    /* A transport the workers drive calls MPI from every worker and the main thread at
     * once. */
    if (X.host->progress && level < MPI_THREAD_MULTIPLE) {
        if (env.transport)
            return sp_set_error(SP_ERR_RUNTIME, "STARPIPE_TRANSPORT=%s needs "
                                "MPI_THREAD_MULTIPLE; this MPI gives level %d", X.host->name,
                                level);
        X.host = &sp_transport_starpu_mpi;
    }
    SP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &sp_exec_rank_));
    SP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &sp_exec_size_));
    /* every rank's host, for the lines of a stall (a host gone names itself) */
    if (!(X.hosts = calloc((size_t)sp_exec_size_, sizeof *X.hosts)) ||
        !(X.sent_to = calloc((size_t)sp_exec_size_, sizeof *X.sent_to)))
        return sp_set_error(SP_ERR_NOMEM, "start-up: out of memory");
    char me[64] = "?";
    gethostname(me, sizeof me - 1);
    SP_MPI_CHECK(MPI_Allgather(me, 64, MPI_CHAR, X.hosts, 64, MPI_CHAR, MPI_COMM_WORLD));
    if ((st = sp_launch_after_mpi(sp_exec_size_))) /* P tasks, fewer ranks: say why */
        return st;
    SP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &X.comm));

    MPI_Comm node;
    SP_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL,
                                     &node));
    /* One GPU per rank: chosen from the rank's place on its host, before StarPU opens
     * any device; every rank agrees on the outcome (a bad STARPIPE_GPU seen by one rank
     * must not leave the others in StarPU's start-up collectives). */
    cpu_set_t near;
    sp_gpu_choice gpu;
    st = choose_gpu(node, &gpu, &near);
    int bad = st != SP_OK, any = 0;
    SP_MPI_CHECK(MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (any) {
        MPI_Comm_free(&node);
        return st ? st : sp_set_error(SP_ERR_ARG, "another rank could not choose its GPU "
                                      "(STARPIPE_GPU)");
    }
    sp_exec_dev_open(&gpu); /* a user's own StarPU settings win */
    sp_binding b;
    st = sp_binding_plan(node, X.opts.ncpus, CPU_COUNT(&near) ? &near : NULL,
                         sp_exec_dev_chosen(&gpu), &b);
    MPI_Comm_free(&node);
    if (st)
        return st;
    sp_binding_apply(&b);
    if (b.starved && b.local_rank == 0)
        fprintf(stderr, "starpipe: rank %d drives a GPU from one core, as its launcher bound it "
                "(the host's other ranks likely alike): its CUDA worker's polling thread, CPU "
                "worker and MPI progress thread share that core, which made steps 3x slower on "
                "an H200; give each rank several cores (mpirun --bind-to none or --map-by "
                "slot:PE=N, srun --cpus-per-task=N)\n", sp_exec_rank_);
    if (X.pieces < 0)
        X.pieces = !b.nobind; /* the same on every rank of the node */
    if (X.opts.verbose) {
        const char *y = getenv("OMPI_MCA_mpi_yield_when_idle");
        char host[256] = "?";
        gethostname(host, sizeof host - 1);
        fprintf(stderr, "starpipe: rank %d on %s (local %d of %d): %s; %d CPU worker(s), %s; "
                "messages %s; StarPU-MPI thread %s%s; MPI: %s\n", sp_exec_rank_, host,
                b.local_rank, b.local_size, gpu.line, b.nworkers, b.desc,
                X.host == &sp_transport_starpu_mpi
                    ? "over StarPU-MPI (detached transfers, its progress thread)"
                : X.pieces ? "direct (MPI requests tested by idle workers; large ones within "
                             "the node in eager pieces)"
                           : "direct (MPI requests tested by idle workers)",
                getenv("STARPU_MPI_NOBIND") ? "unbound" : "on its own core",
                y && strcmp(y, "0") ? ", yields when idle" : "", mpi_line);
    }

    /* Our policy never asks the performance models for predictions, so StarPU would
     * never record into them: record always (the user's STARPU_CALIBRATE wins). */
    setenv("STARPU_CALIBRATE", "1", 0);
    /* and keep them when a task's time moves by more than StarPU's default 50% (ranks
     * sharing cores, a noisy machine, a tensor-parallel task waiting for its group's
     * slowest member: 30x measured): StarPU would flush the history and say so on stderr
     * on every run */
    setenv("STARPU_HISTORY_MAX_ERROR", "100000", 0);
    /* A StarPU built with FxT (scripts/test-fxt builds one) traces every run in 1.3 unless
     * STARPU_FXT_TRACE=0 (src/common/fxt.c), each rank writing its trace at shutdown: a
     * trace only when the user asks for one (STARPU_FXT_TRACE=1). */
    setenv("STARPU_FXT_TRACE", "0", 0);
    struct starpu_conf conf;
    SP_STARPU_CHECK(starpu_conf_init(&conf));
    conf.sched_policy = &sp_policy;
#if STARPU_MAJOR_VERSION > 1 || STARPU_MINOR_VERSION >= 4
    conf.sched_policy_callback = sp_exec_bus_unlock; /* 1.4's name of sched_policy_init */
#else
    conf.sched_policy_init = sp_exec_bus_unlock;
#endif
    /* Every buffer StarPU allocates for us on the host (sp_exec_host_alloc, its own lazy
     * allocations) starts on a cache line: glibc's large mallocs start 16 bytes into a
     * page, so each 64-byte vector the kernels load or store straddled two lines, and the
     * large GPT config's steps were 7% slower on a Xeon (bench/README.md, "Aligned
     * buffers"). */
    starpu_malloc_set_align(64);
    sp_exec_bus_lock();
    int rc = starpu_mpi_init_conf(argc, argv, 0, MPI_COMM_WORLD, &conf);
    sp_exec_bus_unlock(0); /* in case starpu_init failed before creating the context */
    if (rc < 0)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: starpu_mpi_init_conf failed: %s",
                            __FILE__, __LINE__, strerror(-rc));
    /* The cache only serves starpu_mpi_task_insert's implicit transfers, which starpipe
     * never uses; with it off a stray use cannot serve stale data (tests/runtime). */
    SP_STARPU_CHECK(starpu_mpi_cache_set(0));
    sp_transport_config tc = { .world = MPI_COMM_WORLD, .pieces = X.pieces,
                               .poke = sp_policy_poke };
    int active = 0;
    char notice[256];
    if ((st = X.host->init(&tc, &active, notice, sizeof notice)))
        return st;
    if (!active)
        return sp_set_error(SP_ERR_RUNTIME, "transport %s cannot run: %s", X.host->name, notice);
    if (X.host->inflight) /* idle workers drive its requests while there are some */
        sp_policy_set_idle_poll(X.host->inflight);
    /* the device's workers found, its libraries started (CUDA: a cuBLAS handle per worker,
     * exact fp32 products unless STARPIPE_TF32=1 asks for TF32 tensor cores) */
    if ((st = sp_exec_dev_start(env.tf32)))
        return st;
    /* The CPU kernels' bits and speed must not depend on how the rank was launched:
     * OpenBLAS would otherwise run its own thread pool inside our tasks whenever the
     * launcher leaves the rank more than one core (--bind-to none, -np > 2). */
    sp_kernels_init();
    /* A clock origin shared by every rank, for traces and message latencies: one host's
     * ranks read the same monotonic clock, so the skew is the barrier's exit skew. */
    SP_MPI_CHECK(MPI_Barrier(X.comm));
    X.epoch = starpu_timing_now();
    X.started = 1;
    return SP_OK;
}
