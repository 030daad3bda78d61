/* A cut of the model balanced by cost (cut.h): each block's cost, the embedding's and the
 * head's, from the model cut as finely as it goes (the embedding alone, one block per
 * stage, the head alone), then the contiguous cut into S stages whose largest stage
 * costs least. */
#include "apps/cut.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/reference.h"

/* A stage's cost in one step's tasks: F and BW (and F again when it recomputes). */
static double stage_cost(const sp_program *p, const double *cost, int s)
{
    const sp_stage_model *md = sp_program_stage_model(p);
    double f = cost ? cost[s * SP_NUM_TASK_KINDS + SP_TASK_F] : sp_program_flops(p, s, SP_TASK_F);
    double bw = cost ? cost[s * SP_NUM_TASK_KINDS + SP_TASK_BW]
                     : sp_program_flops(p, s, SP_TASK_BW);
    return f + bw + (md->stage[s].recompute ? f : 0);
}

/* The largest stage of cut n[0..S) over items c[0..L+1] (c[0] the embedding, c[L+1] the
 * head). */
static double largest(const double *c, int L, const int *n, int S)
{
    double worst = 0;
    for (int s = 0, b = 1; s < S; s++) {
        double x = s == 0 ? c[0] : 0;
        for (int k = 0; k < n[s]; k++) x += c[b++];
        if (s == S - 1) x += c[L + 1];
        if (x > worst) worst = x;
    }
    return worst;
}

/* Minimizes the largest stage: best[s][j] over the first j blocks in stages 0..s, by
 * dynamic programming; middle stages hold one block at least. 0, or -1 (no cut). */
static int balance(const double *c, int L, int S, int *n)
{
    size_t W = (size_t)L + 1;
    double *best = malloc((size_t)S * W * sizeof *best);
    int *from = malloc((size_t)S * W * sizeof *from);
    if (!best || !from) {
        free(best), free(from);
        return -1;
    }
    for (int j = 0; j <= L; j++) { /* stage 0: the embedding and blocks 1..j */
        double x = c[0];
        for (int k = 1; k <= j; k++) x += c[k];
        best[j] = x, from[j] = 0;
    }
    for (int s = 1; s < S; s++)
        for (int j = 0; j <= L; j++) {
            best[s * W + j] = -1;
            int last = s == S - 1;
            for (int i = 0; i <= j; i++) { /* stage s: blocks i+1..j */
                if (!last && j - i < 1) continue;
                if (best[(s - 1) * W + i] < 0) continue;
                double x = last ? c[L + 1] : 0;
                for (int k = i + 1; k <= j; k++) x += c[k];
                double m = x > best[(s - 1) * W + i] ? x : best[(s - 1) * W + i];
                if (best[s * W + j] < 0 || m < best[s * W + j] * (1 - 1e-12))
                    best[s * W + j] = m, from[s * W + j] = i;
            }
        }
    int ok = best[(S - 1) * W + L] >= 0;
    for (int s = S - 1, j = L; ok && s >= 0; s--) {
        int i = s ? from[s * W + j] : 0;
        n[s] = j - i;
        j = i;
    }
    free(best), free(from);
    return ok ? 0 : -1;
}

int app_balanced_cut(sp_app_model *m, const sp_app_opts *o, int S, int T, int trank,
                     const sp_profile *pf, int *cut, char *why, size_t len)
{
    int L = m->cut_layers && m->set_cut ? m->cut_layers(m->cfg) : 0;
    if (why && len) why[0] = 0;
    if (L <= 0 || S < 2 || L < S - 2 || L > 1022) return 1;
    int *fine = malloc(((size_t)L + 2) * sizeof *fine);
    double *c = malloc(((size_t)L + 2) * sizeof *c);
    double *cost = malloc(((size_t)L + 2) * SP_NUM_TASK_KINDS * sizeof *cost);
    sp_status st = SP_OK;
    sp_graph *g = NULL;
    sp_program *p = NULL;
    int rc = 1;
    if (!fine || !c || !cost) goto out;
    fine[0] = fine[L + 1] = 0;
    for (int k = 1; k <= L; k++) fine[k] = 1;
    m->set_cut(m->cfg, fine, L + 2);
    g = m->build(m->cfg, L + 2, T, trank, &st);
    p = g ? app_program(g, o, 1, &st) : NULL;
    m->set_cut(m->cfg, NULL, 0);
    if (!p || (pf && sp_profile_task_costs(pf, p, cost) != SP_OK)) goto out;
    for (int s = 0; s < L + 2; s++) c[s] = stage_cost(p, pf ? cost : NULL, s);
    if (balance(c, L, S, cut)) goto out;
    /* the even cut (the remainder to the first stages), for the record */
    int even[1026];
    for (int s = 0; s < S && s < 1026; s++) even[s] = L / S + (s < L % S);
    double mine = largest(c, L, cut, S), base = largest(c, L, even, S);
    if (base <= mine * (1 + 1e-9)) memcpy(cut, even, (size_t)S * sizeof *cut);
    m->set_cut(m->cfg, cut, S);
    if (why && len) {
        int k = snprintf(why, len, "cut: blocks per stage ");
        for (int s = 0; s < S && k < (int)len; s++)
            k += snprintf(why + k, len - (size_t)k, "%s%d", s ? "," : "", cut[s]);
        double u = pf ? 1e3 : 1e-9; /* ms or GFLOP */
        if (k < (int)len)
            snprintf(why + k, len - (size_t)k, " (balanced by %s: the largest stage %.4g %s "
                     "per microbatch, the even cut's %.4g)\n",
                     pf ? "--calibrate's costs" : "the programs' FLOPs", u * mine,
                     pf ? "ms" : "GFLOP", u * base);
    }
    rc = 0;
out:
    sp_program_free(p);
    sp_graph_free(g);
    free(fine), free(c), free(cost);
    return rc;
}
