/* The host side of the CPU SIMT emulation (README.md): the block scheduler behind
 * SP_LAUNCH (simt.h), and the CUDA runtime and cuBLAS calls of include/. C-like C++:
 * only the kernels' side (simt.h) needs C++. Every misuse that a GPU would punish with
 * a hang, garbage or a fault ends the process here with a message naming the kernel. */
#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "cublas_v2.h"
#include "simt.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;

static cudaError_t last_error = cudaSuccess;
static const char *kname = "(none)";

static void check_fences(const char *after);

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "EMU: kernel %s, block (%u,%u,%u): ", kname, blockIdx.x, blockIdx.y,
            blockIdx.z);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

/* ---- the scheduler: one block at a time, one fiber per waiting thread ----------------
 * Every thread of a block starts and runs until it ends or waits (at __syncthreads or a
 * shuffle). A fiber whose thread ended without waiting goes on with the next thread, so
 * kernels without barriers cost one fiber per block. Then, round by round: a barrier
 * opens when every thread of the block waits at it, a shuffle when all 32 lanes of the
 * warp do, and the threads let through run to their next wait. Nothing to open while
 * threads wait is a kernel that would hang or read garbage on a GPU: it fails. */

#define MAX_THREADS 1024
#define STACK_BYTES (128 << 10) /* kernel frames are small; a guard page below */

static void fiber_main(void);

/* Switching fibers: glibc's swapcontext makes a system call (the signal mask) each time,
 * 85% of the run time of kernels full of shuffles. On x86-64 a few instructions do: push
 * the callee-saved registers, swap stack pointers, pop (the FP control words stay: no
 * code here changes them). With shadow stacks (-fcf-protection) or elsewhere, ucontext. */
#if defined(__x86_64__) && !(defined(__CET__) && (__CET__ & 2)) && !defined(SP_EMU_UCONTEXT)
typedef void *emu_ctx;
extern "C" void sp_emu_switch(emu_ctx *save, emu_ctx to);
asm(".text\n"
    ".globl sp_emu_switch\n"
    ".type sp_emu_switch, @function\n"
    "sp_emu_switch:\n" /* rdi: where to save this stack pointer; rsi: the one to resume */
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size sp_emu_switch, .-sp_emu_switch\n");
static void ctx_make(emu_ctx *c, char *stack)
{
    uint64_t *sp = (uint64_t *)((uintptr_t)(stack + STACK_BYTES) & ~(uintptr_t)15);
    *--sp = 0;                        /* fiber_main's return address: it never returns */
    *--sp = (uint64_t)&fiber_main;    /* where the first switch's ret goes */
    for (int i = 0; i < 6; i++)
        *--sp = 0;                    /* rbp, rbx, r12-r15 */
    *c = sp;
}
static void ctx_switch(emu_ctx *save, emu_ctx *to) { sp_emu_switch(save, *to); }
#else
typedef ucontext_t emu_ctx;
static void ctx_make(emu_ctx *c, char *stack)
{
    getcontext(c);
    c->uc_stack.ss_sp = stack;
    c->uc_stack.ss_size = STACK_BYTES;
    c->uc_link = NULL;
    makecontext(c, fiber_main, 0);
}
static void ctx_switch(emu_ctx *save, emu_ctx *to) { swapcontext(save, to); }
#endif

enum { T_NEW, T_RUN, T_SYNC, T_SHFL, T_DONE };

typedef struct {
    int state, fiber;
    int nsync, nshfl;  /* barriers and shuffles entered */
    int sync_or;       /* waits at a __syncthreads_or */
    int pred[2];       /* its predicate at the current and the previous barrier ... */
    uint64_t shfl[2];  /* ... and its value at the current and previous shuffle: a lane
                          let through early may enter the next before the others read */
} emu_thread;

typedef struct {
    emu_ctx ctx;
    char *stack;
    int bound;    /* its thread waited: it resumes that thread and nothing else */
    int finished; /* back in the pool once the scheduler is off its stack */
} emu_fiber;

static emu_thread th[MAX_THREADS];
static emu_fiber fib[MAX_THREADS];
static int pool[MAX_THREADS], npool, nfib;
static emu_ctx sched_ctx;
static const std::function<void()> *body;
static int nthr, cur, cur_fib, next_new, reverse_threads;
static long launches;

/* Threads (and blocks) run in reverse order in about half the launches: a kernel whose
 * result depends on the order of threads between barriers, or of blocks, gives other
 * bits in the two runs of tests/gpu/test_cuda_kernels.c. */
static int order(int i) { return reverse_threads ? nthr - 1 - i : i; }

static void set_thread(int t)
{
    cur = t;
    threadIdx = dim3(t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y));
}

static void fiber_main(void)
{
    const int f = cur_fib;
    for (;;) {
        const int t = order(next_new++);
        th[t].state = T_RUN;
        th[t].fiber = f;
        set_thread(t);
        (*body)();
        th[t].state = T_DONE;
        if (fib[f].bound || next_new >= nthr)
            break;
    }
    fib[f].finished = 1;
    ctx_switch(&fib[f].ctx, &sched_ctx); /* never resumed: the next use remakes it */
}

static int fiber_take(void)
{
    int f;
    if (npool) {
        f = pool[--npool];
    } else {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        char *m = (char *)mmap(NULL, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED || mprotect(m, page, PROT_NONE)) {
            perror("EMU: fiber stack");
            abort();
        }
        f = nfib++;
        fib[f].stack = m + page;
    }
    ctx_make(&fib[f].ctx, fib[f].stack);
    fib[f].bound = fib[f].finished = 0;
    return f;
}

static void switch_to(int f)
{
    cur_fib = f;
    ctx_switch(&sched_ctx, &fib[f].ctx);
    if (fib[f].finished)
        pool[npool++] = f;
}

/* The running thread waits; the scheduler resumes it (cur and threadIdx set back). */
static void wait_at(int state)
{
    const int f = th[cur].fiber;
    th[cur].state = state;
    fib[f].bound = 1;
    ctx_switch(&fib[f].ctx, &sched_ctx);
}

static void hang(int at_sync)
{
    for (int w = 0; w * 32 < nthr; w++) {
        int n = 0;
        for (int t = w * 32; t < w * 32 + 32 && t < nthr; t++)
            n += th[t].state == T_SHFL;
        if (n)
            fail("__shfl_xor_sync reached by %d of the 32 lanes of warp %d (the others %s)", n,
                 w, w * 32 + 32 > nthr ? "do not exist: a partial warp"
                                       : "have exited or wait at __syncthreads");
    }
    fail("__syncthreads reached by %d of the block's %d threads (the others have exited)",
         at_sync, nthr);
}

static void run_block(void)
{
    memset(th, 0, sizeof(emu_thread) * (size_t)nthr);
    next_new = 0;
    while (next_new < nthr)
        switch_to(fiber_take());
    for (;;) {
        int live = 0, at_sync = 0, let = 0;
        for (int t = 0; t < nthr; t++) {
            live += th[t].state != T_DONE;
            at_sync += th[t].state == T_SYNC;
        }
        if (!live)
            return;
        if (at_sync == nthr) {
            for (int t = 1; t < nthr; t++)
                if (th[t].sync_or != th[0].sync_or)
                    fail("__syncthreads and __syncthreads_or meet at one barrier");
            for (int t = 0; t < nthr; t++)
                th[t].state = T_RUN;
            let = nthr;
        }
        for (int w = 0; w * 32 + 32 <= nthr; w++) {
            int n = 0;
            for (int t = w * 32; t < w * 32 + 32; t++)
                n += th[t].state == T_SHFL;
            if (n < 32)
                continue;
            for (int t = w * 32; t < w * 32 + 32; t++) {
                if (th[t].nshfl != th[w * 32].nshfl)
                    fail("the lanes of warp %d are at different shuffles", w);
                th[t].state = T_RUN;
            }
            let += 32;
        }
        if (!let)
            hang(at_sync);
        for (int i = 0; i < nthr; i++) {
            const int t = order(i);
            if (th[t].state == T_RUN) {
                set_thread(t);
                switch_to(th[t].fiber);
            }
        }
    }
}

void sp_emu_syncthreads(void)
{
    emu_thread *me = &th[cur];
    me->nsync++;
    me->sync_or = 0;
    wait_at(T_SYNC);
}

int sp_emu_syncthreads_or(int pred)
{
    emu_thread *me = &th[cur];
    const int slot = me->nsync++ & 1;
    me->pred[slot] = pred != 0;
    me->sync_or = 1;
    wait_at(T_SYNC);
    int any = 0;
    for (int t = 0; t < nthr; t++)
        any |= th[t].pred[slot];
    return any;
}

uint64_t sp_emu_shfl_xor(unsigned mask, uint64_t bits, int lane_mask, int width)
{
    if (mask != 0xffffffffu || width != 32)
        fail("__shfl_xor_sync(mask %#x, width %d): only whole warps are emulated", mask, width);
    const int t = cur, slot = th[t].nshfl++ & 1;
    th[t].shfl[slot] = bits;
    wait_at(T_SHFL);
    return th[(t & ~31) | ((t & 31) ^ (lane_mask & 31))].shfl[slot];
}

/* Streams: only whether one is live matters (everything completes at once). */
#define MAX_STREAMS 64
struct CUstream_st {
    int unused;
};
static cudaStream_t streams[MAX_STREAMS];

static int stream_ok(cudaStream_t s)
{
    if (!s)
        return 1; /* the legacy default stream */
    for (int i = 0; i < MAX_STREAMS; i++)
        if (streams[i] == s)
            return 1;
    return 0;
}

void sp_emu_launch(const char *kernel, dim3 g, dim3 b, size_t shared, cudaStream_t stream,
                   const std::function<void()> &fn)
{
    const long long threads = (long long)b.x * b.y * b.z;
    if (!b.x || !b.y || !b.z || b.z > 64 || threads > MAX_THREADS || !g.x || !g.y || !g.z ||
        g.x > 2147483647u || g.y > 65535 || g.z > 65535 || shared > 48 * 1024) {
        last_error = cudaErrorInvalidConfiguration; /* reported by cudaGetLastError */
        return;
    }
    if (!stream_ok(stream)) {
        last_error = cudaErrorInvalidResourceHandle;
        return;
    }
    kname = kernel;
    body = &fn;
    nthr = (int)threads;
    blockDim = b;
    gridDim = g;
    const uint64_t h = mix64((uint64_t)++launches);
    reverse_threads = (int)(h & 1);
    const int reverse_blocks = (int)(h >> 1 & 1);
    const long long nb = (long long)g.x * g.y * g.z;
    for (long long i = 0; i < nb; i++) {
        const long long j = reverse_blocks ? nb - 1 - i : i;
        blockIdx = dim3((unsigned)(j % g.x), (unsigned)(j / g.x % g.y),
                        (unsigned)(j / ((long long)g.x * g.y)));
        run_block();
    }
    check_fences(kernel);
    kname = "(none)";
}

/* ---- device memory: NaN where nothing was written yet, and fences around each block,
 * checked after every kernel and copy so that a write out of bounds names its kernel.
 * The fences hold a signaling NaN: a read out of bounds gives NaN, and arithmetic on it
 * a quiet one, so a value computed from it and written back still shows. ------------- */

#define FENCE 256 /* bytes before and after each block; also its alignment */
static const uint32_t FRESH = 0x7fc00000u, FENCE_NAN = 0xff80deadu;

typedef struct dev_block {
    uint64_t magic;
    size_t bytes;
    struct dev_block *prev, *next;
} dev_block;
static dev_block *blocks;
static const uint64_t MAGIC = 0x5350454d55424c4bull;

static unsigned char pattern(uint32_t word, size_t i) { return (unsigned char)(word >> (8 * (i & 3))); }
static size_t block_size(size_t bytes) { return (2 * FENCE + bytes + FENCE - 1) / FENCE * FENCE; }

static void check_fences(const char *after)
{
    for (dev_block *d = blocks; d; d = d->next) {
        const unsigned char *b = (const unsigned char *)d;
        const size_t end = block_size(d->bytes);
        for (size_t i = sizeof *d; i < end; i++) {
            if (i == FENCE)
                i += d->bytes;
            if (b[i] != pattern(FENCE_NAN, i)) {
                fprintf(stderr, "EMU: %s wrote out of bounds of a %zu-byte cudaMalloc block, "
                        "at float %lld of it\n", after, d->bytes,
                        ((long long)(i & ~(size_t)3) - FENCE) / 4);
                abort();
            }
        }
    }
}

extern "C" {

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    if (!ptr)
        return cudaErrorInvalidValue;
    const size_t size = block_size(bytes);
    unsigned char *b = (unsigned char *)aligned_alloc(FENCE, size);
    if (!b)
        return cudaErrorMemoryAllocation;
    for (size_t i = 0; i < size; i++)
        b[i] = pattern(i >= FENCE && i < FENCE + bytes ? FRESH : FENCE_NAN, i);
    dev_block *d = (dev_block *)b;
    d->magic = MAGIC;
    d->bytes = bytes;
    d->prev = NULL;
    d->next = blocks;
    if (blocks)
        blocks->prev = d;
    blocks = d;
    *ptr = b + FENCE;
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream)
{
    (void)stream;
    return cudaMalloc(ptr, bytes);
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    (void)stream;
    return cudaFree(ptr);
}

cudaError_t cudaFree(void *ptr)
{
    if (!ptr)
        return cudaSuccess;
    dev_block *d = (dev_block *)((unsigned char *)ptr - FENCE);
    if (d->magic != MAGIC) {
        fprintf(stderr, "EMU: cudaFree(%p): not from cudaMalloc, or freed before\n", ptr);
        return cudaErrorInvalidValue;
    }
    check_fences("something before this cudaFree");
    d->magic = 0;
    if (d->prev)
        d->prev->next = d->next;
    else
        blocks = d->next;
    if (d->next)
        d->next->prev = d->prev;
    free(d);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    if ((bytes && (!dst || !src)) || kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return cudaErrorInvalidValue;
    if (!stream_ok(stream))
        return cudaErrorInvalidResourceHandle;
    memmove(dst, src, bytes);
    check_fences("cudaMemcpyAsync");
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream)
{
    if (bytes && !ptr)
        return cudaErrorInvalidValue;
    if (!stream_ok(stream))
        return cudaErrorInvalidResourceHandle;
    memset(ptr, value, bytes);
    check_fences("cudaMemsetAsync");
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (!prop || device != 0)
        return cudaErrorInvalidValue;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "CPU SIMT emulation (tests/gpu/emu)");
    prop->major = 9;
    prop->multiProcessorCount = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    }
    return "unrecognized error code";
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags)
{
    for (int i = 0; i < MAX_STREAMS; i++)
        if (!streams[i]) {
            streams[i] = (cudaStream_t)calloc(1, sizeof(struct CUstream_st));
            *stream = streams[i];
            return streams[i] ? cudaSuccess : cudaErrorMemoryAllocation;
        }
    return cudaErrorMemoryAllocation;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    for (int i = 0; stream && i < MAX_STREAMS; i++)
        if (streams[i] == stream) {
            free(stream);
            streams[i] = NULL;
            return cudaSuccess;
        }
    return cudaErrorInvalidResourceHandle;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    return stream_ok(stream) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

/* Events time the emulation itself: the rate test prints what the CPU achieved. */
struct CUevent_st {
    double seconds;
    int recorded;
};

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    *event = (cudaEvent_t)calloc(1, sizeof(struct CUevent_st));
    return *event ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    free(event);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    if (!event || !stream_ok(stream))
        return cudaErrorInvalidResourceHandle;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    event->seconds = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    event->recorded = 1;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    return event && event->recorded ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!start || !end || !start->recorded || !end->recorded)
        return cudaErrorInvalidResourceHandle;
    *ms = (float)((end->seconds - start->seconds) * 1e3);
    return cudaSuccess;
}

/* ---- cuBLAS: sgemm on OpenBLAS, with cuBLAS's checks of sizes and leading dimensions.
 * A new handle is in device pointer mode (cuBLAS's default is host): starpipe binds
 * every handle to host mode itself (sp_cublas_bind), and this shows if it stops. */

struct cublasContext {
    cudaStream_t stream;
    cublasPointerMode_t pointer_mode;
    cublasMath_t math;
};

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    *handle = (cublasHandle_t)calloc(1, sizeof(struct cublasContext));
    if (!*handle)
        return CUBLAS_STATUS_ALLOC_FAILED;
    (*handle)->pointer_mode = CUBLAS_POINTER_MODE_DEVICE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t stream)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *stream)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *stream = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode(cublasHandle_t h, cublasPointerMode_t *mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *mode = h->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* TF32 is remembered, not emulated: products stay fp32. */
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "unknown cuBLAS status";
}

static int max1(int n) { return n > 1 ? n : 1; }

/* Column-major C (m,n) = alpha op(A) (m,k) op(B) (k,n) + beta C, as cuBLAS defines it. */
static cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (h->pointer_mode != CUBLAS_POINTER_MODE_HOST)
        return CUBLAS_STATUS_NOT_SUPPORTED; /* alpha and beta would be read on the device */
    if (!stream_ok(h->stream))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) ||
        m < 0 || n < 0 || k < 0 || lda < max1(ta == CUBLAS_OP_N ? m : k) ||
        ldb < max1(tb == CUBLAS_OP_N ? k : n) || ldc < max1(m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    const float al = *alpha, be = *beta;
    if (be == 0.0f) /* cuBLAS never reads C then: NaN there must not show */
        for (int j = 0; j < n; j++)
            memset(C + (int64_t)j * ldc, 0, sizeof(float) * (size_t)m);
    if (k == 0) {
        if (be != 0.0f && be != 1.0f)
            for (int j = 0; j < n; j++)
                cblas_sscal(m, be, C + (int64_t)j * ldc, 1);
        return CUBLAS_STATUS_SUCCESS;
    }
    cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                tb == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, m, n, k, al, A, lda, B, ldb, be,
                C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc)
{
    cublasStatus_t s = gemm(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    check_fences("cublasSgemm");
    return s;
}

/* An operand of 16-bit bf16 words (rows x ld as stored, column-major) widened to fp32. */
static float *widen(const void *x, int ld, int cols)
{
    size_t n = (size_t)(ld > 0 ? ld : 1) * (size_t)(cols > 0 ? cols : 1);
    float *w = (float *)malloc(n * sizeof(float));
    const uint16_t *h = (const uint16_t *)x;
    for (size_t i = 0; w && i < n; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&w[i], &u, 4);
    }
    return w;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t comp,
                            cublasGemmAlgo_t algo)
{
    (void)algo;
    if (at != CUDA_R_16BF || bt != CUDA_R_16BF || ct != CUDA_R_32F || comp != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* column-major: A is (m,k) or its transpose, stored with lda rows per column */
    float *a = widen(A, lda, ta == CUBLAS_OP_N ? k : m), *b = widen(B, ldb, tb == CUBLAS_OP_N ? n : k);
    cublasStatus_t s = a && b ? gemm(h, ta, tb, m, n, k, (const float *)alpha, a, lda, b, ldb,
                                     (const float *)beta, (float *)C, ldc)
                              : CUBLAS_STATUS_ALLOC_FAILED;
    free(a), free(b);
    check_fences("cublasGemmEx");
    return s;
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
                                         cublasOperation_t tb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda,
                                         long long sa, const float *B, int ldb, long long sb,
                                         const float *beta, float *C, int ldc, long long sc,
                                         int batch)
{
    if (batch < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < batch && s == CUBLAS_STATUS_SUCCESS; i++)
        s = gemm(h, ta, tb, m, n, k, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc,
                 ldc);
    check_fences("cublasSgemmStridedBatched");
    return s;
}

} /* extern "C" */
