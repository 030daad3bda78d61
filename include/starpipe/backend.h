/* Kernel backends: the table of kernel entry points that stage programs and AdamW run on.
 * One interpreter (sp_program_run_on, sp_optim_update_range_on) knows what every
 * instruction means and where its operands are; a backend only knows how to run one
 * kernel on its own memory: the CPU's (sp_backend_cpu, host memory, codelets/cpu) or
 * a GPU's (codelets/cuda: device memory, a stream). So adding a backend never touches
 * the instruction lists, and the backends cannot drift apart in what they compute.
 *
 * Every entry takes the backend's state first (ctx: NULL for the CPU, a stream and a
 * cuBLAS handle for CUDA) and returns 0 or a backend code, named by status_string.
 * Arguments are those of codelets/cpu/kernels.h (read it for shapes, the size letters
 * and the acc rule), on pointers into the backend's memory; scalars that a kernel
 * produces or reads from another kernel stay there too (see cross_entropy_dx, sum_dx).
 * Every entry is required. */
#ifndef STARPIPE_BACKEND_H
#define STARPIPE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The one code shared by all backends: an index input (a token, a class target) outside
 * [0, V). It is the caller's error (SP_ERR_ARG), where any other code is the backend's
 * failure (SP_ERR_RUNTIME). A backend that cannot check cheaply (a GPU) relies on
 * sp_program_check_inputs, which runs on the host before any task. */
#define SP_BACKEND_BAD_INDEX (-2)
/* A tensor-parallel program (an all-reduce over its group) run with no group given. */
#define SP_BACKEND_NO_GROUP (-4)

/* The `prec` of the matrix products. SP_PREC_BF16: both operands rounded to bfloat16
 * (round to nearest even, NaN kept quiet), products accumulated in fp32, as tensor cores
 * do (sp_program_set_precision). With it, SP_PREC_A16 / SP_PREC_B16: operand a / b is
 * given already in bfloat16 (uint16_t, the upper half of the fp32 value, as to_bf16
 * writes it) and is read as it is: rounding it again would change nothing, so the
 * product has the bits it has from the fp32 operand. */
#define SP_PREC_BF16 1
#define SP_PREC_A16 2
#define SP_PREC_B16 4

typedef struct sp_backend {
    const char *name; /* "cpu", "cuda": for messages */
    /* forward. The three matrix products take prec (SP_PREC_*): 0 is fp32 throughout. */
    int (*matmul)(void *ctx, float *out, const void *a, const void *b, int M, int Nc, int K,
                  int ta, int tb, int acc, int prec);
    /* out = matmul (acc 0) then + bias (Nc) on each row, with the bits of matmul and then
     * bias_add: a linear layer's forward without a pass over its product (the CPU adds
     * the bias as each tile is stored) */
    int (*matmul_bias)(void *ctx, float *out, const void *a, const void *b, const float *bias,
                       int M, int Nc, int K, int ta, int tb, int prec);
    int (*bias_add)(void *ctx, float *out, const float *x, const float *bias, int N, int C);
    int (*add)(void *ctx, float *out, const float *a, const float *b, int64_t n);
    /* out (n) = b > a ? b : a, in place as out == a: the tensor group's maximum rule
     * (program.h, allreduce_max), for a group that gathers its members' values on the
     * device and takes their maximum there, member by member in rank order */
    int (*maximum)(void *ctx, float *out, const float *a, const float *b, int64_t n);
    /* out = s * x, += with acc (the CPU's sp_scale_backward); may run in place */
    int (*scale)(void *ctx, float *out, const float *x, float s, int64_t n, int acc);
    int (*gelu)(void *ctx, float *out, const float *x, int64_t n);
    int (*relu)(void *ctx, float *out, const float *x, int64_t n);
    int (*layernorm)(void *ctx, float *out, float *mean, float *rstd, const float *x,
                     const float *gamma, const float *beta, int N, int C);
    /* RMSNorm (eps 1e-5, Llama's): out = x rstd weight, saving rstd (N) */
    int (*rmsnorm)(void *ctx, float *out, float *rstd, const float *x, const float *weight,
                   int N, int C);
    /* rotary embeddings (sp_rope_forward's arguments): out (B,T,D) = x with heads j,
     * j % period < rotated, turned by position; inverse: the transpose, += with acc (the
     * backward). The others are copied. */
    int (*rope)(void *ctx, float *out, const float *x, int B, int T, int D, int hs, int period,
                int rotated, float theta, int inverse, int acc);
    /* SwiGLU's gate: x (N, 2I) = [a | b] per row, out (N, I) = silu(a) b */
    int (*swiglu)(void *ctx, float *out, const float *x, int N, int I);
    /* V: the vocabulary, for the token check (SP_BACKEND_BAD_INDEX) */
    int (*embed)(void *ctx, float *out, const int32_t *tokens, const float *wte,
                 const float *wpe, int B, int T, int C, int64_t V);
    /* attention and attention_dx take prec too: SP_PREC_BF16 is bf16 attention
     * (codelets/cpu/kernels.h: its rounding points); A16 / B16 never occur. group: qkv's
     * layout (sp_attention_gqa_forward): 0 GPT's [q | k | v], G >= 1 grouped-query, NH/G
     * KV heads each after its G query heads. */
    int (*attention)(void *ctx, float *out, float *lse, float *scratch, const float *qkv,
                     int B, int T, int C, int NH, int group, int prec);
    /* logits (N,V) whose first `valid` columns are the tokens, the rest a padded
     * vocabulary's padding (probability 0, so cross_entropy_dx gives them 0); targets in
     * [0,valid). scratch: 2N + 2 floats, contents undefined (a GPU's per-row losses and
     * bad count) */
    int (*cross_entropy)(void *ctx, float *loss, float *probs, const float *logits,
                         const int32_t *targets, int N, int V, int valid, float *scratch);
    int (*sum)(void *ctx, float *out, const float *x, int64_t n);
    /* The vocab-parallel embedding (graph.h, sp_embed_vocab): out (N,C) = wte[token - lo]
     * where lo <= token < lo + rows, else 0; wte the rank's rows (rows,C); V the whole
     * vocabulary, for the token check (SP_BACKEND_BAD_INDEX) */
    int (*embed_vocab)(void *ctx, float *out, const int32_t *tokens, const float *wte, int N,
                       int C, int64_t lo, int64_t rows, int64_t V);
    /* The vocab-parallel cross-entropy (sp_cross_entropy_vocab): three kernels around the
     * group's all-reduces, which the interpreter runs between them. logits (N,V) are this
     * rank's slice of the vocabulary, whose first column is lo; Vall the tokens of the
     * whole one: columns from Vall on are padding and take no part.
     * vocab_ce_max: rowmax (N) = each row's maximum over the slice's first `valid`
     *   columns (its tokens; -inf for none).
     * vocab_ce_exp (rowmax now the group's): exps (N,V) = exp(logit - rowmax) (0 on
     *   padding); stats (2N)
     *   = each row's sum of them, then its target's logit where lo <= target < lo + V,
     *   else 0; ltargets (N) = target - lo there, else -1 (cross_entropy_dx's targets). A
     *   target outside [0,Vall): SP_BACKEND_BAD_INDEX on the CPU; a GPU makes its target
     *   logit NaN, and so the loss.
     * vocab_ce_loss (stats now the group's sums): exps /= the row's sum (the softmax over
     *   the whole vocabulary, on the slice); *loss = the mean over the rows of log(sum) +
     *   max - target logit, summed in double. */
    int (*vocab_ce_max)(void *ctx, float *rowmax, const float *logits, int N, int V, int valid);
    int (*vocab_ce_exp)(void *ctx, float *exps, float *stats, int32_t *ltargets,
                        const float *logits, const int32_t *targets, const float *rowmax, int N,
                        int V, int64_t lo, int64_t Vall);
    int (*vocab_ce_loss)(void *ctx, float *loss, float *exps, const float *rowmax,
                         const float *stats, int N, int V);
    /* backward */
    /* dout is fp32; the other operand may be stored bf16 (SP_PREC_B16 for matmul_da's b,
     * SP_PREC_A16 for matmul_db's a) */
    int (*matmul_da)(void *ctx, float *da, const float *dout, const void *b, int M, int Nc,
                     int K, int ta, int tb, int acc, int prec);
    int (*matmul_db)(void *ctx, float *db, const float *dout, const void *a, int M, int Nc,
                     int K, int ta, int tb, int acc, int prec);
    int (*bias_db)(void *ctx, float *dbias, const float *dout, int N, int C, int acc);
    int (*gelu_dx)(void *ctx, float *dx, const float *x, const float *dout, int64_t n, int acc);
    int (*relu_dx)(void *ctx, float *dx, const float *x, const float *dout, int64_t n, int acc);
    int (*layernorm_dx)(void *ctx, float *dx, const float *dout, const float *x,
                        const float *mean, const float *rstd, const float *gamma, int N, int C,
                        int acc);
    int (*layernorm_dparams)(void *ctx, float *dgamma, float *dbeta, const float *dout,
                             const float *x, const float *mean, const float *rstd, int N, int C,
                             int acc);
    int (*rmsnorm_dx)(void *ctx, float *dx, const float *dout, const float *x,
                      const float *rstd, const float *weight, int N, int C, int acc);
    int (*rmsnorm_dweight)(void *ctx, float *dweight, const float *dout, const float *x,
                           const float *rstd, int N, int C, int acc);
    /* dwte (rows,C) += dout (N,C) by token, for the rows [lo, lo + rows) it holds, in
     * token order (embed_dparams's) */
    int (*embed_vocab_dwte)(void *ctx, float *dwte, const float *dout, const int32_t *tokens,
                            int N, int C, int64_t lo, int64_t rows);
    int (*embed_dparams)(void *ctx, float *dwte, float *dwpe, const float *dout,
                         const int32_t *tokens, int B, int T, int C);
    int (*attention_dx)(void *ctx, float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *out, const float *lse, int B, int T,
                        int C, int NH, int group, int acc, int prec);
    /* dx (N, 2I) from x and dout (N, I): SwiGLU's backward, += with acc */
    int (*swiglu_dx)(void *ctx, float *dx, const float *x, const float *dout, int N, int I,
                     int acc);
    /* *dloss: the upstream gradient, one float in the backend's memory */
    int (*cross_entropy_dx)(void *ctx, float *dlogits, const float *probs,
                            const int32_t *targets, const float *dloss, int N, int V, int acc);
    /* dx (n) = s * *dout broadcast; *dout in the backend's memory */
    int (*sum_dx)(void *ctx, float *dx, const float *dout, float s, int64_t n, int acc);
    /* *x = value (value on the host): the loss seed */
    int (*set)(void *ctx, float *x, float value);
    int (*zero)(void *ctx, float *x, int64_t n);
    /* out (n bfloat16 values) = x rounded as SP_PREC_BF16 rounds an operand: an activation
     * stored for a later product */
    int (*to_bf16)(void *ctx, uint16_t *out, const float *x, int64_t n);
    /* the optimizer (codelets/cpu/kernels.h: sp_adamw_update) */
    int (*adamw)(void *ctx, float *param, float *m, float *v, const float *grad, int64_t n,
                 float lr, float beta1, float beta2, float eps, float weight_decay,
                 float grad_scale, int t);
    /* *out (one double in the backend's memory) = the sum of squares of x, in double: the
     * global norm's per-parameter terms */
    int (*sum_squares)(void *ctx, double *out, const float *x, int64_t n);
    /* the trainer's helpers: out (n) = x bitwise (a parameter or gradient moved between
     * buffers); dst (n) = ((x0 + x1) + x2) + ... over R replicas in replica order, x_own
     * dst's own values and others[] the R - 1 others' (sp_reduce_replicas) */
    int (*copy)(void *ctx, float *out, const float *x, int64_t n);
    int (*reduce_replicas)(void *ctx, float *dst, const float *const *others, int R, int own,
                           int64_t n);
    /* A name for a code an entry returned. Never NULL. */
    const char *(*status_string)(int code);
} sp_backend;

/* The initializer of every kernel entry, for a backend that names each of its functions
 * after the field: `{ .name = "x", SP_BACKEND_ENTRIES, .status_string = f }`. A function
 * left out then fails to compile instead of leaving a NULL entry. */
#define SP_BACKEND_ENTRIES                                                                  \
    .matmul = matmul, .matmul_bias = matmul_bias, .bias_add = bias_add, .add = add,       \
    .scale = scale, .gelu = gelu,                                                          \
    .relu = relu, .layernorm = layernorm, .embed = embed, .attention = attention,          \
    .cross_entropy = cross_entropy, .sum = sum, .matmul_da = matmul_da,                    \
    .matmul_db = matmul_db, .bias_db = bias_db, .gelu_dx = gelu_dx, .relu_dx = relu_dx,    \
    .layernorm_dx = layernorm_dx, .layernorm_dparams = layernorm_dparams,                  \
    .embed_dparams = embed_dparams, .attention_dx = attention_dx,                          \
    .cross_entropy_dx = cross_entropy_dx, .sum_dx = sum_dx, .set = set, .zero = zero,      \
    .to_bf16 = to_bf16, .adamw = adamw, .sum_squares = sum_squares, .copy = copy,          \
    .reduce_replicas = reduce_replicas, .embed_vocab = embed_vocab,                        \
    .embed_vocab_dwte = embed_vocab_dwte, .vocab_ce_max = vocab_ce_max,                    \
    .vocab_ce_exp = vocab_ce_exp, .vocab_ce_loss = vocab_ce_loss, .maximum = maximum,      \
    .rmsnorm = rmsnorm, .rmsnorm_dx = rmsnorm_dx, .rmsnorm_dweight = rmsnorm_dweight,       \
    .rope = rope, .swiglu = swiglu, .swiglu_dx = swiglu_dx

/* The CPU kernels (codelets/cpu) on host memory; ctx is unused (pass NULL). What
 * sp_program_run and sp_optim_update run on. */
const sp_backend *sp_backend_cpu(void);

/* The device a task runs on, as the executor hands it to every task function: the kernel
 * table of the worker's device and that table's state. A task function is written once
 * against it (codelets/tasks.h); a new device is one table (a folder of kernels) and one
 * case in the executor. */
typedef enum { SP_DEVICE_CPU = 0, SP_DEVICE_CUDA = 1 } sp_device_type;
typedef struct sp_device {
    sp_device_type type;
    const sp_backend *be;
    void *ctx;    /* be's state: NULL on the CPU, the worker's stream and cuBLAS handle on
                     CUDA (codelets/cuda/backend.h) */
    void *stream; /* CUDA: the worker's cudaStream_t, for what runs beside the table (NCCL);
                     NULL on the CPU */
    /* tensor parallelism: the task's group (program.h), NULL without one; meet_only: the
     * step has failed already, the task only meets its group (sp_run_args.meet_only) */
    struct sp_tp_group *group;
    int meet_only;
} sp_device;
/* A task's work, written once for every device: dev is the worker's, bufs[i] points to
 * counts[i] elements of buffer i in the device's memory (launch asynchronously on a GPU's
 * stream), args is the task's argument struct. Returns 0, or a non-zero code that fails
 * the task. The executor runs these (include/starpipe/exec.h); the trainer's are
 * codelets/tasks.h. */
typedef int (*sp_task_fn)(const sp_device *dev, void *const *bufs, const size_t *counts,
                          int nbufs, const void *args);

/* The CPU's: sp_backend_cpu() with no state. */
static inline sp_device sp_device_cpu(void)
{
    sp_device d = { SP_DEVICE_CPU, sp_backend_cpu(), NULL, NULL, NULL, 0 };
    return d;
}

#ifdef __cplusplus
}
#endif
#endif
