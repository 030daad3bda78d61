/* Private copies of sends, reused by size (both host transports). A send that went from
 * the pipeline's own buffer would hold that buffer until MPI completes it, which is only
 * once the receiver has taken the data: a busy receiver does that after its task, tens of
 * milliseconds later, and the plan's pool hands the buffer to the sender's next task long
 * before. So every send goes from a copy made as it is posted, and the buffer goes back
 * at once. A block keeps a slot for its transport (StarPU-MPI: the block's registered
 * handle). Thread-safe. */
#ifndef STARPIPE_COMM_STAGE_H
#define STARPIPE_COMM_STAGE_H

#include <pthread.h>
#include <stddef.h>

typedef struct sp_stage {
    size_t bytes;
    void *user;            /* the transport's: NULL in a new block */
    struct sp_stage *next; /* free list */
    _Alignas(64) unsigned char data[];
} sp_stage;

typedef struct {
    pthread_mutex_t lock;
    sp_stage *free_blocks;
    size_t bytes; /* every block's, in use or free */
} sp_stage_pool;

#define SP_STAGE_POOL_INIT { .lock = PTHREAD_MUTEX_INITIALIZER }

/* A free block of exactly bytes, or a new one; NULL when out of memory. */
sp_stage *sp_stage_get(sp_stage_pool *p, size_t bytes);
void sp_stage_put(sp_stage_pool *p, sp_stage *b);
/* Bytes held in blocks, in use or free. */
size_t sp_stage_bytes(sp_stage_pool *p);
/* With every block back: frees them, calling fini (may be NULL) on each first. */
void sp_stage_clear(sp_stage_pool *p, void (*fini)(sp_stage *b));

#endif
