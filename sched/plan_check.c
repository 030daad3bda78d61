/* Plan well-formedness, checked from the instructions alone (not from how they were
 * made): matched messages, one message order on both ends of every pair, completion
 * under rendezvous semantics, and buffer presence. Also the plan's text form. */
#include "sched/sched_impl.h"

#include <string.h>

const char *sp_op_name(sp_op op)
{
    static const char *n[] = { "RUN", "SEND", "RECV", "FREE", "COMBINE", "OPTIMIZER" };
    return (unsigned)op < SP_NUM_OPS ? n[op] : "?";
}

char *sp_buf_format(sp_buf b, char *buf, size_t n)
{
    const char *name = sp_buf_class_name((sp_buf_class)b.cls);
    switch (b.cls) {
    case SP_BUF_ACT: case SP_BUF_BGRAD: case SP_BUF_LOSS:
        snprintf(buf, n, "%s(mb=%d,s=%d)", name, b.mb, b.idx);
        break;
    case SP_BUF_EDGE_FWD: case SP_BUF_EDGE_GRAD:
        snprintf(buf, n, "%s(e=%d,mb=%d)", name, b.idx, b.mb);
        break;
    case SP_BUF_SHARED_PARAM:
        snprintf(buf, n, "%s(k=%d)", name, b.idx);
        break;
    case SP_BUF_SHARED_GRAD:
        if (b.mb < 0) snprintf(buf, n, "%s(k=%d,s=%d)", name, b.idx, b.stage);
        else snprintf(buf, n, "%s(k=%d,s=%d,mb=%d)", name, b.idx, b.stage, b.mb);
        break;
    default:
        snprintf(buf, n, "%s(s=%d)", name, b.idx);
    }
    return buf;
}

char *sp_instr_format(const sp_instr *in, char *buf, size_t n)
{
    char t[64];
    switch (in->op) {
    case SP_OP_RUN:
        snprintf(buf, n, "RUN %s", sp_task_format(in->task, t, sizeof t));
        break;
    case SP_OP_SEND: case SP_OP_RECV:
        snprintf(buf, n, "%s %s %s actor %d #%lld (%zu bytes)", sp_op_name((sp_op)in->op),
                 sp_buf_format(in->buf, t, sizeof t), in->op == SP_OP_SEND ? "to" : "from",
                 in->peer, (long long)in->seq, in->bytes);
        break;
    case SP_OP_FREE:
        snprintf(buf, n, "FREE %s", sp_buf_format(in->buf, t, sizeof t));
        break;
    case SP_OP_COMBINE:
        if (in->task.mb < 0) snprintf(buf, n, "COMBINE k=%d into s=%d", in->buf.idx, in->stage);
        else snprintf(buf, n, "COMBINE k=%d mb=%d into s=%d", in->buf.idx, in->task.mb,
                      in->stage);
        break;
    case SP_OP_OPTIMIZER:
        snprintf(buf, n, "OPTIMIZER s=%d", in->stage);
        break;
    default:
        snprintf(buf, n, "? op %d", in->op);
    }
    return buf;
}

sp_status sp_plan_write(const sp_plan *plan, FILE *f)
{
    char line[160];
    fprintf(f, "# plan: %d actors, %d stages, %d microbatches, %d tasks, %lld messages\n",
            plan->nactors, plan->nstages, plan->nmicro, plan->ntasks,
            (long long)plan->nmessages);
    for (int a = 0; a < plan->nactors; a++) {
        fprintf(f, "actor %d: %d instructions\n", a, plan->ninstr[a]);
        for (int j = 0; j < plan->ninstr[a]; j++)
            fprintf(f, "  %s\n", sp_instr_format(&plan->instr[a][j], line, sizeof line));
    }
    return ferror(f) ? sp_set_error(SP_ERR_IO, "writing a plan failed") : SP_OK;
}

static int persistent(const sp_plan *plan, sp_buf b, int actor)
{
    if (b.cls == SP_BUF_SHARED_GRAD && b.mb < 0)
        return b.stage >= 0 && b.stage < plan->nstages && plan->stage_actor[b.stage] == actor;
    return sp_buf_persistent(b);
}

typedef struct {
    const sp_plan *plan;
    sp_bufset *live; /* [p] transient buffers present on each actor */
    char msg[700];
} checker;

/* Applies one access on actor a; returns 0 or -1 with c->msg set. */
static int touch(checker *c, int a, const sp_instr *in, sp_buf b, int mode)
{
    if (persistent(c->plan, b, a)) return 0;
    char bs[64], is[160];
    uint64_t key = sp_buf_key(b);
    int present = sp_bufset_find(&c->live[a], key) != NULL;
    if ((mode & SP_ACCESS_R) && !present) {
        snprintf(c->msg, sizeof c->msg, "actor %d: %s reads %s, which is not on the actor", a,
                 sp_instr_format(in, is, sizeof is), sp_buf_format(b, bs, sizeof bs));
        return -1;
    }
    if (mode == SP_ACCESS_W) {
        if (present) {
            snprintf(c->msg, sizeof c->msg, "actor %d: %s writes %s, which is already there",
                     a, sp_instr_format(in, is, sizeof is), sp_buf_format(b, bs, sizeof bs));
            return -1;
        }
        if (sp_bufset_put(&c->live[a], key, 1)) {
            snprintf(c->msg, sizeof c->msg, "out of memory");
            return -1;
        }
    }
    return 0;
}

static int step_local(checker *c, int a, const sp_instr *in)
{
    const sp_plan *plan = c->plan;
    char bs[64];
    if (in->op == SP_OP_FREE) {
        if (persistent(plan, in->buf, a) || !sp_bufset_del(&c->live[a], sp_buf_key(in->buf))) {
            snprintf(c->msg, sizeof c->msg, "actor %d: FREE %s of a buffer that is not live", a,
                     sp_buf_format(in->buf, bs, sizeof bs));
            return -1;
        }
        return 0;
    }
    if (in->acc + (size_t)in->nacc > plan->naccess) {
        snprintf(c->msg, sizeof c->msg, "actor %d: access list out of range", a);
        return -1;
    }
    for (uint32_t q = 0; q < in->nacc; q++)
        if (touch(c, a, in, plan->access[in->acc + q].buf, plan->access[in->acc + q].mode))
            return -1;
    return 0;
}

sp_status sp_plan_stuck_error(const sp_plan *plan, const int *pc, const char *headline)
{
    char msg[900], s1[128];
    size_t off = (size_t)snprintf(msg, sizeof msg, "%s", headline);
    for (int a = 0; a < plan->nactors && off < sizeof msg - 200; a++)
        if (pc[a] < plan->ninstr[a])
            off += (size_t)snprintf(msg + off, sizeof msg - off, " actor %d waits at %s;", a,
                                    sp_instr_format(&plan->instr[a][pc[a]], s1, sizeof s1));
    return sp_set_error(SP_ERR_SCHEDULE, "%s", msg);
}

sp_status sp_plan_check(const sp_plan *plan)
{
    int p = plan->nactors;
    int64_t nm = plan->nmessages;
    checker c = { .plan = plan };
    int *pc = calloc((size_t)p, sizeof *pc);
    int *work = malloc((size_t)p * sizeof *work);
    char *queued = calloc((size_t)p, 1);
    int64_t *sendpos = malloc((size_t)(nm ? nm : 1) * sizeof *sendpos);
    int64_t *recvpos = malloc((size_t)(nm ? nm : 1) * sizeof *recvpos);
    c.live = calloc((size_t)p, sizeof *c.live);
    sp_status st = SP_OK;
    char s1[160], s2[160];
    if (!pc || !work || !queued || !sendpos || !recvpos || !c.live) {
        st = sp_set_error(SP_ERR_NOMEM, "out of memory checking a plan");
        goto out;
    }
    for (int a = 0; a < p; a++)
        if (sp_bufset_init(&c.live[a], 256)) {
            st = sp_set_error(SP_ERR_NOMEM, "out of memory checking a plan");
            goto out;
        }
    /* 1. Every message once on each end, consistent, and in increasing seq per actor. */
    for (int64_t q = 0; q < nm; q++) sendpos[q] = recvpos[q] = -1;
    for (int a = 0; a < p; a++) {
        int64_t prev = -1;
        for (int j = 0; j < plan->ninstr[a]; j++) {
            const sp_instr *in = &plan->instr[a][j];
            if (in->op < 0 || in->op >= SP_NUM_OPS) {
                st = sp_set_error(SP_ERR_SCHEDULE, "actor %d, instruction %d: bad op %d", a, j,
                                  in->op);
                goto out;
            }
            if (in->op != SP_OP_SEND && in->op != SP_OP_RECV) continue;
            if (in->seq < 0 || in->seq >= nm || in->peer < 0 || in->peer >= p || in->peer == a) {
                st = sp_set_error(SP_ERR_SCHEDULE, "actor %d: %s has a bad seq or peer", a,
                                  sp_instr_format(in, s1, sizeof s1));
                goto out;
            }
            if (in->seq <= prev) {
                st = sp_set_error(SP_ERR_SCHEDULE, "actor %d: %s comes after message #%lld: "
                                  "messages out of the global order", a,
                                  sp_instr_format(in, s1, sizeof s1), (long long)prev);
                goto out;
            }
            prev = in->seq;
            int64_t *slot = in->op == SP_OP_SEND ? &sendpos[in->seq] : &recvpos[in->seq];
            if (*slot >= 0) {
                st = sp_set_error(SP_ERR_SCHEDULE, "actor %d: %s: seq used twice", a,
                                  sp_instr_format(in, s1, sizeof s1));
                goto out;
            }
            *slot = (int64_t)a << 32 | (uint32_t)j;
        }
    }
    for (int64_t q = 0; q < nm; q++) {
        if (sendpos[q] < 0 || recvpos[q] < 0) {
            int64_t have = sendpos[q] >= 0 ? sendpos[q] : recvpos[q];
            if (have < 0) {
                st = sp_set_error(SP_ERR_SCHEDULE, "message #%lld appears on no actor",
                                  (long long)q);
            } else {
                const sp_instr *in = &plan->instr[have >> 32][(uint32_t)have];
                st = sp_set_error(SP_ERR_SCHEDULE, "actor %d: %s has no matching %s",
                                  (int)(have >> 32), sp_instr_format(in, s1, sizeof s1),
                                  sendpos[q] < 0 ? "SEND" : "RECV");
            }
            goto out;
        }
        int sa = (int)(sendpos[q] >> 32), ra = (int)(recvpos[q] >> 32);
        const sp_instr *s = &plan->instr[sa][(uint32_t)sendpos[q]];
        const sp_instr *r = &plan->instr[ra][(uint32_t)recvpos[q]];
        if (s->peer != ra || r->peer != sa || sp_buf_key(s->buf) != sp_buf_key(r->buf)
            || s->bytes != r->bytes) {
            st = sp_set_error(SP_ERR_SCHEDULE, "message #%lld: actor %d %s does not match "
                              "actor %d %s", (long long)q, sa, sp_instr_format(s, s1, sizeof s1),
                              ra, sp_instr_format(r, s2, sizeof s2));
            goto out;
        }
    }
    /* 2. Rendezvous dry run: a SEND and its RECV complete together, when both actors
     * have reached them. Completing everything proves no ordered channel can block. */
    int nw = 0, finished = 0;
    for (int a = 0; a < p; a++) work[nw++] = a, queued[a] = 1;
    while (nw) {
        int a = work[--nw];
        queued[a] = 0;
        while (pc[a] < plan->ninstr[a]) {
            const sp_instr *in = &plan->instr[a][pc[a]];
            if (in->op != SP_OP_SEND && in->op != SP_OP_RECV) {
                if (step_local(&c, a, in)) {
                    st = sp_set_error(SP_ERR_SCHEDULE, "%s", c.msg);
                    goto out;
                }
                pc[a]++;
                continue;
            }
            int b = in->peer;
            const sp_instr *other = pc[b] < plan->ninstr[b] ? &plan->instr[b][pc[b]] : NULL;
            if (!other || other->seq != in->seq || other->op == in->op) break; /* blocked */
            const sp_instr *snd = in->op == SP_OP_SEND ? in : other;
            int sa = in->op == SP_OP_SEND ? a : b, ra = sa == a ? b : a;
            if (touch(&c, sa, snd, snd->buf, SP_ACCESS_R) || touch(&c, ra, snd, snd->buf,
                                                                    SP_ACCESS_W)) {
                st = sp_set_error(SP_ERR_SCHEDULE, "%s", c.msg);
                goto out;
            }
            pc[a]++;
            pc[b]++;
            if (!queued[b]) work[nw++] = b, queued[b] = 1;
        }
    }
    for (int a = 0; a < p; a++) finished += pc[a] == plan->ninstr[a];
    if (finished < p) {
        st = sp_plan_stuck_error(plan, pc, "plan deadlocks on rendezvous channels:");
        goto out;
    }
    /* 3. Nothing transient outlives the step. */
    for (int a = 0; a < p; a++)
        if (c.live[a].n) {
            for (size_t i = 0; i < c.live[a].cap; i++)
                if (c.live[a].key[i]) {
                    uint64_t k = c.live[a].key[i];
                    sp_buf b = { (int)(k >> 60), (int)((k >> 40) & 0xfffff),
                                 (int)((k >> 20) & 0xfffff) - 1, (int)(k & 0xfffff) - 1 };
                    st = sp_set_error(SP_ERR_SCHEDULE, "actor %d: %s is never freed", a,
                                      sp_buf_format(b, s1, sizeof s1));
                    break;
                }
            goto out;
        }
out:
    if (c.live)
        for (int a = 0; a < p; a++) sp_bufset_release(&c.live[a]);
    free(c.live), free(pc), free(work), free(queued), free(sendpos), free(recvpos);
    return st;
}
