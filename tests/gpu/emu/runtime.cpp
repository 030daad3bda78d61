/* The CUDA runtime of the emulation (README.md): devices, streams as in-order queues,
 * events, device and pinned memory, copies. Compiled twice: against include/ here, for
 * the emulation in every build (the calls codelets/cuda and tests/gpu make), and
 * against the CUDA toolkit's headers for the fake device (../fake/: libcudart.so.13 with
 * the real ABI, where CUDART_VERSION is defined), which adds what StarPU's CUDA driver
 * calls. Device memory is host memory; an operation runs as soon as it reaches the head
 * of its stream, so everything completes before the call returns unless a stream waits
 * for an NCCL transfer (../fake/nccl.cpp) or an event of such a stream. */
#include <cuda_runtime_api.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "emu.h"

#define MAX_DEVICES 16

std::recursive_mutex &sp_emu_mutex(void)
{
    static std::recursive_mutex *m = new std::recursive_mutex; /* never destroyed: StarPU's
                                                                  threads may outlive exit */
    return *m;
}

static thread_local int last_error = cudaSuccess;
static thread_local int current_device = 0;

void sp_emu_set_error(int e) { last_error = e; }
int sp_emu_current_device(void) { return current_device; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- devices: STARPIPE_FAKE_GPUS of them (default 1), STARPIPE_FAKE_GPU_MIB each ---- */

static long env_count(const char *name, long dflt, long lo, long hi)
{
    const char *v = getenv(name);
    if (!v)
        return dflt;
    char *end;
    long n = strtol(v, &end, 10);
    if (!*v || *end || n < lo || n > hi)
        sp_emu_die("%s=%s: expected a whole number from %ld to %ld", name, v, lo, hi);
    return n;
}

/* CUDA_MODULE_LOADING as the runtime's first call found it (a real runtime reads it
 * then, once): the report says it, so tests see what a GPU's runtime would have used. */
static char module_loading[32];

static int ndevices(void)
{
    static int n = -1;
    if (n < 0) {
        const char *v = getenv("CUDA_MODULE_LOADING");
        snprintf(module_loading, sizeof module_loading, "%s", v ? v : "(unset)");
        n = (int)env_count("STARPIPE_FAKE_GPUS", 1, 0, MAX_DEVICES);
    }
    return n;
}

static size_t device_bytes(void)
{
    static size_t b = 0;
    if (!b)
        b = (size_t)env_count("STARPIPE_FAKE_GPU_MIB", 4096, 1, 1 << 20) << 20;
    return b;
}

static int bad_device(int d) { return d < 0 || d >= ndevices(); }

static unsigned long long counts[MAX_DEVICES][SP_EMU_NCOUNTS];

void sp_emu_count(int dev, int what, size_t n)
{
    if (dev >= 0 && dev < MAX_DEVICES && what >= 0 && what < SP_EMU_NCOUNTS)
        counts[dev][what] += n;
}

/* ---- streams ---- */

struct queued {
    uint64_t seq;
    sp_emu_op op;
    std::vector<std::pair<std::shared_ptr<struct CUstream_st>, uint64_t>> deps;
    bool started;
};

struct CUstream_st {
    int dev;
    unsigned flags;
    bool live, legacy;
    uint64_t enq, done; /* operations enqueued and finished, in order */
    std::deque<queued> q;
};

typedef std::shared_ptr<CUstream_st> stream_ref;
static std::vector<stream_ref> &streams(void) /* live ones, and destroyed ones still busy */
{
    static std::vector<stream_ref> *v = new std::vector<stream_ref>;
    return *v;
}
static stream_ref legacy[MAX_DEVICES];

static stream_ref new_stream(int dev, unsigned flags, bool is_legacy)
{
    stream_ref s = std::make_shared<CUstream_st>();
    s->dev = dev;
    s->flags = flags;
    s->live = true;
    s->legacy = is_legacy;
    s->enq = s->done = 0;
    streams().push_back(s);
    return s;
}

/* NULL, cudaStreamLegacy (1) and cudaStreamPerThread (2, not emulated apart) are the
 * current device's legacy stream. */
static stream_ref find_stream(const void *h)
{
    if ((uintptr_t)h <= 2) {
        int d = current_device;
        if (bad_device(d))
            return nullptr;
        if (!legacy[d])
            legacy[d] = new_stream(d, 0, true);
        return legacy[d];
    }
    for (auto &s : streams())
        if (s.get() == h && s->live && !s->legacy)
            return s;
    return nullptr;
}

static bool ready(const queued &o)
{
    for (auto &d : o.deps)
        if (d.first->done < d.second)
            return false;
    return true;
}

static int in_progress;

/* Runs every operation that can run, until none can. */
static void progress(void)
{
    if (in_progress)
        return; /* an operation's own calls: the loop below sees their work */
    in_progress = 1;
    for (bool moved = true; moved;) {
        moved = false;
        for (size_t i = 0; i < streams().size(); i++) {
            stream_ref s = streams()[i];
            while (!s->q.empty()) {
                queued &h = s->q.front();
                if (!h.started) {
                    if (!ready(h))
                        break;
                    h.started = true;
                    if (h.op.start)
                        h.op.start();
                }
                if (h.op.poll && !h.op.poll())
                    break;
                s->done = h.seq;
                s->q.pop_front();
                moved = true;
            }
        }
    }
    auto &v = streams();
    for (size_t i = 0; i < v.size();)
        if (!v[i]->live && v[i]->q.empty())
            v.erase(v.begin() + (long)i);
        else
            i++;
    in_progress = 0;
}

/* Enqueues op; returns its sequence number on s. The legacy stream waits for the
 * device's blocking streams and they for it (CUDA's implicit synchronization). */
static uint64_t enqueue(const stream_ref &s, sp_emu_op op)
{
    queued o{ ++s->enq, std::move(op), {}, false };
    if (s->legacy) {
        for (auto &b : streams())
            if (b->live && !b->legacy && b->dev == s->dev && !(b->flags & cudaStreamNonBlocking) &&
                b->done < b->enq)
                o.deps.push_back({ b, b->enq });
    } else if (!(s->flags & cudaStreamNonBlocking) && legacy[s->dev] &&
               legacy[s->dev]->done < legacy[s->dev]->enq) {
        o.deps.push_back({ legacy[s->dev], legacy[s->dev]->enq });
    }
    s->q.push_back(std::move(o));
    progress();
    return s->enq;
}

int sp_emu_submit(void *stream, sp_emu_op op, int count_as)
{
    sp_emu_guard g(sp_emu_mutex());
    stream_ref s = find_stream(stream);
    if (!s)
        return cudaErrorInvalidResourceHandle;
    sp_emu_count(s->dev, count_as, 1);
    enqueue(s, std::move(op));
    return cudaSuccess;
}

int sp_emu_stream_device(void *stream)
{
    sp_emu_guard g(sp_emu_mutex());
    stream_ref s = find_stream(stream);
    return s ? s->dev : -1;
}

void sp_emu_wait(const std::function<bool()> &done)
{
    std::recursive_mutex &m = sp_emu_mutex();
    if (in_progress)
        sp_emu_die("a CUDA call that waits, made by a stream operation (a host function)");
    for (int spins = 0;; spins++) {
        progress();
        if (done())
            return;
        m.unlock(); /* let the other threads in while the peer process catches up */
        if (spins < 100) {
            sched_yield();
        } else {
            struct timespec ts = { 0, 50000 };
            nanosleep(&ts, NULL);
        }
        m.lock();
    }
}

static bool idle(const stream_ref &s) { return s->done == s->enq; }

static bool device_idle(int dev)
{
    for (auto &s : streams())
        if (s->dev == dev && !idle(s))
            return false;
    return true;
}

static void wait_seq(const stream_ref &s, uint64_t seq)
{
    sp_emu_wait([&]() { return s->done >= seq; });
}

/* ---- pointers: which side of the bus a range lies on ---- */

enum { HOST, DEVICE, BAD };
static int side(const void *p, size_t bytes)
{
    if (!sp_emu_dev_find(p, 0, NULL))
        return HOST;
    return sp_emu_dev_find(p, bytes, NULL) ? DEVICE : BAD;
}

static const char *kind_name(int kind)
{
    static const char *n[] = { "cudaMemcpyHostToHost", "cudaMemcpyHostToDevice",
                               "cudaMemcpyDeviceToHost", "cudaMemcpyDeviceToDevice",
                               "cudaMemcpyDefault" };
    return kind >= 0 && kind <= 4 ? n[kind] : "an unknown kind";
}

/* The strict (fake device) check of a copy's two ranges against its kind; the counter
 * the copy adds to (-1: none, host to host). -2 after printing what is wrong. */
static int copy_sides(const char *call, void *dst, size_t dbytes, const void *src,
                      size_t sbytes, int kind)
{
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return -2;
    int ds = side(dst, dbytes), ss = side(src, sbytes);
    if (!sp_emu_strict) { /* host memory serves as device memory: trust the kind */
        ds = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice ? DEVICE : HOST;
        ss = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice ? DEVICE : HOST;
    }
    const char *what = NULL;
    if (ds == BAD || ss == BAD)
        what = ds == BAD ? "the destination runs past the end of its cudaMalloc block"
                         : "the source runs past the end of its cudaMalloc block";
    else if ((kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice) && ds != DEVICE)
        what = "the destination is not device memory";
    else if ((kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice) && ss != DEVICE)
        what = "the source is not device memory";
    else if ((kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost) && ds != HOST)
        what = "the destination is device memory";
    else if ((kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost) && ss != HOST)
        what = "the source is device memory";
    if (what) {
        fprintf(stderr, "EMU: %s(%p <- %p, %zu bytes, %s): %s\n", call, dst, src, sbytes,
                kind_name(kind), what);
        return -2;
    }
    return ds == DEVICE ? (ss == DEVICE ? SP_EMU_D2D : SP_EMU_H2D)
                        : (ss == DEVICE ? SP_EMU_D2H : -1 /* host to host */);
}

/* Rows of a (2D or 3D) copy: height x depth rows of width bytes. */
struct rows {
    char *dst;
    const char *src;
    size_t dpitch, spitch, width, height, depth, dslice, sslice; /* slice: rows apart */
};

static void copy_rows(const rows &r)
{
    for (size_t z = 0; z < r.depth; z++)
        for (size_t y = 0; y < r.height; y++)
            memmove(r.dst + (z * r.dslice + y) * r.dpitch, r.src + (z * r.sslice + y) * r.spitch,
                    r.width);
}

static size_t span(size_t pitch, size_t width, size_t height, size_t depth, size_t slice)
{
    if (!width || !height || !depth)
        return 0;
    return ((depth - 1) * slice + height - 1) * pitch + width;
}

/* Enqueues the copy of r on stream h after the checks; waits when sync. */
static cudaError_t copy(const char *call, const rows &r, int kind, const void *h, bool sync,
                        int dev_of_count)
{
    sp_emu_guard g(sp_emu_mutex());
    const size_t db = span(r.dpitch, r.width, r.height, r.depth, r.dslice),
                 sb = span(r.spitch, r.width, r.height, r.depth, r.sslice);
    if ((db && (!r.dst || !r.src)) || r.width > r.dpitch || r.width > r.spitch)
        return cudaErrorInvalidValue;
    int counter = copy_sides(call, r.dst, db, r.src, sb, kind);
    if (counter == -2)
        return kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault
                   ? cudaErrorInvalidMemcpyDirection
                   : cudaErrorInvalidValue;
    stream_ref s = find_stream(h);
    if (!s)
        return cudaErrorInvalidResourceHandle;
    const int dev = dev_of_count >= 0 ? dev_of_count : s->dev;
    static const int trace = getenv("STARPIPE_FAKE_GPU_TRACE") != NULL;
    uint64_t seq = enqueue(s, sp_emu_op{ call, [r, counter, dev, call, sb]() {
                                            if (trace)
                                                fprintf(stderr, "EMU trace: device %d: %s, %zu "
                                                        "bytes, %s\n", dev, call, sb,
                                                        counter == SP_EMU_H2D ? "host to device"
                                                        : counter == SP_EMU_D2H ? "device to host"
                                                        : counter == SP_EMU_D2D ? "device to device"
                                                        : "host to host");
                                            copy_rows(r);
                                            sp_emu_count(dev, counter, sb);
                                            sp_emu_check_fences(call);
                                        }, {} });
    if (sync)
        wait_seq(s, seq);
    return cudaSuccess;
}

static rows linear(void *dst, const void *src, size_t bytes)
{
    return rows{ (char *)dst, (const char *)src, bytes, bytes, bytes, 1, 1, 1, 1 };
}

static cudaError_t set(void *p, int value, size_t bytes, const void *h, bool sync)
{
    sp_emu_guard g(sp_emu_mutex());
    if (bytes && !p)
        return cudaErrorInvalidValue;
    if (sp_emu_strict && bytes && side(p, bytes) != DEVICE) {
        fprintf(stderr, "EMU: cudaMemset(%p, %zu bytes): not inside one cudaMalloc block\n", p,
                bytes);
        return cudaErrorInvalidValue;
    }
    stream_ref s = find_stream(h);
    if (!s)
        return cudaErrorInvalidResourceHandle;
    uint64_t seq = enqueue(s, sp_emu_op{ "cudaMemset", [p, value, bytes]() {
                                            memset(p, value, bytes);
                                            sp_emu_check_fences("cudaMemset");
                                        }, {} });
    if (sync)
        wait_seq(s, seq);
    return cudaSuccess;
}

/* Events: complete when the stream has run the operation that recorded them (never
 * recorded: complete, as in CUDA). Each record gets a fresh time slot, which its
 * operation fills when it runs. */
struct CUevent_st {
    unsigned flags;
    stream_ref s;
    uint64_t seq;
    std::shared_ptr<double> t;
};

static bool complete(const cudaEvent_t e) { return !e->s || e->s->done >= e->seq; }

/* The errors this runtime returns, with CUDA's names and messages. */
static const struct cuda_error {
    int code;
    const char *name, *text;
} errors[] = {
    { cudaSuccess, "cudaSuccess", "no error" },
    { cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument" },
    { cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory" },
    { cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
      "invalid configuration argument" },
    { cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
      "invalid copy direction for memcpy" },
    { cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected" },
    { cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal" },
    { cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle",
      "invalid resource handle" },
    { cudaErrorNotReady, "cudaErrorNotReady", "device not ready" },
    { 704, "cudaErrorPeerAccessAlreadyEnabled", "peer access is already enabled" },
    { 705, "cudaErrorPeerAccessNotEnabled", "peer access has not been enabled" },
    { 712, "cudaErrorHostMemoryAlreadyRegistered",
      "part or all of the requested memory range is already mapped" },
    { 713, "cudaErrorHostMemoryNotRegistered",
      "pointer does not correspond to a registered memory region" },
    { cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported" },
};

static const cuda_error *error_of(int e)
{
    static const cuda_error unknown = { -1, "cudaErrorUnknown", "unrecognized error code" };
    for (const cuda_error &x : errors)
        if (x.code == e)
            return &x;
    return &unknown;
}

extern "C" {

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    sp_emu_guard g(sp_emu_mutex());
    if (!ptr)
        return cudaErrorInvalidValue;
    const int d = current_device;
    if (bad_device(d))
        return cudaErrorNoDevice;
    if (bytes > device_bytes() - sp_emu_dev_used(d))
        return cudaErrorMemoryAllocation;
    *ptr = sp_emu_dev_alloc(d, bytes);
    return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

/* As in CUDA, it waits for the device to finish first. */
cudaError_t cudaFree(void *ptr)
{
    sp_emu_guard g(sp_emu_mutex());
    if (!ptr)
        return cudaSuccess;
    int dev = -1;
    if (sp_emu_dev_find(ptr, 0, &dev))
        sp_emu_wait([dev]() { return device_idle(dev); });
    if (sp_emu_dev_free(ptr)) {
        fprintf(stderr, "EMU: cudaFree(%p): not from cudaMalloc, or freed before\n", ptr);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

/* Stream-ordered allocation: the block exists at once (nothing can use it before the
 * stream reaches the user anyway) and is freed when the stream reaches the free. */
cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream)
{
    (void)stream;
    return cudaMalloc(ptr, bytes);
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    if (!ptr)
        return cudaSuccess;
    if (!sp_emu_dev_find(ptr, 0, NULL))
        return cudaErrorInvalidValue;
    return sp_emu_submit(stream, sp_emu_op{ "cudaFreeAsync", [ptr]() { sp_emu_dev_free(ptr); }, {} })
               ? cudaErrorInvalidResourceHandle
               : cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    if (least) *least = 0;
    if (greatest) *greatest = -1; /* one higher priority, as a GPU has (no effect here) */
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    return copy("cudaMemcpyAsync", linear(dst, src, bytes), kind, stream, false, -1);
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream)
{
    return set(ptr, value, bytes, stream, false);
}

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return cudaErrorInvalidValue;
    *count = ndevices();
    return *count ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (!prop)
        return cudaErrorInvalidValue;
    if (bad_device(device))
        return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "starpipe fake device %d (CPU emulation)", device);
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 1; /* blocks run one at a time */
#ifdef CUDART_VERSION
    prop->totalGlobalMem = device_bytes();
    prop->sharedMemPerBlock = prop->sharedMemPerBlockOptin = 48 << 10;
    prop->sharedMemPerMultiprocessor = 48 << 10;
    prop->regsPerBlock = prop->regsPerMultiprocessor = 65536;
    prop->warpSize = 32;
    prop->memPitch = (size_t)1 << 31;
    prop->maxThreadsPerBlock = prop->maxThreadsPerMultiProcessor = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->totalConstMem = 64 << 10;
    prop->textureAlignment = 512;
    prop->texturePitchAlignment = 32;
    prop->canMapHostMemory = 1;
    prop->concurrentKernels = 1;
    prop->pciBusID = device + 1;
    prop->pciDomainID = 0xfa; /* no such PCI domain: sysfs knows nothing of it */
    prop->asyncEngineCount = 2;
    prop->unifiedAddressing = 1;
    prop->memoryBusWidth = 64;
    prop->l2CacheSize = 1 << 20;
    prop->maxBlocksPerMultiProcessor = 1;
    prop->hostRegisterSupported = 1;
    prop->deviceNumaId = prop->hostNumaId = -1;
#endif
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    sp_emu_guard g(sp_emu_mutex());
    const int d = current_device;
    sp_emu_wait([d]() { return device_idle(d); });
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = (cudaError_t)last_error;
    last_error = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t e) { return error_of(e)->text; }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags)
{
    sp_emu_guard g(sp_emu_mutex());
    if (!stream || flags > cudaStreamNonBlocking)
        return cudaErrorInvalidValue;
    if (bad_device(current_device))
        return cudaErrorNoDevice;
    *stream = new_stream(current_device, flags, false).get();
    return cudaSuccess;
}

/* Returns at once; work already enqueued still runs, as in CUDA. */
cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    sp_emu_guard g(sp_emu_mutex());
    stream_ref s = stream ? find_stream(stream) : nullptr;
    if (!s)
        return cudaErrorInvalidResourceHandle;
    s->live = false;
    progress();
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    sp_emu_guard g(sp_emu_mutex());
    stream_ref s = find_stream(stream);
    if (!s)
        return cudaErrorInvalidResourceHandle;
    wait_seq(s, s->enq);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    if (!event)
        return cudaErrorInvalidValue;
    *event = new CUevent_st{ 0, nullptr, 0, nullptr };
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    sp_emu_guard g(sp_emu_mutex());
    if (!event)
        return cudaErrorInvalidResourceHandle;
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    sp_emu_guard g(sp_emu_mutex());
    stream_ref s = find_stream(stream);
    if (!event || !s)
        return cudaErrorInvalidResourceHandle;
    std::shared_ptr<double> t = std::make_shared<double>(-1.0);
    event->s = s;
    event->t = t;
    event->seq = enqueue(s, sp_emu_op{ "cudaEventRecord", [t]() { *t = now_s(); }, {} });
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    sp_emu_guard g(sp_emu_mutex());
    if (!event)
        return cudaErrorInvalidResourceHandle;
    sp_emu_wait([event]() { return complete(event); });
    return cudaSuccess;
}

/* Times the emulation itself: the rate test prints what the CPU achieved. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    sp_emu_guard g(sp_emu_mutex());
    if (!ms)
        return cudaErrorInvalidValue;
    if (!start || !end || !start->s || !end->s || ((start->flags | end->flags) & 0x02))
        return cudaErrorInvalidResourceHandle; /* not recorded, or cudaEventDisableTiming */
    progress();
    if (!complete(start) || !complete(end))
        return cudaErrorNotReady;
    *ms = (float)((*end->t - *start->t) * 1e3);
    return cudaSuccess;
}

} /* extern "C" */

/* ---- the rest of the runtime, with the toolkit's headers: what StarPU 1.3's CUDA
 * driver, its bus calibration and starpipe call beyond the above (the fake device) ---- */
#ifdef CUDART_VERSION

/* pinned host memory: cudaHostAlloc'ed blocks and cudaHostRegister'ed ranges */
static std::map<uintptr_t, size_t> &pinned(void)
{
    static std::map<uintptr_t, size_t> *m = new std::map<uintptr_t, size_t>;
    return *m;
}
static std::map<uintptr_t, size_t> &registered(void)
{
    static std::map<uintptr_t, size_t> *m = new std::map<uintptr_t, size_t>;
    return *m;
}
static bool peer_on[MAX_DEVICES][MAX_DEVICES];

/* host bytes pinned now (blocks and registered ranges), and the most at once */
static unsigned long long pinned_peak;
static unsigned long long pinned_now(void)
{
    unsigned long long n = 0;
    for (auto &b : pinned()) n += b.second;
    for (auto &r : registered()) n += r.second;
    return n;
}
static void pinned_grew(void)
{
    unsigned long long n = pinned_now();
    if (n > pinned_peak) pinned_peak = n;
}

static int in_ranges(std::map<uintptr_t, size_t> &m, const void *p)
{
    auto it = m.upper_bound((uintptr_t)p);
    if (it == m.begin())
        return 0;
    --it;
    return (uintptr_t)p < it->first + it->second;
}

/* A line per device used, at exit, when STARPIPE_FAKE_GPU_REPORT is set (tests read it). */
static void report(void)
{
    if (module_loading[0])
        fprintf(stderr, "starpipe fake device (pid %d): CUDA_MODULE_LOADING=%s at the "
                "runtime's first call\n", (int)getpid(), module_loading);
    for (int d = 0; d < ndevices(); d++) {
        unsigned long long *c = counts[d];
        if (!c[SP_EMU_KERNELS] && !c[SP_EMU_GEMMS] && !c[SP_EMU_H2D] && !c[SP_EMU_D2H])
            continue;
        fprintf(stderr, "starpipe fake device %d (pid %d): %llu kernels, %llu cuBLAS calls, "
                "host to device %llu bytes, device to host %llu bytes, device to device %llu "
                "bytes, NCCL sent %llu bytes, received %llu bytes\n", d, (int)getpid(),
                c[SP_EMU_KERNELS], c[SP_EMU_GEMMS], c[SP_EMU_H2D], c[SP_EMU_D2H], c[SP_EMU_D2D],
                c[SP_EMU_NCCL_SENT], c[SP_EMU_NCCL_RECV]);
    }
}

__attribute__((constructor)) static void fake_gpu_loaded(void)
{
    if (getenv("STARPIPE_FAKE_GPU_REPORT"))
        atexit(report);
}

extern "C" {

/* What tests/gpu/fake reads (dlsym): bytes moved and operations run on device dev since
 * the process started. 0, or -1 for a device that does not exist. */
int starpipe_fake_gpu_stats(int dev, unsigned long long out[7])
{
    sp_emu_guard g(sp_emu_mutex());
    if (bad_device(dev) || !out)
        return -1;
    static_assert(SP_EMU_NCOUNTS == 7, "starpipe_fake_gpu_stats gives 7 counters");
    for (int i = 0; i < SP_EMU_NCOUNTS; i++)
        out[i] = counts[dev][i];
    return 0;
}

/* What tests/gpu/fake reads (dlsym): the process's pinned host bytes now and at most
 * since it started (cudaHostAlloc'ed blocks and cudaHostRegister'ed ranges), and how
 * many of the bytes now are in blocks of exactly `chunk` bytes (an allocator's chunks,
 * such as StarPU's 32 MiB ones for small buffers). */
int starpipe_fake_gpu_pinned(unsigned long long chunk, unsigned long long out[3])
{
    sp_emu_guard g(sp_emu_mutex());
    if (!out)
        return -1;
    out[0] = pinned_now();
    out[1] = pinned_peak;
    out[2] = 0;
    for (auto &b : pinned())
        if (b.second == chunk) out[2] += b.second;
    return 0;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned flags, int priority)
{
    return cudaStreamCreateWithFlags(stream, flags);
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    sp_emu_guard g(sp_emu_mutex());
    stream_ref s = find_stream(stream);
    if (!s)
        return cudaErrorInvalidResourceHandle;
    progress();
    return idle(s) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags)
{
    sp_emu_guard g(sp_emu_mutex());
    stream_ref s = find_stream(stream);
    if (!s || !event)
        return cudaErrorInvalidResourceHandle;
    if (flags)
        return cudaErrorInvalidValue;
    if (!event->s)
        return cudaSuccess;
    queued o{ ++s->enq, sp_emu_op{ "cudaStreamWaitEvent", {}, {} }, { { event->s, event->seq } },
              false };
    s->q.push_back(std::move(o));
    progress();
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *data)
{
    if (!fn)
        return cudaErrorInvalidValue;
    int e = sp_emu_submit(stream, sp_emu_op{ NULL, [fn, data]() { fn(data); }, {} });
    return (cudaError_t)e;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags)
{
    if (flags & ~0x0fu)
        return cudaErrorInvalidValue;
    cudaError_t e = cudaEventCreate(event);
    if (e == cudaSuccess)
        (*event)->flags = flags;
    return e;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    sp_emu_guard g(sp_emu_mutex());
    if (!event)
        return cudaErrorInvalidResourceHandle;
    progress();
    return complete(event) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaPeekAtLastError(void) { return (cudaError_t)last_error; }

const char *cudaGetErrorName(cudaError_t e) { return error_of(e)->name; }

cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v)
        return cudaErrorInvalidValue;
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) { return cudaDriverGetVersion(v); }

cudaError_t cudaSetDevice(int device)
{
    if (bad_device(device))
        return cudaErrorInvalidDevice;
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return cudaErrorInvalidValue;
    *device = current_device;
    return cudaSuccess;
}

/* Frees the device's memory and streams, as CUDA does (StarPU calls it after measuring
 * the bus, before its workers start). */
cudaError_t cudaDeviceReset(void)
{
    sp_emu_guard g(sp_emu_mutex());
    const int d = current_device;
    if (bad_device(d))
        return cudaErrorNoDevice;
    sp_emu_wait([d]() { return device_idle(d); });
    sp_emu_dev_free_all(d);
    for (auto &s : streams())
        if (s->dev == d)
            s->live = false;
    legacy[d] = nullptr;
    for (int p = 0; p < MAX_DEVICES; p++)
        peer_on[d][p] = false;
    progress();
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!value)
        return cudaErrorInvalidValue;
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e)
        return e;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    case cudaDevAttrTotalConstantMemory: *value = (int)p.totalConstMem; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = p.regsPerBlock; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrIntegrated: *value = p.integrated; break;
    case cudaDevAttrCanMapHostMemory: *value = p.canMapHostMemory; break;
    case cudaDevAttrComputeMode: *value = cudaComputeModeDefault; break;
    case cudaDevAttrConcurrentKernels: *value = p.concurrentKernels; break;
    case cudaDevAttrEccEnabled: *value = p.ECCEnabled; break;
    case cudaDevAttrPciBusId: *value = p.pciBusID; break;
    case cudaDevAttrPciDeviceId: *value = p.pciDeviceID; break;
    case cudaDevAttrPciDomainId: *value = p.pciDomainID; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = p.memoryBusWidth; break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrAsyncEngineCount: *value = p.asyncEngineCount; break;
    case cudaDevAttrUnifiedAddressing: *value = p.unifiedAddressing; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMemoryPoolsSupported: *value = 0; break;
    default:
        fprintf(stderr, "EMU: cudaDeviceGetAttribute(%d): not emulated\n", (int)attr);
        return cudaErrorNotSupported;
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int device)
{
    if (!bus || len <= 0)
        return cudaErrorInvalidValue;
    if (bad_device(device))
        return cudaErrorInvalidDevice;
    snprintf(bus, (size_t)len, "%04x:%02x:00.0", 0xfa, device + 1);
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    if (!can)
        return cudaErrorInvalidValue;
    if (bad_device(device) || bad_device(peer))
        return cudaErrorInvalidDevice;
    *can = device != peer; /* all of it is host memory */
    return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags)
{
    sp_emu_guard g(sp_emu_mutex());
    const int d = current_device;
    if (flags)
        return cudaErrorInvalidValue;
    if (bad_device(peer) || peer == d)
        return cudaErrorInvalidDevice;
    if (peer_on[d][peer])
        return cudaErrorPeerAccessAlreadyEnabled;
    peer_on[d][peer] = true;
    return cudaSuccess;
}

cudaError_t cudaDeviceDisablePeerAccess(int peer)
{
    sp_emu_guard g(sp_emu_mutex());
    const int d = current_device;
    if (bad_device(peer) || peer == d)
        return cudaErrorInvalidDevice;
    if (!peer_on[d][peer])
        return cudaErrorPeerAccessNotEnabled;
    peer_on[d][peer] = false;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    sp_emu_guard g(sp_emu_mutex());
    const int d = current_device;
    if (bad_device(d))
        return cudaErrorNoDevice;
    if (free_bytes)
        *free_bytes = device_bytes() - sp_emu_dev_used(d);
    if (total)
        *total = device_bytes();
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned flags)
{
    sp_emu_guard g(sp_emu_mutex());
    if (!ptr || flags > 0x0f)
        return cudaErrorInvalidValue;
    *ptr = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + (bytes ? 0 : 4096));
    if (!*ptr)
        return cudaErrorMemoryAllocation;
    pinned()[(uintptr_t)*ptr] = bytes;
    pinned_grew();
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }

cudaError_t cudaFreeHost(void *ptr)
{
    sp_emu_guard g(sp_emu_mutex());
    if (!ptr)
        return cudaSuccess;
    auto it = pinned().find((uintptr_t)ptr);
    if (it == pinned().end()) {
        fprintf(stderr, "EMU: cudaFreeHost(%p): not from cudaHostAlloc, or freed before\n", ptr);
        return cudaErrorInvalidValue;
    }
    /* memory a stream may still copy from: let it finish first, as CUDA does */
    sp_emu_wait([]() {
        for (auto &s : streams())
            if (!idle(s))
                return false;
        return true;
    });
    pinned().erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *ptr, size_t bytes, unsigned flags)
{
    sp_emu_guard g(sp_emu_mutex());
    if (!ptr || !bytes)
        return cudaErrorInvalidValue;
    if (in_ranges(registered(), ptr) || in_ranges(pinned(), ptr))
        return cudaErrorHostMemoryAlreadyRegistered;
    if (side(ptr, 0) != HOST)
        return cudaErrorInvalidValue;
    registered()[(uintptr_t)ptr] = bytes;
    pinned_grew();
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr)
{
    sp_emu_guard g(sp_emu_mutex());
    if (!registered().erase((uintptr_t)ptr))
        return cudaErrorHostMemoryNotRegistered;
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr)
{
    sp_emu_guard g(sp_emu_mutex());
    if (!a)
        return cudaErrorInvalidValue;
    memset(a, 0, sizeof *a);
    int dev = -1;
    if (sp_emu_dev_find(ptr, 0, &dev)) {
        a->type = cudaMemoryTypeDevice;
        a->device = dev;
        a->devicePointer = (void *)ptr;
    } else if (in_ranges(pinned(), ptr) || in_ranges(registered(), ptr)) {
        a->type = cudaMemoryTypeHost;
        a->device = current_device;
        a->devicePointer = a->hostPointer = (void *)ptr;
    } else {
        a->type = cudaMemoryTypeUnregistered;
        a->device = -2;
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    return copy("cudaMemcpy", linear(dst, src, bytes), kind, NULL, true, -1);
}

cudaError_t cudaMemset(void *ptr, int value, size_t bytes)
{
    return set(ptr, value, bytes, NULL, true);
}

static rows pitched(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t height)
{
    return rows{ (char *)dst, (const char *)src, dpitch, spitch, width, height, 1, height, height };
}

cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                         size_t height, enum cudaMemcpyKind kind)
{
    return copy("cudaMemcpy2D", pitched(dst, dpitch, src, spitch, width, height), kind, NULL,
                true, -1);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t stream)
{
    return copy("cudaMemcpy2DAsync", pitched(dst, dpitch, src, spitch, width, height), kind,
                stream, false, -1);
}

static cudaError_t peer(const char *call, void *dst, int ddev, const void *src, int sdev,
                        size_t bytes, cudaStream_t stream, bool sync)
{
    if (bad_device(ddev) || bad_device(sdev))
        return cudaErrorInvalidDevice;
    return copy(call, linear(dst, src, bytes), cudaMemcpyDeviceToDevice, stream, sync, ddev);
}

cudaError_t cudaMemcpyPeer(void *dst, int ddev, const void *src, int sdev, size_t bytes)
{
    return peer("cudaMemcpyPeer", dst, ddev, src, sdev, bytes, NULL, true);
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int ddev, const void *src, int sdev, size_t bytes,
                                cudaStream_t stream)
{
    return peer("cudaMemcpyPeerAsync", dst, ddev, src, sdev, bytes, stream, false);
}

/* Pitched pointers only: CUDA arrays are not emulated. */
static cudaError_t copy3d(const char *call, const struct cudaMemcpy3DPeerParms *p,
                          cudaStream_t stream, bool sync)
{
    if (!p)
        return cudaErrorInvalidValue;
    if (p->srcArray || p->dstArray) {
        fprintf(stderr, "EMU: %s: CUDA arrays are not emulated\n", call);
        return cudaErrorNotSupported;
    }
    if (bad_device(p->dstDevice) || bad_device(p->srcDevice))
        return cudaErrorInvalidDevice;
    const cudaPitchedPtr &d = p->dstPtr, &s = p->srcPtr;
    rows r{ (char *)d.ptr + (p->dstPos.z * d.ysize + p->dstPos.y) * d.pitch + p->dstPos.x,
            (const char *)s.ptr + (p->srcPos.z * s.ysize + p->srcPos.y) * s.pitch + p->srcPos.x,
            d.pitch, s.pitch, p->extent.width, p->extent.height, p->extent.depth, d.ysize,
            s.ysize };
    return copy(call, r, cudaMemcpyDefault, stream, sync, p->dstDevice);
}

cudaError_t cudaMemcpy3DPeer(const struct cudaMemcpy3DPeerParms *p)
{
    return copy3d("cudaMemcpy3DPeer", p, NULL, true);
}

cudaError_t cudaMemcpy3DPeerAsync(const struct cudaMemcpy3DPeerParms *p, cudaStream_t stream)
{
    return copy3d("cudaMemcpy3DPeerAsync", p, stream, false);
}

} /* extern "C" */
#endif /* CUDART_VERSION */
