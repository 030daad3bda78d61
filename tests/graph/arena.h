/* A one-microbatch set of buffers for running stage programs directly in tests:
 * one slab per (buffer class, index), sized by the program. */
#ifndef STARPIPE_TEST_ARENA_H
#define STARPIPE_TEST_ARENA_H

#include <stdlib.h>
#include <string.h>

#include "starpipe/program.h"

#define ARENA_MAX 64

typedef struct {
    const sp_program *p;
    int n;
    sp_buf_class cls[ARENA_MAX];
    int index[ARENA_MAX];
    size_t bytes[ARENA_MAX];
    void *buf[ARENA_MAX];
} arena;

static inline void *arena_get(arena *a, sp_buf_class cls, int index)
{
    for (int j = 0; j < a->n; j++)
        if (a->cls[j] == cls && a->index[j] == index) return a->buf[j];
    if (a->n == ARENA_MAX) abort();
    size_t bytes = sp_program_buf_bytes(a->p, cls, index);
    a->cls[a->n] = cls;
    a->index[a->n] = index;
    a->bytes[a->n] = bytes;
    a->buf[a->n] = calloc(bytes ? bytes : 1, 1);
    return a->buf[a->n++];
}

static inline void arena_copy(arena *dst, const arena *src)
{
    *dst = *src;
    for (int j = 0; j < src->n; j++) {
        dst->buf[j] = malloc(src->bytes[j] ? src->bytes[j] : 1);
        memcpy(dst->buf[j], src->buf[j], src->bytes[j]);
    }
}

static inline void arena_free(arena *a)
{
    for (int j = 0; j < a->n; j++) free(a->buf[j]);
    a->n = 0;
}

/* Runs (stage, kind) with the arena's buffers; inputs are read from the arena too. */
static inline sp_status arena_run(arena *a, int stage, sp_task_kind kind, float dloss)
{
    int nb = sp_program_num_bufs(a->p, stage, kind);
    void *bufs[ARENA_MAX];
    for (int j = 0; j < nb; j++) {
        sp_slab_ref r = sp_program_buf(a->p, stage, kind, j);
        bufs[j] = arena_get(a, r.cls, r.index);
    }
    sp_run_args args = { .dloss = dloss };
    return sp_program_run(a->p, stage, kind, bufs, &args);
}

#endif
