/* sp_pool_pack (sched/pool.c), the runtime's buffer pool planned ahead of the step:
 *   - every packing is valid: each buffer in a slot at least its size (exactly, when
 *     exact), no two buffers alive at once in one slot, earlier slots kept at their sizes;
 *   - it never beats the peak of live bytes (a lower bound: a packing below it would be
 *     invalid) and stays within 1.4x of the optimum (worst seen 4/3, mean 1.0005), found
 *     by brute force over every partition of up to 8 buffers into slots, on 3000 random
 *     walks;
 *   - the interleaved-1F1B step that made a greedy pool hold 1.32x the plan's bytes packs
 *     to its optimum;
 *   - sp_plan_pool_bytes of every built-in's plan is never below the plan's peaks of
 *     activations and boundary tensors, and equal to their sum with one stage per actor.
 * Writes the mean and worst ratio to the optimum. */
#include "test_util.h"

static size_t live_peak(const sp_lifetime *x, int n)
{
    size_t peak = 0;
    for (int i = 0; i < n; i++) { /* the peak is at some buffer's start */
        size_t live = 0;
        for (int j = 0; j < n; j++)
            if (x[j].from <= x[i].from && x[i].from < x[j].to) live += x[j].size;
        if (live > peak) peak = live;
    }
    return peak;
}

/* Checks the packing; returns its total size. */
static size_t check_packing(const sp_lifetime *x, int n, const sp_pool_slot *slot, int ns,
                            const size_t *before, int nbefore, const int *of)
{
    size_t total = 0;
    for (int s = 0; s < ns; s++) total += slot[s].size;
    for (int s = 0; s < nbefore; s++)
        CHECK(slot[s].size == before[s], "slot %d grew from %zu to %zu", s, before[s], slot[s].size);
    for (int i = 0; i < n; i++) {
        CHECK(of[i] >= 0 && of[i] < ns, "buffer %d in slot %d of %d", i, of[i], ns);
        if (of[i] < 0 || of[i] >= ns) continue;
        size_t f = slot[of[i]].size;
        CHECK(x[i].exact ? f == x[i].size : f >= x[i].size,
              "buffer %d (%zu%s) in a slot of %zu", i, x[i].size, x[i].exact ? ", exact" : "", f);
        for (int j = 0; j < i; j++)
            CHECK(of[i] != of[j] || x[i].to <= x[j].from || x[j].to <= x[i].from,
                  "buffers %d [%ld,%ld) and %d [%ld,%ld) alive at once in slot %d", i,
                  (long)x[i].from, (long)x[i].to, j, (long)x[j].from, (long)x[j].to, of[i]);
    }
    return total;
}

/* The optimum by brute force: every partition of the buffers into groups (restricted
 * growth strings), a group valid when its buffers never overlap and its exact ones agree
 * with its largest; its cost the largest size. */
static size_t best;
static void search(const sp_lifetime *x, int n, int i, int *grp, int ngrp, size_t cost_sofar)
{
    if (cost_sofar >= best) return;
    if (i == n) {
        best = cost_sofar;
        return;
    }
    for (int g = 0; g <= ngrp; g++) {
        int ok = 1;
        size_t mx = x[i].size, old = 0;
        for (int j = 0; j < i && ok; j++) {
            if (grp[j] != g) continue;
            ok = x[i].to <= x[j].from || x[j].to <= x[i].from;
            if (x[j].size > old) old = x[j].size;
        }
        if (!ok) continue;
        if (old > mx) mx = old;
        for (int j = 0; j < i && ok; j++) /* exact buffers need a slot of their size */
            if (grp[j] == g && x[j].exact) ok = x[j].size == mx;
        if (!ok || (x[i].exact && x[i].size != mx)) continue;
        grp[i] = g;
        search(x, n, i + 1, grp, g == ngrp ? ngrp + 1 : ngrp, cost_sofar + mx - old);
    }
}

int main(void)
{
    rng r = { 42 };
    double sum = 0, worst = 0;
    const int trials = 3000;
    for (int trial = 0; trial < trials; trial++) {
        int n = 1 + rng_int(&r, 8);
        sp_lifetime x[8];
        int64_t clock = 0;
        int open[8], nopen = 0, made = 0;
        /* a walk: takes and gives interleaved, every buffer given back */
        while (made < n || nopen > 0) {
            if (made < n && (nopen == 0 || rng_int(&r, 2))) {
                static const size_t sizes[] = { 4, 5, 6, 8, 8, 10 };
                x[made] = (sp_lifetime){ sizes[rng_int(&r, 6)], rng_int(&r, 4) == 0, clock++, -1 };
                open[nopen++] = made++;
            } else {
                int k = rng_int(&r, nopen);
                x[open[k]].to = clock++;
                open[k] = open[--nopen];
            }
        }
        sp_pool_slot *slot = NULL;
        int ns = 0, of[8];
        MUST(sp_pool_pack(x, n, &slot, &ns, of));
        size_t got = check_packing(x, n, slot, ns, NULL, 0, of);
        int grp[8];
        best = (size_t)-1;
        search(x, n, 0, grp, 0, 0);
        CHECK(got >= live_peak(x, n), "trial %d: %zu below the live peak %zu", trial, got,
              live_peak(x, n));
        CHECK(got >= best, "trial %d: %zu below the optimum %zu: the search is wrong", trial,
              got, best);
        double ratio = (double)got / (double)best;
        CHECK(ratio <= 1.4, "trial %d: %zu against the optimum %zu (n = %d)", trial, got, best, n);
        sum += ratio;
        if (ratio > worst) worst = ratio;
        /* a second walk (an evaluation) on the same slots: valid, and they keep their sizes */
        size_t before[64];
        int nb = ns;
        for (int s = 0; s < ns; s++) before[s] = slot[s].size;
        MUST(sp_pool_pack(x, n, &slot, &ns, of));
        check_packing(x, n, slot, ns, before, nb, of);
        free(slot);
    }
    /* interleaved-1F1B, GPT defaults, p = 1 (two stages on the rank), m = 2: the takes
     * of runtime/buffers.c's dry walk; the optimum keeps stage 0's two activations
     * (A, D) apart from each other and from B, C, E, F where they overlap */
    const sp_lifetime il[] = {
        { 905216, 0, 0, 12 },   { 16384, 1, 1, 7 },     { 1036801, 0, 2, 6 },
        { 966657, 0, 3, 5 },    { 16384, 1, 4, 13 },    { 905216, 0, 8, 22 },
        { 16384, 1, 9, 19 },    { 901120, 0, 10, 11 },  { 1036801, 0, 14, 18 },
        { 966657, 0, 15, 17 },  { 16384, 1, 16, 23 },   { 901120, 0, 20, 21 },
    };
    int n = (int)(sizeof il / sizeof *il), of[12];
    sp_pool_slot *slot = NULL;
    int ns = 0;
    MUST(sp_pool_pack(il, n, &slot, &ns, of));
    size_t got = check_packing(il, n, slot, ns, NULL, 0, of);
    best = (size_t)-1;
    int grp[12];
    search(il, n, 0, grp, 0, 0);
    printf("interleaved-1f1b p=1: packed %zu floats, optimum %zu, live peak %zu (the greedy "
           "pool held 3907586)\n", got, best, live_peak(il, n));
    CHECK(got == best, "interleaved: %zu, the optimum %zu", got, best);
    free(slot);
    printf("random walks: %d, packed / optimum mean %.4f, worst %.4f\n", trials, sum / trials, worst);
    /* sp_plan_pool_bytes: every built-in, p = 2 and 4, on a chain whose stages differ in
     * activation size (stage s: 1000 (s + 1) bytes): never below the plan's peaks,
     * and equal to it for the one-stage-per-actor schedules, whose buffers of one class
     * all have one size */
    for (int b = 0; b < sp_schedule_builtin_count(); b++)
        for (int p = 2; p <= 4; p += 2) {
            const char *name = sp_schedule_builtin_info(b)->name;
            int v = sp_test_chunks(name);
            sp_stage_model *md = sp_test_tied_chain(p * v);
            for (int st = 0; st < p * v; st++) md->stage[st].act_bytes = 1000 * (size_t)(st + 1);
            sp_schedule *sch = NULL;
            sp_plan *pl = NULL;
            MUST(sp_schedule_builtin(name, p, 2 * p, v, &sch));
            MUST(sp_plan_build(md, sch, &pl));
            for (int a = 0; a < p; a++) {
                /* the peak of activations and boundary tensors together: no pool holds
                 * them in less, and with one stage per actor the packing reaches it */
                const sp_mem_peak *k = &pl->peak[a];
                size_t pool = 0, sum = k->acts + k->boundary;
                MUST(sp_plan_pool_bytes(pl, md, a, &pool));
                CHECK(k->transient >= k->acts && k->transient >= k->boundary &&
                          k->transient <= sum,
                      "%s p=%d actor %d: live peak %zu against peaks %zu and %zu", name, p, a,
                      k->transient, k->acts, k->boundary);
                CHECK(pool >= k->transient && pool <= 2 * sum,
                      "%s p=%d actor %d: pool %zu against the live peak %zu", name, p, a, pool,
                      k->transient);
                CHECK(v > 1 || pool == k->transient, "%s p=%d actor %d: pool %zu, live peak %zu",
                      name, p, a, pool, k->transient);
            }
            sp_plan_free(pl);
            sp_schedule_free(sch);
            sp_stage_model_free(md);
        }
    return test_done("test_pool");
}
