/* One instruction of this rank's plan turned into executor calls, for the walks of a
 * step (train.c) and of an evaluation (train_eval.c): a stage program's task (RUN, with
 * its recomputed forward and local adds), a transfer (SEND, RECV, and a tied parameter's
 * packing and unpacking), a tied gradient's combine, an NCCL group, an optimizer update. */
#include <stdio.h>
#include <stdlib.h>

#include "base/env.h"
#include "codelets/tasks.h"
#include "runtime/trainer_impl.h"

/* A program's scratch is the executor's per-task temporary. */
static sp_access_mode exec_mode(sp_buf_class c, sp_access_mode m)
{
    return c == SP_BUF_SCRATCH ? SP_ACCESS_SCRATCH : m;
}

/* Submits stage s's program `kind` for microbatch mb. act_mb: the microbatch whose ACT
 * slot it uses (mb + m for a recomputing stage's backward: a buffer of its own). redo: the
 * recomputation of F inside the backward: its boundary outputs go to scratch buffers (the
 * real ones were sent, and may serve another microbatch by now). */
static sp_status submit_program(sp_trainer *t, int s, sp_task_kind kind, int mb, int act_mb,
                                int redo, int instr, sp_exec_buf **bufs, sp_access_mode *modes)
{
    int nb = sp_tr_num_bufs(t, s, kind), nscratch = 0;
    sp_exec_buf *scratch[8] = { NULL };
    sp_status st = SP_OK;
    for (int j = 0; st == SP_OK && j < nb; j++) {
        sp_slab_ref r = sp_tr_prog_buf(t, s, kind, j);
        if (redo && r.cls == SP_BUF_EDGE_FWD && r.mode != SP_ACCESS_R && nscratch < 8)
            bufs[j] = sp_tr_pool_scratch(t, &scratch[nscratch++],
                                         sp_tr_bytes(t, r.cls, r.index) / 4);
        else
            bufs[j] = sp_tr_slab_buf(t, r.cls, r.index, r.cls == SP_BUF_ACT ? act_mb : mb);
        modes[j] = exec_mode(r.cls, r.mode);
        if (!bufs[j]) st = sp_error_context(SP_ERR_RUNTIME, "trainer: no buffer %s[%d] for %s "
                                            "mb%d s%d", sp_buf_class_name(r.cls), r.index,
                                            sp_task_kind_name(kind), mb, s);
    }
    if (st == SP_OK) {
        char name[32];
        snprintf(name, sizeof name, "%s%s mb%d s%d", sp_task_kind_name(kind), redo ? "'" : "",
                 mb, s);
        sp_stage_task_args a = { .prog = t->p, .stage = s, .kind = kind,
                                 .dloss = 1.0f / (float)(t->R * t->m),
                                 .clock = redo ? NULL : sp_tr_profile_clock(t, s, kind) };
        if (t->fault.kind && !redo && !t->evaluating && t->fault.step == t->steps + 1 &&
            (t->fault.stage == s || t->fault.kind == SP_FAULT_GROUP) && kind == SP_TASK_F &&
            mb == 0)
            a.fault = t->fault.kind;
        st = sp_tr_submit(t, name, sp_stage_task, nb, bufs, modes, &a, sizeof a,
                          (task_id){ kind, mb, s, redo ? -1 : instr });
    }
    for (int k = 0; k < nscratch; k++) sp_tr_pool_give(t, &scratch[k]);
    return st;
}

sp_status sp_tr_do_run(sp_trainer *t, const sp_task *task, int instr)
{
    int s = task->stage, mb = task->mb;
    sp_task_kind kind = (sp_task_kind)task->kind;
    int nb = sp_tr_num_bufs(t, s, kind), nf = sp_tr_num_bufs(t, s, SP_TASK_F);
    if (nf > nb) nb = nf;
    sp_exec_buf *stack_bufs[32];
    sp_access_mode stack_modes[32];
    sp_exec_buf **bufs = nb <= 32 ? stack_bufs : malloc((size_t)nb * sizeof *bufs);
    sp_access_mode *modes = nb <= 32 ? stack_modes : malloc((size_t)nb * sizeof *modes);
    sp_status st = SP_OK;
    if (!bufs || !modes) st = sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    /* activation recomputation (sp_program_set_recompute): F again, into the backward's
     * own activations, right before the first backward task of the microbatch */
    int rec = t->model->stage[s].recompute && !t->evaluating;
    int act_mb = rec && kind != SP_TASK_F ? mb + t->m : mb;
    if (st == SP_OK && rec && (kind == SP_TASK_B || kind == SP_TASK_BW))
        st = submit_program(t, s, SP_TASK_F, mb, act_mb, 1, instr, bufs, modes);
    if (st == SP_OK) {
        st = submit_program(t, s, kind, mb, act_mb, 0, instr, bufs, modes);
        /* BW's activation gradients live and die inside the task (the plan does not
         * track them): the buffer can serve the next user at once */
        if (kind == SP_TASK_BW) sp_tr_pool_give(t, sp_tr_mb_slot(t, SP_BUF_BGRAD, s, mb));
        /* after the stage's last weight gradient: repeated uses of a parameter in the
         * stage are added into its first accumulator (program.h) */
        if (st == SP_OK && (kind == SP_TASK_W || kind == SP_TASK_BW) && mb == t->m - 1 &&
            t->nlocal[s] > 0) {
            sp_exec_buf *g = t->h_grads[s];
            sp_access_mode rw = SP_ACCESS_RW;
            sp_local_add_task_args la = { .prog = t->p, .stage = s };
            st = sp_tr_submit(t, "local add", sp_local_add_task, 1, &g, &rw, &la,
                              sizeof la, (task_id){ -1, -1, s, -1 });
        }
    }
    if (bufs != stack_bufs) free(bufs);
    if (modes != stack_modes) free(modes);
    return st;
}

/* A boundary buffer under scatter-gather (sp_tr_scatter_gather): this member's chunk
 * [lo, lo + n) goes out of a pool buffer of its own, or comes into one and is gathered
 * with the group's other chunks into x. */
static sp_status transfer_chunk(sp_trainer *t, const sp_instr *in, sp_exec_buf *x, int64_t lo,
                                int64_t n)
{
    sp_exec_buf *part = NULL;
    if (!sp_tr_pool_scratch(t, &part, (size_t)n))
        return sp_error_context(SP_ERR_RUNTIME, "trainer: no buffer for a boundary tensor's chunk");
    sp_status st;
    if (in->op == SP_OP_SEND) {
        if (!(st = sp_tr_submit_copy(t, part, 0, x, lo, n, "scatter", SP_TR_HELPER)))
            st = sp_tr_send(t, part, peer_rank(t, in->peer), (uint32_t)in->seq);
    } else if (!(st = sp_tr_recv(t, part, peer_rank(t, in->peer), (uint32_t)in->seq))) {
        sp_exec_buf *bufs[2] = { x, part };
        sp_access_mode modes[2] = { SP_ACCESS_W, SP_ACCESS_R };
        sp_gather_task_args a = { .lo = lo, .n = n };
        st = sp_tr_submit(t, "gather", sp_gather_task, 2, bufs, modes, &a, sizeof a,
                          SP_TR_HELPER);
    }
    sp_tr_pool_give(t, &part); /* StarPU orders its next writer after these */
    return st;
}

/* Tied parameter k has a copy on another rank: its owner sends it after each update. */
static int sent_tied(const sp_trainer *t, int k)
{
    const sp_stage_shared *sh = &t->model->shared[k];
    for (int q = 1; q < sh->nstages; q++)
        if (!owns(t, sh->stages[q])) return 1;
    return 0;
}

/* Whether stage s's tied parameters are packed for their sends by the optimizer itself:
 * when s owns one whose copy is on another rank, and the update is not sharded (ZeRO-1
 * gathers the other replicas' shards after it). Their AdamW then runs first, and their
 * transfers overlap the rest of the stage's update. */
static int packs_tied(const sp_trainer *t, int s)
{
    for (int k = 0; !t->o.shard_optimizer && k < t->nshared; k++)
        if (t->model->shared[k].stages[0] == s && sent_tied(t, k)) return 1;
    return 0;
}

/* Copies tied parameter k's values out of its owner's slab into its send buffer. */
static sp_status pack_tied(sp_trainer *t, int k)
{
    int o = sp_tr_shared_owner(t, k);
    return sp_tr_submit_copy(t, sp_tr_transfer_buf(t, &(sp_buf){ .cls = SP_BUF_SHARED_PARAM,
                                                                 .idx = k, .mb = -1,
                                                                 .stage = -1 }),
                             0, t->h_params[o], sp_tr_shared_off(t, k, o),
                             sp_tr_shared_numel(t, k), "pack param", SP_TR_HELPER);
}

sp_status sp_tr_do_transfer(sp_trainer *t, const sp_instr *in)
{
    const sp_buf *b = &in->buf;
    sp_exec_buf *x = sp_tr_transfer_buf(t, b);
    if (!x)
        return sp_set_error(SP_ERR_RUNTIME, "trainer: the plan moves %s, which has no buffer",
                            sp_buf_class_name((sp_buf_class)b->cls));
    int64_t lo, n = sp_tr_scatter_gather(t, b, in->peer, &lo);
    if (n >= 0) return transfer_chunk(t, in, x, lo, n);
    if (b->cls == SP_BUF_SHARED_GRAD && b->mb >= 0)
        return sp_set_error(SP_ERR_RUNTIME, "trainer: per-microbatch tied-gradient transfers "
                            "are not supported (the graph never needs them)");
    sp_status st;
    if (in->op == SP_OP_SEND) {
        /* tied parameters travel out of their stage slab through a transfer buffer */
        if (b->cls == SP_BUF_SHARED_GRAD &&
            (st = sp_tr_submit_copy(t, x, 0, t->h_grads[b->stage], sp_tr_shared_off(t, b->idx, b->stage),
                              sp_tr_shared_numel(t, b->idx), "pack grad", SP_TR_HELPER)))
            return st;
        if (b->cls == SP_BUF_SHARED_PARAM && !packs_tied(t, sp_tr_shared_owner(t, b->idx)) &&
            (st = pack_tied(t, b->idx)))
            return st;
        return sp_tr_send(t, x, peer_rank(t, in->peer), (uint32_t)in->seq);
    }
    if ((st = sp_tr_recv(t, x, peer_rank(t, in->peer), (uint32_t)in->seq))) return st;
    if (b->cls == SP_BUF_SHARED_PARAM) /* the owner's new values into every local copy */
        for (int s = 0; s < t->S; s++) {
            int64_t off = owns(t, s) ? sp_tr_shared_off(t, b->idx, s) : -1;
            if (off >= 0 && s != sp_tr_shared_owner(t, b->idx) &&
                (st = sp_tr_submit_copy(t, t->h_params[s], off, x, 0, sp_tr_shared_numel(t, b->idx),
                                  "unpack param", SP_TR_HELPER)))
                return st;
        }
    return SP_OK;
}

sp_status sp_tr_do_combine(sp_trainer *t, int k, int instr)
{
    const sp_stage_shared *sh = &t->model->shared[k];
    int o = sh->stages[0];
    sp_exec_buf *bufs[SP_COMBINE_MAX];
    sp_access_mode modes[SP_COMBINE_MAX];
    sp_combine_task_args a = { .dst_off = sp_tr_shared_off(t, k, o), .n = sp_tr_shared_numel(t, k) };
    bufs[0] = t->h_grads[o];
    modes[0] = SP_ACCESS_RW;
    int nb = 1;
    for (int q = 1; q < sh->nstages; q++) {
        int s = sh->stages[q];
        if (owns(t, s)) {
            bufs[nb] = t->h_grads[s];
            a.src_off[nb] = sp_tr_shared_off(t, k, s);
        } else {
            bufs[nb] = sp_tr_transfer_buf(t, &(sp_buf){ .cls = SP_BUF_SHARED_GRAD, .idx = k,
                                                  .mb = -1, .stage = s });
            a.src_off[nb] = 0;
        }
        modes[nb++] = SP_ACCESS_R;
    }
    return sp_tr_submit(t, "combine", sp_combine_task, nb, bufs, modes, &a, sizeof a,
                  (task_id){ -1, -1, o, instr });
}

/* One task for a whole NCCL group of the plan (sp_nccl_calls), at its first call. */
sp_status sp_tr_do_nccl(sp_trainer *t, int call)
{
    const sp_nccl_call *c = &t->ncalls[call];
    if (call > 0 && t->ncalls[call - 1].group == c->group) return SP_OK; /* already issued */
    int n = 0;
    while (call + n < t->nncalls && t->ncalls[call + n].group == c->group) n++;
    sp_exec_xfer *x = malloc((size_t)n * sizeof *x);
    if (!x) return sp_set_error(SP_ERR_NOMEM, "trainer: out of memory");
    for (int k = 0; k < n; k++) {
        const sp_instr *in = &t->plan->instr[t->actor][t->ncalls[call + k].instr];
        x[k] = (sp_exec_xfer){ sp_tr_transfer_buf(t, &in->buf), in->op == SP_OP_SEND,
                               peer_rank(t, in->peer) };
    }
    char name[32];
    snprintf(name, sizeof name, "nccl group %d", c->group);
    sp_status st = sp_tr_submit_group(t, name, x, n, (task_id){ -1, -1, -1, c->instr });
    free(x);
    return st;
}

static sp_status submit_adamw(sp_trainer *t, int s, float scale, sp_optim_part part)
{
    sp_exec_buf *bufs[4] = { t->h_params[s], t->h_grads[s], t->h_m[s], t->h_v[s] };
    sp_access_mode modes[4] = { SP_ACCESS_RW, SP_ACCESS_R, SP_ACCESS_RW, SP_ACCESS_RW };
    sp_optim_task_args a = { .prog = t->p, .stage = s, .opt = t->o.opt, .grad_scale = scale,
                             .t = t->steps + 1, .shard = t->o.shard_optimizer, .part = part };
    if (a.shard) sp_trainer_shard(t, s, &a.lo, &a.hi);
    char name[32];
    snprintf(name, sizeof name, part == SP_OPTIM_TIED ? "AdamW tied s%d" : "AdamW s%d", s);
    return sp_tr_submit(t, name, sp_optim_task, 4, bufs, modes, &a, sizeof a,
                        (task_id){ -1, -1, s, -1 });
}

sp_status sp_tr_do_optimizer(sp_trainer *t, int s, float scale)
{
    const int early = packs_tied(t, s);
    sp_status st = submit_adamw(t, s, scale, early ? SP_OPTIM_TIED : SP_OPTIM_ALL);
    for (int k = 0; early && st == SP_OK && k < t->nshared; k++)
        if (t->model->shared[k].stages[0] == s && sent_tied(t, k)) st = pack_tied(t, k);
    if (early && st == SP_OK) st = submit_adamw(t, s, scale, SP_OPTIM_UNTIED);
    /* ZeRO-1: the other replicas' updated shards */
    if (st == SP_OK && t->rep && t->o.shard_optimizer) st = sp_tr_gather_params(t, s);
    /* tied parameters with a copy in another stage of this rank: no message, a copy */
    for (int k = 0; st == SP_OK && k < t->nshared; k++) {
        const sp_stage_shared *sh = &t->model->shared[k];
        if (sh->stages[0] != s) continue;
        for (int q = 1; st == SP_OK && q < sh->nstages; q++)
            if (owns(t, sh->stages[q]))
                st = sp_tr_submit_copy(t, t->h_params[sh->stages[q]], sp_tr_shared_off(t, k, sh->stages[q]),
                                 t->h_params[s], sp_tr_shared_off(t, k, s), sp_tr_shared_numel(t, k),
                                 "copy param", SP_TR_HELPER);
    }
    return st;
}
