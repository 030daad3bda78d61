/* Device memory of the CUDA emulation (emu.h): host memory in blocks with fences around
 * them, checked after every kernel and copy so that a write out of bounds names what did
 * it. The fences hold a signaling NaN: a read out of bounds gives NaN, and arithmetic on
 * it a quiet one, so a value computed from it and written back still shows. A new block
 * is filled with quiet NaNs, so that memory read before it is written shows too. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>

#include "emu.h"

#define FENCE 256 /* bytes before and after each block; also its alignment */
static const uint32_t FRESH = 0x7fc00000u, FENCE_NAN = 0xff80deadu;

typedef struct {
    size_t bytes;
    int dev;
} dev_block;

/* by the address of the block's first byte (its leading fence) */
static std::map<uintptr_t, dev_block> &blocks(void)
{
    static std::map<uintptr_t, dev_block> *m = new std::map<uintptr_t, dev_block>;
    return *m;
}

static unsigned char fence_bytes[2 * FENCE + 4]; /* the pattern from an offset 0 mod 4 */
static size_t block_size(size_t bytes) { return (2 * FENCE + bytes + FENCE - 1) / FENCE * FENCE; }

static void fill(unsigned char *p, size_t n, uint32_t word)
{
    /* p is 4-aligned (FENCE and every size here are multiples of 4, bar the tail) */
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        memcpy(p + i, &word, 4);
    for (; i < n; i++)
        p[i] = (unsigned char)(word >> (8 * (i & 3)));
}

void *sp_emu_dev_alloc(int dev, size_t bytes)
{
    if (!fence_bytes[0])
        fill(fence_bytes, sizeof fence_bytes, FENCE_NAN);
    const size_t size = block_size(bytes);
    unsigned char *b = (unsigned char *)aligned_alloc(FENCE, size);
    if (!b)
        return NULL;
    fill(b, FENCE, FENCE_NAN);
    fill(b + FENCE, bytes, FRESH);
    /* the trailing fence starts wherever the block ends: keep the pattern's phase */
    for (size_t i = FENCE + bytes; i < size; i++)
        b[i] = (unsigned char)(FENCE_NAN >> (8 * (i & 3)));
    blocks()[(uintptr_t)b] = dev_block{ bytes, dev };
    return b + FENCE;
}

int sp_emu_dev_free(void *ptr)
{
    auto it = blocks().find((uintptr_t)ptr - FENCE);
    if (!ptr || it == blocks().end())
        return -1;
    sp_emu_check_fences("something before this cudaFree");
    free((void *)it->first);
    blocks().erase(it);
    return 0;
}

int sp_emu_dev_find(const void *p, size_t bytes, int *dev)
{
    const uintptr_t a = (uintptr_t)p;
    if (a < FENCE)
        return 0;
    auto it = blocks().upper_bound(a - FENCE); /* the first block after p's, if any */
    if (it == blocks().begin())
        return 0;
    --it;
    const uintptr_t lo = it->first + FENCE, hi = lo + it->second.bytes;
    if (a < lo || a > hi || bytes > hi - a)
        return 0;
    if (dev)
        *dev = it->second.dev;
    return 1;
}

size_t sp_emu_dev_used(int dev)
{
    size_t n = 0;
    for (auto &b : blocks())
        if (b.second.dev == dev)
            n += b.second.bytes;
    return n;
}

void sp_emu_dev_free_all(int dev)
{
    for (auto it = blocks().begin(); it != blocks().end();) {
        if (it->second.dev == dev) {
            free((void *)it->first);
            it = blocks().erase(it);
        } else {
            ++it;
        }
    }
}

static void fence_broken(const char *after, const dev_block &d, size_t at)
{
    sp_emu_die("%s wrote out of bounds of a %zu-byte cudaMalloc block, at float %lld of it",
               after, d.bytes, ((long long)(at & ~(size_t)3) - FENCE) / 4);
}

void sp_emu_check_fences(const char *after)
{
    for (auto &e : blocks()) {
        const unsigned char *b = (const unsigned char *)e.first;
        const size_t end = block_size(e.second.bytes), tail = FENCE + e.second.bytes;
        if (!memcmp(b, fence_bytes, FENCE) &&
            !memcmp(b + tail, fence_bytes + (tail & 3), end - tail))
            continue;
        for (size_t i = 0; i < end; i++) {
            if (i == FENCE)
                i = tail;
            if (b[i] != fence_bytes[i & 3])
                fence_broken(after, e.second, i);
        }
    }
}

void sp_emu_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("EMU: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}
