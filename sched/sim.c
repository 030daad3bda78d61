/* The simulator: runs a plan on a cost model with blocking, ordered channels (FIFO per
 * pair of actors, link latency + bytes / bandwidth, links serialise their messages).
 * A RECV blocks until its message arrives; with cfg->rendezvous a SEND also blocks until
 * the RECV is posted, as NCCL's send/recv do. A wrong message at the head of a channel,
 * or no actor able to move, is reported, never waited on. */
#include "sched/sched_impl.h"

#include <string.h>

typedef struct {
    double post, done; /* when the SEND was posted; when the message arrived (<0: not yet) */
    int next;          /* next message of the same channel */
} msg_state;

void sp_sim_result_free(sp_sim_result *r)
{
    if (!r) return;
    if (r->start)
        for (int a = 0; a < r->nactors; a++) free(r->start[a]);
    if (r->end)
        for (int a = 0; a < r->nactors; a++) free(r->end[a]);
    free(r->start), free(r->end), free(r->busy), free(r->idle), free(r->peak);
    free(r->ar_start), free(r->ar_end), free(r->tp_busy);
    free(r);
}

double sp_allreduce_time(const sp_allreduce_model *m, double bytes)
{
    int R = m ? m->replicas : 1;
    if (R <= 1 || bytes <= 0) return 0;
    int g = m->replicas_per_node < 1 ? 1 : m->replicas_per_node > R ? R : m->replicas_per_node;
    if (!m->hierarchical || g == 1 || g == R) { /* one ring */
        double bw = g == R ? m->bw_intra : m->bw_inter;
        return 2.0 * (R - 1) * m->alpha + (bw > 0 ? 2.0 * (R - 1) / R * bytes / bw : 0);
    }
    int n = (R + g - 1) / g;
    double t = 2.0 * (g - 1) * m->alpha + (m->bw_intra > 0 ? 2.0 * (g - 1) / g * bytes / m->bw_intra : 0);
    t += 2.0 * (n - 1) * m->alpha +
         (m->bw_inter > 0 ? 2.0 * (n - 1) / n * (bytes / g) / m->bw_inter : 0);
    return t;
}

double sp_sim_msg_time(const sp_sim_config *cfg, double bytes, double *gather)
{
    const sp_tensor_link *l = cfg->tensor;
    double T = cfg->scatter_gather && l && l->tensor > 1 ? l->tensor : 1;
    *gather = T > 1 ? (T - 1) * (l->alpha + (l->bw > 0 ? bytes / T / l->bw : 0)) : 0;
    return cfg->bandwidth > 0 ? bytes / T / cfg->bandwidth : 0;
}

double sp_tensor_allreduce_time(const sp_tensor_link *l, int count, double bytes)
{
    if (!l || l->tensor <= 1 || count <= 0) return 0;
    /* count rings of T ranks inside a node: sp_allreduce_time's flat ring at T, summed
     * (linear in the bytes, so only their total matters) */
    double T = l->tensor;
    return count * 2 * (T - 1) * l->alpha + (l->bw > 0 ? 2 * (T - 1) / T * bytes / l->bw : 0);
}

/* The last instruction of each actor that touches stage s's gradients: its W or BW tasks,
 * a tied combine, a tied gradient's send; last[s] (-1: none). */
static void grads_final(const sp_plan *plan, const sp_stage_model *model, int *last)
{
    for (int s = 0; s < plan->nstages; s++) last[s] = -1;
    for (int a = 0; a < plan->nactors; a++)
        for (int i = 0; i < plan->ninstr[a]; i++) {
            const sp_instr *in = &plan->instr[a][i];
            if (in->op == SP_OP_RUN && (in->task.kind == SP_TASK_W || in->task.kind == SP_TASK_BW))
                last[in->task.stage] = i;
            else if (in->op == SP_OP_COMBINE)
                for (int q = 0; q < model->shared[in->buf.idx].nstages; q++) {
                    int s = model->shared[in->buf.idx].stages[q];
                    if (plan->stage_actor[s] == a) last[s] = i;
                }
            else if (in->op == SP_OP_SEND && in->buf.cls == SP_BUF_SHARED_GRAD)
                last[in->buf.stage] = i;
        }
}

/* The time of the group's all-reduces inside task t (and of F's again when it recomputes). */
static double tp_task_time(const sp_stage_model *model, const sp_sim_config *cfg, sp_task t)
{
    const sp_stage_info *st = &model->stage[t.stage];
    int again = st->recompute && (t.kind == SP_TASK_B || t.kind == SP_TASK_BW);
    double x = sp_tensor_allreduce_time(cfg->tensor, st->tp_allreduces[t.kind], st->tp_bytes[t.kind]);
    return x + (again ? sp_tensor_allreduce_time(cfg->tensor, st->tp_allreduces[SP_TASK_F],
                                                 st->tp_bytes[SP_TASK_F]) : 0);
}

static double task_time(const sp_stage_model *model, const sp_sim_config *cfg, sp_task t)
{
    /* a recomputing stage's first backward task runs F again first */
    int again = model->stage[t.stage].recompute && (t.kind == SP_TASK_B || t.kind == SP_TASK_BW);
    double tp = cfg->tensor ? tp_task_time(model, cfg, t) : 0;
    if (cfg->flops && cfg->device_flops > 0)
        return (cfg->flops[t.stage * SP_NUM_TASK_KINDS + t.kind] +
                (again ? cfg->flops[t.stage * SP_NUM_TASK_KINDS + SP_TASK_F] : 0)) /
               cfg->device_flops + tp;
    return model->stage[t.stage].cost[t.kind] + (again ? model->stage[t.stage].cost[SP_TASK_F] : 0)
           + tp;
}

/* Memory of each actor, recomputed from its instructions alone: persistent buffers it
 * touches exist from the start, transient ones from their first write to their FREE. */
static sp_status memory(const sp_plan *plan, const sp_stage_model *model, sp_sim_result *r)
{
    sp_bufset seen;
    if (sp_bufset_init(&seen, 1024)) return sp_set_error(SP_ERR_NOMEM, "out of memory");
    for (int a = 0; a < plan->nactors; a++) {
        sp_mem_peak pk = { 0 };
        size_t cur[5] = { 0 };
        int acts = 0;
        seen.n = 0;
        memset(seen.key, 0, seen.cap * sizeof *seen.key);
        for (int pass = 0; pass < 2; pass++) {
            for (int j = 0; j < plan->ninstr[a]; j++) {
                const sp_instr *in = &plan->instr[a][j];
                int msgop = in->op == SP_OP_SEND || in->op == SP_OP_RECV
                            || in->op == SP_OP_FREE;
                int n = msgop ? 1 : (int)in->nacc;
                for (int q = 0; q < n; q++) {
                    sp_buf b = msgop ? in->buf : plan->access[in->acc + q].buf;
                    int pers = sp_buf_persistent(b) && !(b.cls == SP_BUF_SHARED_GRAD && b.mb < 0
                                                         && plan->stage_actor[b.stage] != a);
                    uint64_t key = sp_buf_key(b);
                    if (pass == 0) { /* persistent buffers first, once each */
                        if (pers && !sp_bufset_find(&seen, key)) {
                            if (sp_bufset_put(&seen, key, 0)) goto nomem;
                            sp_mem_add(&pk, cur, &acts, b, sp_buf_bytes(model, b), 1);
                        }
                        continue;
                    }
                    if (pers) continue;
                    if (in->op == SP_OP_FREE) {
                        if (sp_bufset_del(&seen, key))
                            sp_mem_add(&pk, cur, &acts, b, sp_buf_bytes(model, b), -1);
                    } else if (!sp_bufset_find(&seen, key)) {
                        if (sp_bufset_put(&seen, key, 1)) goto nomem;
                        sp_mem_add(&pk, cur, &acts, b, sp_buf_bytes(model, b), 1);
                    }
                }
            }
        }
        r->peak[a] = pk;
    }
    sp_bufset_release(&seen);
    return SP_OK;
nomem:
    sp_bufset_release(&seen);
    return sp_set_error(SP_ERR_NOMEM, "out of memory");
}

/* Times and costs the simulator accepts: finite, not negative, and small enough that no
 * sum over a step (at most a few million instructions) leaves the doubles' range, so
 * every time it reports, and every trace drawn from them, is a finite number. */
#define SIM_MAX 1e100

static int bad_time(double x) { return !(x >= 0 && x <= SIM_MAX); } /* NaN too */

static sp_status check_inputs(const sp_plan *plan, const sp_stage_model *model,
                              const sp_sim_config *cfg)
{
    static const char *const kinds[SP_NUM_TASK_KINDS] = { "F", "B", "W", "BW" };
    if (!plan || !model) return sp_set_error(SP_ERR_ARG, "sp_simulate: NULL plan or model");
    const struct { const char *what; double v; } scalars[] = {
        { "latency", cfg->latency }, { "bandwidth", cfg->bandwidth },
        { "combine time", cfg->combine_time }, { "optimizer time", cfg->optimizer_time },
        { "device FLOP rate", cfg->device_flops } };
    for (size_t k = 0; k < sizeof scalars / sizeof *scalars; k++)
        if (bad_time(scalars[k].v))
            return sp_set_error(SP_ERR_ARG, "simulator: the %s is %g; it must be a finite "
                                "number in [0, %g]", scalars[k].what, scalars[k].v, SIM_MAX);
    /* bytes / bandwidth stays finite: a bandwidth is 0 (infinite) or at least 1/SIM_MAX */
    if (cfg->bandwidth > 0 && cfg->bandwidth < 1 / SIM_MAX)
        return sp_set_error(SP_ERR_ARG, "simulator: the bandwidth %g is below %g (0 means "
                            "infinite)", cfg->bandwidth, 1 / SIM_MAX);
    if (cfg->tensor && (bad_time(cfg->tensor->alpha) || bad_time(cfg->tensor->bw) ||
                        (cfg->tensor->bw > 0 && cfg->tensor->bw < 1 / SIM_MAX)))
        return sp_set_error(SP_ERR_ARG, "simulator: the tensor-parallel link's latency %g and "
                            "bandwidth %g must be finite numbers in [0, %g], the bandwidth 0 "
                            "(infinite) or at least %g", cfg->tensor->alpha, cfg->tensor->bw,
                            SIM_MAX, 1 / SIM_MAX);
    for (int s = 0; cfg->tensor && s < plan->nstages && s < model->nstages; s++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++)
            if (bad_time(model->stage[s].tp_bytes[k]) || model->stage[s].tp_allreduces[k] < 0)
                return sp_set_error(SP_ERR_ARG, "simulator: stage %d's %s has %d tensor-parallel "
                                    "all-reduces of %g bytes; both must be finite and not "
                                    "negative", s, kinds[k], model->stage[s].tp_allreduces[k],
                                    model->stage[s].tp_bytes[k]);
    int use_flops = cfg->flops && cfg->device_flops > 0;
    if (use_flops && cfg->device_flops < 1 / SIM_MAX)
        return sp_set_error(SP_ERR_ARG, "simulator: the device FLOP rate %g is below %g",
                            cfg->device_flops, 1 / SIM_MAX);
    if (model->nstages < plan->nstages)
        return sp_set_error(SP_ERR_ARG, "simulator: the model has %d stages, the plan %d",
                            model->nstages, plan->nstages);
    for (int s = 0; !cfg->instr_time && s < plan->nstages; s++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++) {
            double c = use_flops ? cfg->flops[s * SP_NUM_TASK_KINDS + k]
                                 : model->stage[s].cost[k];
            if (bad_time(c))
                return sp_set_error(SP_ERR_ARG, "simulator: the %s of %s on stage %d is %g; it "
                                    "must be a finite number in [0, %g]",
                                    use_flops ? "FLOP count" : "cost", kinds[k], s, c, SIM_MAX);
        }
    for (int a = 0; cfg->instr_time && a < plan->nactors; a++)
        for (int j = 0; j < plan->ninstr[a]; j++) {
            int op = plan->instr[a][j].op;
            if ((op == SP_OP_RUN || op == SP_OP_COMBINE || op == SP_OP_OPTIMIZER) &&
                bad_time(cfg->instr_time[a][j]))
                return sp_set_error(SP_ERR_ARG, "simulator: instruction %d of actor %d takes %g; "
                                    "times must be finite numbers in [0, %g]", j, a,
                                    cfg->instr_time[a][j], SIM_MAX);
        }
    return SP_OK;
}

/* Whether instruction j of actor a reads buffer b (j = ninstr: the end, which takes
 * every receive left). */
static int reads_buf(const sp_plan *plan, int a, int j, const sp_buf *b)
{
    if (j == plan->ninstr[a]) return 1;
    const sp_instr *in = &plan->instr[a][j];
    if (in->op == SP_OP_SEND || in->op == SP_OP_FREE) return !memcmp(&in->buf, b, sizeof *b);
    for (uint32_t q = 0; q < in->nacc; q++) {
        const sp_access *x = &plan->access[in->acc + q];
        if (!memcmp(&x->buf, b, sizeof *b)) return 1;
    }
    return 0;
}

/* Takes, in program order, the deferred receives instruction j of actor a needs: those of
 * the buffers it reads and, before each, the earlier ones on the same channel (a channel
 * delivers in order). A receive taken moves the actor's clock to the message's arrival.
 * Returns 1 when one of them is not sent yet (the actor waits), else 0; *st on a message
 * out of channel order. */
static int take_recvs(const sp_plan *plan, int a, int j, int *def, int *ndef, msg_state *ms,
                      int *qhead, int *qtail, double *clock, sp_sim_result *r, int p,
                      sp_status *st)
{
    char s1[160];
    for (int k = 0; k < *ndef; k++) {
        const sp_instr *in = &plan->instr[a][def[k]];
        if (!reads_buf(plan, a, j, &in->buf)) continue;
        for (int i = 0; i <= k; i++) { /* this channel's, up to this one */
            const sp_instr *x = &plan->instr[a][def[i]];
            if (x->peer != in->peer) continue;
            int ch = x->peer * p + a, h = qhead[ch];
            if (h < 0) return 1; /* nothing sent on this channel yet */
            if (h != x->seq) {
                *st = sp_set_error(SP_ERR_SCHEDULE, "actor %d: %s, but message #%d is first "
                                   "on the channel from actor %d: ordered channels would "
                                   "deliver the wrong message", a,
                                   sp_instr_format(x, s1, sizeof s1), h, x->peer);
                return 0;
            }
            msg_state *m = &ms[h];
            qhead[ch] = m->next;
            if (qhead[ch] < 0) qtail[ch] = -1;
            r->start[a][def[i]] = clock[a]; /* the wait it costs, for traces */
            if (m->done > clock[a]) clock[a] = m->done;
            r->end[a][def[i]] = clock[a];
            for (int q = i; q + 1 < *ndef; q++) def[q] = def[q + 1];
            (*ndef)--, i--, k--;
        }
    }
    return 0;
}

sp_status sp_simulate(const sp_plan *plan, const sp_stage_model *model,
                      const sp_sim_config *cfg_in, sp_sim_result **out)
{
    *out = NULL;
    sp_sim_config cfg0 = { 0 };
    const sp_sim_config *cfg = cfg_in ? cfg_in : &cfg0;
    sp_status vst = check_inputs(plan, model, cfg);
    if (vst) return vst;
    int p = plan->nactors;
    int64_t nm = plan->nmessages;
    sp_sim_result *r = calloc(1, sizeof *r);
    int *pc = calloc((size_t)p, sizeof *pc), *work = malloc((size_t)p * sizeof *work);
    /* each actor's receives not taken yet (buffered channels): [a][k], k < ndef[a] */
    int **def = calloc((size_t)p, sizeof *def), *ndef = calloc((size_t)p, sizeof *ndef);
    char *queued = calloc((size_t)p, 1);
    double *clock = calloc((size_t)p, sizeof *clock);
    msg_state *ms = malloc((size_t)(nm ? nm : 1) * sizeof *ms);
    int *qhead = malloc((size_t)p * p * sizeof *qhead), *qtail = malloc((size_t)p * p * sizeof *qtail);
    double *linkfree = calloc((size_t)p * p, sizeof *linkfree);
    int S = plan->nstages, ar = cfg->allreduce && cfg->allreduce->replicas > 1;
    int *last = NULL;                      /* [stage]: its gradients' last instruction */
    double *netfree = NULL, *ardone = NULL; /* [actor]: its network free; collectives done */
    sp_status st = SP_OK;
    char s1[160];
    if (!r || !pc || !work || !queued || !clock || !ms || !qhead || !qtail || !linkfree ||
        !def || !ndef)
        goto nomem;
    for (int a = 0; a < p; a++)
        if (!(def[a] = malloc(((size_t)plan->ninstr[a] + 1) * sizeof **def))) goto nomem;
    r->nactors = p;
    r->nmessages = nm;
    r->nstages = plan->nstages;
    r->ar_start = calloc((size_t)S + 1, sizeof(double));
    r->ar_end = calloc((size_t)S + 1, sizeof(double));
    last = malloc(((size_t)S + 1) * sizeof(int));
    netfree = calloc((size_t)p, sizeof(double));
    ardone = calloc((size_t)p, sizeof(double));
    if (!r->ar_start || !r->ar_end || !last || !netfree || !ardone) goto nomem;
    grads_final(plan, model, last);
    double gbytes = cfg->grad_bytes_per_param > 0 ? cfg->grad_bytes_per_param : 4;
    r->busy = calloc((size_t)p, sizeof *r->busy);
    r->idle = calloc((size_t)p, sizeof *r->idle);
    r->peak = calloc((size_t)p, sizeof *r->peak);
    r->start = calloc((size_t)p, sizeof *r->start);
    r->end = calloc((size_t)p, sizeof *r->end);
    r->tp_busy = calloc((size_t)p, sizeof *r->tp_busy);
    if (!r->busy || !r->idle || !r->peak || !r->start || !r->end || !r->tp_busy) goto nomem;
    for (int a = 0; a < p; a++) {
        r->start[a] = malloc((size_t)(plan->ninstr[a] + 1) * sizeof(double));
        r->end[a] = malloc((size_t)(plan->ninstr[a] + 1) * sizeof(double));
        if (!r->start[a] || !r->end[a]) goto nomem;
    }
    for (int i = 0; i < p * p; i++) qhead[i] = qtail[i] = -1;
    for (int64_t q = 0; q < nm; q++) ms[q].post = ms[q].done = -1, ms[q].next = -1;

    int nw = 0;
    for (int a = p - 1; a >= 0; a--) work[nw++] = a, queued[a] = 1;
#define WAKE(b) do { if (!queued[b]) work[nw++] = (b), queued[b] = 1; } while (0)
    while (nw) {
        int a = work[--nw];
        queued[a] = 0;
        while (pc[a] <= plan->ninstr[a]) {
            /* the deferred receives this instruction reads (all of them at the end) */
            int need = take_recvs(plan, a, pc[a], def[a], &ndef[a], ms, qhead, qtail, clock, r,
                                  p, &st);
            if (st) goto fail;
            if (need) break; /* blocked: a message it reads is not sent yet */
            if (pc[a] == plan->ninstr[a]) break;
            const sp_instr *in = &plan->instr[a][pc[a]];
            double t = clock[a], dur = 0;
            if (in->op == SP_OP_SEND) {
                if (in->seq < 0 || in->seq >= nm) goto badmsg;
                msg_state *m = &ms[in->seq];
                int ch = a * p + in->peer;
                if (m->post < 0) { /* post it on the channel */
                    m->post = t;
                    if (qtail[ch] >= 0) ms[qtail[ch]].next = (int)in->seq;
                    else qhead[ch] = (int)in->seq;
                    qtail[ch] = (int)in->seq;
                    if (!cfg->rendezvous) {
                        double gather, xfer = sp_sim_msg_time(cfg, (double)in->bytes, &gather);
                        double s0 = t > linkfree[ch] ? t : linkfree[ch];
                        linkfree[ch] = s0 + xfer;
                        m->done = s0 + cfg->latency + xfer + gather;
                    }
                    WAKE(in->peer);
                }
                if (cfg->rendezvous) {
                    if (m->done < 0) break; /* blocked until the receiver takes it */
                    clock[a] = m->done;
                }
            } else if (in->op == SP_OP_RECV && !cfg->rendezvous) {
                /* posted, not waited for: the runtime's receive does not hold the actor;
                 * what reads the buffer waits for it (take_recvs) */
                if (in->seq < 0 || in->seq >= nm) goto badmsg;
                def[a][ndef[a]++] = pc[a];
                r->start[a][pc[a]] = r->end[a][pc[a]] = t;
                pc[a]++;
                continue;
            } else if (in->op == SP_OP_RECV) {
                if (in->seq < 0 || in->seq >= nm) goto badmsg;
                int ch = in->peer * p + a, h = qhead[ch];
                if (h < 0) break; /* blocked: nothing sent on this channel yet */
                if (h != in->seq) {
                    st = sp_set_error(SP_ERR_SCHEDULE, "actor %d: %s, but message #%d is first "
                                      "on the channel from actor %d: ordered channels would "
                                      "deliver the wrong message", a,
                                      sp_instr_format(in, s1, sizeof s1), h, in->peer);
                    goto fail;
                }
                msg_state *m = &ms[h];
                if (cfg->rendezvous) {
                    double gather, xfer = sp_sim_msg_time(cfg, (double)in->bytes, &gather);
                    double s0 = m->post > t ? m->post : t;
                    if (linkfree[ch] > s0) s0 = linkfree[ch];
                    linkfree[ch] = s0 + xfer;
                    m->done = s0 + cfg->latency + xfer + gather;
                    WAKE(in->peer);
                }
                qhead[ch] = m->next;
                if (qhead[ch] < 0) qtail[ch] = -1;
                clock[a] = m->done > t ? m->done : t;
            } else if (in->op == SP_OP_RUN || in->op == SP_OP_COMBINE ||
                       in->op == SP_OP_OPTIMIZER) {
                dur = cfg->instr_time ? cfg->instr_time[a][pc[a]]
                    : in->op == SP_OP_RUN ? task_time(model, cfg, in->task)
                    : in->op == SP_OP_COMBINE ? cfg->combine_time : cfg->optimizer_time;
                if (in->op == SP_OP_OPTIMIZER && ar && ardone[a] > t) t = ardone[a];
                if (in->op == SP_OP_RUN && cfg->tensor && !cfg->instr_time)
                    r->tp_busy[a] += tp_task_time(model, cfg, in->task);
            }
            if (in->op == SP_OP_RECV || in->op == SP_OP_SEND) {
                r->start[a][pc[a]] = t;
                r->end[a][pc[a]] = clock[a];
            } else {
                r->start[a][pc[a]] = t;
                r->end[a][pc[a]] = t + dur;
                clock[a] = t + dur;
                r->busy[a] += dur;
            }
            /* the stages whose gradients are now final start their all-reduce */
            for (int s = 0; ar && s < S; s++)
                if (last[s] == pc[a] && plan->stage_actor[s] == a) {
                    double t0 = clock[a] > netfree[a] ? clock[a] : netfree[a];
                    double d = sp_allreduce_time(cfg->allreduce,
                                                 gbytes / 4 * (double)model->stage[s].param_bytes);
                    r->ar_start[s] = t0;
                    r->ar_end[s] = netfree[a] = t0 + d;
                    if (netfree[a] > ardone[a]) ardone[a] = netfree[a];
                    r->comm_time += d;
                }
            pc[a]++;
        }
    }
#undef WAKE
    int stuck = 0;
    for (int a = 0; a < p; a++) stuck += pc[a] < plan->ninstr[a] || ndef[a] > 0;
    if (stuck) {
        st = sp_plan_stuck_error(plan, pc, cfg->rendezvous
                                               ? "simulation deadlocked (rendezvous channels):"
                                               : "simulation deadlocked (buffered channels):");
        goto fail;
    }
    for (int64_t q = 0; q < nm; q++)
        if (ms[q].post < 0) {
            st = sp_set_error(SP_ERR_SCHEDULE, "message #%lld was never sent", (long long)q);
            goto fail;
        }
    for (int i = 0; i < p * p; i++)
        if (qhead[i] >= 0) {
            st = sp_set_error(SP_ERR_SCHEDULE, "message #%d from actor %d to actor %d was "
                              "never received", qhead[i], i / p, i % p);
            goto fail;
        }
    double T = 0, busy = 0;
    for (int a = 0; a < p; a++) {
        if (ar && ardone[a] > clock[a]) clock[a] = ardone[a]; /* a plan with no OPTIMIZER */
        if (clock[a] > T) T = clock[a];
        busy += r->busy[a];
        if (r->tp_busy[a] > r->tp_time) r->tp_time = r->tp_busy[a];
    }
    r->step_time = T;
    for (int a = 0; a < p; a++) r->idle[a] = T - r->busy[a];
    r->bubble_fraction = T > 0 ? 1.0 - busy / ((double)p * T) : 0;
    st = memory(plan, model, r);
    if (st) goto fail;
    if (ar && !cfg->skip_exposed) { /* exposed: what the collectives add without them */
        sp_sim_config alone = *cfg;
        alone.allreduce = NULL;
        sp_sim_result *r0 = NULL;
        if ((st = sp_simulate(plan, model, &alone, &r0))) goto fail;
        r->exposed_comm = T > r0->step_time ? T - r0->step_time : 0;
        sp_sim_result_free(r0);
    }
    *out = r;
    r = NULL;
    goto done;
badmsg:
    st = sp_set_error(SP_ERR_SCHEDULE, "malformed plan: message number out of range");
    goto fail;
nomem:
    st = sp_set_error(SP_ERR_NOMEM, "out of memory simulating");
fail:
done:
    sp_sim_result_free(r);
    free(pc), free(work), free(queued), free(clock), free(ms), free(qhead), free(qtail);
    free(linkfree);
    free(last), free(netfree), free(ardone);
    for (int a = 0; def && a < p; a++) free(def[a]);
    free(def), free(ndef);
    return st;
}
