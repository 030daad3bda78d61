/* Tensor parallelism in the graph (starpipe/graph.h): the two conjugate operators and
 * split parameters, against the unsharded model. A two-stage network
 *   stage 0: h = relu(x w0 + b0)                                  (whole on every rank)
 *   stage 1: a = gelu(tp_copy(h) W1 + b1)    W1 (D,H), b1 (H) split by columns
 *            o = tp_sum(a W2) + b2           W2 (H,V) split by rows, b2 whole
 *            loss = cross_entropy(o, y)
 * built for T = 1, 2, 3 (one graph per tensor rank, each run by a reference in a thread
 * of its own, joined by the in-process group) must give:
 *   - initial values that are the parts of T = 1's;
 *   - every member the same loss, bit for bit, and the same bits run after run;
 *   - the loss and the gradients of T = 1 within float32 rounding, and float64 central
 *     differences of an independent float64 forward of the whole model: w0's gradient
 *     checks tp_copy's transpose (the sum of the parts' contributions), W1's and b1's
 *     tp_sum's (the identity);
 *   - after optimizer steps with clipping active, the parameters of T = 1 (the norm
 *     counts each split parameter once: a norm over the local parts only would clip by
 *     another scale), whole parameters bitwise equal on every member;
 *   - a T that does not divide H refused naming the parameter; a program of T = 2 run
 *     without its group refused. */
#include <math.h>
#include <string.h>

#include "starpipe/graph.h"
#include "tests/graph/tp_group.h"

enum { B = 4, D = 5, H = 12, V = 7, M = 2 };

static sp_graph *build(int T, int rank, sp_status *err)
{
    sp_graph *g = sp_graph_create();
    REQUIRE(g, "no graph");
    if ((*err = sp_graph_set_tensor(g, T, rank))) return g;
    sp_tensor x = sp_input_f32(g, "x", 2, (int64_t[]){ B, D });
    sp_tensor y = sp_input_i32(g, "y", 1, (int64_t[]){ B });
    sp_tensor w0 = sp_param(g, "w0", 2, (int64_t[]){ D, D }, SP_INIT_NORMAL, 0.5f);
    sp_tensor b0 = sp_param(g, "b0", 1, (int64_t[]){ D }, SP_INIT_NORMAL, 0.1f);
    sp_tensor w1 = sp_param_split(g, "W1", 2, (int64_t[]){ D, H }, 1, SP_INIT_NORMAL, 0.5f);
    sp_tensor b1 = sp_param_split(g, "b1", 1, (int64_t[]){ H }, 0, SP_INIT_NORMAL, 0.1f);
    sp_tensor w2 = sp_param_split(g, "W2", 2, (int64_t[]){ H, V }, 0, SP_INIT_NORMAL, 0.5f);
    sp_tensor b2 = sp_param(g, "b2", 1, (int64_t[]){ V }, SP_INIT_NORMAL, 0.1f);
    sp_tensor h = sp_relu(g, sp_bias_add(g, sp_matmul(g, x, w0, 0, 0), b0));
    h = sp_pipeline_yield(g, h);
    sp_tensor a = sp_gelu(g, sp_bias_add(g, sp_matmul(g, sp_tp_copy(g, h), w1, 0, 0), b1));
    sp_tensor o = sp_bias_add(g, sp_tp_sum(g, sp_matmul(g, a, w2, 0, 0)), b2);
    *err = sp_graph_set_loss(g, sp_cross_entropy(g, o, y));
    return g;
}

static float xin[M][B * D];
static int32_t yin[M][B];
static const void *inputs[M * 2];

static sp_graph *build_member(int T, int rank, const void *ctx)
{
    (void)ctx;
    sp_status st;
    sp_graph *g = build(T, rank, &st);
    REQUIRE(st == SP_OK, "build T=%d: %s", T, sp_last_error());
    return g;
}

/* T members' references after `steps` optimizer steps (0: one forward-backward). */
static void run_group(tp_group *G, int T, int steps)
{
    tp_run run = { .microbatches = M, .steps = steps, .inputs = inputs, .seed = 3 };
    sp_adamw_defaults(&run.opt);
    run.opt.lr = 0.05f;
    run.opt.grad_clip = 0.05f; /* below the norms here: every step clips */
    tp_run_group(G, T, build_member, NULL, &run);
}

/* ---- the whole model in float64, written here ---- */
static const char *const names[] = { "w0", "b0", "W1", "b1", "W2", "b2" };
enum { NP = 6 };
static const int64_t sizes[NP] = { D * D, D, D * H, H, H * V, V };

static double loss64(double *const *P)
{
    const double *w0 = P[0], *b0 = P[1], *w1 = P[2], *b1 = P[3], *w2 = P[4], *b2 = P[5];
    double total = 0;
    for (int i = 0; i < M; i++) {
        double mb = 0;
        for (int b = 0; b < B; b++) {
            double h[D], a[H], o[V];
            for (int c = 0; c < D; c++) {
                double s = b0[c];
                for (int k = 0; k < D; k++) s += xin[i][b * D + k] * w0[k * D + c];
                h[c] = s > 0 ? s : 0;
            }
            for (int c = 0; c < H; c++) {
                double s = b1[c];
                for (int k = 0; k < D; k++) s += h[k] * w1[k * H + c];
                a[c] = 0.5 * s * (1 + tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
            }
            double mx = -1e300;
            for (int c = 0; c < V; c++) {
                double s = b2[c];
                for (int k = 0; k < H; k++) s += a[k] * w2[k * V + c];
                o[c] = s;
                if (s > mx) mx = s;
            }
            double z = 0;
            for (int c = 0; c < V; c++) z += exp(o[c] - mx);
            mb += log(z) + mx - o[yin[i][b]];
        }
        total += mb / B;
    }
    return total / M;
}

/* The group's whole parameters (grad 0) or gradients (grad 1), one array per name. */
static void wholes(const tp_group *G, int grad, float **out)
{
    for (int k = 0; k < NP; k++) {
        REQUIRE(tp_whole_numel(G, names[k]) == sizes[k], "%s: whole size", names[k]);
        out[k] = tp_whole(G, names[k], grad);
    }
}

static void free_wholes(float **w)
{
    for (int k = 0; k < NP; k++) free(w[k]);
}

static void check_against_whole(const tp_group *G, const tp_group *one, const char *what)
{
    double *P[NP];
    float *val[NP], *grad[NP], *ref[NP];
    wholes(G, 0, val), wholes(G, 1, grad), wholes(one, 1, ref);
    for (int k = 0; k < NP; k++) {
        P[k] = malloc(sizeof(double) * (size_t)sizes[k]);
        for (int64_t j = 0; j < sizes[k]; j++) P[k][j] = val[k][j];
    }
    double L = loss64(P);
    CHECK(fabs(G->m[0].loss - L) <= 1e-5 * (1 + fabs(L)), "%s: loss %.9g, float64 %.9g", what,
          G->m[0].loss, L);
    CHECK(fabs(G->m[0].loss - one->m[0].loss) <= 1e-5 * (1 + fabs(L)), "%s: loss %.9g, T=1 %.9g",
          what, G->m[0].loss, one->m[0].loss);
    for (int k = 0; k < NP; k++) {
        double worst = 0;
        int64_t at = 0;
        for (int64_t j = 0; j < sizes[k]; j++) {
            double keep = P[k][j], e = 1e-5 * (1 + fabs(keep));
            P[k][j] = keep + e;
            double up = loss64(P);
            P[k][j] = keep - e;
            double down = loss64(P);
            P[k][j] = keep;
            double fd = (up - down) / (2 * e), got = grad[k][j], r = ref[k][j];
            double err = fabs(got - fd) / (1e-3 + fabs(fd));
            if (!(err <= worst)) worst = err, at = j;
            CHECK(fabs(got - r) <= 2e-5 * (1 + fabs(r)), "%s: d%s[%lld] %.9g, T=1 %.9g", what,
                  names[k], (long long)j, got, r);
        }
        CHECK(worst < 2e-3, "%s: d%s[%lld] off the float64 finite difference by %.2g", what,
              names[k], (long long)at, worst);
    }
    for (int k = 0; k < NP; k++) free(P[k]);
    free_wholes(val), free_wholes(grad), free_wholes(ref);
}

int main(void)
{
    for (int i = 0; i < M; i++) {
        for (int k = 0; k < B * D; k++) xin[i][k] = (float)sin(1.3 * (i * B * D + k) + 0.2);
        for (int b = 0; b < B; b++) yin[i][b] = (i * 5 + b * 3) % V;
        inputs[2 * i] = xin[i];
        inputs[2 * i + 1] = yin[i];
    }
    tp_group one, two, again, three;
    run_group(&one, 1, 0);
    check_against_whole(&one, &one, "T=1"); /* the float64 model itself */
    float *v1[NP];
    wholes(&one, 0, v1);
    for (int T = 2; T <= 3; T++) {
        tp_group *G = T == 2 ? &two : &three;
        run_group(G, T, 0);
        char what[32];
        snprintf(what, sizeof what, "T=%d", T);
        for (int r = 1; r < T; r++)
            CHECK(!memcmp(&G->m[r].loss, &G->m[0].loss, 4), "%s: member %d's loss %.9g, member "
                  "0's %.9g", what, r, G->m[r].loss, G->m[0].loss);
        float *v[NP];
        wholes(G, 0, v);
        for (int k = 0; k < NP; k++) /* initial values: the parts of T = 1's */
            for (int64_t j = 0; j < sizes[k]; j++)
                CHECK(!memcmp(&v[k][j], &v1[k][j], 4), "%s: %s[%lld] starts at %.9g, T=1 at %.9g",
                      what, names[k], (long long)j, v[k][j], v1[k][j]);
        free_wholes(v);
        check_against_whole(G, &one, what);
    }
    free_wholes(v1);
    run_group(&again, 2, 0); /* the same bits run after run */
    float *ga[NP], *g2[NP];
    wholes(&again, 1, ga), wholes(&two, 1, g2);
    for (int k = 0; k < NP; k++)
        for (int64_t j = 0; j < sizes[k]; j++)
            CHECK(!memcmp(&ga[k][j], &g2[k][j], 4), "T=2 twice: d%s[%lld] %.9g then %.9g",
                  names[k], (long long)j, g2[k][j], ga[k][j]);
    free_wholes(ga), free_wholes(g2);
    tp_free_group(&again), tp_free_group(&three);

    /* optimizer steps with clipping: the parameters of T = 1 */
    tp_group s1, s2;
    run_group(&s1, 1, 3);
    run_group(&s2, 2, 3);
    CHECK(fabs(sp_reference_grad_norm(s2.m[0].r) - sp_reference_grad_norm(s1.m[0].r)) <=
              1e-5 * sp_reference_grad_norm(s1.m[0].r), "T=2: gradient norm %.9g, T=1 %.9g",
          sp_reference_grad_norm(s2.m[0].r), sp_reference_grad_norm(s1.m[0].r));
    float *p1[NP], *p2[NP];
    wholes(&s1, 0, p1), wholes(&s2, 0, p2);
    for (int k = 0; k < NP; k++)
        for (int64_t j = 0; j < sizes[k]; j++)
            CHECK(fabs(p2[k][j] - p1[k][j]) <= 1e-5 * (1 + fabs(p1[k][j])),
                  "3 steps: %s[%lld] %.9g, T=1 %.9g", names[k], (long long)j, p2[k][j],
                  p1[k][j]);
    free_wholes(p1), free_wholes(p2);
    for (int k = 0; k < NP; k++) { /* whole parameters: the same bits on every member */
        sp_tensor t0 = sp_graph_find(s2.m[0].g, names[k]), t1 = sp_graph_find(s2.m[1].g, names[k]);
        if (sp_param_split_dim(s2.m[0].g, t0) >= 0) continue;
        CHECK(!memcmp(sp_reference_param(s2.m[0].r, t0), sp_reference_param(s2.m[1].r, t1),
                      4 * (size_t)sizes[k]), "3 steps: %s differs between the members", names[k]);
    }
    tp_free_group(&s1), tp_free_group(&s2);

    /* refusals */
    sp_status st;
    sp_graph *bad = build(5, 0, &st);
    CHECK(st != SP_OK && strstr(sp_last_error(), "tensor parallelism of 5 does not divide"),
          "T=5 with H=12: %s", sp_last_error());
    sp_graph_free(bad);
    sp_program *p2prog = two.m[0].p;
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    sp_reference *lone = sp_reference_create(p2prog, M, &opt, 3, &st);
    REQUIRE(lone, "reference: %s", sp_last_error());
    float l;
    st = sp_reference_forward_backward(lone, inputs, &l);
    CHECK(st != SP_OK && strstr(sp_last_error(), "without its group"),
          "T=2 without a group: %s", st ? sp_last_error() : "ran");
    sp_reference_free(lone);
    tp_free_group(&one), tp_free_group(&two);
    return check_summary("test_tensor_parallel");
}
