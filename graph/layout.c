/* Stage programs' memory (program_impl.h): the buffers a program takes and the operand
 * of every value, auxiliary float and gradient it reads or writes (sp_loc_*), and the
 * layout of each buffer class: parameters and their per-use gradient accumulators, the
 * boundary tensors of each edge, ACT (what a backward reads), SCRATCH and BGRAD packed by
 * lifetime. program.c emits the forward programs on it, autodiff.c the backward ones. */
#include "graph/program_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/cpu/kernels.h"

sp_kprog *sp_prog_of(const sp_program *p, int stage, sp_task_kind kind)
{
    if (!p || stage < 0 || stage >= p->nstages || kind < 0 || kind >= SP_NUM_TASK_KINDS)
        return NULL;
    return &p->prog[stage * SP_NUM_TASK_KINDS + kind];
}

int sp_edge_index(const sp_program *p, int src, int dst)
{
    for (int e = 0; e < p->nedges; e++)
        if (p->edge[e].src == src && p->edge[e].dst == dst) return e;
    return -1;
}

static int64_t edge_offset(const sp_edge_layout *e, int t)
{
    for (int j = 0; j < e->ntensors; j++)
        if (e->tensor[j] == t) return e->off[j];
    return -1;
}

int sp_prog_buf(sp_kprog *kp, sp_buf_class cls, int index, size_t bytes, sp_access_mode mode)
{
    for (int j = 0; j < kp->nbufs; j++)
        if (kp->bufs[j].cls == cls && kp->bufs[j].index == index) {
            kp->bufs[j].mode |= mode;
            return j;
        }
    if (kp->nbufs == kp->capbufs) {
        int cap = kp->capbufs ? 2 * kp->capbufs : 8;
        sp_slab_ref *nb = realloc(kp->bufs, (size_t)cap * sizeof *nb);
        if (!nb) { /* remembered; sp_program_build fails with SP_ERR_NOMEM */
            kp->oom = 1;
            return 0;
        }
        kp->bufs = nb;
        kp->capbufs = cap;
    }
    kp->bufs[kp->nbufs] = (sp_slab_ref){ .cls = cls, .index = index, .bytes = bytes, .mode = mode };
    return kp->nbufs++;
}

sp_kinstr *sp_prog_emit(sp_kprog *kp, sp_icode code, int node)
{
    if (kp->nins == kp->capins) {
        int cap = kp->capins ? 2 * kp->capins : 32;
        sp_kinstr *ni = realloc(kp->ins, (size_t)cap * sizeof *ni);
        if (!ni) { /* the caller fills a scratch instruction; the build then fails */
            static _Thread_local sp_kinstr sink;
            kp->oom = 1;
            return &sink;
        }
        kp->ins = ni;
        kp->capins = cap;
    }
    sp_kinstr *in = &kp->ins[kp->nins++];
    memset(in, 0, sizeof *in);
    in->code = code;
    in->node = node;
    return in;
}

size_t sp_program_buf_bytes(const sp_program *p, sp_buf_class cls, int index)
{
    if (!p) return 0;
    switch (cls) {
    case SP_BUF_PARAMS:
        return (index >= 0 && index < p->nstages) ? (size_t)p->param_floats[index] * 4 : 0;
    case SP_BUF_GRADS:
        return (index >= 0 && index < p->nstages) ? (size_t)p->grad_floats[index] * 4 : 0;
    case SP_BUF_ACT:
        return (index >= 0 && index < p->nstages)
                   ? (size_t)p->act_floats[index] * 4 + (size_t)p->act_half[index] * 2 : 0;
    case SP_BUF_BGRAD:
        return (index >= 0 && index < p->nstages) ? (size_t)p->bgrad_floats[index] * 4 : 0;
    case SP_BUF_SCRATCH:
        return (index >= 0 && index < p->nstages) ? (size_t)p->scratch_floats[index] * 4 : 0;
    case SP_BUF_EDGE_FWD:
    case SP_BUF_EDGE_GRAD:
        return (index >= 0 && index < p->nedges) ? (size_t)p->edge[index].floats * 4 : 0;
    case SP_BUF_INPUT:
        return (index >= 0 && index < p->ninputs)
                   ? (size_t)p->g->node[p->input[index]].numel * 4 : 0;
    case SP_BUF_LOSS:
        return 4;
    default:
        return 0;
    }
}

/* The operand at float offset `off` of slab (cls, idx), which joins kp's buffer list. */
sp_loc sp_loc_slab(sp_program *p, sp_kprog *kp, sp_buf_class cls, int idx,
                   sp_access_mode mode, int64_t off)
{
    return (sp_loc){ sp_prog_buf(kp, cls, idx, sp_program_buf_bytes(p, cls, idx), mode), off };
}

/* A piece of stage s's SCRATCH: floats at offset off, the slab grown to hold them. */
sp_loc sp_loc_scratch_at(sp_program *p, sp_kprog *kp, int s, int64_t off, int64_t floats)
{
    sp_loc l = sp_loc_scratch(p, kp, s, off + floats);
    l.off = off;
    return l;
}

/* Where tensor t is read or written in stage s: PARAMS, INPUT, its own ACT or an edge. */
static sp_loc value_loc(sp_program *p, sp_kprog *kp, int s, int t, sp_access_mode mode)
{
    const sp_node *n = &p->g->node[t];
    if (n->op == SP_OP_PARAM) return sp_loc_slab(p, kp, SP_BUF_PARAMS, s, mode, p->param_off[s][t]);
    if (n->op == SP_OP_INPUT) {
        int k = 0;
        while (p->input[k] != t) k++;
        return sp_loc_slab(p, kp, SP_BUF_INPUT, k, mode, 0);
    }
    if (n->stage == s && p->scr_off[t] >= 0)
        return sp_loc_scratch_at(p, kp, s, p->scr_off[t], n->numel);
    if (n->stage == s) return sp_loc_slab(p, kp, SP_BUF_ACT, s, mode, p->act_off[t]);
    int e = sp_edge_index(p, n->stage, s);
    return sp_loc_slab(p, kp, SP_BUF_EDGE_FWD, e, mode, edge_offset(&p->edge[e], t));
}

/* t's own ACT value, as opposed to a parameter, an input or an edge's copy */
static int in_own_act(const sp_program *p, int s, int t)
{
    const sp_node *n = &p->g->node[t];
    return n->op != SP_OP_PARAM && n->op != SP_OP_INPUT && n->stage == s;
}

/* kp is B, W or BW: what it reads must outlive F (recompute's F again is F) */
static int is_backward(const sp_program *p, const sp_kprog *kp)
{
    return (kp - p->prog) % SP_NUM_TASK_KINDS != SP_TASK_F;
}

sp_loc sp_loc_value(sp_program *p, sp_kprog *kp, int s, int t, sp_access_mode mode)
{
    if ((mode & SP_ACCESS_R) && in_own_act(p, s, t)) {
        p->plain_read[t] = 1;
        if (is_backward(p, kp)) p->bwd_read[t] = 1;
    }
    return value_loc(p, kp, s, t, mode);
}

void sp_set_operand(sp_program *p, sp_kprog *kp, int s, sp_kinstr *I, int k, int t)
{
    I->i[k] = value_loc(p, kp, s, t, SP_ACCESS_R);
    if (in_own_act(p, s, t) && is_backward(p, kp)) p->bwd_read[t] = 1;
    if (in_own_act(p, s, t) && p->act16[t]) I->half |= 1 << k;
}

sp_loc sp_loc_aux(sp_program *p, sp_kprog *kp, int t, sp_access_mode mode)
{
    int s = p->g->node[t].stage;
    if ((mode & SP_ACCESS_R) && is_backward(p, kp)) p->aux_bwd_read[t] = 1;
    if (p->aux_scr_off[t] >= 0)
        return sp_loc_scratch_at(p, kp, s, p->aux_scr_off[t], p->g->node[t].aux);
    return sp_loc_slab(p, kp, SP_BUF_ACT, s, mode, p->aux_off[t]);
}

/* Marks which of B and W touch t's gradient, and over which instructions: kp->nins, the
 * index of the instruction being built, as every gradient operand is resolved before its
 * instruction is emitted (autodiff.c). */
static void mark_grad(sp_program *p, const sp_kprog *kp, int t)
{
    int kind = (int)((kp - p->prog) % SP_NUM_TASK_KINDS);
    if (kind != SP_TASK_B && kind != SP_TASK_W) return; /* F never; BW is B and W */
    p->grad_use[t] |= kind == SP_TASK_B ? 1 : 2;
    if (kp->nins < p->grad_first[t]) p->grad_first[t] = kp->nins;
    if (kp->nins > p->grad_last[t]) p->grad_last[t] = kp->nins;
}

sp_loc sp_loc_grad(sp_program *p, sp_kprog *kp, int s, int t, sp_access_mode mode)
{
    const sp_node *n = &p->g->node[t];
    if (n->op == SP_OP_PARAM) return sp_loc_slab(p, kp, SP_BUF_GRADS, s, mode, p->param_off[s][t]);
    if (n->stage == s) { /* an alias is marked and placed as its root (same stage, size) */
        t = p->grad_root[t];
        n = &p->g->node[t];
        mark_grad(p, kp, t);
    }
    if (n->stage == s && p->gscr_off[t] >= 0)
        return sp_loc_scratch_at(p, kp, s, p->gscr_off[t], n->numel);
    if (n->stage == s) return sp_loc_slab(p, kp, SP_BUF_BGRAD, s, mode, p->bgrad_off[t]);
    int e = sp_edge_index(p, n->stage, s);
    return sp_loc_slab(p, kp, SP_BUF_EDGE_GRAD, e, mode, edge_offset(&p->edge[e], t));
}

sp_loc sp_loc_scratch(sp_program *p, sp_kprog *kp, int s, int64_t floats)
{
    if (floats > p->scratch_floats[s]) p->scratch_floats[s] = floats;
    return (sp_loc){ sp_prog_buf(kp, SP_BUF_SCRATCH, s, 0, SP_ACCESS_RW), 0 };
}

static int64_t attention_need(sp_precision precision, const sp_node *n, int backward)
{
    int64_t T = n->shape[1];
    int64_t cpu = (precision == SP_PRECISION_BF16 ? sp_attention_scratch_floats_bf16
                                                  : sp_attention_scratch_floats)(
        (int)n->shape[0], (int)T, (int)n->shape[2], n->heads);
    /* sp_cuda_attention_scratch_floats: the backward's D = rowsum(dout * out), (B,NH,T) */
    int64_t cuda = backward ? n->shape[0] * n->heads * T : 0;
    return cpu > cuda ? cpu : cuda;
}

int64_t sp_attention_scratch_need(const sp_program *p, const sp_node *n, int backward)
{
    return attention_need(p->precision, n, backward);
}

/* Where stage s's packed SCRATCH values and gradients start: past what its kernels take
 * under either precision and direction (kernel_scratch was measured in fp32 at build,
 * and bf16's attention takes more), so that the layout does not depend on the precision
 * and no kernel's scratch reaches a value live across it. */
static int64_t kernel_room(const sp_program *p, int s)
{
    int64_t room = p->kernel_scratch[s];
    for (int t = 0; t < p->g->n; t++)
        if (p->g->node[t].stage == s && p->g->node[t].op == SP_OP_ATTENTION)
            for (int bf = 0; bf < 2; bf++)
                for (int backward = 0; backward < 2; backward++) {
                    int64_t need = attention_need(bf ? SP_PRECISION_BF16 : SP_PRECISION_FP32,
                                                  &p->g->node[t], backward);
                    if (need > room) room = need;
                }
    return (room + 3) / 4 * 4;
}

/* One gradient slot per use of a parameter (see program_impl.h): the first use in a
 * stage gets the PARAMS-shaped slot, later ones extra slots, listed for the local add. */
static sp_status layout_param_uses(sp_program *p)
{
    const sp_graph *g = p->g;
    int S = p->nstages, T = g->n;
    p->use_goff = malloc((size_t)T * 3 * sizeof *p->use_goff);
    p->grad_floats = calloc((size_t)S, sizeof *p->grad_floats);
    p->nlocal = calloc((size_t)S, sizeof *p->nlocal);
    p->local = calloc((size_t)S, sizeof *p->local);
    uint8_t *seen = calloc((size_t)T, 1);
    if (!p->use_goff || !p->grad_floats || !p->nlocal || !p->local || !seen) {
        free(seen);
        return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
    }
    for (int i = 0; i < T * 3; i++) p->use_goff[i] = -1;
    for (int s = 0; s < S; s++) {
        p->grad_floats[s] = p->param_floats[s];
        memset(seen, 0, (size_t)T);
        int cap = 0;
        for (int t = 0; t < T; t++) {
            const sp_node *n = &g->node[t];
            if (n->stage != s || n->op == SP_OP_YIELD) continue;
            for (int k = 0; k < n->nin; k++) {
                int x = n->in[k];
                if (g->node[x].op != SP_OP_PARAM) continue;
                if (!seen[x]) {
                    seen[x] = 1;
                    p->use_goff[t * 3 + k] = p->param_off[s][x];
                    continue;
                }
                p->use_goff[t * 3 + k] = p->grad_floats[s];
                if (p->nlocal[s] == cap) {
                    cap = cap ? 2 * cap : 4;
                    int64_t *l = realloc(p->local[s], (size_t)cap * 3 * sizeof *l);
                    if (!l) {
                        free(seen);
                        return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
                    }
                    p->local[s] = l;
                }
                int64_t *e = &p->local[s][3 * p->nlocal[s]++];
                e[0] = p->param_off[s][x];
                e[1] = p->grad_floats[s];
                e[2] = g->node[x].numel;
                p->grad_floats[s] += g->node[x].numel;
            }
        }
    }
    free(seen);
    return SP_OK;
}

/* --- layout ------------------------------------------------------------------------ */

/* grad_root: a bias add y = x + b copies dy into dx, and so does an add y = x + z (or z +
 * x) for each of its terms. When that copy is all of dx, x's gradient is y's storage and
 * the copy is not emitted (autodiff.c): the same floats, no traffic, kept once. It is all
 * of dx when x's only use is that input (no other job adds into dx) and x is computed in
 * the add's stage (no edge sends or gathers dx); x is then not the loss either (no seed:
 * the loss has no consumer the loss depends on). A PARAM's gradient is its own
 * accumulator, an INPUT needs none. Both terms of an add may share dy: once y's consumers
 * are done (reverse order), nothing writes dy, and only the terms' producers read it. In
 * descending order, a chain of adds shares the last one's root (a residual branch's
 * projection and its bias add share the residual sum's gradient). */
static sp_status alias_grads(sp_program *p)
{
    const sp_graph *g = p->g;
    int T = g->n;
    int *uses = calloc((size_t)(T ? T : 1), sizeof *uses);
    if (!uses) return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
    for (int u = 0; u < T; u++) {
        p->grad_root[u] = u;
        if (g->node[u].op != SP_OP_YIELD) /* a marker, not a reader: its readers use x */
            for (int k = 0; k < g->node[u].nin; k++) uses[g->node[u].in[k]]++;
    }
    for (int t = T - 1; t >= 0; t--) {
        const sp_node *n = &g->node[t];
        if ((n->op != SP_OP_BIAS_ADD && n->op != SP_OP_ADD) || !p->needs_grad[t]) continue;
        for (int k = 0; k < (n->op == SP_OP_ADD ? 2 : 1); k++) { /* a bias add: x, not b */
            int x = n->in[k];
            const sp_node *X = &g->node[x];
            if (X->op == SP_OP_PARAM || X->op == SP_OP_INPUT || X->stage != n->stage ||
                !p->needs_grad[x] || uses[x] != 1)
                continue;
            p->grad_root[x] = p->grad_root[t]; /* t's root is final: its consumers came later */
        }
    }
    free(uses);
    return SP_OK;
}

/* The ACT slab of every stage: each tensor computed there, in graph order, its value and
 * then its auxiliary floats, less those in SCRATCH (scr_off, aux_scr_off); the values
 * stored as bf16 (act16) go after the fp32 part, each on 16 bytes (cuBLAS's preferred
 * alignment), their aux floats stay in the fp32 part. Without bf16 or SCRATCH values
 * this is the plain fp32 layout. A fused product (program.c) has no value, so no place. */
static void layout_act(sp_program *p)
{
    const sp_graph *g = p->g;
    for (int s = 0; s < p->nstages; s++) p->act_floats[s] = p->act_half[s] = 0;
    for (int t = 0; t < g->n; t++) {
        const sp_node *n = &g->node[t];
        p->act_off[t] = p->aux_off[t] = -1;
        if (n->op == SP_OP_INPUT || n->op == SP_OP_PARAM || n->op == SP_OP_YIELD ||
            p->fused[t])
            continue;
        int s = n->stage;
        if (!p->act16[t] && p->scr_off[t] < 0) {
            p->act_off[t] = p->act_floats[s];
            p->act_floats[s] += n->numel;
        }
        if (p->aux_scr_off[t] < 0) {
            p->aux_off[t] = p->act_floats[s];
            p->act_floats[s] += n->aux;
        }
    }
    for (int t = 0; t < g->n; t++) {
        if (!p->act16[t]) continue;
        int s = g->node[t].stage;
        if (!p->act_half[s]) p->act_floats[s] = (p->act_floats[s] + 3) / 4 * 4; /* the first */
        p->act_off[t] = 2 * p->act_floats[s] + p->act_half[s];
        p->act_half[s] += (g->node[t].numel + 7) / 8 * 8;
    }
}

/* Packing by lifetime (layout_scratch, layout_grads): pieces live[i] = { offset, floats,
 * last use }. live_from drops those whose last use comes before `now` and returns how
 * many stay; first_fit returns the lowest offset where `floats` overlap none of them. */
static int live_from(int64_t (*live)[3], int nlive, int64_t now)
{
    int j = 0;
    for (int i = 0; i < nlive; i++)
        if (live[i][2] >= now) memmove(live[j++], live[i], sizeof *live);
    return j;
}

static int64_t first_fit(const int64_t (*live)[3], int nlive, int64_t floats)
{
    int64_t off = 0;
    for (int moved = 1; moved;) {
        moved = 0;
        for (int i = 0; i < nlive; i++)
            if (off < live[i][0] + live[i][1] && live[i][0] < off + floats) {
                off = live[i][0] + live[i][1];
                moved = 1;
            }
    }
    return off;
}

/* SCRATCH of stage s past the kernels' own floats: F's values no backward reads (scr_off),
 * aux floats no backward reads (aux_scr_off) and the fp32 results of bf16 values
 * (tmp_off), packed first-fit by lifetime in F's op order. A value lives from its op to
 * its last reader in the stage, or to F's end when a later stage takes it (the edge
 * copies come last); aux floats and a bf16 value's fp32 result only during their op.
 * Nothing that is live at the same op shares floats, an op's output and inputs included.
 * Each piece starts on 16 bytes. On entry scr_off and aux_scr_off are 0 where chosen. */
static sp_status layout_scratch(sp_program *p)
{
    const sp_graph *g = p->g;
    int T = g->n;
    int64_t *last = malloc((size_t)(T ? T : 1) * sizeof *last);
    /* live pieces: offset, floats, last op */
    int64_t(*live)[3] = malloc((size_t)(3 * T + 1) * sizeof *live);
    if (!last || !live) {
        free(last);
        free(live);
        return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
    }
    for (int t = 0; t < T; t++) last[t] = t;
    for (int u = 0; u < T; u++) {
        const sp_node *n = &g->node[u];
        if (n->op == SP_OP_YIELD) continue;
        for (int k = 0; k < n->nin; k++)
            if (g->node[n->in[k]].stage == n->stage && last[n->in[k]] < u) last[n->in[k]] = u;
    }
    for (int e = 0; e < p->nedges; e++)
        for (int j = 0; j < p->edge[e].ntensors; j++) last[p->edge[e].tensor[j]] = T;
    for (int s = 0; s < p->nstages; s++) {
        int64_t base = kernel_room(p, s);
        int nlive = 0;
        for (int t = 0; t < T; t++) {
            const sp_node *n = &g->node[t];
            if (n->stage != s || n->op == SP_OP_YIELD) continue;
            nlive = live_from(live, nlive, t); /* pieces whose last op came before t are free */
            int64_t *piece[3] = { p->scr_off[t] >= 0 ? &p->scr_off[t] : NULL,
                                  p->aux_scr_off[t] >= 0 ? &p->aux_scr_off[t] : NULL,
                                  p->act16[t] ? &p->tmp_off[t] : NULL };
            int64_t floats[3] = { n->numel, n->aux, n->numel }, end[3] = { last[t], t, t };
            for (int q = 0; q < 3; q++) {
                if (!piece[q]) continue;
                int64_t need = (floats[q] + 3) / 4 * 4, off = first_fit(live, nlive, need);
                live[nlive][0] = off;
                live[nlive][1] = need;
                live[nlive++][2] = end[q];
                *piece[q] = base + off;
            }
        }
    }
    free(last);
    free(live);
    return SP_OK;
}

/* BGRAD of every stage and the gradients' part of SCRATCH. BGRAD keeps, in graph order,
 * the gradients that B touches and W reads: they live from B to W of a microbatch. A
 * gradient only one of the two programs touches lives inside it: those of B are packed
 * first-fit by lifetime (its span of B's instructions, mark_grad) past the kernels' own
 * floats, those of W likewise after B's part, apart from it because BW runs both lists
 * interleaved (each in its own order, autodiff.c). F's values in SCRATCH need no room
 * apart: F is always another task. Each piece starts on 16 bytes. A gradient neither
 * touches has no place (no program reads or writes it), nor has an alias: sp_loc_grad
 * marks and places it as its root (grad_root). */
static sp_status layout_grads(sp_program *p)
{
    const sp_graph *g = p->g;
    int T = g->n;
    int *order = malloc((size_t)(T ? T : 1) * sizeof *order);
    int64_t(*live)[3] = malloc((size_t)(T ? T : 1) * sizeof *live);
    if (!order || !live) {
        free(order);
        free(live);
        return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
    }
    for (int s = 0; s < p->nstages; s++) {
        int64_t top = kernel_room(p, s);
        p->bgrad_floats[s] = 0;
        for (int t = 0; t < T; t++) {
            const sp_node *n = &g->node[t];
            if (n->stage != s || n->op == SP_OP_INPUT || n->op == SP_OP_PARAM ||
                n->op == SP_OP_YIELD)
                continue;
            p->bgrad_off[t] = p->gscr_off[t] = -1;
            if (p->grad_use[t] != 3) continue;
            p->bgrad_off[t] = p->bgrad_floats[s];
            p->bgrad_floats[s] += g->node[t].numel;
        }
        for (int use = 1; use <= 2; use++) {
            int n = 0;
            for (int t = 0; t < T; t++) /* by first use, insertion sort (stable) */
                if (g->node[t].stage == s && p->grad_use[t] == use) {
                    int j = n++;
                    for (; j > 0 && p->grad_first[order[j - 1]] > p->grad_first[t]; j--)
                        order[j] = order[j - 1];
                    order[j] = t;
                }
            int nlive = 0;
            int64_t peak = 0;
            for (int i = 0; i < n; i++) {
                int t = order[i];
                nlive = live_from(live, nlive, p->grad_first[t]); /* ended before t's first */
                int64_t need = (g->node[t].numel + 3) / 4 * 4, off = first_fit(live, nlive, need);
                p->gscr_off[t] = top + off;
                live[nlive][0] = off;
                live[nlive][1] = need;
                live[nlive++][2] = p->grad_last[t];
                if (off + need > peak) peak = off + need;
            }
            top += peak;
        }
    }
    free(order);
    free(live);
    return SP_OK;
}

sp_status sp_program_layout(sp_program *p)
{
    const sp_graph *g = p->g;
    int S = p->nstages, T = g->n;
    p->act_off = malloc((size_t)T * sizeof *p->act_off);
    p->aux_off = malloc((size_t)T * sizeof *p->aux_off);
    p->act16 = calloc((size_t)T, 1);
    p->plain_read = calloc((size_t)T, 1);
    p->bwd_read = calloc((size_t)T, 1);
    p->aux_bwd_read = calloc((size_t)T, 1);
    p->scr_off = malloc((size_t)T * sizeof *p->scr_off);
    p->aux_scr_off = malloc((size_t)T * sizeof *p->aux_scr_off);
    p->tmp_off = malloc((size_t)T * sizeof *p->tmp_off);
    p->grad_root = malloc((size_t)T * sizeof *p->grad_root);
    p->bgrad_off = malloc((size_t)T * sizeof *p->bgrad_off);
    p->grad_use = calloc((size_t)T, 1);
    p->grad_first = malloc((size_t)T * sizeof *p->grad_first);
    p->grad_last = malloc((size_t)T * sizeof *p->grad_last);
    p->gscr_off = malloc((size_t)T * sizeof *p->gscr_off);
    p->param_off = calloc((size_t)S, sizeof *p->param_off);
    p->param_floats = calloc((size_t)S, sizeof(int64_t));
    p->act_floats = calloc((size_t)S, sizeof(int64_t));
    p->act_half = calloc((size_t)S, sizeof(int64_t));
    p->bgrad_floats = calloc((size_t)S, sizeof(int64_t));
    p->scratch_floats = calloc((size_t)S, sizeof(int64_t));
    p->kernel_scratch = calloc((size_t)S, sizeof(int64_t));
    p->input = malloc((size_t)T * sizeof *p->input);
    if (!p->act_off || !p->aux_off || !p->act16 || !p->plain_read || !p->bwd_read ||
        !p->aux_bwd_read || !p->scr_off || !p->aux_scr_off || !p->tmp_off || !p->bgrad_off ||
        !p->grad_root || !p->grad_use || !p->grad_first || !p->grad_last || !p->gscr_off ||
        !p->param_off || !p->param_floats || !p->act_floats || !p->act_half ||
        !p->bgrad_floats || !p->scratch_floats || !p->kernel_scratch || !p->input)
        return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
    for (int t = 0; t < T; t++) {
        p->scr_off[t] = p->aux_scr_off[t] = p->tmp_off[t] = p->gscr_off[t] = -1;
        p->grad_first[t] = INT64_MAX;
        p->grad_last[t] = -1;
    }
    for (int s = 0; s < S; s++) {
        p->param_off[s] = malloc((size_t)T * sizeof(int64_t));
        if (!p->param_off[s]) return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
        for (int t = 0; t < T; t++) p->param_off[s][t] = -1;
    }
    sp_status st = alias_grads(p);
    if (st != SP_OK) return st;
    int *ops_in_stage = calloc((size_t)S, sizeof(int));
    /* edge_of[src*S + dst] marks which stage pairs exchange tensors */
    uint8_t *pair = calloc((size_t)S * (size_t)S, 1);
    if (!ops_in_stage || !pair) {
        free(ops_in_stage);
        free(pair);
        return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
    }
    for (int t = 0; t < T; t++) {
        const sp_node *n = &g->node[t];
        p->bgrad_off[t] = -1;
        if (n->op == SP_OP_INPUT) p->input[p->ninputs++] = t;
        if (n->op == SP_OP_INPUT || n->op == SP_OP_PARAM || n->op == SP_OP_YIELD) continue;
        int s = n->stage;
        ops_in_stage[s]++;
        if (p->needs_grad[t] && p->grad_root[t] == t) {
            p->bgrad_off[t] = p->bgrad_floats[s];
            p->bgrad_floats[s] += n->numel;
        }
        for (int k = 0; k < n->nin; k++) {
            const sp_node *x = &g->node[n->in[k]];
            if (x->op == SP_OP_PARAM && p->param_off[s][n->in[k]] < 0) {
                p->param_off[s][n->in[k]] = p->param_floats[s];
                p->param_floats[s] += x->numel;
            } else if (x->stage >= 0 && x->stage != s) {
                pair[x->stage * S + s] = 1;
            }
        }
    }
    for (int s = 0; s < S; s++)
        if (!ops_in_stage[s]) {
            free(ops_in_stage);
            free(pair);
            return sp_set_error(SP_ERR_GRAPH, "sp_program_build: stage %d has no ops (two "
                                "sp_pipeline_yield in a row, or one after the loss?)", s);
        }
    free(ops_in_stage);
    for (int a = 0; a < S; a++)
        for (int b = 0; b < S; b++) p->nedges += pair[a * S + b];
    p->edge = calloc((size_t)(p->nedges ? p->nedges : 1), sizeof *p->edge);
    if (!p->edge) {
        free(pair);
        return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
    }
    int e = 0;
    for (int a = 0; a < S; a++)
        for (int b = 0; b < S; b++) {
            if (!pair[a * S + b]) continue;
            sp_edge_layout *E = &p->edge[e++];
            E->src = a;
            E->dst = b;
            E->tensor = malloc((size_t)T * sizeof(int));
            E->off = malloc((size_t)T * sizeof(int64_t));
            if (!E->tensor || !E->off) {
                free(pair);
                return sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
            }
            /* every tensor of stage a read by an op of stage b, each once, ascending */
            for (int t = 0; t < T; t++) {
                if (g->node[t].stage != a || g->node[t].op == SP_OP_YIELD) continue;
                int used = 0;
                for (int u = t + 1; u < T && !used; u++) {
                    const sp_node *c = &g->node[u];
                    if (c->stage != b || c->op == SP_OP_YIELD) continue;
                    for (int k = 0; k < c->nin; k++) used |= c->in[k] == t;
                }
                if (!used) continue;
                E->tensor[E->ntensors] = t;
                E->off[E->ntensors++] = E->floats;
                E->floats += g->node[t].numel;
                E->needs_grad |= p->needs_grad[t];
            }
        }
    free(pair);
    layout_act(p);
    return layout_param_uses(p);
}

/* Places every computed value and activation gradient (layout_grads: BGRAD keeps what B
 * hands W, the rest goes to SCRATCH), from the readers known from the programs as first
 * emitted (every value in ACT, fp32): every value read goes through sp_loc_value (which
 * marks it plain_read, and bwd_read in B, W or BW), as a product's operand through
 * sp_set_operand (bwd_read), and aux floats through sp_loc_aux (aux_bwd_read). What no
 * backward program reads goes to SCRATCH: F alone uses it (a recomputing stage's second F
 * too), so it need not live from F to B. The loss and named tensors stay in ACT
 * (sp_reference_value reads them after a forward). Of the rest, under bf16 precision and
 * when asked for, ACT stores as bf16 the values that only matrix products read. */
sp_status sp_program_place(sp_program *p)
{
    const sp_graph *g = p->g;
    int on = p->act_bf16 && p->precision == SP_PRECISION_BF16;
    for (int t = 0; t < g->n; t++) {
        const sp_node *n = &g->node[t];
        int computed = n->op != SP_OP_INPUT && n->op != SP_OP_PARAM && n->op != SP_OP_YIELD &&
                       !p->fused[t]; /* a fused product has no value of its own */
        int scr = computed && !p->bwd_read[t] && t != g->loss && !n->name[0];
        p->scr_off[t] = scr ? 0 : -1;
        p->aux_scr_off[t] = computed && n->aux && !p->aux_bwd_read[t] ? 0 : -1;
        p->tmp_off[t] = -1;
        p->act16[t] = on && computed && !scr && !p->plain_read[t];
    }
    sp_status st = layout_scratch(p);
    if (st == SP_OK) st = layout_grads(p);
    if (st != SP_OK) return st;
    layout_act(p);
    return SP_OK;
}

int sp_program_edge_replicated(const sp_program *p, int e)
{
    if (!p || e < 0 || e >= p->nedges) return -1;
    int n = sp_graph_num_tensors(p->g);
    uint8_t *value = malloc((size_t)n + 1), *grad = malloc((size_t)n + 1);
    int bits = -1;
    if (value && grad && sp_graph_replicated(p->g, value, grad) == SP_OK) {
        bits = 3;
        const sp_edge_layout *E = &p->edge[e];
        for (int j = 0; j < E->ntensors; j++) {
            if (!value[E->tensor[j]]) bits &= ~1;
            if (!grad[E->tensor[j]]) bits &= ~2;
        }
    }
    free(value), free(grad);
    return bits;
}
