/* The trainer's buffers: persistent stage slabs, and per-microbatch buffers
 * (activations, boundary tensors, their gradients) from a pool that follows the plan's
 * FREEs, registered with the executor on first use. */
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "runtime/trainer_impl.h"

static size_t floats_of(const sp_trainer *t, sp_buf_class c, int idx)
{
    size_t b = sp_tr_bytes(t, c, idx) / 4;
    return b ? b : 1; /* StarPU wants non-empty buffers */
}

/* A buffer of the tasks, created on first use where they run (sp_exec_buf_create: device
 * memory on a GPU rank, with no host copy), zeroed rather than left to StarPU's lazy
 * allocation: StarPU refuses to read a never-written buffer, and a program may
 * accumulate (read) into a buffer whose first writer it is. */
static sp_exec_buf *lazy_buf(sp_trainer *t, sp_exec_buf **slot, size_t floats)
{
    if (*slot) return *slot;
    if (sp_exec_buf_create(slot, floats, sizeof(float)) != SP_OK) return NULL;
    if (!sp_exec_buf_on_device(*slot)) t->host_mem += floats * sizeof(float);
    return *slot;
}

/* A buffer made on first use that lives as long as the trainer (task scratch, a tied
 * parameter's transfer buffers): counted with the persistent ones. */
static sp_exec_buf *lazy_persistent(sp_trainer *t, sp_exec_buf **slot, size_t floats)
{
    if (*slot) return *slot;
    sp_exec_buf *b = lazy_buf(t, slot, floats);
    if (b) t->persistent_bytes += floats * sizeof(float);
    return b;
}

/* The same in host memory, for what the host reads every step (the losses). */
static sp_exec_buf *lazy_host_buf(sp_trainer *t, sp_exec_buf **slot, size_t floats)
{
    void *mem;
    if (*slot) return *slot;
    return sp_tr_register_mem(t, slot, &mem, floats, sizeof(float)) == SP_OK ? *slot : NULL;
}

/* Per-microbatch buffers (activations, boundary tensors and their gradients) come from a
 * pool whose buffers ("slots") are planned before the first step. The trainer walks its
 * plan once without submitting anything (t->pool.dry: sp_tr_pool_plan), and each take of a
 * buffer is recorded with its size, whether the size must be exact (buffers that travel
 * have the size the peer registered; activations may sit in a larger one) and its
 * lifetime, from the take to its give (the plan's FREE), and sp_pool_pack (sched/pool.c)
 * packs those lifetimes into slots. A real step makes the same takes in the same
 * order (the walk depends on the plan only) and the k-th gets its planned slot. Taking a
 * slot back early is safe without any wait here: StarPU orders the new writer after the
 * old readers and sends. A greedy pool deciding at each take cannot know what comes next:
 * one that handed out the smallest larger free buffer grew interleaved-1F1B's pool to
 * 1.32x the plan's live bytes. */
static sp_exec_buf *pool_take(sp_trainer *t, sp_exec_buf **slot, size_t floats, int exact)
{
    if (*slot) return *slot;
    sp_tr_pool_walk *w = &t->pool.walk[t->pool.running];
    if (t->pool.dry) {
        if (w->n == w->cap) {
            int cap = w->cap ? 2 * w->cap : 256;
            sp_tr_pool_take *n = realloc(w->take, (size_t)cap * sizeof *n);
            if (!n) {
                sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
                return NULL;
            }
            w->take = n, w->cap = cap;
        }
        w->take[w->n] = (sp_tr_pool_take){ floats, exact, t->pool.clock, -1, -1 };
        t->pool.clock++;
        /* a token, never dereferenced: nothing is submitted in a dry walk */
        return *slot = (sp_exec_buf *)(uintptr_t)(++w->n);
    }
    if (t->pool.next >= w->n || w->take[t->pool.next].floats != floats ||
        w->take[t->pool.next].exact != exact) {
        sp_set_error(SP_ERR_RUNTIME, "trainer: take %d of %zu floats differs from the planned "
                     "walk (%d takes)", t->pool.next, floats, w->n);
        return NULL;
    }
    int k = w->take[t->pool.next++].slot;
    if (!t->pool.buf[k]) {
        if (!lazy_buf(t, &t->pool.buf[k], t->pool.slot[k].size)) return NULL;
        t->pool.bytes += t->pool.slot[k].size * sizeof(float);
    }
    return *slot = t->pool.buf[k];
}

void sp_tr_pool_give(sp_trainer *t, sp_exec_buf **slot)
{
    if (!*slot) return;
    if (t->pool.dry) {
        sp_tr_pool_walk *w = &t->pool.walk[t->pool.running];
        w->take[(uintptr_t)*slot - 1].to = t->pool.clock++;
    }
    *slot = NULL;
}

void sp_tr_pool_begin(sp_trainer *t, int walk)
{
    t->pool.running = walk;
    t->pool.next = 0;
    t->pool.clock = 0;
    if (t->pool.dry) t->pool.walk[walk].n = 0;
}

/* Packs one walk's takes into slots (sched/pool.c), starting from the slots of the walks
 * before (the walks run apart, so each may use every slot). */
static sp_status pack_walk(sp_trainer *t, sp_tr_pool_walk *w)
{
    sp_lifetime *x = malloc(sizeof *x * (size_t)(w->n + 1));
    int *slot_of = malloc(sizeof(int) * (size_t)(w->n + 1));
    sp_status st = x && slot_of ? SP_OK : sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int i = 0; i < w->n && st == SP_OK; i++) /* one alive to the end ends there */
        x[i] = (sp_lifetime){ w->take[i].floats, w->take[i].exact, w->take[i].from,
                              w->take[i].to >= 0 ? w->take[i].to : t->pool.clock };
    int before = t->pool.nslots;
    if (st == SP_OK) st = sp_pool_pack(x, w->n, &t->pool.slot, &t->pool.nslots, slot_of);
    sp_exec_buf **bufs = st ? NULL : realloc(t->pool.buf, sizeof *bufs * (size_t)(t->pool.nslots + 1));
    if (st == SP_OK && !bufs) st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    if (st == SP_OK) {
        t->pool.buf = bufs;
        for (int s = before; s < t->pool.nslots; s++) bufs[s] = NULL; /* registered on use */
        for (int i = 0; i < w->n; i++) w->take[i].slot = slot_of[i];
    }
    free(x), free(slot_of);
    return st;
}

sp_status sp_tr_pool_plan(sp_trainer *t, sp_status (*walk)(sp_trainer *, int), int nwalks)
{
    sp_status st = SP_OK;
    for (int w = 0; w < nwalks && st == SP_OK; w++) {
        t->pool.dry = 1;
        sp_tr_pool_begin(t, w);
        st = walk(t, w);
        t->pool.dry = 0;
        if (st == SP_OK) st = pack_walk(t, &t->pool.walk[w]);
    }
    return st;
}

void sp_tr_pool_free(sp_trainer *t)
{
    for (int s = 0; s < t->pool.nslots; s++)
        if (t->pool.buf[s]) sp_exec_buf_unregister(t->pool.buf[s]);
    for (int w = 0; w < 2; w++) free(t->pool.walk[w].take);
    free(t->pool.slot), free(t->pool.buf);
}

sp_exec_buf **sp_tr_mb_slot(sp_trainer *t, sp_buf_class c, int idx, int mb)
{
    switch (c) {
    case SP_BUF_ACT: return &t->h_act[mb * t->S + idx];
    case SP_BUF_BGRAD: return &t->h_bgrad[mb * t->S + idx];
    case SP_BUF_EDGE_FWD: return &t->h_efwd[mb * t->E + idx];
    case SP_BUF_EDGE_GRAD: return &t->h_egrad[mb * t->E + idx];
    default: return NULL;
    }
}

sp_exec_buf *sp_tr_pool_scratch(sp_trainer *t, sp_exec_buf **slot, size_t floats)
{
    return pool_take(t, slot, floats ? floats : 1, 1);
}

sp_exec_buf *sp_tr_slab_buf(sp_trainer *t, sp_buf_class c, int idx, int mb)
{
    switch (c) {
    case SP_BUF_PARAMS: return t->h_params[idx];
    case SP_BUF_GRADS: return t->h_grads[idx];
    case SP_BUF_SCRATCH:
        return lazy_persistent(t, &t->h_scratch[idx], floats_of(t, c, idx));
    case SP_BUF_ACT:
    case SP_BUF_BGRAD: return pool_take(t, sp_tr_mb_slot(t, c, idx, mb), floats_of(t, c, idx), 0);
    case SP_BUF_EDGE_FWD:
    case SP_BUF_EDGE_GRAD: return pool_take(t, sp_tr_mb_slot(t, c, idx, mb), floats_of(t, c, idx), 1);
    case SP_BUF_INPUT: return t->h_input[mb * t->nin + idx];
    case SP_BUF_LOSS: return lazy_host_buf(t, &t->h_loss[mb], 1);
    default: return NULL;
    }
}

/* The plan's FREE: the buffer goes back to the pool. */
void sp_tr_free_buf(sp_trainer *t, const sp_buf *b)
{
    sp_exec_buf **slot = NULL;
    switch (b->cls) {
    case SP_BUF_ACT: slot = sp_tr_mb_slot(t, SP_BUF_ACT, b->idx, b->mb); break;
    case SP_BUF_BGRAD: slot = sp_tr_mb_slot(t, SP_BUF_BGRAD, b->idx, b->mb); break;
    case SP_BUF_EDGE_FWD: slot = sp_tr_mb_slot(t, SP_BUF_EDGE_FWD, b->idx, b->mb); break;
    case SP_BUF_EDGE_GRAD: slot = sp_tr_mb_slot(t, SP_BUF_EDGE_GRAD, b->idx, b->mb); break;
    default: return; /* persistent buffers and tied-weight transfers stay */
    }
    sp_tr_pool_give(t, slot);
}

/* The tied parameter behind the plan's shared k: its slab offsets, its size, its owner
 * (the tables of train_create.c). */
int64_t sp_tr_shared_off(const sp_trainer *t, int k, int stage)
{
    return t->shared_off[k * t->S + stage];
}
int64_t sp_tr_shared_numel(const sp_trainer *t, int k)
{
    return t->shared_numel[k];
}
int sp_tr_shared_owner(const sp_trainer *t, int k)
{
    return t->model->shared[k].stages[0];
}

/* The buffer a SEND or RECV of the plan moves. */
sp_exec_buf *sp_tr_transfer_buf(sp_trainer *t, const sp_buf *b)
{
    switch (b->cls) {
    case SP_BUF_EDGE_FWD: return sp_tr_slab_buf(t, SP_BUF_EDGE_FWD, b->idx, b->mb);
    case SP_BUF_EDGE_GRAD: return sp_tr_slab_buf(t, SP_BUF_EDGE_GRAD, b->idx, b->mb);
    case SP_BUF_SHARED_GRAD:
        return lazy_persistent(t, &t->h_sgrad[b->idx * t->S + b->stage],
                               (size_t)sp_tr_shared_numel(t, b->idx));
    case SP_BUF_SHARED_PARAM:
        return lazy_persistent(t, &t->h_sparam[b->idx], (size_t)sp_tr_shared_numel(t, b->idx));
    default: return NULL;
    }
}

sp_status sp_tr_register_mem(sp_trainer *t, sp_exec_buf **h, void **host, size_t count,
                             size_t elemsize)
{
    if (t->nhost == t->caphost) {
        size_t cap = t->caphost ? 2 * t->caphost : 64;
        struct sp_tr_alloc *a = realloc(t->host, cap * sizeof *a);
        if (!a) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        t->host = a;
        t->caphost = cap;
    }
    size_t bytes = count * elemsize;
    if (!(*host = sp_exec_host_alloc(bytes)))
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory (%zu bytes of host buffers)",
                            bytes);
    sp_status st = sp_exec_buf_register(h, *host, count, elemsize);
    if (st) {
        sp_exec_host_free(*host, bytes);
        *host = NULL;
        return st;
    }
    t->host[t->nhost++] = (struct sp_tr_alloc){ *host, bytes };
    t->host_mem += bytes;
    return SP_OK;
}

sp_status sp_tr_register_host(sp_trainer *t, sp_exec_buf **h, float **host, size_t bytes)
{
    size_t n = bytes / 4 ? bytes / 4 : 1;
    void *mem;
    sp_status st = sp_tr_register_mem(t, h, &mem, n, sizeof(float));
    *host = mem;
    if (st == SP_OK) t->persistent_bytes += n * sizeof(float);
    return st;
}

sp_status sp_tr_create_slab(sp_trainer *t, sp_exec_buf **h, size_t bytes)
{
    size_t n = bytes / 4 ? bytes / 4 : 1;
    sp_status st = sp_exec_buf_create(h, n, sizeof(float));
    if (st == SP_OK) t->persistent_bytes += n * sizeof(float);
    if (st == SP_OK && !sp_exec_buf_on_device(*h)) t->host_mem += n * sizeof(float);
    return st;
}

int64_t sp_tr_scatter_gather(const sp_trainer *t, const sp_buf *b, int peer, int64_t *lo)
{
    *lo = 0;
    if (!t->sg_edge || peer < 0 || peer >= t->layout.actors || !t->sg_actor[peer]) return -1;
    int bit = b->cls == SP_BUF_EDGE_FWD ? 1 : b->cls == SP_BUF_EDGE_GRAD ? 2 : 0;
    if (!bit || b->idx < 0 || b->idx >= t->E || !(t->sg_edge[b->idx] & bit)) return -1;
    const int64_t n = (int64_t)(sp_tr_bytes(t, (sp_buf_class)b->cls, b->idx) / 4);
    if (n < t->T) return -1; /* every chunk non-empty */
    *lo = sp_tp_chunk(n, t->T, t->trank);
    return sp_tp_chunk(n, t->T, t->trank + 1) - *lo;
}
