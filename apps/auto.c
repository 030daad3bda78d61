/* --schedule auto in the apps (auto.h): the stage costs from --calibrate's profile, or
 * measured by two steps of a probe trainer under ZB-H1 (B and W apart) whose updates are
 * thrown away; then sp_schedule_auto for those costs and the memory cap, set against the
 * built-ins in the simulator with the same costs. */
#include "apps/auto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "starpipe/exec.h"

/* Two steps of a trainer under `probe` on zeroed inputs (token 0, class 0: in range):
 * cost[s * 4 + kind] the median task times of the second, lat the median time a
 * message added to a path, gap the runtime's between tasks. */
static sp_status measure(const sp_program *p, const sp_schedule *probe,
                         const sp_train_opts *opts, int R, double *cost, double *lat)
{
    sp_train_opts to = *opts;
    to.trace = to.profile = 1;
    to.eval_microbatches = 0;
    sp_status st = SP_OK;
    sp_trainer *t = sp_trainer_create(p, probe, &to, &st);
    if (!t) return st;
    int nin = sp_program_num_inputs(p), n = R * probe->nmicro * nin;
    void **in = calloc((size_t)n, sizeof *in);
    for (int i = 0; in && i < n; i++)
        if (!(in[i] = calloc(1, sp_program_buf_bytes(p, SP_BUF_INPUT, i % nin) + 4))) {
            st = sp_set_error(SP_ERR_NOMEM, "out of memory");
            break;
        }
    if (!in) st = sp_set_error(SP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < 2 && st == SP_OK; k++) st = sp_trainer_step(t, (const void *const *)in, NULL);
    sp_train_profile pf;
    if (st == SP_OK && (st = sp_trainer_profile(t, &pf)) == SP_OK) {
        int S = pf.nstages;
        for (int k = 0; k < S * SP_NUM_TASK_KINDS; k++)
            cost[k] = pf.task_s[k] > 0 ? pf.task_s[k] + pf.gap_s : 0;
        /* what the probe ran fused (ZB-H1 runs BW where B has nothing to do) or apart: the
         * other form by the programs' FLOPs */
        for (int s = 0; s < S; s++) {
            double *c = cost + (size_t)s * SP_NUM_TASK_KINDS;
            double fb = sp_program_flops(p, s, SP_TASK_B), fbw = sp_program_flops(p, s, SP_TASK_BW);
            if (c[SP_TASK_BW] > 0 && c[SP_TASK_B] + c[SP_TASK_W] == 0) {
                c[SP_TASK_B] = fbw > 0 ? c[SP_TASK_BW] * fb / fbw : 0;
                c[SP_TASK_W] = c[SP_TASK_BW] - c[SP_TASK_B];
            } else if (c[SP_TASK_BW] == 0) {
                c[SP_TASK_BW] = c[SP_TASK_B] + c[SP_TASK_W];
            }
        }
        double sum = 0;
        int m = 0;
        for (int64_t q = 0; q < pf.nmessages; q++)
            if (pf.msg_s[q] >= 0) sum += pf.msg_s[q], m++;
        *lat = m ? sum / m : 0;
        sp_train_profile_free(&pf);
    }
    for (int i = 0; in && i < n; i++) free(in[i]);
    free(in);
    sp_trainer_free(t);
    return st;
}

/* The step of schedule s under the model's costs, simulated; -1 when it cannot run. */
static double simulate(const sp_stage_model *m, const sp_schedule *s, double lat)
{
    sp_plan *pl = NULL;
    sp_sim_result *r = NULL;
    sp_sim_config cfg = { .latency = lat };
    double step = -1;
    if (sp_plan_build(m, s, &pl) == SP_OK && sp_simulate(pl, m, &cfg, &r) == SP_OK)
        step = r->step_time;
    sp_sim_result_free(r);
    sp_plan_free(pl);
    return step;
}

sp_status app_auto_schedule(const sp_program *p, const sp_schedule *probe,
                            const sp_train_opts *opts, int R, const sp_profile *calib, int cap,
                            sp_schedule **out, char *why, size_t len)
{
    const sp_stage_model *model = sp_program_stage_model(p);
    int S = model->nstages, P = probe->nactors, m = probe->nmicro;
    double *buf = calloc((size_t)S * SP_NUM_TASK_KINDS + 1, sizeof *buf);
    sp_stage_info *info = malloc((size_t)S * sizeof *info);
    if (!buf || !info) {
        free(buf), free(info);
        return sp_set_error(SP_ERR_NOMEM, "out of memory");
    }
    double *lat = buf + (size_t)S * SP_NUM_TASK_KINDS;
    sp_status st = SP_OK;
    const char *source = "measured by two steps under zb-h1";
    if (calib) {
        st = sp_profile_task_costs(calib, p, buf);
        double bw;
        sp_profile_link(calib, lat, &bw);
        source = "predicted by --calibrate's profile";
    } else {
        st = measure(p, probe, opts, R, buf, lat);
    }
    /* every rank the same schedule: rank 0's numbers */
    if (st == SP_OK) st = sp_exec_bcast(buf, ((size_t)S * SP_NUM_TASK_KINDS + 1) * sizeof *buf, 0);
    if (st) {
        free(buf), free(info);
        return st;
    }
    memcpy(info, model->stage, (size_t)S * sizeof *info);
    for (int s = 0; s < S; s++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++) info[s].cost[k] = buf[s * SP_NUM_TASK_KINDS + k];
    sp_stage_model costed = *model;
    costed.stage = info;
    sp_auto_config cfg = { .latency = *lat, .mem_cap = cap };
    st = sp_schedule_auto(&costed, P, m, &cfg, out);
    if (st == SP_OK) {
        int k = snprintf(why, len, "schedule auto: for the task times %s (", source);
        for (int s = 0; s < S && k < (int)len; s++)
            k += snprintf(why + k, len - (size_t)k, "%sstage %d F %.2f B %.2f W %.2f ms",
                          s ? ", " : "", s, 1e3 * info[s].cost[SP_TASK_F],
                          1e3 * info[s].cost[SP_TASK_B], 1e3 * info[s].cost[SP_TASK_W]);
        int c = cap > 0 ? cap : sp_schedule_auto_default_cap(P, m);
        if (k < (int)len)
            k += snprintf(why + k, len - (size_t)k, "; messages %.0f us) and at most %d "
                          "microbatches' activations per actor%s: predicted pipeline %.2f ms",
                          1e6 * *lat, c, cap > 0 ? "" : " (1F1B's)", 1e3 * simulate(&costed, *out, *lat));
        const char *names[] = { "1f1b", "zb-h1" }; /* at the same memory */
        for (int i = 0; i < 2 && k < (int)len; i++) {
            sp_schedule *b = NULL;
            if (sp_schedule_from_env(names[i], P, m, 1, &b) == SP_OK)
                k += snprintf(why + k, len - (size_t)k, ", %s %.2f ms", names[i],
                              1e3 * simulate(&costed, b, *lat));
            sp_schedule_free(b);
        }
        if (k < (int)len) snprintf(why + k, len - (size_t)k, "\n");
    }
    free(buf), free(info);
    return st;
}
