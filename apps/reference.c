/* The apps' reference interpreter, one member or a tensor group of them (reference.h). */
#include "apps/reference.h"

#include <stdlib.h>
#include <string.h>

#include "starpipe/graph.h"

struct app_ref {
    int T;
    sp_graph **g;
    sp_program **p;
    sp_reference **r;
    sp_tp_local *local; /* NULL when T = 1 */
    /* the call the members run (sp_tp_local_run) */
    const void *const *in;
    int K;
    float *loss;
};

sp_program *app_program(const sp_graph *g, const sp_app_opts *o, int trainer, sp_status *st)
{
    sp_program *p = sp_program_build(g, st);
    if (!p) return NULL;
    if ((*st = sp_program_set_precision(p, o->bf16 ? SP_PRECISION_BF16 : SP_PRECISION_FP32)) ||
        (*st = sp_program_set_bf16_activations(p, trainer && o->bf16))) {
        sp_program_free(p);
        return NULL;
    }
    sp_program_set_recompute(p, -1, o->recompute);
    for (int k = 0; k < o->nrecompute; k++) sp_program_set_recompute(p, o->recompute_stages[k], 1);
    return p;
}

void app_ref_free(app_ref *a)
{
    if (!a) return;
    for (int q = 0; q < a->T; q++) {
        if (a->r) sp_reference_free(a->r[q]);
        if (a->p) sp_program_free(a->p[q]);
        if (a->g) sp_graph_free(a->g[q]);
    }
    free(a->g), free(a->p), free(a->r), free(a->loss);
    sp_tp_local_free(a->local);
    free(a);
}

app_ref *app_ref_create(sp_app_model *m, const sp_app_opts *o, int stages, int T, int nmb,
                        int R, const sp_adamw_config *opt, sp_status *st)
{
    app_ref *a = calloc(1, sizeof *a);
    if (a) {
        a->T = T;
        a->g = calloc((size_t)T, sizeof *a->g);
        a->p = calloc((size_t)T, sizeof *a->p);
        a->r = calloc((size_t)T, sizeof *a->r);
        a->loss = calloc((size_t)T, sizeof *a->loss);
    }
    if (!a || !a->g || !a->p || !a->r || !a->loss || (T > 1 && !(a->local = sp_tp_local_create(T)))) {
        *st = sp_set_error(SP_ERR_NOMEM, "reference: out of memory");
        app_ref_free(a);
        return NULL;
    }
    for (int q = 0; q < T; q++) {
        if (!(a->g[q] = m->build(m->cfg, stages, T, q, st)) ||
            !(a->p[q] = app_program(a->g[q], o, 0, st)) ||
            !(a->r[q] = sp_reference_create(a->p[q], nmb, opt, (uint64_t)o->seed, st)) ||
            (*st = sp_reference_set_replicas(a->r[q], R))) {
            app_ref_free(a);
            return NULL;
        }
        sp_reference_set_group(a->r[q], a->local ? sp_tp_local_member(a->local, q) : NULL);
    }
    return a;
}

int app_ref_size(const app_ref *a) { return a ? a->T : 0; }
sp_reference *app_ref_member(app_ref *a, int q) { return a->r[q]; }
const sp_graph *app_ref_graph(const app_ref *a, int q) { return a->g[q]; }
const sp_program *app_ref_program(const app_ref *a, int q) { return a->p[q]; }

/* Runs fn on every member: in threads joined by the group when T > 1. */
static sp_status on_members(app_ref *a, sp_status (*fn)(int q, void *arg))
{
    return a->local ? sp_tp_local_run(a->local, fn, a) : fn(0, a);
}

static sp_status member_step(int q, void *arg)
{
    app_ref *a = arg;
    return sp_reference_step(a->r[q], a->in, &a->loss[q]);
}

static sp_status member_eval(int q, void *arg)
{
    app_ref *a = arg;
    return sp_reference_eval(a->r[q], a->K, a->in, &a->loss[q]);
}

sp_status app_ref_step(app_ref *a, const void *const *inputs, float *loss)
{
    a->in = inputs;
    sp_status st = on_members(a, member_step);
    if (loss) *loss = a->loss[0];
    return st;
}

sp_status app_ref_eval(app_ref *a, int K, const void *const *inputs, float *loss)
{
    a->in = inputs;
    a->K = K;
    sp_status st = on_members(a, member_eval);
    if (loss) *loss = a->loss[0];
    return st;
}

void app_ref_set_lr(app_ref *a, float lr)
{
    for (int q = 0; q < a->T; q++) sp_reference_set_lr(a->r[q], lr);
}

void app_ref_set_steps_done(app_ref *a, int steps)
{
    for (int q = 0; q < a->T; q++) sp_reference_set_steps_done(a->r[q], steps);
}

/* ---- whole tensors to and from the members ---- */

static sp_status get(void *ctx, sp_tensor p, int what, float *dst)
{
    app_ref *a = ctx;
    const char *name = sp_tensor_name(a->g[0], p);
    int parts = sp_param_split_dim(a->g[0], p) >= 0 ? a->T : 1;
    for (int q = 0; q < parts; q++) {
        sp_tensor t = sp_graph_find(a->g[q], name);
        const float *src = what == 0 ? sp_reference_param(a->r[q], t)
                         : what == 1 ? sp_reference_grad(a->r[q], t)
                                     : sp_reference_param_moment(a->r[q], t, what - 2);
        if (!src) return sp_set_error(SP_ERR_ARG, "reference: no parameter '%s'", name);
        sp_status st = sp_param_part_to_whole(a->g[q], t, q, src, dst);
        if (st) return st;
    }
    return SP_OK;
}

static sp_status set(void *ctx, sp_tensor p, int what, const float *src)
{
    app_ref *a = ctx;
    const char *name = sp_tensor_name(a->g[0], p);
    sp_status st = SP_OK;
    for (int q = 0; q < a->T && st == SP_OK; q++) {
        sp_tensor t = sp_graph_find(a->g[q], name);
        float *part = malloc(sizeof(float) * (size_t)(sp_tensor_numel(a->g[q], t) + 1));
        st = part ? sp_param_whole_to_part(a->g[q], t, q, src, part)
                  : sp_set_error(SP_ERR_NOMEM, "reference: out of memory");
        if (st == SP_OK) st = sp_reference_store(a->r[q], t, what, part);
        free(part);
    }
    return st;
}

ckpt_io app_ref_io(app_ref *a, int writer)
{
    return (ckpt_io){ .ctx = a, .get = get, .set = set, .writer = writer };
}
