/* The reference interpreter: a whole training step in one process, in the plainest
 * order (microbatch by microbatch: F of every stage, then BW in reverse), on the same
 * stage programs and kernels the runtime uses. */
#include "starpipe/reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codelets/cpu/kernels.h"
#include "graph/program_impl.h"

struct sp_reference {
    const sp_program *p;
    int m, R;
    sp_adamw_config opt;
    int steps;
    double grad_norm;
    int skipped;
    int S, E;
    float **params, **grads, **mom_m, **mom_v, **act, **bgrad, **scratch;
    float **efwd, **egrad;
    float *losses;
    float **rgrads; /* with replicas: replica q >= 1's gradients, before the sum */
    sp_tp_group *group; /* tensor parallelism: this member's group, or NULL */
};

void sp_reference_set_group(sp_reference *r, sp_tp_group *g)
{
    if (r) r->group = g;
}

static float *zalloc(size_t bytes) { return calloc(bytes ? bytes : 1, 1); }

void sp_reference_free(sp_reference *r)
{
    if (!r) return;
    float **all[] = { r->params, r->grads, r->mom_m, r->mom_v, r->act, r->bgrad, r->scratch,
                      r->rgrads };
    for (size_t a = 0; a < sizeof all / sizeof *all; a++) {
        for (int s = 0; all[a] && s < r->S; s++) free(all[a][s]);
        free(all[a]);
    }
    for (int e = 0; e < r->E; e++) {
        if (r->efwd) free(r->efwd[e]);
        if (r->egrad) free(r->egrad[e]);
    }
    free(r->efwd);
    free(r->egrad);
    free(r->losses);
    free(r);
}

sp_reference *sp_reference_create(const sp_program *p, int microbatches,
                                  const sp_adamw_config *opt, uint64_t seed, sp_status *status)
{
    sp_status st = SP_OK;
    sp_reference *r = NULL;
    if (!p || microbatches < 1) {
        st = sp_set_error(SP_ERR_ARG, "sp_reference_create: need a program and >= 1 microbatch");
        goto out;
    }
    r = calloc(1, sizeof *r);
    if (!r) goto nomem;
    r->p = p;
    r->m = microbatches;
    r->R = 1;
    if (opt) r->opt = *opt;
    else sp_adamw_defaults(&r->opt);
    r->S = p->nstages;
    r->E = p->nedges;
    float ***slabs[] = { &r->params, &r->grads, &r->mom_m, &r->mom_v, &r->act, &r->bgrad,
                         &r->scratch };
    for (size_t a = 0; a < sizeof slabs / sizeof *slabs; a++)
        if (!(*slabs[a] = calloc((size_t)r->S, sizeof(float *)))) goto nomem;
    for (int s = 0; s < r->S; s++) {
        size_t pb = sp_program_buf_bytes(p, SP_BUF_PARAMS, s);
        if (!(r->params[s] = zalloc(pb)) ||
            !(r->grads[s] = zalloc(sp_program_buf_bytes(p, SP_BUF_GRADS, s))) ||
            !(r->mom_m[s] = zalloc(pb)) || !(r->mom_v[s] = zalloc(pb)) ||
            !(r->act[s] = zalloc(sp_program_buf_bytes(p, SP_BUF_ACT, s))) ||
            !(r->bgrad[s] = zalloc(sp_program_buf_bytes(p, SP_BUF_BGRAD, s))) ||
            !(r->scratch[s] = zalloc(sp_program_buf_bytes(p, SP_BUF_SCRATCH, s))))
            goto nomem;
    }
    r->efwd = calloc((size_t)(r->E ? r->E : 1), sizeof(float *));
    r->egrad = calloc((size_t)(r->E ? r->E : 1), sizeof(float *));
    if (!r->efwd || !r->egrad) goto nomem;
    for (int e = 0; e < r->E; e++)
        if (!(r->efwd[e] = zalloc(sp_program_buf_bytes(p, SP_BUF_EDGE_FWD, e))) ||
            !(r->egrad[e] = zalloc(sp_program_buf_bytes(p, SP_BUF_EDGE_GRAD, e))))
            goto nomem;
    if (!(r->losses = zalloc((size_t)r->m * sizeof(float)))) goto nomem;
    for (int i = 0; i < sp_graph_num_params(p->g); i++) {
        sp_tensor t = sp_graph_param(p->g, i);
        for (int s = 0; s < r->S; s++) {
            int64_t off = p->param_off[s][t];
            if (off >= 0 && (st = sp_param_init_values(p->g, t, seed, r->params[s] + off)))
                goto out;
        }
    }
    sp_kernels_init();
    goto out;
nomem:
    st = sp_set_error(SP_ERR_NOMEM, "sp_reference_create: out of memory");
out:
    if (st != SP_OK) {
        sp_reference_free(r);
        r = NULL;
    }
    if (status) *status = st;
    return r;
}

/* Runs program (s, kind) on microbatch i; its loss (the last F) goes to *loss. */
static sp_status run_to(sp_reference *r, int s, sp_task_kind kind, int i,
                        const void *const *inputs, float *loss)
{
    const sp_program *p = r->p;
    int nb = sp_program_num_bufs(p, s, kind);
    void *bufs[64];
    void **b = nb <= 64 ? bufs : malloc((size_t)nb * sizeof(void *));
    if (!b) return sp_set_error(SP_ERR_NOMEM, "reference: out of memory");
    for (int j = 0; j < nb; j++) {
        sp_slab_ref ref = sp_program_buf(p, s, kind, j);
        switch (ref.cls) {
        case SP_BUF_PARAMS: b[j] = r->params[ref.index]; break;
        case SP_BUF_GRADS: b[j] = r->grads[ref.index]; break;
        case SP_BUF_ACT: b[j] = r->act[ref.index]; break;
        case SP_BUF_BGRAD: b[j] = r->bgrad[ref.index]; break;
        case SP_BUF_SCRATCH: b[j] = r->scratch[ref.index]; break;
        case SP_BUF_EDGE_FWD: b[j] = r->efwd[ref.index]; break;
        case SP_BUF_EDGE_GRAD: b[j] = r->egrad[ref.index]; break;
        case SP_BUF_INPUT: b[j] = (void *)inputs[i * p->ninputs + ref.index]; break;
        case SP_BUF_LOSS: b[j] = loss; break;
        default: b[j] = NULL;
        }
    }
    sp_run_args args = { .dloss = 1.0f / (float)(r->R * r->m), .group = r->group };
    sp_status st = sp_program_run(p, s, kind, b, &args);
    if (b != bufs) free(b);
    return st;
}

static sp_status run(sp_reference *r, int s, sp_task_kind kind, int i, const void *const *inputs)
{
    return run_to(r, s, kind, i, inputs, &r->losses[i]);
}

sp_status sp_reference_set_replicas(sp_reference *r, int replicas)
{
    if (!r || replicas < 1)
        return sp_set_error(SP_ERR_ARG, "sp_reference_set_replicas: need >= 1 replica");
    float *losses = realloc(r->losses, (size_t)replicas * r->m * sizeof(float));
    if (!losses) return sp_set_error(SP_ERR_NOMEM, "reference: out of memory");
    r->losses = losses;
    memset(r->losses, 0, (size_t)replicas * r->m * sizeof(float));
    if (replicas > 1 && !r->rgrads) {
        if (!(r->rgrads = calloc((size_t)r->S, sizeof(float *))))
            return sp_set_error(SP_ERR_NOMEM, "reference: out of memory");
        for (int s = 0; s < r->S; s++)
            if (!(r->rgrads[s] = zalloc(sp_program_buf_bytes(r->p, SP_BUF_GRADS, s))))
                return sp_set_error(SP_ERR_NOMEM, "reference: out of memory");
    }
    r->R = replicas;
    return SP_OK;
}

/* One replica's gradients of microbatches first .. first + m - 1, from zero, into
 * r->grads: what one pipeline computes. */
static sp_status replica_grads(sp_reference *r, int first, const void *const *inputs)
{
    const sp_program *p = r->p;
    sp_status st;
    for (int s = 0; s < r->S; s++)
        memset(r->grads[s], 0, sp_program_buf_bytes(p, SP_BUF_GRADS, s));
    for (int i = first; i < first + r->m; i++) {
        for (int s = 0; s < r->S; s++)
            if ((st = run(r, s, SP_TASK_F, i, inputs))) return st;
        for (int s = r->S - 1; s >= 0; s--)
            if ((st = run(r, s, SP_TASK_BW, i, inputs))) return st;
    }
    /* repeated uses within a stage first, then each owner adds the other stages' partial
     * gradients, ascending: the sum in use order */
    for (int s = 0; s < r->S; s++) sp_program_local_add_run(p, s, r->grads[s]);
    for (int s = 1; s < r->S; s++)
        for (int o = 0; o < s; o++)
            if (sp_optim_stages_share(p, o, s)) sp_optim_combine(p, o, r->grads[o], s, r->grads[s]);
    return SP_OK;
}

sp_status sp_reference_forward_backward(sp_reference *r, const void *const *inputs, float *loss)
{
    if (!r || !inputs) return sp_set_error(SP_ERR_ARG, "sp_reference_forward_backward: NULL");
    const sp_program *p = r->p;
    int n = r->R * r->m;
    sp_status st = sp_program_check_inputs(p, inputs, n);
    if (st) return st;
    /* replica 0 into grads; each later one into its own slabs, then added in order */
    for (int q = 0; q < r->R; q++) {
        float **sum = r->grads;
        if (q > 0) r->grads = r->rgrads, r->rgrads = sum;
        st = replica_grads(r, q * r->m, inputs);
        if (q > 0) r->rgrads = r->grads, r->grads = sum;
        if (st) return st;
        for (int s = 0; q > 0 && s < r->S; s++) {
            int64_t nf = (int64_t)(sp_program_buf_bytes(p, SP_BUF_PARAMS, s) / 4);
            for (int64_t j = 0; j < nf; j++) r->grads[s][j] += r->rgrads[s][j];
        }
    }
    double total = 0.0;
    for (int i = 0; i < n; i++) total += r->losses[i];
    if (loss) *loss = (float)(total / n);
    return SP_OK;
}

sp_status sp_reference_step(sp_reference *r, const void *const *inputs, float *loss_out)
{
    float mean_loss;
    sp_status st = sp_reference_forward_backward(r, inputs, &mean_loss);
    if (loss_out) *loss_out = mean_loss;
    if (st) return st;
    const sp_program *p = r->p;
    double sumsq[r->S];
    for (int s = 0; s < r->S; s++) sumsq[s] = sp_optim_sumsq(p, s, r->grads[s]);
    if (sp_graph_tensor_size(p->g) > 1) /* split parameters' terms summed over the group */
        for (int s = 0; s < r->S && st == SP_OK; s++)
            st = sp_optim_group_sumsq(p, s, r->grads[s], r->group, &sumsq[s]);
    if (st) return st;
    float scale = sp_optim_clip_scale(&r->opt, sumsq, r->S, &r->grad_norm);
    int bad = sp_optim_nonfinite_stage(sumsq, r->S, mean_loss);
    r->skipped = bad >= 0;
    if (bad >= 0 && !r->opt.skip_nonfinite)
        return sp_set_error(SP_ERR_NUMERIC, "non-finite %s in stage %d (use --skip-nonfinite "
                            "to skip such steps)", isfinite(sumsq[bad]) ? "loss" : "gradients", bad);
    if (bad >= 0) return SP_OK; /* skipped: no update, the step does not count */
    r->steps++;
    for (int s = 0; s < r->S; s++)
        sp_optim_update(p, s, r->params[s], r->grads[s], r->mom_m[s], r->mom_v[s], &r->opt, scale,
                        r->steps);
    for (int s = 1; s < r->S; s++)
        for (int o = 0; o < s; o++)
            if (sp_optim_stages_share(p, o, s))
                sp_optim_copy_shared(p, o, r->params[o], s, r->params[s]);
    return SP_OK;
}

sp_status sp_reference_eval(sp_reference *r, int K, const void *const *inputs, float *loss)
{
    if (!r || !inputs || K < 1) return sp_set_error(SP_ERR_ARG, "sp_reference_eval: bad argument");
    sp_status st = sp_program_check_inputs(r->p, inputs, K);
    if (st) return st;
    /* forward only: the gradient accumulators, the step's losses and the parameters stay
     * as they are */
    double total = 0.0;
    for (int i = 0; i < K; i++) {
        float mb_loss = 0.0f;
        for (int s = 0; s < r->S; s++)
            if ((st = run_to(r, s, SP_TASK_F, i, inputs, &mb_loss))) return st;
        total += mb_loss;
    }
    if (loss) *loss = (float)(total / K);
    return SP_OK;
}

const float *sp_reference_value(const sp_reference *r, sp_tensor t)
{
    const sp_graph *g = r ? r->p->g : NULL;
    if (!g || t < 0 || t >= g->n) return NULL;
    while (g->node[t].op == SP_OP_YIELD) t = g->node[t].in[0];
    int s = g->node[t].stage;
    if (s < 0 || r->p->act_off[t] < 0 || r->p->act16[t]) return NULL;
    return r->act[s] + r->p->act_off[t];
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

sp_status sp_reference_task_times(sp_reference *r, const void *const *inputs, int reps,
                                  double *secs)
{
    if (!r || !inputs || !secs || reps < 1)
        return sp_set_error(SP_ERR_ARG, "sp_reference_task_times: bad argument");
    sp_status st = sp_program_check_inputs(r->p, inputs, r->m);
    if (st) return st;
    const int n = r->S * SP_NUM_TASK_KINDS;
    double *t = malloc((size_t)reps * (size_t)n * sizeof *t);
    if (!t) return sp_set_error(SP_ERR_NOMEM, "reference: out of memory");
    for (int k = 0; k < n; k++) secs[k] = 0;
    /* reps passes of microbatch 0: forward through every stage, then each stage's
     * backward kinds from the last stage down, so that every task finds the buffers it
     * reads. Pass after pass rather than one task reps times: a burst of load from
     * elsewhere then lands on a pass, which the median drops, not on all of one task's
     * runs (the first of several schedules' ideals came out 10-40% high). */
    const sp_task_kind order[] = { SP_TASK_F, SP_TASK_B, SP_TASK_W, SP_TASK_BW };
    for (int k = 0; k < reps && st == SP_OK; k++)
        for (int o = 0; o < 4 && st == SP_OK; o++)
            for (int q = 0; q < r->S && st == SP_OK; q++) {
                int s = order[o] == SP_TASK_F ? q : r->S - 1 - q;
                double t0 = seconds();
                st = run(r, s, order[o], 0, inputs);
                t[(size_t)(s * SP_NUM_TASK_KINDS + order[o]) * (size_t)reps + (size_t)k] =
                    seconds() - t0;
            }
    for (int o = 0; o < 4 && st == SP_OK; o++)
        for (int s = 0; s < r->S; s++) {
            double *v = t + (size_t)(s * SP_NUM_TASK_KINDS + order[o]) * (size_t)reps;
            qsort(v, (size_t)reps, sizeof *v, cmp_double);
            secs[s * SP_NUM_TASK_KINDS + order[o]] = v[reps / 2];
        }
    free(t);
    return st;
}

const sp_program *sp_reference_program(const sp_reference *r) { return r ? r->p : NULL; }

const float *sp_reference_param(const sp_reference *r, sp_tensor t)
{
    int o = r ? sp_program_param_owner(r->p, t) : -1;
    return o < 0 ? NULL : r->params[o] + r->p->param_off[o][t];
}

const float *sp_reference_grad(const sp_reference *r, sp_tensor t)
{
    int o = r ? sp_program_param_owner(r->p, t) : -1;
    return o < 0 ? NULL : r->grads[o] + r->p->param_off[o][t];
}

sp_status sp_reference_set_param(sp_reference *r, sp_tensor t, const float *values)
{
    return sp_reference_store(r, t, 0, values);
}

sp_status sp_reference_store(sp_reference *r, sp_tensor t, int what, const float *values)
{
    if (!r || !sp_tensor_is_param(r->p->g, t) || !values || (what != 0 && what != 2 && what != 3))
        return sp_set_error(SP_ERR_ARG, "sp_reference_store: bad argument");
    int64_t n = sp_tensor_numel(r->p->g, t);
    float **slabs = what == 0 ? r->params : what == 2 ? r->mom_m : r->mom_v;
    for (int s = 0; s < r->S; s++) {
        int64_t off = r->p->param_off[s][t];
        if (off >= 0) memcpy(slabs[s] + off, values, (size_t)n * sizeof(float));
    }
    return SP_OK;
}

void sp_reference_set_steps_done(sp_reference *r, int steps)
{
    if (r) r->steps = steps;
}

void sp_reference_set_lr(sp_reference *r, float lr)
{
    if (r) r->opt.lr = lr;
}

const float *sp_reference_param_moment(const sp_reference *r, sp_tensor t, int which)
{
    int o = r ? sp_program_param_owner(r->p, t) : -1;
    return o < 0 ? NULL : (which ? r->mom_v[o] : r->mom_m[o]) + r->p->param_off[o][t];
}

const float *sp_reference_microbatch_losses(const sp_reference *r) { return r ? r->losses : NULL; }
int sp_reference_last_skipped(const sp_reference *r) { return r ? r->skipped : 0; }
double sp_reference_grad_norm(const sp_reference *r) { return r ? r->grad_norm : 0.0; }
int sp_reference_steps_done(const sp_reference *r) { return r ? r->steps : 0; }

float *sp_reference_slab(sp_reference *r, sp_buf_class cls, int stage)
{
    if (r && (cls == SP_BUF_EDGE_FWD || cls == SP_BUF_EDGE_GRAD))
        return stage < 0 || stage >= r->E ? NULL
             : cls == SP_BUF_EDGE_FWD ? r->efwd[stage] : r->egrad[stage];
    if (!r || stage < 0 || stage >= r->S) return NULL;
    if (cls == SP_BUF_PARAMS) return r->params[stage];
    if (cls == SP_BUF_GRADS) return r->grads[stage];
    return NULL;
}

float *sp_reference_moment(sp_reference *r, int which, int stage)
{
    if (!r || stage < 0 || stage >= r->S) return NULL;
    return which ? r->mom_v[stage] : r->mom_m[stage];
}
