/* The apps' default cut (apps/cut.c) against brute force: for GPTs whose head weighs from
 * a fraction of a block to several, on 2 to 4 stages, the cut it picks has the least
 * largest stage of every cut the model takes, each candidate's cost read from its own
 * S-stage program (not the fine cut the function measures with); the even cut when it
 * ties; a cut given by --stage-layers left alone. No MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/cut.h"
#include "apps/reference.h"
#include "starpipe/models.h"
#include "tests/check.h"

typedef struct {
    sp_gpt_config c;
    int cut[64], ncut, given;
} fake;

static sp_graph *build(void *cfg, int stages, int tensor, int trank, sp_status *st)
{
    fake *f = cfg;
    sp_gpt_config c = f->c;
    c.stages = stages, c.tensor = tensor, c.tensor_rank = trank;
    c.stage_layers = f->ncut == stages ? f->cut : NULL;
    return sp_model_gpt(&c, st);
}
static int layers(void *cfg) { return ((fake *)cfg)->given ? 0 : ((fake *)cfg)->c.layers; }
static void set_cut(void *cfg, const int *n, int stages)
{
    fake *f = cfg;
    f->ncut = n ? stages : 0;
    if (n) memcpy(f->cut, n, (size_t)stages * sizeof *n);
}

/* The largest stage of cut n (F + BW FLOPs of its own S-stage program). */
static double largest_of(fake *f, const sp_app_opts *o, const int *n, int S)
{
    set_cut(f, n, S);
    sp_status st;
    sp_graph *g = build(f, S, 1, 0, &st);
    sp_program *p = g ? app_program(g, o, 1, &st) : NULL;
    double worst = -1;
    for (int s = 0; p && s < S; s++) {
        double x = sp_program_flops(p, s, SP_TASK_F) + sp_program_flops(p, s, SP_TASK_BW);
        if (x > worst) worst = x;
    }
    sp_program_free(p);
    sp_graph_free(g);
    set_cut(f, NULL, 0);
    return worst;
}

/* Every cut of L blocks into S stages (middle stages one block at least): the least
 * largest stage. */
static double brute(fake *f, const sp_app_opts *o, int L, int S, int *n, int s, int left)
{
    if (s == S - 1) {
        n[s] = left;
        return largest_of(f, o, n, S);
    }
    double best = -1;
    for (int k = s == 0 ? 0 : 1; k <= left - (S - 2 - s > 0 ? S - 2 - s : 0); k++) {
        n[s] = k;
        double x = brute(f, o, L, S, n, s + 1, left - k);
        if (x >= 0 && (best < 0 || x < best)) best = x;
    }
    return best;
}

int main(void)
{
    sp_app_opts o = { 0 };
    struct { int layers, channels, vocab; } shapes[] = {
        { 4, 64, 256 }, { 6, 32, 4096 }, { 8, 16, 2048 }, { 5, 32, 512 }, { 7, 16, 8192 },
    };
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
        for (int S = 2; S <= 4; S++) {
            fake f = { .c = { .vocab = shapes[k].vocab, .context = 16, .layers = shapes[k].layers,
                              .heads = 2, .channels = shapes[k].channels, .batch = 2 } };
            sp_app_model m = { .cfg = &f, .build = build, .cut_layers = layers, .set_cut = set_cut };
            int cut[64], n[64];
            char why[256];
            CHECK(app_balanced_cut(&m, &o, S, 1, 0, NULL, cut, why, sizeof why) == 0,
                  "shape %zu S %d: no cut", k, S);
            CHECK(f.ncut == S, "shape %zu S %d: the model's next build has no cut", k, S);
            double got = largest_of(&f, &o, cut, S);
            double want = brute(&f, &o, f.c.layers, S, n, 0, f.c.layers);
            CHECK(got <= want * (1 + 1e-12), "shape %zu S %d: largest stage %.6g, brute force "
                  "%.6g (%s)", k, S, got, want, why);
            int even[64], tie = 1;
            for (int s = 0; s < S; s++) even[s] = f.c.layers / S + (s < f.c.layers % S);
            if (largest_of(&f, &o, even, S) <= want * (1 + 1e-12))
                for (int s = 0; s < S; s++) tie &= cut[s] == even[s];
            CHECK(tie, "shape %zu S %d: the even cut is as good, another was picked (%s)", k, S,
                  why);
            CHECK(!strncmp(why, "cut: blocks per stage ", 22), "why: '%s'", why);
        }
    /* the heavy head moves blocks off the last stage (the fine cut's costs: 2 blocks
     * plus a head of 8192 x 16 weigh more than 5 blocks) */
    fake f = { .c = { .vocab = 8192, .context = 16, .layers = 7, .heads = 2, .channels = 16,
                      .batch = 2 } };
    sp_app_model m = { .cfg = &f, .build = build, .cut_layers = layers, .set_cut = set_cut };
    int cut[2];
    CHECK(app_balanced_cut(&m, &o, 2, 1, 0, NULL, cut, NULL, 0) == 0 && cut[0] > cut[1],
          "a heavy head: cut %d,%d", cut[0], cut[1]);
    /* --stage-layers given: no cut */
    f.given = 1;
    f.ncut = 0;
    CHECK(app_balanced_cut(&m, &o, 2, 1, 0, NULL, cut, NULL, 0) == 1 && f.ncut == 0,
          "a given cut was replaced");
    return check_summary("test_cut");
}
