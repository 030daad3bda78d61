/* Internal layout of stage programs, shared by layout.c (memory layout, operands),
 * program.c (forward programs, build), autodiff.c (the backward: VJP rules and the B/W
 * split) and run.c (the interpreter). */
#ifndef STARPIPE_PROGRAM_IMPL_H
#define STARPIPE_PROGRAM_IMPL_H

#include "graph/graph_impl.h"
#include "starpipe/program.h"

/* An operand: buffer number in the program's list, float offset inside it. */
typedef struct {
    int buf;
    int64_t off;
} sp_loc;

typedef enum {
    /* forward */
    SP_I_MATMUL, SP_I_BIAS_ADD, SP_I_ADD, SP_I_GELU, SP_I_RELU, SP_I_LAYERNORM, SP_I_EMBED,
    SP_I_ATTENTION, SP_I_CE, SP_I_SUM,
    SP_I_SCALE,        /* o0 = f * i0 (n0 elements); acc adds; f = 1 is a copy */
    SP_I_TO_BF16,      /* o0 (bf16 storage, offset in 16-bit elements) = i0 rounded (n0) */
    /* backward */
    SP_I_MATMUL_DA, SP_I_MATMUL_DB, SP_I_BIAS_DB, SP_I_GELU_DX, SP_I_RELU_DX, SP_I_LN_DX,
    SP_I_LN_DP, SP_I_EMBED_DP, SP_I_ATTN_DX, SP_I_CE_DX,
    SP_I_SUM_DX,       /* o0 = f * (*i0) broadcast */
    SP_I_SEED,         /* *o0 = dloss of the run */
    SP_I_ZERO,         /* o0 = 0 (n0 floats) */
    /* both */
    SP_I_ALLREDUCE,    /* o0 = (acc: +=) the sum of i0 over the tensor group (n0 floats) */
    /* the vocab-parallel embedding and cross-entropy (graph.h); the kernels never meet
     * the group themselves: the all-reduces between them are instructions of their own */
    SP_I_ALLREDUCE_MAX, /* o0 (n0 floats) = its maximum over the tensor group, in place */
    SP_I_EMBED_VOCAB,  /* o0 (N,C) = rows of i1 (rows n3 from row n2) by token i0; n4 V */
    SP_I_ADD_POS,      /* o0 = i0 + i1 per batch row: n0 rows of n1 = T*C floats */
    SP_I_VCE_MAX,      /* o0 (n0) = the row maxima of the slice i0 (n0, n1) */
    SP_I_VCE_EXP,      /* o0 = exp(i0 - max), o1: max | sum | target logit | target */
    SP_I_VCE_LOSS,     /* *o0 = the mean loss; o1 (the exps) normalized; i0 as EXP's o1 */
    SP_I_EMBED_VOCAB_DP, /* o0 += dout i0 by token i1, the rows n3 from row n2 */
    SP_I_ADD_POS_DP,   /* o0 (n1) += each of the n0 batch rows of i0, in order */
    /* RMSNorm (n0 rows of n1): o0 = out, o1 = rstd (aux); backward i0 dout, i1 x,
     * i2 rstd, i3 weight (dx only) */
    SP_I_RMSNORM, SP_I_RMS_DX, SP_I_RMS_DW,
    /* rotary embeddings: o0 = i0 turned (+= with acc); n0..n4 B, T, D, hs, period;
     * flag0 rotated heads, flag1 inverse (the backward); f theta */
    SP_I_ROPE,
    /* SwiGLU (n0 rows of n1 = I outputs): o0 = silu(a) b of i0; backward o0 = dx from
     * i0 x and i1 dout */
    SP_I_SWIGLU, SP_I_SWIGLU_DX,
    /* a matrix product whose only reader is a bias add, fused with it (program.c): o0 =
     * i0 @ i1 + i2 on each row, sizes and transposes as SP_I_MATMUL's, acc 0 */
    SP_I_MATMUL_BIAS,
    SP_I_COUNT
} sp_icode;

typedef struct {
    sp_icode code;
    int acc;
    int node;          /* graph node the instruction belongs to (for messages) */
    sp_loc o[2];
    sp_loc i[4];
    int64_t n[5];      /* sizes, meaning per code */
    int flag[2];       /* matmul transposes */
    int half;          /* bit k: i[k] is a matrix product's operand in bf16 storage */
    float f;
} sp_kinstr;

typedef struct {
    int nbufs, capbufs;
    sp_slab_ref *bufs;
    int nins, capins;
    sp_kinstr *ins;
    double flops;
    int oom; /* an allocation failed while emitting: the build fails */
} sp_kprog;

typedef struct {
    int src, dst;
    int ntensors;
    int *tensor;       /* ids, ascending */
    int64_t *off;      /* float offset of each in the slab */
    int64_t floats;
    int needs_grad;
} sp_edge_layout;

struct sp_program {
    const sp_graph *g;
    int nstages;
    sp_precision precision;  /* of the matrix products (sp_program_set_precision) */
    uint8_t *needs_grad;     /* per tensor: requires grad and the loss depends on it */
    uint8_t *fused;          /* per tensor: a matrix product whose one reader is a bias add
                                of its stage; emitted as that add's SP_I_MATMUL_BIAS, it has
                                no value, so no place (program.c, analyze) */
    /* ACT of a stage: the fp32 values with their auxiliary floats (act_floats), then,
     * 16-byte aligned, the values stored as bf16 (act_half 16-bit elements; see
     * sp_program_set_bf16_activations). */
    int64_t *act_off;        /* per tensor computed in its stage: offset in ACT, in floats,
                                or in 16-bit elements when act16 */
    int64_t *aux_off;        /* per tensor: float offset of its auxiliary floats in ACT */
    uint8_t *act16;          /* per tensor: its value is stored in ACT as bf16 */
    uint8_t *plain_read;     /* per tensor: an instruction reads its value from ACT other
                                than as a matrix product's operand (so it must stay fp32) */
    /* What only F reads lives in SCRATCH instead of ACT (sp_program_build decides it from
     * the marks of its first emission, where every value is in ACT). */
    uint8_t *bwd_read;       /* per tensor: a B, W or BW instruction reads its value */
    uint8_t *aux_bwd_read;   /* per tensor: ... or its auxiliary floats */
    int64_t *scr_off;        /* per tensor: float offset of its value in SCRATCH, or -1 */
    int64_t *aux_scr_off;    /* per tensor: of its auxiliary floats in SCRATCH, or -1 */
    int64_t *tmp_off;        /* per act16 tensor: its fp32 value before rounding, in SCRATCH */
    int act_bf16;            /* sp_program_set_bf16_activations */
    int64_t *act_half;       /* per stage */
    int64_t *kernel_scratch; /* per stage: SCRATCH floats the kernels themselves need */
    /* Activation gradients: BGRAD (kept from B to W of a microbatch) holds only those B
     * touches and W reads; every other one lives in SCRATCH, packed by lifetime inside the
     * one program, B or W, that uses it (sp_program_build decides it from the marks of its
     * first emission, where every gradient is in BGRAD). */
    int *grad_root;          /* per tensor: the tensor whose gradient storage its gradient
                                is, itself unless aliased (layout: a bias add's sole input
                                shares its output's gradient, which it would copy) */
    int64_t *bgrad_off;      /* per tensor: offset in BGRAD of its stage, or -1 */
    uint8_t *grad_use;       /* per tensor: bit 0 B touches its gradient, bit 1 W does */
    int64_t *grad_first;     /* per tensor: the first and last instruction of that program */
    int64_t *grad_last;      /*   that touch its gradient (its lifetime there) */
    int64_t *gscr_off;       /* per tensor: float offset of its gradient in SCRATCH, or -1 */
    int64_t **param_off;     /* [stage][tensor] offset in PARAMS/GRADS, -1 if unused */
    int64_t *param_floats;   /* per stage */
    /* Gradient accumulators: one per use of a parameter. The first use in a stage has
     * the slot that mirrors PARAMS; later uses in the same stage get slots after it, and
     * are added into the first after the microbatch loop, in use order, so a model
     * trains to the same bits however it is cut into stages. */
    int64_t *use_goff;       /* [tensor * 3 + input]: GRADS offset of that param use */
    int64_t *grad_floats;    /* per stage: PARAMS size plus the extra slots */
    int *nlocal;             /* per stage: extra slots, each added into a first slot */
    int64_t **local;         /* [stage][3 * j]: dst offset, src offset, floats */
    int64_t *act_floats, *bgrad_floats, *scratch_floats;
    int nedges;
    sp_edge_layout *edge;
    int ninputs;
    int *input;              /* tensor id of each input number */
    int64_t *input_limit;    /* per input: exclusive bound of its values (i32), or INT64_MAX */
    sp_kprog *prog;          /* [stage * 4 + kind] */
    sp_stage_model model;
};

sp_kprog *sp_prog_of(const sp_program *p, int stage, sp_task_kind kind);
/* The operand for tensor t as read in stage s (params, inputs, ACT or an incoming edge). */
sp_loc sp_loc_value(sp_program *p, sp_kprog *kp, int s, int t, sp_access_mode mode);
/* Input k of I: tensor t as a matrix product's operand, read in stage s. Where t is stored
 * as bf16, I reads that storage (I->half), which the product would have rounded to. */
void sp_set_operand(sp_program *p, sp_kprog *kp, int s, sp_kinstr *I, int k, int t);
/* The operand holding t's auxiliary floats (saved statistics), in ACT of its stage. */
sp_loc sp_loc_aux(sp_program *p, sp_kprog *kp, int t, sp_access_mode mode);
/* The operand for t's gradient as produced in stage s. */
sp_loc sp_loc_grad(sp_program *p, sp_kprog *kp, int s, int t, sp_access_mode mode);
int sp_prog_buf(sp_kprog *kp, sp_buf_class cls, int index, size_t bytes, sp_access_mode mode);
sp_kinstr *sp_prog_emit(sp_kprog *kp, sp_icode code, int node);
int sp_edge_index(const sp_program *p, int src, int dst);
/* The stage's SCRATCH operand, grown to hold `floats`. Sized for the CPU and the CUDA
 * kernels alike (their needs differ; codelets/cuda/kernels_cuda.h). */
sp_loc sp_loc_scratch(sp_program *p, sp_kprog *kp, int s, int64_t floats);
/* A piece of stage s's SCRATCH: floats at offset off, the slab grown to hold them. */
sp_loc sp_loc_scratch_at(sp_program *p, sp_kprog *kp, int s, int64_t off, int64_t floats);
/* Offset off of buffer (cls, idx), taken by kp with mode. */
sp_loc sp_loc_slab(sp_program *p, sp_kprog *kp, sp_buf_class cls, int idx, sp_access_mode mode,
                   int64_t off);
/* A rope node's sizes and selection into I (SP_I_ROPE's n, flag[0] and f): the forward's
 * and the backward's, one definition. */
static inline void sp_rope_sizes(sp_kinstr *I, const sp_node *n)
{
    I->n[0] = n->shape[0];
    I->n[1] = n->shape[1];
    I->n[2] = n->shape[2];
    I->n[3] = n->rope_hs;
    I->n[4] = n->rope_period;
    I->flag[0] = n->rope_rotated;
    I->f = n->rope_theta;
}

/* SCRATCH floats of attention node n's forward (backward = 0) or backward under p's
 * precision: the CPU's need, or the CUDA kernels' (none forward, B*NH*T backward),
 * whichever is larger. */
int64_t sp_attention_scratch_need(const sp_program *p, const sp_node *n, int backward);

/* layout.c: the first layout (every value in ACT, fp32), then the placement once the
 * programs' readers are known. */
sp_status sp_program_layout(sp_program *p);
sp_status sp_program_place(sp_program *p);
/* run.c: an instruction's name, for messages and listings. */
const char *sp_icode_name(sp_icode code);

#endif
