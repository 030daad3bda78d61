/* The stage-program interpreter on a GPU: the same instruction list sp_program_run walks
 * (graph/program.c), each instruction enqueued as the matching CUDA kernel on the task's
 * stream (codelets/cuda/kernels_cuda.h). Nothing here synchronizes: StarPU's CUDA worker
 * waits for the stream when the task ends (STARPU_CUDA_ASYNC). Integer inputs were
 * range-checked on the host before the step (sp_program_check_inputs). */
#include "codelets/cuda/program_cuda.h"

#include "codelets/cuda/kernels_cuda.h"
#include "graph/program_impl.h"

#define F32(l) ((float *)bufs[(l).buf] + (l).off)
#define I32(l) ((int32_t *)bufs[(l).buf] + (l).off)

sp_status sp_program_run_cuda(const sp_program *p, int stage, sp_task_kind kind,
                              void *const *bufs, const sp_run_args *args, void *stream,
                              void *cublas)
{
    const sp_kprog *kp = sp_prog_of(p, stage, kind);
    if (!kp) return sp_set_error(SP_ERR_ARG, "sp_program_run_cuda: no program of stage %d", stage);
    float dloss = args ? args->dloss : 1.0f;
    for (int j = 0; j < kp->nins; j++) {
        const sp_kinstr *I = &kp->ins[j];
        const int64_t *n = I->n;
        int M = (int)n[0], Nc = (int)n[1], K = (int)n[2], rc = 0;
        switch (I->code) {
        case SP_I_MATMUL:
            rc = sp_cuda_matmul_forward(F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), M, Nc, K,
                                        I->flag[0], I->flag[1], I->acc, stream, cublas);
            break;
        case SP_I_BIAS_ADD:
            rc = sp_cuda_bias_add_forward(F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), M, Nc, stream);
            break;
        case SP_I_ADD:
            rc = sp_cuda_add_forward(F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), n[0], stream);
            break;
        case SP_I_SCALE:
            rc = sp_cuda_scale_backward(F32(I->o[0]), F32(I->i[0]), I->f, n[0], I->acc, stream);
            break;
        case SP_I_GELU:
            rc = sp_cuda_gelu_forward(F32(I->o[0]), F32(I->i[0]), n[0], stream);
            break;
        case SP_I_RELU:
            rc = sp_cuda_relu_forward(F32(I->o[0]), F32(I->i[0]), n[0], stream);
            break;
        case SP_I_LAYERNORM: {
            float *aux = F32(I->o[1]);
            rc = sp_cuda_layernorm_forward(F32(I->o[0]), aux, aux + n[0], F32(I->i[0]),
                                           F32(I->i[1]), F32(I->i[2]), M, Nc, stream);
            break;
        }
        case SP_I_EMBED:
            rc = sp_cuda_embed_forward(F32(I->o[0]), I32(I->i[0]), F32(I->i[1]), F32(I->i[2]), M,
                                       Nc, K, stream);
            break;
        case SP_I_ATTENTION:
            rc = sp_cuda_attention_forward(F32(I->o[0]), F32(I->o[1]), F32(I->i[1]),
                                           F32(I->i[0]), M, Nc, K, (int)n[3], stream, cublas);
            break;
        case SP_I_CE: {
            /* scratch: N doubles of per-row losses, then the bad-target count */
            float *scratch = F32(I->i[2]);
            rc = sp_cuda_cross_entropy_forward(F32(I->o[0]), F32(I->o[1]), F32(I->i[0]),
                                               I32(I->i[1]), M, Nc, (int *)(scratch + 2 * n[0]),
                                               scratch, stream);
            break;
        }
        case SP_I_SUM:
            rc = sp_cuda_sum_forward(F32(I->o[0]), F32(I->i[0]), n[0], stream);
            if (!rc && I->f != 1.0f)
                rc = sp_cuda_scale_forward(F32(I->o[0]), F32(I->o[0]), I->f, 1, stream);
            break;
        case SP_I_MATMUL_DA:
            rc = sp_cuda_matmul_backward_a(F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), M, Nc, K,
                                           I->flag[0], I->flag[1], I->acc, stream, cublas);
            break;
        case SP_I_MATMUL_DB:
            rc = sp_cuda_matmul_backward_b(F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), M, Nc, K,
                                           I->flag[0], I->flag[1], I->acc, stream, cublas);
            break;
        case SP_I_BIAS_DB:
            rc = sp_cuda_bias_add_backward_bias(F32(I->o[0]), F32(I->i[0]), M, Nc, I->acc, stream);
            break;
        case SP_I_GELU_DX:
            rc = sp_cuda_gelu_backward(F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), n[0], I->acc,
                                       stream);
            break;
        case SP_I_RELU_DX:
            rc = sp_cuda_relu_backward(F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), n[0], I->acc,
                                       stream);
            break;
        case SP_I_LN_DX: {
            const float *aux = F32(I->i[2]);
            rc = sp_cuda_layernorm_backward_x(F32(I->o[0]), F32(I->i[0]), F32(I->i[1]), aux,
                                              aux + n[0], F32(I->i[3]), M, Nc, I->acc, stream);
            break;
        }
        case SP_I_LN_DP: {
            const float *aux = F32(I->i[2]);
            rc = sp_cuda_layernorm_backward_params(F32(I->o[0]), F32(I->o[1]), F32(I->i[0]),
                                                   F32(I->i[1]), aux, aux + n[0], M, Nc, I->acc,
                                                   stream);
            break;
        }
        case SP_I_EMBED_DP:
            rc = sp_cuda_embed_backward(F32(I->o[0]), F32(I->o[1]), F32(I->i[0]), I32(I->i[1]), M,
                                        Nc, K, stream);
            break;
        case SP_I_ATTN_DX:
            rc = sp_cuda_attention_backward(F32(I->o[0]), F32(I->o[1]), F32(I->i[0]), F32(I->i[1]),
                                            F32(I->i[3]), F32(I->i[2]), M, Nc, K, (int)n[3],
                                            I->acc, stream, cublas);
            break;
        case SP_I_CE_DX:
            rc = sp_cuda_cross_entropy_backward(F32(I->o[0]), F32(I->i[0]), I32(I->i[1]),
                                                F32(I->i[2]), 1.0f, M, Nc, I->acc, stream);
            break;
        case SP_I_SUM_DX:
            rc = sp_cuda_sum_backward(F32(I->o[0]), F32(I->i[0]), I->f, n[0], I->acc, stream);
            break;
        case SP_I_SEED:
            rc = sp_cuda_set_scalar(F32(I->o[0]), dloss, stream);
            break;
        case SP_I_ZERO:
            rc = sp_cuda_fill_zero(F32(I->o[0]), n[0], stream);
            break;
        default:
            return sp_set_error(SP_ERR_ARG, "sp_program_run_cuda: bad instruction %d", I->code);
        }
        if (rc)
            return sp_set_error(SP_ERR_RUNTIME, "stage %d: instruction %d (node %d) failed on "
                                "the GPU: %s", stage, j, I->node, sp_cuda_status_string(rc));
    }
    return SP_OK;
}

sp_status sp_optim_update_cuda(const sp_program *p, int s, float *params, const float *grads,
                               float *m, float *v, const sp_adamw_config *cfg, float grad_scale,
                               int t, void *stream)
{
    const sp_graph *g = p->g;
    for (int k = 0; k < g->n; k++) {
        int64_t a = p->param_off[s][k];
        if (g->node[k].op != SP_OP_PARAM || a < 0 || sp_program_param_owner(p, k) != s) continue;
        float wd = g->node[k].ndim >= 2 ? cfg->weight_decay : 0.0f;
        int rc = sp_cuda_adamw_update(params + a, m + a, v + a, grads + a, g->node[k].numel,
                                      cfg->lr, cfg->beta1, cfg->beta2, cfg->eps, wd, grad_scale,
                                      t, stream);
        if (rc)
            return sp_set_error(SP_ERR_RUNTIME, "AdamW of '%s' failed on the GPU: %s",
                                g->node[k].name, sp_cuda_status_string(rc));
    }
    return SP_OK;
}
