/* Synthetic stage models (a chain of identical stages, a GPT or a Llama from its shape) for
 * studying schedules without a real graph, and the names of task kinds and buffer
 * classes. */
#include "starpipe/stages.h"

#include <stdio.h>
#include <stdlib.h>

#include "starpipe/status.h"

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

/* What a decoder-only transformer's stages are made of, whatever its block: per block
 * (whole) its FLOPs by task kind, (one rank's) parameters and saved activations in bytes;
 * the first stage's and the last stage's extra parameters (one rank's). The head's 2 N C V
 * per kind, the group's all-reduces and the boundary tensors are the same for the GPT and
 * the Llama (stages.h). */
typedef struct {
    int layers, tp;
    const int *stage_layers;    /* NULL: even, the remainder to the first stages */
    double N, C, V, eb, device_flops;
    double f, b, w;             /* one block's FLOPs, before the split by tp */
    double params, acts;        /* one block's, one rank's: parameters (count), bytes */
    double first, last;         /* parameters (count) the first and last stages add */
} decoder_costs;

/* A cut of `layers` into nstages counts (the apps' rule: only the first and the last stage
 * may be empty), or the message of why not. */
static const char *bad_cut(const int *cut, int nstages, int layers, char *msg, size_t len)
{
    long long sum = 0;
    for (int s = 0; s < nstages; s++) {
        if (cut[s] < 0 || (cut[s] == 0 && s > 0 && s < nstages - 1)) {
            snprintf(msg, len, "stage %d of %d would have %d layers (only the first and the "
                     "last stage may be empty)", s, nstages, cut[s]);
            return msg;
        }
        sum += cut[s];
    }
    if (sum == layers) return NULL;
    snprintf(msg, len, "the stages' layer counts add up to %lld, not the model's %d layers", sum,
             layers);
    return msg;
}

static sp_stage_model *decoder_stages(const decoder_costs *d, int nstages)
{
    sp_stage_model *m = sp_stage_model_chain(nstages, 0, 0, 0, 0);
    if (!m) {
        sp_set_error(SP_ERR_NOMEM, "stage model: out of memory");
        return NULL;
    }
    double N = d->N, C = d->C, V = d->V, act = N * C * d->eb;
    int tp = d->tp;
    for (int s = 0; s < nstages; s++) {
        int nl = d->stage_layers ? d->stage_layers[s]
                                 : d->layers / nstages + (s < d->layers % nstages);
        double f = nl * d->f, b = nl * d->b, w = nl * d->w, params = nl * d->params;
        int nf = 2 * nl, nb = 2 * nl;        /* the group's all-reduces of (N, C) */
        double xf = 0;                       /* and of the cross-entropy's N floats */
        if (s == 0) params += d->first, nf++;
        if (s == nstages - 1) {
            f += 2 * N * C * V, b += 2 * N * C * V, w += 2 * N * C * V;
            params += d->last;
            nb++;
            if (tp > 1) xf = 3 * N * 4;
        }
        f /= tp, b /= tp, w /= tp;
        sp_stage_info *st = &m->stage[s];
        st->cost[SP_TASK_F] = f / d->device_flops;
        st->cost[SP_TASK_B] = b / d->device_flops;
        st->cost[SP_TASK_W] = w / d->device_flops;
        st->cost[SP_TASK_BW] = (b + w) / d->device_flops;
        st->act_bytes = (size_t)(nl * d->acts);
        st->param_bytes = (size_t)(4 * params);
        st->opt_bytes = 2 * st->param_bytes;
        if (tp > 1) {
            st->tp_allreduces[SP_TASK_F] = nf + (xf > 0 ? 3 : 0);
            st->tp_bytes[SP_TASK_F] = nf * act + xf;
            st->tp_allreduces[SP_TASK_B] = st->tp_allreduces[SP_TASK_BW] = nb;
            st->tp_bytes[SP_TASK_B] = st->tp_bytes[SP_TASK_BW] = nb * act;
        }
    }
    for (int e = 0; e < m->nedges; e++) m->edge[e].bytes = (size_t)act;
    return m;
}

int64_t sp_padded_vocab(int64_t vocab, int pad, int tp)
{
    const int64_t m = pad > 0 ? (int64_t)pad * (tp > 1 ? tp : 1) : 1;
    return (vocab + m - 1) / m * m;
}

sp_stage_model *sp_stage_model_gpt(const sp_gpt_shape *g, int nstages)
{
    int tp = g && g->tensor > 1 ? g->tensor : 1;
    char msg[160];
    if (!g || nstages < 1 || (!g->stage_layers && g->layers < nstages) || g->channels < 1 ||
        g->context < 1 || g->vocab < 1 || g->batch < 1 || !(g->device_flops > 0) ||
        g->channels % tp) {
        sp_set_error(SP_ERR_ARG, "GPT shape: a size below 1, T not dividing the channels, or "
                     "fewer layers than stages");
        return NULL;
    }
    if (g->stage_layers && bad_cut(g->stage_layers, nstages, g->layers, msg, sizeof msg)) {
        sp_set_error(SP_ERR_ARG, "GPT shape: %s", msg);
        return NULL;
    }
    double N = (double)g->batch * g->context, C = g->channels, T = g->context;
    double V = (double)sp_padded_vocab(g->vocab, SP_VOCAB_PAD, tp);
    double eb = g->elem_bytes > 0 ? g->elem_bytes : 2;
    /* one rank's part of a block (stages.h): the split weights and biases, the rest whole */
    decoder_costs d = {
        .layers = g->layers, .tp = tp, .stage_layers = g->stage_layers,
        .N = N, .C = C, .V = V, .eb = eb,
        .device_flops = g->device_flops,
        .f = 24 * N * C * C + 4 * N * T * C, .b = 24 * N * C * C + 8 * N * T * C,
        .w = 24 * N * C * C,
        .params = (12 * C * C + 7 * C) / tp + 6 * C,
        .acts = (10 + 24.0 / tp) * N * C * eb / 2,
        .first = V * C / tp + T * C, .last = V * C / tp + 2 * C };
    return decoder_stages(&d, nstages);
}

sp_stage_model *sp_stage_model_llama(const sp_llama_shape *l, int nstages)
{
    if (!l) {
        sp_set_error(SP_ERR_ARG, "Llama shape: NULL");
        return NULL;
    }
    int tp = l->tensor > 1 ? l->tensor : 1;
    const char *why = NULL;
    char msg[200];
    if (l->layers < 1 || l->channels < 1 || l->heads < 1 || l->kv_heads < 1 ||
        l->hidden < 1 || l->context < 1 || l->vocab < 1 || l->batch < 1)
        why = "every size (layers, channels, heads, KV heads, hidden, context, vocabulary, "
              "batch) must be at least 1";
    else if (!(l->device_flops > 0))
        why = "device_flops must be positive";
    else if (l->channels % l->heads)
        snprintf(msg, sizeof msg, "%d channels are not a multiple of %d heads", l->channels,
                 l->heads), why = msg;
    else if ((l->channels / l->heads) % 2)
        snprintf(msg, sizeof msg, "head size %d (%d channels / %d heads) is odd: rotary "
                 "embeddings rotate pairs", l->channels / l->heads, l->channels, l->heads),
            why = msg;
    else if (l->heads % l->kv_heads)
        snprintf(msg, sizeof msg, "%d KV heads do not divide %d heads", l->kv_heads, l->heads),
            why = msg;
    else if (l->kv_heads % tp || l->hidden % tp)
        snprintf(msg, sizeof msg, "tensor %d must divide the %d KV heads and the %d hidden "
                 "units", tp, l->kv_heads, l->hidden),
            why = msg;
    else if (nstages < 1 || (!l->stage_layers && l->layers < nstages))
        snprintf(msg, sizeof msg, "%d layers cannot be cut into %d stages", l->layers,
                 nstages), why = msg;
    else if (l->stage_layers)
        why = bad_cut(l->stage_layers, nstages, l->layers, msg, sizeof msg);
    if (why) {
        sp_set_error(SP_ERR_ARG, "Llama shape: %s", why);
        return NULL;
    }
    double N = (double)l->batch * l->context, C = l->channels, T = l->context;
    double V = (double)sp_padded_vocab(l->vocab, SP_VOCAB_PAD, tp);
    double I = l->hidden, kv = (double)l->kv_heads * (l->channels / l->heads);
    double eb = l->elem_bytes > 0 ? l->elem_bytes : 2;
    double prod = 2 * N * C * (2 * C + 2 * kv + 3 * I); /* q, k, v, o, gate, up, down */
    decoder_costs d = {
        .layers = l->layers, .tp = tp, .stage_layers = l->stage_layers,
        .N = N, .C = C, .V = V, .eb = eb,
        .device_flops = l->device_flops,
        .f = prod + 4 * N * T * C, .b = prod + 8 * N * T * C, .w = prod,
        .params = (2 * C * C + 2 * C * kv + 3 * C * I) / tp + 2 * C,
        .acts = N * eb * (4 * C + (2 * C + 2 * kv + 3 * I) / tp),
        .first = V * C / tp, .last = V * C / tp + C };
    /* a stage's bytes must fit a size_t: refuse what no device holds long before */
    if (l->layers * d.acts > 1e18 || 4 * (l->layers * d.params + d.first + d.last) > 1e18) {
        sp_set_error(SP_ERR_ARG, "Llama shape: a stage's activations or parameters past "
                     "1e18 bytes");
        return NULL;
    }
    return decoder_stages(&d, nstages);
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
