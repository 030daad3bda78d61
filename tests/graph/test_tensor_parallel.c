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
#include <pthread.h>
#include <string.h>

#include "starpipe/graph.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"
#include "tests/check.h"

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

/* ---- one member of a group, in a thread ---- */
typedef struct {
    int T, rank, steps;
    sp_tp_local *local;
    sp_graph *g;
    sp_program *p;
    sp_reference *r;
    float loss;
    sp_status st;
    char err[256];
} member;

static void *run_member(void *arg)
{
    member *m = arg;
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    opt.lr = 0.05f;
    opt.grad_clip = 0.05f; /* below the norms here: every step clips */
    m->r = sp_reference_create(m->p, M, &opt, 3, &m->st);
    if (m->r) {
        sp_reference_set_group(m->r, m->T > 1 ? sp_tp_local_member(m->local, m->rank) : NULL);
        m->st = m->steps ? SP_OK : sp_reference_forward_backward(m->r, inputs, &m->loss);
        for (int k = 0; k < m->steps && m->st == SP_OK; k++)
            m->st = sp_reference_step(m->r, inputs, &m->loss);
    }
    if (m->st) {
        snprintf(m->err, sizeof m->err, "%s", sp_last_error());
        sp_tp_local_abort(m->local);
    }
    return NULL;
}

typedef struct {
    int T;
    member m[3];
    sp_tp_local *local;
} group;

/* T members' references after `steps` optimizer steps (0: one forward-backward). */
static void run_group(group *G, int T, int steps)
{
    memset(G, 0, sizeof *G);
    G->T = T;
    G->local = sp_tp_local_create(T);
    REQUIRE(G->local, "sp_tp_local_create: %s", sp_last_error());
    pthread_t th[3];
    for (int r = 0; r < T; r++) {
        member *m = &G->m[r];
        *m = (member){ .T = T, .rank = r, .steps = steps, .local = G->local };
        sp_status st;
        m->g = build(T, r, &st);
        REQUIRE(st == SP_OK, "build T=%d: %s", T, sp_last_error());
        m->p = sp_program_build(m->g, &st);
        REQUIRE(m->p, "program T=%d: %s", T, sp_last_error());
        REQUIRE(pthread_create(&th[r], NULL, run_member, m) == 0, "no thread");
    }
    for (int r = 0; r < T; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < T; r++)
        REQUIRE(G->m[r].st == SP_OK, "T=%d member %d: %s", T, r, G->m[r].err);
}

static void free_group(group *G)
{
    for (int r = 0; r < G->T; r++) {
        sp_reference_free(G->m[r].r);
        sp_program_free(G->m[r].p);
        sp_graph_free(G->m[r].g);
    }
    sp_tp_local_free(G->local);
}

/* Element j of parameter `name` of the whole model, from the group's parts (values:
 * grad 0, gradients: grad 1). */
static float whole(const group *G, const char *name, int64_t j, int grad)
{
    const sp_graph *g0 = G->m[0].g;
    sp_tensor t0 = sp_graph_find(g0, name);
    int dim = sp_param_split_dim(g0, t0);
    const int64_t *full = sp_param_full_shape(g0, t0);
    int r = 0;
    int64_t local = j;
    if (dim >= 0) {
        int nd = sp_tensor_ndim(g0, t0);
        int64_t inner = 1;
        for (int d = dim + 1; d < nd; d++) inner *= full[d];
        int64_t part = full[dim] / G->T, o = j / (full[dim] * inner), q = j % (full[dim] * inner);
        int64_t idx = q / inner;
        r = (int)(idx / part);
        local = (o * part + idx % part) * inner + q % inner;
    }
    const member *m = &G->m[r];
    sp_tensor t = sp_graph_find(m->g, name);
    const float *v = grad ? sp_reference_grad(m->r, t) : sp_reference_param(m->r, t);
    return v[local];
}

static int64_t whole_numel(const group *G, const char *name)
{
    sp_tensor t = sp_graph_find(G->m[0].g, name);
    const int64_t *full = sp_param_full_shape(G->m[0].g, t);
    int64_t n = 1;
    for (int d = 0; d < sp_tensor_ndim(G->m[0].g, t); d++) n *= full[d];
    return n;
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

static void check_against_whole(const group *G, const group *one, const char *what)
{
    double *P[NP];
    for (int k = 0; k < NP; k++) {
        P[k] = malloc(sizeof(double) * (size_t)sizes[k]);
        for (int64_t j = 0; j < sizes[k]; j++) P[k][j] = whole(G, names[k], j, 0);
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
            double fd = (up - down) / (2 * e), got = whole(G, names[k], j, 1),
                   ref = whole(one, names[k], j, 1);
            double err = fabs(got - fd) / (1e-3 + fabs(fd));
            if (err > worst) worst = err, at = j;
            CHECK(fabs(got - ref) <= 2e-5 * (1 + fabs(ref)), "%s: d%s[%lld] %.9g, T=1 %.9g", what,
                  names[k], (long long)j, got, ref);
        }
        CHECK(worst < 2e-3, "%s: d%s[%lld] off the float64 finite difference by %.2g", what,
              names[k], (long long)at, worst);
    }
    for (int k = 0; k < NP; k++) free(P[k]);
}

int main(void)
{
    for (int i = 0; i < M; i++) {
        for (int k = 0; k < B * D; k++) xin[i][k] = (float)sin(1.3 * (i * B * D + k) + 0.2);
        for (int b = 0; b < B; b++) yin[i][b] = (i * 5 + b * 3) % V;
        inputs[2 * i] = xin[i];
        inputs[2 * i + 1] = yin[i];
    }
    group one, two, again, three;
    run_group(&one, 1, 0);
    check_against_whole(&one, &one, "T=1"); /* the float64 model itself */
    for (int T = 2; T <= 3; T++) {
        group *G = T == 2 ? &two : &three;
        run_group(G, T, 0);
        char what[32];
        snprintf(what, sizeof what, "T=%d", T);
        for (int r = 1; r < T; r++)
            CHECK(!memcmp(&G->m[r].loss, &G->m[0].loss, 4), "%s: member %d's loss %.9g, member "
                  "0's %.9g", what, r, G->m[r].loss, G->m[0].loss);
        for (int k = 0; k < NP; k++) /* initial values: the parts of T = 1's */
            for (int64_t j = 0; j < sizes[k]; j++) {
                float a = whole(G, names[k], j, 0), b = whole(&one, names[k], j, 0);
                CHECK(!memcmp(&a, &b, 4), "%s: %s[%lld] starts at %.9g, T=1 at %.9g", what,
                      names[k], (long long)j, a, b);
            }
        check_against_whole(G, &one, what);
    }
    run_group(&again, 2, 0); /* the same bits run after run */
    for (int k = 0; k < NP; k++)
        for (int64_t j = 0; j < sizes[k]; j++) {
            float a = whole(&again, names[k], j, 1), b = whole(&two, names[k], j, 1);
            CHECK(!memcmp(&a, &b, 4), "T=2 twice: d%s[%lld] %.9g then %.9g", names[k],
                  (long long)j, b, a);
        }
    free_group(&again), free_group(&three);

    /* optimizer steps with clipping: the parameters of T = 1 */
    group s1, s2;
    run_group(&s1, 1, 3);
    run_group(&s2, 2, 3);
    CHECK(fabs(sp_reference_grad_norm(s2.m[0].r) - sp_reference_grad_norm(s1.m[0].r)) <=
              1e-5 * sp_reference_grad_norm(s1.m[0].r), "T=2: gradient norm %.9g, T=1 %.9g",
          sp_reference_grad_norm(s2.m[0].r), sp_reference_grad_norm(s1.m[0].r));
    for (int k = 0; k < NP; k++)
        for (int64_t j = 0; j < whole_numel(&s2, names[k]); j++) {
            float a = whole(&s2, names[k], j, 0), b = whole(&s1, names[k], j, 0);
            CHECK(fabs(a - b) <= 1e-5 * (1 + fabs(b)), "3 steps: %s[%lld] %.9g, T=1 %.9g",
                  names[k], (long long)j, a, b);
        }
    for (int k = 0; k < NP; k++) { /* whole parameters: the same bits on every member */
        sp_tensor t0 = sp_graph_find(s2.m[0].g, names[k]), t1 = sp_graph_find(s2.m[1].g, names[k]);
        if (sp_param_split_dim(s2.m[0].g, t0) >= 0) continue;
        CHECK(!memcmp(sp_reference_param(s2.m[0].r, t0), sp_reference_param(s2.m[1].r, t1),
                      4 * (size_t)sizes[k]), "3 steps: %s differs between the members", names[k]);
    }
    free_group(&s1), free_group(&s2);

    /* refusals */
    sp_status st;
    sp_graph *bad = build(5, 0, &st);
    CHECK(st != SP_OK && strstr(sp_last_error(), "tensor parallelism of 5 does not divide"),
          "T=5 with H=12: %s", sp_last_error());
    sp_graph_free(bad);
    sp_program *p2 = two.m[0].p;
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    sp_reference *lone = sp_reference_create(p2, M, &opt, 3, &st);
    REQUIRE(lone, "reference: %s", sp_last_error());
    float l;
    st = sp_reference_forward_backward(lone, inputs, &l);
    CHECK(st != SP_OK && strstr(sp_last_error(), "without its group"),
          "T=2 without a group: %s", st ? sp_last_error() : "ran");
    sp_reference_free(lone);
    free_group(&one), free_group(&two);
    return check_summary("test_tensor_parallel");
}
