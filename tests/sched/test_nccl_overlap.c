/* NCCL beside compute (comm/nccl.c): each actor dispatches its plan's instructions in
 * order on one worker; an NCCL group is issued at its first call, returns at once and
 * runs on the actor's own in-order NCCL stream, where a group completes when every call
 * in it has its partner posted (rendezvous); compute never blocks that stream. Modelled
 * conservatively (a task waits for every earlier receive and an issued group for every
 * earlier task, which only adds waits): for every built-in schedule, p = 2..6, several m,
 * everything on NCCL or only large tensors, the step runs to completion — no interleaving
 * of NCCL calls with compute tasks can deadlock. And the model can fail: two receives
 * swapped on one actor's stream are caught. */
#include <string.h>

#include "test_util.h"

/* Phase-1 instructions only (the update phase runs after a global agreement). */
static int in_pipeline(const sp_instr *in)
{
    if (in->op == SP_OP_OPTIMIZER) return 0;
    if ((in->op == SP_OP_SEND || in->op == SP_OP_RECV) && in->buf.cls == SP_BUF_SHARED_PARAM)
        return 0;
    return 1;
}

typedef struct {
    sp_nccl_call *c;
    int n;
    int *group_of; /* [ninstr]: NCCL group of an instruction, -1 if not NCCL */
    int ngroups;
    int *issued;   /* [ngroups]: 1 once dispatched onto the stream */
    int *done;     /* [ngroups] */
    int head;      /* the stream's first group not done */
} actor_state;

/* 1 when the whole plan completes under the model. */
static int completes(const sp_plan *pl, size_t threshold)
{
    int p = pl->nactors;
    int64_t nm = pl->nmessages;
    actor_state *A = calloc((size_t)p, sizeof *A);
    int *pc = calloc((size_t)p, sizeof(int));
    /* StarPU-MPI messages: buffered, done when the send is dispatched */
    char *sent = calloc((size_t)(nm ? nm : 1), 1);
    /* NCCL messages: where each end sits (actor, group) */
    int *sg = malloc(sizeof(int) * (size_t)(nm ? nm : 1) * 4), *sa = sg + nm, *rg = sa + nm,
        *ra = rg + nm;
    for (int64_t q = 0; q < nm; q++) sg[q] = rg[q] = -1;
    for (int a = 0; a < p; a++) {
        MUST(sp_nccl_calls(pl, a, threshold, &A[a].c, &A[a].n));
        A[a].group_of = malloc(sizeof(int) * (size_t)(pl->ninstr[a] + 1));
        for (int i = 0; i < pl->ninstr[a]; i++) A[a].group_of[i] = -1;
        for (int k = 0; k < A[a].n; k++) {
            const sp_nccl_call *c = &A[a].c[k];
            A[a].group_of[c->instr] = c->group;
            if (c->group + 1 > A[a].ngroups) A[a].ngroups = c->group + 1;
            if (c->op == SP_OP_SEND) sg[c->seq] = c->group, sa[c->seq] = a;
            else rg[c->seq] = c->group, ra[c->seq] = a;
        }
        A[a].issued = calloc((size_t)A[a].ngroups + 1, sizeof(int));
        A[a].done = calloc((size_t)A[a].ngroups + 1, sizeof(int));
    }
    int progress = 1;
    while (progress) {
        progress = 0;
        for (int a = 0; a < p; a++) {
            actor_state *s = &A[a];
            /* the stream: its head group completes once every partner is posted */
            while (s->head < s->ngroups && s->issued[s->head]) {
                int ok = 1;
                for (int k = 0; k < s->n && ok; k++) {
                    const sp_nccl_call *c = &s->c[k];
                    if (c->group != s->head) continue;
                    int pa = c->op == SP_OP_SEND ? ra[c->seq] : sa[c->seq];
                    int pg = c->op == SP_OP_SEND ? rg[c->seq] : sg[c->seq];
                    /* posted: issued and at its stream's head, or already done */
                    ok = pa >= 0 && A[pa].issued[pg] && (A[pa].done[pg] || A[pa].head == pg);
                }
                if (!ok) break;
                s->done[s->head++] = 1;
                progress = 1;
            }
            /* the worker: the next instruction, in order */
            while (pc[a] < pl->ninstr[a]) {
                const sp_instr *in = &pl->instr[a][pc[a]];
                if (!in_pipeline(in)) {
                    pc[a]++;
                    continue;
                }
                int g = s->group_of[pc[a]];
                if (g >= 0) { /* issued at its first call: every earlier task has ended */
                    s->issued[g] = 1;
                    pc[a]++;
                } else if (in->op == SP_OP_SEND) {
                    sent[in->seq] = 1;
                    pc[a]++;
                } else if (in->op == SP_OP_RECV) {
                    if (!sent[in->seq]) break;
                    pc[a]++;
                } else { /* a task: every earlier NCCL group done (its receives arrived) */
                    int ready = 1;
                    for (int k = 0; k < pc[a] && ready; k++)
                        if (s->group_of[k] >= 0 && !s->done[s->group_of[k]]) ready = 0;
                    if (!ready) break;
                    pc[a]++;
                }
                progress = 1;
            }
        }
    }
    int ok = 1;
    for (int a = 0; a < p; a++) {
        ok &= pc[a] == pl->ninstr[a] && A[a].head == A[a].ngroups;
        free(A[a].c), free(A[a].group_of), free(A[a].issued), free(A[a].done);
    }
    free(A), free(pc), free(sent), free(sg);
    return ok;
}

int main(void)
{
    int cases = 0;
    for (int k = 0; k < sp_schedule_builtin_count(); k++) {
        const char *name = sp_schedule_builtin_info(k)->name;
        int v = sp_test_chunks(name);
        for (int p = 2; p <= 6; p++) {
            int ms[3] = { p, 2 * p, 3 * p + 1 };
            for (int j = 0; j < 3; j++) {
                sp_schedule *sch;
                if (sp_schedule_builtin(name, p, ms[j], v, &sch) != SP_OK) continue;
                sp_stage_model *md = sp_test_tied_chain(sch->nstages);
                sp_plan *pl;
                MUST(sp_plan_build(md, sch, &pl));
                CHECK(completes(pl, 0), "%s p=%d m=%d: NCCL beside compute deadlocks", name, p,
                      ms[j]);
                CHECK(completes(pl, 1000), "%s p=%d m=%d (large tensors on NCCL): deadlocks",
                      name, p, ms[j]);
                cases += 2;
                sp_plan_free(pl);
                sp_stage_model_free(md);
                sp_schedule_free(sch);
            }
        }
    }
    /* the model can fail: actor 1's first two receives swapped (the second message's
     * receive first on its stream, while actor 0's stream sends the first first) */
    sp_schedule *sch;
    MUST(sp_schedule_builtin("1f1b", 2, 4, 1, &sch));
    sp_stage_model *md = sp_test_tied_chain(2);
    sp_plan *pl;
    MUST(sp_plan_build(md, sch, &pl));
    sp_instr *prog = pl->instr[1];
    int r0 = -1, r1 = -1;
    for (int i = 0; i < pl->ninstr[1]; i++)
        if (prog[i].op == SP_OP_RECV && prog[i].buf.cls == SP_BUF_EDGE_FWD) {
            if (r0 < 0) r0 = i;
            else if (r1 < 0) r1 = i;
        }
    if (r0 < 0 || r1 < 0) {
        fprintf(stderr, "FAIL: 1f1b plan without two forward receives on actor 1\n");
        return 1;
    }
    CHECK(completes(pl, 0), "the unmodified 1f1b plan should complete");
    sp_instr t = prog[r0];
    prog[r0] = prog[r1];
    prog[r1] = t;
    CHECK(!completes(pl, 0), "two receives swapped on one NCCL stream: not caught");
    sp_plan_free(pl);
    sp_stage_model_free(md);
    sp_schedule_free(sch);
    if (sp_test_failures) return 1;
    printf("ok: NCCL beside compute completes in %d plans; a broken order is caught\n", cases);
    return 0;
}
