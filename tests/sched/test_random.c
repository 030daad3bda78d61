/* Randomized, seeded. (1) 10,000 random valid schedules (random p <= 8, v <= 3,
 * m <= 16, random placement, random B/W split, skip edges and shared weights; per-actor
 * orders cut from a random topological order of the task graph) must plan, pass
 * sp_plan_check and simulate to completion on buffered and rendezvous channels.
 * (2) 10,000 random corruptions (swap, move, drop, duplicate, misplace) must be classified
 * like an independent brute-force check: the dependency rules are rewritten here from
 * docs/planner.md, and deadlock is found by naively running every actor's list. Each
 * rejection has a message; each reported cycle is checked link by link. */
#include <string.h>

#include "test_util.h"

enum { MAXT = 4 * 16 * 24 };

/* Index of (kind, mb, stage) in this file's tables: a layout unlike the planner's. */
static int tix(int k, int i, int s, int m, int S) { return (k * m + i) * S + s; }

typedef struct {
    const sp_stage_model *md;
    int S, m;
    const char *present; /* [4 m S] */
} rules;

/* The tasks `t` waits for, from the written rules; returns their count. */
static int deps(const rules *r, sp_task t, sp_task *out)
{
    int n = 0, S = r->S, m = r->m;
    const sp_stage_model *md = r->md;
#define BACK(i, s) (r->present[tix(SP_TASK_BW, i, s, m, S)] ? SP_TASK_BW : SP_TASK_B)
#define WPART(i, s) (r->present[tix(SP_TASK_BW, i, s, m, S)] ? SP_TASK_BW : SP_TASK_W)
    switch (t.kind) {
    case SP_TASK_F:
        for (int e = 0; e < md->nedges; e++)
            if (md->edge[e].dst_stage == t.stage)
                out[n++] = (sp_task){ SP_TASK_F, t.mb, md->edge[e].src_stage };
        break;
    case SP_TASK_W:
        out[n++] = (sp_task){ SP_TASK_B, t.mb, t.stage };
        break;
    default:
        out[n++] = (sp_task){ SP_TASK_F, t.mb, t.stage };
        for (int e = 0; e < md->nedges; e++)
            if (md->edge[e].src_stage == t.stage && md->edge[e].needs_grad)
                out[n++] = (sp_task){ BACK(t.mb, md->edge[e].dst_stage), t.mb,
                                      md->edge[e].dst_stage };
    }
    if ((t.kind == SP_TASK_W || t.kind == SP_TASK_BW) && t.mb > 0)
        out[n++] = (sp_task){ WPART(t.mb - 1, t.stage), t.mb - 1, t.stage };
#undef BACK
#undef WPART
    return n;
}

/* The brute-force classifier: 1 valid, 0 invalid. */
static int brute_valid(const sp_stage_model *md, const sp_schedule *sch)
{
    int S = sch->nstages, m = sch->nmicro, p = sch->nactors;
    static char cnt[MAXT], done[MAXT];
    memset(cnt, 0, (size_t)4 * m * S);
    memset(done, 0, (size_t)4 * m * S);
    for (int a = 0; a < p; a++)
        for (int j = 0; j < sch->ntasks[a]; j++) {
            sp_task t = sch->tasks[a][j];
            if (t.kind < 0 || t.kind > 3 || t.mb < 0 || t.mb >= m || t.stage < 0 || t.stage >= S)
                return 0;
            if (sch->stage_actor[t.stage] != a) return 0;
            if (++cnt[tix(t.kind, t.mb, t.stage, m, S)] > 1) return 0;
        }
    for (int i = 0; i < m; i++)
        for (int s = 0; s < S; s++) {
            int f = cnt[tix(0, i, s, m, S)], b = cnt[tix(1, i, s, m, S)];
            int w = cnt[tix(2, i, s, m, S)], bw = cnt[tix(3, i, s, m, S)];
            if (!f || !((bw && !b && !w) || (!bw && b && w))) return 0;
        }
    rules r = { md, S, m, cnt };
    int pos[8] = { 0 }, progress = 1;
    sp_task d[64];
    while (progress) {
        progress = 0;
        for (int a = 0; a < p; a++)
            while (pos[a] < sch->ntasks[a]) {
                sp_task t = sch->tasks[a][pos[a]];
                int n = deps(&r, t, d), ok = 1;
                for (int q = 0; q < n && ok; q++) ok = done[tix(d[q].kind, d[q].mb, d[q].stage, m, S)];
                if (!ok) break;
                done[tix(t.kind, t.mb, t.stage, m, S)] = 1;
                pos[a]++;
                progress = 1;
            }
    }
    for (int a = 0; a < p; a++)
        if (pos[a] < sch->ntasks[a]) return 0;
    return 1;
}

static sp_stage_model *random_model(rng *g, int S)
{
    sp_stage_model *md = sp_stage_model_chain(S, 1, 1, 1, 1);
    for (int s = 0; s < S; s++) {
        sp_stage_info *st = &md->stage[s];
        for (int k = 0; k < 3; k++) st->cost[k] = 1 + rng_int(g, 3);
        st->cost[SP_TASK_BW] = st->cost[SP_TASK_B] + st->cost[SP_TASK_W];
        st->act_bytes = 1 + (size_t)rng_int(g, 100);
        st->bgrad_bytes = (size_t)rng_int(g, 50);
        st->param_bytes = (size_t)rng_int(g, 1000);
        st->opt_bytes = 2 * st->param_bytes;
    }
    for (int e = 0; e < md->nedges; e++) md->edge[e].bytes = 1 + (size_t)rng_int(g, 4096);
    int extra = S >= 3 ? rng_int(g, 3) : 0;
    if (extra) {
        md->edge = realloc(md->edge, (size_t)(md->nedges + extra) * sizeof *md->edge);
        for (int k = 0; k < extra; k++) {
            int src = rng_int(g, S - 2), dst = src + 2 + rng_int(g, S - src - 2);
            md->edge[md->nedges++] = (sp_stage_edge){ src, dst, 1 + (size_t)rng_int(g, 512),
                                                      rng_int(g, 4) != 0 };
        }
    }
    if (S >= 2 && rng_int(g, 10) < 4) {
        md->nshared = 1 + rng_int(g, 2);
        md->shared = calloc((size_t)md->nshared, sizeof *md->shared);
        for (int k = 0; k < md->nshared; k++) {
            sp_stage_shared *sh = &md->shared[k];
            sh->bytes = 1 + (size_t)rng_int(g, 300);
            sh->single_use = rng_int(g, 2);
            for (int s = 0; s < S && sh->nstages < 8; s++)
                if (s == 0 || s == S - 1 || rng_int(g, 4) == 0) sh->stages[sh->nstages++] = s;
        }
    }
    return md;
}

/* A valid schedule: random placement (v stages per actor), random B/W split, actor lists
 * cut from one random topological order. */
static sp_schedule *random_valid(rng *g, const sp_stage_model *md, int p, int m)
{
    int S = md->nstages;
    sp_schedule *sch = sp_schedule_create(p, S, m);
    int perm[24];
    for (int s = 0; s < S; s++) perm[s] = s;
    for (int s = S - 1; s > 0; s--) {
        int j = rng_int(g, s + 1), t = perm[s];
        perm[s] = perm[j], perm[j] = t;
    }
    for (int s = 0; s < S; s++) sch->stage_actor[perm[s]] = s % p;
    static char present[MAXT];
    memset(present, 0, (size_t)4 * m * S);
    int nt = 0;
    static sp_task tasks[MAXT];
    for (int i = 0; i < m; i++)
        for (int s = 0; s < S; s++) {
            tasks[nt++] = (sp_task){ SP_TASK_F, i, s };
            present[tix(SP_TASK_F, i, s, m, S)] = 1;
            if (rng_int(g, 2)) {
                tasks[nt++] = (sp_task){ SP_TASK_BW, i, s };
                present[tix(SP_TASK_BW, i, s, m, S)] = 1;
            } else {
                tasks[nt++] = (sp_task){ SP_TASK_B, i, s };
                tasks[nt++] = (sp_task){ SP_TASK_W, i, s };
                present[tix(SP_TASK_B, i, s, m, S)] = present[tix(SP_TASK_W, i, s, m, S)] = 1;
            }
        }
    rules r = { md, S, m, present };
    /* successor lists from the dependency rules, then a random Kahn order */
    static int indeg[MAXT], ready[MAXT], qof[MAXT], soff[MAXT + 1], succ[MAXT * 40];
    sp_task d[64];
    for (int q = 0; q < nt; q++) qof[tix(tasks[q].kind, tasks[q].mb, tasks[q].stage, m, S)] = q;
    memset(soff, 0, (size_t)(nt + 1) * sizeof *soff);
    for (int q = 0; q < nt; q++) {
        int n = deps(&r, tasks[q], d);
        indeg[q] = n;
        for (int j = 0; j < n; j++) soff[qof[tix(d[j].kind, d[j].mb, d[j].stage, m, S)] + 1]++;
    }
    for (int q = 0; q < nt; q++) soff[q + 1] += soff[q];
    static int fill[MAXT];
    memcpy(fill, soff, (size_t)nt * sizeof *fill);
    for (int q = 0; q < nt; q++) {
        int n = deps(&r, tasks[q], d);
        for (int j = 0; j < n; j++) succ[fill[qof[tix(d[j].kind, d[j].mb, d[j].stage, m, S)]]++] = q;
    }
    int nready = 0;
    for (int q = 0; q < nt; q++)
        if (!indeg[q]) ready[nready++] = q;
    for (int placed = 0; placed < nt; placed++) {
        if (!nready) {
            fprintf(stderr, "random_valid: task graph has a cycle?\n");
            exit(1);
        }
        int k = rng_int(g, nready), q = ready[k];
        ready[k] = ready[--nready];
        sp_task t = tasks[q];
        sp_schedule_append(sch, sch->stage_actor[t.stage], (sp_task_kind)t.kind, t.mb, t.stage);
        for (int j = soff[q]; j < soff[q + 1]; j++)
            if (--indeg[succ[j]] == 0) ready[nready++] = succ[j];
    }
    return sch;
}

static void corrupt(rng *g, sp_schedule *s, int *kind_out)
{
    int a;
    do a = rng_int(g, s->nactors);
    while (!s->ntasks[a]);
    int n = s->ntasks[a], op = rng_int(g, 10);
    sp_task *v = s->tasks[a];
    *kind_out = op;
    if (op <= 3) { /* swap two tasks (half of them adjacent) */
        int i = rng_int(g, n), j = op <= 1 && n > 1 ? (i + 1) % n : rng_int(g, n);
        sp_task t = v[i];
        v[i] = v[j], v[j] = t;
    } else if (op <= 5) { /* move one task elsewhere in the list */
        int i = rng_int(g, n), j = rng_int(g, n);
        sp_task t = v[i];
        memmove(v + i, v + i + 1, (size_t)(n - i - 1) * sizeof *v);
        memmove(v + j + 1, v + j, (size_t)(n - 1 - j) * sizeof *v);
        v[j] = t;
    } else if (op == 6) { /* drop */
        int i = rng_int(g, n);
        memmove(v + i, v + i + 1, (size_t)(n - i - 1) * sizeof *v);
        s->ntasks[a]--;
    } else if (op == 7) { /* duplicate */
        sp_task t = v[rng_int(g, n)];
        sp_schedule_append(s, a, (sp_task_kind)t.kind, t.mb, t.stage);
        v = s->tasks[a];
        int j = rng_int(g, n + 1);
        memmove(v + j + 1, v + j, (size_t)(n - j) * sizeof *v);
        v[j] = t;
    } else { /* misplace: move a task to another actor (or, with one actor, a bad stage) */
        int i = rng_int(g, n);
        sp_task t = v[i];
        if (s->nactors == 1) {
            v[i].mb = (v[i].mb + 1) % s->nmicro; /* now a duplicate or a swap */
            return;
        }
        memmove(v + i, v + i + 1, (size_t)(n - i - 1) * sizeof *v);
        s->ntasks[a]--;
        int b = (a + 1 + rng_int(g, s->nactors - 1)) % s->nactors;
        sp_schedule_append(s, b, (sp_task_kind)t.kind, t.mb, t.stage);
        int nb = s->ntasks[b], j = rng_int(g, nb);
        sp_task *w = s->tasks[b];
        memmove(w + j + 1, w + j, (size_t)(nb - 1 - j) * sizeof *w);
        w[j] = t;
    }
}

static int position(const sp_schedule *s, sp_task t, int *actor)
{
    for (int a = 0; a < s->nactors; a++)
        for (int j = 0; j < s->ntasks[a]; j++) {
            sp_task u = s->tasks[a][j];
            if (u.kind == t.kind && u.mb == t.mb && u.stage == t.stage) {
                *actor = a;
                return j;
            }
        }
    return -1;
}

/* Each link of a reported cycle must be real: an earlier task on the same actor, or a
 * dependency by this file's rules. */
static void check_cycle(const sp_stage_model *md, const sp_schedule *s)
{
    sp_task cyc[MAXT];
    int n = sp_schedule_find_cycle(s, md, cyc, MAXT);
    CHECK(n > 0, "rejected for a cycle but no cycle found: %s", sp_last_error());
    if (n <= 0 || n > MAXT) return;
    static char present[MAXT];
    int m = s->nmicro, S = s->nstages;
    memset(present, 0, (size_t)4 * m * S);
    for (int a = 0; a < s->nactors; a++)
        for (int j = 0; j < s->ntasks[a]; j++)
            present[tix(s->tasks[a][j].kind, s->tasks[a][j].mb, s->tasks[a][j].stage, m, S)] = 1;
    rules r = { md, S, m, present };
    sp_task d[64];
    for (int j = 0; j < n; j++) {
        sp_task u = cyc[j], w = cyc[(j + 1) % n];
        int au = -1, aw = -2, pu = position(s, u, &au), pw = position(s, w, &aw), ok = 0;
        if (au == aw && pw < pu) ok = 1;
        int nd = deps(&r, u, d);
        for (int q = 0; q < nd; q++)
            ok |= d[q].kind == w.kind && d[q].mb == w.mb && d[q].stage == w.stage;
        char a1[32], a2[32];
        CHECK(ok, "cycle link %s -> %s is not a real wait", sp_task_format(u, a1, sizeof a1),
              sp_task_format(w, a2, sizeof a2));
    }
}

static void plan_and_run(const sp_stage_model *md, const sp_schedule *s, int rendezvous)
{
    sp_plan *plan;
    MUST(sp_plan_build(md, s, &plan));
    MUST(sp_plan_check(plan));
    int64_t sends = 0, recvs = 0;
    int runs = 0;
    for (int a = 0; a < plan->nactors; a++)
        for (int j = 0; j < plan->ninstr[a]; j++) {
            sends += plan->instr[a][j].op == SP_OP_SEND;
            recvs += plan->instr[a][j].op == SP_OP_RECV;
            runs += plan->instr[a][j].op == SP_OP_RUN;
        }
    CHECK(sends == plan->nmessages && recvs == plan->nmessages, "messages %lld sends %lld "
          "recvs %lld", (long long)plan->nmessages, (long long)sends, (long long)recvs);
    CHECK(runs == sp_schedule_total_tasks(s), "RUNs %d vs tasks %d", runs,
          sp_schedule_total_tasks(s));
    sp_sim_config cfg = { .latency = 0.5, .bandwidth = 2048, .rendezvous = rendezvous };
    sp_sim_result *res;
    MUST(sp_simulate(plan, md, &cfg, &res));
    for (int a = 0; a < plan->nactors; a++)
        CHECK(res->peak[a].total == plan->peak[a].total, "sim/plan memory differ on actor %d", a);
    sp_sim_result_free(res);
    sp_plan_free(plan);
}

int main(int argc, char **argv)
{
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20240611;
    rng g = { seed };
    printf("test_random: seed %llu\n", (unsigned long long)seed);
    const int NVALID = 10000, NCORRUPT = 10000;
    for (int it = 0; it < NVALID; it++) {
        int p = 1 + rng_int(&g, 8), v = 1 + rng_int(&g, 3), m = 1 + rng_int(&g, 16);
        sp_stage_model *md = random_model(&g, p * v);
        sp_schedule *s = random_valid(&g, md, p, m);
        CHECK(brute_valid(md, s), "generator made an invalid schedule (it %d)", it);
        sp_status st = sp_schedule_validate(s, md);
        CHECK(st == SP_OK, "valid schedule rejected (it %d p=%d v=%d m=%d): %s", it, p, v, m,
              sp_last_error());
        if (st == SP_OK) plan_and_run(md, s, it & 1);
        sp_schedule_free(s);
        sp_stage_model_free(md);
    }
    int accepted = 0, rejected = 0, by_kind[10][2] = { { 0 } };
    for (int it = 0; it < NCORRUPT; it++) {
        /* Smaller sizes keep the brute force quick; built-ins are corrupted too. */
        int p = 1 + rng_int(&g, 6), v = 1 + rng_int(&g, 3), m = 1 + rng_int(&g, 8), op;
        sp_stage_model *md;
        sp_schedule *s;
        if (it % 4 == 0) {
            static const char *names[] = { "gpipe", "1f1b", "eager-1f1b", "zb-h1", "zb-v",
                                           "dualpipe-v", "interleaved-1f1b" };
            int k = rng_int(&g, 7);
            int mm = k == 5 ? 2 * p + m : k == 6 ? p * (1 + m % 3) : m;
            MUST(sp_schedule_builtin(names[k], p, mm, k >= 4 ? 2 : k == 6 ? 2 : 0, &s));
            md = sp_stage_model_chain(s->nstages, 1, 1, 1, 8);
        } else {
            md = random_model(&g, p * v);
            s = random_valid(&g, md, p, m);
        }
        corrupt(&g, s, &op);
        int want = brute_valid(md, s);
        sp_clear_error();
        sp_status st = sp_schedule_validate(s, md);
        int got = st == SP_OK;
        CHECK(got == want, "corruption %d (op %d): planner says %s, brute force says %s (%s)",
              it, op, got ? "valid" : "invalid", want ? "valid" : "invalid", sp_last_error());
        by_kind[op][got]++;
        if (got) {
            accepted++;
            plan_and_run(md, s, it & 1);
        } else {
            rejected++;
            CHECK(st == SP_ERR_SCHEDULE && sp_last_error()[0], "rejection without a message");
            if (strstr(sp_last_error(), "cycle")) {
                CHECK(strstr(sp_last_error(), "waits for") != NULL, "cycle message: %s",
                      sp_last_error());
                check_cycle(md, s);
            }
        }
        sp_schedule_free(s);
        sp_stage_model_free(md);
    }
    printf("test_random: %d valid schedules planned; %d corruptions: %d still valid, %d "
           "rejected\n", NVALID, NCORRUPT, accepted, rejected);
    printf("  per op (valid/rejected): swap-adjacent %d/%d, swap %d/%d, move %d/%d, drop %d/%d, "
           "dup %d/%d, misplace %d/%d\n", by_kind[0][1] + by_kind[1][1],
           by_kind[0][0] + by_kind[1][0], by_kind[2][1] + by_kind[3][1],
           by_kind[2][0] + by_kind[3][0], by_kind[4][1] + by_kind[5][1],
           by_kind[4][0] + by_kind[5][0], by_kind[6][1], by_kind[6][0], by_kind[7][1],
           by_kind[7][0], by_kind[8][1] + by_kind[9][1], by_kind[8][0] + by_kind[9][0]);
    CHECK(accepted > 500 && rejected > 5000, "corruptions should land on both sides");
    return test_done("test_random");
}
