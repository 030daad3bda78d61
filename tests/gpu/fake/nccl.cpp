/* NCCL of the fake device (README.md): point-to-point transfers between processes over
 * MPI, with NCCL's ABI (libnccl.so.2, built against the toolkit's nccl.h). A group of
 * ncclSend/ncclRecv is one operation on its stream (../emu/runtime.cpp): when it reaches
 * the head of the stream its MPI requests are posted, and the stream waits until they
 * complete, polled whenever the runtime is asked about completion. So a stream blocks
 * on a transfer as a GPU's does, while the host thread goes on; MPI keeps the order of
 * messages between two ranks, as NCCL's channels do.
 * Only what starpipe uses: communicators from ncclCommInitRank (collective over every
 * rank of MPI_COMM_WORLD, which must be initialised with MPI_THREAD_MULTIPLE), groups,
 * ncclSend and ncclRecv; no collectives. ncclCommInitRank refuses two ranks on one GPU
 * of one host as NCCL 2.28 does, host and GPU identified as NCCL identifies them (written
 * here from NCCL's sources, apart from comm/nccl_peers.c, so that a wrong decision of
 * starpipe's fails here). */
#include <ctype.h>
#include <mpi.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <vector>

#include "emu.h"

struct ncclComm {
    MPI_Comm mpi;
    int rank, size, dev;
    int pending;              /* groups enqueued and not finished */
    ncclResult_t async_error; /* an MPI failure inside a transfer */
};

static const char magic[] = "starpipe fake NCCL id";
static thread_local char last_error[256];

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    fprintf(stderr, "NCCL (fake) WARN %s\n", last_error);
    return r;
}

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

/* ---- a thread's open group: the calls since ncclGroupStart ---- */
struct call {
    ncclComm_t comm;
    cudaStream_t stream;
    bool send;
    void *buf;
    size_t bytes;
    int peer;
};
static thread_local int group_depth;
static thread_local std::vector<call> *group_calls;

struct transfer { /* one group's calls on one stream, once enqueued */
    ncclComm_t comm;
    std::vector<call> calls;
    std::vector<MPI_Request> reqs;
    unsigned long long issued; /* its place among the device's operations, all communicators */
};

/* The order of a device's NCCL operations (under the emulation's lock): how many were
 * issued, which have not ended, and how many began (reached their stream's head) while
 * one issued before them, of any communicator and stream, had not ended. starpipe runs
 * them one at a time in issue order (comm/nccl_chain.h); the report says how it went. */
static struct device_order {
    unsigned long long issued, began_early;
    std::set<unsigned long long> open;
} order[64];

static void post(transfer &t)
{
    device_order &o = order[t.comm->dev & 63];
    if (!o.open.empty() && *o.open.begin() < t.issued)
        o.began_early++;
    t.reqs.assign(t.calls.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < t.calls.size(); i++) {
        const call &c = t.calls[i];
        int rc = c.send ? MPI_Isend(c.buf, (int)c.bytes, MPI_BYTE, c.peer, 0, t.comm->mpi, &t.reqs[i])
                        : MPI_Irecv(c.buf, (int)c.bytes, MPI_BYTE, c.peer, 0, t.comm->mpi, &t.reqs[i]);
        if (rc != MPI_SUCCESS)
            t.comm->async_error = fail(ncclSystemError, "rank %d: MPI_I%s to rank %d failed",
                                       t.comm->rank, c.send ? "send" : "recv", c.peer);
    }
}

static bool finished(transfer &t)
{
    int done = 0;
    if (MPI_Testall((int)t.reqs.size(), t.reqs.data(), &done, MPI_STATUSES_IGNORE) !=
        MPI_SUCCESS) {
        t.comm->async_error = fail(ncclSystemError, "rank %d: MPI_Testall failed", t.comm->rank);
        done = 1;
    }
    if (!done)
        return false;
    for (const call &c : t.calls)
        sp_emu_count(t.comm->dev, c.send ? SP_EMU_NCCL_SENT : SP_EMU_NCCL_RECV, c.bytes);
    sp_emu_check_fences("ncclRecv");
    order[t.comm->dev & 63].open.erase(t.issued);
    t.comm->pending--;
    return true;
}

static ncclResult_t enqueue(std::vector<call> &calls)
{
    sp_emu_guard g(sp_emu_mutex());
    /* one operation per stream, in the order of the calls */
    while (!calls.empty()) {
        auto t = std::make_shared<transfer>();
        t->comm = calls[0].comm;
        const cudaStream_t s = calls[0].stream;
        std::vector<call> rest;
        for (const call &c : calls)
            (c.stream == s && c.comm == t->comm ? t->calls : rest).push_back(c);
        calls.swap(rest);
        t->comm->pending++;
        device_order &o = order[t->comm->dev & 63];
        t->issued = ++o.issued;
        o.open.insert(t->issued);
        int e = sp_emu_submit(s, sp_emu_op{ "NCCL group", [t]() { post(*t); },
                                            [t]() { return finished(*t); } });
        if (e) {
            t->comm->pending--;
            order[t->comm->dev & 63].open.erase(t->issued);
            return fail(ncclInvalidArgument, "the stream %p is not a live stream", (void *)s);
        }
    }
    return ncclSuccess;
}

static ncclResult_t p2p(bool send, const void *buf, size_t count, ncclDataType_t type, int peer,
                        ncclComm_t comm, cudaStream_t stream)
{
    const char *name = send ? "ncclSend" : "ncclRecv";
    if (!comm)
        return fail(ncclInvalidArgument, "%s: no communicator", name);
    const size_t ts = type_size(type);
    if (!ts)
        return fail(ncclInvalidArgument, "%s: unknown data type %d", name, (int)type);
    if (peer < 0 || peer >= comm->size)
        return fail(ncclInvalidArgument, "%s: peer %d of a communicator of %d ranks", name, peer,
                    comm->size);
    if (count > (size_t)0x7fffffff / ts)
        return fail(ncclInvalidArgument, "%s: %zu elements: the fake moves at most 2 GiB a call",
                    name, count);
    {
        sp_emu_guard g(sp_emu_mutex());
        int dev = -1;
        if (count && (!sp_emu_dev_find(buf, count * ts, &dev) || dev != comm->dev))
            return fail(ncclInvalidArgument, "%s: buffer %p (%zu bytes) is not memory of "
                        "device %d", name, buf, count * ts, comm->dev);
        if (sp_emu_stream_device(stream) != comm->dev)
            return fail(ncclInvalidArgument, "%s: the stream is not one of device %d", name,
                        comm->dev);
    }
    call c{ comm, stream, send, (void *)buf, count * ts, peer };
    if (group_depth) {
        group_calls->push_back(c);
        return ncclSuccess;
    }
    std::vector<call> one{ c };
    return enqueue(one);
}

/* With STARPIPE_FAKE_GPU_REPORT, at exit: each device's NCCL operations and how many
 * began before an earlier-issued one had ended. */
static void report_order(void)
{
    for (int d = 0; d < 64; d++)
        if (order[d].issued)
            fprintf(stderr, "starpipe fake NCCL (pid %d): device %d: %llu operations, %llu began "
                    "before one issued earlier had ended\n", (int)getpid(), d, order[d].issued,
                    order[d].began_early);
}

__attribute__((constructor)) static void fake_nccl_loaded(void)
{
    if (getenv("STARPIPE_FAKE_GPU_REPORT"))
        atexit(report_order);
}

extern "C" {

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) { return last_error; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id)
        return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    memcpy(id->internal, magic, sizeof magic);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const long long salt[3] = { (long long)getpid(), (long long)ts.tv_sec, (long long)ts.tv_nsec };
    memcpy(id->internal + 64, salt, sizeof salt);
    return ncclSuccess;
}

/* NCCL's host string (src/misc/utils.cc, getHostHashOnce): NCCL_HOSTID when set, else the
 * whole hostname (getHostName's delimiter is '\0') and the first word of the boot id. The
 * fake reads NCCL_HOSTID from the environment only (NCCL also reads its nccl.conf files). */
static void host_string(char *s, size_t len)
{
    if (gethostname(s, len) != 0)
        snprintf(s, len, "unknown");
    s[len - 1] = '\0';
    if (const char *id = getenv("NCCL_HOSTID")) {
        snprintf(s, len, "%s", id);
        return;
    }
    if (FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r")) {
        char word[128];
        size_t n = strlen(s);
        if (fscanf(f, "%127s", word) == 1)
            snprintf(s + n, len - n, "%s", word);
        fclose(f);
    }
}

/* NCCL's busIdToInt64: the hex digits, ':' and '.' skipped. */
static int64_t bus_number(const char *bus)
{
    char hex[17];
    int n = 0;
    for (const char *c = bus; *c && n < 16; c++) {
        if (*c == ':' || *c == '.')
            continue;
        if (!isxdigit((unsigned char)*c))
            break;
        hex[n++] = *c;
    }
    hex[n] = '\0';
    return strtoll(hex, NULL, 16);
}

/* NCCL's check after its first allgather (src/init.cc, initTransportsRank): a rank that
 * shares its host and bus id with another fails with ncclInvalidUsage. The fake's ranks
 * all answer the same (an allreduce): NCCL's others would wait in the next collective. */
static ncclResult_t duplicate_gpu(MPI_Comm c, int rank, int size, int dev)
{
    struct peer {
        char host[1024];
        int64_t bus;
    } me{};
    char bus[32] = "";
    host_string(me.host, sizeof me.host);
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess)
        return fail(ncclUnhandledCudaError, "ncclCommInitRank: no bus id for device %d", dev);
    me.bus = bus_number(bus);
    std::vector<peer> all((size_t)size);
    if (MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all.data(), (int)sizeof me, MPI_BYTE, c) !=
        MPI_SUCCESS)
        return fail(ncclSystemError, "ncclCommInitRank: MPI_Allgather failed");
    int other = -1;
    for (int i = 0; i < size && other < 0; i++)
        if (i != rank && all[i].bus == me.bus && !strcmp(all[i].host, me.host))
            other = i;
    int bad = other >= 0, any = 0;
    if (MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, c) != MPI_SUCCESS)
        return fail(ncclSystemError, "ncclCommInitRank: MPI_Allreduce failed");
    if (bad)
        return fail(ncclInvalidUsage, "Duplicate GPU detected : rank %d and rank %d both on "
                    "CUDA device %lx", rank, other, (long)me.bus);
    if (any)
        return fail(ncclInvalidUsage, "ncclCommInitRank: another rank shares its GPU (the "
                    "fake's stand-in for NCCL's hang in its next bootstrap collective)");
    return ncclSuccess;
}

/* Collective over MPI_COMM_WORLD: the ranks holding the same id form the communicator. */
ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
    if (!out || nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
    if (memcmp(id.internal, magic, sizeof magic))
        return fail(ncclInvalidArgument, "ncclCommInitRank: not an id of ncclGetUniqueId");
    int up = 0, level = 0, devices = 0;
    if (MPI_Initialized(&up) != MPI_SUCCESS || !up || MPI_Query_thread(&level) != MPI_SUCCESS ||
        level < MPI_THREAD_MULTIPLE)
        return fail(ncclInvalidUsage, "the fake NCCL runs over MPI: MPI must be initialised "
                    "with MPI_THREAD_MULTIPLE before ncclCommInitRank");
    const int dev = sp_emu_current_device();
    if (cudaGetDeviceCount(&devices) != cudaSuccess || dev >= devices)
        return fail(ncclUnhandledCudaError, "ncclCommInitRank: no device %d", dev);
    uint32_t color = 2166136261u; /* FNV-1a of the id */
    for (size_t i = 0; i < sizeof id.internal; i++)
        color = (color ^ (unsigned char)id.internal[i]) * 16777619u;
    MPI_Comm c;
    if (MPI_Comm_split(MPI_COMM_WORLD, (int)(color & 0x7fffffff), rank, &c) != MPI_SUCCESS)
        return fail(ncclSystemError, "ncclCommInitRank: MPI_Comm_split failed");
    int size = 0, me = -1;
    MPI_Comm_size(c, &size);
    MPI_Comm_rank(c, &me);
    if (size != nranks || me != rank) {
        MPI_Comm_free(&c);
        return fail(ncclInvalidUsage, "ncclCommInitRank: rank %d of %d, but %d MPI ranks hold "
                    "this id and this one is their rank %d (every rank of MPI_COMM_WORLD must "
                    "call it, each with its own rank)", rank, nranks, size, me);
    }
    if (ncclResult_t r = duplicate_gpu(c, rank, nranks, dev)) {
        MPI_Comm_free(&c);
        return r;
    }
    *out = new ncclComm{ c, rank, nranks, dev, 0, ncclSuccess };
    return ncclSuccess;
}

/* Waits for the communicator's transfers, as NCCL does. */
/* As destroy, without waiting for pending operations (they are the reason to abort). */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    MPI_Comm_free(&comm->mpi);
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    {
        sp_emu_guard g(sp_emu_mutex());
        sp_emu_wait([comm]() { return comm->pending == 0; });
    }
    MPI_Comm_free(&comm->mpi);
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return ncclInvalidArgument;
    *count = comm->size;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm || !device)
        return ncclInvalidArgument;
    *device = comm->dev;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error)
{
    if (!comm || !error)
        return ncclInvalidArgument;
    sp_emu_guard g(sp_emu_mutex());
    *error = comm->async_error;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void)
{
    if (!group_calls)
        group_calls = new std::vector<call>;
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (!group_depth)
        return fail(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart");
    if (--group_depth)
        return ncclSuccess;
    std::vector<call> calls;
    calls.swap(*group_calls);
    return enqueue(calls);
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return p2p(true, buf, count, type, peer, comm, stream);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return p2p(false, buf, count, type, peer, comm, stream);
}

} /* extern "C" */
