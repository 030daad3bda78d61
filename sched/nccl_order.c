/* The NCCL calls each actor issues for a plan: the plan's point-to-point messages of at
 * least `threshold` bytes, in the plan's global message order, grouped where an actor
 * sends and receives at the same point (no task between them). NCCL's send and receive
 * block on ordered per-pair channels, so the two ends must issue matching calls in the
 * same order; the plan's global order gives that, and a group only relaxes it. */
#include <stdlib.h>

#include "starpipe/plan.h"

sp_status sp_nccl_calls(const sp_plan *plan, int actor, size_t threshold, sp_nccl_call **out,
                        int *n)
{
    *out = NULL;
    *n = 0;
    if (!plan || actor < 0 || actor >= plan->nactors)
        return sp_set_error(SP_ERR_ARG, "sp_nccl_calls: bad plan or actor %d", actor);
    const sp_instr *prog = plan->instr[actor];
    int cap = 0, group = -1, open = 0;
    for (int i = 0; i < plan->ninstr[actor]; i++) {
        const sp_instr *in = &prog[i];
        if (in->op == SP_OP_RUN || in->op == SP_OP_COMBINE || in->op == SP_OP_OPTIMIZER) {
            open = 0; /* compute in between: the next call starts a new group */
            continue;
        }
        /* boundary tensors and their gradients; tied-weight transfers (small, once per
         * step, packed from a slab) stay on StarPU-MPI */
        if ((in->op != SP_OP_SEND && in->op != SP_OP_RECV) || in->bytes < threshold ||
            (in->buf.cls != SP_BUF_EDGE_FWD && in->buf.cls != SP_BUF_EDGE_GRAD))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            sp_nccl_call *c = realloc(*out, (size_t)cap * sizeof *c);
            if (!c) {
                free(*out);
                *out = NULL;
                *n = 0;
                return sp_set_error(SP_ERR_NOMEM, "sp_nccl_calls: out of memory");
            }
            *out = c;
        }
        if (!open) group++;
        open = 1;
        (*out)[(*n)++] = (sp_nccl_call){ .op = in->op, .peer = in->peer, .bytes = in->bytes,
                                         .seq = in->seq, .group = group, .instr = i };
    }
    return SP_OK;
}
