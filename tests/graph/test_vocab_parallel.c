/* The vocab-parallel embedding and cross-entropy (starpipe/graph.h) against the unsharded
 * model in float64, at T = 1, 2, 3, 4 (V = 12), each member a reference in a thread of its
 * own joined by the in-process group (tp_group.h). Two graphs:
 *   tied:  x = add_positions(tp_sum(embed_vocab(tokens, wte)), wpe)   wte (V,C) by rows
 *          logits = tp_copy(x wm) wte^T   (this rank's slice)          wm (C,C) whole
 *          loss = cross_entropy_vocab(logits, targets)
 *   loss:  loss = cross_entropy_vocab(L, targets), L (N,V) a parameter split by columns:
 *          the loss alone, its gradient against softmax - one-hot in float64.
 * Checked: the loss against an independent float64 forward and T = 1's; every gradient
 * (split ones assembled from the parts) against float64 central differences (and, for the
 * loss alone, the closed form) and T = 1's within float32 rounding; every member's loss
 * the same bits, the whole parameters' gradients (wpe's, wm's: the replicated ops) the
 * same bits on every member, the same bits run after run; targets anywhere in [0,V),
 * also outside a rank's slice, accepted, and one outside refused before any kernel;
 * wte not split by rows, a short wpe, and a T not dividing V refused. */
#include <math.h>
#include <string.h>

#include "starpipe/graph.h"
#include "tests/graph/tp_group.h"

enum { B = 2, TC = 3, TMAX = 4, C = 5, V = 12, N = B * TC, M = 2 };

static int32_t tok[M][N], tgt[M][N];
static const void *inputs[M * 2];

static sp_graph *finish(sp_graph *g, sp_tensor loss)
{
    REQUIRE(sp_graph_set_loss(g, loss) == SP_OK, "loss: %s", sp_last_error());
    return g;
}

static sp_graph *build_tied(int T, int rank, const void *ctx)
{
    (void)ctx;
    sp_graph *g = sp_graph_create();
    REQUIRE(g && sp_graph_set_tensor(g, T, rank) == SP_OK, "group: %s", sp_last_error());
    sp_tensor tokens = sp_input_i32(g, "tokens", 2, (int64_t[]){ B, TC });
    sp_tensor targets = sp_input_i32(g, "targets", 2, (int64_t[]){ B, TC });
    sp_tensor wte = sp_param_split(g, "wte", 2, (int64_t[]){ V, C }, 0, SP_INIT_NORMAL, 0.7f);
    sp_tensor wpe = sp_param(g, "wpe", 2, (int64_t[]){ TMAX, C }, SP_INIT_NORMAL, 0.5f);
    sp_tensor wm = sp_param(g, "wm", 2, (int64_t[]){ C, C }, SP_INIT_NORMAL, 0.6f);
    sp_tensor x = sp_add_positions(g, sp_tp_sum(g, sp_embed_vocab(g, tokens, wte)), wpe);
    sp_tensor h = sp_matmul(g, x, wm, 0, 0);
    sp_tensor logits = sp_matmul(g, sp_tp_copy(g, h), wte, 0, 1);
    return finish(g, sp_cross_entropy_vocab(g, logits, targets));
}

static sp_graph *build_loss(int T, int rank, const void *ctx)
{
    (void)ctx;
    sp_graph *g = sp_graph_create();
    REQUIRE(g && sp_graph_set_tensor(g, T, rank) == SP_OK, "group: %s", sp_last_error());
    sp_input_i32(g, "tokens", 2, (int64_t[]){ B, TC }); /* unused: the inputs' layout */
    sp_tensor targets = sp_input_i32(g, "targets", 2, (int64_t[]){ B, TC });
    sp_tensor L = sp_param_split(g, "L", 3, (int64_t[]){ B, TC, V }, 2, SP_INIT_NORMAL, 3.0f);
    return finish(g, sp_cross_entropy_vocab(g, L, targets));
}

/* ---- the whole models in float64, written here ---- */
static double ce64(const double *logits, const int32_t *y)
{
    double total = 0;
    for (int i = 0; i < N; i++) {
        const double *o = logits + i * V;
        double mx = o[0], z = 0;
        for (int v = 1; v < V; v++) mx = fmax(mx, o[v]);
        for (int v = 0; v < V; v++) z += exp(o[v] - mx);
        total += log(z) + mx - o[y[i]];
    }
    return total / N;
}

static double tied64(double *const *P)
{
    const double *wte = P[0], *wpe = P[1], *wm = P[2];
    double total = 0;
    for (int i = 0; i < M; i++) {
        double x[N][C], h[N][C], logits[N * V];
        for (int r = 0; r < N; r++)
            for (int c = 0; c < C; c++) x[r][c] = wte[tok[i][r] * C + c] + wpe[(r % TC) * C + c];
        for (int r = 0; r < N; r++)
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int k = 0; k < C; k++) s += x[r][k] * wm[k * C + c];
                h[r][c] = s;
            }
        for (int r = 0; r < N; r++)
            for (int v = 0; v < V; v++) {
                double s = 0;
                for (int k = 0; k < C; k++) s += h[r][k] * wte[v * C + k];
                logits[r * V + v] = s;
            }
        total += ce64(logits, tgt[i]);
    }
    return total / M;
}

static double loss64(double *const *P)
{
    double total = 0;
    for (int i = 0; i < M; i++) total += ce64(P[0], tgt[i]);
    return total / M;
}

typedef struct {
    const char *what;
    tp_build_fn build;
    double (*loss64)(double *const *P);
    int np;
    const char *names[3];
    int64_t sizes[3];
} model;

static const model tied = { "tied", build_tied, tied64, 3, { "wte", "wpe", "wm" },
                            { V * C, TMAX * C, C * C } };
static const model alone = { "loss", build_loss, loss64, 1, { "L" }, { N * V } };

static void run(tp_group *G, const model *md, int T)
{
    tp_run r = { .microbatches = M, .steps = 0, .inputs = inputs, .seed = 9 };
    sp_adamw_defaults(&r.opt);
    tp_run_group(G, T, md->build, NULL, &r);
}

static double worst_fd; /* reported: the margin of the finite-difference tolerance */

static void check(const model *md, const tp_group *G, const tp_group *one, int T)
{
    char what[48];
    snprintf(what, sizeof what, "%s T=%d", md->what, T);
    double *P[3];
    float *grad[3], *ref[3];
    for (int k = 0; k < md->np; k++) {
        REQUIRE(tp_whole_numel(G, md->names[k]) == md->sizes[k], "%s: %s's size", what,
                md->names[k]);
        float *v = tp_whole(G, md->names[k], 0);
        P[k] = malloc(sizeof(double) * (size_t)md->sizes[k]);
        REQUIRE(P[k], "out of memory");
        for (int64_t j = 0; j < md->sizes[k]; j++) P[k][j] = v[j];
        free(v);
        grad[k] = tp_whole(G, md->names[k], 1), ref[k] = tp_whole(one, md->names[k], 1);
    }
    double L = md->loss64(P);
    float l = G->m[0].loss;
    CHECK(fabs(l - L) <= 1e-5 * (1 + fabs(L)), "%s: loss %.9g, float64 %.9g", what, l, L);
    CHECK(fabs(l - one->m[0].loss) <= 1e-5 * (1 + fabs(L)), "%s: loss %.9g, T=1 %.9g", what, l,
          one->m[0].loss);
    for (int r = 1; r < T; r++)
        CHECK(!memcmp(&G->m[r].loss, &G->m[0].loss, 4), "%s: member %d's loss %.9g, member "
              "0's %.9g", what, r, G->m[r].loss, l);
    for (int k = 0; k < md->np; k++) {
        double worst = 0;
        int64_t at = 0;
        for (int64_t j = 0; j < md->sizes[k]; j++) {
            double keep = P[k][j], e = 1e-5 * (1 + fabs(keep));
            P[k][j] = keep + e;
            double up = md->loss64(P);
            P[k][j] = keep - e;
            double down = md->loss64(P);
            P[k][j] = keep;
            double fd = (up - down) / (2 * e), got = grad[k][j], r = ref[k][j];
            double err = fabs(got - fd) / (1e-3 + fabs(fd));
            if (!(err <= worst)) worst = err, at = j;
            CHECK(fabs(got - r) <= 2e-5 * (1 + fabs(r)), "%s: d%s[%lld] %.9g, T=1 %.9g", what,
                  md->names[k], (long long)j, got, r);
        }
        if (worst > worst_fd) worst_fd = worst;
        CHECK(worst < 2e-3, "%s: d%s[%lld] off the float64 finite difference by %.2g", what,
              md->names[k], (long long)at, worst);
    }
    if (md == &alone) { /* the closed form: (softmax - one-hot(target)) / (N M) */
        double worst = 0;
        for (int r = 0; r < N; r++) {
            const double *o = P[0] + r * V;
            double mx = o[0], z = 0;
            for (int v = 1; v < V; v++) mx = fmax(mx, o[v]);
            for (int v = 0; v < V; v++) z += exp(o[v] - mx);
            for (int v = 0; v < V; v++) {
                double d = 0;
                for (int i = 0; i < M; i++) d += (exp(o[v] - mx) / z - (tgt[i][r] == v)) / N / M;
                double e = fabs(grad[0][r * V + v] - d);
                if (!(e <= worst)) worst = e;
            }
        }
        CHECK(worst <= 1e-6, "%s: dL off softmax - one-hot by %.3g", what, worst);
    }
    /* whole parameters: the replicated ops give every member the same bits */
    for (int k = 0; k < md->np; k++)
        for (int r = 1; r < T; r++) {
            sp_tensor t0 = sp_graph_find(G->m[0].g, md->names[k]);
            sp_tensor tr = sp_graph_find(G->m[r].g, md->names[k]);
            if (sp_param_split_dim(G->m[0].g, t0) >= 0) continue;
            CHECK(!memcmp(sp_reference_grad(G->m[r].r, tr), sp_reference_grad(G->m[0].r, t0),
                          4 * (size_t)md->sizes[k]),
                  "%s: d%s (whole) differs between members 0 and %d", what, md->names[k], r);
        }
    for (int k = 0; k < md->np; k++) free(P[k]), free(grad[k]), free(ref[k]);
}

/* Two runs of T give the same bits for every member's gradients. */
static void check_again(const model *md, const tp_group *G, int T)
{
    tp_group again;
    run(&again, md, T);
    for (int r = 0; r < T; r++)
        for (int k = 0; k < md->np; k++) {
            sp_tensor t = sp_graph_find(G->m[r].g, md->names[k]);
            CHECK(!memcmp(sp_reference_grad(G->m[r].r, t),
                          sp_reference_grad(again.m[r].r, sp_graph_find(again.m[r].g,
                                                                        md->names[k])),
                          4 * (size_t)sp_tensor_numel(G->m[r].g, t)),
                  "%s T=%d: member %d's d%s differs between two runs", md->what, T, r,
                  md->names[k]);
        }
    tp_free_group(&again);
}

int main(void)
{
    for (int i = 0; i < M; i++) {
        for (int k = 0; k < N; k++) {
            tok[i][k] = (int32_t)((5 * k + 7 * i + 3) % V);
            tgt[i][k] = (int32_t)((7 * k + 5 * i + 11) % V); /* every rank's slice, V - 1 too */
        }
        inputs[2 * i] = tok[i], inputs[2 * i + 1] = tgt[i];
    }
    const model *models[2] = { &tied, &alone };
    for (int q = 0; q < 2; q++) {
        tp_group one;
        run(&one, models[q], 1);
        check(models[q], &one, &one, 1); /* the float64 model itself */
        for (int T = 2; T <= 4; T++) {
            tp_group G;
            run(&G, models[q], T);
            check(models[q], &G, &one, T);
            if (T == 2) check_again(models[q], &G, T);
            tp_free_group(&G);
        }
        tp_free_group(&one);
    }
    printf("largest error against the float64 finite differences %.3g\n", worst_fd);

    /* a target outside the whole vocabulary: refused before any kernel, naming it */
    tp_group G;
    tgt[1][4] = V;
    tp_run r = { .microbatches = M, .steps = 0, .inputs = inputs, .seed = 9 };
    sp_adamw_defaults(&r.opt);
    memset(&G, 0, sizeof G);
    G.T = 2;
    G.local = sp_tp_local_create(2);
    REQUIRE(G.local, "%s", sp_last_error());
    for (int q = 0; q < 2; q++) {
        tp_member *m = &G.m[q];
        *m = (tp_member){ .T = 2, .rank = q, .run = &r, .local = G.local };
        m->g = build_tied(2, q, NULL);
        sp_status st;
        m->p = sp_program_build(m->g, &st);
        REQUIRE(m->p, "%s", sp_last_error());
        tp_member_main(m); /* fails before its first all-reduce: no thread needed */
        CHECK(m->st == SP_ERR_ARG && strstr(m->err, "input 'targets' of microbatch 1: value 12 "
                                            "at position 4 is outside [0,12)"),
              "a target of 12: %s", m->st ? m->err : "accepted");
    }
    tp_free_group(&G);
    tgt[1][4] = 0;

    /* refusals */
    sp_graph *g = sp_graph_create();
    REQUIRE(g && sp_graph_set_tensor(g, 2, 1) == SP_OK, "%s", sp_last_error());
    sp_tensor tokens = sp_input_i32(g, "tokens", 2, (int64_t[]){ B, TC });
    sp_tensor whole = sp_param(g, "wte", 2, (int64_t[]){ V, C }, SP_INIT_NORMAL, 0.1f);
    sp_tensor cols = sp_param_split(g, "w2", 2, (int64_t[]){ V, C + 1 }, 1, SP_INIT_NORMAL, 0.1f);
    CHECK(sp_embed_vocab(g, tokens, whole) == -(int)SP_ERR_GRAPH &&
              strstr(sp_last_error(), "wte 'wte' must be split by rows"), "a whole wte: %s",
          sp_last_error());
    CHECK(sp_embed_vocab(g, tokens, cols) == -(int)SP_ERR_GRAPH, "wte split by columns accepted");
    sp_tensor rows = sp_param_split(g, "w3", 2, (int64_t[]){ V, C }, 0, SP_INIT_NORMAL, 0.1f);
    sp_tensor x = sp_embed_vocab(g, tokens, rows);
    REQUIRE(x >= 0, "%s", sp_last_error());
    sp_tensor shortp = sp_param(g, "wpe", 2, (int64_t[]){ TC - 1, C }, SP_INIT_NORMAL, 0.1f);
    CHECK(sp_add_positions(g, x, shortp) == -(int)SP_ERR_SHAPE &&
              strstr(sp_last_error(), "Tmax >= T"), "a short wpe: %s", sp_last_error());
    CHECK(sp_add_positions(g, x, tokens) < 0, "positions from an input accepted");
    CHECK(sp_param_split(g, "w4", 2, (int64_t[]){ V + 1, C }, 0, SP_INIT_NORMAL, 0.1f) ==
              -(int)SP_ERR_SHAPE, "T=2 of a vocabulary of 13 accepted");
    sp_graph_free(g);
    return check_summary("test_vocab_parallel");
}
