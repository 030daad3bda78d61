/* Stage programs: the forward programs, the build (analysis, layout, emission of every
 * program, autodiff.c for the backward ones, the stage model handed to the planner) and
 * the queries. The layout is layout.c's; the interpreter that runs a program, run.c's. */
#include "graph/autodiff.h"
#include "graph/program_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- forward ------------------------------------------------------------------------- */

static int64_t rows_of(const sp_node *n) { return n->numel / n->shape[n->ndim - 1]; }

/* The vocab-parallel cross-entropy (graph.h) as kernels around the group's all-reduces,
 * so that no kernel meets the group itself. Its aux: the slice's exponentials (N,Vp),
 * normalized into the softmax over the whole vocabulary, then the tail of 4N floats per
 * row: the maximum, the sum of exponentials, the target's logit (0 where another rank
 * holds the target), the target in the slice (i32, -1 elsewhere: the backward is
 * SP_I_CE_DX's, whose one-hot skips a target outside the slice). */
static double emit_ce_vocab(sp_program *p, sp_kprog *kp, int t, sp_loc out, sp_loc logits,
                            sp_loc targets)
{
    const sp_node *n = &p->g->node[t], *A = &p->g->node[n->in[0]];
    const int64_t N = rows_of(A), Vp = A->shape[A->ndim - 1];
    sp_loc probs = sp_loc_aux(p, kp, t, SP_ACCESS_RW), tail = probs, sums;
    tail.off += N * Vp;
    sums = tail;
    sums.off += N;
    sp_kinstr *I = sp_prog_emit(kp, SP_I_VCE_MAX, t);
    I->o[0] = tail;
    I->i[0] = logits;
    I->n[0] = N;
    I->n[1] = Vp;
    /* the slice's tokens: its columns before the vocabulary's padding */
    I->n[2] = n->vocab - n->vlo >= Vp ? Vp : n->vocab - n->vlo > 0 ? n->vocab - n->vlo : 0;
    I = sp_prog_emit(kp, SP_I_ALLREDUCE_MAX, t);
    I->o[0] = I->i[0] = tail;
    I->n[0] = N;
    I = sp_prog_emit(kp, SP_I_VCE_EXP, t);
    I->o[0] = probs;
    I->o[1] = tail;
    I->i[0] = logits;
    I->i[1] = targets;
    I->n[0] = N;
    I->n[1] = Vp;
    I->n[2] = n->vlo;
    I->n[3] = n->vocab;
    I = sp_prog_emit(kp, SP_I_ALLREDUCE, t); /* the sums and the target logits at once */
    I->o[0] = I->i[0] = sums;
    I->n[0] = 2 * N;
    I = sp_prog_emit(kp, SP_I_VCE_LOSS, t);
    I->o[0] = out;
    I->o[1] = probs;
    I->i[0] = tail;
    I->n[0] = N;
    I->n[1] = Vp;
    return 6.0 * A->numel;
}

/* Emits op t of stage s, writing its value to `out`. Returns its FLOPs. */
static double emit_forward_op(sp_program *p, sp_kprog *kp, int s, int t, sp_loc out)
{
    const sp_graph *g = p->g;
    const sp_node *n = &g->node[t];
    const sp_node *A = n->nin > 0 ? &g->node[n->in[0]] : NULL;
    const sp_node *B = n->nin > 1 ? &g->node[n->in[1]] : NULL;
    sp_kinstr *I;
    /* a product and the bias add that is its one reader: one instruction, at the add */
    const int fuse = n->op == SP_OP_BIAS_ADD && p->fused[n->in[0]];
    if (n->op == SP_OP_MATMUL || fuse) {
        const sp_node *P = fuse ? A : n, *PA = &g->node[P->in[0]];
        int64_t M = P->numel / P->shape[P->ndim - 1], Nc = P->shape[P->ndim - 1];
        int64_t K = P->ta ? PA->shape[0] : PA->shape[PA->ndim - 1];
        I = sp_prog_emit(kp, fuse ? SP_I_MATMUL_BIAS : SP_I_MATMUL, t);
        I->o[0] = out;
        sp_set_operand(p, kp, s, I, 0, P->in[0]);
        sp_set_operand(p, kp, s, I, 1, P->in[1]);
        if (fuse) I->i[2] = sp_loc_value(p, kp, s, n->in[1], SP_ACCESS_R);
        I->n[0] = M;
        I->n[1] = Nc;
        I->n[2] = K;
        I->flag[0] = P->ta;
        I->flag[1] = P->tb;
        return 2.0 * M * Nc * K + (fuse ? (double)n->numel : 0.0);
    }
    sp_loc x0 = n->nin > 0 ? sp_loc_value(p, kp, s, n->in[0], SP_ACCESS_R) : (sp_loc){ 0, 0 };
    sp_loc x1 = n->nin > 1 ? sp_loc_value(p, kp, s, n->in[1], SP_ACCESS_R) : (sp_loc){ 0, 0 };
    sp_loc x2 = n->nin > 2 ? sp_loc_value(p, kp, s, n->in[2], SP_ACCESS_R) : (sp_loc){ 0, 0 };
    switch (n->op) {
    case SP_OP_BIAS_ADD:
        I = sp_prog_emit(kp, SP_I_BIAS_ADD, t);
        I->o[0] = out;
        I->i[0] = x0;
        I->i[1] = x1;
        I->n[0] = rows_of(n);
        I->n[1] = n->shape[n->ndim - 1];
        return (double)n->numel;
    case SP_OP_ADD:
        I = sp_prog_emit(kp, SP_I_ADD, t);
        I->o[0] = out;
        I->i[0] = x0;
        I->i[1] = x1;
        I->n[0] = n->numel;
        return (double)n->numel;
    case SP_OP_SCALE:
    case SP_OP_RESHAPE:
        I = sp_prog_emit(kp, SP_I_SCALE, t);
        I->o[0] = out;
        I->i[0] = x0;
        I->n[0] = n->numel;
        I->f = n->op == SP_OP_SCALE ? n->s : 1.0f;
        return (double)n->numel;
    case SP_OP_GELU:
    case SP_OP_RELU:
        I = sp_prog_emit(kp, n->op == SP_OP_GELU ? SP_I_GELU : SP_I_RELU, t);
        I->o[0] = out;
        I->i[0] = x0;
        I->n[0] = n->numel;
        return 8.0 * n->numel;
    case SP_OP_LAYERNORM:
    case SP_OP_RMSNORM: /* RMSNorm: no beta (x2 unset, unread) */
        I = sp_prog_emit(kp, n->op == SP_OP_LAYERNORM ? SP_I_LAYERNORM : SP_I_RMSNORM, t);
        I->o[0] = out;
        I->o[1] = sp_loc_aux(p, kp, t, SP_ACCESS_W);
        I->i[0] = x0;
        I->i[1] = x1;
        I->i[2] = x2;
        I->n[0] = rows_of(n);
        I->n[1] = n->shape[n->ndim - 1];
        return (n->op == SP_OP_LAYERNORM ? 8.0 : 6.0) * n->numel;
    case SP_OP_EMBED:
        I = sp_prog_emit(kp, SP_I_EMBED, t);
        I->o[0] = out;
        I->i[0] = x0;
        I->i[1] = x1;
        I->i[2] = x2;
        I->n[0] = n->shape[0];
        I->n[1] = n->shape[1];
        I->n[2] = n->shape[2];
        I->n[3] = B->shape[0]; /* V, for the token range check */
        return (double)n->numel;
    case SP_OP_ATTENTION:
        I = sp_prog_emit(kp, SP_I_ATTENTION, t);
        I->o[0] = out;
        I->o[1] = sp_loc_aux(p, kp, t, SP_ACCESS_W);
        I->i[0] = x0;
        I->i[1] = sp_loc_scratch(p, kp, s, sp_attention_scratch_need(p, n, 0));
        I->n[0] = n->shape[0];
        I->n[1] = n->shape[1];
        I->n[2] = n->shape[2];
        I->n[3] = n->heads;
        I->n[4] = n->group;
        return 2.0 * n->shape[0] * n->shape[1] * n->shape[1] * n->shape[2];
    case SP_OP_ROPE:
        I = sp_prog_emit(kp, SP_I_ROPE, t);
        I->o[0] = out;
        I->i[0] = x0;
        sp_rope_sizes(I, n);
        return 6.0 * n->numel;
    case SP_OP_SWIGLU:
        I = sp_prog_emit(kp, SP_I_SWIGLU, t);
        I->o[0] = out;
        I->i[0] = x0;
        I->n[0] = rows_of(n);
        I->n[1] = n->shape[n->ndim - 1];
        return 12.0 * n->numel;
    case SP_OP_CROSS_ENTROPY:
        I = sp_prog_emit(kp, SP_I_CE, t);
        I->o[0] = out;
        I->o[1] = sp_loc_aux(p, kp, t, SP_ACCESS_W);
        I->i[0] = x0;
        I->i[1] = x1;
        /* the CUDA kernel's per-row losses (N doubles) and its bad-target count */
        I->i[2] = sp_loc_scratch(p, kp, s, 2 * rows_of(A) + 2);
        I->n[0] = rows_of(A);
        I->n[1] = A->shape[A->ndim - 1];
        I->n[2] = n->vocab; /* the tokens: columns from here on are padding */
        return 6.0 * A->numel;
    case SP_OP_SUM:
    case SP_OP_MEAN:
        I = sp_prog_emit(kp, SP_I_SUM, t);
        I->o[0] = out;
        I->i[0] = x0;
        I->n[0] = A->numel;
        I->f = n->op == SP_OP_MEAN ? 1.0f / (float)A->numel : 1.0f;
        return (double)A->numel;
    case SP_OP_EMBED_VOCAB:
        I = sp_prog_emit(kp, SP_I_EMBED_VOCAB, t);
        I->o[0] = out;
        I->i[0] = x0;
        I->i[1] = x1;
        I->n[0] = n->shape[0] * n->shape[1];
        I->n[1] = n->shape[2];
        I->n[2] = n->vlo;
        I->n[3] = B->shape[0];
        I->n[4] = n->vocab; /* for the token range check */
        return (double)n->numel;
    case SP_OP_ADD_POS:
        I = sp_prog_emit(kp, SP_I_ADD_POS, t);
        I->o[0] = out;
        I->i[0] = x0;
        I->i[1] = x1;
        I->n[0] = n->shape[0];
        I->n[1] = n->shape[1] * n->shape[2];
        return (double)n->numel;
    case SP_OP_CE_VOCAB:
        return emit_ce_vocab(p, kp, t, out, x0, x1);
    case SP_OP_TP_COPY: /* the identity: a copy */
    case SP_OP_TP_SUM:
        I = sp_prog_emit(kp, n->op == SP_OP_TP_SUM ? SP_I_ALLREDUCE : SP_I_SCALE, t);
        I->o[0] = out;
        I->i[0] = x0;
        I->n[0] = n->numel;
        I->f = 1.0f;
        return (double)n->numel;
    default:
        return 0.0;
    }
}

static void emit_forward(sp_program *p, int s)
{
    const sp_graph *g = p->g;
    sp_kprog *kp = sp_prog_of(p, s, SP_TASK_F);
    for (int t = 0; t < g->n; t++) {
        const sp_node *n = &g->node[t];
        if (n->stage != s || n->op == SP_OP_YIELD || p->fused[t]) continue;
        if (!p->act16[t]) {
            kp->flops += emit_forward_op(p, kp, s, t, sp_loc_value(p, kp, s, t, SP_ACCESS_W));
            continue;
        }
        /* a value stored as bf16: computed in fp32 into SCRATCH (layout_scratch), then
         * rounded into ACT (not counted: a copy, not model FLOPs) */
        sp_loc tmp = sp_loc_scratch_at(p, kp, s, p->tmp_off[t], n->numel);
        kp->flops += emit_forward_op(p, kp, s, t, tmp);
        sp_kinstr *I = sp_prog_emit(kp, SP_I_TO_BF16, t);
        I->o[0] = sp_loc_slab(p, kp, SP_BUF_ACT, s, SP_ACCESS_W, p->act_off[t]);
        I->i[0] = tmp;
        I->n[0] = n->numel;
    }
    /* hand the boundary tensors to later stages: one copy per edge slab */
    for (int e = 0; e < p->nedges; e++) {
        const sp_edge_layout *E = &p->edge[e];
        if (E->src != s) continue;
        int b = sp_prog_buf(kp, SP_BUF_EDGE_FWD, e, (size_t)E->floats * 4, SP_ACCESS_W);
        for (int j = 0; j < E->ntensors; j++) {
            sp_kinstr *I = sp_prog_emit(kp, SP_I_SCALE, E->tensor[j]);
            I->o[0] = (sp_loc){ b, E->off[j] };
            I->i[0] = sp_loc_value(p, kp, s, E->tensor[j], SP_ACCESS_R);
            I->n[0] = g->node[E->tensor[j]].numel;
            I->f = 1.0f;
        }
    }
    if (g->node[g->loss].stage == s) {
        sp_kinstr *I = sp_prog_emit(kp, SP_I_SCALE, g->loss);
        I->o[0] = (sp_loc){ sp_prog_buf(kp, SP_BUF_LOSS, 0, 4, SP_ACCESS_W), 0 };
        I->i[0] = sp_loc_value(p, kp, s, g->loss, SP_ACCESS_R);
        I->n[0] = 1;
        I->f = 1.0f;
    }
}

static int64_t find_input_limit(const sp_program *p, int t);

/* --- build, queries ------------------------------------------------------------------ */

static sp_status analyze(sp_program *p)
{
    const sp_graph *g = p->g;
    uint8_t *req = calloc((size_t)g->n, 1), *reach = calloc((size_t)g->n, 1);
    if (!req || !reach) {
        free(req);
        free(reach);
        return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
    }
    for (int t = 0; t < g->n; t++) {
        const sp_node *n = &g->node[t];
        if (n->op == SP_OP_PARAM) req[t] = 1;
        for (int k = 0; k < n->nin; k++) req[t] |= req[n->in[k]];
    }
    reach[g->loss] = 1;
    for (int t = g->n - 1; t >= 0; t--) {
        const sp_node *n = &g->node[t];
        if (!reach[t] || n->op == SP_OP_YIELD) continue;
        for (int k = 0; k < n->nin; k++) reach[n->in[k]] = 1;
    }
    for (int t = 0; t < g->n; t++)
        p->needs_grad[t] = req[t] && reach[t] && g->node[t].dtype == SP_F32 &&
                           g->node[t].op != SP_OP_YIELD;
    free(req);
    free(reach);
    /* Fusion: a product whose one reader is a bias add of its stage (a linear layer) runs
     * as one SP_I_MATMUL_BIAS, the bias added as the product is stored: no pass over the
     * product, and no buffer for it. Nothing else may read it: no other op (a yield is a
     * marker: its readers name the product themselves, so another stage's reader counts),
     * not the loss, not a named tensor (sp_reference_value). No backward reads it either:
     * a product's and a bias add's gradients need only their inputs. */
    int *readers = calloc((size_t)g->n, sizeof *readers);
    if (!readers) return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
    for (int u = 0; u < g->n; u++)
        if (g->node[u].op != SP_OP_YIELD)
            for (int k = 0; k < g->node[u].nin; k++) readers[g->node[u].in[k]]++;
    for (int u = 0; u < g->n; u++) {
        const sp_node *n = &g->node[u];
        if (n->op != SP_OP_BIAS_ADD) continue;
        const int t = n->in[0];
        const sp_node *x = &g->node[t];
        p->fused[t] = x->op == SP_OP_MATMUL && x->stage == n->stage && readers[t] == 1 &&
                      t != g->loss && !x->name[0];
    }
    free(readers);
    return SP_OK;
}

/* Emits every program on the current layout, from scratch. */
static sp_status emit_programs(sp_program *p)
{
    for (int i = 0; i < p->nstages * SP_NUM_TASK_KINDS; i++) {
        p->prog[i].nbufs = p->prog[i].nins = 0;
        p->prog[i].flops = 0;
    }
    for (int s = 0; s < p->nstages; s++) p->scratch_floats[s] = 0;
    for (int s = 0; s < p->nstages; s++) emit_forward(p, s);
    sp_status st = sp_autodiff_emit(p);
    for (int i = 0; st == SP_OK && i < p->nstages * SP_NUM_TASK_KINDS; i++)
        if (p->prog[i].oom) st = sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
    return st;
}

/* Places the values and gradients again, now that the programs' readers are known
 * (sp_program_place), and emits the programs on that layout. */
static sp_status relayout(sp_program *p)
{
    sp_status st = sp_program_place(p);
    if (st == SP_OK) st = emit_programs(p);
    for (int s = 0; st == SP_OK && s < p->nstages; s++) {
        p->model.stage[s].act_bytes = sp_program_buf_bytes(p, SP_BUF_ACT, s);
        p->model.stage[s].bgrad_bytes = sp_program_buf_bytes(p, SP_BUF_BGRAD, s);
    }
    return st;
}

static sp_status build_model(sp_program *p)
{
    const sp_graph *g = p->g;
    sp_stage_model *m = &p->model;
    m->nstages = p->nstages;
    m->stage = calloc((size_t)p->nstages, sizeof *m->stage);
    m->nedges = p->nedges;
    m->edge = calloc((size_t)(p->nedges ? p->nedges : 1), sizeof *m->edge);
    if (!m->stage || !m->edge) return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
    for (int s = 0; s < p->nstages; s++) {
        sp_stage_info *st = &m->stage[s];
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++) st->cost[k] = sp_prog_of(p, s, k)->flops;
        st->act_bytes = sp_program_buf_bytes(p, SP_BUF_ACT, s);
        st->bgrad_bytes = (size_t)p->bgrad_floats[s] * 4;
        st->param_bytes = (size_t)p->param_floats[s] * 4;
        st->opt_bytes = 2 * st->param_bytes;
    }
    for (int e = 0; e < p->nedges; e++)
        m->edge[e] = (sp_stage_edge){ .src_stage = p->edge[e].src, .dst_stage = p->edge[e].dst,
                                      .bytes = (size_t)p->edge[e].floats * 4,
                                      .needs_grad = p->edge[e].needs_grad };
    int nparams = sp_graph_num_params(g);
    m->shared = calloc((size_t)(nparams ? nparams : 1), sizeof *m->shared);
    if (!m->shared) return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
    for (int i = 0; i < nparams; i++) {
        int t = sp_graph_param(g, i), ns = 0;
        sp_stage_shared sh = { .bytes = (size_t)g->node[t].numel * 4, .single_use = 1 };
        for (int s = 0; s < p->nstages; s++) {
            if (p->param_off[s][t] < 0) continue;
            if (ns == 8)
                return sp_set_error(SP_ERR_GRAPH, "sp_program_build: parameter '%s' is used by "
                                    "more than 8 stages", g->node[t].name);
            sh.stages[ns++] = s;
        }
        sh.nstages = ns;
        /* A gradient in this IR is only ever read by the combine (no op takes a gradient
         * as input), so the precondition of the out-of-loop combine always holds. */
        if (ns > 1) m->shared[m->nshared++] = sh;
    }
    return SP_OK;
}

sp_program *sp_program_build(const sp_graph *g, sp_status *status)
{
    sp_status st = SP_OK;
    sp_program *p = NULL;
    if (!g) {
        st = sp_set_error(SP_ERR_ARG, "sp_program_build: graph is NULL");
        goto out;
    }
    if (g->loss < 0) {
        st = sp_set_error(SP_ERR_GRAPH, "sp_program_build: no loss (call sp_graph_set_loss)");
        goto out;
    }
    p = calloc(1, sizeof *p);
    if (!p) {
        st = sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
        goto out;
    }
    p->g = g;
    p->nstages = sp_graph_num_stages(g);
    p->needs_grad = calloc((size_t)g->n, 1);
    p->fused = calloc((size_t)g->n, 1);
    p->prog = calloc((size_t)p->nstages * SP_NUM_TASK_KINDS, sizeof *p->prog);
    if (!p->needs_grad || !p->fused || !p->prog) {
        st = sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
        goto out;
    }
    if ((st = analyze(p)) != SP_OK) goto out;
    if ((st = sp_program_layout(p)) != SP_OK) goto out;
    if (!(p->input_limit = malloc(sizeof(int64_t) * (size_t)(p->ninputs + 1)))) {
        st = sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
        goto out;
    }
    for (int k = 0; k < p->ninputs; k++) p->input_limit[k] = find_input_limit(p, p->input[k]);
    if ((st = emit_programs(p)) != SP_OK) goto out;
    /* every value in fp32 in ACT: the scratch is all the kernels' own */
    memcpy(p->kernel_scratch, p->scratch_floats, (size_t)p->nstages * sizeof(int64_t));
    if ((st = build_model(p)) != SP_OK) goto out;
    /* the readers now known: what only F reads moves to SCRATCH */
    if ((st = relayout(p)) != SP_OK) goto out;
out:
    if (st != SP_OK) {
        sp_program_free(p);
        p = NULL;
    }
    if (status) *status = st;
    return p;
}

void sp_program_free(sp_program *p)
{
    if (!p) return;
    for (int i = 0; p->prog && i < p->nstages * SP_NUM_TASK_KINDS; i++) {
        free(p->prog[i].bufs);
        free(p->prog[i].ins);
    }
    free(p->prog);
    for (int s = 0; p->param_off && s < p->nstages; s++) free(p->param_off[s]);
    free(p->param_off);
    for (int s = 0; p->local && s < p->nstages; s++) free(p->local[s]);
    free(p->local);
    free(p->nlocal);
    free(p->use_goff);
    free(p->grad_floats);
    for (int e = 0; p->edge && e < p->nedges; e++) {
        free(p->edge[e].tensor);
        free(p->edge[e].off);
    }
    free(p->edge);
    free(p->needs_grad);
    free(p->fused);
    free(p->act_off);
    free(p->aux_off);
    free(p->act16);
    free(p->plain_read);
    free(p->bwd_read);
    free(p->aux_bwd_read);
    free(p->scr_off);
    free(p->aux_scr_off);
    free(p->tmp_off);
    free(p->act_half);
    free(p->kernel_scratch);
    free(p->grad_root);
    free(p->bgrad_off);
    free(p->grad_use);
    free(p->grad_first);
    free(p->grad_last);
    free(p->gscr_off);
    free(p->param_floats);
    free(p->act_floats);
    free(p->bgrad_floats);
    free(p->scratch_floats);
    free(p->input);
    free(p->input_limit);
    free(p->model.stage);
    free(p->model.edge);
    free(p->model.shared);
    free(p);
}

const sp_graph *sp_program_graph(const sp_program *p) { return p ? p->g : NULL; }
int sp_program_num_stages(const sp_program *p) { return p ? p->nstages : 0; }
const sp_stage_model *sp_program_stage_model(const sp_program *p) { return p ? &p->model : NULL; }

int sp_program_num_bufs(const sp_program *p, int stage, sp_task_kind kind)
{
    const sp_kprog *kp = sp_prog_of(p, stage, kind);
    return kp ? kp->nbufs : 0;
}

sp_slab_ref sp_program_buf(const sp_program *p, int stage, sp_task_kind kind, int j)
{
    const sp_kprog *kp = sp_prog_of(p, stage, kind);
    if (!kp || j < 0 || j >= kp->nbufs) return (sp_slab_ref){ 0 };
    return kp->bufs[j];
}

int sp_program_num_ops(const sp_program *p, int stage, sp_task_kind kind)
{
    const sp_kprog *kp = sp_prog_of(p, stage, kind);
    return kp ? kp->nins : 0;
}

double sp_program_flops(const sp_program *p, int stage, sp_task_kind kind)
{
    const sp_kprog *kp = sp_prog_of(p, stage, kind);
    return kp ? kp->flops : 0.0;
}

int64_t sp_program_group_floats(const sp_program *p, int stage)
{
    int64_t most = 0;
    for (int k = SP_TASK_F; k <= SP_TASK_BW; k++) {
        const sp_kprog *kp = sp_prog_of(p, stage, (sp_task_kind)k);
        for (int j = 0; kp && j < kp->nins; j++)
            if ((kp->ins[j].code == SP_I_ALLREDUCE || kp->ins[j].code == SP_I_ALLREDUCE_MAX) &&
                kp->ins[j].n[0] > most)
                most = kp->ins[j].n[0];
    }
    return most;
}

int sp_program_num_inputs(const sp_program *p) { return p ? p->ninputs : 0; }
sp_tensor sp_program_input(const sp_program *p, int k)
{
    return (p && k >= 0 && k < p->ninputs) ? p->input[k] : -1;
}

/* The exclusive bound of an integer input: the smallest class count among its users. */
static int64_t find_input_limit(const sp_program *p, int t)
{
    const sp_graph *g = p->g;
    int64_t lim = INT64_MAX;
    for (int u = t + 1; u < g->n; u++) {
        const sp_node *n = &g->node[u];
        /* ids of the whole vocabulary (not of a vocab-parallel rank's part), before its
         * padding: the embedding's valid rows, the cross-entropy's tokens */
        if ((n->op == SP_OP_EMBED || n->op == SP_OP_EMBED_VOCAB) && n->in[0] == t &&
            sp_param_valid_rows(g, n->in[1]) < lim)
            lim = sp_param_valid_rows(g, n->in[1]);
        if ((n->op == SP_OP_CROSS_ENTROPY || n->op == SP_OP_CE_VOCAB) && n->in[1] == t &&
            n->vocab < lim)
            lim = n->vocab;
    }
    return lim;
}

sp_status sp_program_check_inputs(const sp_program *p, const void *const *inputs, int m)
{
    for (int k = 0; k < p->ninputs; k++) {
        const sp_node *n = &p->g->node[p->input[k]];
        if (n->dtype != SP_I32) continue;
        int64_t lim = p->input_limit[k];
        for (int i = 0; i < m; i++) {
            const int32_t *x = inputs[i * p->ninputs + k];
            for (int64_t j = 0; j < n->numel; j++)
                if (x[j] < 0 || x[j] >= lim)
                    return sp_set_error(SP_ERR_ARG, "input '%s' of microbatch %d: value %d at "
                                        "position %lld is outside [0,%lld)", n->name, i, x[j],
                                        (long long)j, (long long)lim);
        }
    }
    return SP_OK;
}

int sp_program_local_adds(const sp_program *p, int stage, const int64_t **adds)
{
    if (!p || stage < 0 || stage >= p->nstages) return 0;
    if (adds) *adds = p->local[stage];
    return p->nlocal[stage];
}

int64_t sp_program_param_offset(const sp_program *p, int stage, sp_tensor param)
{
    if (!p || stage < 0 || stage >= p->nstages || param < 0 || param >= p->g->n) return -1;
    return p->param_off[stage][param];
}

int sp_program_param_owner(const sp_program *p, sp_tensor param)
{
    for (int s = 0; p && s < p->nstages; s++)
        if (p->param_off[s][param] >= 0) return s;
    return -1;
}

int64_t sp_program_owned_floats(const sp_program *p, int stage)
{
    int64_t n = 0;
    for (int k = 0; p && stage >= 0 && stage < p->nstages && k < p->g->n; k++)
        if (p->g->node[k].op == SP_OP_PARAM && p->param_off[stage][k] >= 0 &&
            sp_program_param_owner(p, k) == stage)
            n += p->g->node[k].numel;
    return n;
}

/* NULL: a failed build, whose message stays */
sp_status sp_program_set_precision(sp_program *p, sp_precision precision)
{
    if (!p) return SP_ERR_ARG;
    p->precision = precision;
    return relayout(p);
}

sp_status sp_program_set_bf16_activations(sp_program *p, int on)
{
    if (!p) return SP_ERR_ARG;
    p->act_bf16 = on != 0;
    return relayout(p);
}

void sp_program_set_recompute(sp_program *p, int stage, int on)
{
    for (int s = 0; p && s < p->model.nstages; s++)
        if (stage < 0 || stage == s) p->model.stage[s].recompute = on != 0;
}

sp_precision sp_program_precision(const sp_program *p)
{
    return p ? p->precision : SP_PRECISION_FP32;
}

const char *sp_precision_name(sp_precision precision)
{
    return precision == SP_PRECISION_BF16 ? "bf16" : "fp32";
}

void sp_program_print(const sp_program *p, void *stream)
{
    FILE *f = stream ? (FILE *)stream : stdout;
    if (!p) return;
    for (int s = 0; s < p->nstages; s++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++) {
            const sp_kprog *kp = sp_prog_of(p, s, k);
            fprintf(f, "%s%d: %d ops, %.3g flops, buffers:", sp_task_kind_name(k), s, kp->nins,
                    kp->flops);
            for (int j = 0; j < kp->nbufs; j++)
                fprintf(f, " %s[%d]%s(%zu B)", sp_buf_class_name(kp->bufs[j].cls),
                        kp->bufs[j].index,
                        kp->bufs[j].mode == SP_ACCESS_R ? "r" : kp->bufs[j].mode == SP_ACCESS_W ? "w"
                                                                                          : "rw",
                        kp->bufs[j].bytes);
            fputc('\n', f);
            for (int j = 0; j < kp->nins; j++) {
                const sp_kinstr *I = &kp->ins[j];
                fprintf(f, "    %-13s node %-4d -> b%d+%lld%s\n", sp_icode_name(I->code), I->node,
                        I->o[0].buf, (long long)I->o[0].off, I->acc ? " (+=)" : "");
            }
        }
}
