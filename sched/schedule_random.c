/* Random valid schedules, for stress tests of the runtime: every actor's list is cut
 * from one random topological order of the unrolled task graph, so the result is valid
 * by construction (docs/planner.md, section 3), and any valid schedule can come out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/plan.h"

typedef struct {
    uint64_t s;
} rng;

static uint64_t next(rng *g)
{
    uint64_t z = (g->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int below(rng *g, int n) { return (int)(next(g) % (uint64_t)n); }

/* Task index: kind-major over (mb, stage). */
static int tix(int k, int i, int s, int m, int S) { return (k * m + i) * S + s; }

sp_status sp_schedule_random(const sp_stage_model *model, int p, int m, uint64_t seed,
                             sp_schedule **out)
{
    *out = NULL;
    if (!model || p < 1 || m < 1)
        return sp_set_error(SP_ERR_ARG, "sp_schedule_random: need a model, p >= 1, m >= 1");
    int S = model->nstages, n = 4 * m * S;
    rng g = { seed };
    sp_schedule *sch = sp_schedule_create(p, S, m);
    char *present = calloc((size_t)n, 1);
    int *indeg = calloc((size_t)n, sizeof(int)), *ready = malloc((size_t)n * sizeof(int));
    int *perm = malloc((size_t)S * sizeof(int));
    if (!sch || !present || !indeg || !ready || !perm) {
        sp_schedule_free(sch), free(present), free(indeg), free(ready), free(perm);
        return sp_set_error(SP_ERR_NOMEM, "sp_schedule_random: out of memory");
    }
    snprintf(sch->name, sizeof sch->name, "random-%llu", (unsigned long long)seed);
    /* placement: a random permutation dealt round-robin, so every actor gets a stage
     * when S >= p */
    for (int s = 0; s < S; s++) perm[s] = s;
    for (int s = S - 1; s > 0; s--) {
        int j = below(&g, s + 1), t = perm[s];
        perm[s] = perm[j], perm[j] = t;
    }
    for (int s = 0; s < S; s++) sch->stage_actor[perm[s]] = s % p;
    for (int i = 0; i < m; i++)
        for (int s = 0; s < S; s++) {
            present[tix(SP_TASK_F, i, s, m, S)] = 1;
            if (below(&g, 2)) present[tix(SP_TASK_BW, i, s, m, S)] = 1;
            else present[tix(SP_TASK_B, i, s, m, S)] = present[tix(SP_TASK_W, i, s, m, S)] = 1;
        }
#define BACK(i, s) (present[tix(SP_TASK_BW, i, s, m, S)] ? SP_TASK_BW : SP_TASK_B)
#define WPART(i, s) (present[tix(SP_TASK_BW, i, s, m, S)] ? SP_TASK_BW : SP_TASK_W)
    /* in-degrees from the dependency rules; successors are found by scanning the rules
     * again (schedules here are small: this is for tests) */
    for (int q = 0; q < n; q++) {
        if (!present[q]) continue;
        int k = q / (m * S), i = (q / S) % m, s = q % S;
        if (k == SP_TASK_F) {
            for (int e = 0; e < model->nedges; e++) indeg[q] += model->edge[e].dst_stage == s;
        } else if (k == SP_TASK_W) {
            indeg[q] = 1;
        } else {
            indeg[q] = 1;
            for (int e = 0; e < model->nedges; e++)
                indeg[q] += model->edge[e].src_stage == s && model->edge[e].needs_grad;
        }
        if ((k == SP_TASK_W || k == SP_TASK_BW) && i > 0) indeg[q]++;
    }
    int nready = 0;
    for (int q = 0; q < n; q++)
        if (present[q] && !indeg[q]) ready[nready++] = q;
    sp_status st = SP_OK;
    for (int placed = 0; st == SP_OK && nready; placed++) {
        int r = below(&g, nready), q = ready[r];
        ready[r] = ready[--nready];
        int k = q / (m * S), i = (q / S) % m, s = q % S;
        st = sp_schedule_append(sch, sch->stage_actor[s], (sp_task_kind)k, i, s);
        /* release the successors of (k, i, s) */
        int succ[64], ns = 0;
        if (k == SP_TASK_F) {
            for (int e = 0; e < model->nedges && ns < 60; e++)
                if (model->edge[e].src_stage == s)
                    succ[ns++] = tix(SP_TASK_F, i, model->edge[e].dst_stage, m, S);
            succ[ns++] = tix(BACK(i, s), i, s, m, S);
        }
        if (k == SP_TASK_B || k == SP_TASK_BW)
            for (int e = 0; e < model->nedges && ns < 60; e++)
                if (model->edge[e].dst_stage == s && model->edge[e].needs_grad)
                    succ[ns++] = tix(BACK(i, model->edge[e].src_stage), i,
                                     model->edge[e].src_stage, m, S);
        if (k == SP_TASK_B) succ[ns++] = tix(SP_TASK_W, i, s, m, S);
        if ((k == SP_TASK_W || k == SP_TASK_BW) && i + 1 < m)
            succ[ns++] = tix(WPART(i + 1, s), i + 1, s, m, S);
        for (int j = 0; j < ns; j++)
            if (--indeg[succ[j]] == 0) ready[nready++] = succ[j];
    }
#undef BACK
#undef WPART
    free(present), free(indeg), free(ready), free(perm);
    if (st != SP_OK) {
        sp_schedule_free(sch);
        return st;
    }
    *out = sch;
    return SP_OK;
}
