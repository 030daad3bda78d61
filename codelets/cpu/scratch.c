/* sp_scratch (scratch_impl.h): one set of buffers per thread, behind a pthread key whose
 * destructor frees them when the thread ends. */
#include "codelets/cpu/scratch_impl.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    float *p[SP_SCRATCH_SLOTS];
    int64_t cap[SP_SCRATCH_SLOTS];
} scratch_set;

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void set_free(void *v)
{
    scratch_set *s = v;
    for (int i = 0; i < SP_SCRATCH_SLOTS; i++) free(s->p[i]);
    free(s);
}

static void key_init(void) { pthread_key_create(&key, set_free); }

float *sp_scratch(int slot, int64_t n)
{
    if (slot < 0 || slot >= SP_SCRATCH_SLOTS || n < 0 || (uint64_t)n > SIZE_MAX / 8)
        return NULL;
    pthread_once(&once, key_init);
    scratch_set *s = pthread_getspecific(key);
    if (!s && (s = calloc(1, sizeof *s)) && pthread_setspecific(key, s)) {
        free(s);
        return NULL;
    }
    if (!s) return NULL;
    if (s->cap[slot] < n || !s->p[slot]) {
        /* rounded up to whole lines: aligned_alloc wants a multiple of the alignment */
        const size_t bytes = ((size_t)(n > 0 ? n : 1) * sizeof(float) + 63) & ~(size_t)63;
        free(s->p[slot]);
        s->p[slot] = aligned_alloc(64, bytes);
        s->cap[slot] = s->p[slot] ? n : 0;
    }
    return s->p[slot];
}
