/* What the planner knows about a pipelined model: its stages' sizes, costs and the edges
 * between them, and nothing of their ops. Built from a graph's stage programs
 * (sp_program_describe in program.h) or by hand, for synthetic studies at any scale.
 * Pure C: no StarPU, no MPI. */
#ifndef STARPIPE_STAGES_H
#define STARPIPE_STAGES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* F forward; B backward for the stage's inputs; W backward for its weights; BW both,
 * fused. A schedule uses either BW, or B and W, for each (microbatch, stage). */
typedef enum { SP_TASK_F = 0, SP_TASK_B = 1, SP_TASK_W = 2, SP_TASK_BW = 3 } sp_task_kind;
#define SP_NUM_TASK_KINDS 4
/* "F", "B", "W", "BW"; "?" for anything else. */
const char *sp_task_kind_name(sp_task_kind k);

/* What a buffer holds: one enum for the stage programs' slabs (program.h), the plan's
 * buffers (plan.h) and the trainer. Per step: PARAMS, GRADS (index = stage), OPT
 * (stage: optimizer state), SHARED_PARAM (index = shared parameter k), SHARED_GRAD (k, and
 * the contributing stage). Per microbatch: ACT (stage: what F keeps for B, W or BW; what
 * only F reads lives in SCRATCH), BGRAD (stage: activation gradients B keeps for W),
 * EDGE_FWD and EDGE_GRAD (index = edge of the stage model: a boundary tensor and its
 * gradient), INPUT (index = graph input), LOSS (the microbatch loss, one float).
 * SCRATCH (stage): one task's temporary space, contents not kept. */
typedef enum {
    SP_BUF_PARAMS = 0,
    SP_BUF_GRADS = 1,
    SP_BUF_ACT = 2,
    SP_BUF_BGRAD = 3,
    SP_BUF_EDGE_FWD = 4,
    SP_BUF_EDGE_GRAD = 5,
    SP_BUF_INPUT = 6,
    SP_BUF_LOSS = 7,
    SP_BUF_SCRATCH = 8,
    SP_BUF_OPT = 9,
    SP_BUF_SHARED_PARAM = 10,
    SP_BUF_SHARED_GRAD = 11
} sp_buf_class;
#define SP_NUM_BUF_CLASSES 12
/* "PARAMS", "EDGE_FWD", ...; "?" for anything else. */
const char *sp_buf_class_name(sp_buf_class c);

/* How a task or an instruction touches a buffer: one enum for the programs, the plan and
 * the executor. SCRATCH: a task's temporary, contents undefined on entry (executor). */
typedef enum {
    SP_ACCESS_R = 1,
    SP_ACCESS_W = 2,      /* written entirely; previous contents undefined */
    SP_ACCESS_RW = 3,
    SP_ACCESS_SCRATCH = 4
} sp_access_mode;

/* A tensor produced by F of src_stage and read by F of dst_stage (dst > src), per
 * microbatch. When needs_grad, B (or BW) of dst sends its gradient back to B (or BW) of
 * src, same size. Non-adjacent stages (skip connections) are allowed. */
typedef struct {
    int src_stage;
    int dst_stage;
    size_t bytes;
    int needs_grad;
} sp_stage_edge;

/* One stage's sizes (bytes) and costs (seconds or any unit; the simulator does not care). */
typedef struct {
    double cost[SP_NUM_TASK_KINDS]; /* per microbatch, indexed by sp_task_kind */
    size_t act_bytes;   /* saved by F for B/W of the same microbatch (freed after W/BW) */
    size_t bgrad_bytes; /* kept by B for W of the same microbatch (freed after W) */
    size_t param_bytes; /* parameters held by the stage; gradient accumulators are as big */
    size_t opt_bytes;   /* optimizer state (AdamW: 2 x param_bytes) */
    /* Activation recomputation: F's saved activations are dropped right after F, and the
     * first backward task (B or BW) of the microbatch runs F again from the stage's kept
     * inputs before its own work (cost F + B). The plan keeps the stage's input boundary
     * tensors alive until then, and its activations only from there to the last W. */
    int recompute;
    /* Tensor parallelism (an actor of T ranks): the all-reduces among the actor's group
     * inside one task of each kind, per microbatch: how many, and their bytes in all (each
     * rank's buffer). The simulator adds their time on the group's link to the task's
     * (exposed, not overlapped; sp_tensor_link in plan.h). All zero at T = 1. The costs
     * and sizes above are then one rank's: its part of the split work and buffers. */
    int tp_allreduces[SP_NUM_TASK_KINDS];
    double tp_bytes[SP_NUM_TASK_KINDS];
} sp_stage_info;

/* A parameter used by several stages (the GPT's tied token embedding). Each stage keeps
 * its own gradient accumulator; the partial gradients are combined once per step, on
 * the lowest stage (the owner), which updates the parameter and sends it back.
 * single_use: each partial gradient is used by nothing but that sum, the precondition
 * for moving the combine out of the microbatch loop; when 0 the planner keeps the
 * per-microbatch combine. */
typedef struct {
    size_t bytes;
    int nstages;
    int stages[8]; /* ascending */
    int single_use;
} sp_stage_shared;

typedef struct {
    int nstages;
    sp_stage_info *stage;   /* nstages entries */
    int nedges;
    sp_stage_edge *edge;
    int nshared;
    sp_stage_shared *shared;
} sp_stage_model;

/* A chain of n identical stages: edge s -> s+1 of `bytes`, each stage's cost F, B, W
 * (BW = B + W), act_bytes = 1, everything else 0. Caller frees with sp_stage_model_free. */
sp_stage_model *sp_stage_model_chain(int n, double f, double b, double w, size_t bytes);
void sp_stage_model_free(sp_stage_model *m);

/* The vocabulary padded as Megatron pads it (make-vocab-size-divisible-by): vocab rounded
 * up to a multiple of pad x tp (pad <= 0: vocab itself). The models' (models.h vocab_pad)
 * and the planner's: the apps pad with SP_VOCAB_PAD, and so do the stage models below. */
int64_t sp_padded_vocab(int64_t vocab, int pad, int tp);
#define SP_VOCAB_PAD 128

/* A GPT's stages from its shape alone, for planning at scales that cannot run here
 * (docs/scaling.md): `layers` transformer blocks of `channels` (pre-LayerNorm, 4x MLP,
 * full attention over `context` tokens), `batch` sequences per microbatch, vocabulary
 * `vocab`, cut into nstages stages of layers / nstages blocks (the remainder to the first
 * stages); stage 0 also holds the token and position embeddings, the last stage the
 * final LayerNorm and the (untied) output head; V below is the vocabulary padded to a
 * multiple of SP_VOCAB_PAD x T (sp_padded_vocab), as the apps run it. Per microbatch of N = batch x context
 * tokens and a block of C channels: F = 24 N C^2 + 4 N T C FLOPs, B = 24 N C^2 + 8 N T C,
 * W = 24 N C^2; the head adds 2 N C V to each. Costs are FLOPs / device_flops; activations
 * saved per block 34 N C x elem_bytes / 2 (Megatron's count with attention recomputed by a
 * fused kernel), boundary tensors N C x elem_bytes, parameters 4 bytes each.
 *
 * tensor = T > 1: one rank of an actor of T (Megatron's layout). Split by T: every FLOP
 * counted above (the blocks' products and attention by heads, the head by vocabulary), a
 * block's weights 12 C^2 and the biases before the sums (qkv 3C, fc 4C), the token
 * embedding and the head (vocabulary-parallel), and 24 of a block's 34 activation units
 * (qkv, attention, the MLP's 4C hidden); replicated: the LayerNorms, the biases after the
 * sums (proj, fcproj), the position embedding, the other 10 units (LayerNorm inputs, the
 * residual stream) and the boundary tensors. Its group's all-reduces, of one (N, C)
 * activation each (N C x elem_bytes): per block two in F (attention's output projection,
 * the MLP's second product) and two in B (the gradients of the inputs of qkv and fc), none
 * in W; the embedding one in F, the head one in B (its input's gradient); the
 * vocabulary-parallel cross-entropy three of N floats in F (max, sum of exponentials,
 * target logit). BW has B's. T must divide the channels, and stage_layers, when given, be a
 * cut of the layers (NULL otherwise, with sp_last_error() saying why). */
typedef struct {
    int layers, channels, context, vocab, batch;
    double device_flops; /* FLOP/s of one device */
    int elem_bytes;      /* bytes per activation element (2 for bf16) */
    int tensor;          /* T ranks per actor; 0 or 1: one */
    /* blocks per stage, nstages counts adding up to layers (the first and the last may be
     * 0: the embedding or the head alone, as the apps' --stage-layers); NULL: even */
    const int *stage_layers;
} sp_gpt_shape;
sp_stage_model *sp_stage_model_gpt(const sp_gpt_shape *g, int nstages);

/* A Llama's stages from its shape (Llama 2's decoder, Hugging Face's LlamaForCausalLM),
 * cut as the GPT's: `layers` blocks over nstages stages (the remainder to the first),
 * stage 0 also the token embedding (V x C; rotary embeddings have no parameters), the
 * last stage the final RMSNorm and the untied head (C x V). A block of C channels, H query
 * heads of hs = C / H, Hkv KV heads (grouped-query attention; Hkv = H: multi-head) and a
 * SwiGLU MLP of I hidden units: RMSNorm (weight C) -> q, k, v without biases (C x (H +
 * 2 Hkv) hs) -> rotary embeddings -> causal attention -> o (C x C) -> residual; RMSNorm ->
 * gate, up (C x I each) -> silu(gate) up -> down (I x C) -> residual. Per microbatch of
 * N = batch x context tokens, with P = 2 N C (2 C + 2 Hkv hs + 3 I) the block's matrix
 * products (2 FLOPs per multiply-add): F = P + 4 N T C, B = P + 8 N T C (input gradients
 * and attention's whole backward), W = P (weight gradients); attention's terms over the
 * query heads' width C, as the GPT's; the head adds 2 N C V to each. Elementwise work
 * (norms, rotations, silu) is not counted. Costs are FLOPs / device_flops; parameters 4
 * bytes each: per block 2 C^2 + 2 C Hkv hs + 3 C I + 2 C. Activations a block keeps for
 * its backward, per token, in elements of elem_bytes: both RMSNorms' inputs and outputs
 * (the outputs are the inputs of q, k, v and of gate, up) 4 C; q, k, v after the rotation
 * C + 2 Hkv hs and attention's output C (attention's scores recomputed by a fused kernel);
 * gate, up and silu(gate) up 3 I. Megatron's count of the GPT's 34 units, with no
 * dropout masks and the normalisations' per-token statistics left out. Boundary tensors
 * N C x elem_bytes.
 *
 * tensor = T > 1: one rank of an actor of T (Megatron's layout): query heads and KV heads
 * split by T (a rank holds Hkv / T KV groups and their query heads), gate and up by
 * columns, down and o by rows, the embedding and the head by vocabulary: every FLOP above,
 * every weight but the RMSNorms', and the activations past the normalisations (2 C +
 * 2 Hkv hs + 3 I per token) divided by T; the RMSNorm weights, their 4 C activations, the
 * residual stream and the boundary tensors whole. The group's all-reduces are the GPT's:
 * per block two of (N, C) in F (o, down) and two in B (the gradients of the inputs of
 * q, k, v and of gate, up), none in W; the embedding one in F, the head one in B, the
 * vocabulary-parallel cross-entropy three of N floats in F; BW has B's.
 * NULL, with sp_last_error() saying why, for a bad shape: a size below 1, C not a
 * multiple of H, an odd head size (rotary embeddings rotate pairs), Hkv not dividing H,
 * T not dividing Hkv, I or V, fewer layers than stages, a stage_layers that is no cut. */
typedef struct {
    int layers, channels, heads, kv_heads, hidden, context, vocab, batch;
    double device_flops; /* FLOP/s of one device */
    int elem_bytes;      /* bytes per activation element (2 for bf16) */
    int tensor;          /* T ranks per actor; 0 or 1: one */
    const int *stage_layers; /* as sp_gpt_shape's */
} sp_llama_shape;
sp_stage_model *sp_stage_model_llama(const sp_llama_shape *l, int nstages);

#ifdef __cplusplus
}
#endif
#endif
