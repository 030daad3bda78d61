/* Data parallelism over replicas of the pipeline: each stage's gradients are summed over
 * the R ranks that hold it, deterministically, as a reduce-scatter and an all-gather:
 *
 *   - the stage's PARAMS range is cut into R shards of whole tensors (sp_optim_shards);
 *     replica c reduces shard c;
 *   - as soon as this replica's gradients of stage s are final in phase 1 (its last
 *     W/BW, local add, tied combine or tied-gradient send), each shard c != own is copied
 *     out and sent to replica c, and the others' copies of the own shard are received;
 *   - one task later in this rank's order, a task sums the own shard over the replicas in
 *     replica order, ((x0 + x1) + x2) + ..., the order the reference interpreter uses
 *     (sp_reference_set_replicas) whatever R, P and the schedule;
 *   - without shard_optimizer the reduced shard is sent to every other replica, and the
 *     others' reduced shards are copied into GRADS at the end of phase 1; with it, each
 *     rank updates only its shard in phase 2 (AdamW moments of that shard only) and the
 *     updated parameter shards are gathered the same way (sp_tr_gather_params).
 *
 * Every message is 1/R of a stage's parameters, each rank sends and receives 2 (R - 1) of
 * them per stage and step, as a ring all-reduce does, with R - 1 peers instead of two.
 * Each phase's messages (exchange) are StarPU-MPI messages between ranks of the same
 * actor, tagged past the plan's message numbers, or, when NCCL carries the plan's GPU
 * transfers, one NCCL group on NCCL's own stream (an all-to-all of shards: the reduce-
 * scatter's sends and receives, then the all-gather's). Not ncclReduceScatter: its sum
 * order is NCCL's (not the reference's) and its shards are equal, ours whole tensors.
 * Deadlock-free on NCCL's in-order stream: the groups of stage s pair only the replicas of
 * one actor, and every replica submits the same task sequence, so they sit at the same
 * place in each rank's order; the plan's own groups keep the global message order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/tasks.h"
#include "runtime/trainer_impl.h"

enum { PH_REDUCE = 0, PH_GATHER_GRADS = 1, PH_GATHER_PARAMS = 2 };
#define COLL(s) ((task_id){ SP_TR_COLLECTIVE, -1, (s), -1 })

static uint32_t msg_of(const sp_trainer *t, int s, int phase)
{
    return (uint32_t)(t->plan->nmessages + 3 * (int64_t)s + phase);
}

static int64_t shard_lo(const sp_trainer *t, int s, int c) { return t->rep[s].bounds[c]; }
static int64_t shard_n(const sp_trainer *t, int s, int c)
{
    return t->rep[s].bounds[c + 1] - t->rep[s].bounds[c];
}

/* The rank holding this rank's actor in replica c. */
static int replica_rank(const sp_trainer *t, int c)
{
    return t->replica_peer[c];
}

sp_status sp_tr_replicas_create(sp_trainer *t)
{
    if (t->R <= 1) return SP_OK;
    if (!(t->rep = calloc((size_t)t->S, sizeof *t->rep)) ||
        !(t->unpack = malloc(sizeof(int) * 2 * (size_t)t->S * (size_t)t->R)))
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int s = 0; s < t->S; s++) {
        if (!owns(t, s)) continue;
        sp_tr_stage_replicas *r = &t->rep[s];
        if (!(r->bounds = malloc(sizeof(int64_t) * (size_t)(t->R + 1))) ||
            !(r->send = calloc((size_t)t->R, sizeof *r->send)) ||
            !(r->recv = calloc((size_t)t->R, sizeof *r->recv)))
            return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        sp_optim_shards(t->p, s, t->R, r->bounds);
        sp_status st;
        for (int c = 0; c < t->R; c++) {
            if (c == t->replica) continue;
            /* shard c: this replica's part of it goes to replica c, and in the gathers
             * replica c's result comes back in the same buffer; what replica c sends of
             * this rank's own shard arrives in recv[c] */
            if ((st = sp_tr_create_slab(t, &r->send[c], 4 * (size_t)shard_n(t, s, c))) ||
                (st = sp_tr_create_slab(t, &r->recv[c], 4 * (size_t)shard_n(t, s, t->replica))))
                return st;
        }
        if ((st = sp_tr_create_slab(t, &r->mine, 4 * (size_t)shard_n(t, s, t->replica))))
            return st;
    }
    return SP_OK;
}

void sp_tr_replicas_free(sp_trainer *t)
{
    if (!t->rep) return;
    for (int s = 0; s < t->S; s++) {
        sp_tr_stage_replicas *r = &t->rep[s];
        for (int c = 0; c < t->R; c++) {
            if (r->send && r->send[c]) sp_exec_buf_unregister(r->send[c]);
            if (r->recv && r->recv[c]) sp_exec_buf_unregister(r->recv[c]);
        }
        if (r->mine) sp_exec_buf_unregister(r->mine);
        free(r->bounds), free(r->send), free(r->recv);
    }
    free(t->rep);
    free(t->unpack);
    t->rep = NULL;
}

/* A phase's transfers: one group when the group transport (NCCL) carries GPU transfers
 * (every replica of the actor decides alike), else the host transport's messages
 * numbered msg. */
static sp_status exchange(sp_trainer *t, int s, int phase, const sp_exec_xfer *x, int n)
{
    static const char *const what[] = { "reduce-scatter", "gather grads", "gather params" };
    if (n == 0) return SP_OK;
    if (sp_exec_groups_active()) {
        char name[40];
        snprintf(name, sizeof name, "nccl %s s%d", what[phase], s);
        return sp_tr_submit_group(t, name, x, n, COLL(s));
    }
    sp_status st = SP_OK;
    for (int k = 0; k < n && st == SP_OK; k++)
        st = x[k].is_send ? sp_tr_send(t, x[k].buf, x[k].peer, msg_of(t, s, phase))
                          : sp_tr_recv(t, x[k].buf, x[k].peer, msg_of(t, s, phase));
    return st;
}

sp_status sp_tr_reduce_begin(sp_trainer *t, int s)
{
    sp_tr_stage_replicas *r = &t->rep[s];
    sp_status st = SP_OK;
    sp_exec_xfer x[2 * t->R];
    int n = 0;
    char name[32];
    r->pending = 1;
    for (int c = 0; c < t->R && st == SP_OK; c++) {
        if (c == t->replica) continue;
        snprintf(name, sizeof name, "pack s%d r%d", s, c);
        if (shard_n(t, s, c) > 0) {
            st = sp_tr_submit_copy(t, r->send[c], 0, t->h_grads[s], shard_lo(t, s, c),
                                   shard_n(t, s, c), name, COLL(s));
            x[n++] = (sp_exec_xfer){ r->send[c], 1, replica_rank(t, c) };
        }
        if (shard_n(t, s, t->replica) > 0)
            x[n++] = (sp_exec_xfer){ r->recv[c], 0, replica_rank(t, c) };
    }
    return st ? st : exchange(t, s, PH_REDUCE, x, n);
}

/* Sends this rank's shard (in r->mine) to every other replica and receives theirs (into
 * the buffers that carried their shards out); the unpacks into dst are queued (grads,
 * for the end of phase 1) or submitted now (parameters). */
static sp_status gather(sp_trainer *t, int s, sp_exec_buf *dst, int phase)
{
    sp_tr_stage_replicas *r = &t->rep[s];
    sp_exec_xfer x[2 * t->R];
    int n = 0;
    for (int c = 0; c < t->R; c++) {
        if (c == t->replica) continue;
        if (shard_n(t, s, t->replica) > 0)
            x[n++] = (sp_exec_xfer){ r->mine, 1, replica_rank(t, c) };
        if (shard_n(t, s, c) > 0)
            x[n++] = (sp_exec_xfer){ r->send[c], 0, replica_rank(t, c) };
    }
    sp_status st = exchange(t, s, phase, x, n);
    for (int c = 0; c < t->R && st == SP_OK; c++) {
        if (c == t->replica || shard_n(t, s, c) == 0) continue;
        if (phase == PH_GATHER_GRADS) {
            t->unpack[2 * t->nunpack] = s;
            t->unpack[2 * t->nunpack + 1] = c;
            t->nunpack++;
        } else {
            char name[32];
            snprintf(name, sizeof name, "unpack param s%d r%d", s, c);
            st = sp_tr_submit_copy(t, dst, shard_lo(t, s, c), r->send[c], 0, shard_n(t, s, c),
                                   name, COLL(s));
        }
    }
    return st;
}

static sp_status reduce(sp_trainer *t, int s)
{
    sp_tr_stage_replicas *r = &t->rep[s];
    r->pending = 0;
    int own = t->replica;
    int64_t n = shard_n(t, s, own);
    sp_status st = SP_OK;
    if (n > 0) {
        sp_exec_buf *bufs[t->R];
        sp_access_mode modes[t->R];
        bufs[0] = t->h_grads[s];
        modes[0] = SP_ACCESS_RW;
        for (int c = 0, k = 1; c < t->R; c++)
            if (c != own) bufs[k] = r->recv[c], modes[k++] = SP_ACCESS_R;
        sp_reduce_task_args a = { .dst_off = shard_lo(t, s, own), .n = n, .own = own };
        char name[32];
        snprintf(name, sizeof name, "reduce s%d", s);
        st = sp_tr_submit(t, name, sp_reduce_task, t->R, bufs, modes, &a,
                          sizeof a, (task_id){ SP_TR_COLLECTIVE, -1, s, -1 });
    }
    if (st || t->o.shard_optimizer) return st;
    if (n > 0 && (st = sp_tr_submit_copy(t, r->mine, 0, t->h_grads[s], shard_lo(t, s, own), n,
                                         "pack reduced", COLL(s))))
        return st;
    return gather(t, s, t->h_grads[s], PH_GATHER_GRADS);
}

sp_status sp_tr_reduce_pending(sp_trainer *t)
{
    sp_status st = SP_OK;
    for (int s = 0; t->rep && s < t->S && st == SP_OK; s++)
        if (t->rep[s].pending) st = reduce(t, s);
    return st;
}

sp_status sp_tr_reduce_end(sp_trainer *t)
{
    sp_status st = sp_tr_reduce_pending(t);
    for (int k = 0; k < t->nunpack && st == SP_OK; k++) {
        int s = t->unpack[2 * k], c = t->unpack[2 * k + 1];
        char name[32];
        snprintf(name, sizeof name, "unpack grad s%d r%d", s, c);
        st = sp_tr_submit_copy(t, t->h_grads[s], shard_lo(t, s, c), t->rep[s].send[c], 0,
                               shard_n(t, s, c), name, COLL(s));
    }
    t->nunpack = 0;
    return st;
}

sp_status sp_tr_gather_params(sp_trainer *t, int s)
{
    int64_t n = shard_n(t, s, t->replica);
    sp_status st;
    if (n > 0 && (st = sp_tr_submit_copy(t, t->rep[s].mine, 0, t->h_params[s],
                                         shard_lo(t, s, t->replica), n, "pack param shard", COLL(s))))
        return st;
    return gather(t, s, t->h_params[s], PH_GATHER_PARAMS);
}
