/* A measured run of a plan next to the schedule's bound for the same tasks: the plan
 * replayed by the simulator with each instruction's measured duration and instant
 * messages, and the time tasks that could have run waited for their messages. */
#include "sched/sched_impl.h"

#include <stdlib.h>
#include <string.h>

static int is_work(const sp_instr *in) { return in->op == SP_OP_RUN || in->op == SP_OP_COMBINE; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* 1 if instruction `in` reads or writes buffer key k. */
static int touches(const sp_plan *plan, const sp_instr *in, uint64_t k)
{
    for (uint32_t q = 0; q < in->nacc; q++)
        if (sp_buf_key(plan->access[in->acc + q].buf) == k) return 1;
    return 0;
}

sp_status sp_plan_measure(const sp_plan *plan, const sp_stage_model *model,
                          const double *const *start, const double *const *end,
                          sp_run_measure *out)
{
    if (!plan || !model || !start || !end || !out)
        return sp_set_error(SP_ERR_ARG, "sp_plan_measure: NULL argument");
    memset(out, 0, sizeof *out);
    int p = plan->nactors;
    int64_t nm = plan->nmessages;
    double **dur = calloc((size_t)p, sizeof *dur);
    int64_t *send_actor = malloc((size_t)(nm ? nm : 1) * 2 * sizeof *send_actor);
    double *waits = malloc((size_t)(nm ? nm : 1) * sizeof *waits);
    double *disp = malloc((size_t)(nm ? nm : 1) * sizeof *disp);
    sp_status st = SP_OK;
    if (!dur || !send_actor || !waits || !disp) goto nomem;

    /* measured span and busy time; durations for the replay */
    double first = 0, last = 0;
    int any = 0;
    for (int a = 0; a < p; a++) {
        if (!(dur[a] = calloc((size_t)plan->ninstr[a] + 1, sizeof(double)))) goto nomem;
        for (int i = 0; i < plan->ninstr[a]; i++) {
            if (!is_work(&plan->instr[a][i]) || start[a][i] < 0) continue;
            double d = end[a][i] - start[a][i];
            dur[a][i] = d > 0 ? d : 0;
            out->busy += dur[a][i];
            if (!any || start[a][i] < first) first = start[a][i];
            if (!any || end[a][i] > last) last = end[a][i];
            any = 1;
        }
    }
    out->span = any ? last - first : 0;
    out->bubble = out->span > 0 ? 1.0 - out->busy / (p * out->span) : 0;

    sp_sim_config cfg = { .instr_time = (const double *const *)dur };
    sp_sim_result *r = NULL;
    if ((st = sp_simulate(plan, model, &cfg, &r))) goto done;
    out->replay_span = r->step_time;
    out->replay_bubble = r->bubble_fraction;
    sp_sim_result_free(r);

    /* where each message is sent: (actor, instruction) */
    for (int64_t q = 0; q < 2 * nm; q++) send_actor[q] = -1;
    for (int a = 0; a < p; a++)
        for (int i = 0; i < plan->ninstr[a]; i++) {
            const sp_instr *in = &plan->instr[a][i];
            if (in->op == SP_OP_SEND && in->seq >= 0 && in->seq < nm) {
                send_actor[2 * in->seq] = a;
                send_actor[2 * in->seq + 1] = i;
            }
        }
    int n = 0, nd = 0;
    for (int a = 0; a < p; a++)
        for (int i = 0; i < plan->ninstr[a]; i++) {
            const sp_instr *in = &plan->instr[a][i];
            if (in->op != SP_OP_RECV || in->seq < 0 || in->seq >= nm) continue;
            int sa = (int)send_actor[2 * in->seq], si = (int)send_actor[2 * in->seq + 1];
            if (sa < 0) continue;
            /* the producer: the last work before the SEND (a SEND follows its producer) */
            int prod = si - 1;
            while (prod >= 0 && !is_work(&plan->instr[sa][prod])) prod--;
            /* the consumer: the first work after the RECV that touches the buffer */
            uint64_t k = sp_buf_key(in->buf);
            int cons = i + 1;
            while (cons < plan->ninstr[a] &&
                   !(is_work(&plan->instr[a][cons]) && touches(plan, &plan->instr[a][cons], k)))
                cons++;
            if (prod < 0 || cons >= plan->ninstr[a] || start[sa][prod] < 0 ||
                start[a][cons] < 0)
                continue;
            double ready = end[sa][prod], prev = -1;
            for (int j = cons - 1; j >= 0; j--)
                if (is_work(&plan->instr[a][j]) && start[a][j] >= 0) {
                    prev = end[a][j];
                    break;
                }
            if (prev > ready) ready = prev;
            double w = start[a][cons] - ready;
            waits[n++] = w > 0 ? w : 0;
            if (start[a][i] >= 0) { /* the RECV itself was measured: its end is arrival */
                double d = start[a][cons] - (end[a][i] > prev ? end[a][i] : prev);
                disp[nd++] = d > 0 ? d : 0;
            }
        }
    out->nwaits = n;
    if (n) {
        qsort(waits, (size_t)n, sizeof *waits, cmp_double);
        out->wait_median = n % 2 ? waits[n / 2] : 0.5 * (waits[n / 2 - 1] + waits[n / 2]);
        out->wait_p90 = waits[(int)(0.9 * (n - 1) + 0.5)];
        out->wait_max = waits[n - 1];
    }
    out->ndispatch = nd;
    if (nd) {
        qsort(disp, (size_t)nd, sizeof *disp, cmp_double);
        out->dispatch_median = nd % 2 ? disp[nd / 2] : 0.5 * (disp[nd / 2 - 1] + disp[nd / 2]);
        out->dispatch_p90 = disp[(int)(0.9 * (nd - 1) + 0.5)];
    }
    goto done;
nomem:
    st = sp_set_error(SP_ERR_NOMEM, "sp_plan_measure: out of memory");
done:
    for (int a = 0; dur && a < p; a++) free(dur[a]);
    free(dur), free(send_actor), free(waits), free(disp);
    return st;
}
