/* Elementwise kernels (bias add, add, scale, GELU, ReLU) against float64 references and
 * central finite differences; also in-place use (out aliasing an input) and acc 0/1. */
#include "codelets/cpu/kernels.h"
#include "codelets/cpu/vec_impl.h"
#include "codelets/gelu.h"
#include "kcheck.h"

/* Each output is one or two fp32 operations, except GELU, whose sigmoid (a vectorizable
 * exp, ~1e-7 absolute) enters the derivative times |x k (1 + 3a x^2)| ~ 3 near x = -3:
 * observed scaled errors <= 9.2e-7 (dense sweep), 4.6e-7 on random inputs. 3e-6 is ~3x
 * that; a wrong sign or term fails by orders of magnitude, and even 0.0447 for 0.044715
 * fails the sweep. */
#define TOL 3e-6
/* GELU's negative tail, relatively: the exp's ~1 ulp times |v| ~ 80 at most, the rest a
 * few roundings; observed 1.0e-5 both ways (the tanh form: 1). */
#define TOL_TAIL 3e-5
/* The bias gradient sums N = 37 rows in fp32: bound N u = 2.2e-6. */
#define TOL_SUM 5e-6

enum { OP_BIAS, OP_ADD, OP_SCALE, OP_GELU, OP_RELU };
typedef struct {
    int op, N, C;
    float s;
    double *x, *y, *out; /* y: the bias (C) or the second addend (N*C) */
    const float *r;
} ew_ctx;

static void ref_forward(ew_ctx *c)
{
    const double k = sqrt(2.0 / M_PI);
    for (int n = 0; n < c->N; n++)
        for (int j = 0; j < c->C; j++) {
            int64_t i = (int64_t)n * c->C + j;
            double x = c->x[i], o = 0.0;
            switch (c->op) {
            case OP_BIAS: o = x + c->y[j]; break;
            case OP_ADD: o = x + c->y[i]; break;
            case OP_SCALE: o = (double)c->s * x; break;
            case OP_GELU: o = 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x))); break;
            case OP_RELU: o = x > 0 ? x : 0.0; break;
            }
            c->out[i] = o;
        }
}
static double ref_loss(void *p)
{
    ew_ctx *c = p;
    ref_forward(c);
    return kc_project(c->out, c->r, (int64_t)c->N * c->C);
}

static const char *names[] = {"bias_add", "add", "scale", "gelu", "relu"};

static void run_case(int op, int N, int C, uint64_t seed)
{
    char what[160];
    int64_t n = (int64_t)N * C, ny = op == OP_BIAS ? C : n;
    kc_seed(seed);
    float *x = KC_F(n), *y = KC_F(ny), *r = KC_F(n), *out = KC_F(n), *out2 = KC_F(n);
    float *g = KC_F(n), *base = KC_F(n);
    double *xd = KC_D(n), *yd = KC_D(ny), *od = KC_D(n), *gx = KC_D(n), *gy = KC_D(ny);
    double *want = KC_D(n);
    kc_fill(x, n, op == OP_GELU ? -4 : -1, op == OP_GELU ? 4 : 1);
    if (op == OP_RELU) /* keep finite differences away from the kink at 0 */
        for (int64_t i = 0; i < n; i++)
            if (fabsf(x[i]) < 1e-2f)
                x[i] = 0.5f;
    kc_fill(y, ny, -1, 1);
    kc_fill(r, n, -1, 1);
    kc_fill(base, n, -1, 1);
    float s = (float)(0.5 + kc_uniform());
    kc_to_double(xd, x, n);
    kc_to_double(yd, y, ny);
    ew_ctx c = {op, N, C, s, xd, yd, od, r};
    ref_forward(&c);
#define TAG(t) (snprintf(what, sizeof what, "%s N%d C%d seed%llu %s", names[op], N, C, \
                         (unsigned long long)seed, t), what)

    kc_fill_nan(out, n);
    switch (op) {
    case OP_BIAS: sp_bias_add_forward(out, x, y, N, C); break;
    case OP_ADD: sp_add_forward(out, x, y, n); break;
    case OP_SCALE: sp_scale_forward(out, x, s, n); break;
    case OP_GELU: sp_gelu_forward(out, x, n); break;
    case OP_RELU: sp_relu_forward(out, x, n); break;
    }
    kc_check(TAG("forward"), out, od, n, TOL);

    /* In place: out aliasing x must give the same bits. */
    memcpy(out2, x, sizeof(float) * (size_t)n);
    switch (op) {
    case OP_BIAS: sp_bias_add_forward(out2, out2, y, N, C); break;
    case OP_ADD: sp_add_forward(out2, out2, y, n); break;
    case OP_SCALE: sp_scale_forward(out2, out2, s, n); break;
    case OP_GELU: sp_gelu_forward(out2, out2, n); break;
    case OP_RELU: sp_relu_forward(out2, out2, n); break;
    }
    kc_expect(memcmp(out, out2, sizeof(float) * (size_t)n) == 0, TAG("in place, same bits"));

    kc_fd_grad(gx, xd, n, ref_loss, &c);
    kc_fd_grad(gy, yd, ny, ref_loss, &c);
    for (int acc = 0; acc < 2; acc++) {
        const char *tg = acc ? "dx acc=1 vs finite differences" : "dx vs finite differences";
        kc_acc_init(g, base, n, acc);
        switch (op) {
        case OP_BIAS: case OP_ADD: sp_scale_backward(g, r, 1.0f, n, acc); break;
        case OP_SCALE: sp_scale_backward(g, r, s, n, acc); break;
        case OP_GELU: sp_gelu_backward(g, x, r, n, acc); break;
        case OP_RELU: sp_relu_backward(g, x, r, n, acc); break;
        }
        kc_acc_want(want, base, gx, n, acc);
        kc_check(TAG(tg), g, want, n, TOL);
    }
    if (op == OP_BIAS) {
        kc_fill_nan(g, C);
        sp_bias_add_backward_bias(g, r, N, C, 0);
        kc_check(TAG("dbias vs finite differences"), g, gy, C, TOL_SUM);
        memcpy(g, base, sizeof(float) * (size_t)C);
        sp_bias_add_backward_bias(g, r, N, C, 1);
        kc_plus(want, base, gy, C);
        kc_check(TAG("dbias acc=1"), g, want, C, TOL_SUM);
    }
    if (op == OP_ADD) { /* the second addend's gradient is dout too */
        sp_scale_backward(g, r, 1.0f, n, 0);
        kc_check(TAG("db vs finite differences"), g, gy, n, TOL);
        sp_scale_backward(g, g, 1.0f, n, 0); /* the same buffer: a no-op copy */
        kc_check(TAG("in-place copy"), g, gy, n, TOL);
    }
#undef TAG
    free(x); free(y); free(r); free(out); free(out2); free(g); free(base);
    free(xd); free(yd); free(od); free(gx); free(gy); free(want);
}

/* Whether y[i] has the bits of gelu.h's scalar sp_gelu (or sp_gelu_grad) of x[i], compiled
 * here without FMA contraction, as the kernels are. */
static SP_NOFMA int same_as_scalar(const float *y, const float *x, int n, int grad)
{
    int same = 1;
    for (int i = 0; i < n; i++) {
        float w = grad ? sp_gelu_grad(x[i]) : sp_gelu(x[i]);
        same &= memcmp(&w, &y[i], sizeof w) == 0;
    }
    return same;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* gelu.h's loops compiled for each vector clone's target, run where the CPU has it: the
 * kernels run only the clone this CPU picks, so the others are checked here. */
#define GELU_LOOP(name, isa)                                                             \
    static SP_NOFMA __attribute__((target(isa))) void name(float *restrict y,            \
                                                              const float *restrict x,   \
                                                              int n, int grad)           \
    {                                                                                    \
        if (grad)                                                                        \
            for (int i = 0; i < n; i++) y[i] = sp_gelu_grad(x[i]);                       \
        else                                                                             \
            for (int i = 0; i < n; i++) y[i] = sp_gelu(x[i]);                            \
    }
GELU_LOOP(gelu_x86_64_v3, "arch=x86-64-v3")
GELU_LOOP(gelu_avx512f, "avx512f")

/* Each target's GELU and derivative against the baseline's scalar ones, bit for bit. */
static void check_clone_targets(const float *xs, float *ys, int n)
{
    static const struct {
        const char *name;
        void (*run)(float *restrict, const float *restrict, int, int);
    } paths[] = { { "x86-64-v3", gelu_x86_64_v3 }, { "avx512f", gelu_avx512f } };
    const int has[] = { __builtin_cpu_supports("x86-64-v3"), __builtin_cpu_supports("avx512f") };
    for (int p = 0; p < 2; p++) {
        if (!has[p]) {
            printf("gelu: no %s on this CPU, its clone not checked\n", paths[p].name);
            continue;
        }
        char what[96];
        for (int grad = 0; grad < 2; grad++) {
            paths[p].run(ys, xs, n, grad);
            snprintf(what, sizeof what, "gelu %s, %s: the baseline's bits", grad ? "derivative"
                     : "forward", paths[p].name);
            kc_expect(same_as_scalar(ys, xs, n, grad), what);
        }
    }
}
#endif

int main(void)
{
    kc_start();
    static const int sizes[][2] = {{7, 13}, {37, 5}, {1, 33}, {3, 1}};
    for (int op = OP_BIAS; op <= OP_RELU; op++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            for (uint64_t seed = 1; seed <= 3; seed++)
                run_case(op, sizes[i][0], sizes[i][1], seed);

    /* GELU far out: finite, exact limits (x for large x, 0 for very negative). */
    float big[4] = {-1e4f, -30.0f, 30.0f, 1e4f}, o[4], d[4], one[4] = {1, 1, 1, 1};
    sp_gelu_forward(o, big, 4);
    sp_gelu_backward(d, big, one, 4, 0);
    double wo[4] = {0, 0, 30, 1e4}, wd[4] = {0, 0, 1, 1};
    kc_check("gelu forward at |x| = 30, 1e4", o, wo, 4, TOL);
    kc_check("gelu backward at |x| = 30, 1e4", d, wd, 4, TOL);
    /* Dense GELU sweep over [-10, 10] against the float64 formula and its derivative:
     * covers every range of the kernel's own sigmoid (small |v|, the exp clamp, tails). */
    enum { NS = 40001 };
    float *xs = KC_F(NS), *ys = KC_F(NS), *gs = KC_F(NS), *ones = KC_F(NS);
    double *wy = KC_D(NS), *wg = KC_D(NS);
    const double k = sqrt(2.0 / M_PI), a = 0.044715;
    for (int i = 0; i < NS; i++) {
        xs[i] = (float)(-10.0 + 20.0 * i / (NS - 1));
        ones[i] = 1.0f;
        double x = xs[i], t = tanh(k * (x + a * x * x * x));
        wy[i] = 0.5 * x * (1 + t);
        wg[i] = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * a * x * x);
    }
    sp_gelu_forward(ys, xs, NS);
    sp_gelu_backward(gs, xs, ones, NS, 0);
    kc_check("gelu forward, dense sweep of [-10, 10]", ys, wy, NS, TOL);
    kc_check("gelu derivative, dense sweep of [-10, 10]", gs, wg, NS, TOL);
    /* The negative tail, relatively: GELU and its derivative are ~x e^v there (v = 2u
     * down to -80), which the form 0.5 x (1 + tanh(u)) rounds to 0 or to a few ulp of
     * 1 (relative errors up to 1). Against x s(v) in float64, s(v) = e^v / (1 + e^v). */
    double worst_y = 0, worst_g = 0;
    for (int i = 0; i < NS; i++) {
        const double x = xs[i], v = 2 * k * (x + a * x * x * x);
        if (x > -1.0 || v < -80.0) continue;
        const double e = exp(v), s = e / (1 + e);
        const double y = x * s, dy = s + x * s * (1 - s) * 2 * k * (1 + 3 * a * x * x);
        worst_y = fmax(worst_y, fabs(ys[i] - y) / fabs(y));
        worst_g = fmax(worst_g, fabs(gs[i] - dy) / fabs(dy));
    }
    printf("gelu's negative tail (v >= -80, x <= -1): relative error %.2g forward, %.2g "
           "derivative\n", worst_y, worst_g);
    kc_expect(worst_y < TOL_TAIL, "gelu forward: relative error in the negative tail");
    kc_expect(worst_g < TOL_TAIL, "gelu derivative: relative error in the negative tail");
    /* The kernels run a vector clone for this CPU (AVX-512F, x86-64-v3 or the baseline): the
     * same bits as gelu.h's scalar functions compiled here, element by element. */
    kc_expect(same_as_scalar(ys, xs, NS, 0),
              "gelu forward: the same bits as the scalar gelu.h, every element");
    kc_expect(same_as_scalar(gs, xs, NS, 1),
              "gelu backward: the same bits as the scalar gelu.h, every element");
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    /* the sweep's first half, then arbitrary bit patterns (NaN, inf, subnormals) */
    for (int i = NS / 2; i < NS; i++) {
        const uint32_t u = (uint32_t)i * 2654435761u;
        memcpy(&xs[i], &u, sizeof u);
    }
    check_clone_targets(xs, ys, NS);
#endif
    xs[0] = NAN;
    sp_gelu_forward(ys, xs, 1);
    kc_expect(isnan(ys[0]), "gelu forward propagates NaN");
    free(xs); free(ys); free(gs); free(ones); free(wy); free(wg);
    return kc_finish("test_kernels_elementwise");
}
