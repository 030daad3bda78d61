/* A kind of device, as the executor sees it: one table with a kernel half (sp_backend,
 * backend.h) and a memory half (zero, copies to and from the host, free memory), the
 * choice of the rank's device among those visible, and the state a worker of its kind
 * hands its kernels (a stream, library handles). ggml's backend buffer interface is the
 * model. A kind lives in its own folder of codelets/ (codelets/cuda/device.c) and is one
 * row of the registry (codelets/devices.c, sp_device_kinds); the runtime calls only this
 * table, so it names no device API, and adding a device touches no file of runtime/.
 *
 * Memory itself is StarPU's: the executor allocates a buffer on the kind's StarPU memory
 * node (starpu_malloc_on_node) and StarPU moves data between nodes; the table says what
 * StarPU cannot: how to zero it and copy a piece of it to or from the host outside a
 * task, on the main thread. Every int-returning entry returns 0 or a code named by
 * error(). */
#ifndef STARPIPE_DEVICE_H
#define STARPIPE_DEVICE_H

#include <stddef.h>

#include "starpipe/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes a worker's sp_device.ctx may need (worker_device's storage): the caller's. */
#define SP_DEVICE_CTX_BYTES 64

typedef struct sp_device_kind {
    const char *name;       /* "cuda": for messages and STARPIPE_DEVICE */
    /* what sp_device.type says on its workers: SP_DEVICE_CPU for a kind whose memory the
     * host addresses and whose kernels have ended when they return */
    sp_device_type type;
    int starpu_arch;        /* the StarPU worker type that runs it (STARPU_CUDA_WORKER) */
    /* The StarPU variables that open its workers, one device per rank (STARPU_NCUDA,
     * STARPU_WORKERS_CUDAID): set from the executor's device choice (runtime/gpumap.c);
     * NULL for a kind whose workers StarPU opens by other means (the test device) */
    const char *starpu_count_var, *starpu_ids_var;
    /* 1: its kernels only enqueue work on the worker's stream (STARPU_CUDA_ASYNC): a task
     * has ended when StarPU sees the stream done, not when its function returns */
    int async;
    /* 1: used only when STARPIPE_DEVICE names it (a test device), never by default */
    int opt_in;
    /* 1: every kernel gives the CPU table's bits (test_backend_ops compares bits); 0: within
     * the tolerances that test states per entry */
    int cpu_bits;
    const sp_backend *kernels;
    /* whether StarPU's worker workerid is one of this kind's */
    int (*owns_worker)(unsigned workerid);

    /* -- the devices: the rank's choice (runtime/gpumap.c decides; these inform it) -- */
    int (*count)(void);                              /* devices visible; 0 if none */
    /* the PCI address ("0000:1b:00.0", as hwloc names it) of device dev; non-zero: unknown */
    int (*bus_id)(int dev, char *bus, int len);
    /* free and total bytes of device dev, as its driver counts them */
    int (*mem_info)(int dev, size_t *free_bytes, size_t *total);

    /* -- the workers -- */
    /* once, on the main thread after StarPU started its workers: library handles of each
     * worker of the kind (cuBLAS), tf32: its matrix products may round operands to TF32
     * (STARPIPE_TF32=1); stop: before StarPU shuts down, with what start made */
    int (*start)(int tf32);
    void (*stop)(void);
    /* on one of its workers: the device a task gets there, its state in ctx_storage
     * (SP_DEVICE_CTX_BYTES bytes, alive while the task runs) */
    sp_device (*worker_device)(void *ctx_storage);

    /* -- memory of device dev, from the main thread: a stream of the table's own that
     * never waits for the workers' kernels, synchronised before the call returns -- */
    int (*zero)(int dev, void *mem, size_t bytes);
    int (*copy)(int dev, void *dst, const void *src, size_t bytes, int to_host);
    /* memory inside a task, on the worker's stream (dev its sp_device): a task's scratch
     * beyond its StarPU buffers (a tensor group's gathered rows) */
    int (*task_alloc)(const sp_device *dev, void **mem, size_t bytes);
    void (*task_free)(const sp_device *dev, void *mem);

    /* -- outside StarPU (test_backend_ops, benchmarks): state on device dev and memory
     * there, for the kernel half alone -- */
    int (*ctx_create)(int dev, void **ctx);
    void (*ctx_destroy)(void *ctx);
    void *(*alloc)(size_t bytes); /* NULL: out of memory */
    void (*free)(void *mem);
    int (*sync)(void *ctx);       /* waits for what was enqueued on ctx */

    const char *(*error)(int code); /* never NULL */
} sp_device_kind;

/* The registered kinds besides the CPU, NULL-terminated, in the order the executor tries
 * them (codelets/devices.c): those this build has. */
const sp_device_kind *const *sp_device_kinds(void);
/* The registered kind named name ("cuda"); NULL if none. */
const sp_device_kind *sp_device_kind_by_name(const char *name);

#ifdef __cplusplus
}
#endif
#endif
