/* Stage programs: a graph cut at its sp_pipeline_yield markers and differentiated, as
 * the units the planner schedules and the runtime runs as one task each.
 *
 * For every stage s there are four programs: F (forward), B (the backward ops needed for
 * the gradients handed to earlier stages), W (the rest of the backward: parameter
 * gradients and whatever only they need) and BW (B and W fused, in plain reverse order).
 * Running B then W gives bitwise the same buffers as BW.
 *
 * A program reads and writes a short list of buffers, each a contiguous slab of one
 * class (see sp_buf_class); the same buffer of a microbatch is shared by the F, B and W
 * of its stage. A runtime maps each (class, index, microbatch) to storage and passes
 * the pointers in the program's order to sp_program_run. */
#ifndef STARPIPE_PROGRAM_H
#define STARPIPE_PROGRAM_H

#include <stddef.h>
#include <stdint.h>

#include "starpipe/backend.h"
#include "starpipe/graph.h"
#include "starpipe/stages.h"
#include "starpipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif


typedef struct {
    sp_buf_class cls;
    int index;
    size_t bytes;
    sp_access_mode mode;
} sp_slab_ref;

typedef struct sp_program sp_program;

/* Cuts and differentiates g. Fails with a message if the graph has no loss, a stage
 * without ops, or an op of stage s that reads a tensor of a later stage. */
sp_program *sp_program_build(const sp_graph *g, sp_status *status);
void sp_program_free(sp_program *p);

/* The precision of the matrix products (linear layers, forward and both backward
 * products): fp32, or bf16 mixed precision, where both operands are rounded to bfloat16
 * (round to nearest even) and the products accumulate in fp32, as tensor cores do.
 * Master weights, gradients, AdamW state, attention, LayerNorm, softmax and the loss stay
 * fp32. Deterministic on the CPU (the reference a GPU's bf16 run is compared with); set
 * it before creating a trainer or a reference. */
typedef enum { SP_PRECISION_FP32 = 0, SP_PRECISION_BF16 = 1 } sp_precision;
sp_status sp_program_set_precision(sp_program *p, sp_precision precision);
sp_precision sp_program_precision(const sp_program *p);
const char *sp_precision_name(sp_precision precision);

/* Under bf16 precision (on = 1), ACT stores as bfloat16 every value that nothing but
 * matrix products read (in a GPT block the LayerNorm outputs and the GELU output; not the
 * attention output, which its backward reads in fp32): the products round it to bf16
 * anyway, so each such value takes 2 bytes instead of 4 and every result keeps its bits.
 * F computes the value in fp32 into SCRATCH and stores it rounded. Off by default, and
 * without effect under fp32: the reference interpreter keeps every activation in fp32,
 * so comparing a run with it checks this storage. Set before planning, like the
 * precision (the two may come in either order). */
sp_status sp_program_set_bf16_activations(sp_program *p, int on);

/* Activation recomputation for stage s (-1: every stage): the stage keeps only its inputs
 * between F and B and runs its forward again inside its first backward task (stages.h,
 * sp_stage_info.recompute). The same bits as without it (the same forward, run twice),
 * less activation memory, one more forward of compute. Set before planning. */
void sp_program_set_recompute(sp_program *p, int stage, int on);

const sp_graph *sp_program_graph(const sp_program *p);
int sp_program_num_stages(const sp_program *p);

/* The sizes and edges the planner needs. Costs are FLOP counts (an F of 2 GFLOP costs
 * 2e9); divide by a measured rate for seconds. Owned by p. */
const sp_stage_model *sp_program_stage_model(const sp_program *p);

/* Edge e of the stage model (its EDGE_FWD and EDGE_GRAD buffers): bit 0 when every
 * value it carries is whole and alike on each member of the tensor group, bit 1 when
 * every gradient is (sp_graph_replicated); 3 at T = 1. Such a buffer may cross between
 * hosts as 1/T per member and be all-gathered by the receiving group. -1: no edge e or
 * out of memory. */
int sp_program_edge_replicated(const sp_program *p, int e);

/* The buffers program (stage, kind) takes, in the order sp_program_run wants them. */
int sp_program_num_bufs(const sp_program *p, int stage, sp_task_kind kind);
sp_slab_ref sp_program_buf(const sp_program *p, int stage, sp_task_kind kind, int j);
/* Bytes of a buffer class and index (the same for every microbatch). */
size_t sp_program_buf_bytes(const sp_program *p, sp_buf_class cls, int index);
/* Number of ops of a program (0: the task has nothing to do, e.g. B of stage 0). */
int sp_program_num_ops(const sp_program *p, int stage, sp_task_kind kind);
/* FLOPs of one run of a program. */
double sp_program_flops(const sp_program *p, int stage, sp_task_kind kind);
/* The largest tensor-group all-reduce (floats) of any of the stage's programs: what a
 * group's member keeps room for (0: none). */
int64_t sp_program_group_floats(const sp_program *p, int stage);

/* Instruction j of program (stage, kind) as a cost model sees it: its kernel ("matmul",
 * "attention", "allreduce", ...), its sizes (meaning per kernel: a product's M, N, K),
 * transposes, bf16 operands, and `work`, the quantity its time grows with: FLOPs of a
 * product (2 M N K) or of attention (2 B T^2 C), floats moved for everything else
 * (elementwise ops, norms, copies, all-reduces: their input plus output elements).
 * Two instructions with the same kernel, sizes and flags do the same work at the same
 * speed; across sizes the calibration scales a measured time by `work`. 0, or -1 for j
 * out of range. */
typedef struct {
    const char *kernel;
    int64_t n[5];
    int flag[2];
    int half;
    double work;
} sp_op_desc;
int sp_program_op(const sp_program *p, int stage, sp_task_kind kind, int j, sp_op_desc *d);

/* Graph inputs, numbered as SP_BUF_INPUT indexes. */
int sp_program_num_inputs(const sp_program *p);
sp_tensor sp_program_input(const sp_program *p, int k);

/* Checks every integer input of m microbatches (inputs[i * ninputs + k]) against the
 * range its ops accept (token ids and class targets in [0, V)): an error names the
 * input, the microbatch, the position and the value. Runs before any task, so a bad
 * batch fails the step on every rank alike and no kernel ever sees a bad index. */
sp_status sp_program_check_inputs(const sp_program *p, const void *const *inputs, int m);

/* A parameter used more than once in a stage (a tied weight in a one-stage model) has
 * one gradient accumulator per use; after the microbatch loop the later ones are added
 * into the first, in use order, so that cutting a model into stages never changes its
 * bits. The adds of a stage: *adds holds (dst, src, floats) triples of GRADS offsets.
 * Returns their count (0 for most stages). */
int sp_program_local_adds(const sp_program *p, int stage, const int64_t **adds);
/* Performs them on a stage's GRADS slab; _on: on any kernel backend (its scale, += 1 x,
 * which is exact), failing with a message when a kernel does. */
void sp_program_local_add_run(const sp_program *p, int stage, float *grads);
sp_status sp_program_local_add_run_on(const sp_program *p, int stage, float *grads,
                                       const sp_backend *be, void *ctx);

/* Where parameter `param` lives in SP_BUF_PARAMS/GRADS of `stage`: its float offset, or
 * -1 when the stage does not use it. A parameter used by several stages has a copy in
 * each; its owner is the lowest of them. */
int64_t sp_program_param_offset(const sp_program *p, int stage, sp_tensor param);
int sp_program_param_owner(const sp_program *p, sp_tensor param);
/* Floats of the parameters stage `stage` owns: what its AdamW updates (its PARAMS slab
 * less the copies of parameters an earlier stage owns). */
int64_t sp_program_owned_floats(const sp_program *p, int stage);

/* Runs one program on buffers given in sp_program_buf order. dloss is the gradient that
 * seeds the backward at the loss (1/m to average m microbatches). Returns SP_OK, or an
 * error naming the op (an out-of-range token, say). */
/* A tensor group (starpipe/graph.h, tensor parallelism) as a program sees it: allreduce
 * sets dst (acc: adds into it) to the sum of every member's src, n floats, in the group's
 * one order ((src_0 + src_1) + src_2) + ... in float32; dst may be src. allreduce_max
 * sets x (n floats, in place) to the elementwise maximum of every member's x, taken in
 * the same rank order with the CPU cross-entropy's rule (m = x_r > m ? x_r : m), which is
 * exact whatever the order (a NaN of member 0 stays, a later one is passed over): the
 * row maxima of the vocab-parallel cross-entropy. Every entry is required. Returns 0 or
 * a code its status_string names. The reference's in-process group is sp_tp_local
 * (starpipe/reference.h); the runtime's go over MPI or NCCL. */
typedef struct sp_tp_group sp_tp_group;
struct sp_tp_group {
    int (*allreduce)(sp_tp_group *g, float *dst, const float *src, int64_t n, int acc);
    int (*allreduce_max)(sp_tp_group *g, float *x, int64_t n);
    /* x (n doubles, host memory) becomes the sum of every member's x, in rank order: the
     * gradient norm's terms of split parameters (sp_optim_group_sumsq) */
    int (*sum_f64)(sp_tp_group *g, double *x, int64_t n);
    /* x (n floats): every member's chunk (sp_tp_chunk) from that member into every
     * member's x, exactly (a copy): what a boundary tensor sent as 1/T per member becomes
     * whole again with (scatter-gather between hosts) */
    int (*allgather)(sp_tp_group *g, float *x, int64_t n);
    const char *(*status_string)(sp_tp_group *g, int code);
    /* tests (STARPIPE_FAULT=group@STEP:RANK): the next allreduce or allreduce_max fails on
     * this member alone, after taking part in all of its exchanges; then cleared */
    int fail_next;
};
/* Member q's chunk of n floats in a group of T: [sp_tp_chunk(n, T, q), sp_tp_chunk(n, T,
 * q + 1)), the chunks of a reduce-scatter and of an all-gather alike. */
static inline int64_t sp_tp_chunk(int64_t n, int T, int q) { return n * q / T; }

typedef struct {
    float dloss;
    sp_tp_group *group; /* the rank's tensor group: needed by programs of T > 1 */
    /* 1: run only the all-reduces, on whatever the buffers hold, results unused: a task
     * of a failed step still meets its group, so that no member waits for it forever.
     * A program whose kernel fails does the same for the rest of its all-reduces. */
    int meet_only;
    /* NULL, or one double per instruction of the program (sp_program_num_ops): each gets
     * its instruction's wall seconds added. For a synchronous backend (the CPU); a GPU's
     * kernels return at launch. The profile's op times (docs/planner.md, calibration). */
    double *op_seconds;
} sp_run_args;
sp_status sp_program_run(const sp_program *p, int stage, sp_task_kind kind, void *const *bufs,
                         const sp_run_args *args);
/* The same on any kernel backend (starpipe/backend.h), bufs in its memory, ctx its state:
 * sp_program_run is this with sp_backend_cpu(). A failed kernel fails the run with a
 * message naming the instruction, its node and the backend's status. */
sp_status sp_program_run_on(const sp_program *p, int stage, sp_task_kind kind,
                            void *const *bufs, const sp_run_args *args, const sp_backend *be,
                            void *ctx);

/* A readable listing of every stage program (ops, buffers, sizes). */
void sp_program_print(const sp_program *p, void *FILE_stream);


#ifdef __cplusplus
}
#endif
#endif
