/* Stage programs: the memory layout of every buffer class, the forward programs, the
 * stage model handed to the planner, and the interpreter loop that runs a program on
 * buffers through a kernel backend (the same loop runs in the reference and inside every
 * StarPU task, CPU or CUDA). */
#include "graph/program_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/cpu/kernels.h"

static const char *kind_name(sp_task_kind k)
{
    static const char *const names[] = { "F", "B", "W", "BW" };
    return (k >= 0 && k < SP_NUM_TASK_KINDS) ? names[k] : "?";
}

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
static sp_loc slab_at(sp_program *p, sp_kprog *kp, sp_buf_class cls, int idx,
                      sp_access_mode mode, int64_t off)
{
    return (sp_loc){ sp_prog_buf(kp, cls, idx, sp_program_buf_bytes(p, cls, idx), mode), off };
}

/* A piece of stage s's SCRATCH: floats at offset off, the slab grown to hold them. */
static sp_loc scratch_piece(sp_program *p, sp_kprog *kp, int s, int64_t off, int64_t floats)
{
    sp_loc l = sp_loc_scratch(p, kp, s, off + floats);
    l.off = off;
    return l;
}

/* Where tensor t is read or written in stage s: PARAMS, INPUT, its own ACT or an edge. */
static sp_loc value_loc(sp_program *p, sp_kprog *kp, int s, int t, sp_access_mode mode)
{
    const sp_node *n = &p->g->node[t];
    if (n->op == SP_OP_PARAM) return slab_at(p, kp, SP_BUF_PARAMS, s, mode, p->param_off[s][t]);
    if (n->op == SP_OP_INPUT) {
        int k = 0;
        while (p->input[k] != t) k++;
        return slab_at(p, kp, SP_BUF_INPUT, k, mode, 0);
    }
    if (n->stage == s && p->scr_off[t] >= 0)
        return scratch_piece(p, kp, s, p->scr_off[t], n->numel);
    if (n->stage == s) return slab_at(p, kp, SP_BUF_ACT, s, mode, p->act_off[t]);
    int e = sp_edge_index(p, n->stage, s);
    return slab_at(p, kp, SP_BUF_EDGE_FWD, e, mode, edge_offset(&p->edge[e], t));
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
        return scratch_piece(p, kp, s, p->aux_scr_off[t], p->g->node[t].aux);
    return slab_at(p, kp, SP_BUF_ACT, s, mode, p->aux_off[t]);
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
    if (n->op == SP_OP_PARAM) return slab_at(p, kp, SP_BUF_GRADS, s, mode, p->param_off[s][t]);
    if (n->stage == s) { /* an alias is marked and placed as its root (same stage, size) */
        t = p->grad_root[t];
        n = &p->g->node[t];
        mark_grad(p, kp, t);
    }
    if (n->stage == s && p->gscr_off[t] >= 0)
        return scratch_piece(p, kp, s, p->gscr_off[t], n->numel);
    if (n->stage == s) return slab_at(p, kp, SP_BUF_BGRAD, s, mode, p->bgrad_off[t]);
    int e = sp_edge_index(p, n->stage, s);
    return slab_at(p, kp, SP_BUF_EDGE_GRAD, e, mode, edge_offset(&p->edge[e], t));
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

/* grad_root: a bias add y = x + b copies dy into dx. When that copy is all of dx, x's
 * gradient is y's storage and the copy is not emitted (autodiff.c): the same floats, no
 * traffic, kept once. It is all of dx when the bias add's input 0 is x's only use (no other
 * job adds into dx) and x is computed in the bias add's stage (no edge sends or gathers dx);
 * x is then not the loss either (no seed: the loss has no consumer the loss depends on). A
 * PARAM's gradient is its own accumulator, an INPUT needs none. In descending order, a
 * chain of bias adds shares the last one's root. */
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
        if (n->op != SP_OP_BIAS_ADD || !p->needs_grad[t]) continue;
        int x = n->in[0];
        const sp_node *X = &g->node[x];
        if (X->op == SP_OP_PARAM || X->op == SP_OP_INPUT || X->stage != n->stage ||
            !p->needs_grad[x] || uses[x] != 1)
            continue;
        p->grad_root[x] = p->grad_root[t]; /* t's root is final: its consumers came later */
    }
    free(uses);
    return SP_OK;
}

/* The ACT slab of every stage: each tensor computed there, in graph order, its value and
 * then its auxiliary floats, less those in SCRATCH (scr_off, aux_scr_off); the values
 * stored as bf16 (act16) go after the fp32 part, each on 16 bytes (cuBLAS's preferred
 * alignment), their aux floats stay in the fp32 part. Without bf16 or SCRATCH values
 * this is the plain fp32 layout. */
static void layout_act(sp_program *p)
{
    const sp_graph *g = p->g;
    for (int s = 0; s < p->nstages; s++) p->act_floats[s] = p->act_half[s] = 0;
    for (int t = 0; t < g->n; t++) {
        const sp_node *n = &g->node[t];
        p->act_off[t] = p->aux_off[t] = -1;
        if (n->op == SP_OP_INPUT || n->op == SP_OP_PARAM || n->op == SP_OP_YIELD) continue;
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

static sp_status layout(sp_program *p)
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

/* --- forward ------------------------------------------------------------------------- */

static int64_t rows_of(const sp_node *n) { return n->numel / n->shape[n->ndim - 1]; }

/* Emits op t of stage s, writing its value to `out`. Returns its FLOPs. */
static double emit_forward_op(sp_program *p, sp_kprog *kp, int s, int t, sp_loc out)
{
    const sp_graph *g = p->g;
    const sp_node *n = &g->node[t];
    const sp_node *A = n->nin > 0 ? &g->node[n->in[0]] : NULL;
    const sp_node *B = n->nin > 1 ? &g->node[n->in[1]] : NULL;
    sp_kinstr *I;
    if (n->op == SP_OP_MATMUL) {
        int64_t M = n->numel / n->shape[n->ndim - 1], Nc = n->shape[n->ndim - 1];
        int64_t K = n->ta ? A->shape[0] : A->shape[A->ndim - 1];
        I = sp_prog_emit(kp, SP_I_MATMUL, t);
        I->o[0] = out;
        sp_set_operand(p, kp, s, I, 0, n->in[0]);
        sp_set_operand(p, kp, s, I, 1, n->in[1]);
        I->n[0] = M;
        I->n[1] = Nc;
        I->n[2] = K;
        I->flag[0] = n->ta;
        I->flag[1] = n->tb;
        return 2.0 * M * Nc * K;
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
        I = sp_prog_emit(kp, SP_I_LAYERNORM, t);
        I->o[0] = out;
        I->o[1] = sp_loc_aux(p, kp, t, SP_ACCESS_W);
        I->i[0] = x0;
        I->i[1] = x1;
        I->i[2] = x2;
        I->n[0] = rows_of(n);
        I->n[1] = n->shape[n->ndim - 1];
        return 8.0 * n->numel;
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
        return 2.0 * n->shape[0] * n->shape[1] * n->shape[1] * n->shape[2];
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
        return 6.0 * A->numel;
    case SP_OP_SUM:
    case SP_OP_MEAN:
        I = sp_prog_emit(kp, SP_I_SUM, t);
        I->o[0] = out;
        I->i[0] = x0;
        I->n[0] = A->numel;
        I->f = n->op == SP_OP_MEAN ? 1.0f / (float)A->numel : 1.0f;
        return (double)A->numel;
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
        if (n->stage != s || n->op == SP_OP_YIELD) continue;
        if (!p->act16[t]) {
            kp->flops += emit_forward_op(p, kp, s, t, sp_loc_value(p, kp, s, t, SP_ACCESS_W));
            continue;
        }
        /* a value stored as bf16: computed in fp32 into SCRATCH (layout_scratch), then
         * rounded into ACT (not counted: a copy, not model FLOPs) */
        sp_loc tmp = scratch_piece(p, kp, s, p->tmp_off[t], n->numel);
        kp->flops += emit_forward_op(p, kp, s, t, tmp);
        sp_kinstr *I = sp_prog_emit(kp, SP_I_TO_BF16, t);
        I->o[0] = slab_at(p, kp, SP_BUF_ACT, s, SP_ACCESS_W, p->act_off[t]);
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

/* Places every computed value and activation gradient (layout_grads: BGRAD keeps what B
 * hands W, the rest goes to SCRATCH) and emits the programs on that layout. The readers are
 * known from the programs as first emitted (every value in ACT, fp32): every value read
 * goes through sp_loc_value (which marks it plain_read, and bwd_read in B, W or BW), as
 * a product's operand through sp_set_operand (bwd_read), and aux floats through
 * sp_loc_aux (aux_bwd_read). What no backward program reads goes to SCRATCH: F alone
 * uses it (a recomputing stage's second F too), so it need not live from F to B. The
 * loss and named tensors stay in ACT (sp_reference_value reads them after a forward).
 * Of the rest, under bf16 precision and when asked for, ACT stores as bf16 the values
 * that only matrix products read. */
static sp_status relayout(sp_program *p)
{
    const sp_graph *g = p->g;
    int on = p->act_bf16 && p->precision == SP_PRECISION_BF16;
    for (int t = 0; t < g->n; t++) {
        const sp_node *n = &g->node[t];
        int computed = n->op != SP_OP_INPUT && n->op != SP_OP_PARAM && n->op != SP_OP_YIELD;
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
    st = emit_programs(p);
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
    p->prog = calloc((size_t)p->nstages * SP_NUM_TASK_KINDS, sizeof *p->prog);
    if (!p->needs_grad || !p->prog) {
        st = sp_set_error(SP_ERR_NOMEM, "sp_program_build: out of memory");
        goto out;
    }
    if ((st = analyze(p)) != SP_OK) goto out;
    if ((st = layout(p)) != SP_OK) goto out;
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
        if (n->op == SP_OP_EMBED && n->in[0] == t && g->node[n->in[1]].shape[0] < lim)
            lim = g->node[n->in[1]].shape[0];
        if (n->op == SP_OP_CROSS_ENTROPY && n->in[1] == t) {
            const sp_node *L = &g->node[n->in[0]];
            if (L->shape[L->ndim - 1] < lim) lim = L->shape[L->ndim - 1];
        }
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

void sp_program_local_add_run(const sp_program *p, int stage, float *grads)
{
    for (int j = 0; j < p->nlocal[stage]; j++) {
        const int64_t *e = &p->local[stage][3 * j];
        float *dst = grads + e[0];
        const float *src = grads + e[1];
        for (int64_t i = 0; i < e[2]; i++) dst[i] += src[i];
    }
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

/* --- execution ----------------------------------------------------------------------- */

static const char *const icode_names[SP_I_COUNT] = {
    "matmul", "bias_add", "add", "gelu", "relu", "layernorm", "embed", "attention", "ce", "sum",
    "scale", "to_bf16", "matmul_da", "matmul_db", "bias_db", "gelu_dx", "relu_dx", "ln_dx",
    "ln_dparams", "embed_dparams", "attn_dqkv", "ce_dlogits", "sum_dx", "seed", "zero",
};

#define F32(l) ((float *)bufs[(l).buf] + (l).off)
#define I32(l) ((int32_t *)bufs[(l).buf] + (l).off)
#define U16(l) ((uint16_t *)bufs[(l).buf] + (l).off)
/* input k of a matrix product: bf16 storage or fp32 */
#define OPND(I, k)                                                                          \
    (((I)->half >> (k)) & 1 ? (const void *)U16((I)->i[k]) : (const void *)F32((I)->i[k]))

/* The one place that knows what each instruction's operands and sizes mean: every
 * backend sees only kernel calls. */
static int run_instr(const sp_kinstr *I, void *const *bufs, float dloss, int bf16,
                     const sp_backend *be, void *c)
{
    const int64_t *n = I->n;
    const int M = (int)n[0], Nc = (int)n[1], K = (int)n[2], acc = I->acc;
    const int prec = bf16 ? SP_PREC_BF16 : 0;
    switch (I->code) {
    case SP_I_MATMUL:
        return be->matmul(c, F32(I->o[0]), OPND(I, 0), OPND(I, 1), M, Nc, K, I->flag[0],
                          I->flag[1], acc,
                          prec | (I->half & 1 ? SP_PREC_A16 : 0) | (I->half & 2 ? SP_PREC_B16 : 0));
    case SP_I_BIAS_ADD:
        return be->bias_add(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), M, Nc);
    case SP_I_ADD:
        return be->add(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), n[0]);
    case SP_I_SCALE:
        return be->scale(c, F32(I->o[0]), F32(I->i[0]), I->f, n[0], acc);
    case SP_I_TO_BF16:
        return be->to_bf16(c, U16(I->o[0]), F32(I->i[0]), n[0]);
    case SP_I_GELU:
        return be->gelu(c, F32(I->o[0]), F32(I->i[0]), n[0]);
    case SP_I_RELU:
        return be->relu(c, F32(I->o[0]), F32(I->i[0]), n[0]);
    case SP_I_LAYERNORM: /* aux: mean (N) then rstd (N) */
        return be->layernorm(c, F32(I->o[0]), F32(I->o[1]), F32(I->o[1]) + n[0], F32(I->i[0]),
                             F32(I->i[1]), F32(I->i[2]), M, Nc);
    case SP_I_EMBED:
        return be->embed(c, F32(I->o[0]), I32(I->i[0]), F32(I->i[1]), F32(I->i[2]), M, Nc, K,
                         n[3]);
    case SP_I_ATTENTION:
        return be->attention(c, F32(I->o[0]), F32(I->o[1]), F32(I->i[1]), F32(I->i[0]), M, Nc,
                             K, (int)n[3], prec);
    case SP_I_CE:
        return be->cross_entropy(c, F32(I->o[0]), F32(I->o[1]), F32(I->i[0]), I32(I->i[1]), M,
                                 Nc, F32(I->i[2]));
    case SP_I_SUM: { /* f: 1/n for a mean */
        int rc = be->sum(c, F32(I->o[0]), F32(I->i[0]), n[0]);
        return rc || I->f == 1.0f ? rc : be->scale(c, F32(I->o[0]), F32(I->o[0]), I->f, 1, 0);
    }
    case SP_I_MATMUL_DA:
        return be->matmul_da(c, F32(I->o[0]), F32(I->i[0]), OPND(I, 1), M, Nc, K, I->flag[0],
                             I->flag[1], acc, prec | (I->half & 2 ? SP_PREC_B16 : 0));
    case SP_I_MATMUL_DB:
        return be->matmul_db(c, F32(I->o[0]), F32(I->i[0]), OPND(I, 1), M, Nc, K, I->flag[0],
                             I->flag[1], acc, prec | (I->half & 2 ? SP_PREC_A16 : 0));
    case SP_I_BIAS_DB:
        return be->bias_db(c, F32(I->o[0]), F32(I->i[0]), M, Nc, acc);
    case SP_I_GELU_DX:
        return be->gelu_dx(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), n[0], acc);
    case SP_I_RELU_DX:
        return be->relu_dx(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), n[0], acc);
    case SP_I_LN_DX:
        return be->layernorm_dx(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), F32(I->i[2]),
                                F32(I->i[2]) + n[0], F32(I->i[3]), M, Nc, acc);
    case SP_I_LN_DP:
        return be->layernorm_dparams(c, F32(I->o[0]), F32(I->o[1]), F32(I->i[0]), F32(I->i[1]),
                                     F32(I->i[2]), F32(I->i[2]) + n[0], M, Nc, acc);
    case SP_I_EMBED_DP:
        return be->embed_dparams(c, F32(I->o[0]), F32(I->o[1]), F32(I->i[0]), I32(I->i[1]), M,
                                 Nc, K);
    case SP_I_ATTN_DX:
        return be->attention_dx(c, F32(I->o[0]), F32(I->o[1]), F32(I->i[0]), F32(I->i[1]),
                                F32(I->i[3]), F32(I->i[2]), M, Nc, K, (int)n[3], acc, prec);
    case SP_I_CE_DX:
        return be->cross_entropy_dx(c, F32(I->o[0]), F32(I->i[0]), I32(I->i[1]), F32(I->i[2]), M,
                                    Nc, acc);
    case SP_I_SUM_DX:
        return be->sum_dx(c, F32(I->o[0]), F32(I->i[0]), I->f, n[0], acc);
    case SP_I_SEED:
        return be->set(c, F32(I->o[0]), dloss);
    case SP_I_ZERO:
        return be->zero(c, F32(I->o[0]), n[0]);
    default: /* SP_I_COUNT: refused by the caller */
        return 0;
    }
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

sp_status sp_program_run_on(const sp_program *p, int stage, sp_task_kind kind, void *const *bufs,
                            const sp_run_args *args, const sp_backend *be, void *ctx)
{
    const sp_kprog *kp = sp_prog_of(p, stage, kind);
    if (!kp) return sp_set_error(SP_ERR_ARG, "sp_program_run (%s): no program %s of stage %d",
                                 be->name, kind_name(kind), stage);
    float dloss = args ? args->dloss : 1.0f;
    for (int j = 0; j < kp->nins; j++) {
        const sp_kinstr *I = &kp->ins[j];
        if ((unsigned)I->code >= SP_I_COUNT)
            return sp_set_error(SP_ERR_ARG, "sp_program_run: bad instruction %d", I->code);
        int rc = run_instr(I, bufs, dloss, p->precision == SP_PRECISION_BF16, be, ctx);
        if (rc)
            return sp_set_error(rc == SP_BACKEND_BAD_INDEX ? SP_ERR_ARG : SP_ERR_RUNTIME,
                                "stage %d %s, instruction %d (%s, node %d) failed on %s: %s",
                                stage, kind_name(kind), j, icode_names[I->code], I->node,
                                be->name, be->status_string(rc));
    }
    return SP_OK;
}

sp_status sp_program_run(const sp_program *p, int stage, sp_task_kind kind, void *const *bufs,
                         const sp_run_args *args)
{
    return sp_program_run_on(p, stage, kind, bufs, args, sp_backend_cpu(), NULL);
}

void sp_program_print(const sp_program *p, void *stream)
{
    FILE *f = stream ? (FILE *)stream : stdout;
    if (!p) return;
    for (int s = 0; s < p->nstages; s++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++) {
            const sp_kprog *kp = sp_prog_of(p, s, k);
            fprintf(f, "%s%d: %d ops, %.3g flops, buffers:", kind_name(k), s, kp->nins,
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
                fprintf(f, "    %-13s node %-4d -> b%d+%lld%s\n", icode_names[I->code], I->node,
                        I->o[0].buf, (long long)I->o[0].off, I->acc ? " (+=)" : "");
            }
        }
}
