/* The executor's device (device.c): all that runtime/exec/ does with CUDA, behind plain
 * functions of StarPU's memory nodes and workers, so that no other file of the folder
 * names CUDA. In a build without CUDA each one answers as a rank without a GPU. */
#ifndef STARPIPE_RUNTIME_EXEC_DEVICE_H
#define STARPIPE_RUNTIME_EXEC_DEVICE_H

#include <stddef.h>

#include <starpu.h>

#include "codelets/cuda/backend.h" /* sp_cuda_ctx, and sp_device (starpipe/backend.h) */
#include "starpipe/status.h"

/* What was built: StarPU with CUDA workers (STARPU_USE_CUDA: a task may be held to
 * them), and StarPU with starpipe's CUDA kernels (STARPIPE_HAVE_CUDA too: a rank may
 * run on a GPU). */
int sp_exec_dev_starpu_cuda(void);
int sp_exec_dev_cuda(void);

/* The host's GPUs as the CUDA runtime sees them (0 without CUDA), and GPU dev's PCI
 * address into bus: 1, or 0 when unknown. */
int sp_exec_dev_count(void);
int sp_exec_dev_pci(int dev, char *bus, size_t len);

/* The workers. How many CUDA workers StarPU started. */
int sp_exec_dev_nworkers(void);
/* The calling worker's device: a CUDA worker's stream and cuBLAS handle (kept in *c, the
 * caller's while the device is in use), else the CPU's. */
sp_device sp_exec_dev_of_worker(sp_cuda_ctx *c);
/* Gives codelet cl its CUDA implementation, run, asynchronous (the task ends when StarPU
 * sees its stream done); without CUDA, nothing. */
void sp_exec_dev_codelet(struct starpu_codelet *cl, starpu_cuda_func_t run);
/* Once StarPU has started: a cuBLAS handle per CUDA worker, TF32 products if tf32. Before
 * it stops: the handles and the main thread's stream go. */
void sp_exec_dev_start(int tf32);
void sp_exec_dev_stop(void);

/* The rank's device memory, from the main thread (on a stream of its own, synchronised
 * before each call returns). The CUDA worker's memory node and *devid its device, or -1
 * on a rank without one. */
int sp_exec_dev_node(int *devid);
/* bytes of zeroed memory on node, device devid's, into *mem. */
sp_status sp_exec_dev_alloc(int node, int devid, size_t bytes, void **mem);
void sp_exec_dev_free(int node, void *mem, size_t bytes);
/* len bytes between dev, on node, and host; to_host says which way. */
sp_status sp_exec_dev_copy(int node, void *dev, void *host, size_t len, int to_host);

#endif
