/* --schedule auto in the apps (auto.h): op times from --calibrate's profile, or from two
 * steps of a probe trainer under ZB-H1 whose updates are thrown away; the stage costs of
 * any cut predicted from them (sp_profile_task_costs); the schedule synthesized for the
 * chain (sp_schedule_auto), set against the built-ins of two stages per actor on the
 * model cut twice as fine, each simulated with its predicted costs; the fastest that
 * holds no more activations than the synthesized one wins. */
#include "apps/auto.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/exec.h"

/* The probe: two steps on zeroed inputs (token 0, class 0: in range); what the second
 * measured, as a profile in memory: the ops of the programs that ran, the messages, the
 * gap between tasks. */
static sp_status measure(const sp_program *p, const sp_schedule *probe,
                         const sp_train_opts *opts, int R, sp_profile **out, int64_t *msgs)
{
    sp_train_opts to = *opts;
    to.trace = to.profile = 1;
    to.eval_microbatches = 0;
    sp_status st = SP_OK;
    sp_trainer *t = sp_trainer_create(p, probe, &to, &st);
    if (!t) return st;
    int nin = sp_program_num_inputs(p), n = R * probe->nmicro * nin;
    void **in = calloc((size_t)n, sizeof *in);
    for (int i = 0; in && i < n && st == SP_OK; i++)
        if (!(in[i] = calloc(1, sp_program_buf_bytes(p, SP_BUF_INPUT, i % nin) + 4)))
            st = sp_set_error(SP_ERR_NOMEM, "out of memory");
    if (!in) st = sp_set_error(SP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < 2 && st == SP_OK; k++) st = sp_trainer_step(t, (const void *const *)in, NULL);
    sp_train_profile tp;
    sp_profile *pf = NULL;
    if (st == SP_OK && (st = sp_trainer_profile(t, &tp)) == SP_OK) {
        if (!(pf = sp_profile_create())) st = sp_set_error(SP_ERR_NOMEM, "out of memory");
        for (int k = 0; pf && st == SP_OK && k < tp.nstages * SP_NUM_TASK_KINDS; k++) {
            sp_op_desc d;
            for (int64_t j = tp.op_at[k]; st == SP_OK && tp.task_s[k] > 0 && j < tp.op_at[k + 1]; j++)
                if (sp_program_op(p, k / 4, (sp_task_kind)(k % 4), (int)(j - tp.op_at[k]), &d) == 0)
                    st = sp_profile_add_op(pf, &d, tp.op_s[j]);
        }
        const sp_plan *pl = sp_trainer_plan(t);
        *msgs = pl->nmessages;
        for (int a = 0; pf && st == SP_OK && a < pl->nactors; a++)
            for (int i = 0; st == SP_OK && i < pl->ninstr[a]; i++) {
                const sp_instr *x = &pl->instr[a][i];
                if (x->op == SP_OP_RECV && x->seq >= 0 && x->seq < tp.nmessages)
                    st = sp_profile_add_message(pf, (double)x->bytes, tp.msg_s[x->seq]);
            }
        sp_profile_set_gap(pf, tp.gap_s);
        sp_train_profile_free(&tp);
    }
    for (int i = 0; in && i < n; i++) free(in[i]);
    free(in);
    sp_trainer_free(t);
    if (st) sp_profile_free(pf);
    else *out = pf;
    return st;
}

/* A candidate: its schedule planned and simulated on p's stages at the profile's costs. */
typedef struct {
    sp_schedule *s;
    double step;  /* predicted pipeline, seconds; -1: none */
    double acts;  /* the largest actor's peak of saved activations, bytes */
} candidate;

static void evaluate(const sp_profile *pf, const sp_program *p, candidate *c)
{
    sp_stage_model m;
    sp_stage_info *info = sp_profile_costed_model(pf, p, &m, NULL);
    sp_plan *pl = NULL;
    sp_sim_result *r = NULL;
    double lat = 0, bw = 0;
    c->step = -1;
    sp_profile_link(pf, &lat, &bw);
    sp_sim_config cfg = { .latency = lat, .bandwidth = bw };
    if (info && sp_plan_build(&m, c->s, &pl) == SP_OK && sp_simulate(pl, &m, &cfg, &r) == SP_OK) {
        c->step = r->step_time;
        c->acts = 0;
        for (int a = 0; a < pl->nactors; a++)
            if ((double)pl->peak[a].acts > c->acts) c->acts = (double)pl->peak[a].acts;
    }
    sp_sim_result_free(r);
    sp_plan_free(pl);
    free(info);
}

/* The chain's schedule, synthesized for its stage costs at the cap. */
static sp_status synthesize(const sp_profile *pf, const sp_program *p, int P, int m, int cap,
                            sp_schedule **out)
{
    sp_stage_model costed;
    sp_stage_info *info = sp_profile_costed_model(pf, p, &costed, NULL);
    if (!info) return sp_set_error(SP_ERR_NOMEM, "out of memory");
    double lat = 0, bw = 0;
    sp_profile_link(pf, &lat, &bw);
    sp_auto_config cfg = { .latency = lat, .bandwidth = bw, .mem_cap = cap };
    sp_status st = sp_schedule_auto(&costed, P, m, &cfg, out);
    free(info);
    return st;
}

sp_status app_auto_schedule(const sp_program *p, app_program_fn build, void *ctx,
                            const sp_schedule *probe, const sp_train_opts *opts, int R,
                            const sp_profile *calib, int cap, int chain_only,
                            sp_schedule **out, char *why, size_t len)
{
    int P = probe->nactors, m = probe->nmicro;
    sp_profile *mine = NULL;
    int64_t msgs = 0;
    sp_status st = calib ? SP_OK : measure(p, probe, opts, R, &mine, &msgs);
    const sp_profile *pf = calib ? calib : mine;
    enum { NC = 4 };
    static const char *const vnames[NC] = { "auto", "interleaved-1f1b", "zb-v", "dualpipe-v" };
    candidate c[NC] = { { 0 } };
    sp_program *pv = NULL;
    sp_graph *gv = NULL;
    if (st == SP_OK && (st = synthesize(pf, p, P, m, cap, &c[0].s)) == SP_OK)
        evaluate(pf, p, &c[0]);
    /* the same model cut into 2 P stages, two per actor: the built-ins that place them */
    /* (a model too shallow for 2 P stages, or a built-in whose constraints m and P break,
     * is no candidate) */
    sp_status none;
    if (st == SP_OK && !chain_only && P > 1 && build && (pv = build(ctx, 2 * P, &gv, &none)))
        for (int k = 1; k < NC; k++)
            if (sp_schedule_from_env(vnames[k], P, m, 2, &c[k].s) == SP_OK) evaluate(pf, pv, &c[k]);
    /* every rank the same choice: rank 0's */
    double pick = 0;
    for (int k = 1; st == SP_OK && k < NC; k++)
        if (c[k].step > 0 && c[k].acts <= c[0].acts && (c[(int)pick].step < 0 ||
                                                        c[k].step < c[(int)pick].step))
            pick = k;
    if (st == SP_OK) st = sp_exec_bcast(&pick, sizeof pick, 0);
    if (st == SP_OK && !c[(int)pick].s) st = sp_set_error(SP_ERR_RUNTIME, "ranks disagree");
    if (st == SP_OK) {
        int k = snprintf(why, len, "schedule auto: for the task times %s, at most %d "
                         "microbatches' activations per actor (%s): predicted pipeline",
                         calib ? "--calibrate's profile predicts"
                               : "two probe steps under zb-h1 measured",
                         cap > 0 ? cap : sp_schedule_auto_default_cap(P, m),
                         cap > 0 ? "--memory-cap" : "1F1B's");
        for (int i = 0; i < NC && k < (int)len; i++)
            if (c[i].step > 0)
                k += snprintf(why + k, len - (size_t)k, "%s %s %.2f ms%s", i ? "," : "",
                              i ? vnames[i] : "synthesized", 1e3 * c[i].step,
                              i && c[i].acts > c[0].acts ? " (more memory)" : "");
        if (k < (int)len)
            k += snprintf(why + k, len - (size_t)k, "; runs %s",
                          pick ? vnames[(int)pick] : "the synthesized one");
        if (k < (int)len && !calib) /* (what the transports count besides the run's) */
            k += snprintf(why + k, len - (size_t)k, " (the probe: 2 steps of %lld messages)",
                          (long long)msgs);
        if (k < (int)len) snprintf(why + k, len - (size_t)k, "\n");
        *out = c[(int)pick].s;
        c[(int)pick].s = NULL;
    }
    for (int i = 0; i < NC; i++) sp_schedule_free(c[i].s);
    sp_program_free(pv);
    sp_graph_free(gv);
    sp_profile_free(mine);
    return st;
}
