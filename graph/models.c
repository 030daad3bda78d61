/* Model builders: GPT-2-style decoder and MLP over the graph API (include/starpipe/models.h). */
#include "starpipe/models.h"
#include "starpipe/stages.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define SP_LLAMA_MAX_HEAD 1024 /* sp_rope's largest head */

/* Checks a cut of n layers into S stages: `given` (S counts) or, when NULL, an even split.
 * A stage may be empty only where it still holds other work: the first when
 * first_may_be_empty (the GPT's embedding), the last (the head). */
static sp_status check_split(const char *who, int n, int S, const int *given,
                             int first_may_be_empty)
{
    if (!given)
        return S > n ? sp_set_error(SP_ERR_ARG, "%s: %d stages need at least %d layers for an "
                                    "even split (have %d), or a cut of layers per stage in "
                                    "which only %s may be empty", who, S, S, n,
                                    first_may_be_empty ? "the first and the last stage"
                                                       : "the last stage") : SP_OK;
    long long sum = 0;
    for (int s = 0; s < S; s++) {
        int may_be_empty = (s == 0 && first_may_be_empty) || (s == S - 1 && S > 1);
        if (given[s] < 0 || (given[s] == 0 && !may_be_empty))
            return sp_set_error(SP_ERR_ARG, "%s: stage %d of %d would have %d layers (only %s "
                                "may be empty)", who, s, S, given[s],
                                first_may_be_empty ? "the first and the last stage"
                                                   : "the last stage");
        sum += given[s];
    }
    if (sum != n)
        return sp_set_error(SP_ERR_ARG, "%s: the stages' layer counts add up to %lld, not the "
                            "model's %d layers", who, sum, n);
    return SP_OK;
}

/* The stage of layer l of n under a checked cut. */
static int layer_stage(int l, int n, int S, const int *given)
{
    if (!given) return (int)((long long)l * S / n);
    int s = 0;
    for (int end = given[0]; l >= end; end += given[++s]) {}
    return s;
}

/* Ends stages until x is in stage `to` (several when stages in between are empty). */
static sp_tensor yield_to(sp_graph *g, sp_tensor x, int *cur, int to)
{
    for (; *cur < to; ++*cur) x = sp_pipeline_yield(g, x);
    return x;
}

static sp_tensor param(sp_graph *g, const char *fmt, int l, int ndim, int64_t d0, int64_t d1,
                       sp_init init, float std)
{
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    int64_t shape[2] = { d0, d1 };
    return sp_param(g, name, ndim, shape, init, std);
}

/* A parameter split over the tensor group: a matrix (d0, d1) when d1 > 0, else a vector
 * (d0), along dimension dim (sp_param_split). */
static sp_tensor split(sp_graph *g, const char *fmt, int l, int64_t d0, int64_t d1, int dim,
                       sp_init init, float std)
{
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    int64_t shape[2] = { d0, d1 };
    return sp_param_split(g, name, d1 > 0 ? 2 : 1, shape, dim, init, std);
}

/* p with its rows from `valid` on marked as padding (a failure propagates as the graph's
 * error: the tensor id of the failure is passed on). */
static sp_tensor pad_rows(sp_graph *g, sp_tensor p, int64_t valid)
{
    if (p < 0 || valid >= sp_param_full_shape(g, p)[0]) return p;
    return sp_param_pad_rows(g, p, valid) == SP_OK ? p : -1;
}

/* The same, split along dimension dim of a view of the shape (sp_param_split_view). */
static sp_tensor split_view(sp_graph *g, const char *fmt, int l, int ndim, const int64_t *shape,
                            int vndim, const int64_t *view, int dim, sp_init init, float std)
{
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    return sp_param_split_view(g, name, ndim, shape, vndim, view, dim, init, std);
}

/* The loss, and the logits named "logits" for whoever samples or inspects them; a graph
 * whose logits are this rank's slice of the vocabulary (T > 1) names them "logits.slice",
 * so that nothing takes them for the whole rows. */
static sp_graph *finish(sp_graph *g, sp_tensor logits, const char *name, sp_tensor loss,
                        sp_status *status)
{
    sp_status st = sp_graph_set_loss(g, loss);
    if (st == SP_OK) st = sp_graph_name(g, logits, name);
    if (status) *status = st;
    if (st != SP_OK) {
        sp_graph_free(g);
        return NULL;
    }
    return g;
}

/* The graph of a model whose configuration checks gave st: NULL with *status set when
 * they failed, when out of memory, or when its tensor group (T, 0 meaning 1, and this
 * graph's rank in it) is out of range; else an empty graph of that group. */
static sp_graph *new_model(const char *who, sp_status st, int T, int rank, sp_status *status)
{
    sp_graph *g = st ? NULL : sp_graph_create();
    if (!st && !g) st = sp_set_error(SP_ERR_NOMEM, "%s: out of memory", who);
    if (!st && sp_graph_set_tensor(g, T ? T : 1, rank) != SP_OK)
        st = sp_set_error(SP_ERR_ARG, "%s: tensor rank %d of a tensor parallelism of %d (1 to "
                          "%d ranks, 0 meaning 1)", who, rank, T, SP_MAX_TENSOR);
    if (!st) return g;
    sp_graph_free(g);
    if (status) *status = st;
    return NULL;
}

/* A model is built as one rank of its tensor group (Megatron's layout): a column-parallel
 * linear layer is sp_tp_copy, then the product with its weight split by columns and the
 * bias split alike; a row-parallel one the product with its weight split by rows, then
 * sp_tp_sum, then its whole bias, added once after the sum. At T = 1 the splits are plain
 * parameters and both operators add no node: the graph is the one of a model without
 * tensor parallelism, node for node. Parameters are created in the order the builders
 * always had (the order of slabs and of the gradient norm's sum). */
sp_graph *sp_model_gpt(const sp_gpt_config *c, sp_status *status)
{
    sp_status st = SP_OK;
    const int T = c && c->tensor > 0 ? c->tensor : 1;
    if (!c || c->vocab < 2 || c->context < 1 || c->layers < 1 || c->heads < 1 ||
        c->channels < 1 || c->batch < 1 || c->stages < 1)
        st = sp_set_error(SP_ERR_ARG, "sp_model_gpt: every size must be >= 1 (vocab >= 2)");
    else if (c->channels % c->heads)
        st = sp_set_error(SP_ERR_ARG, "sp_model_gpt: %d heads do not divide %d channels",
                          c->heads, c->channels);
    else if (c->heads % T) /* then T divides C = heads x head_size and 4C too */
        st = sp_set_error(SP_ERR_ARG, "sp_model_gpt: tensor parallelism of %d does not divide "
                          "the %d heads", T, c->heads);
    else if (c->vocab_pad < 0 || (!c->vocab_pad && c->vocab % T)) /* wte split by rows */
        st = sp_set_error(SP_ERR_ARG, "sp_model_gpt: tensor parallelism of %d does not divide "
                          "the vocabulary of %d (vocab_pad pads it: 128, Megatron's)", T,
                          c->vocab);
    else
        st = check_split("sp_model_gpt", c->layers, c->stages, c->stage_layers, 1);
    sp_graph *g = new_model("sp_model_gpt", st, c ? c->tensor : 0, c ? c->tensor_rank : 0, status);
    if (!g) return NULL;
    const int64_t B = c->batch, Tc = c->context, C = c->channels, V = c->vocab;
    const int64_t Vp = sp_padded_vocab(c->vocab, c->vocab_pad, T);
    const int64_t H = c->heads, hs = C / H;
    const float std = 0.02f, std_res = 0.02f / sqrtf(2.0f * c->layers);
    sp_tensor tokens = sp_input_i32(g, "tokens", 2, (int64_t[]){ B, Tc });
    sp_tensor targets = sp_input_i32(g, "targets", 2, (int64_t[]){ B, Tc });
    /* wte split by rows, the vocabulary (at T = 1 a plain parameter): the vocab-parallel
     * embedding, summed over the group, then the positions added once by every rank */
    sp_tensor wte = pad_rows(g, split(g, "wte", 0, Vp, C, 0, SP_INIT_NORMAL, std), V);
    sp_tensor wpe = param(g, "wpe", 0, 2, Tc, C, SP_INIT_NORMAL, std);
    sp_tensor x = T == 1 ? sp_embed(g, tokens, wte, wpe)
                         : sp_add_positions(g, sp_tp_sum(g, sp_embed_vocab(g, tokens, wte)), wpe);
    int cur = 0;
    for (int l = 0; l < c->layers; l++) {
        x = yield_to(g, x, &cur, layer_stage(l, c->layers, c->stages, c->stage_layers));
        /* attention: heads split over the group; qkv's columns [q | k | v] by heads. The
         * LayerNorms' b before g: the order their nested creation always gave them */
        sp_tensor b = param(g, "h%d.ln1.b", l, 1, C, 0, SP_INIT_ZEROS, 0);
        sp_tensor h = sp_layernorm(g, x, param(g, "h%d.ln1.g", l, 1, C, 0, SP_INIT_ONES, 0), b);
        h = sp_tp_copy(g, h);
        h = sp_matmul(g, h, split_view(g, "h%d.attn.w", l, 2, (int64_t[]){ C, 3 * C }, 4,
                                       (int64_t[]){ C, 3, H, hs }, 2, SP_INIT_NORMAL, std), 0, 0);
        h = sp_bias_add(g, h, split_view(g, "h%d.attn.b", l, 1, (int64_t[]){ 3 * C }, 3,
                                         (int64_t[]){ 3, H, hs }, 1, SP_INIT_ZEROS, 0));
        h = sp_attention(g, h, c->heads / T);
        h = sp_matmul(g, h, split(g, "h%d.proj.w", l, C, C, 0, SP_INIT_NORMAL, std_res), 0, 0);
        h = sp_tp_sum(g, h);
        h = sp_bias_add(g, h, param(g, "h%d.proj.b", l, 1, C, 0, SP_INIT_ZEROS, 0));
        x = sp_add(g, x, h);
        /* MLP: fc split by columns, fcproj by rows */
        b = param(g, "h%d.ln2.b", l, 1, C, 0, SP_INIT_ZEROS, 0);
        h = sp_layernorm(g, x, param(g, "h%d.ln2.g", l, 1, C, 0, SP_INIT_ONES, 0), b);
        h = sp_tp_copy(g, h);
        h = sp_matmul(g, h, split(g, "h%d.fc.w", l, C, 4 * C, 1, SP_INIT_NORMAL, std), 0, 0);
        h = sp_bias_add(g, h, split(g, "h%d.fc.b", l, 4 * C, 0, 0, SP_INIT_ZEROS, 0));
        h = sp_gelu(g, h);
        h = sp_matmul(g, h, split(g, "h%d.fcproj.w", l, 4 * C, C, 0, SP_INIT_NORMAL, std_res),
                      0, 0);
        h = sp_tp_sum(g, h);
        h = sp_bias_add(g, h, param(g, "h%d.fcproj.b", l, 1, C, 0, SP_INIT_ZEROS, 0));
        x = sp_add(g, x, h);
    }
    x = yield_to(g, x, &cur, c->stages - 1);
    sp_tensor lnf_b = param(g, "lnf.b", 0, 1, C, 0, SP_INIT_ZEROS, 0);
    x = sp_layernorm(g, x, param(g, "lnf.g", 0, 1, C, 0, SP_INIT_ONES, 0), lnf_b);
    /* tied: (B,T,C) x (V,C)^T, column-parallel by the vocabulary: this rank's slice of the
     * logits (B,T,V/T), then the vocab-parallel cross-entropy (at T = 1 the plain one) */
    sp_tensor logits = sp_matmul(g, sp_tp_copy(g, x), wte, 0, 1);
    return finish(g, logits, T == 1 ? "logits" : "logits.slice",
                  sp_cross_entropy_padded(g, logits, targets, V), status);
}

/* The Llama block of models.h; the same stage cut and tensor-parallel operators as the
 * GPT's. Weights (out, in), so a product is x W^T. */
sp_graph *sp_model_llama(const sp_llama_config *c, sp_status *status)
{
    sp_status st = SP_OK;
    const int T = c && c->tensor > 0 ? c->tensor : 1;
    if (!c || c->vocab < 2 || c->context < 1 || c->layers < 1 || c->heads < 1 ||
        c->kv_heads < 1 || c->channels < 1 || c->hidden < 1 || c->batch < 1 || c->stages < 1)
        st = sp_set_error(SP_ERR_ARG, "sp_model_llama: every size must be >= 1 (vocab >= 2)");
    else if (c->heads % c->kv_heads)
        st = sp_set_error(SP_ERR_ARG, "sp_model_llama: %d KV heads do not divide %d heads",
                          c->kv_heads, c->heads);
    else if (c->channels % c->heads)
        st = sp_set_error(SP_ERR_ARG, "sp_model_llama: %d heads do not divide %d channels",
                          c->heads, c->channels);
    else if ((c->channels / c->heads) % 2 || c->channels / c->heads > SP_LLAMA_MAX_HEAD)
        st = sp_set_error(SP_ERR_ARG, "sp_model_llama: the head size %d (%d channels / %d "
                          "heads) must be even and at most %d: rotary embeddings turn pairs of "
                          "its halves", c->channels / c->heads, c->channels, c->heads,
                          SP_LLAMA_MAX_HEAD);
    else if (c->rope_theta != 0 && !(c->rope_theta > 1.0f && c->rope_theta < 1e30f))
        st = sp_set_error(SP_ERR_ARG, "sp_model_llama: rope theta %g must be above 1",
                          c->rope_theta);
    else if (c->kv_heads % T)
        st = sp_set_error(SP_ERR_ARG, "sp_model_llama: tensor parallelism of %d does not "
                          "divide the %d KV heads", T, c->kv_heads);
    else if (c->hidden % T)
        st = sp_set_error(SP_ERR_ARG, "sp_model_llama: tensor parallelism of %d does not "
                          "divide the hidden size %d", T, c->hidden);
    else if (c->vocab_pad < 0 || (!c->vocab_pad && c->vocab % T))
        st = sp_set_error(SP_ERR_ARG, "sp_model_llama: tensor parallelism of %d does not "
                          "divide the vocabulary of %d (vocab_pad pads it: 128, Megatron's)",
                          T, c->vocab);
    else
        st = check_split("sp_model_llama", c->layers, c->stages, c->stage_layers, 1);
    sp_graph *g = new_model("sp_model_llama", st, c ? c->tensor : 0, c ? c->tensor_rank : 0, status);
    if (!g) return NULL;
    const int64_t B = c->batch, Tc = c->context, C = c->channels, V = c->vocab;
    const int64_t Vp = sp_padded_vocab(c->vocab, c->vocab_pad, T);
    const int64_t H = c->heads, KV = c->kv_heads, G = H / KV, hs = C / H, I = c->hidden;
    const float theta = c->rope_theta != 0 ? c->rope_theta : 10000.0f;
    const float std = 0.02f, std_res = 0.02f / sqrtf(2.0f * c->layers);
    sp_tensor tokens = sp_input_i32(g, "tokens", 2, (int64_t[]){ B, Tc });
    sp_tensor targets = sp_input_i32(g, "targets", 2, (int64_t[]){ B, Tc });
    sp_tensor emb = pad_rows(g, split(g, "model.embed_tokens.weight", 0, Vp, C, 0,
                                      SP_INIT_NORMAL, std), V);
    sp_tensor x = sp_tp_sum(g, sp_embed_vocab(g, tokens, emb));
    int cur = 0;
    for (int l = 0; l < c->layers; l++) {
        x = yield_to(g, x, &cur, layer_stage(l, c->layers, c->stages, c->stage_layers));
        sp_tensor h = sp_rmsnorm(g, x, param(g, "model.layers.%d.input_layernorm.weight", l, 1,
                                             C, 0, SP_INIT_ONES, 0));
        h = sp_tp_copy(g, h);
        h = sp_matmul(g, h, split_view(g, "model.layers.%d.self_attn.qkv_proj.weight", l, 2,
                                       (int64_t[]){ KV * (G + 2) * hs, C }, 4,
                                       (int64_t[]){ KV, G + 2, hs, C }, 0, SP_INIT_NORMAL, std),
                      0, 1);
        h = sp_rope(g, h, (int)hs, (int)G + 2, (int)G + 1, theta);
        h = sp_attention_gqa(g, h, (int)(H / T), (int)(KV / T));
        h = sp_matmul(g, h, split(g, "model.layers.%d.self_attn.o_proj.weight", l, C, C, 1,
                                  SP_INIT_NORMAL, std_res), 0, 1);
        x = sp_add(g, x, sp_tp_sum(g, h));
        h = sp_rmsnorm(g, x, param(g, "model.layers.%d.post_attention_layernorm.weight", l, 1,
                                   C, 0, SP_INIT_ONES, 0));
        h = sp_tp_copy(g, h);
        h = sp_matmul(g, h, split_view(g, "model.layers.%d.mlp.gate_up_proj.weight", l, 2,
                                       (int64_t[]){ 2 * I, C }, 3, (int64_t[]){ 2, I, C }, 1,
                                       SP_INIT_NORMAL, std), 0, 1);
        h = sp_swiglu(g, h);
        h = sp_matmul(g, h, split(g, "model.layers.%d.mlp.down_proj.weight", l, C, I, 1,
                                  SP_INIT_NORMAL, std_res), 0, 1);
        x = sp_add(g, x, sp_tp_sum(g, h));
    }
    x = yield_to(g, x, &cur, c->stages - 1);
    x = sp_rmsnorm(g, x, param(g, "model.norm.weight", 0, 1, C, 0, SP_INIT_ONES, 0));
    sp_tensor logits = sp_matmul(g, sp_tp_copy(g, x),
                                 pad_rows(g, split(g, "lm_head.weight", 0, Vp, C, 0,
                                                   SP_INIT_NORMAL, std), V),
                                 0, 1);
    return finish(g, logits, T == 1 ? "logits" : "logits.slice",
                  sp_cross_entropy_padded(g, logits, targets, V), status);
}

/* The MLP's hidden layers pair up, (0, 1), (2, 3), ...: the first of a pair is
 * column-parallel, the second row-parallel (its ReLU after the sum and its whole bias);
 * with an odd depth the last hidden layer is whole, as is the head. A pair may straddle
 * a stage boundary: the activation handed over is then each rank's part. */
sp_graph *sp_model_mlp(const sp_mlp_config *c, sp_status *status)
{
    sp_status st = SP_OK;
    const int T = c && c->tensor > 0 ? c->tensor : 1;
    if (!c || c->in_dim < 1 || c->width < 1 || c->depth < 1 || c->classes < 2 || c->batch < 1 ||
        c->stages < 1)
        st = sp_set_error(SP_ERR_ARG, "sp_model_mlp: every size must be >= 1 (classes >= 2)");
    else if (c->depth >= 2 && c->width % T)
        st = sp_set_error(SP_ERR_ARG, "sp_model_mlp: tensor parallelism of %d does not divide "
                          "the width %d", T, c->width);
    else
        st = check_split("sp_model_mlp", c->depth, c->stages, c->stage_layers, 0);
    sp_graph *g = new_model("sp_model_mlp", st, c ? c->tensor : 0, c ? c->tensor_rank : 0, status);
    if (!g) return NULL;
    sp_tensor h = sp_input_f32(g, "x", 2, (int64_t[]){ c->batch, c->in_dim });
    sp_tensor y = sp_input_i32(g, "y", 1, (int64_t[]){ c->batch });
    int64_t fan_in = c->in_dim;
    int cur = 0;
    for (int l = 0; l < c->depth; l++) {
        h = yield_to(g, h, &cur, layer_stage(l, c->depth, c->stages, c->stage_layers));
        float std = sqrtf(2.0f / (float)fan_in);
        if (l % 2 == 0 && l + 1 < c->depth) { /* column-parallel */
            if (l > 0) /* x, the input, has no gradient for tp_copy to sum: no copy of it */
                h = sp_tp_copy(g, h);
            h = sp_matmul(g, h, split(g, "l%d.w", l, fan_in, c->width, 1, SP_INIT_NORMAL, std),
                          0, 0);
            h = sp_bias_add(g, h, split(g, "l%d.b", l, c->width, 0, 0, SP_INIT_ZEROS, 0));
        } else if (l % 2) { /* row-parallel */
            h = sp_matmul(g, h, split(g, "l%d.w", l, fan_in, c->width, 0, SP_INIT_NORMAL, std),
                          0, 0);
            h = sp_tp_sum(g, h);
            h = sp_bias_add(g, h, param(g, "l%d.b", l, 1, c->width, 0, SP_INIT_ZEROS, 0));
        } else { /* the last of an odd depth: whole */
            h = sp_matmul(g, h, param(g, "l%d.w", l, 2, fan_in, c->width, SP_INIT_NORMAL, std),
                          0, 0);
            h = sp_bias_add(g, h, param(g, "l%d.b", l, 1, c->width, 0, SP_INIT_ZEROS, 0));
        }
        h = sp_relu(g, h);
        fan_in = c->width;
    }
    h = yield_to(g, h, &cur, c->stages - 1);
    sp_tensor w = param(g, "head.w", 0, 2, fan_in, c->classes, SP_INIT_NORMAL,
                        sqrtf(1.0f / (float)fan_in));
    sp_tensor head_b = param(g, "head.b", 0, 1, c->classes, 0, SP_INIT_ZEROS, 0);
    h = sp_bias_add(g, sp_matmul(g, h, w, 0, 0), head_b);
    return finish(g, h, "logits", sp_cross_entropy(g, h, y), status);
}

static const sp_model_preset presets[] = {
    { "gpt-small", 0, 4, 4, 4, 64, 0, 64, 256, 0 },
    { "gpt2", 0, 12, 12, 12, 768, 0, 1024, 50257, 0 },
    { "gpt2-medium", 0, 24, 16, 16, 1024, 0, 1024, 50257, 0 },
    { "gpt2-large", 0, 36, 20, 20, 1280, 0, 1024, 50257, 0 },
    { "gpt2-xl", 0, 48, 25, 25, 1600, 0, 1024, 50257, 0 },
    { "gpt3-175b", 0, 96, 96, 96, 12288, 0, 2048, 50257, 0 },
    { "llama-small", 1, 4, 4, 4, 64, 0, 64, 256, 10000 },
    { "llama2-7b", 1, 32, 32, 32, 4096, 11008, 4096, 32000, 10000 },
    { "llama2-13b", 1, 40, 40, 40, 5120, 13824, 4096, 32000, 10000 },
    { "llama2-70b", 1, 80, 64, 8, 8192, 28672, 4096, 32000, 10000 },
};

const sp_model_preset *sp_model_preset_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name)) return &presets[i];
    return NULL;
}

const char *sp_model_preset_names(char *buf, size_t len)
{
    size_t k = 0;
    if (len) buf[0] = 0;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0] && k < len; i++) {
        int n = snprintf(buf + k, len - k, "%s%s", i ? ", " : "", presets[i].name);
        if (n < 0) break;
        k += (size_t)n;
    }
    return buf;
}
