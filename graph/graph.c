/* The graph builder: ops, shape checks at creation, sp_pipeline_yield, param init.
 * Every op checks its inputs and returns a negative id with a message naming the op and
 * the shapes involved; a negative input id is passed through unchanged. */
#define _GNU_SOURCE /* sincos */
#include "graph/graph_impl.h"

#include "codelets/cpu/kernels.h" /* SP_ROPE_MAX_HEAD */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const op_names[SP_OP_COUNT] = {
    "input", "param", "matmul", "bias_add", "add", "scale", "gelu", "relu", "layernorm",
    "embed", "attention", "cross_entropy", "sum", "mean", "reshape", "pipeline_yield",
    "tp_copy", "tp_sum", "embed_vocab", "add_positions", "cross_entropy_vocab", "rmsnorm",
    "rope", "swiglu",
};

const char *sp_opcode_name(sp_opcode op)
{
    return (op >= 0 && op < SP_OP_COUNT) ? op_names[op] : "?";
}

sp_graph *sp_graph_create(void)
{
    sp_graph *g = calloc(1, sizeof *g);
    if (g) g->loss = -1, g->tp_size = 1;
    return g;
}

void sp_graph_free(sp_graph *g)
{
    if (!g) return;
    free(g->node);
    free(g);
}

/* "(7,13)" */
static const char *shape_str(const sp_node *n, char *buf, size_t len)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, len - k, "(");
    for (int d = 0; d < n->ndim && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, d ? ",%lld" : "%lld", (long long)n->shape[d]);
    if (k < len) snprintf(buf + k, len - k, ")");
    return buf;
}

static int valid_id(const sp_graph *g, sp_tensor t) { return g && t >= 0 && t < g->n; }

static const sp_node *N(const sp_graph *g, sp_tensor t) { return &g->node[t]; }

/* Follows pipeline_yield aliases to the tensor that holds the data. */
static sp_tensor resolve(const sp_graph *g, sp_tensor t)
{
    while (g->node[t].op == SP_OP_YIELD) t = g->node[t].in[0];
    return t;
}

static sp_tensor fail(sp_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int need_f32(const sp_graph *g, const char *op, sp_tensor t, const char *what);

static sp_tensor fail(sp_status code, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sp_set_error(code, "%s", msg);
    return -(int)code;
}

/* Appends a node. The shape is copied first: it often points into another node, which
 * the realloc below may move. Pointers to nodes taken before a push are stale after it. */
static sp_node *push(sp_graph *g, sp_opcode op, sp_dtype dt, int ndim, const int64_t *shape_in)
{
    int64_t shape[SP_MAX_DIMS];
    for (int d = 0; d < ndim; d++) shape[d] = shape_in[d];
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        sp_node *nn = realloc(g->node, (size_t)cap * sizeof *nn);
        if (!nn) return NULL;
        g->node = nn;
        g->cap = cap;
    }
    sp_node *n = &g->node[g->n++];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->dtype = dt;
    n->ndim = ndim;
    n->numel = 1;
    for (int d = 0; d < ndim; d++) {
        n->shape[d] = shape[d];
        n->numel *= shape[d];
    }
    n->stage = (op == SP_OP_INPUT || op == SP_OP_PARAM) ? -1 : g->cur_stage;
    n->in[0] = n->in[1] = n->in[2] = -1;
    n->split = -1;
    return n;
}

static int check_shape_arg(int ndim, const int64_t *shape)
{
    if (ndim < 1 || ndim > SP_MAX_DIMS || !shape) return 0;
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 1) return 0;
    return 1;
}

/* Checks ids and dtype of an op's inputs; resolves yields. Returns 0 or a negative id. */
static int take_inputs(sp_graph *g, const char *op, int nin, sp_tensor *in)
{
    if (!g) return fail(SP_ERR_ARG, "%s: graph is NULL", op);
    for (int k = 0; k < nin; k++) {
        if (in[k] < 0) return in[k];
        if (!valid_id(g, in[k]))
            return fail(SP_ERR_ARG, "%s: input %d is not a tensor of this graph (id %d)", op, k,
                        in[k]);
        in[k] = resolve(g, in[k]);
    }
    return 0;
}

static sp_tensor add_leaf(sp_graph *g, sp_opcode op, sp_dtype dt, const char *name, int ndim,
                          const int64_t *shape)
{
    const char *what = op == SP_OP_PARAM ? "sp_param" : "sp_input";
    if (!g) return fail(SP_ERR_ARG, "%s: graph is NULL", what);
    if (!name || !name[0] || strlen(name) >= sizeof g->node[0].name)
        return fail(SP_ERR_ARG, "%s: a name of 1 to 63 characters is needed", what);
    if (!check_shape_arg(ndim, shape))
        return fail(SP_ERR_SHAPE, "%s '%s': shape must have 1..%d dims, each >= 1", what, name,
                    SP_MAX_DIMS);
    if (sp_graph_find(g, name) >= 0)
        return fail(SP_ERR_ARG, "%s: the name '%s' is already used", what, name);
    sp_node *n = push(g, op, dt, ndim, shape);
    if (!n) return fail(SP_ERR_NOMEM, "%s: out of memory", what);
    snprintf(n->name, sizeof n->name, "%s", name);
    return g->n - 1;
}

sp_tensor sp_input_f32(sp_graph *g, const char *name, int ndim, const int64_t *shape)
{
    return add_leaf(g, SP_OP_INPUT, SP_F32, name, ndim, shape);
}

sp_tensor sp_input_i32(sp_graph *g, const char *name, int ndim, const int64_t *shape)
{
    return add_leaf(g, SP_OP_INPUT, SP_I32, name, ndim, shape);
}

sp_tensor sp_param(sp_graph *g, const char *name, int ndim, const int64_t *shape, sp_init init,
                   float std)
{
    if (init != SP_INIT_NORMAL && init != SP_INIT_ZEROS && init != SP_INIT_ONES)
        return fail(SP_ERR_ARG, "sp_param '%s': unknown initializer %d", name ? name : "", init);
    if (init == SP_INIT_NORMAL && !(std >= 0.0f && std < 1e6f))
        return fail(SP_ERR_ARG, "sp_param '%s': std must be finite and >= 0", name ? name : "");
    sp_tensor t = add_leaf(g, SP_OP_PARAM, SP_F32, name, ndim, shape);
    if (t >= 0) {
        g->node[t].init = init;
        g->node[t].init_std = std;
    }
    return t;
}

/* ---- tensor parallelism ---- */

sp_status sp_graph_set_tensor(sp_graph *g, int size, int rank)
{
    if (!g) return sp_set_error(SP_ERR_ARG, "sp_graph_set_tensor: graph is NULL");
    if (g->n)
        return sp_set_error(SP_ERR_ARG, "sp_graph_set_tensor: set the tensor group before the "
                            "first tensor");
    if (size < 1 || size > SP_MAX_TENSOR || rank < 0 || rank >= size)
        return sp_set_error(SP_ERR_ARG, "sp_graph_set_tensor: rank %d of a group of %d (1 to "
                            "%d ranks)", rank, size, SP_MAX_TENSOR);
    g->tp_size = size;
    g->tp_rank = rank;
    return SP_OK;
}

int sp_param_split_dim(const sp_graph *g, sp_tensor p)
{
    return sp_tensor_is_param(g, p) ? g->node[p].split : -1;
}
const int64_t *sp_param_full_shape(const sp_graph *g, sp_tensor p)
{
    if (!sp_tensor_is_param(g, p)) return NULL;
    return g->node[p].split >= 0 ? g->node[p].full : g->node[p].shape;
}
const int64_t *sp_param_view(const sp_graph *g, sp_tensor p, int *ndim)
{
    int split = sp_tensor_is_param(g, p) && g->node[p].split >= 0;
    if (ndim) *ndim = split ? g->node[p].vndim : 0;
    return split ? g->node[p].view : NULL;
}
int64_t sp_param_whole_numel(const sp_graph *g, sp_tensor p)
{
    const int64_t *full = sp_param_full_shape(g, p);
    int64_t n = full ? 1 : 0;
    for (int d = 0; full && d < g->node[p].ndim; d++) n *= full[d];
    return n;
}

sp_status sp_param_pad_rows(sp_graph *g, sp_tensor p, int64_t valid)
{
    const int64_t *full = sp_param_full_shape(g, p);
    if (!full || g->node[p].ndim < 1 || valid < 1 || valid > full[0])
        return sp_set_error(SP_ERR_ARG, "sp_param_pad_rows: %lld valid rows of a parameter "
                            "of %lld", (long long)valid, (long long)(full ? full[0] : 0));
    g->node[p].valid_rows = valid < full[0] ? valid : 0;
    return SP_OK;
}

int64_t sp_param_valid_rows(const sp_graph *g, sp_tensor p)
{
    const int64_t *full = sp_param_full_shape(g, p);
    if (!full) return 0;
    if (g->node[p].ndim < 1) return 1;
    return g->node[p].valid_rows ? g->node[p].valid_rows : full[0];
}

int sp_graph_tensor_size(const sp_graph *g) { return g ? g->tp_size : 1; }
int sp_graph_tensor_rank(const sp_graph *g) { return g ? g->tp_rank : 0; }

/* sp_param_split and sp_param_split_view: checks that the view refines the whole shape
 * (each whole dimension the product of consecutive view dimensions) and that T divides
 * the view's dimension `dim`, then adds this rank's part. The part's shape is the whole
 * one with the whole dimension holding `dim` divided by T. At T = 1 it is sp_param. */
static sp_tensor add_split(sp_graph *g, const char *who, const char *name, int ndim,
                           const int64_t *shape, int vndim, const int64_t *view, int dim,
                           sp_init init, float std)
{
    const char *nm = name ? name : "";
    if (!g) return fail(SP_ERR_ARG, "%s: graph is NULL", who);
    if (!check_shape_arg(ndim, shape) || !check_shape_arg(vndim, view) || dim < 0 ||
        dim >= vndim)
        return fail(SP_ERR_SHAPE, "%s '%s': a shape of 1..%d dims and a dimension of it to "
                    "split (got %d)", who, nm, SP_MAX_DIMS, dim);
    int owner = -1, v = 0, refines = 1;
    for (int e = 0; e < ndim; e++) {
        int64_t prod = 1;
        while (v < vndim && (prod < shape[e] || e == ndim - 1)) {
            if (v == dim) owner = e;
            prod *= view[v++];
        }
        refines &= prod == shape[e];
    }
    if (!refines || owner < 0 || v != vndim)
        return fail(SP_ERR_SHAPE, "%s '%s': the view does not refine the parameter's shape "
                    "(each dimension of the shape must be the product of consecutive "
                    "dimensions of the view)", who, nm);
    if (view[dim] % g->tp_size)
        return fail(SP_ERR_SHAPE, "%s '%s': tensor parallelism of %d does not divide "
                    "dimension %d (%lld) of the parameter%s", who, nm, g->tp_size, dim,
                    (long long)view[dim], view == shape ? "" : "'s view");
    int64_t part[SP_MAX_DIMS];
    for (int d = 0; d < ndim; d++) part[d] = shape[d];
    part[owner] /= g->tp_size;
    sp_tensor t = sp_param(g, name, ndim, part, init, std);
    if (t >= 0 && g->tp_size > 1) {
        sp_node *n = &g->node[t];
        n->split = dim;
        for (int d = 0; d < ndim; d++) n->full[d] = shape[d];
        n->vndim = vndim;
        for (int d = 0; d < vndim; d++) n->view[d] = view[d];
    }
    return t;
}

sp_tensor sp_param_split(sp_graph *g, const char *name, int ndim, const int64_t *shape, int dim,
                         sp_init init, float std)
{
    return add_split(g, "sp_param_split", name, ndim, shape, ndim, shape, dim, init, std);
}

sp_tensor sp_param_split_view(sp_graph *g, const char *name, int ndim, const int64_t *shape,
                              int vndim, const int64_t *view, int dim, sp_init init, float std)
{
    return add_split(g, "sp_param_split_view", name, ndim, shape, vndim, view, dim, init, std);
}

/* Part `rank` of parameter n, in its order, is `outer` runs of `run` contiguous elements of
 * the whole tensor, run o starting at element o * stride + offset: the view's dimensions
 * before the split one make the runs, its share of the split one and those after it a
 * run. A whole parameter is one run, the same for every rank. */
static void part_runs(const sp_graph *g, const sp_node *n, int rank, int64_t *outer,
                      int64_t *run, int64_t *stride, int64_t *offset)
{
    if (n->split < 0) {
        *outer = 1, *run = *stride = n->numel, *offset = 0;
        return;
    }
    int64_t o = 1, inner = 1;
    for (int d = 0; d < n->split; d++) o *= n->view[d];
    for (int d = n->split + 1; d < n->vndim; d++) inner *= n->view[d];
    *outer = o;
    *run = n->view[n->split] / g->tp_size * inner;
    *stride = n->view[n->split] * inner;
    *offset = (int64_t)rank * *run;
}

/* Copies between part `rank` and the whole tensor: to_whole 1 scatters the part (src)
 * into the whole tensor (dst), 0 gathers it from the whole (src) into the part (dst). */
static sp_status part_copy(const sp_graph *g, sp_tensor p, int rank, const float *src,
                           float *dst, int to_whole, const char *who)
{
    if (!sp_tensor_is_param(g, p))
        return sp_set_error(SP_ERR_ARG, "%s: tensor %d is not a parameter", who, p);
    if (!src || !dst) return sp_set_error(SP_ERR_ARG, "%s: a buffer is NULL", who);
    if (rank < 0 || rank >= g->tp_size)
        return sp_set_error(SP_ERR_ARG, "%s '%s': rank %d is not in the group of %d", who,
                            N(g, p)->name, rank, g->tp_size);
    int64_t outer, run, stride, offset;
    part_runs(g, N(g, p), rank, &outer, &run, &stride, &offset);
    for (int64_t o = 0; o < outer; o++) {
        int64_t w = o * stride + offset, q = o * run;
        memcpy(dst + (to_whole ? w : q), src + (to_whole ? q : w), sizeof(float) * (size_t)run);
    }
    return SP_OK;
}

sp_status sp_param_part_to_whole(const sp_graph *g, sp_tensor p, int rank, const float *part,
                                 float *whole)
{
    return part_copy(g, p, rank, part, whole, 1, "sp_param_part_to_whole");
}

sp_status sp_param_whole_to_part(const sp_graph *g, sp_tensor p, int rank, const float *whole,
                                 float *part)
{
    return part_copy(g, p, rank, whole, part, 0, "sp_param_whole_to_part");
}

/* The two conjugate operators of Megatron's tensor parallelism (f and g): T = 1 makes
 * both the identity itself, with no node, so a model written for T builds at T = 1
 * exactly the graph it always had. */
static sp_tensor tp_op(sp_graph *g, sp_opcode op, const char *what, sp_tensor x)
{
    sp_tensor in[1] = { x };
    int r = take_inputs(g, what, 1, in);
    if (r) return r;
    if (need_f32(g, what, in[0], "x")) return -(int)SP_ERR_SHAPE;
    if (g->tp_size == 1) return in[0];
    const sp_node *X = N(g, in[0]);
    sp_node *n = push(g, op, SP_F32, X->ndim, X->shape);
    if (!n) return fail(SP_ERR_NOMEM, "%s: out of memory", what);
    n->nin = 1;
    n->in[0] = in[0];
    return g->n - 1;
}

sp_tensor sp_tp_copy(sp_graph *g, sp_tensor x) { return tp_op(g, SP_OP_TP_COPY, "sp_tp_copy", x); }
sp_tensor sp_tp_sum(sp_graph *g, sp_tensor x) { return tp_op(g, SP_OP_TP_SUM, "sp_tp_sum", x); }

/* Forward: a value is whole and alike on every member unless it depends on a split
 * parameter (or the vocab-parallel embedding's zeros) with no sp_tp_sum in between.
 * Backward, in reverse (a consumer comes after what it reads): an input's gradient is
 * alike when each consumer's contribution is: sp_tp_copy's is summed over the group,
 * sp_tp_sum's is its output's gradient, the vocab-parallel cross-entropy's is the
 * member's slice, and any other op's is alike when its output gradient and every input
 * are (a product with a split parameter and no sp_tp_copy before it is not). */
sp_status sp_graph_replicated(const sp_graph *g, uint8_t *value, uint8_t *grad)
{
    if (!g || !value || !grad) return sp_set_error(SP_ERR_ARG, "sp_graph_replicated: NULL");
    for (int i = 0; i < g->n; i++) {
        const sp_node *n = &g->node[i];
        uint8_t v = 1;
        switch (n->op) {
        case SP_OP_INPUT: v = 1; break;
        case SP_OP_PARAM: v = n->split < 0; break;
        case SP_OP_TP_SUM:
        case SP_OP_CE_VOCAB: v = 1; break;
        case SP_OP_EMBED_VOCAB: v = 0; break;
        default:
            for (int k = 0; k < n->nin; k++) v &= value[n->in[k]];
        }
        value[i] = v;
        grad[i] = 1;
    }
    for (int i = g->n - 1; i >= 0; i--) {
        const sp_node *n = &g->node[i];
        uint8_t whole = 1;
        for (int k = 0; k < n->nin; k++) whole &= value[n->in[k]];
        for (int k = 0; k < n->nin; k++) {
            uint8_t c = n->op == SP_OP_TP_COPY ? 1
                      : n->op == SP_OP_TP_SUM ? grad[i]
                      : n->op == SP_OP_CE_VOCAB ? 0
                      : (uint8_t)(grad[i] & whole);
            grad[n->in[k]] &= c;
        }
    }
    return SP_OK;
}

static int need_f32(const sp_graph *g, const char *op, sp_tensor t, const char *what)
{
    if (N(g, t)->dtype != SP_F32)
        return fail(SP_ERR_SHAPE, "%s: %s must be f32, got i32", op, what);
    return 0;
}

sp_tensor sp_matmul(sp_graph *g, sp_tensor a, sp_tensor b, int ta, int tb)
{
    sp_tensor in[2] = { a, b };
    int r = take_inputs(g, "sp_matmul", 2, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_matmul", in[0], "a")) < 0) return r;
    if ((r = need_f32(g, "sp_matmul", in[1], "b")) < 0) return r;
    const sp_node *A = N(g, in[0]), *B = N(g, in[1]);
    char sa[64], sb[64];
    if (B->ndim != 2 || (ta && A->ndim != 2))
        return fail(SP_ERR_SHAPE, "sp_matmul: b%s must be 2-D (and a%s too when transposed)",
                    shape_str(B, sb, 64), shape_str(A, sa, 64));
    int64_t k_a = ta ? A->shape[0] : A->shape[A->ndim - 1];
    int64_t k_b = tb ? B->shape[1] : B->shape[0];
    int64_t ncols = tb ? B->shape[0] : B->shape[1];
    if (k_a != k_b)
        return fail(SP_ERR_SHAPE,
                    "sp_matmul: inner dimensions differ: a%s%s has %lld, b%s%s has %lld",
                    shape_str(A, sa, 64), ta ? "^T" : "", (long long)k_a, shape_str(B, sb, 64),
                    tb ? "^T" : "", (long long)k_b);
    int64_t shape[SP_MAX_DIMS];
    int ndim = A->ndim;
    if (ta) {
        shape[0] = A->shape[1];
        shape[1] = ncols;
    } else {
        memcpy(shape, A->shape, sizeof shape);
        shape[ndim - 1] = ncols;
    }
    sp_node *n = push(g, SP_OP_MATMUL, SP_F32, ndim, shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_matmul: out of memory");
    n->nin = 2;
    n->in[0] = in[0];
    n->in[1] = in[1];
    n->ta = ta != 0;
    n->tb = tb != 0;
    return g->n - 1;
}

sp_tensor sp_bias_add(sp_graph *g, sp_tensor x, sp_tensor bias)
{
    sp_tensor in[2] = { x, bias };
    int r = take_inputs(g, "sp_bias_add", 2, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_bias_add", in[0], "x")) < 0) return r;
    if ((r = need_f32(g, "sp_bias_add", in[1], "bias")) < 0) return r;
    const sp_node *X = N(g, in[0]), *Bn = N(g, in[1]);
    char sx[64], sb[64];
    if (Bn->ndim != 1 || Bn->shape[0] != X->shape[X->ndim - 1])
        return fail(SP_ERR_SHAPE,
                    "sp_bias_add: bias%s must be 1-D with the last dim of x%s (no broadcasting)",
                    shape_str(Bn, sb, 64), shape_str(X, sx, 64));
    sp_node *n = push(g, SP_OP_BIAS_ADD, SP_F32, X->ndim, X->shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_bias_add: out of memory");
    n->nin = 2;
    n->in[0] = in[0];
    n->in[1] = in[1];
    return g->n - 1;
}

static int same_shape(const sp_node *a, const sp_node *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

sp_tensor sp_add(sp_graph *g, sp_tensor a, sp_tensor b)
{
    sp_tensor in[2] = { a, b };
    int r = take_inputs(g, "sp_add", 2, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_add", in[0], "a")) < 0) return r;
    if ((r = need_f32(g, "sp_add", in[1], "b")) < 0) return r;
    const sp_node *A = N(g, in[0]), *B = N(g, in[1]);
    char sa[64], sb[64];
    if (!same_shape(A, B))
        return fail(SP_ERR_SHAPE, "sp_add: shapes differ: a%s vs b%s (no broadcasting)",
                    shape_str(A, sa, 64), shape_str(B, sb, 64));
    sp_node *n = push(g, SP_OP_ADD, SP_F32, A->ndim, A->shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_add: out of memory");
    n->nin = 2;
    n->in[0] = in[0];
    n->in[1] = in[1];
    return g->n - 1;
}

static sp_tensor unary(sp_graph *g, sp_opcode op, const char *name, sp_tensor x)
{
    sp_tensor in[1] = { x };
    int r = take_inputs(g, name, 1, in);
    if (r < 0) return r;
    if ((r = need_f32(g, name, in[0], "x")) < 0) return r;
    const sp_node *X = N(g, in[0]);
    sp_node *n = push(g, op, SP_F32, X->ndim, X->shape);
    if (!n) return fail(SP_ERR_NOMEM, "%s: out of memory", name);
    n->nin = 1;
    n->in[0] = in[0];
    return g->n - 1;
}

sp_tensor sp_scale(sp_graph *g, sp_tensor x, float s)
{
    if (!isfinite(s)) return fail(SP_ERR_ARG, "sp_scale: factor must be finite");
    sp_tensor t = unary(g, SP_OP_SCALE, "sp_scale", x);
    if (t >= 0) g->node[t].s = s;
    return t;
}

sp_tensor sp_gelu(sp_graph *g, sp_tensor x) { return unary(g, SP_OP_GELU, "sp_gelu", x); }
sp_tensor sp_relu(sp_graph *g, sp_tensor x) { return unary(g, SP_OP_RELU, "sp_relu", x); }

static int need_param(const sp_graph *g, const char *op, sp_tensor t, const char *what)
{
    if (N(g, t)->op != SP_OP_PARAM)
        return fail(SP_ERR_GRAPH, "%s: %s must be a parameter (sp_param)", op, what);
    return 0;
}

sp_tensor sp_layernorm(sp_graph *g, sp_tensor x, sp_tensor gamma, sp_tensor beta)
{
    sp_tensor in[3] = { x, gamma, beta };
    int r = take_inputs(g, "sp_layernorm", 3, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_layernorm", in[0], "x")) < 0) return r;
    if ((r = need_param(g, "sp_layernorm", in[1], "gamma")) < 0) return r;
    if ((r = need_param(g, "sp_layernorm", in[2], "beta")) < 0) return r;
    const sp_node *X = N(g, in[0]), *G = N(g, in[1]), *Bt = N(g, in[2]);
    int64_t C = X->shape[X->ndim - 1];
    char sx[64], sg[64], sb[64];
    if (G->ndim != 1 || Bt->ndim != 1 || G->shape[0] != C || Bt->shape[0] != C)
        return fail(SP_ERR_SHAPE,
                    "sp_layernorm: gamma%s and beta%s must be 1-D with the last dim of x%s",
                    shape_str(G, sg, 64), shape_str(Bt, sb, 64), shape_str(X, sx, 64));
    sp_node *n = push(g, SP_OP_LAYERNORM, SP_F32, X->ndim, X->shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_layernorm: out of memory");
    n->nin = 3;
    memcpy(n->in, in, sizeof in);
    n->aux = 2 * (n->numel / C); /* mean and rstd per row */
    return g->n - 1;
}

sp_tensor sp_rmsnorm(sp_graph *g, sp_tensor x, sp_tensor weight)
{
    sp_tensor in[2] = { x, weight };
    int r = take_inputs(g, "sp_rmsnorm", 2, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_rmsnorm", in[0], "x")) < 0) return r;
    if ((r = need_param(g, "sp_rmsnorm", in[1], "weight")) < 0) return r;
    const sp_node *X = N(g, in[0]), *W = N(g, in[1]);
    int64_t C = X->shape[X->ndim - 1];
    char sx[64], sw[64];
    if (W->ndim != 1 || W->shape[0] != C)
        return fail(SP_ERR_SHAPE, "sp_rmsnorm: weight%s must be 1-D with the last dim of x%s",
                    shape_str(W, sw, 64), shape_str(X, sx, 64));
    sp_node *n = push(g, SP_OP_RMSNORM, SP_F32, X->ndim, X->shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_rmsnorm: out of memory");
    n->nin = 2;
    memcpy(n->in, in, sizeof in);
    n->aux = n->numel / C; /* rstd per row */
    return g->n - 1;
}

sp_tensor sp_embed(sp_graph *g, sp_tensor tokens, sp_tensor wte, sp_tensor wpe)
{
    sp_tensor in[3] = { tokens, wte, wpe };
    int r = take_inputs(g, "sp_embed", 3, in);
    if (r < 0) return r;
    const sp_node *Tk = N(g, in[0]), *E = N(g, in[1]), *P = N(g, in[2]);
    char st[64], se[64], sp[64];
    if (Tk->dtype != SP_I32 || Tk->op != SP_OP_INPUT || Tk->ndim != 2)
        return fail(SP_ERR_SHAPE, "sp_embed: tokens%s must be an i32 input of shape (B,T)",
                    shape_str(Tk, st, 64));
    if ((r = need_param(g, "sp_embed", in[1], "wte")) < 0) return r;
    if ((r = need_param(g, "sp_embed", in[2], "wpe")) < 0) return r;
    if (E->ndim != 2 || P->ndim != 2 || E->shape[1] != P->shape[1] || P->shape[0] < Tk->shape[1])
        return fail(SP_ERR_SHAPE,
                    "sp_embed: wte%s (V,C) and wpe%s (Tmax,C) must share C, with Tmax >= T of "
                    "tokens%s",
                    shape_str(E, se, 64), shape_str(P, sp, 64), shape_str(Tk, st, 64));
    int64_t shape[3] = { Tk->shape[0], Tk->shape[1], E->shape[1] };
    sp_node *n = push(g, SP_OP_EMBED, SP_F32, 3, shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_embed: out of memory");
    n->nin = 3;
    memcpy(n->in, in, sizeof in);
    return g->n - 1;
}

/* The vocab-parallel embedding: wte this rank's rows [lo, lo + V/T) of the whole (V,C),
 * a parameter split by rows (sp_param_split along dim 0, or any view split along its
 * first dimension: the part is then one block of whole rows); at T = 1 any (V,C) one. */
sp_tensor sp_embed_vocab(sp_graph *g, sp_tensor tokens, sp_tensor wte)
{
    sp_tensor in[2] = { tokens, wte };
    int r = take_inputs(g, "sp_embed_vocab", 2, in);
    if (r < 0) return r;
    const sp_node *Tk = N(g, in[0]), *E = N(g, in[1]);
    char st[64], se[64];
    if (Tk->dtype != SP_I32 || Tk->op != SP_OP_INPUT || Tk->ndim != 2)
        return fail(SP_ERR_SHAPE, "sp_embed_vocab: tokens%s must be an i32 input of shape "
                    "(B,T)", shape_str(Tk, st, 64));
    if ((r = need_param(g, "sp_embed_vocab", in[1], "wte")) < 0) return r;
    if (E->ndim != 2)
        return fail(SP_ERR_SHAPE, "sp_embed_vocab: wte%s must be (V/T,C)", shape_str(E, se, 64));
    if (g->tp_size > 1 && E->split != 0)
        return fail(SP_ERR_GRAPH, "sp_embed_vocab: wte '%s' must be split by rows over the "
                    "tensor group (sp_param_split along dim 0)", E->name);
    int64_t shape[3] = { Tk->shape[0], Tk->shape[1], E->shape[1] };
    int64_t rows = E->shape[0];
    sp_node *n = push(g, SP_OP_EMBED_VOCAB, SP_F32, 3, shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_embed_vocab: out of memory");
    n->nin = 2;
    memcpy(n->in, in, sizeof in);
    n->vlo = (int64_t)g->tp_rank * rows;
    n->vocab = rows * g->tp_size;
    return g->n - 1;
}

sp_tensor sp_add_positions(sp_graph *g, sp_tensor x, sp_tensor wpe)
{
    sp_tensor in[2] = { x, wpe };
    int r = take_inputs(g, "sp_add_positions", 2, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_add_positions", in[0], "x")) < 0) return r;
    if ((r = need_param(g, "sp_add_positions", in[1], "wpe")) < 0) return r;
    const sp_node *X = N(g, in[0]), *P = N(g, in[1]);
    char sx[64], sp[64];
    if (X->ndim != 3 || P->ndim != 2 || P->shape[1] != X->shape[2] || P->shape[0] < X->shape[1])
        return fail(SP_ERR_SHAPE, "sp_add_positions: x%s (B,T,C) and wpe%s (Tmax,C) must share "
                    "C, with Tmax >= T", shape_str(X, sx, 64), shape_str(P, sp, 64));
    sp_node *n = push(g, SP_OP_ADD_POS, SP_F32, X->ndim, X->shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_add_positions: out of memory");
    n->nin = 2;
    memcpy(n->in, in, sizeof in);
    return g->n - 1;
}

sp_tensor sp_attention(sp_graph *g, sp_tensor qkv, int heads)
{
    sp_tensor in[1] = { qkv };
    int r = take_inputs(g, "sp_attention", 1, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_attention", in[0], "qkv")) < 0) return r;
    const sp_node *Q = N(g, in[0]);
    char sq[64];
    if (Q->ndim != 3 || Q->shape[2] % 3 != 0)
        return fail(SP_ERR_SHAPE, "sp_attention: qkv%s must be (B,T,3C)", shape_str(Q, sq, 64));
    int64_t C = Q->shape[2] / 3;
    if (heads < 1 || C % heads != 0)
        return fail(SP_ERR_SHAPE, "sp_attention: %d heads do not divide C=%lld of qkv%s", heads,
                    (long long)C, shape_str(Q, sq, 64));
    int64_t shape[3] = { Q->shape[0], Q->shape[1], C };
    int64_t lse = Q->shape[0] * heads * Q->shape[1]; /* per-row log-sum-exp; before push moves Q */
    sp_node *n = push(g, SP_OP_ATTENTION, SP_F32, 3, shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_attention: out of memory");
    n->nin = 1;
    n->in[0] = in[0];
    n->heads = heads;
    n->aux = lse;
    return g->n - 1;
}

/* Grouped-query attention: the layout of sp_attention_gqa_forward (codelets/cpu/kernels.h),
 * kept as an attention node whose group is G = heads / kv_heads. */
sp_tensor sp_attention_gqa(sp_graph *g, sp_tensor qkv, int heads, int kv_heads)
{
    sp_tensor in[1] = { qkv };
    int r = take_inputs(g, "sp_attention_gqa", 1, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_attention_gqa", in[0], "qkv")) < 0) return r;
    const sp_node *Q = N(g, in[0]);
    char sq[64];
    if (heads < 1 || kv_heads < 1 || heads % kv_heads)
        return fail(SP_ERR_SHAPE, "sp_attention_gqa: %d KV heads do not divide %d query heads",
                    kv_heads, heads);
    const int G = heads / kv_heads;
    const int64_t w = (int64_t)kv_heads * (G + 2); /* head slots per token */
    if (Q->ndim != 3 || Q->shape[2] % w)
        return fail(SP_ERR_SHAPE, "sp_attention_gqa: qkv%s must be (B,T,%lld hs): per KV head "
                    "its %d query heads, its key and its value", shape_str(Q, sq, 64),
                    (long long)w, G);
    const int64_t hs = Q->shape[2] / w;
    int64_t shape[3] = { Q->shape[0], Q->shape[1], heads * hs };
    int64_t lse = Q->shape[0] * heads * Q->shape[1]; /* before push moves Q */
    sp_node *n = push(g, SP_OP_ATTENTION, SP_F32, 3, shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_attention_gqa: out of memory");
    n->nin = 1;
    n->in[0] = in[0];
    n->heads = heads;
    n->group = G;
    n->aux = lse;
    return g->n - 1;
}

sp_tensor sp_rope(sp_graph *g, sp_tensor x, int head_size, int period, int rotated, float theta)
{
    sp_tensor in[1] = { x };
    int r = take_inputs(g, "sp_rope", 1, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_rope", in[0], "x")) < 0) return r;
    const sp_node *X = N(g, in[0]);
    char sx[64];
    if (head_size < 2 || head_size % 2 || head_size > SP_ROPE_MAX_HEAD)
        return fail(SP_ERR_SHAPE, "sp_rope: the head size %d must be even, 2 to %d (the "
                    "rotation pairs its halves)", head_size, SP_ROPE_MAX_HEAD);
    if (X->ndim != 3 || X->shape[2] % head_size)
        return fail(SP_ERR_SHAPE, "sp_rope: x%s must be (B,T,D) with D a multiple of the head "
                    "size %d", shape_str(X, sx, 64), head_size);
    if (period < 1 || rotated < 0 || rotated > period)
        return fail(SP_ERR_ARG, "sp_rope: rotated %d of every %d heads (0 <= rotated <= period, "
                    "period >= 1)", rotated, period);
    if (!(theta > 1.0f) || !isfinite(theta))
        return fail(SP_ERR_ARG, "sp_rope: theta %g must be a finite number above 1", theta);
    sp_node *n = push(g, SP_OP_ROPE, SP_F32, X->ndim, X->shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_rope: out of memory");
    n->nin = 1;
    n->in[0] = in[0];
    n->rope_hs = head_size;
    n->rope_period = period;
    n->rope_rotated = rotated;
    n->rope_theta = theta;
    return g->n - 1;
}

sp_tensor sp_swiglu(sp_graph *g, sp_tensor x)
{
    sp_tensor in[1] = { x };
    int r = take_inputs(g, "sp_swiglu", 1, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_swiglu", in[0], "x")) < 0) return r;
    const sp_node *X = N(g, in[0]);
    char sx[64];
    if (X->shape[X->ndim - 1] % 2)
        return fail(SP_ERR_SHAPE, "sp_swiglu: x%s must end in an even dim, [a | b]",
                    shape_str(X, sx, 64));
    int64_t shape[SP_MAX_DIMS];
    memcpy(shape, X->shape, sizeof shape);
    shape[X->ndim - 1] /= 2;
    sp_node *n = push(g, SP_OP_SWIGLU, SP_F32, X->ndim, shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_swiglu: out of memory");
    n->nin = 1;
    n->in[0] = in[0];
    return g->n - 1;
}

/* targets: i32 with the leading dims of logits */
static int need_targets(const sp_graph *g, const char *op, sp_tensor logits, sp_tensor targets)
{
    const sp_node *L = N(g, logits), *T = N(g, targets);
    char sl[64], stg[64];
    int ok = T->dtype == SP_I32 && T->ndim == L->ndim - 1;
    for (int d = 0; ok && d < T->ndim; d++) ok = T->shape[d] == L->shape[d];
    if (!ok)
        return fail(SP_ERR_SHAPE, "%s: targets%s must be i32 with the leading dims of logits%s",
                    op, shape_str(T, stg, 64), shape_str(L, sl, 64));
    return 0;
}

sp_tensor sp_cross_entropy(sp_graph *g, sp_tensor logits, sp_tensor targets)
{
    sp_tensor in[2] = { logits, targets };
    int r = take_inputs(g, "sp_cross_entropy", 2, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_cross_entropy", in[0], "logits")) < 0) return r;
    if ((r = need_targets(g, "sp_cross_entropy", in[0], in[1])) < 0) return r;
    const sp_node *L = N(g, in[0]);
    int64_t one = 1, probs = L->numel; /* softmax probabilities; before push moves L */
    const int64_t V = L->shape[L->ndim - 1];
    sp_node *n = push(g, SP_OP_CROSS_ENTROPY, SP_F32, 1, &one);
    if (!n) return fail(SP_ERR_NOMEM, "sp_cross_entropy: out of memory");
    n->nin = 2;
    n->in[0] = in[0];
    n->in[1] = in[1];
    n->aux = probs;
    n->vocab = V;
    return g->n - 1;
}

sp_tensor sp_cross_entropy_padded(sp_graph *g, sp_tensor logits, sp_tensor targets,
                                  int64_t vocab)
{
    sp_tensor t = g && g->tp_size > 1 ? sp_cross_entropy_vocab(g, logits, targets)
                                      : sp_cross_entropy(g, logits, targets);
    if (t < 0) return t;
    sp_node *n = &g->node[t];
    const int64_t width = g->node[n->in[0]].shape[g->node[n->in[0]].ndim - 1] * g->tp_size;
    if (vocab < 1 || vocab > width)
        return fail(SP_ERR_SHAPE, "sp_cross_entropy_padded: %lld tokens in a vocabulary of "
                    "%lld columns", (long long)vocab, (long long)width);
    n->vocab = vocab;
    return t;
}

/* At T = 1 the whole vocabulary is this rank's: sp_cross_entropy itself, no node of its
 * own. The aux floats: the probabilities of the slice (N,V/T), then per row the maximum,
 * the sum of exponentials, the target's logit and the target inside the slice (an i32,
 * -1 where another rank holds it), read by the backward (program.c). */
sp_tensor sp_cross_entropy_vocab(sp_graph *g, sp_tensor logits, sp_tensor targets)
{
    if (g && g->tp_size == 1) return sp_cross_entropy(g, logits, targets);
    sp_tensor in[2] = { logits, targets };
    int r = take_inputs(g, "sp_cross_entropy_vocab", 2, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_cross_entropy_vocab", in[0], "logits")) < 0) return r;
    if ((r = need_targets(g, "sp_cross_entropy_vocab", in[0], in[1])) < 0) return r;
    const sp_node *L = N(g, in[0]);
    int64_t one = 1, Vp = L->shape[L->ndim - 1], rows = L->numel / Vp;
    int64_t aux = L->numel + 4 * rows; /* before push moves L */
    sp_node *n = push(g, SP_OP_CE_VOCAB, SP_F32, 1, &one);
    if (!n) return fail(SP_ERR_NOMEM, "sp_cross_entropy_vocab: out of memory");
    n->nin = 2;
    n->in[0] = in[0];
    n->in[1] = in[1];
    n->aux = aux;
    n->vlo = (int64_t)g->tp_rank * Vp;
    n->vocab = Vp * g->tp_size;
    return g->n - 1;
}

static sp_tensor reduce(sp_graph *g, sp_opcode op, const char *name, sp_tensor x)
{
    sp_tensor in[1] = { x };
    int r = take_inputs(g, name, 1, in);
    if (r < 0) return r;
    if ((r = need_f32(g, name, in[0], "x")) < 0) return r;
    int64_t one = 1;
    sp_node *n = push(g, op, SP_F32, 1, &one);
    if (!n) return fail(SP_ERR_NOMEM, "%s: out of memory", name);
    n->nin = 1;
    n->in[0] = in[0];
    return g->n - 1;
}

sp_tensor sp_sum(sp_graph *g, sp_tensor x) { return reduce(g, SP_OP_SUM, "sp_sum", x); }
sp_tensor sp_mean(sp_graph *g, sp_tensor x) { return reduce(g, SP_OP_MEAN, "sp_mean", x); }

sp_tensor sp_reshape(sp_graph *g, sp_tensor x, int ndim, const int64_t *shape)
{
    sp_tensor in[1] = { x };
    int r = take_inputs(g, "sp_reshape", 1, in);
    if (r < 0) return r;
    if ((r = need_f32(g, "sp_reshape", in[0], "x")) < 0) return r;
    const sp_node *X = N(g, in[0]);
    char sx[64];
    if (!check_shape_arg(ndim, shape))
        return fail(SP_ERR_SHAPE, "sp_reshape: new shape must have 1..%d dims, each >= 1",
                    SP_MAX_DIMS);
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    if (numel != X->numel)
        return fail(SP_ERR_SHAPE, "sp_reshape: x%s has %lld elements, the new shape %lld",
                    shape_str(X, sx, 64), (long long)X->numel, (long long)numel);
    sp_node *n = push(g, SP_OP_RESHAPE, SP_F32, ndim, shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_reshape: out of memory");
    n->nin = 1;
    n->in[0] = in[0];
    return g->n - 1;
}

sp_tensor sp_pipeline_yield(sp_graph *g, sp_tensor x)
{
    sp_tensor in[1] = { x };
    int r = take_inputs(g, "sp_pipeline_yield", 1, in);
    if (r < 0) return r;
    const sp_node *X = N(g, in[0]);
    if (X->op == SP_OP_PARAM || X->op == SP_OP_INPUT)
        return fail(SP_ERR_GRAPH, "sp_pipeline_yield: '%s' is a %s; only a computed tensor "
                    "can be handed to the next stage", X->name, sp_opcode_name(X->op));
    if (X->stage != g->cur_stage)
        return fail(SP_ERR_GRAPH, "sp_pipeline_yield: the tensor comes from stage %d, but "
                    "stage %d is being closed", X->stage, g->cur_stage);
    sp_node *n = push(g, SP_OP_YIELD, X->dtype, X->ndim, X->shape);
    if (!n) return fail(SP_ERR_NOMEM, "sp_pipeline_yield: out of memory");
    n->nin = 1;
    n->in[0] = in[0];
    g->cur_stage++;
    return g->n - 1;
}

sp_status sp_graph_set_loss(sp_graph *g, sp_tensor loss)
{
    if (!g) return sp_set_error(SP_ERR_ARG, "sp_graph_set_loss: graph is NULL");
    if (loss < 0)
        return sp_error_context(SP_ERR_GRAPH, "sp_graph_set_loss: the loss tensor is invalid "
                                "(an earlier op failed)");
    if (!valid_id(g, loss)) return sp_set_error(SP_ERR_ARG, "sp_graph_set_loss: bad tensor id");
    loss = resolve(g, loss);
    const sp_node *L = N(g, loss);
    if (L->numel != 1 || L->dtype != SP_F32 || L->stage < 0)
        return sp_set_error(SP_ERR_GRAPH, "sp_graph_set_loss: the loss must be a computed f32 "
                            "scalar");
    if (L->stage != g->cur_stage)
        return sp_set_error(SP_ERR_GRAPH, "sp_graph_set_loss: the loss must be computed in the "
                            "last stage (%d), not in stage %d", g->cur_stage, L->stage);
    g->loss = loss;
    return SP_OK;
}

int sp_graph_num_stages(const sp_graph *g) { return g ? g->cur_stage + 1 : 0; }
int sp_graph_num_tensors(const sp_graph *g) { return g ? g->n : 0; }
int sp_tensor_ndim(const sp_graph *g, sp_tensor t) { return valid_id(g, t) ? N(g, t)->ndim : 0; }
const int64_t *sp_tensor_shape(const sp_graph *g, sp_tensor t)
{
    return valid_id(g, t) ? N(g, t)->shape : NULL;
}
int64_t sp_tensor_numel(const sp_graph *g, sp_tensor t)
{
    return valid_id(g, t) ? N(g, t)->numel : 0;
}
sp_dtype sp_tensor_dtype(const sp_graph *g, sp_tensor t)
{
    return valid_id(g, t) ? N(g, t)->dtype : SP_F32;
}
const char *sp_tensor_name(const sp_graph *g, sp_tensor t)
{
    return valid_id(g, t) ? N(g, t)->name : "";
}
int sp_tensor_is_param(const sp_graph *g, sp_tensor t)
{
    return valid_id(g, t) && N(g, t)->op == SP_OP_PARAM;
}
int sp_tensor_is_input(const sp_graph *g, sp_tensor t)
{
    return valid_id(g, t) && N(g, t)->op == SP_OP_INPUT;
}
int sp_tensor_stage(const sp_graph *g, sp_tensor t) { return valid_id(g, t) ? N(g, t)->stage : -1; }

sp_tensor sp_graph_find(const sp_graph *g, const char *name)
{
    if (!g || !name || !name[0]) return -1;
    for (int i = 0; i < g->n; i++)
        if (strcmp(g->node[i].name, name) == 0) return i;
    return -1;
}

sp_status sp_graph_name(sp_graph *g, sp_tensor t, const char *name)
{
    if (!valid_id(g, t)) return sp_set_error(SP_ERR_ARG, "sp_graph_name: bad tensor id %d", t);
    t = resolve(g, t);
    sp_node *n = &g->node[t];
    if (n->op == SP_OP_PARAM || n->op == SP_OP_INPUT || n->name[0])
        return sp_set_error(SP_ERR_ARG, "sp_graph_name: tensor %d already has a name ('%s')",
                            t, n->name);
    if (!name || !name[0] || strlen(name) >= sizeof n->name)
        return sp_set_error(SP_ERR_ARG, "sp_graph_name: a name of 1 to 63 characters is needed");
    if (sp_graph_find(g, name) >= 0)
        return sp_set_error(SP_ERR_ARG, "sp_graph_name: the name '%s' is already used", name);
    snprintf(n->name, sizeof n->name, "%s", name);
    return SP_OK;
}

int sp_graph_num_params(const sp_graph *g)
{
    int k = 0;
    for (int i = 0; g && i < g->n; i++) k += g->node[i].op == SP_OP_PARAM;
    return k;
}

sp_tensor sp_graph_param(const sp_graph *g, int idx)
{
    for (int i = 0; g && i < g->n; i++)
        if (g->node[i].op == SP_OP_PARAM && idx-- == 0) return i;
    return -1;
}

int64_t sp_graph_param_count(const sp_graph *g)
{
    int64_t k = 0;
    for (int i = 0; g && i < g->n; i++)
        if (g->node[i].op == SP_OP_PARAM) k += g->node[i].numel;
    return k;
}

/* splitmix64: a counter-based generator, so element j of a parameter has the same value
 * in every process, whatever else was initialised before it. */
static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
    return h;
}

/* Elements j0 and j0 + 1 (j0 even) of a NORMAL tensor: Box-Muller on the pair of uniforms
 * in (0,1] drawn for them, the cosine for j0, the sine for j0 + 1. One call for both:
 * the logarithm, the square root and the angle's reduction are the pair's (most of a large
 * model's start-up, 2.5 s for GPT-2 124M). */
static void normal_pair(uint64_t key, uint64_t j0, float std, float *even, float *odd)
{
    uint64_t r1 = splitmix64(key + j0), r2 = splitmix64(key + j0 + 1);
    double u1 = ((r1 >> 11) + 1.0) * 0x1.0p-53, u2 = (r2 >> 11) * 0x1.0p-53;
    double rad = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
    double sn, cs;
    if (even && odd) /* glibc's sincos is its sin and cos (the same code): the same bits */
        sincos(th, &sn, &cs);
    else
        sn = odd ? sin(th) : 0, cs = even ? cos(th) : 0;
    if (even) *even = (float)(std * rad * cs);
    if (odd) *odd = (float)(std * rad * sn);
}

sp_status sp_param_init_values(const sp_graph *g, sp_tensor p, uint64_t seed, float *dst)
{
    if (!sp_tensor_is_param(g, p) || !dst)
        return sp_set_error(SP_ERR_ARG, "sp_param_init_values: not a parameter");
    const sp_node *n = N(g, p);
    if (n->init != SP_INIT_NORMAL) {
        float v = n->init == SP_INIT_ONES ? 1.0f : 0.0f;
        for (int64_t j = 0; j < n->numel; j++) dst[j] = v;
        return SP_OK;
    }
    uint64_t key = splitmix64(seed ^ fnv1a(n->name));
    /* a part holds the whole tensor's values at its elements (part_runs): those of T = 1;
     * padding rows (sp_param_pad_rows) zero */
    const int64_t pad = n->valid_rows ? n->valid_rows * (sp_param_whole_numel(g, p) /
                                                          sp_param_full_shape(g, p)[0])
                                      : INT64_MAX;
    int64_t outer, run, stride, offset;
    part_runs(g, n, g->tp_rank, &outer, &run, &stride, &offset);
    for (int64_t o = 0, k = 0; o < outer; o++)
        for (int64_t q = 0; q < run; k++, q++) {
            const int64_t j = o * stride + offset + q;
            if (j >= pad) {
                dst[k] = 0.0f;
            } else if (j & 1) { /* an odd first element: its pair's sine alone */
                normal_pair(key, (uint64_t)j - 1, n->init_std, NULL, &dst[k]);
            } else if (q + 1 < run && j + 1 < pad) { /* the pair, in one call */
                normal_pair(key, (uint64_t)j, n->init_std, &dst[k], &dst[k + 1]);
                k++, q++;
            } else {
                normal_pair(key, (uint64_t)j, n->init_std, &dst[k], NULL);
            }
        }
    return SP_OK;
}

void sp_graph_print(const sp_graph *g, void *stream)
{
    FILE *f = stream ? (FILE *)stream : stdout;
    char s[64];
    for (int i = 0; g && i < g->n; i++) {
        const sp_node *n = &g->node[i];
        fprintf(f, "%4d stage %2d %-14s %-12s", i, n->stage, sp_opcode_name(n->op),
                shape_str(n, s, 64));
        for (int k = 0; k < n->nin; k++) fprintf(f, " %d", n->in[k]);
        if (n->name[0]) fprintf(f, "  '%s'", n->name);
        fputc('\n', f);
    }
}
