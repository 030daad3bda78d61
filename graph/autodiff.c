/* Reverse-mode autodiff, stage by stage, with the B/W split of zero-bubble schedules.
 *
 * Every backward instruction belongs to the stage of its forward op (pipeline_yield's
 * transpose is again a stage marker), so backward stage s is the VJP of forward stage s.
 * A backward "job" computes one op's contribution to one input's gradient. The jobs of
 * stage s are split:
 *   B: the jobs the gradients handed to earlier stages depend on (transitively);
 *   W: all other jobs, i.e. parameter gradients and what only they need.
 * B also takes in the gradients handed back by later stages (and the loss seed), so W
 * reads only buffers of its own stage.
 * BW holds every job in plain reverse order. A gradient's contributions are all in B or
 * all in W (a job in B needs its op's output gradient complete, so every contribution
 * to it is in B too), and each list keeps reverse order, so B-then-W and BW perform the
 * same additions in the same order: bitwise the same result. The first contribution to
 * an activation gradient assigns, later ones add; parameter gradients always add. An add's
 * or bias add's input gradient that is only the copy of its output gradient is that
 * storage (grad_root): the job emits nothing, and the gradient is the same floats. */
#include "graph/autodiff.h"

#include <stdlib.h>
#include <string.h>

#include "codelets/cpu/kernels.h"

typedef struct {
    sp_program *p;
    int s;
    const uint8_t *needed; /* per tensor: its gradient is computed in B */
    uint8_t *written;      /* per tensor: a contribution was already emitted */
} ctx;

static int64_t rows_of(const sp_node *n) { return n->numel / n->shape[n->ndim - 1]; }

/* The gradient operand of op t's input k: for a parameter, the accumulator of this use
 * (program_impl.h); for an activation, its gradient. */
static sp_loc param_use_grad(sp_program *p, sp_kprog *kp, int s, int t, int k, sp_access_mode mode)
{
    int x = p->g->node[t].in[k];
    if (p->g->node[x].op != SP_OP_PARAM) return sp_loc_grad(p, kp, s, x, mode);
    sp_loc l = sp_loc_grad(p, kp, s, x, mode);
    l.off = p->use_goff[t * 3 + k];
    return l;
}

/* grad(t) op= f * src (n floats): the copy used by add, bias_add, scale, reshape and the
 * gathering of gradients that came back over edges. */
static double emit_scaled(sp_kprog *kp, sp_loc dst, sp_loc src, int64_t n, float f, int acc,
                          int node)
{
    sp_kinstr *I = sp_prog_emit(kp, SP_I_SCALE, node);
    I->o[0] = dst;
    I->i[0] = src;
    I->n[0] = n;
    I->f = f;
    I->acc = acc;
    return (double)n;
}

/* Emits into kp the job of op t for its input k (k = 1 for a layernorm's or embedding's
 * parameter pair). Returns its FLOPs. */
static double emit_job(ctx *c, sp_kprog *kp, int t, int k, int acc)
{
    sp_program *p = c->p;
    int s = c->s;
    const sp_node *n = &p->g->node[t];
    const sp_node *A = &p->g->node[n->in[0]];
    const sp_node *X = &p->g->node[n->in[k]];
    /* dx shares dy's storage (grad_root, program.c): the copy would be onto itself. Returned
     * before any operand is resolved, so no gradient is marked as used here. */
    if (((n->op == SP_OP_BIAS_ADD && k == 0) || n->op == SP_OP_ADD) &&
        p->grad_root[n->in[k]] == p->grad_root[t])
        return 0.0;
    sp_loc dout = sp_loc_grad(p, kp, s, t, SP_ACCESS_R);
    sp_loc dx = param_use_grad(p, kp, s, t, k, acc ? SP_ACCESS_RW : SP_ACCESS_W);
    sp_kinstr *I;
    switch (n->op) {
    case SP_OP_MATMUL: {
        int64_t M = rows_of(n), Nc = n->shape[n->ndim - 1];
        int64_t K = n->ta ? A->shape[0] : A->shape[A->ndim - 1];
        I = sp_prog_emit(kp, k == 0 ? SP_I_MATMUL_DA : SP_I_MATMUL_DB, t);
        I->o[0] = dx;
        I->i[0] = dout;
        sp_set_operand(p, kp, s, I, 1, n->in[1 - k]);
        I->n[0] = M;
        I->n[1] = Nc;
        I->n[2] = K;
        I->flag[0] = n->ta;
        I->flag[1] = n->tb;
        I->acc = acc;
        return 2.0 * M * Nc * K;
    }
    case SP_OP_BIAS_ADD:
        if (k == 0) return emit_scaled(kp, dx, dout, n->numel, 1.0f, acc, t);
        I = sp_prog_emit(kp, SP_I_BIAS_DB, t);
        I->o[0] = dx;
        I->i[0] = dout;
        I->n[0] = rows_of(n);
        I->n[1] = n->shape[n->ndim - 1];
        I->acc = acc;
        return (double)n->numel;
    case SP_OP_ADD:
    case SP_OP_RESHAPE:
    case SP_OP_TP_SUM: /* each term's gradient is the sum's */
        return emit_scaled(kp, dx, dout, n->numel, 1.0f, acc, t);
    case SP_OP_TP_COPY: /* every rank's part contributed to x's gradient: their sum */
        I = sp_prog_emit(kp, SP_I_ALLREDUCE, t);
        I->o[0] = dx;
        I->i[0] = dout;
        I->n[0] = n->numel;
        I->acc = acc;
        return (double)n->numel;
    case SP_OP_SCALE:
        return emit_scaled(kp, dx, dout, n->numel, n->s, acc, t);
    case SP_OP_GELU:
    case SP_OP_RELU:
        I = sp_prog_emit(kp, n->op == SP_OP_GELU ? SP_I_GELU_DX : SP_I_RELU_DX, t);
        I->o[0] = dx;
        I->i[0] = sp_loc_value(p, kp, s, n->in[0], SP_ACCESS_R);
        I->i[1] = dout;
        I->n[0] = n->numel;
        I->acc = acc;
        return 10.0 * n->numel;
    case SP_OP_LAYERNORM:
        if (k == 0) {
            I = sp_prog_emit(kp, SP_I_LN_DX, t);
            I->o[0] = dx;
            I->i[3] = sp_loc_value(p, kp, s, n->in[1], SP_ACCESS_R);
        } else {
            I = sp_prog_emit(kp, SP_I_LN_DP, t);
            I->o[0] = dx;
            I->o[1] = param_use_grad(p, kp, s, t, 2, SP_ACCESS_RW);
        }
        I->i[0] = dout;
        I->i[1] = sp_loc_value(p, kp, s, n->in[0], SP_ACCESS_R);
        I->i[2] = sp_loc_aux(p, kp, t, SP_ACCESS_R);
        I->n[0] = rows_of(n);
        I->n[1] = n->shape[n->ndim - 1];
        I->acc = acc;
        return 10.0 * n->numel;
    case SP_OP_RMSNORM: /* k = 0: dx; k = 1: dweight, accumulated as parameter gradients are */
        I = sp_prog_emit(kp, k == 0 ? SP_I_RMS_DX : SP_I_RMS_DW, t);
        I->o[0] = dx;
        I->i[0] = dout;
        I->i[1] = sp_loc_value(p, kp, s, n->in[0], SP_ACCESS_R);
        I->i[2] = sp_loc_aux(p, kp, t, SP_ACCESS_R);
        if (k == 0) I->i[3] = sp_loc_value(p, kp, s, n->in[1], SP_ACCESS_R);
        I->n[0] = rows_of(n);
        I->n[1] = n->shape[n->ndim - 1];
        I->acc = acc;
        return 8.0 * n->numel;
    case SP_OP_EMBED:
        I = sp_prog_emit(kp, SP_I_EMBED_DP, t);
        I->o[0] = dx;
        I->o[1] = param_use_grad(p, kp, s, t, 2, SP_ACCESS_RW);
        I->i[0] = dout;
        I->i[1] = sp_loc_value(p, kp, s, n->in[0], SP_ACCESS_R);
        I->n[0] = n->shape[0];
        I->n[1] = n->shape[1];
        I->n[2] = n->shape[2];
        I->acc = 1;
        return 2.0 * n->numel;
    case SP_OP_ATTENTION: {
        I = sp_prog_emit(kp, SP_I_ATTN_DX, t);
        I->o[0] = dx;
        I->o[1] = sp_loc_scratch(p, kp, s, sp_attention_scratch_need(p, n, 1));
        I->i[0] = dout;
        I->i[1] = sp_loc_value(p, kp, s, n->in[0], SP_ACCESS_R);
        I->i[2] = sp_loc_aux(p, kp, t, SP_ACCESS_R);
        I->i[3] = sp_loc_value(p, kp, s, t, SP_ACCESS_R); /* the output: D = dout . out */
        I->n[0] = n->shape[0];
        I->n[1] = n->shape[1];
        I->n[2] = n->shape[2];
        I->n[3] = n->heads;
        I->n[4] = n->group;
        I->acc = acc;
        return 4.0 * n->shape[0] * n->shape[1] * n->shape[1] * n->shape[2];
    }
    case SP_OP_ROPE: /* linear: the transpose, the opposite turn */
        I = sp_prog_emit(kp, SP_I_ROPE, t);
        I->o[0] = dx;
        I->i[0] = dout;
        sp_rope_sizes(I, n);
        I->flag[1] = 1;
        I->acc = acc;
        return 6.0 * n->numel;
    case SP_OP_SWIGLU:
        I = sp_prog_emit(kp, SP_I_SWIGLU_DX, t);
        I->o[0] = dx;
        I->i[0] = sp_loc_value(p, kp, s, n->in[0], SP_ACCESS_R);
        I->i[1] = dout;
        I->n[0] = rows_of(n);
        I->n[1] = n->shape[n->ndim - 1];
        I->acc = acc;
        return 16.0 * n->numel;
    case SP_OP_CROSS_ENTROPY:
        I = sp_prog_emit(kp, SP_I_CE_DX, t);
        I->o[0] = dx;
        I->i[0] = sp_loc_aux(p, kp, t, SP_ACCESS_R);
        I->i[1] = sp_loc_value(p, kp, s, n->in[1], SP_ACCESS_R);
        I->i[2] = dout;
        I->n[0] = rows_of(A);
        I->n[1] = A->shape[A->ndim - 1];
        I->acc = acc;
        return 3.0 * A->numel;
    case SP_OP_EMBED_VOCAB: /* k = 1, wte: its rows this rank holds */
        I = sp_prog_emit(kp, SP_I_EMBED_VOCAB_DP, t);
        I->o[0] = dx;
        I->i[0] = dout;
        I->i[1] = sp_loc_value(p, kp, s, n->in[0], SP_ACCESS_R);
        I->n[0] = n->shape[0] * n->shape[1];
        I->n[1] = n->shape[2];
        I->n[2] = n->vlo;
        I->n[3] = X->shape[0];
        I->acc = 1;
        return (double)n->numel;
    case SP_OP_ADD_POS:
        if (k == 0) return emit_scaled(kp, dx, dout, n->numel, 1.0f, acc, t);
        I = sp_prog_emit(kp, SP_I_ADD_POS_DP, t);
        I->o[0] = dx;
        I->i[0] = dout;
        I->n[0] = n->shape[0];
        I->n[1] = n->shape[1] * n->shape[2];
        I->acc = 1;
        return (double)n->numel;
    case SP_OP_CE_VOCAB: { /* the plain backward on the slice, its targets in the slice */
        int64_t N = rows_of(A), Vp = A->shape[A->ndim - 1];
        I = sp_prog_emit(kp, SP_I_CE_DX, t);
        I->o[0] = dx;
        I->i[0] = sp_loc_aux(p, kp, t, SP_ACCESS_R);
        I->i[1] = I->i[0];
        I->i[1].off += N * Vp + 3 * N; /* program.c, emit_ce_vocab */
        I->i[2] = dout;
        I->n[0] = N;
        I->n[1] = Vp;
        I->acc = acc;
        return 3.0 * A->numel;
    }
    case SP_OP_SUM:
    case SP_OP_MEAN:
        I = sp_prog_emit(kp, SP_I_SUM_DX, t);
        I->o[0] = dx;
        I->i[0] = dout;
        I->n[0] = X->numel;
        I->f = n->op == SP_OP_MEAN ? 1.0f / (float)X->numel : 1.0f;
        I->acc = acc;
        return (double)X->numel;
    default:
        return 0.0;
    }
}

/* Emits into the B or W program and into BW. */
static void emit_both(ctx *c, int inB, int t, int k, int acc)
{
    sp_kprog *split = sp_prog_of(c->p, c->s, inB ? SP_TASK_B : SP_TASK_W);
    sp_kprog *fused = sp_prog_of(c->p, c->s, SP_TASK_BW);
    split->flops += emit_job(c, split, t, k, acc);
    fused->flops += emit_job(c, fused, t, k, acc);
}

/* Starts the gradient of t (computed in stage s) from what later stages handed back and,
 * in the last stage, from the loss seed. */
static void emit_gather(ctx *c, int t)
{
    sp_program *p = c->p;
    /* Always in B, even when only W needs t: then W never reads what later stages handed
     * back, and those buffers can be freed after B. Being the first contribution to t,
     * it precedes every job in both orders. */
    sp_kprog *kps[2] = { sp_prog_of(p, c->s, SP_TASK_B),
                         sp_prog_of(p, c->s, SP_TASK_BW) };
    int acc = 0;
    if (t == p->g->loss) {
        for (int v = 0; v < 2; v++) {
            sp_loc o = sp_loc_grad(p, kps[v], c->s, t, SP_ACCESS_W); /* before: mark_grad */
            sp_prog_emit(kps[v], SP_I_SEED, t)->o[0] = o;
        }
        acc = 1;
    }
    /* later consumers first, as in a single-stage reverse pass */
    for (int e = p->nedges - 1; e >= 0; e--) {
        const sp_edge_layout *E = &p->edge[e];
        if (E->src != c->s) continue;
        for (int j = 0; j < E->ntensors; j++) {
            if (E->tensor[j] != t) continue;
            for (int v = 0; v < 2; v++) {
                int b = sp_prog_buf(kps[v], SP_BUF_EDGE_GRAD, e, (size_t)E->floats * 4,
                                    SP_ACCESS_R);
                sp_loc dst = sp_loc_grad(p, kps[v], c->s, t, acc ? SP_ACCESS_RW : SP_ACCESS_W);
                kps[v]->flops += emit_scaled(kps[v], dst, (sp_loc){ b, E->off[j] },
                                             p->g->node[t].numel, 1.0f, acc, t);
            }
            acc = 1;
        }
    }
    if (acc) c->written[t] = 1;
}

static sp_status emit_stage(sp_program *p, int s, uint8_t *needed, uint8_t *written)
{
    const sp_graph *g = p->g;
    ctx c = { .p = p, .s = s, .needed = needed, .written = written };
    memset(needed, 0, (size_t)g->n);
    memset(written, 0, (size_t)g->n);
    /* B's roots: tensors of earlier stages whose gradient this stage hands back. */
    for (int t = 0; t < g->n; t++) {
        const sp_node *n = &g->node[t];
        if (n->stage != s || n->op == SP_OP_YIELD || !p->needs_grad[t]) continue;
        for (int k = 0; k < n->nin; k++) {
            const sp_node *x = &g->node[n->in[k]];
            if (x->stage >= 0 && x->stage < s && p->needs_grad[n->in[k]]) needed[n->in[k]] = 1;
            if (x->op != SP_OP_PARAM && needed[n->in[k]] && p->needs_grad[n->in[k]])
                needed[t] = 1;
        }
    }
    /* Gradients handed back by later stages come first: every consumer there was created
     * after every consumer here, so this is the single-stage reverse order. */
    for (int t = g->n - 1; t >= 0; t--)
        if (g->node[t].stage == s && g->node[t].op != SP_OP_YIELD && p->needs_grad[t])
            emit_gather(&c, t);
    for (int t = g->n - 1; t >= 0; t--) {
        const sp_node *n = &g->node[t];
        if (n->stage != s || n->op == SP_OP_YIELD || !p->needs_grad[t]) continue;
        if (!written[t]) continue; /* nothing flows into t: its inputs get nothing from it */
        int njobs = (n->op == SP_OP_LAYERNORM || n->op == SP_OP_EMBED) ? 2 : n->nin;
        for (int k = 0; k < njobs; k++) {
            int x = n->in[k];
            if (n->op == SP_OP_EMBED) {
                if (k == 0) continue; /* tokens */
                x = n->in[1];
                if (!p->needs_grad[x] && !p->needs_grad[n->in[2]]) continue;
            } else if (!p->needs_grad[x]) {
                continue;
            }
            int is_param = g->node[x].op == SP_OP_PARAM;
            int acc = is_param ? 1 : written[x];
            emit_both(&c, !is_param && needed[x], t, k, acc);
            written[x] = 1;
            if (n->op == SP_OP_LAYERNORM && k == 1) written[n->in[2]] = 1;
        }
    }
    /* Gradient slots of incoming edges that nothing here contributed to are sent as zeros,
     * so the producer never reads stale memory. */
    for (int e = 0; e < p->nedges; e++) {
        const sp_edge_layout *E = &p->edge[e];
        if (E->dst != s || !E->needs_grad) continue;
        for (int j = 0; j < E->ntensors; j++) {
            int t = E->tensor[j];
            if (p->needs_grad[t] && written[t]) continue;
            for (int v = 0; v < 2; v++) {
                sp_kprog *kp = sp_prog_of(p, s, v ? SP_TASK_BW : SP_TASK_B);
                sp_kinstr *I = sp_prog_emit(kp, SP_I_ZERO, t);
                I->o[0] = (sp_loc){ sp_prog_buf(kp, SP_BUF_EDGE_GRAD, e, (size_t)E->floats * 4,
                                                SP_ACCESS_W),
                                    E->off[j] };
                I->n[0] = g->node[t].numel;
            }
        }
    }
    return SP_OK;
}

sp_status sp_autodiff_emit(sp_program *p)
{
    uint8_t *needed = malloc((size_t)p->g->n), *written = malloc((size_t)p->g->n);
    sp_status st = SP_OK;
    if (!needed || !written) st = sp_set_error(SP_ERR_NOMEM, "autodiff: out of memory");
    for (int s = 0; st == SP_OK && s < p->nstages; s++) st = emit_stage(p, s, needed, written);
    /* The scratch size is known only now: fix the byte size of every SCRATCH reference. */
    for (int s = 0; st == SP_OK && s < p->nstages; s++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++) {
            sp_kprog *kp = sp_prog_of(p, s, k);
            for (int j = 0; j < kp->nbufs; j++)
                if (kp->bufs[j].cls == SP_BUF_SCRATCH)
                    kp->bufs[j].bytes = (size_t)p->scratch_floats[s] * 4;
        }
    free(needed);
    free(written);
    return st;
}
