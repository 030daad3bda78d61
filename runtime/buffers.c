/* The trainer's buffers: persistent stage slabs, and per-microbatch buffers
 * (activations, boundary tensors, their gradients) from a pool that follows the plan's
 * FREEs, registered with the executor on first use. */
#include <stdlib.h>
#include <string.h>

#include "runtime/train_impl.h"

static size_t floats_of(const sp_trainer *t, sp_slab_class c, int idx)
{
    size_t b = sp_program_buf_bytes(t->p, c, idx) / 4;
    return b ? b : 1; /* StarPU wants non-empty buffers */
}

/* A per-microbatch buffer, registered on first use. It gets zeroed host memory rather
 * than StarPU's lazy allocation: StarPU refuses to read a never-written buffer, and a
 * program may accumulate (read) into a buffer whose first writer it is. */
static sp_exec_buf *lazy_buf(sp_trainer *t, sp_exec_buf **slot, size_t floats)
{
    void *mem;
    if (*slot) return *slot;
    return sp_tr_register_mem(t, slot, &mem, floats, sizeof(float)) == SP_OK ? *slot : NULL;
}

/* Per-microbatch buffers (activations, boundary tensors and their gradients) come from
 * a pool: a slot takes a buffer of its size when first used in a step and gives it back
 * at the plan's FREE, so memory follows the planner's liveness. Reusing a buffer is safe
 * without any wait here: StarPU orders the new writer after the old readers and sends. */
static sp_exec_buf *pool_take(sp_trainer *t, sp_exec_buf **slot, size_t floats, int exact)
{
    if (*slot) return *slot;
    /* Buffers that travel must have the size the peer registered; those that stay on the
     * rank (activations and their gradients) may take the smallest larger free one. */
    size_t best = t->nfree;
    for (size_t i = 0; i < t->nfree; i++) {
        size_t c = sp_exec_buf_count(t->pool_free[i]);
        if (c == floats || (!exact && c > floats &&
                            (best == t->nfree || c < sp_exec_buf_count(t->pool_free[best]))))
            best = i;
        if (c == floats) break;
    }
    if (best < t->nfree) {
        *slot = t->pool_free[best];
        t->pool_free[best] = t->pool_free[--t->nfree];
        return *slot;
    }
    if (t->nfree == t->capfree || t->npooled == t->capfree) {
        size_t cap = t->capfree ? 2 * t->capfree : 64;
        sp_exec_buf **f = realloc(t->pool_free, cap * sizeof *f);
        if (!f) return NULL;
        t->pool_free = f;
        t->capfree = cap;
    }
    sp_exec_buf *b = NULL;
    if (!lazy_buf(t, &b, floats)) return NULL;
    t->npooled++;
    t->pool_bytes += floats * sizeof(float);
    return *slot = b;
}

void sp_tr_pool_give(sp_trainer *t, sp_exec_buf **slot)
{
    if (!*slot) return;
    t->pool_free[t->nfree++] = *slot; /* capacity >= npooled >= nfree + 1 */
    *slot = NULL;
}

sp_exec_buf **sp_tr_mb_slot(sp_trainer *t, sp_slab_class c, int idx, int mb)
{
    switch (c) {
    case SP_SLAB_ACT: return &t->h_act[mb * t->S + idx];
    case SP_SLAB_BGRAD: return &t->h_bgrad[mb * t->S + idx];
    case SP_SLAB_EDGE_FWD: return &t->h_efwd[mb * t->E + idx];
    case SP_SLAB_EDGE_GRAD: return &t->h_egrad[mb * t->E + idx];
    default: return NULL;
    }
}

sp_exec_buf *sp_tr_pool_scratch(sp_trainer *t, sp_exec_buf **slot, size_t floats)
{
    return pool_take(t, slot, floats ? floats : 1, 1);
}

sp_exec_buf *sp_tr_slab_buf(sp_trainer *t, sp_slab_class c, int idx, int mb)
{
    switch (c) {
    case SP_SLAB_PARAMS: return t->h_params[idx];
    case SP_SLAB_GRADS: return t->h_grads[idx];
    case SP_SLAB_SCRATCH:
        return lazy_buf(t, &t->h_scratch[idx], floats_of(t, c, idx));
    case SP_SLAB_ACT:
    case SP_SLAB_BGRAD: return pool_take(t, sp_tr_mb_slot(t, c, idx, mb), floats_of(t, c, idx), 0);
    case SP_SLAB_EDGE_FWD:
    case SP_SLAB_EDGE_GRAD: return pool_take(t, sp_tr_mb_slot(t, c, idx, mb), floats_of(t, c, idx), 1);
    case SP_SLAB_INPUT: return t->h_input[mb * t->nin + idx];
    case SP_SLAB_LOSS: return lazy_buf(t, &t->h_loss[mb], 1);
    default: return NULL;
    }
}

/* The plan's FREE: the buffer goes back to the pool. */
void sp_tr_free_buf(sp_trainer *t, const sp_buf *b)
{
    sp_exec_buf **slot = NULL;
    switch (b->cls) {
    case SP_BUF_ACT: slot = sp_tr_mb_slot(t, SP_SLAB_ACT, b->idx, b->mb); break;
    case SP_BUF_BGRAD: slot = sp_tr_mb_slot(t, SP_SLAB_BGRAD, b->idx, b->mb); break;
    case SP_BUF_EDGE_FWD: slot = sp_tr_mb_slot(t, SP_SLAB_EDGE_FWD, b->idx, b->mb); break;
    case SP_BUF_EDGE_GRAD: slot = sp_tr_mb_slot(t, SP_SLAB_EDGE_GRAD, b->idx, b->mb); break;
    default: return; /* persistent buffers and tied-weight transfers stay */
    }
    sp_tr_pool_give(t, slot);
}

/* Index of the tied parameter behind the plan's shared k, and its slab offsets. */
int64_t sp_tr_shared_off(const sp_trainer *t, int k, int stage)
{
    return sp_program_param_offset(t->p, stage, t->shared_param[k]);
}
int64_t sp_tr_shared_numel(const sp_trainer *t, int k)
{
    return sp_tensor_numel(t->g, t->shared_param[k]);
}
int sp_tr_shared_owner(const sp_trainer *t, int k)
{
    return sp_program_stage_model(t->p)->shared[k].stages[0];
}

/* The buffer a SEND or RECV of the plan moves. */
sp_exec_buf *sp_tr_transfer_buf(sp_trainer *t, const sp_buf *b)
{
    switch (b->cls) {
    case SP_BUF_EDGE_FWD: return sp_tr_slab_buf(t, SP_SLAB_EDGE_FWD, b->idx, b->mb);
    case SP_BUF_EDGE_GRAD: return sp_tr_slab_buf(t, SP_SLAB_EDGE_GRAD, b->idx, b->mb);
    case SP_BUF_SHARED_GRAD:
        return lazy_buf(t, &t->h_sgrad[b->idx * t->S + b->stage], (size_t)sp_tr_shared_numel(t, b->idx));
    case SP_BUF_SHARED_PARAM:
        return lazy_buf(t, &t->h_sparam[b->idx], (size_t)sp_tr_shared_numel(t, b->idx));
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

