/* The optimizer step on stage slabs (see include/starpipe/optim.h): combine of tied
 * gradients, global-norm clipping and AdamW, in one fixed order of float operations. */
#include "starpipe/optim.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codelets/cpu/kernels.h"
#include "graph/program_impl.h"

void sp_adamw_defaults(sp_adamw_config *cfg)
{
    *cfg = (sp_adamw_config){ .lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                              .weight_decay = 0.1f, .grad_clip = 1.0f };
}

float sp_lr_at(const sp_lr_schedule *s, int step)
{
    double lr = s->lr, lo = s->lr_min;
    if (s->warmup > 0 && step <= s->warmup) return (float)(lr * step / s->warmup);
    if (s->decay == SP_LR_DECAY_NONE) return s->lr;
    double x = s->total > s->warmup ? (double)(step - s->warmup) / (s->total - s->warmup) : 1.0;
    if (x > 1.0) x = 1.0;
    if (x < 0.0) x = 0.0; /* step < 1 with no warmup: the peak */
    double k = s->decay == SP_LR_DECAY_COSINE ? 0.5 * (1.0 + cos(M_PI * x)) : 1.0 - x;
    return (float)(lo + (lr - lo) * k);
}

static const char *const decay_names[] = { "none", "cosine", "linear" };

const char *sp_lr_decay_name(sp_lr_decay d)
{
    return d >= SP_LR_DECAY_NONE && d <= SP_LR_DECAY_LINEAR ? decay_names[d] : "?";
}

int sp_lr_decay_parse(const char *name)
{
    for (int d = SP_LR_DECAY_NONE; name && d <= SP_LR_DECAY_LINEAR; d++)
        if (!strcmp(name, decay_names[d])) return d;
    return -1;
}

static int owner_of(const sp_program *p, int t) { return sp_program_param_owner(p, t); }

void sp_optim_combine(const sp_program *p, int owner, float *owner_grads, int other,
                      const float *other_grads)
{
    const sp_graph *g = p->g;
    for (int t = 0; t < g->n; t++) {
        int64_t a = p->param_off[owner][t], b = p->param_off[other][t];
        if (g->node[t].op != SP_OP_PARAM || a < 0 || b < 0 || owner_of(p, t) != owner) continue;
        float *dst = owner_grads + a;
        const float *src = other_grads + b;
        for (int64_t j = 0; j < g->node[t].numel; j++) dst[j] += src[j];
    }
}

double sp_optim_sumsq(const sp_program *p, int s, const float *grads)
{
    const sp_graph *g = p->g;
    double acc = 0.0;
    for (int t = 0; t < g->n; t++) {
        int64_t a = p->param_off[s][t];
        if (g->node[t].op != SP_OP_PARAM || a < 0 || owner_of(p, t) != s) continue;
        acc += sp_sum_squares(grads + a, g->node[t].numel);
    }
    return acc;
}

float sp_optim_clip_scale(const sp_adamw_config *cfg, const double *stage_sumsq, int nstages,
                          double *norm)
{
    double total = 0.0;
    for (int s = 0; s < nstages; s++) total += stage_sumsq[s];
    double n = sqrt(total);
    if (norm) *norm = n;
    if (cfg->grad_clip > 0.0f && n > cfg->grad_clip) return (float)(cfg->grad_clip / n);
    return 1.0f;
}

int sp_optim_nonfinite_stage(const double *stage_sumsq, int nstages, float loss)
{
    for (int s = 0; s < nstages; s++)
        if (!isfinite(stage_sumsq[s])) return s;
    return isfinite(loss) ? -1 : nstages - 1;
}

void sp_optim_update(const sp_program *p, int s, float *params, const float *grads, float *m,
                     float *v, const sp_adamw_config *cfg, float grad_scale, int t)
{
    sp_optim_update_range(p, s, 0, INT64_MAX, params, grads, m, v, cfg, grad_scale, t);
}

void sp_optim_update_range(const sp_program *p, int s, int64_t lo, int64_t hi, float *params,
                           const float *grads, float *m, float *v, const sp_adamw_config *cfg,
                           float grad_scale, int t)
{
    /* the CPU's AdamW cannot fail */
    sp_optim_update_range_on(p, s, lo, hi, params, grads, m, v, cfg, grad_scale, t,
                             sp_backend_cpu(), NULL);
}

sp_status sp_optim_update_range_on(const sp_program *p, int s, int64_t lo, int64_t hi,
                                   float *params, const float *grads, float *m, float *v,
                                   const sp_adamw_config *cfg, float grad_scale, int t,
                                   const sp_backend *be, void *ctx)
{
    return sp_optim_update_part_on(p, s, lo, hi, SP_OPTIM_ALL, params, grads, m, v, cfg,
                                   grad_scale, t, be, ctx);
}

/* Parameter k is held by a stage other than s (a tied parameter). */
static int held_elsewhere(const sp_program *p, int s, int k)
{
    for (int q = 0; q < p->nstages; q++)
        if (q != s && p->param_off[q][k] >= 0) return 1;
    return 0;
}

sp_status sp_optim_update_part_on(const sp_program *p, int s, int64_t lo, int64_t hi,
                                  sp_optim_part part, float *params, const float *grads,
                                  float *m, float *v, const sp_adamw_config *cfg,
                                  float grad_scale, int t, const sp_backend *be, void *ctx)
{
    const sp_graph *g = p->g;
    for (int k = 0; k < g->n; k++) {
        int64_t a = p->param_off[s][k];
        if (g->node[k].op != SP_OP_PARAM || a < lo || a >= hi || owner_of(p, k) != s) continue;
        if (part != SP_OPTIM_ALL && held_elsewhere(p, s, k) != (part == SP_OPTIM_TIED))
            continue;
        float wd = g->node[k].ndim >= 2 ? cfg->weight_decay : 0.0f;
        int rc = be->adamw(ctx, params + a, m + (a - lo), v + (a - lo), grads + a,
                           g->node[k].numel, cfg->lr, cfg->beta1, cfg->beta2, cfg->eps, wd,
                           grad_scale, t);
        if (rc)
            return sp_set_error(SP_ERR_RUNTIME, "AdamW of '%s' failed on %s: %s",
                                g->node[k].name, be->name, be->status_string(rc));
    }
    return SP_OK;
}

void sp_optim_shards(const sp_program *p, int s, int R, int64_t *bounds)
{
    const sp_graph *g = p->g;
    int64_t total = p->param_floats[s];
    bounds[0] = 0;
    for (int c = 1; c < R; c++) {
        /* the tensor start nearest to c/R of the slab, never before the previous cut */
        double want = (double)total * c / R;
        int64_t best = total;
        for (int k = 0; k < g->n; k++) {
            int64_t a = p->param_off[s][k];
            if (g->node[k].op != SP_OP_PARAM || a < bounds[c - 1]) continue;
            if (fabs((double)a - want) < fabs((double)best - want)) best = a;
        }
        bounds[c] = best;
    }
    bounds[R] = total;
}

void sp_optim_param_sumsq(const sp_program *p, int s, int64_t lo, int64_t hi,
                          const float *grads, double *sumsq)
{
    sp_optim_param_sumsq_on(p, s, lo, hi, grads, sumsq, sp_backend_cpu(), NULL);
}

sp_status sp_optim_param_sumsq_on(const sp_program *p, int s, int64_t lo, int64_t hi,
                                  const float *grads, double *sumsq, const sp_backend *be,
                                  void *ctx)
{
    const sp_graph *g = p->g;
    for (int k = 0, i = 0; k < g->n; k++) {
        if (g->node[k].op != SP_OP_PARAM) continue;
        int64_t a = p->param_off[s][k];
        int rc = a >= lo && a < hi && owner_of(p, k) == s
                     ? be->sum_squares(ctx, sumsq + i, grads + a, g->node[k].numel) : 0;
        if (rc)
            return sp_set_error(SP_ERR_RUNTIME, "the gradient norm of '%s' failed on %s: %s",
                                g->node[k].name, be->name, be->status_string(rc));
        i++;
    }
    return SP_OK;
}

sp_status sp_optim_group_terms(const sp_program *p, int s, double *terms, sp_tp_group *grp)
{
    const sp_graph *g = p->g;
    int np = sp_graph_num_params(g), nsplit = 0;
    if (sp_graph_tensor_size(g) == 1) return SP_OK;
    if (!grp) return sp_set_error(SP_ERR_ARG, "the gradient norm of a tensor-parallel stage "
                                  "needs its group");
    double *part = malloc(sizeof(double) * (size_t)(np > 0 ? np : 1));
    if (!part) return sp_set_error(SP_ERR_NOMEM, "the gradient norm: out of memory");
    for (int i = 0; i < np; i++) /* the stage's split parameters, in parameter order */
        if (sp_param_split_dim(g, sp_graph_param(g, i)) >= 0) part[nsplit++] = terms[i];
    (void)s;
    int rc = nsplit ? grp->sum_f64(grp, part, nsplit) : 0;
    for (int i = 0, k = 0; i < np && !rc; i++)
        if (sp_param_split_dim(g, sp_graph_param(g, i)) >= 0) terms[i] = part[k++];
    free(part);
    return rc ? sp_set_error(SP_ERR_RUNTIME, "the gradient norm's sum over the tensor group "
                             "failed: %s", grp->status_string(grp, rc))
              : SP_OK;
}

sp_status sp_optim_group_sumsq(const sp_program *p, int s, const float *grads, sp_tp_group *grp,
                               double *sumsq)
{
    int np = sp_graph_num_params(p->g);
    double *terms = calloc((size_t)(np > 0 ? np : 1), sizeof(double));
    if (!terms) return sp_set_error(SP_ERR_NOMEM, "the gradient norm: out of memory");
    sp_optim_param_sumsq(p, s, 0, INT64_MAX, grads, terms);
    sp_status st = sp_optim_group_terms(p, s, terms, grp);
    if (st == SP_OK) *sumsq = sp_optim_fold_sumsq(p, s, terms);
    free(terms);
    return st;
}

double sp_optim_fold_sumsq(const sp_program *p, int s, const double *sumsq)
{
    /* the order of sp_optim_sumsq: graph nodes ascending (parameters are numbered in
     * node order) */
    const sp_graph *g = p->g;
    double acc = 0.0;
    for (int k = 0, i = 0; k < g->n; k++) {
        if (g->node[k].op != SP_OP_PARAM) continue;
        if (p->param_off[s][k] >= 0 && owner_of(p, k) == s) acc += sumsq[i];
        i++;
    }
    return acc;
}

void sp_optim_copy_shared(const sp_program *p, int owner, const float *owner_params, int other,
                          float *other_params)
{
    const sp_graph *g = p->g;
    for (int t = 0; t < g->n; t++) {
        int64_t a = p->param_off[owner][t], b = p->param_off[other][t];
        if (g->node[t].op != SP_OP_PARAM || a < 0 || b < 0 || owner_of(p, t) != owner) continue;
        for (int64_t j = 0; j < g->node[t].numel; j++) other_params[b + j] = owner_params[a + j];
    }
}

int sp_optim_stages_share(const sp_program *p, int a, int b)
{
    const sp_graph *g = p->g;
    for (int t = 0; t < g->n; t++)
        if (g->node[t].op == SP_OP_PARAM && p->param_off[a][t] >= 0 && p->param_off[b][t] >= 0)
            return 1;
    return 0;
}
