/* Internal layout of the graph IR, shared by graph.c, autodiff.c and program.c.
 * A graph is a list of nodes in creation order, which is a topological order: an op can
 * only name tensors that already exist. Tensor id = node index. */
#ifndef STARPIPE_GRAPH_IMPL_H
#define STARPIPE_GRAPH_IMPL_H

#include "starpipe/graph.h"

typedef enum {
    SP_OP_INPUT,
    SP_OP_PARAM,
    SP_OP_MATMUL,
    SP_OP_BIAS_ADD,
    SP_OP_ADD,
    SP_OP_SCALE,
    SP_OP_GELU,
    SP_OP_RELU,
    SP_OP_LAYERNORM,
    SP_OP_EMBED,
    SP_OP_ATTENTION,
    SP_OP_CROSS_ENTROPY,
    SP_OP_SUM,
    SP_OP_MEAN,
    SP_OP_RESHAPE,
    SP_OP_YIELD,
    SP_OP_TP_COPY,  /* tensor parallelism: identity; its transpose sums over the group */
    SP_OP_TP_SUM,   /* the sum over the group; its transpose is the identity */
    SP_OP_EMBED_VOCAB, /* vocab-parallel embedding: the rows of wte this rank holds */
    SP_OP_ADD_POS,     /* x (B,T,C) + wpe[t]: the positions, added once after the sum */
    SP_OP_CE_VOCAB,    /* vocab-parallel cross-entropy over the group's logits slices */
    SP_OP_RMSNORM,
    SP_OP_ROPE,        /* rotary embeddings of a selection of heads */
    SP_OP_SWIGLU,      /* silu(a) b of x = [a | b] */
    SP_OP_COUNT
} sp_opcode;

typedef struct {
    sp_opcode op;
    sp_dtype dtype;
    int ndim;
    int64_t shape[SP_MAX_DIMS];
    int64_t numel;
    int nin;
    int in[3];        /* input tensor ids, yields already resolved to their source */
    int stage;        /* stage of the op; -1 for params and inputs */
    int ta, tb;       /* matmul transposes */
    int heads;        /* attention */
    int group;        /* attention: qkv's layout (0 GPT's; G: grouped-query, G per KV head) */
    int rope_hs, rope_period, rope_rotated; /* rope: head size, the selection of heads */
    float rope_theta;
    float s;          /* scale */
    sp_init init;     /* params */
    float init_std;
    int64_t valid_rows; /* params: the whole tensor's rows from here on are padding (0: none) */
    int64_t aux;      /* floats the forward saves besides the output (mean/rstd, lse, probs) */
    /* the vocab-parallel ops: the first row of wte (embedding) or column of the logits
     * (cross-entropy) this rank holds, and the whole vocabulary V (the cross-entropies,
     * plain and vocab-parallel: its tokens, the columns before any padding) */
    int64_t vlo, vocab;
    /* a parameter split over the tensor group (sp_param_split, sp_param_split_view): the
     * whole tensor's shape, whose part tp_rank this one is, the view of it that is split
     * (vndim dims; the whole shape itself for sp_param_split) and the view's dimension
     * split, or -1 (whole on every rank; vndim 0) */
    int split;
    int64_t full[SP_MAX_DIMS];
    int vndim;
    int64_t view[SP_MAX_DIMS];
    char name[64];
} sp_node;

struct sp_graph {
    sp_node *node;
    int n, cap;
    int cur_stage;
    int loss;
    int tp_size, tp_rank; /* the tensor group this graph is one member of (1, 0: none) */
};

const char *sp_opcode_name(sp_opcode op);

#endif
