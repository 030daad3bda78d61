/* Data parallelism over replicas of the pipeline: each stage's gradients are summed over
 * the R ranks that hold it, deterministically, in replica order ((x0 + x1) + x2) + ...,
 * the order the reference interpreter uses (sp_reference_set_replicas) whatever R, P,
 * the schedule and the hosts:
 *
 *   - the stage's PARAMS range is cut into R shards of whole tensors (sp_optim_shards);
 *     replica c owns shard c (with shard_optimizer, it alone updates it);
 *   - the replicas, in replica order, form runs: consecutive replicas on one host
 *     (hierarchical), or one run of all of them (flat: one host, or no host holding two
 *     replicas of the stage, or NCCL carrying the transfers, or STARPIPE_ALLREDUCE=flat);
 *   - each shard has a leader in each run: its owner where the run holds it, else a
 *     member chosen by the shard's number, so that a run's members share the work;
 *   - as soon as this replica's gradients of stage s are final in phase 1 (its last
 *     W/BW, local add, tied combine or tied-gradient send), each member of a run sends
 *     its copy of each shard to that shard's leader in the run (inside the host);
 *   - one task later in this rank's order, a leader sums its shard: the previous run's
 *     partial sum (received from that run's leader, across hosts), then its run's
 *     members in replica order; that is the replica-order sum so far, which it sends on
 *     to the next run's leader. The last run's leader holds the whole sum;
 *   - without shard_optimizer the sum goes from there to its run's members and to the
 *     other runs' leaders, which pass it to their members (inside, across, inside again),
 *     and every rank copies the others' shards into GRADS at the end of phase 1; with it,
 *     the sum goes to the owner alone, which updates its shard in phase 2 (AdamW moments
 *     of that shard only), and the updated parameters spread from the owner the same way
 *     (sp_tr_gather_params).
 *
 * Flat, that is the all-to-all of shards: every message is 1/R of a stage's parameters,
 * each rank sends and receives 2 (R - 1) of them per stage and step. Hierarchical, a
 * shard crosses between two adjacent runs once for the sum and once on the way back (a
 * ring's bytes between hosts, and only one message of each shard per link), and the
 * rest moves inside the hosts. Messages are StarPU-MPI messages between ranks of the same
 * actor, numbered past the plan's messages by stage, phase and shard, or, when NCCL
 * carries the plan's GPU transfers, one NCCL group per phase on NCCL's own stream (flat
 * only: the reduce-scatter's sends and receives, then the all-gather's). Not
 * ncclReduceScatter: its sum order is NCCL's (not the reference's) and its shards are
 * equal, ours whole tensors. Deadlock-free: a leader's sum waits only for messages of
 * its own run, posted at the same place of every replica's order, and for the previous
 * run's sum; the spreads are waited for only at the end of phase 1 (grads) or after the
 * optimizer (parameters); on NCCL's in-order stream the groups of stage s pair only the
 * replicas of one actor, at the same place in each rank's order, and the plan's own
 * groups keep the global message order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "codelets/tasks.h"
#include "runtime/trainer_impl.h"

enum { PH_REDUCE = 0, PH_GATHER_GRADS = 1, PH_GATHER_PARAMS = 2 };
#define COLL(s) ((task_id){ SP_TR_COLLECTIVE, -1, (s), -1 })

/* The message of shard c of stage s in a phase: past the plan's, SP_TR_REPLICA_MSG(s)
 * apart per stage (train_trace.c reads the stage back). */
static uint32_t msg_of(const sp_trainer *t, int s, int phase, int c)
{
    return (uint32_t)(t->plan->nmessages + (3 * (int64_t)s + phase) * t->R + c);
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

/* The runs: run k holds replicas [run_first[k], run_first[k + 1]). */
static int run_of(const sp_trainer *t, int c) { return t->run_of[c]; }
static int run_len(const sp_trainer *t, int k) { return t->run_first[k + 1] - t->run_first[k]; }

/* The leader of shard c in run k: its owner where the run holds it, else the member c
 * picks by its number. */
static int leader(const sp_trainer *t, int k, int c)
{
    if (run_of(t, c) == k) return c;
    return t->run_first[k] + c % run_len(t, k);
}

/* Cuts the replicas into runs: where the host changes, when some host holds two or more
 * of them and there are several hosts (or every `hosts` replicas, STARPIPE_ALLREDUCE's
 * test form); one run otherwise. Every replica of the actor computes the same runs. */
static sp_status make_runs(sp_trainer *t)
{
    const int R = t->R;
    if (!(t->run_of = malloc(sizeof(int) * (size_t)R)) ||
        !(t->run_first = malloc(sizeof(int) * (size_t)(R + 1))))
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    sp_env env;
    sp_status st = sp_env_read(&env);
    if (st) return st;
    int per = env.allreduce; /* 0 auto, -1 flat, K: every K replicas */
    int nruns = 0, longest = 0;
    for (int c = 0; c < R; c++) {
        int cut = c == 0 ||
                  (per > 0 ? c % per == 0
                           : per == 0 && strcmp(sp_exec_hostname(replica_rank(t, c)),
                                                sp_exec_hostname(replica_rank(t, c - 1))));
        if (cut) t->run_first[nruns++] = c;
        t->run_of[c] = nruns - 1;
    }
    t->run_first[nruns] = R;
    for (int k = 0; k < nruns; k++)
        if (run_len(t, k) > longest) longest = run_len(t, k);
    /* flat: one run (no host holds two of them, or NCCL carries the messages) */
    if (nruns == 1 || (per == 0 && longest == 1) || sp_exec_groups_active()) {
        for (int c = 0; c < R; c++) t->run_of[c] = 0;
        t->run_first[0] = 0, t->run_first[1] = R;
        nruns = 1;
    }
    t->nruns = nruns;
    return SP_OK;
}

sp_status sp_tr_replicas_create(sp_trainer *t)
{
    if (t->R <= 1) return SP_OK;
    const int R = t->R, me = t->replica;
    sp_status st = make_runs(t);
    if (st) return st;
    if (!(t->rep = calloc((size_t)t->S, sizeof *t->rep)) ||
        !(t->unpack = malloc(sizeof(int) * 2 * (size_t)t->S * (size_t)R)))
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    const int k = run_of(t, me);
    for (int s = 0; s < t->S; s++) {
        if (!owns(t, s)) continue;
        sp_tr_stage_replicas *r = &t->rep[s];
        if (!(r->bounds = malloc(sizeof(int64_t) * (size_t)(R + 1))) ||
            !(r->shard = calloc((size_t)R, sizeof *r->shard)) ||
            !(r->in = calloc((size_t)R * (size_t)(R + 1), sizeof *r->in)))
            return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        sp_optim_shards(t->p, s, R, r->bounds);
        for (int c = 0; c < R; c++) {
            /* shard c: this replica's copy of it goes out (or is summed here), and the
             * sum or the owner's parameters come back in the same buffer */
            if (c != me && (st = sp_tr_create_slab(t, &r->shard[c], 4 * (size_t)shard_n(t, s, c))))
                return st;
            if (leader(t, k, c) != me) continue;
            /* led here: each other member's copy, and the previous run's partial sum */
            for (int q = t->run_first[k]; q <= R; q++) {
                if (q == me || (q == R ? k == 0 : q >= t->run_first[k + 1])) continue;
                if ((st = sp_tr_create_slab(t, &r->in[c * (R + 1) + q], 4 * (size_t)shard_n(t, s, c))))
                    return st;
            }
        }
        if ((st = sp_tr_create_slab(t, &r->mine, 4 * (size_t)shard_n(t, s, me))))
            return st;
    }
    return SP_OK;
}

void sp_tr_replicas_free(sp_trainer *t)
{
    if (t->rep) {
        for (int s = 0; s < t->S; s++) {
            sp_tr_stage_replicas *r = &t->rep[s];
            for (int c = 0; r->shard && c < t->R; c++)
                if (r->shard[c]) sp_exec_buf_unregister(r->shard[c]);
            for (int q = 0; r->in && q < t->R * (t->R + 1); q++)
                if (r->in[q]) sp_exec_buf_unregister(r->in[q]);
            if (r->mine) sp_exec_buf_unregister(r->mine);
            free(r->bounds), free(r->shard), free(r->in);
        }
    }
    free(t->rep);
    free(t->unpack);
    free(t->run_of), free(t->run_first);
    t->rep = NULL, t->unpack = NULL, t->run_of = t->run_first = NULL;
}

/* A phase's transfers, gathered first so that NCCL takes them as one group. */
typedef struct {
    int n;
    sp_exec_xfer x[];
} xfers;
typedef struct {
    xfers *l;
    uint32_t *msg;
} xlist;

static sp_status xlist_make(const sp_trainer *t, xlist *l)
{
    size_t cap = 2 * (size_t)t->R * (size_t)(t->R + 1);
    l->l = malloc(sizeof *l->l + cap * sizeof l->l->x[0]);
    l->msg = malloc(cap * sizeof *l->msg);
    if (!l->l || !l->msg) {
        free(l->l), free(l->msg);
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    }
    l->l->n = 0;
    return SP_OK;
}

static void xlist_add(xlist *l, sp_exec_buf *b, int is_send, int peer, uint32_t msg)
{
    l->msg[l->l->n] = msg;
    l->l->x[l->l->n++] = (sp_exec_xfer){ b, is_send, peer };
}

/* Posts a phase's transfers and frees the list: one group when the group transport
 * (NCCL) carries GPU transfers (every replica of the actor decides alike), else the host
 * transport's messages; the bytes sent are counted per rank when t->replica_count is set
 * (sp_trainer_replica_bytes). */
static sp_status exchange(sp_trainer *t, int s, int phase, xlist *l)
{
    static const char *const what[] = { "reduce-scatter", "gather grads", "gather params" };
    sp_status st = SP_OK;
    for (int k = 0; t->replica_count && k < l->l->n; k++)
        if (l->l->x[k].is_send)
            t->replica_count[l->l->x[k].peer] += 4 * (unsigned long long)sp_exec_buf_count(l->l->x[k].buf);
    if (l->l->n == 0 || t->replica_count) { /* nothing to post */
    } else if (sp_exec_groups_active()) {
        char name[40];
        snprintf(name, sizeof name, "nccl %s s%d", what[phase], s);
        st = sp_tr_submit_group(t, name, l->l->x, l->l->n, COLL(s));
    } else {
        for (int k = 0; k < l->l->n && st == SP_OK; k++) {
            const sp_exec_xfer *x = &l->l->x[k];
            st = x->is_send ? sp_tr_send(t, x->buf, x->peer, l->msg[k])
                            : sp_tr_recv(t, x->buf, x->peer, l->msg[k]);
        }
    }
    free(l->l), free(l->msg);
    return st;
}

/* Where this rank's value of shard c ends up in its own slabs once summed or gathered:
 * its shard buffer, or for its own shard the reduced-shard buffer. */
static sp_exec_buf *shard_buf(sp_trainer *t, int s, int c)
{
    return c == t->replica ? t->rep[s].mine : t->rep[s].shard[c];
}

sp_status sp_tr_reduce_begin(sp_trainer *t, int s)
{
    sp_tr_stage_replicas *r = &t->rep[s];
    const int me = t->replica, k = run_of(t, me), R = t->R;
    xlist l;
    sp_status st = xlist_make(t, &l);
    char name[32];
    r->pending = 1;
    for (int c = 0; c < R && st == SP_OK; c++) {
        if (shard_n(t, s, c) == 0) continue;
        const int L = leader(t, k, c);
        if (c != me) { /* this replica's copy of shard c, out of GRADS */
            snprintf(name, sizeof name, "pack s%d r%d", s, c);
            st = sp_tr_submit_copy(t, r->shard[c], 0, t->h_grads[s], shard_lo(t, s, c),
                                   shard_n(t, s, c), name, COLL(s));
        }
        if (L != me) { /* to the shard's leader in this run */
            xlist_add(&l, r->shard[c], 1, replica_rank(t, L), msg_of(t, s, PH_REDUCE, c));
            continue;
        }
        for (int q = t->run_first[k]; q < t->run_first[k + 1]; q++) /* led here */
            if (q != me)
                xlist_add(&l, r->in[c * (R + 1) + q], 0, replica_rank(t, q),
                          msg_of(t, s, PH_REDUCE, c));
        if (k > 0)
            xlist_add(&l, r->in[c * (R + 1) + R], 0, replica_rank(t, leader(t, k - 1, c)),
                      msg_of(t, s, PH_REDUCE, c));
    }
    if (st) {
        free(l.l), free(l.msg);
        return st;
    }
    return exchange(t, s, PH_REDUCE, &l);
}

/* Shard c's buffer buf (at the source src, the leader of its run) spreads to every other
 * replica: src sends it to its run's members and to the other runs' leaders, which pass
 * it to their members. Each receiver's copy lands in shard_buf; gradients are queued for
 * their copy into GRADS at the end of phase 1, parameters copied by the caller once the
 * messages are posted. */
static void spread(sp_trainer *t, int s, int c, int src, int phase, xlist *l)
{
    const int me = t->replica, k = run_of(t, me);
    const uint32_t msg = msg_of(t, s, phase, c);
    sp_exec_buf *buf = shard_buf(t, s, c);
    if (shard_n(t, s, c) == 0) return;
    const int hub = me == src ? me : run_of(t, src) == k ? src : leader(t, k, c);
    if (me != hub) /* a member: from its run's hub */
        xlist_add(l, buf, 0, replica_rank(t, hub), msg);
    else {
        if (me != src) xlist_add(l, buf, 0, replica_rank(t, src), msg); /* a hub */
        for (int q = t->run_first[k]; q < t->run_first[k + 1]; q++)
            if (q != me) xlist_add(l, buf, 1, replica_rank(t, q), msg);
        for (int j = 0; me == src && j < t->nruns; j++)
            if (j != k) xlist_add(l, buf, 1, replica_rank(t, leader(t, j, c)), msg);
    }
    if (phase == PH_GATHER_GRADS && (me != src || c != me)) { /* not summed in place */
        t->unpack[2 * t->nunpack] = s;
        t->unpack[2 * t->nunpack + 1] = c;
        t->nunpack++;
    }
}

static sp_status reduce(sp_trainer *t, int s)
{
    sp_tr_stage_replicas *r = &t->rep[s];
    const int me = t->replica, k = run_of(t, me), R = t->R, last = t->nruns - 1;
    r->pending = 0;
    xlist l;
    sp_status st = xlist_make(t, &l);
    for (int c = 0; c < R && st == SP_OK; c++) { /* the shards led here */
        const int64_t n = shard_n(t, s, c);
        if (n == 0 || leader(t, k, c) != me) continue;
        /* the previous run's partial, then this run's members in replica order, summed
         * into this replica's copy: GRADS for its own shard, else the shard's buffer */
        sp_exec_buf *bufs[R + 2];
        sp_access_mode modes[R + 2];
        int nb = 1, own = 0;
        bufs[0] = c == me ? t->h_grads[s] : r->shard[c];
        modes[0] = SP_ACCESS_RW;
        if (k > 0) bufs[nb] = r->in[c * (R + 1) + R], modes[nb++] = SP_ACCESS_R, own++;
        for (int q = t->run_first[k]; q < t->run_first[k + 1]; q++) {
            if (q == me) own = nb - 1;
            else bufs[nb] = r->in[c * (R + 1) + q], modes[nb++] = SP_ACCESS_R;
        }
        sp_reduce_task_args a = { .dst_off = c == me ? shard_lo(t, s, c) : 0, .n = n, .own = own };
        char name[32];
        snprintf(name, sizeof name, "reduce s%d r%d", s, c);
        st = sp_tr_submit(t, name, sp_reduce_task, nb, bufs, modes, &a, sizeof a,
                          (task_id){ SP_TR_COLLECTIVE, -1, s, -1 });
        /* its own shard's sum leaves GRADS through the reduced-shard buffer */
        if (st == SP_OK && c == me && (k < last || !t->o.shard_optimizer))
            st = sp_tr_submit_copy(t, r->mine, 0, t->h_grads[s], shard_lo(t, s, c), n,
                                   "pack reduced", COLL(s));
        if (st == SP_OK && k < last) /* on to the next run's leader */
            xlist_add(&l, shard_buf(t, s, c), 1, replica_rank(t, leader(t, k + 1, c)),
                      msg_of(t, s, PH_REDUCE, c));
    }
    if (st) {
        free(l.l), free(l.msg);
        return st;
    }
    if ((st = exchange(t, s, PH_REDUCE, &l)) || (st = xlist_make(t, &l))) return st;
    for (int c = 0; c < R && st == SP_OK; c++) { /* the sums, from the last run's leaders */
        const int src = leader(t, last, c);
        if (!t->o.shard_optimizer) spread(t, s, c, src, PH_GATHER_GRADS, &l);
        else if (src != c && shard_n(t, s, c) > 0) { /* to the owner alone */
            if (me == src) xlist_add(&l, shard_buf(t, s, c), 1, replica_rank(t, c), msg_of(t, s, PH_GATHER_GRADS, c));
            if (me == c) {
                xlist_add(&l, r->mine, 0, replica_rank(t, src), msg_of(t, s, PH_GATHER_GRADS, c));
                t->unpack[2 * t->nunpack] = s, t->unpack[2 * t->nunpack + 1] = c;
                t->nunpack++;
            }
        }
    }
    if (st) {
        free(l.l), free(l.msg);
        return st;
    }
    return exchange(t, s, PH_GATHER_GRADS, &l);
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
        st = sp_tr_submit_copy(t, t->h_grads[s], shard_lo(t, s, c), shard_buf(t, s, c), 0,
                               shard_n(t, s, c), name, COLL(s));
    }
    t->nunpack = 0;
    return st;
}

sp_status sp_tr_gather_params(sp_trainer *t, int s)
{
    const int me = t->replica;
    int64_t n = shard_n(t, s, me);
    xlist l;
    sp_status st = xlist_make(t, &l);
    if (st == SP_OK && n > 0)
        st = sp_tr_submit_copy(t, t->rep[s].mine, 0, t->h_params[s], shard_lo(t, s, me), n,
                               "pack param shard", COLL(s));
    if (st) {
        free(l.l), free(l.msg);
        return st;
    }
    for (int c = 0; c < t->R; c++) spread(t, s, c, c, PH_GATHER_PARAMS, &l); /* from owners */
    st = exchange(t, s, PH_GATHER_PARAMS, &l);
    for (int c = 0; c < t->R && st == SP_OK; c++) { /* the others' shards, once posted */
        if (c == me || shard_n(t, s, c) == 0) continue;
        char name[32];
        snprintf(name, sizeof name, "unpack param s%d r%d", s, c);
        st = sp_tr_submit_copy(t, t->h_params[s], shard_lo(t, s, c), t->rep[s].shard[c], 0,
                               shard_n(t, s, c), name, COLL(s));
    }
    return st;
}

sp_status sp_trainer_replica_bytes(sp_trainer *t, unsigned long long *to)
{
    if (!t || !to) return sp_set_error(SP_ERR_ARG, "sp_trainer_replica_bytes: NULL");
    if (!t->rep) return SP_OK;
    /* the walks of a step's collectives, submitting nothing, counting the sends */
    int dry = t->pool.dry;
    t->pool.dry = 1, t->replica_count = to;
    sp_status st = SP_OK;
    for (int s = 0; s < t->S && st == SP_OK; s++) {
        if (!owns(t, s)) continue;
        if (!(st = sp_tr_reduce_begin(t, s)) && !(st = sp_tr_reduce_end(t)) &&
            t->o.shard_optimizer)
            st = sp_tr_gather_params(t, s);
    }
    t->pool.dry = dry, t->replica_count = NULL, t->nunpack = 0;
    return st;
}
