/* The executor's device (device.c): the rank's device kind (include/starpipe/device.h,
 * one row of codelets/devices.c) as StarPU's workers and memory nodes see it, so that no
 * file of runtime/ names a device API. A rank of CPUs only has no kind, and each function
 * answers as such a rank. */
#ifndef STARPIPE_RUNTIME_EXEC_DEVICE_H
#define STARPIPE_RUNTIME_EXEC_DEVICE_H

#include <stddef.h>

#include <starpu.h>

#include "runtime/gpumap.h"
#include "starpipe/device.h"
#include "starpipe/status.h"

/* The rank's kind from STARPIPE_DEVICE (name: a kind, "cpu" for none; NULL: the first
 * registered kind that is not opt-in), before StarPU starts. A name no kind has is
 * SP_ERR_ARG, naming the kinds this build has. */
sp_status sp_exec_dev_select(const char *name);
const sp_device_kind *sp_exec_dev_kind(void);

/* The devices the kind sees for the GPU choice (0 for a kind that StarPU opens by other
 * means, or none), and device dev's PCI address into bus: 1, or 0 when unknown. */
int sp_exec_dev_count(void);
int sp_exec_dev_pci(int dev, char *bus, size_t len);
/* The StarPU variables of the choice (a user's own settings win); every other kind's
 * workers are left closed. */
void sp_exec_dev_open(const sp_gpu_choice *gpu);
/* Whether the choice gives the rank a device worker (before StarPU starts). */
int sp_exec_dev_chosen(const sp_gpu_choice *gpu);

/* The workers, once StarPU has started (sp_exec_dev_start): how many are the kind's, and
 * whether worker w is. */
int sp_exec_dev_nworkers(void);
int sp_exec_dev_is_worker(unsigned w);
/* The calling worker's device: the kind's on its workers (state in storage,
 * SP_DEVICE_CTX_BYTES bytes, the caller's while the device is in use), else the CPU's.
 * *async: the task's kernels only enqueue (the kind's async). */
sp_device sp_exec_dev_of_worker(void *storage, int *async);
/* Gives codelet cl run as the implementation of the kind's StarPU worker type. */
void sp_exec_dev_codelet(struct starpu_codelet *cl, starpu_cuda_func_t run);
/* Once StarPU has started: the kind's workers found and its libraries started (TF32
 * products if tf32). Before it stops: what start made goes. */
sp_status sp_exec_dev_start(int tf32);
void sp_exec_dev_stop(void);

/* The rank's device memory, from the main thread. The memory node of the kind's first
 * worker and *devid its device, or -1 on a rank without one. */
int sp_exec_dev_node(int *devid);
/* bytes of zeroed memory on node, device devid's, into *mem. */
sp_status sp_exec_dev_alloc(int node, int devid, size_t bytes, void **mem);
void sp_exec_dev_free(int node, void *mem, size_t bytes);
/* len bytes between dev, on node, and host; to_host says which way. */
sp_status sp_exec_dev_copy(int node, void *dev, void *host, size_t len, int to_host);

#endif
