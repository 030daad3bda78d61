/* The executor's device (device.h): the rank's device kind, chosen once before StarPU
 * starts, its workers among StarPU's, and its memory through the kind's table. Relies on
 * StarPU and the registry of kinds (codelets/devices.c), on nothing else of the executor;
 * it names no device API: a new device adds a row to the registry, not a case here. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec/device.h"
#include "sched/policy.h"

static const sp_device_kind *kind; /* the rank's; NULL: CPUs only */
static int nworkers;
static unsigned char is_worker[STARPU_NMAXWORKERS];

sp_status sp_exec_dev_select(const char *name)
{
    kind = NULL;
    if (name && !strcmp(name, "cpu")) return SP_OK;
    const sp_device_kind *const *all = sp_device_kinds();
    if (!name) {
        for (const sp_device_kind *const *k = all; *k && !kind; k++)
            if (!(*k)->opt_in) kind = *k;
        return SP_OK;
    }
    if ((kind = sp_device_kind_by_name(name))) return SP_OK;
    char list[256] = "cpu";
    for (const sp_device_kind *const *k = all; *k; k++) {
        size_t n = strlen(list);
        snprintf(list + n, sizeof list - n, ", %s", (*k)->name);
    }
    return sp_set_error(SP_ERR_ARG, "STARPIPE_DEVICE=%s: this build has no such device (it "
                        "has: %s)", name, list);
}

const sp_device_kind *sp_exec_dev_kind(void) { return kind; }

/* ---- the device choice (runtime/exec/startup.c, runtime/gpumap.c) ---- */

int sp_exec_dev_count(void)
{
    return kind && kind->starpu_count_var && kind->count ? kind->count() : 0;
}

int sp_exec_dev_pci(int dev, char *bus, size_t len)
{
    return kind && kind->bus_id && kind->bus_id(dev, bus, (int)len) == 0;
}

void sp_exec_dev_open(const sp_gpu_choice *gpu)
{
    for (const sp_device_kind *const *k = sp_device_kinds(); *k; k++) {
        if (!(*k)->starpu_count_var) continue;
        if (*k != kind) {
            setenv((*k)->starpu_count_var, "0", 0);
            continue;
        }
        setenv(kind->starpu_count_var, gpu->ncuda, 0); /* a user's own StarPU settings win */
        if (gpu->device >= 0 && kind->starpu_ids_var)
            setenv(kind->starpu_ids_var, gpu->cudaid, 0);
    }
}

int sp_exec_dev_chosen(const sp_gpu_choice *gpu)
{
    if (!kind || !kind->starpu_count_var) return 0;
    const char *n = getenv(kind->starpu_count_var);
    return gpu->device >= 0 && (!n || strcmp(n, "0") != 0);
}

/* ---- the workers ---- */

int sp_exec_dev_nworkers(void) { return nworkers; }

int sp_exec_dev_is_worker(unsigned w) { return w < STARPU_NMAXWORKERS && is_worker[w]; }

sp_device sp_exec_dev_of_worker(void *storage, int *async)
{
    int w = starpu_worker_get_id();
    if (w >= 0 && is_worker[w]) {
        *async = kind->async;
        return kind->worker_device(storage);
    }
    *async = 0;
    return sp_device_cpu();
}

void sp_exec_dev_codelet(struct starpu_codelet *cl, starpu_cuda_func_t run)
{
    for (const sp_device_kind *const *k = sp_device_kinds(); *k; k++)
        if ((*k)->starpu_arch == STARPU_CUDA_WORKER) {
            cl->cuda_funcs[0] = run;
            cl->cuda_flags[0] = (*k)->async ? STARPU_CUDA_ASYNC : 0;
        }
}

sp_status sp_exec_dev_start(int tf32)
{
    nworkers = 0;
    memset(is_worker, 0, sizeof is_worker);
    if (!kind) return SP_OK;
    unsigned n = starpu_worker_get_count();
    for (unsigned w = 0; w < n && w < STARPU_NMAXWORKERS; w++)
        if (kind->owns_worker(w)) is_worker[w] = 1, nworkers++;
    sp_policy_set_device_workers(is_worker); /* their inputs prefetched as tasks get ready */
    int rc = kind->start(tf32);
    return rc ? sp_set_error(SP_ERR_RUNTIME, "starting the %s device's workers failed: %s",
                             kind->name, kind->error(rc))
              : SP_OK;
}

void sp_exec_dev_stop(void)
{
    if (kind) kind->stop();
    sp_policy_set_device_workers(NULL);
    nworkers = 0;
    memset(is_worker, 0, sizeof is_worker);
}

/* ---- device memory ---- */

int sp_exec_dev_node(int *devid)
{
    *devid = -1;
    for (unsigned w = 0; w < STARPU_NMAXWORKERS && nworkers; w++)
        if (is_worker[w]) {
            *devid = starpu_worker_get_devid((int)w);
            return (int)starpu_worker_get_memory_node(w);
        }
    return -1;
}

/* Pieces of host copies of device buffers: a checkpoint of a large stage never needs
 * the whole slab on the host (the copy functions stage nothing themselves; the caller's
 * destination is the only host memory). */
#define SP_EXEC_COPY_PIECE ((size_t)64 << 20)

sp_status sp_exec_dev_alloc(int node, int devid, size_t bytes, void **mem)
{
    void *p = (void *)starpu_malloc_on_node((unsigned)node, bytes);
    if (!p)
        return sp_set_error(SP_ERR_NOMEM, "out of memory on the rank's %s device %d (a "
                            "buffer of %zu bytes)", kind->name, devid, bytes);
    int rc = kind->zero(devid, p, bytes);
    if (rc) {
        starpu_free_on_node((unsigned)node, (uintptr_t)p, bytes);
        return sp_set_error(SP_ERR_RUNTIME, "zeroing a buffer on the rank's %s device failed: "
                            "%s", kind->name, kind->error(rc));
    }
    *mem = p;
    return SP_OK;
}

void sp_exec_dev_free(int node, void *mem, size_t bytes)
{
    starpu_free_on_node((unsigned)node, (uintptr_t)mem, bytes);
}

sp_status sp_exec_dev_copy(int node, void *dev, void *host, size_t len, int to_host)
{
    int devid = starpu_memory_node_get_devid((unsigned)node);
    for (size_t done = 0; done < len; done += SP_EXEC_COPY_PIECE) {
        size_t n = len - done < SP_EXEC_COPY_PIECE ? len - done : SP_EXEC_COPY_PIECE;
        char *h = (char *)host + done, *d = (char *)dev + done;
        int rc = kind->copy(devid, to_host ? h : d, to_host ? d : h, n, to_host);
        if (rc)
            return sp_set_error(SP_ERR_RUNTIME, "%s on the rank's %s device failed: %s",
                                to_host ? "a copy to the host" : "a copy from the host",
                                kind->name, kind->error(rc));
    }
    return SP_OK;
}
