/* Private copies of sends, reused by size (stage.h). */
#include <stdlib.h>

#include "comm/stage.h"

sp_stage *sp_stage_get(sp_stage_pool *p, size_t bytes)
{
    pthread_mutex_lock(&p->lock);
    sp_stage **q = &p->free_blocks;
    while (*q && (*q)->bytes != bytes)
        q = &(*q)->next;
    sp_stage *b = *q;
    if (b)
        *q = b->next;
    pthread_mutex_unlock(&p->lock);
    if (!b && (b = malloc(sizeof *b + bytes))) {
        b->bytes = bytes;
        b->user = NULL;
        pthread_mutex_lock(&p->lock);
        p->bytes += bytes;
        pthread_mutex_unlock(&p->lock);
    }
    return b;
}

void sp_stage_put(sp_stage_pool *p, sp_stage *b)
{
    pthread_mutex_lock(&p->lock);
    b->next = p->free_blocks;
    p->free_blocks = b;
    pthread_mutex_unlock(&p->lock);
}

size_t sp_stage_bytes(sp_stage_pool *p)
{
    pthread_mutex_lock(&p->lock);
    size_t n = p->bytes;
    pthread_mutex_unlock(&p->lock);
    return n;
}

void sp_stage_clear(sp_stage_pool *p, void (*fini)(sp_stage *b))
{
    pthread_mutex_lock(&p->lock);
    while (p->free_blocks) {
        sp_stage *b = p->free_blocks;
        p->free_blocks = b->next;
        if (fini)
            fini(b);
        free(b);
    }
    p->bytes = 0;
    pthread_mutex_unlock(&p->lock);
}
