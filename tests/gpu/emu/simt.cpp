/* The device side of the CPU SIMT emulation (README.md): the block scheduler behind
 * SP_LAUNCH (simt.h), which runs a launch's grid when the launch reaches the head of its
 * stream (runtime.cpp). C-like C++. Every misuse that a GPU would punish with a hang,
 * garbage or a fault ends the process here with a message naming the kernel. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <map>
#include <string>

#include "emu.h"
#include "simt.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;

static const char *kname = "(none)";

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sp_emu_die("kernel %s, block (%u,%u,%u): %s", kname, blockIdx.x, blockIdx.y, blockIdx.z,
               msg);
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
    int nsync, nshfl;  /* barriers and warp collectives (shuffles, mma) entered */
    int mma;           /* the warp collective it waits at is an mma, not a shuffle */
    int sync_or;       /* waits at a __syncthreads_or */
    int pred[2];       /* its predicate at the current and the previous barrier ... */
    uint64_t shfl[2];  /* ... and its value at the current and previous shuffle: a lane
                          let through early may enter the next before the others read */
    uint32_t frag[2][10]; /* its a (4), b (2) and c (4, fp32 bits) at an mma, likewise */
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
        int mma = 0;
        for (int t = w * 32; t < w * 32 + 32 && t < nthr; t++)
            mma |= th[t].state == T_SHFL && th[t].mma;
        if (n)
            fail("%s reached by %d of the 32 lanes of warp %d (the others %s)",
                 mma ? "mma.sync (sp_mma_bf16)" : "__shfl_xor_sync", n, w,
                 w * 32 + 32 > nthr ? "do not exist: a partial warp"
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
                if (th[t].nshfl != th[w * 32].nshfl || th[t].mma != th[w * 32].mma)
                    fail("the lanes of warp %d are at different shuffles or mma", w);
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
    th[t].mma = 0;
    wait_at(T_SHFL);
    return th[(t & ~31) | ((t & 31) ^ (lane_mask & 31))].shfl[slot];
}

/* The fragments of mma.m16n8k16 with .bf16 multiplicands and .f32 accumulators, from the
 * PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type"): lane =
 * groupID * 4 + threadID_in_group, each .b32 register two bf16 elements, the lower index
 * in the low half.
 *   A (16 x 16), a0..a7 in 4 registers: row = groupID for a0, a1, a4, a5, else
 *     groupID + 8; col = threadID_in_group * 2 + (i & 1), + 8 for i >= 4.
 *   B (16 x 8), b0..b3 in 2 registers: row = threadID_in_group * 2 + (i & 1), + 8 for
 *     i >= 2; col = groupID.
 *   C, D (16 x 8), c0..c3 fp32: row = groupID for c0, c1, else groupID + 8;
 *     col = threadID_in_group * 2 + (i & 1).
 * Each lane's d from every lane's a and b: each product of two bf16 values is exact in
 * fp32; the sum runs from c over k in order, rounded to fp32 at each step (the tensor
 * cores' internal order and rounding differ: the kernels' tests allow for it). */
static float bf16_at(const uint32_t *r, int i)
{
    const uint32_t u = (r[i >> 1] >> (16 * (i & 1)) & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void sp_emu_mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4])
{
    if (nthr % 32)
        fail("mma.sync in a block of %d threads: only whole warps are emulated", nthr);
    const int t = cur, slot = th[t].nshfl++ & 1;
    memcpy(th[t].frag[slot], a, 16);
    memcpy(th[t].frag[slot] + 4, b, 8);
    memcpy(th[t].frag[slot] + 6, c, 16);
    th[t].mma = 1;
    wait_at(T_SHFL);
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const uint32_t *f = th[(t & ~31) | lane].frag[slot];
        const int g = lane >> 2, tg = lane & 3;
        for (int i = 0; i < 8; i++)
            A[(i & 2) ? g + 8 : g][tg * 2 + (i & 1) + (i >= 4 ? 8 : 0)] = bf16_at(f, i);
        for (int i = 0; i < 4; i++)
            B[tg * 2 + (i & 1) + (i >= 2 ? 8 : 0)][g] = bf16_at(f + 4, i);
    }
    const int g = (t & 31) >> 2, tg = t & 3;
    for (int i = 0; i < 4; i++) {
        const int row = i < 2 ? g : g + 8, col = tg * 2 + (i & 1);
        float s = c[i];
        for (int k = 0; k < 16; k++)
            s += A[row][k] * B[k][col];
        d[i] = s;
    }
}

/* ldmatrix m8n8 .b16 from the PTX ISA ("Warp-level matrix load instruction: ldmatrix"):
 * matrix i's 8 rows are at the addresses of lanes 8 i .. 8 i + 7 (16 bytes each). Lane
 * 4 groupID + threadID_in_group gets in register i the elements (groupID, 2 tig) and
 * (groupID, 2 tig + 1) of matrix i, the lower column in the low half; with .trans, of the
 * transposed matrix: (2 tig, groupID) and (2 tig + 1, groupID). */
void sp_emu_ldmatrix(uint32_t *r, int n, int trans, const void *row)
{
    if (nthr % 32)
        fail("ldmatrix in a block of %d threads: only whole warps are emulated", nthr);
    if (n != 1 && n != 2 && n != 4)
        fail("ldmatrix .x%d: only .x1, .x2 and .x4 exist", n);
    if ((uintptr_t)row % 16)
        fail("ldmatrix: lane %d's row address %p is not 16-byte aligned", cur & 31, row);
    const int t = cur, slot = th[t].nshfl++ & 1;
    th[t].shfl[slot] = (uint64_t)(uintptr_t)row;
    th[t].mma = 0;
    wait_at(T_SHFL);
    const int g = (t & 31) >> 2, tg = t & 3;
    for (int i = 0; i < n; i++) {
        const uint16_t *m[8];
        for (int j = 0; j < 8; j++)
            m[j] = (const uint16_t *)(uintptr_t)th[(t & ~31) | (8 * i + j)].shfl[slot];
        uint16_t lo, hi;
        if (trans)
            lo = m[2 * tg][g], hi = m[2 * tg + 1][g];
        else
            lo = m[g][2 * tg], hi = m[g][2 * tg + 1];
        r[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
}

/* The blocks of each kernel's latest grid, by name: what a test asks to see that a
 * kernel really spreads over the device (sp_emu_last_grid). */
static std::map<std::string, long long> last_grid;

extern "C" long long sp_emu_last_grid(const char *kernel)
{
    sp_emu_guard lock(sp_emu_mutex());
    auto it = last_grid.find(kernel);
    return it == last_grid.end() ? -1 : it->second;
}

/* A launch: its configuration is checked at once (cudaGetLastError reports it, as on a
 * GPU); its grid runs when the launch reaches the head of its stream. */
static void run_grid(const char *kernel, dim3 g, dim3 b, const std::function<void()> &fn)
{
    {
        sp_emu_guard lock(sp_emu_mutex());
        last_grid[kernel] = (long long)g.x * g.y * g.z;
    }
    kname = kernel;
    body = &fn;
    nthr = (int)(b.x * b.y * b.z);
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
    sp_emu_check_fences(kernel);
    kname = "(none)";
}

void sp_emu_launch(const char *kernel, dim3 g, dim3 b, size_t shared, cudaStream_t stream,
                   const std::function<void()> &fn)
{
    const long long threads = (long long)b.x * b.y * b.z;
    if (!b.x || !b.y || !b.z || b.z > 64 || threads > MAX_THREADS || !g.x || !g.y || !g.z ||
        g.x > 2147483647u || g.y > 65535 || g.z > 65535 || shared > 48 * 1024) {
        sp_emu_set_error(cudaErrorInvalidConfiguration);
        return;
    }
    int e = sp_emu_submit(stream, sp_emu_op{ kernel, [=]() { run_grid(kernel, g, b, fn); }, {} },
                          SP_EMU_KERNELS);
    if (e)
        sp_emu_set_error(e);
}
