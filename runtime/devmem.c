/* The device memory a GPU rank can still give its buffers, read before step 1 so that the
 * apps refuse a run that cannot fit (apps/preflight.c) instead of failing inside StarPU in
 * the middle of a step. */
#include <stdio.h>
#include <string.h>

#include <starpu.h>

#include "comm/nccl_peers.h" /* the host and GPU as NCCL identifies them */
#include "starpipe/device.h"
#include "starpipe/exec.h"

sp_status sp_exec_device_memory(sp_exec_devmem *out)
{
    if (!out) return sp_set_error(SP_ERR_ARG, "sp_exec_device_memory: NULL argument");
    memset(out, 0, sizeof *out);
    out->device = -1;
    const sp_device_kind *k = sp_exec_device();
    if (!k) return SP_OK;
    /* the device of the rank's (first) device worker, where StarPU puts the buffers: the
     * main thread's current device may be another (device 0 by default) */
    unsigned worker = 0;
    while (worker < starpu_worker_get_count() && !k->owns_worker(worker)) worker++;
    int dev = starpu_worker_get_devid((int)worker);
    unsigned node = starpu_worker_get_memory_node(worker);
    size_t cuda_free = 0, total = 0;
    char bus[32] = "";
    int c = k->mem_info(dev, &cuda_free, &total);
    if (c)
        return sp_set_error(SP_ERR_RUNTIME, "%s:%d: device %d's memory: %s", __FILE__, __LINE__,
                            dev, k->error(c));
    if (k->bus_id(dev, bus, (int)sizeof bus)) bus[0] = 0; /* unknown: the host alone */
    out->device = dev;
    sp_nccl_peer me;
    sp_nccl_peer_local(bus, &me);
    out->bus = sp_nccl_bus_number(bus);
    out->host = 1469598103934665603ull; /* FNV-1a of the host string */
    for (const unsigned char *k = (const unsigned char *)me.key; *k; k++)
        out->host = (out->host ^ *k) * 1099511628211ull;
    out->total = total;
    out->cuda_free = cuda_free;
    /* StarPU 1.3.10 never allocates past its own cap of the node, 90% of the device's
     * total by default (STARPU_LIMIT_CUDA_MEM or STARPU_LIMIT_CUDA_<dev>_MEM in MiB
     * instead: src/drivers/cuda/driver_cuda.c, _starpu_cuda_limit_gpu_mem_if_needed);
     * starpu_memory_get_total/available read that cap and StarPU's own use of it (-1: no
     * cap, as when 90% of a small device rounds down to 0 MiB). What StarPU holds already
     * is counted as free: it is the rank's own buffers, which the caller's estimate
     * covers. */
    starpu_ssize_t cap = starpu_memory_get_total(node), avail = starpu_memory_get_available(node);
    size_t held = cap > 0 && avail >= 0 && avail <= cap ? (size_t)(cap - avail) : 0;
    out->free = cuda_free + held;
    if (cap > 0) {
        out->starpu_cap = (size_t)cap;
        if ((size_t)cap < out->free) out->free = (size_t)cap;
    }
    return SP_OK;
}
