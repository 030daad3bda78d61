/* The parts of the CUDA emulation talk to each other through this header, never through
 * CUDA's own API: the SIMT scheduler (simt.cpp), device memory (devmem.cpp), the runtime
 * (runtime.cpp), cuBLAS (cublas.cpp) and, in the fake device, NCCL (../fake/nccl.cpp).
 * Plain types only: runtime.cpp and cublas.cpp are compiled against include/ here (the
 * emulation of every build) or against the CUDA toolkit's own headers (the fake device,
 * whose ABI must be the real one); simt.cpp always against include/. */
#ifndef STARPIPE_EMU_H
#define STARPIPE_EMU_H

#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <mutex>

/* One lock for all state, recursive (an operation's code may call back in): StarPU calls
 * the runtime from several threads. Kernels and copies run under it, one at a time. */
std::recursive_mutex &sp_emu_mutex(void);
typedef std::lock_guard<std::recursive_mutex> sp_emu_guard;

/* Prints "EMU: " and the message, and aborts: what a GPU would punish with a fault,
 * garbage or a hang. */
[[noreturn]] void sp_emu_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- streams (runtime.cpp): in-order queues of operations. An operation runs when it
 * reaches the head of its stream and what it depends on is done: at once when the stream
 * is idle, so kernels and copies complete before the call that enqueues them returns. Its
 * start runs then; poll (optional), called whenever anything asks the runtime about
 * completion, says when it has finished: an NCCL transfer waits for another process. */
struct sp_emu_op {
    const char *what;
    std::function<void()> start;
    std::function<bool()> poll;
};
/* Counters of what each device did, for starpipe_fake_gpu_stats (runtime.cpp). */
enum { SP_EMU_H2D, SP_EMU_D2H, SP_EMU_D2D, SP_EMU_NCCL_SENT, SP_EMU_NCCL_RECV, SP_EMU_KERNELS,
       SP_EMU_GEMMS, SP_EMU_NCOUNTS };
void sp_emu_count(int dev, int what, size_t n); /* what < 0: nothing */
/* Enqueues op on stream (a cudaStream_t; NULL: the device's legacy default stream), and
 * counts one `count_as` on the stream's device. Returns 0, or
 * cudaErrorInvalidResourceHandle (400) for a stream that is not live. */
int sp_emu_submit(void *stream, sp_emu_op op, int count_as = -1);
/* The device a stream belongs to; -1 when the stream is not live. */
int sp_emu_stream_device(void *stream);
/* What cudaGetLastError returns next on this thread (a launch's error). */
void sp_emu_set_error(int cuda_error);
/* The calling thread's current device (cudaSetDevice). */
int sp_emu_current_device(void);
/* Waits (dropping the lock meanwhile) until done() holds, running every stream's
 * operations as they become ready. */
void sp_emu_wait(const std::function<bool()> &done);

/* ---- device memory (devmem.cpp): host memory in blocks fenced by signaling NaNs,
 * filled with quiet NaNs until written. Accessed under the lock. ---- */
void *sp_emu_dev_alloc(int dev, size_t bytes);     /* NULL when out of memory */
int sp_emu_dev_free(void *ptr);                    /* 0, or -1: not a live block's start */
/* Whether [p, p + bytes) lies inside one live block (its device in *dev); 0 otherwise. */
int sp_emu_dev_find(const void *p, size_t bytes, int *dev);
size_t sp_emu_dev_used(int dev);                   /* bytes allocated on dev */
void sp_emu_dev_free_all(int dev);                 /* cudaDeviceReset */
/* Aborts naming `after` when something wrote into a fence. */
void sp_emu_check_fences(const char *after);

/* Pointer checks: with SP_EMU_STRICT (the fake device), copies, cuBLAS and NCCL refuse
 * host memory where device memory is due; the plain emulation lets host memory serve as
 * device memory (tests/gpu/emu/test_programs_emu.c runs kernels on the interpreter's
 * buffers). */
#ifdef SP_EMU_STRICT
enum { sp_emu_strict = 1 };
#else
enum { sp_emu_strict = 0 };
#endif

#endif
