/* Synthetic stage models (a chain of identical stages, a GPT from its shape) for studying
 * schedules without a real graph, and the names of task kinds and buffer classes. */
#include "starpipe/stages.h"

#include <stdlib.h>

sp_stage_model *sp_stage_model_chain(int n, double f, double b, double w, size_t bytes)
{
    if (n < 1) return NULL;
    sp_stage_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->nstages = n;
    m->stage = calloc((size_t)n, sizeof *m->stage);
    m->nedges = n - 1;
    m->edge = n > 1 ? calloc((size_t)(n - 1), sizeof *m->edge) : NULL;
    if (!m->stage || (n > 1 && !m->edge)) {
        sp_stage_model_free(m);
        return NULL;
    }
    for (int s = 0; s < n; s++) {
        sp_stage_info *st = &m->stage[s];
        st->cost[0] = f;
        st->cost[1] = b;
        st->cost[2] = w;
        st->cost[3] = b + w;
        st->act_bytes = 1;
    }
    for (int s = 0; s + 1 < n; s++)
        m->edge[s] = (sp_stage_edge){ .src_stage = s, .dst_stage = s + 1, .bytes = bytes,
                                      .needs_grad = 1 };
    return m;
}

void sp_stage_model_free(sp_stage_model *m)
{
    if (!m) return;
    free(m->stage);
    free(m->edge);
    free(m->shared);
    free(m);
}

sp_stage_model *sp_stage_model_gpt(const sp_gpt_shape *g, int nstages)
{
    int tp = g && g->tensor > 1 ? g->tensor : 1;
    if (!g || nstages < 1 || g->layers < nstages || g->channels < 1 || g->context < 1 ||
        g->vocab < 1 || g->batch < 1 || !(g->device_flops > 0) || g->channels % tp)
        return NULL;
    sp_stage_model *m = sp_stage_model_chain(nstages, 0, 0, 0, 0);
    if (!m) return NULL;
    double N = (double)g->batch * g->context, C = g->channels, T = g->context, V = g->vocab;
    double eb = g->elem_bytes > 0 ? g->elem_bytes : 2;
    /* one rank's part of a block (stages.h): the split weights and biases, the rest whole */
    double block_params = (12 * C * C + 7 * C) / tp + 6 * C;
    double block_acts = (10 + 24.0 / tp) * N * C * eb / 2, act = N * C * eb;
    for (int s = 0; s < nstages; s++) {
        int nl = g->layers / nstages + (s < g->layers % nstages);
        double f = nl * (24 * N * C * C + 4 * N * T * C), b = nl * (24 * N * C * C + 8 * N * T * C);
        double w = nl * 24 * N * C * C, params = nl * block_params;
        int nf = 2 * nl, nb = 2 * nl;        /* the group's all-reduces of (N, C) */
        double xf = 0;                       /* and of the cross-entropy's N floats */
        if (s == 0) params += V * C / tp + T * C, nf++;
        if (s == nstages - 1) {
            f += 2 * N * C * V, b += 2 * N * C * V, w += 2 * N * C * V;
            params += V * C / tp + 2 * C;
            nb++;
            if (tp > 1) xf = 3 * N * 4;
        }
        f /= tp, b /= tp, w /= tp;
        sp_stage_info *st = &m->stage[s];
        st->cost[SP_TASK_F] = f / g->device_flops;
        st->cost[SP_TASK_B] = b / g->device_flops;
        st->cost[SP_TASK_W] = w / g->device_flops;
        st->cost[SP_TASK_BW] = (b + w) / g->device_flops;
        st->act_bytes = (size_t)(nl * block_acts);
        st->param_bytes = (size_t)(4 * params);
        st->opt_bytes = 2 * st->param_bytes;
        if (tp > 1) {
            st->tp_allreduces[SP_TASK_F] = nf + (xf > 0 ? 3 : 0);
            st->tp_bytes[SP_TASK_F] = nf * act + xf;
            st->tp_allreduces[SP_TASK_B] = st->tp_allreduces[SP_TASK_BW] = nb;
            st->tp_bytes[SP_TASK_B] = st->tp_bytes[SP_TASK_BW] = nb * act;
        }
    }
    for (int e = 0; e < m->nedges; e++) m->edge[e].bytes = (size_t)(N * C * eb);
    return m;
}

const char *sp_buf_class_name(sp_buf_class c)
{
    static const char *const names[SP_NUM_BUF_CLASSES] = {
        "PARAMS", "GRADS", "ACT", "BGRAD", "EDGE_FWD", "EDGE_GRAD", "INPUT", "LOSS", "SCRATCH",
        "OPT", "SHARED_PARAM", "SHARED_GRAD" };
    return (unsigned)c < SP_NUM_BUF_CLASSES ? names[c] : "?";
}

const char *sp_task_kind_name(sp_task_kind k)
{
    static const char *const names[] = { "F", "B", "W", "BW" };
    return (unsigned)k < SP_NUM_TASK_KINDS ? names[k] : "?";
}
