/* Synthetic stage models: a chain of identical stages, for studying schedules without a
 * real graph. */
#include "starpipe/stages.h"

#include <stdlib.h>

sp_stage_model *sp_stage_model_chain(int n, double f, double b, double w, size_t bytes)
{
    if (n < 1) return NULL;
    sp_stage_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->nstages = n;
    m->stage = calloc((size_t)n, sizeof *m->stage);
    m->nedges = n - 1;
    m->edge = n > 1 ? calloc((size_t)(n - 1), sizeof *m->edge) : NULL;
    if (!m->stage || (n > 1 && !m->edge)) {
        sp_stage_model_free(m);
        return NULL;
    }
    for (int s = 0; s < n; s++) {
        sp_stage_info *st = &m->stage[s];
        st->cost[0] = f;
        st->cost[1] = b;
        st->cost[2] = w;
        st->cost[3] = b + w;
        st->act_bytes = 1;
    }
    for (int s = 0; s + 1 < n; s++)
        m->edge[s] = (sp_stage_edge){ .src_stage = s, .dst_stage = s + 1, .bytes = bytes,
                                      .needs_grad = 1 };
    return m;
}

void sp_stage_model_free(sp_stage_model *m)
{
    if (!m) return;
    free(m->stage);
    free(m->edge);
    free(m->shared);
    free(m);
}
