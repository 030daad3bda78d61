/* The trainer's creation and destruction: the arguments checked against the MPI ranks,
 * the plans built and checked (training and evaluation), NCCL's calls and peers, the
 * stage slabs and their initial parameters, the tied parameters, the replicas' buffers
 * and the pool planned from a dry walk; and everything freed again. */
#include "starpipe/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/trainer_impl.h"
#include "starpipe/data.h"
#include "base/env.h"

/* Each stage program's key in StarPU's performance model, once: its stage and the bytes
 * it reads and writes, not those of the pool buffers it runs on (which may be larger). */
static void stage_footprints(sp_trainer *t)
{
    for (int s = 0; s < t->S; s++)
        for (int kind = 0; kind < SP_NUM_TASK_KINDS; kind++) {
            uint64_t h = sp_mix64((uint64_t)s + 1);
            for (int j = 0; j < sp_program_num_bufs(t->p, s, (sp_task_kind)kind); j++) {
                sp_slab_ref r = sp_program_buf(t->p, s, (sp_task_kind)kind, j);
                h = sp_mix64(h ^ sp_program_buf_bytes(t->p, r.cls, r.index));
            }
            t->footprint[s * SP_NUM_TASK_KINDS + kind] = (uint32_t)h | 1; /* 0: no key */
        }
}

/* The walks of the pool's plan (sp_tr_pool_plan): a step's phase 1, an evaluation. */
static sp_status pool_walk(sp_trainer *t, int w)
{
    return w == 0 ? sp_tr_walk_pipeline(t) : sp_tr_walk_eval(t);
}

/* Stage s's initial parameters, one tensor at a time through the host (the slab lives
 * where the tasks run: on a GPU rank the host never holds more than one tensor). */
static sp_status init_params(sp_trainer *t, int s, uint64_t seed)
{
    int64_t most = 0;
    for (int i = 0; i < sp_graph_num_params(t->g); i++) {
        sp_tensor x = sp_graph_param(t->g, i);
        if (sp_program_param_offset(t->p, s, x) >= 0 && sp_tensor_numel(t->g, x) > most)
            most = sp_tensor_numel(t->g, x);
    }
    float *tmp = malloc(sizeof(float) * (size_t)(most > 0 ? most : 1));
    sp_status st = tmp ? SP_OK : sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int i = 0; i < sp_graph_num_params(t->g) && st == SP_OK; i++) {
        sp_tensor x = sp_graph_param(t->g, i);
        int64_t off = sp_program_param_offset(t->p, s, x), n = sp_tensor_numel(t->g, x);
        if (off >= 0 && !(st = sp_param_init_values(t->g, x, seed, tmp)))
            st = sp_exec_buf_write(t->h_params[s], 4 * (size_t)off, 4 * (size_t)n, tmp);
    }
    free(tmp);
    return st;
}

static sp_status alloc_arrays(sp_trainer *t)
{
    int S = t->S, E = t->E, m = t->mcap;
#define ALLOC(field, count)                                                              \
    if (!(t->field = calloc((size_t)(count) + 1, sizeof *t->field)))                      \
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    ALLOC(view, 4 * S)
    ALLOC(h_params, S) ALLOC(h_grads, S) ALLOC(h_m, S) ALLOC(h_v, S) ALLOC(h_scratch, S)
    ALLOC(h_act, 2 * m * S) ALLOC(h_bgrad, m * S) /* ACT: m more for recomputation */ ALLOC(h_efwd, m * E) ALLOC(h_egrad, m * E)
    ALLOC(h_input, m * t->nin) ALLOC(input_host, m * t->nin) ALLOC(h_loss, m)
    ALLOC(shared_param, t->nshared) ALLOC(h_sgrad, t->nshared * S)
    ALLOC(h_sparam, t->nshared) ALLOC(h_sumsq, S) ALLOC(footprint, S * SP_NUM_TASK_KINDS)
    ALLOC(progbuf_at, S * SP_NUM_TASK_KINDS) ALLOC(nlocal, S)
    ALLOC(shared_off, t->nshared * S) ALLOC(shared_numel, t->nshared)
#undef ALLOC
    return SP_OK;
}

/* The program's sizes, buffer lists, local adds and tied parameters, looked up once
 * (trainer_impl.h): a step then never calls into graph/ for them. After alloc_arrays and
 * the tied parameters. */
static sp_status program_tables(sp_trainer *t)
{
    const sp_program *p = t->p;
    int K = SP_NUM_TASK_KINDS;
    for (int c = 0; c <= SP_BUF_SCRATCH; c++) {
        int n = c == SP_BUF_EDGE_FWD || c == SP_BUF_EDGE_GRAD ? t->E
              : c == SP_BUF_INPUT ? t->nin : c == SP_BUF_LOSS ? 0 : t->S;
        if (!(t->bytes[c] = malloc(sizeof(size_t) * (size_t)(n + 1))))
            return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        t->nbytes[c] = n;
        for (int i = 0; i < n; i++)
            t->bytes[c][i] = sp_program_buf_bytes(p, (sp_buf_class)c, i);
    }
    for (int k = 0; k < t->S * K; k++)
        t->progbuf_at[k + 1] =
            t->progbuf_at[k] + sp_program_num_bufs(p, k / K, (sp_task_kind)(k % K));
    if (!(t->progbuf = malloc(sizeof *t->progbuf * (size_t)(t->progbuf_at[t->S * K] + 1))))
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int k = 0; k < t->S * K; k++)
        for (int j = t->progbuf_at[k]; j < t->progbuf_at[k + 1]; j++)
            t->progbuf[j] =
                sp_program_buf(p, k / K, (sp_task_kind)(k % K), j - t->progbuf_at[k]);
    for (int s = 0; s < t->S; s++) t->nlocal[s] = sp_program_local_adds(p, s, NULL);
    for (int k = 0; k < t->nshared; k++) {
        t->shared_numel[k] = sp_tensor_numel(t->g, t->shared_param[k]);
        for (int s = 0; s < t->S; s++)
            t->shared_off[k * t->S + s] = sp_program_param_offset(p, s, t->shared_param[k]);
    }
    t->nparams = sp_graph_num_params(t->g);
    return SP_OK;
}

/* The last instruction of phase 1 that touches GRADS[s] on this rank: a task writing it
 * (W, BW and the local adds after them), a tied combine that writes or reads it, or a
 * tied gradient's send that reads it. After it the stage's gradients can be reduced over the replicas. */
/* Scatter-gather (Megatron's, for T > 1): a boundary buffer whose values (or gradients)
 * every member of the tensor group holds alike goes to the next actor's group as 1/T per
 * member, and that group all-gathers it inside itself (sp_gather_task): the bytes between
 * two actors' groups / T, the same bits. Used with actors whose group has a member on
 * another host than its counterpart here (auto, the default), with every actor
 * (STARPIPE_SCATTER_GATHER=1), or never (=0). The members of a group agree: the rule
 * reads the whole groups of both actors, and their graphs have one structure. */
static sp_status scatter_gather_plan(sp_trainer *t, int want)
{
    const int A = t->layout.actors;
    if (t->T <= 1 || want == 0) return SP_OK;
    if (!(t->sg_edge = calloc((size_t)t->E + 1, 1)) || !(t->sg_actor = calloc((size_t)A, 1)))
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int e = 0; e < t->E; e++) {
        int bits = sp_program_edge_replicated(t->p, e);
        if (bits < 0) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        t->sg_edge[e] = (uint8_t)bits;
    }
    for (int a = 0; a < A; a++) {
        int across = a != t->actor && want == 1;
        for (int k = 0; a != t->actor && k < t->T; k++)
            across |= strcmp(sp_exec_hostname(sp_layout_rank_t(&t->layout, t->replica, a, k)),
                             sp_exec_hostname(sp_layout_rank_t(&t->layout, t->replica, t->actor,
                                                               k))) != 0;
        t->sg_actor[a] = (uint8_t)across;
    }
    return SP_OK;
}

static sp_status find_grads_last(sp_trainer *t)
{
    if (!(t->grads_last = malloc(sizeof(int) * (size_t)t->S)))
        return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int s = 0; s < t->S; s++) t->grads_last[s] = -1;
    const sp_stage_model *model = sp_program_stage_model(t->p);
    for (int i = 0; i < t->plan->ninstr[t->actor]; i++) {
        const sp_instr *in = &t->plan->instr[t->actor][i];
        if (sp_tr_is_update_phase(in)) continue;
        if (in->op == SP_OP_RUN) {
            int s = in->task.stage;
            sp_task_kind kind = (sp_task_kind)in->task.kind;
            for (int j = 0; j < sp_program_num_bufs(t->p, s, kind); j++) {
                sp_slab_ref r = sp_program_buf(t->p, s, kind, j);
                if (r.cls == SP_BUF_GRADS && r.mode != SP_ACCESS_R) t->grads_last[r.index] = i;
            }
        } else if (in->op == SP_OP_COMBINE) { /* writes the owner's, reads local others' */
            const sp_stage_shared *sh = &model->shared[in->buf.idx];
            for (int q = 0; q < sh->nstages; q++)
                if (owns(t, sh->stages[q])) t->grads_last[sh->stages[q]] = i;
        } else if (in->op == SP_OP_SEND && in->buf.cls == SP_BUF_SHARED_GRAD) {
            t->grads_last[in->buf.stage] = i;
        }
    }
    return SP_OK;
}

sp_trainer *sp_trainer_create(const sp_program *p, const sp_schedule *sched,
                              const sp_train_opts *opts, sp_status *status)
{
    sp_status st = SP_OK;
    sp_trainer *t = NULL;
    if (!p || !sched || !opts) {
        st = sp_set_error(SP_ERR_ARG, "sp_trainer_create: NULL argument");
        goto out;
    }
    if (sched->nstages != sp_program_num_stages(p)) {
        st = sp_set_error(SP_ERR_ARG, "schedule '%s' has %d stages but the model has %d",
                          sched->name, sched->nstages, sp_program_num_stages(p));
        goto out;
    }
    int R = opts->replicas > 1 ? opts->replicas : 1, T = opts->tensor > 1 ? opts->tensor : 1;
    if (sp_graph_tensor_size(sp_program_graph(p)) != T) {
        st = sp_set_error(SP_ERR_ARG, "the program was built for a tensor group of %d ranks, "
                          "the trainer's is %d (sp_train_opts.tensor)",
                          sp_graph_tensor_size(sp_program_graph(p)), T);
        goto out;
    }
    if (T > 1 && sched->nactors * R * T != sp_exec_size()) {
        st = sp_set_error(SP_ERR_ARG, "%d replica%s of schedule '%s' (%d actors) of %d ranks "
                          "each (--tensor) need %d MPI ranks, but %d are running", R,
                          R == 1 ? "" : "s", sched->name, sched->nactors, T,
                          R * sched->nactors * T, sp_exec_size());
        goto out;
    }
    if (T == 1 && sched->nactors * R != sp_exec_size()) {
        if (R == 1)
            st = sp_set_error(SP_ERR_ARG, "schedule '%s' needs %d actors (MPI ranks), but %d "
                              "ranks are running: use mpirun -np %d", sched->name,
                              sched->nactors, sp_exec_size(), sched->nactors);
        else
            st = sp_set_error(SP_ERR_ARG, "%d replicas of schedule '%s' (%d actors) need %d "
                              "MPI ranks, but %d are running", R, sched->name, sched->nactors,
                              R * sched->nactors, sp_exec_size());
        goto out;
    }
    if (opts->shard_optimizer && R == 1) {
        st = sp_set_error(SP_ERR_ARG, "a sharded optimizer needs replicas (--replicas R > 1)");
        goto out;
    }
    if (!(t = calloc(1, sizeof *t))) {
        st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        goto out;
    }
    t->p = p;
    t->g = sp_program_graph(p);
    t->o = *opts;
    t->rank = sp_exec_rank();
    t->R = R;
    t->T = T;
    t->layout = (sp_layout){ .replicas = R, .actors = sched->nactors, .order = opts->rank_order,
                             .tensor = T };
    sp_layout_place_t(&t->layout, t->rank, &t->replica, &t->actor, &t->trank);
    if (T > 1 && sp_graph_tensor_rank(t->g) != t->trank) {
        st = sp_set_error(SP_ERR_ARG, "rank %d is tensor rank %d of its actor, but its program "
                          "was built for tensor rank %d", t->rank, t->trank,
                          sp_graph_tensor_rank(t->g));
        goto out;
    }
    /* the group of the actor's T ranks, colored by the group's first rank, with room for
     * the largest all-reduce of any stage (the same on every member) */
    int64_t most = 0;
    for (int s = 0; T > 1 && s < sp_program_num_stages(p); s++)
        if (sp_program_group_floats(p, s) > most) most = sp_program_group_floats(p, s);
    if (T > 1 && (st = sp_exec_tensor_group_create(sp_layout_rank(&t->layout, t->replica, t->actor),
                                                   t->trank, T, most, &t->tgroup)))
        goto out;
    if (!(t->peer = malloc(sizeof(int) * (size_t)sched->nactors)) ||
        !(t->replica_peer = malloc(sizeof(int) * (size_t)R))) {
        st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        goto out;
    }
    for (int a = 0; a < sched->nactors; a++)
        t->peer[a] = sp_layout_rank_t(&t->layout, t->replica, a, t->trank);
    for (int c = 0; c < R; c++)
        t->replica_peer[c] = sp_layout_rank_t(&t->layout, c, t->actor, t->trank);
    t->S = sp_program_num_stages(p);
    const sp_stage_model *model = sp_program_stage_model(p);
    t->model = model;
    t->E = model->nedges;
    t->m = sched->nmicro;
    t->nin = sp_program_num_inputs(p);
    t->nshared = model->nshared;
    sp_env env; /* STARPIPE_FAULT */
    if ((st = sp_env_read(&env))) goto out;
    if (env.fault.kind == SP_FAULT_FAIL || env.fault.kind == SP_FAULT_HANG ||
        (env.fault.kind == SP_FAULT_GROUP && env.fault.stage == t->rank && T > 1))
        t->fault.kind = env.fault.kind, t->fault.step = env.fault.step,
        t->fault.stage = env.fault.stage;
    if ((st = sp_plan_build(model, sched, &t->plan))) goto out;
    if ((st = sp_plan_check(t->plan))) goto out;
    if ((st = scatter_gather_plan(t, env.scatter_gather))) goto out;
    t->mcap = t->m;
    if (opts->eval_microbatches > 0) { /* the forward-only plan on the same placement */
        if (opts->eval_microbatches % R) {
            st = sp_set_error(SP_ERR_ARG, "evaluating %d microbatches over %d replicas: each "
                              "replica evaluates an equal share, so the count must be a "
                              "multiple of %d", opts->eval_microbatches, R, R);
            goto out;
        }
        t->eval_m = opts->eval_microbatches / R;
        sp_schedule *fs = NULL;
        if (!(st = sp_schedule_forward(sched, t->eval_m, &fs)) &&
            !(st = sp_plan_build(model, fs, &t->eval_plan)))
            st = sp_plan_check(t->eval_plan);
        sp_schedule_free(fs);
        if (st) goto out;
        if (t->eval_m > t->mcap) t->mcap = t->eval_m;
    }
    if (!(t->msg_instr = malloc(sizeof(int) * (size_t)(t->plan->nmessages + 1)))) {
        st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
        goto out;
    }
    for (int64_t q = 0; q < t->plan->nmessages; q++) t->msg_instr[q] = -1;
    /* large boundary tensors between GPU actors go in groups (NCCL) when it can start */
    if ((st = sp_exec_groups_init(t->notice, sizeof t->notice))) goto out;
    if (sp_exec_groups_active()) {
        size_t threshold = sp_exec_group_threshold();
        if ((st = sp_nccl_calls(t->plan, t->actor, threshold, &t->ncalls, &t->nncalls)))
            goto out;
        if (!(t->nccl_of = malloc(sizeof(int) * (size_t)(t->plan->ninstr[t->actor] + 1)))) {
            st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
            goto out;
        }
        for (int i = 0; i < t->plan->ninstr[t->actor]; i++) t->nccl_of[i] = -1;
        for (int k = 0; k < t->nncalls; k++) t->nccl_of[t->ncalls[k].instr] = k;
        /* connect to every NCCL peer now (a peer of ours has us as its peer: both sides
         * of a message decide NCCL from its size alike) */
        int *peers = malloc(sizeof(int) * (size_t)(t->nncalls + R + 1)), np = 0;
        if (!peers) {
            st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
            goto out;
        }
        for (int k = 0; k < t->nncalls; k++) {
            int r = peer_rank(t, t->plan->instr[t->actor][t->ncalls[k].instr].peer), seen = 0;
            for (int j = 0; j < np; j++) seen |= peers[j] == r;
            if (!seen) peers[np++] = r;
        }
        for (int c = 0; c < R; c++) /* the replicas' collectives (replicas.c) */
            if (c != t->replica) peers[np++] = sp_layout_rank_t(&t->layout, c, t->actor, t->trank);
        st = sp_exec_groups_connect(peers, np);
        free(peers);
        if (st) goto out;
        snprintf(t->notice, sizeof t->notice, "NCCL carries boundary tensors of %zu bytes "
                 "and more%s", threshold, R > 1 ? ", and the replicas' gradient shards" : "");
    }
    for (int i = 0; i < t->plan->ninstr[t->actor]; i++) {
        const sp_instr *in = &t->plan->instr[t->actor][i];
        if (in->op == SP_OP_SEND || in->op == SP_OP_RECV) t->msg_instr[in->seq] = i;
    }
    for (int a = 0; a < t->plan->nactors; a++)
        if (t->plan->ninstr[a] > t->tmax) t->tmax = t->plan->ninstr[a];
    if ((st = alloc_arrays(t))) goto out;
    stage_footprints(t);
    for (int i = 0, k = 0; i < sp_graph_num_params(t->g); i++) {
        sp_tensor x = sp_graph_param(t->g, i);
        int users = 0;
        for (int s = 0; s < t->S; s++) users += sp_program_param_offset(p, s, x) >= 0;
        if (users > 1) t->shared_param[k++] = x;
    }
    if ((st = program_tables(t)) || (st = sp_tr_replicas_create(t)) ||
        (st = find_grads_last(t)) || (st = sp_tr_profile_init(t)))
        goto out;
    for (int s = 0; s < t->S; s++) {
        if (!owns(t, s)) continue;
        size_t pb = sp_program_buf_bytes(p, SP_BUF_PARAMS, s);
        int64_t lo, hi; /* the moments of this rank's shard (sharded), else of all */
        sp_trainer_shard(t, s, &lo, &hi);
        size_t mb = opts->shard_optimizer ? 4 * (size_t)(hi - lo) : pb;
        if ((st = sp_tr_create_slab(t, &t->h_params[s], pb)) ||
            (st = sp_tr_create_slab(t, &t->h_grads[s], sp_program_buf_bytes(p, SP_BUF_GRADS, s))) ||
            (st = sp_tr_create_slab(t, &t->h_m[s], mb)) ||
            (st = sp_tr_create_slab(t, &t->h_v[s], mb)))
            goto out;
        t->optimizer_bytes += 2 * mb;
        void *mem;
        int np = sp_graph_num_params(t->g); /* one double per parameter: all cross the bus */
        if ((st = sp_tr_register_mem(t, &t->h_sumsq[s], &mem, (size_t)(np > 0 ? np : 1),
                                     sizeof(double))))
            goto out;
        if ((st = init_params(t, s, opts->seed))) goto out;
    }
    for (int i = 0; i < t->mcap * t->nin; i++)
        if ((st = sp_tr_register_host(t, &t->h_input[i], (float **)&t->input_host[i],
                                sp_program_buf_bytes(p, SP_BUF_INPUT, i % t->nin))))
            goto out;
    /* the per-microbatch buffers' pool, from a dry walk of a step (and an evaluation) */
    st = sp_tr_pool_plan(t, pool_walk, t->eval_plan ? 2 : 1);
out:
    if (st != SP_OK) {
        sp_trainer_free(t);
        t = NULL;
    }
    if (status) *status = st;
    return t;
}

void sp_trainer_free(sp_trainer *t)
{
    if (!t) return;
    /* (the per-microbatch slots h_act, h_bgrad, h_efwd, h_egrad hold the pool's buffers) */
    sp_exec_buf **lists[] = { t->h_params, t->h_grads, t->h_m, t->h_v, t->h_scratch, t->h_sumsq,
                              t->h_input, t->h_loss, t->h_sgrad, t->h_sparam };
    size_t mc = (size_t)t->mcap; /* per-microbatch slots, evaluation included */
    size_t counts[] = { t->S, t->S, t->S, t->S, t->S, t->S, mc * t->nin, mc,
                        (size_t)t->nshared * t->S, t->nshared };
    for (size_t l = 0; l < sizeof lists / sizeof *lists; l++)
        for (size_t i = 0; lists[l] && i < counts[l]; i++)
            if (lists[l][i]) sp_exec_buf_unregister(lists[l][i]);
    sp_tr_pool_free(t);
    sp_tr_replicas_free(t);
    sp_tr_profile_free(t);
    /* the memory behind every buffer, once none is registered any more */
    for (size_t i = 0; i < t->nhost; i++) sp_exec_host_free(t->host[i].p, t->host[i].bytes);
    free(t->host);
    for (int i = 0; t->view && i < 4 * t->S; i++) free(t->view[i]);
    free(t->view);
    free(t->h_params), free(t->h_grads), free(t->h_m), free(t->h_v), free(t->h_scratch);
    free(t->h_sumsq);
    free(t->h_act), free(t->h_bgrad), free(t->h_efwd), free(t->h_egrad), free(t->h_input);
    free(t->input_host), free(t->h_loss), free(t->shared_param);
    free(t->h_sgrad), free(t->h_sparam), free(t->seq_task), free(t->events), free(t->msg_instr);
    free(t->nccl_of), free(t->ncalls), free(t->grads_last), free(t->footprint);
    free(t->link_base), free(t->link_step);
    free(t->tbuf), free(t->tstart), free(t->tend);
    for (int c = 0; c <= SP_BUF_SCRATCH; c++) free(t->bytes[c]);
    free(t->progbuf), free(t->progbuf_at), free(t->nlocal), free(t->shared_off);
    free(t->shared_numel), free(t->peer), free(t->replica_peer);
    free(t->sg_edge), free(t->sg_actor);
    sp_plan_free(t->plan);
    sp_plan_free(t->eval_plan);
    sp_exec_tensor_group_free(t->tgroup);
    free(t);
}
