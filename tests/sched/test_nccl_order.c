/* NCCL call order: for every built-in schedule, p = 2..8 and several m, on a chain model
 * with a tied weight between the first and last stage, the ncclSend/ncclRecv sequence
 * each actor would issue pairs up across actors (same peers, same order, same sizes),
 * covers every boundary-tensor message above the threshold exactly once on each end
 * (tied-weight transfers stay on StarPU-MPI), and runs to
 * completion when every group blocks until all its calls have a posted partner (NCCL's
 * rendezvous semantics). Thresholds 0 (everything over NCCL) and one that leaves the
 * small tied-weight transfers to StarPU-MPI. */
#include <string.h>

#include "test_util.h"

typedef struct {
    sp_nccl_call *c;
    int n;
} calls;

/* Group-rendezvous run of all actors' call lists: 1 if every call completes. */
static int runs_to_completion(const calls *A, int p, int64_t nmsg)
{
    /* where each message's send and receive sit: actor and call index */
    int *sa = malloc(sizeof(int) * (size_t)nmsg * 4), *si = sa + nmsg, *ra = si + nmsg,
        *ri = ra + nmsg;
    for (int64_t q = 0; q < nmsg; q++) sa[q] = ra[q] = -1;
    for (int a = 0; a < p; a++)
        for (int j = 0; j < A[a].n; j++) {
            const sp_nccl_call *c = &A[a].c[j];
            if (c->op == SP_OP_SEND) sa[c->seq] = a, si[c->seq] = j;
            else ra[c->seq] = a, ri[c->seq] = j;
        }
    int *pos = calloc((size_t)p, sizeof(int)); /* first call of the current group */
    int progress = 1, done = 0;
    while (progress) {
        progress = 0;
        done = 1;
        for (int a = 0; a < p; a++) {
            if (pos[a] == A[a].n) continue;
            done = 0;
            int g = A[a].c[pos[a]].group, end = pos[a], ok = 1;
            while (end < A[a].n && A[a].c[end].group == g) end++;
            for (int j = pos[a]; j < end && ok; j++) {
                const sp_nccl_call *c = &A[a].c[j];
                int pa = c->op == SP_OP_SEND ? ra[c->seq] : sa[c->seq];
                int pj = c->op == SP_OP_SEND ? ri[c->seq] : si[c->seq];
                if (pa < 0) { ok = 0; break; }
                /* the partner is posted when it is in its actor's current group or done */
                int pg = pos[pa] < A[pa].n ? A[pa].c[pos[pa]].group : 1 << 30;
                ok = pj < pos[pa] || A[pa].c[pj].group == pg;
            }
            if (ok) {
                pos[a] = end;
                progress = 1;
            }
        }
    }
    free(pos);
    free(sa);
    return done;
}

static void check(const char *name, int p, int m, int v, size_t threshold)
{
    sp_schedule *sch;
    if (sp_schedule_builtin(name, p, m, v, &sch) != SP_OK) return; /* a stated constraint */
    int S = sch->nstages;
    sp_stage_model *md = sp_test_tied_chain(S);
    sp_plan *plan;
    MUST(sp_plan_build(md, sch, &plan));
    calls *A = calloc((size_t)p, sizeof *A);
    for (int a = 0; a < p; a++) MUST(sp_nccl_calls(plan, a, threshold, &A[a].c, &A[a].n));
    /* per ordered pair: a's sends to b against b's receives from a */
    for (int a = 0; a < p; a++)
        for (int b = 0; b < p; b++) {
            if (a == b) continue;
            int i = 0, j = 0;
            for (;;) {
                while (i < A[a].n && !(A[a].c[i].op == SP_OP_SEND && A[a].c[i].peer == b)) i++;
                while (j < A[b].n && !(A[b].c[j].op == SP_OP_RECV && A[b].c[j].peer == a)) j++;
                if (i == A[a].n || j == A[b].n) {
                    CHECK(i == A[a].n && j == A[b].n, "%s p=%d m=%d: %d -> %d: unmatched %s",
                          name, p, m, a, b, i < A[a].n ? "send" : "receive");
                    break;
                }
                CHECK(A[a].c[i].seq == A[b].c[j].seq && A[a].c[i].bytes == A[b].c[j].bytes,
                      "%s p=%d m=%d: %d -> %d: send #%lld (%zu B) meets receive #%lld (%zu B)",
                      name, p, m, a, b, (long long)A[a].c[i].seq, A[a].c[i].bytes,
                      (long long)A[b].c[j].seq, A[b].c[j].bytes);
                i++, j++;
            }
        }
    /* every message above the threshold once on each end, none below it */
    int64_t expect = 0, got = 0;
    for (int a = 0; a < p; a++) {
        for (int k = 0; k < plan->ninstr[a]; k++) {
            const sp_instr *in = &plan->instr[a][k];
            expect += in->op == SP_OP_SEND && in->bytes >= threshold &&
                      (in->buf.cls == SP_BUF_EDGE_FWD || in->buf.cls == SP_BUF_EDGE_GRAD);
        }
        for (int k = 0; k < A[a].n; k++) {
            got += A[a].c[k].op == SP_OP_SEND;
            CHECK(A[a].c[k].bytes >= threshold, "%s: a call below the threshold", name);
        }
    }
    CHECK(got == expect, "%s p=%d m=%d: %lld NCCL sends for %lld plan messages", name, p, m,
          (long long)got, (long long)expect);
    CHECK(runs_to_completion(A, p, plan->nmessages), "%s p=%d m=%d threshold %zu: deadlock",
          name, p, m, threshold);
    for (int a = 0; a < p; a++) free(A[a].c);
    free(A);
    sp_plan_free(plan);
    sp_stage_model_free(md);
    sp_schedule_free(sch);
}

int main(void)
{
    int cases = 0;
    for (int k = 0; k < sp_schedule_builtin_count(); k++) {
        const char *name = sp_schedule_builtin_info(k)->name;
        int v = sp_test_chunks(name);
        for (int p = 2; p <= 8; p++) {
            int ms[4] = { 1, p, 2 * p, 3 * p + 1 };
            for (int j = 0; j < 4; j++) {
                check(name, p, ms[j], v, 0);
                check(name, p, ms[j], v, 1000);
                cases += 2;
            }
        }
    }
    /* the check must be able to fail: a receive moved ahead of an earlier one deadlocks */
    sp_schedule *sch;
    MUST(sp_schedule_builtin("1f1b", 2, 4, 1, &sch));
    sp_stage_model *md = sp_stage_model_chain(2, 1, 1, 1, 4096);
    sp_plan *plan;
    MUST(sp_plan_build(md, sch, &plan));
    calls A[2];
    for (int a = 0; a < 2; a++) MUST(sp_nccl_calls(plan, a, 0, &A[a].c, &A[a].n));
    int r0 = -1, r1 = -1;
    for (int j = 0; j < A[1].n && r1 < 0; j++)
        if (A[1].c[j].op == SP_OP_RECV) {
            if (r0 < 0) r0 = j;
            else if (A[1].c[j].group != A[1].c[r0].group) r1 = j;
        }
    CHECK(r0 >= 0 && r1 >= 0, "no two receive groups on actor 1");
    if (r0 >= 0 && r1 >= 0) {
        sp_nccl_call t = A[1].c[r0];
        A[1].c[r0] = A[1].c[r1], A[1].c[r1] = t;
        A[1].c[r0].group = A[1].c[r1].group = -1; /* both alone in a group of their own */
        for (int j = 0; j < A[1].n; j++) A[1].c[j].group = j;
        CHECK(!runs_to_completion(A, 2, plan->nmessages), "a swapped receive order ran");
    }
    free(A[0].c), free(A[1].c);
    sp_plan_free(plan);
    sp_stage_model_free(md);
    sp_schedule_free(sch);
    printf("%d schedule cases\n", cases);
    return test_done("test_nccl_order");
}
