/* The trainer seen from the host: what it is (owned stages, shards, the plan, the layout)
 * and its settings between steps, its stage slabs and moments (checks, checkpoints),
 * parameters gathered or stored across ranks, and memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec_impl.h" /* the broadcast named for the watchdog */
#include "runtime/trainer_impl.h"

int sp_trainer_owns_stage(const sp_trainer *t, int stage)
{
    return t && stage >= 0 && stage < t->S && owns(t, stage);
}
int sp_trainer_steps_done(const sp_trainer *t) { return t ? t->steps : 0; }
void sp_trainer_set_steps_done(sp_trainer *t, int steps) { t->steps = steps; }
void sp_trainer_set_lr(sp_trainer *t, float lr) { t->o.opt.lr = lr; }
const sp_plan *sp_trainer_plan(const sp_trainer *t) { return t ? t->plan : NULL; }
sp_layout sp_trainer_layout(const sp_trainer *t) { return t->layout; }
int sp_trainer_replica(const sp_trainer *t) { return t ? t->replica : 0; }
unsigned long long sp_trainer_bytes_sent_to(const sp_trainer *t, int rank)
{
    return t && t->link_step && rank >= 0 && rank < sp_exec_size() ? t->link_step[rank] : 0;
}

size_t sp_trainer_send_bytes(const sp_trainer *t, const sp_instr *in)
{
    int64_t lo, n = sp_tr_scatter_gather(t, &in->buf, in->peer, &lo);
    return n >= 0 ? (size_t)n * sizeof(float) : in->bytes;
}

int sp_trainer_scatter_gather_peers(const sp_trainer *t)
{
    int n = 0;
    for (int a = 0; t && t->sg_actor && a < t->layout.actors; a++) n += t->sg_actor[a];
    return n;
}

void sp_trainer_shard(const sp_trainer *t, int stage, int64_t *lo, int64_t *hi)
{
    *lo = 0;
    *hi = (int64_t)(sp_tr_bytes(t, SP_BUF_PARAMS, stage) / 4);
    if (t->rep && t->rep[stage].bounds) {
        *lo = t->rep[stage].bounds[t->replica];
        *hi = t->rep[stage].bounds[t->replica + 1];
    }
}

const char *sp_trainer_notice(const sp_trainer *t) { return t ? t->notice : ""; }

sp_train_memory sp_trainer_memory(const sp_trainer *t)
{
    sp_train_memory m = { 0 };
    if (!t) return m;
    m.transient = t->pool.bytes;
    m.persistent = t->persistent_bytes;
    m.optimizer = t->optimizer_bytes;
    m.staging = sp_exec_staging_bytes();
    m.host = t->host_mem;
    return m;
}

/* ---- host access ------------------------------------------------------------------- */

static sp_exec_buf *slab_buf(const sp_trainer *t, int which, int stage)
{
    return which == 0 ? t->h_params[stage] : which == 1 ? t->h_grads[stage]
         : which == 2 ? t->h_m[stage] : t->h_v[stage];
}

/* A host copy of a slab (the slab itself lives where the tasks run), kept for the
 * trainer's life: only checks ask for whole slabs; checkpoints go tensor by tensor. */
static float *host_slab(sp_trainer *t, int which, int stage)
{
    if (!t || stage < 0 || stage >= t->S || !owns(t, stage)) return NULL;
    sp_exec_buf *h = slab_buf(t, which, stage);
    size_t bytes = sp_exec_buf_count(h) * sizeof(float);
    float **view = &t->view[4 * stage + which];
    if (!*view && !(*view = malloc(bytes))) {
        sp_set_error(SP_ERR_NOMEM, "trainer: out of memory (a host copy of %zu bytes)", bytes);
        return NULL;
    }
    return sp_exec_buf_read(h, 0, bytes, *view) == SP_OK ? *view : NULL;
}

const float *sp_trainer_slab(sp_trainer *t, sp_buf_class cls, int stage)
{
    return cls == SP_BUF_PARAMS ? host_slab(t, 0, stage)
         : cls == SP_BUF_GRADS  ? host_slab(t, 1, stage) : NULL;
}

const float *sp_trainer_moment(sp_trainer *t, int which, int stage)
{
    return host_slab(t, which ? 3 : 2, stage);
}

/* The replica whose rank holds what (0 value, 1 gradient, 2, 3 moments) of the
 * parameter at offset off of stage s: any for values; with a sharded optimizer, the
 * gradients and moments are complete only in the shard's own replica. */
static int holder_replica(const sp_trainer *t, int s, int64_t off, int what)
{
    if (!t->rep || what == 0 || !t->o.shard_optimizer) return 0;
    /* another actor's stage: the same cut as its holders make */
    int64_t cut[t->R + 1];
    const int64_t *b = t->rep[s].bounds ? t->rep[s].bounds : (sp_optim_shards(t->p, s, t->R, cut), cut);
    int c = 0;
    while (c + 1 < t->R && off >= b[c + 1]) c++;
    return c;
}

sp_status sp_trainer_fetch(sp_trainer *t, sp_tensor param, int what, float *dst)
{
    if (!t || !sp_tensor_is_param(t->g, param) || what < 0 || what > 3 || !dst)
        return sp_set_error(SP_ERR_ARG, "sp_trainer_fetch: bad argument");
    int o = sp_program_param_owner(t->p, param);
    int64_t n = sp_tensor_numel(t->g, param), off = sp_program_param_offset(t->p, o, param);
    int c = holder_replica(t, o, off, what); /* the same for every member: equal slabs */
    /* tensor parallelism: a split parameter's parts, one per member of the holder's
     * group, each broadcast and put in its place of the whole tensor */
    int split = t->T > 1 && sp_param_split_dim(t->g, param) >= 0, parts = split ? t->T : 1;
    float *part = split ? malloc(sizeof(float) * (size_t)(n > 0 ? n : 1)) : dst;
    if (!part) return sp_set_error(SP_ERR_NOMEM, "sp_trainer_fetch: out of memory");
    sp_status st = SP_OK;
    for (int q = 0; q < parts && st == SP_OK; q++) {
        int root = sp_layout_rank_t(&t->layout, c, t->plan->stage_actor[o], q);
        if (t->rank == root) {
            int64_t lo, hi; /* sharded moments hold floats lo.. only */
            sp_trainer_shard(t, o, &lo, &hi);
            int64_t base = what >= 2 && t->o.shard_optimizer ? lo : 0;
            st = sp_exec_buf_read(slab_buf(t, what, o), 4 * (size_t)(off - base),
                                  4 * (size_t)n, part);
        }
        /* a broadcast from the holder, not a sum with the others' zeros: -0.0 + 0.0 is
         * +0.0, and the bits must not depend on how many ranks there are (a failed read
         * is the holder's alone: every rank still meets the broadcast) */
        sp_status bst = sp_exec_bcast_named(part, (size_t)n * sizeof(float), root,
                                            "a parameter's broadcast (sp_trainer_fetch, as "
                                            "for a checkpoint)");
        if (st == SP_OK) st = bst;
        if (st == SP_OK && split) st = sp_param_part_to_whole(t->g, param, q, part, dst);
    }
    if (split) free(part);
    return st;
}

sp_status sp_trainer_store(sp_trainer *t, sp_tensor param, int what, const float *src)
{
    if (!t || !sp_tensor_is_param(t->g, param) || what < 0 || what > 3 || what == 1 || !src)
        return sp_set_error(SP_ERR_ARG, "sp_trainer_store: bad argument");
    int64_t n = sp_tensor_numel(t->g, param);
    /* src is the whole tensor: a split parameter's rank keeps its part of it */
    float *part = NULL;
    if (t->T > 1 && sp_param_split_dim(t->g, param) >= 0) {
        sp_status st = (part = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1)))
                           ? sp_param_whole_to_part(t->g, param, t->trank, src, part)
                           : sp_set_error(SP_ERR_NOMEM, "sp_trainer_store: out of memory");
        if (st) {
            free(part);
            return st;
        }
        src = part;
    }
    sp_status st = SP_OK;
    for (int s = 0; s < t->S && st == SP_OK; s++) {
        int64_t off = sp_program_param_offset(t->p, s, param), lo, hi;
        if (!owns(t, s) || off < 0) continue;
        if (what >= 2 && t->o.shard_optimizer) { /* moments: only in the shard's replica */
            sp_trainer_shard(t, s, &lo, &hi);
            if (off < lo || off >= hi) continue;
            off -= lo;
        }
        st = sp_exec_buf_write(slab_buf(t, what, s), 4 * (size_t)off, 4 * (size_t)n, src);
    }
    free(part);
    return st;
}

double sp_trainer_compare(sp_trainer *t, sp_reference *r, double tol, char *where, size_t len)
{
    double bad = 0;
    const char *names[4] = { "parameters", "gradients", "AdamW m", "AdamW v" };
    if (where && len) where[0] = '\0';
    for (int s = 0; t && r && s < t->S; s++) {
        if (!owns(t, s)) continue;
        size_t all = sp_program_buf_bytes(t->p, SP_BUF_PARAMS, s) / 4;
        int64_t lo, hi;
        sp_trainer_shard(t, s, &lo, &hi);
        const float *mine[4] = { sp_trainer_slab(t, SP_BUF_PARAMS, s),
                                 sp_trainer_slab(t, SP_BUF_GRADS, s),
                                 sp_trainer_moment(t, 0, s), sp_trainer_moment(t, 1, s) };
        const float *ref[4] = { sp_reference_slab(r, SP_BUF_PARAMS, s),
                                sp_reference_slab(r, SP_BUF_GRADS, s),
                                sp_reference_moment(r, 0, s), sp_reference_moment(r, 1, s) };
        for (int k = 0; k < 4; k++) {
            if (!mine[k] || !ref[k]) continue;
            /* sharded: gradients summed and moments kept in this rank's shard only */
            int part = t->o.shard_optimizer && k > 0;
            size_t n = part ? (size_t)(hi - lo) : all, diff = 0;
            const float *a = mine[k] + (part && k == 1 ? lo : 0), *b = ref[k] + (part ? lo : 0);
            for (size_t j = 0; j < n; j++)
                diff += tol > 0 ? !(fabs(a[j] - b[j]) <= tol * (1 + fabs(b[j])))
                                : memcmp(&a[j], &b[j], 4) != 0;
            if (diff && bad == 0 && where)
                snprintf(where, len, "%s of stage %d (%zu of %zu floats)", names[k], s, diff, n);
            bad += (double)diff;
        }
    }
    return bad;
}
