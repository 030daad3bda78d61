/* Sampling from a causal model on the reference interpreter (include/starpipe/sample.h):
 * the token sampler, and generation token by token from a right-padded context. */
#include "starpipe/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/data.h"

double sp_sample_uniform(uint64_t seed, uint64_t i)
{
    return (double)(sp_mix64(sp_mix64(seed) ^ i) >> 11) * 0x1.0p-53;
}

static int argmax(const float *x, int V)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (x[v] > x[best]) best = v;
    return best;
}

typedef struct {
    float logit;
    int index;
} cand;

/* Descending logit, then ascending index: a total order, so the cut at top_k and the
 * walk are the same on every machine. */
static int by_logit(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

int sp_sample_token(const float *logits, int V, float temperature, int top_k, double u)
{
    if (!logits || V < 1) return -1;
    for (int v = 0; v < V; v++)
        if (!isfinite(logits[v])) return -1;
    if (temperature <= 0.0f || top_k == 1 || V == 1) return argmax(logits, V);
    int k = top_k > 0 && top_k < V ? top_k : V;
    cand *c = malloc((size_t)V * sizeof *c);
    if (!c) return argmax(logits, V); /* no memory for the order: the greedy choice */
    for (int v = 0; v < V; v++) c[v] = (cand){ logits[v], v };
    qsort(c, (size_t)V, sizeof *c, by_logit);
    double max = c[0].logit, total = 0.0;
    for (int j = 0; j < k; j++) total += exp(((double)c[j].logit - max) / temperature);
    double target = u * total, run = 0.0;
    int pick = c[k - 1].index;
    for (int j = 0; j < k; j++) {
        run += exp(((double)c[j].logit - max) / temperature);
        if (run > target) {
            pick = c[j].index;
            break;
        }
    }
    free(c);
    return pick;
}

sp_status sp_generate(sp_reference *r, const int32_t *prompt, int nprompt, int n,
                      const sp_sample_opts *o, int32_t *out)
{
    if (!r || !prompt || nprompt < 1 || n < 0 || !o || (n > 0 && !out))
        return sp_set_error(SP_ERR_ARG, "sp_generate: bad argument (a prompt of at least one "
                            "token is needed)");
    const sp_program *p = sp_reference_program(r);
    const sp_graph *g = sp_program_graph(p);
    sp_tensor tok = sp_graph_find(g, "tokens"), lg = sp_graph_find(g, "logits");
    if (tok < 0 || !sp_tensor_is_input(g, tok) || sp_tensor_dtype(g, tok) != SP_I32 ||
        sp_tensor_ndim(g, tok) != 2)
        return sp_set_error(SP_ERR_ARG, "sp_generate: the model has no i32 input 'tokens' (B,T)");
    const int64_t *ts = sp_tensor_shape(g, tok);
    if (lg < 0 || sp_tensor_is_input(g, lg) || sp_tensor_is_param(g, lg) ||
        sp_tensor_ndim(g, lg) != 3 || sp_tensor_shape(g, lg)[0] != ts[0] ||
        sp_tensor_shape(g, lg)[1] != ts[1])
        return sp_set_error(SP_ERR_ARG, "sp_generate: the model has no tensor named 'logits' "
                            "(B,T,V) to go with its tokens (B,T)");
    int T = (int)ts[1], V = (int)sp_tensor_shape(g, lg)[2];
    int nin = sp_program_num_inputs(p), k_tok = -1;
    void **in = calloc((size_t)nin, sizeof *in);
    int32_t *ctx = malloc(((size_t)nprompt + (size_t)n) * sizeof *ctx);
    sp_status st = SP_OK;
    if (!in || !ctx) st = sp_set_error(SP_ERR_NOMEM, "sp_generate: out of memory");
    for (int k = 0; st == SP_OK && k < nin; k++) {
        if (sp_program_input(p, k) == tok) k_tok = k;
        if (!(in[k] = calloc(1, sp_program_buf_bytes(p, SP_BUF_INPUT, k) + 4)))
            st = sp_set_error(SP_ERR_NOMEM, "sp_generate: out of memory");
    }
    if (st == SP_OK) memcpy(ctx, prompt, (size_t)nprompt * sizeof *ctx);
    for (int i = 0; st == SP_OK && i < n; i++) {
        int have = nprompt + i, L = have < T ? have : T;
        int32_t *row = in[k_tok];
        memcpy(row, ctx + (have - L), (size_t)L * sizeof *row);
        memset(row + L, 0, (size_t)(T - L) * sizeof *row); /* right padding */
        if ((st = sp_reference_eval(r, 1, (const void *const *)in, NULL))) break;
        const float *logits = sp_reference_value(r, lg) + (size_t)(L - 1) * V;
        int next = sp_sample_token(logits, o->vocab > 0 && o->vocab < V ? o->vocab : V,
                                   o->temperature, o->top_k,
                                   sp_sample_uniform(o->seed, (uint64_t)i));
        if (next < 0) {
            st = sp_set_error(SP_ERR_NUMERIC, "sampling: non-finite logits for generated token "
                              "%d", i);
            break;
        }
        ctx[have] = out[i] = next;
    }
    for (int k = 0; in && k < nin; k++) free(in[k]);
    free(in);
    free(ctx);
    return st;
}
