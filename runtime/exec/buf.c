/* Buffers: StarPU handles on the caller's memory, on pinned host memory, or on a GPU
 * rank in device memory only, with the host's bounded copies in and out. Relies on
 * state.c, tasks.c (access modes) and device.c (device memory). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/hostmem.h"
#include "runtime/exec/device.h"
#include "runtime/exec/exec_int.h"

/* ---- buffers ---- */

static sp_status wrap_handle(sp_exec_buf **out, int node, void *ptr, size_t count,
                             size_t elemsize)
{
    sp_exec_buf *b = malloc(sizeof *b);
    if (!b)
        return sp_set_error(SP_ERR_NOMEM, "%s:%d: out of memory", __FILE__, __LINE__);
    *b = (sp_exec_buf){ .count = count, .elemsize = elemsize, .node = STARPU_MAIN_RAM };
    /* home node -1: no copy anywhere until someone needs one */
    starpu_vector_data_register(&b->handle, ptr ? node : -1, (uintptr_t)ptr, (uint32_t)count,
                                elemsize);
    *out = b;
    return SP_OK;
}

static sp_status check_buf_args(const char *who, sp_exec_buf **out, size_t count, size_t elemsize)
{
    if (!X.started)
        return sp_set_error(SP_ERR_ARG, "%s: sp_exec_init first", who);
    if (!out || count == 0 || elemsize == 0 || count > UINT32_MAX)
        return sp_set_error(SP_ERR_ARG, "%s: bad arguments (count %zu, elemsize %zu)", who,
                            count, elemsize);
    return SP_OK;
}

sp_status sp_exec_buf_register(sp_exec_buf **out, void *ptr, size_t count, size_t elemsize)
{
    sp_status st = check_buf_args("sp_exec_buf_register", out, count, elemsize);
    return st ? st : wrap_handle(out, STARPU_MAIN_RAM, ptr, count, elemsize);
}

/* Host buffers of SP_MEM_HUGE_MIN (4 MB) and more go on transparent huge pages
 * (base/hostmem.h), from a 2 MB boundary to their end: on their 2 MB-aligned interior
 * alone, a 4 MB activation had half its rows on 4 KB pages (the GPT block's products on
 * huge pages: +2% on a Xeon core, bench/README.md, "Huge pages, whole"). StarPU's memory
 * is 64-byte aligned, so such a buffer takes 2 MB more and starts at the first boundary
 * inside, the block's own start kept just below it for the free. Not where StarPU pins
 * host memory for CUDA workers: the driver's pinned memory takes no advice, and 2 MB more
 * of it a buffer would be waste. Decided once a process, so that a free undoes its alloc.
 * The bytes such a buffer takes beyond its own: 0 for the others. */
static size_t huge_extra(size_t bytes)
{
    static int on = -1;
    int v = __atomic_load_n(&on, __ATOMIC_RELAXED);
    if (v < 0) {
        v = starpu_cuda_worker_get_count() == 0;
        int expect = -1;
        if (!__atomic_compare_exchange_n(&on, &expect, v, 0, __ATOMIC_RELAXED,
                                         __ATOMIC_RELAXED))
            v = expect;
    }
    return v && bytes >= SP_MEM_HUGE_MIN ? SP_MEM_HUGE_PAGE + 64 : 0;
}

void *sp_exec_host_alloc(size_t bytes)
{
    const size_t extra = huge_extra(bytes);
    void *raw = NULL;
    if (bytes > SIZE_MAX - extra ||
        starpu_malloc_flags(&raw, (bytes ? bytes : 1) + extra, STARPU_MALLOC_PINNED) != 0 ||
        !raw)
        return NULL;
    void *p = raw;
    if (extra) { /* raw is 64-byte aligned: the boundary is 8 to 2 MB + 56 bytes on */
        p = (void *)(((uintptr_t)raw + sizeof(void *) + SP_MEM_HUGE_PAGE - 1) &
                     ~(uintptr_t)(SP_MEM_HUGE_PAGE - 1));
        ((void **)p)[-1] = raw;
    }
    sp_mem_want_huge_pages(p, bytes);
    memset(p, 0, bytes);
    return p;
}

void sp_exec_host_free(void *ptr, size_t bytes)
{
    if (!ptr) return;
    const size_t extra = huge_extra(bytes);
    starpu_free_flags(extra ? ((void **)ptr)[-1] : ptr, (bytes ? bytes : 1) + extra,
                      STARPU_MALLOC_PINNED);
}

sp_status sp_exec_buf_create(sp_exec_buf **out, size_t count, size_t elemsize)
{
    sp_status st = check_buf_args("sp_exec_buf_create", out, count, elemsize);
    if (st)
        return st;
    size_t bytes = count * elemsize;
    int devid, node = sp_exec_dev_node(&devid);
    void *mem = NULL;
    if (node < 0) {
        if (!(mem = sp_exec_host_alloc(bytes)))
            return sp_set_error(SP_ERR_NOMEM, "out of host memory (a buffer of %zu bytes)", bytes);
        node = STARPU_MAIN_RAM;
    } else if ((st = sp_exec_dev_alloc(node, devid, bytes, &mem))) {
        return st;
    }
    if ((st = wrap_handle(out, node, mem, count, elemsize))) {
        if (node == STARPU_MAIN_RAM) sp_exec_host_free(mem, bytes);
        else sp_exec_dev_free(node, mem, bytes);
        return st;
    }
    (*out)->node = node;
    (*out)->mem = mem;
    return SP_OK;
}

int sp_exec_buf_on_device(const sp_exec_buf *b) { return b && b->node != STARPU_MAIN_RAM; }

/* Bytes [off, off + len) between the buffer's home memory and the host, after the
 * tasks submitted before (sequential consistency); to_host: which way. */
static sp_status buf_copy(const char *who, sp_exec_buf *b, size_t off, size_t len, void *host,
                          int to_host)
{
    if (!b || !host || off > b->count * b->elemsize || len > b->count * b->elemsize - off)
        return sp_set_error(SP_ERR_ARG, "%s: bad arguments (bytes %zu..%zu)", who, off, off + len);
    if (X.broken)
        return sp_exec_broken_error(who);
    int node = b->node;
    SP_STARPU_CHECK(starpu_data_acquire_on_node(b->handle, node, to_host ? STARPU_R : STARPU_RW));
    char *home = (char *)starpu_data_handle_to_pointer(b->handle, (unsigned)node);
    sp_status st = SP_OK;
    if (node == STARPU_MAIN_RAM) {
        if (to_host) memcpy(host, home + off, len);
        else memcpy(home + off, host, len);
    } else {
        st = sp_exec_dev_copy(node, home + off, host, len, to_host);
    }
    starpu_data_release_on_node(b->handle, node);
    if (!to_host) b->writer = NULL; /* the caller wrote it: a send of it waits for the release */
    return st;
}

sp_status sp_exec_buf_read(sp_exec_buf *b, size_t off, size_t len, void *dst)
{
    return buf_copy("sp_exec_buf_read", b, off, len, dst, 1);
}

sp_status sp_exec_buf_write(sp_exec_buf *b, size_t off, size_t len, const void *src)
{
    return buf_copy("sp_exec_buf_write", b, off, len, (void *)src, 0);
}

sp_status sp_exec_buf_unregister(sp_exec_buf *b)
{
    if (!b)
        return SP_OK;
    if (X.broken) { /* tasks of the lost step may still hold it: leave it to the exit */
        free(b);
        return sp_exec_broken_error("sp_exec_buf_unregister");
    }
    starpu_data_unregister(b->handle);
    if (b->mem && b->node == STARPU_MAIN_RAM)
        sp_exec_host_free(b->mem, b->count * b->elemsize);
    else if (b->mem)
        sp_exec_dev_free(b->node, b->mem, b->count * b->elemsize);
    free(b);
    return SP_OK;
}

size_t sp_exec_buf_count(const sp_exec_buf *b) { return b ? b->count : 0; }

sp_status sp_exec_buf_acquire(sp_exec_buf *b, sp_access_mode mode, void **ptr)
{
    if (!b || !ptr || (mode != SP_ACCESS_R && mode != SP_ACCESS_W && mode != SP_ACCESS_RW))
        return sp_set_error(SP_ERR_ARG, "sp_exec_buf_acquire: bad arguments");
    if (X.broken)
        return sp_exec_broken_error("sp_exec_buf_acquire");
    SP_STARPU_CHECK(starpu_data_acquire(b->handle, sp_exec_starpu_mode(mode)));
    *ptr = (void *)starpu_vector_get_local_ptr(b->handle);
    if (mode != SP_ACCESS_R)
        b->writer = NULL; /* the caller writes it: a send of it waits for the release */
    return SP_OK;
}

sp_status sp_exec_buf_release(sp_exec_buf *b)
{
    if (!b)
        return sp_set_error(SP_ERR_ARG, "sp_exec_buf_release: NULL buffer");
    starpu_data_release(b->handle);
    return SP_OK;
}
