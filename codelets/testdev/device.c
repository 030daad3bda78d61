/* The test device (include/starpipe/device.h): StarPU's CPU workers of a second memory
 * node, their kernels the CPU's. Under STARPU_USE_NUMA=1 and a topology of two NUMA nodes
 * (tests/testdev/), StarPU gives the workers of the second one their own memory node and
 * moves data to and from it as it would to a GPU; STARPIPE_DEVICE=testdev makes them the
 * rank's device. So the executor's device path (buffers on the device's node, copies to
 * and from the host, tasks held to device workers) runs on any machine, with the CPU's
 * bits to compare against. It exists to prove that a device is one folder and one row
 * of codelets/devices.c; it is never used unless named. */
#include "codelets/testdev/device.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <starpu.h>

#include "base/hostmem.h"

static const char *error(int code)
{
    return code == 0 ? "ok" : code == 1 ? "out of host memory" : "unknown test device code";
}

/* Its kernels: the CPU table's, under the device's own name. */
static const sp_backend *kernels(void)
{
    static sp_backend table;
    if (!table.name) {
        table = *sp_backend_cpu();
        table.name = "testdev";
    }
    return &table;
}

/* One device, the second NUMA node's memory. */
static int count(void) { return 1; }
static int bus_id(int dev, char *bus, int len) { return 1; } /* no PCI address */

static int mem_info(int dev, size_t *free_bytes, size_t *total)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    *total = pages > 0 && size > 0 ? (size_t)pages * (size_t)size : 0;
    double avail = sp_mem_available(NULL, 0);
    *free_bytes = avail > 0 ? (size_t)avail : 0;
    return 0;
}

static int owns_worker(unsigned w)
{
    return starpu_worker_get_type((int)w) == STARPU_CPU_WORKER &&
           starpu_worker_get_memory_node(w) != STARPU_MAIN_RAM;
}

static int start(int tf32) { return 0; }
static void stop(void) {}

static sp_device worker_device(void *ctx_storage)
{
    sp_device d = { SP_DEVICE_CPU, kernels(), NULL, NULL, NULL, 0 };
    return d;
}

/* Its memory is the host's: the main thread reaches it directly. */
static int zero(int dev, void *mem, size_t bytes)
{
    memset(mem, 0, bytes);
    return 0;
}

static int copy(int dev, void *dst, const void *src, size_t bytes, int to_host)
{
    memcpy(dst, src, bytes);
    return 0;
}

static int task_alloc(const sp_device *d, void **mem, size_t bytes)
{
    *mem = malloc(bytes ? bytes : 1);
    return *mem ? 0 : 1;
}

static void task_free(const sp_device *d, void *mem) { free(mem); }

static int ctx_create(int dev, void **ctx)
{
    *ctx = NULL;
    return 0;
}

static void ctx_destroy(void *ctx) {}
static void *alloc(size_t bytes) { return malloc(bytes ? bytes : 1); }
static void release(void *mem) { free(mem); }
static int sync_ctx(void *ctx) { return 0; }

const sp_device_kind *sp_device_kind_testdev(void)
{
    static sp_device_kind kind;
    if (!kind.name)
        kind = (sp_device_kind){ .name = "testdev", .type = SP_DEVICE_CPU,
                                 .starpu_arch = STARPU_CPU_WORKER, .opt_in = 1, .cpu_bits = 1,
                                 .kernels = kernels(), .owns_worker = owns_worker,
                                 .count = count, .bus_id = bus_id, .mem_info = mem_info,
                                 .start = start, .stop = stop, .worker_device = worker_device,
                                 .zero = zero, .copy = copy, .task_alloc = task_alloc,
                                 .task_free = task_free, .ctx_create = ctx_create,
                                 .ctx_destroy = ctx_destroy, .alloc = alloc, .free = release,
                                 .sync = sync_ctx, .error = error };
    return &kind;
}
