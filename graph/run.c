/* The one interpreter loop every task runs (the reference's and every StarPU task's, on
 * the CPU or a GPU): each instruction's operands resolved and handed to a kernel
 * backend's table (starpipe/backend.h), and the local adds of repeated parameter uses. */
#include "graph/program_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <time.h>

static double sp_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *const icode_names[SP_I_COUNT] = {
    "matmul", "bias_add", "add", "gelu", "relu", "layernorm", "embed", "attention", "ce", "sum",
    "scale", "to_bf16", "matmul_da", "matmul_db", "bias_db", "gelu_dx", "relu_dx", "ln_dx",
    "ln_dparams", "embed_dparams", "attn_dqkv", "ce_dlogits", "sum_dx", "seed", "zero",
    "allreduce", "allreduce_max", "embed_vocab", "add_positions", "vce_max", "vce_exp",
    "vce_loss", "embed_vocab_dwte", "add_positions_dwpe", "rmsnorm", "rms_dx", "rms_dweight",
    "rope", "swiglu", "swiglu_dx", "matmul_bias",
};

#define F32(l) ((float *)bufs[(l).buf] + (l).off)
#define I32(l) ((int32_t *)bufs[(l).buf] + (l).off)
#define U16(l) ((uint16_t *)bufs[(l).buf] + (l).off)
/* input k of a matrix product: bf16 storage or fp32 */
#define OPND(I, k)                                                                          \
    (((I)->half >> (k)) & 1 ? (const void *)U16((I)->i[k]) : (const void *)F32((I)->i[k]))

/* The one place that knows what each instruction's operands and sizes mean: every
 * backend sees only kernel calls. */
static int run_instr(const sp_kinstr *I, void *const *bufs, const sp_run_args *args, int bf16,
                     const sp_backend *be, void *c)
{
    const float dloss = args ? args->dloss : 1.0f;
    const int64_t *n = I->n;
    const int M = (int)n[0], Nc = (int)n[1], K = (int)n[2], acc = I->acc;
    const int prec = bf16 ? SP_PREC_BF16 : 0;
    switch (I->code) {
    case SP_I_MATMUL:
        return be->matmul(c, F32(I->o[0]), OPND(I, 0), OPND(I, 1), M, Nc, K, I->flag[0],
                          I->flag[1], acc,
                          prec | (I->half & 1 ? SP_PREC_A16 : 0) | (I->half & 2 ? SP_PREC_B16 : 0));
    case SP_I_MATMUL_BIAS:
        return be->matmul_bias(c, F32(I->o[0]), OPND(I, 0), OPND(I, 1), F32(I->i[2]), M, Nc, K,
                               I->flag[0], I->flag[1],
                               prec | (I->half & 1 ? SP_PREC_A16 : 0) |
                                   (I->half & 2 ? SP_PREC_B16 : 0));
    case SP_I_BIAS_ADD:
        return be->bias_add(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), M, Nc);
    case SP_I_ADD:
        return be->add(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), n[0]);
    case SP_I_SCALE:
        return be->scale(c, F32(I->o[0]), F32(I->i[0]), I->f, n[0], acc);
    case SP_I_TO_BF16:
        return be->to_bf16(c, U16(I->o[0]), F32(I->i[0]), n[0]);
    case SP_I_GELU:
        return be->gelu(c, F32(I->o[0]), F32(I->i[0]), n[0]);
    case SP_I_RELU:
        return be->relu(c, F32(I->o[0]), F32(I->i[0]), n[0]);
    case SP_I_LAYERNORM: /* aux: mean (N) then rstd (N) */
        return be->layernorm(c, F32(I->o[0]), F32(I->o[1]), F32(I->o[1]) + n[0], F32(I->i[0]),
                             F32(I->i[1]), F32(I->i[2]), M, Nc);
    case SP_I_RMSNORM: /* aux: rstd (N) */
        return be->rmsnorm(c, F32(I->o[0]), F32(I->o[1]), F32(I->i[0]), F32(I->i[1]), M, Nc);
    case SP_I_EMBED:
        return be->embed(c, F32(I->o[0]), I32(I->i[0]), F32(I->i[1]), F32(I->i[2]), M, Nc, K,
                         n[3]);
    case SP_I_ATTENTION:
        return be->attention(c, F32(I->o[0]), F32(I->o[1]), F32(I->i[1]), F32(I->i[0]), M, Nc,
                             K, (int)n[3], (int)n[4], prec);
    case SP_I_ROPE:
        return be->rope(c, F32(I->o[0]), F32(I->i[0]), M, Nc, K, (int)n[3], (int)n[4],
                        I->flag[0], I->f, I->flag[1], acc);
    case SP_I_SWIGLU:
        return be->swiglu(c, F32(I->o[0]), F32(I->i[0]), M, Nc);
    case SP_I_SWIGLU_DX:
        return be->swiglu_dx(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), M, Nc, acc);
    case SP_I_CE:
        return be->cross_entropy(c, F32(I->o[0]), F32(I->o[1]), F32(I->i[0]), I32(I->i[1]), M,
                                 Nc, (int)n[2], F32(I->i[2]));
    case SP_I_SUM: { /* f: 1/n for a mean */
        int rc = be->sum(c, F32(I->o[0]), F32(I->i[0]), n[0]);
        return rc || I->f == 1.0f ? rc : be->scale(c, F32(I->o[0]), F32(I->o[0]), I->f, 1, 0);
    }
    case SP_I_MATMUL_DA:
        return be->matmul_da(c, F32(I->o[0]), F32(I->i[0]), OPND(I, 1), M, Nc, K, I->flag[0],
                             I->flag[1], acc, prec | (I->half & 2 ? SP_PREC_B16 : 0));
    case SP_I_MATMUL_DB:
        return be->matmul_db(c, F32(I->o[0]), F32(I->i[0]), OPND(I, 1), M, Nc, K, I->flag[0],
                             I->flag[1], acc, prec | (I->half & 2 ? SP_PREC_A16 : 0));
    case SP_I_BIAS_DB:
        return be->bias_db(c, F32(I->o[0]), F32(I->i[0]), M, Nc, acc);
    case SP_I_GELU_DX:
        return be->gelu_dx(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), n[0], acc);
    case SP_I_RELU_DX:
        return be->relu_dx(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), n[0], acc);
    case SP_I_LN_DX:
        return be->layernorm_dx(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), F32(I->i[2]),
                                F32(I->i[2]) + n[0], F32(I->i[3]), M, Nc, acc);
    case SP_I_LN_DP:
        return be->layernorm_dparams(c, F32(I->o[0]), F32(I->o[1]), F32(I->i[0]), F32(I->i[1]),
                                     F32(I->i[2]), F32(I->i[2]) + n[0], M, Nc, acc);
    case SP_I_RMS_DX:
        return be->rmsnorm_dx(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), F32(I->i[2]),
                              F32(I->i[3]), M, Nc, acc);
    case SP_I_RMS_DW:
        return be->rmsnorm_dweight(c, F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), F32(I->i[2]), M,
                                   Nc, acc);
    case SP_I_EMBED_DP:
        return be->embed_dparams(c, F32(I->o[0]), F32(I->o[1]), F32(I->i[0]), I32(I->i[1]), M,
                                 Nc, K);
    case SP_I_ATTN_DX:
        return be->attention_dx(c, F32(I->o[0]), F32(I->o[1]), F32(I->i[0]), F32(I->i[1]),
                                F32(I->i[3]), F32(I->i[2]), M, Nc, K, (int)n[3], (int)n[4], acc,
                                prec);
    case SP_I_CE_DX:
        return be->cross_entropy_dx(c, F32(I->o[0]), F32(I->i[0]), I32(I->i[1]), F32(I->i[2]), M,
                                    Nc, acc);
    case SP_I_SUM_DX:
        return be->sum_dx(c, F32(I->o[0]), F32(I->i[0]), I->f, n[0], acc);
    case SP_I_SEED:
        return be->set(c, F32(I->o[0]), dloss);
    case SP_I_ALLREDUCE: /* the group is the caller's (the reference's, MPI, NCCL) */
        return args && args->group ? args->group->allreduce(args->group, F32(I->o[0]),
                                                            F32(I->i[0]), n[0], acc)
                                   : SP_BACKEND_NO_GROUP;
    case SP_I_ALLREDUCE_MAX:
        return args && args->group ? args->group->allreduce_max(args->group, F32(I->o[0]), n[0])
                                   : SP_BACKEND_NO_GROUP;
    case SP_I_EMBED_VOCAB:
        return be->embed_vocab(c, F32(I->o[0]), I32(I->i[0]), F32(I->i[1]), M, Nc, n[2], n[3],
                               n[4]);
    case SP_I_EMBED_VOCAB_DP:
        return be->embed_vocab_dwte(c, F32(I->o[0]), F32(I->i[0]), I32(I->i[1]), M, Nc, n[2],
                                    n[3]);
    case SP_I_ADD_POS: /* per batch row, the positions' add: x[b] + wpe[0:T] */
        for (int64_t b = 0; b < n[0]; b++) {
            int rc = be->add(c, F32(I->o[0]) + b * n[1], F32(I->i[0]) + b * n[1], F32(I->i[1]),
                             n[1]);
            if (rc) return rc;
        }
        return 0;
    case SP_I_ADD_POS_DP: /* dwpe[0:T] += dout[b] for b ascending: sp_embed's order */
        for (int64_t b = 0; b < n[0]; b++) {
            int rc = be->scale(c, F32(I->o[0]), F32(I->i[0]) + b * n[1], 1.0f, n[1], 1);
            if (rc) return rc;
        }
        return 0;
    /* the vocab-parallel cross-entropy; tail: max (N) | sum (N) | target logit (N) |
     * target in the slice (N, i32) (program.c, emit_ce_vocab) */
    case SP_I_VCE_MAX:
        return be->vocab_ce_max(c, F32(I->o[0]), F32(I->i[0]), M, Nc, (int)n[2]);
    case SP_I_VCE_EXP:
        return be->vocab_ce_exp(c, F32(I->o[0]), F32(I->o[1]) + n[0],
                                (int32_t *)(F32(I->o[1]) + 3 * n[0]), F32(I->i[0]),
                                I32(I->i[1]), F32(I->o[1]), M, Nc, n[2], n[3]);
    case SP_I_VCE_LOSS:
        return be->vocab_ce_loss(c, F32(I->o[0]), F32(I->o[1]), F32(I->i[0]),
                                 F32(I->i[0]) + n[0], M, Nc);
    case SP_I_ZERO:
        return be->zero(c, F32(I->o[0]), n[0]);
    default: /* SP_I_COUNT: refused by the caller */
        return 0;
    }
}

/* What an instruction's time grows with (sp_op_desc.work): FLOPs of products and
 * attention, floats read plus written by the rest. Only ratios within one kernel matter. */
static double work_of(const sp_kinstr *I)
{
    const int64_t *n = I->n;
    double mn = (double)n[0] * (double)n[1];
    switch (I->code) {
    case SP_I_MATMUL: case SP_I_MATMUL_DA: case SP_I_MATMUL_DB:
    case SP_I_MATMUL_BIAS: /* (the bias rides on the product's stores) */
        return 2.0 * mn * (double)n[2];
    case SP_I_ATTENTION: return 2.0 * mn * (double)n[1] * (double)n[2];
    case SP_I_ATTN_DX: return 4.0 * mn * (double)n[1] * (double)n[2];
    case SP_I_EMBED: case SP_I_EMBED_DP: case SP_I_ROPE: return 2.0 * mn * (double)n[2];
    case SP_I_ADD: case SP_I_GELU_DX: case SP_I_RELU_DX: return 3.0 * (double)n[0];
    case SP_I_SCALE: case SP_I_GELU: case SP_I_RELU: case SP_I_ALLREDUCE:
        return 2.0 * (double)n[0];
    case SP_I_TO_BF16: return 1.5 * (double)n[0];
    case SP_I_SUM: case SP_I_SUM_DX: case SP_I_ZERO: case SP_I_ALLREDUCE_MAX:
        return (double)n[0];
    case SP_I_SEED: return 1.0;
    case SP_I_ADD_POS: return 3.0 * mn;
    case SP_I_BIAS_DB: case SP_I_VCE_MAX: return mn;
    case SP_I_SWIGLU: return 3.0 * mn;
    case SP_I_SWIGLU_DX: return 5.0 * mn;
    case SP_I_LN_DX: case SP_I_RMS_DX: return 3.0 * mn;
    default: /* bias_add, norms, embeddings by vocabulary, cross-entropies: in and out */
        return 2.0 * mn;
    }
}

int sp_program_op(const sp_program *p, int stage, sp_task_kind kind, int j, sp_op_desc *d)
{
    const sp_kprog *kp = p && d ? sp_prog_of(p, stage, kind) : NULL;
    if (!kp || j < 0 || j >= kp->nins || (unsigned)kp->ins[j].code >= SP_I_COUNT) return -1;
    const sp_kinstr *I = &kp->ins[j];
    d->kernel = icode_names[I->code];
    for (int k = 0; k < 5; k++) d->n[k] = I->n[k];
    d->flag[0] = I->flag[0], d->flag[1] = I->flag[1];
    d->half = I->half;
    d->work = work_of(I);
    return 0;
}

const char *sp_icode_name(sp_icode code)
{
    return (unsigned)code < SP_I_COUNT ? icode_names[code] : "?";
}

sp_status sp_program_run_on(const sp_program *p, int stage, sp_task_kind kind, void *const *bufs,
                            const sp_run_args *args, const sp_backend *be, void *ctx)
{
    const sp_kprog *kp = sp_prog_of(p, stage, kind);
    if (!kp) return sp_set_error(SP_ERR_ARG, "sp_program_run (%s): no program %s of stage %d",
                                 be->name, sp_task_kind_name(kind), stage);
    sp_status st = SP_OK;
    int meet_only = args && args->meet_only;
    for (int j = 0; j < kp->nins; j++) {
        const sp_kinstr *I = &kp->ins[j];
        if ((unsigned)I->code >= SP_I_COUNT)
            return sp_set_error(SP_ERR_ARG, "sp_program_run: bad instruction %d", I->code);
        if (meet_only) { /* the group's members wait for this one: meet them, ignore it */
            if (I->code == SP_I_ALLREDUCE && args->group)
                args->group->allreduce(args->group, F32(I->o[0]), F32(I->o[0]), I->n[0], 0);
            if (I->code == SP_I_ALLREDUCE_MAX && args->group)
                args->group->allreduce_max(args->group, F32(I->o[0]), I->n[0]);
            continue;
        }
        double t0 = args && args->op_seconds ? sp_now_s() : 0;
        int rc = run_instr(I, bufs, args, p->precision == SP_PRECISION_BF16, be, ctx);
        if (args && args->op_seconds) args->op_seconds[j] += sp_now_s() - t0;
        if (rc) {
            st = sp_set_error(rc == SP_BACKEND_BAD_INDEX ? SP_ERR_ARG : SP_ERR_RUNTIME,
                              "stage %d %s, instruction %d (%s, node %d) failed on %s: %s",
                              stage, sp_task_kind_name(kind), j, sp_icode_name(I->code), I->node,
                              be->name, rc == SP_BACKEND_NO_GROUP
                                            ? "a tensor-parallel program run without its group"
                                        : (I->code == SP_I_ALLREDUCE ||
                                           I->code == SP_I_ALLREDUCE_MAX) &&
                                                  args->group->status_string
                                            ? args->group->status_string(args->group, rc)
                                            : be->status_string(rc));
            meet_only = args && args->group; /* the rest: only meet the group */
            if (!meet_only) return st;
        }
    }
    return st;
}

sp_status sp_program_run(const sp_program *p, int stage, sp_task_kind kind, void *const *bufs,
                         const sp_run_args *args)
{
    return sp_program_run_on(p, stage, kind, bufs, args, sp_backend_cpu(), NULL);
}

sp_status sp_program_local_add_run_on(const sp_program *p, int stage, float *grads,
                                       const sp_backend *be, void *ctx)
{
    for (int j = 0; j < p->nlocal[stage]; j++) {
        const int64_t *e = &p->local[stage][3 * j];
        int rc = be->scale(ctx, grads + e[0], grads + e[1], 1.0f, e[2], 1); /* += 1 x: exact */
        if (rc)
            return sp_set_error(SP_ERR_RUNTIME, "stage %d: local add %d of %" PRId64 " floats "
                                "failed on %s: %s", stage, j, e[2], be->name,
                                be->status_string(rc));
    }
    return SP_OK;
}

void sp_program_local_add_run(const sp_program *p, int stage, float *grads)
{
    sp_program_local_add_run_on(p, stage, grads, sp_backend_cpu(), NULL); /* cannot fail */
}
