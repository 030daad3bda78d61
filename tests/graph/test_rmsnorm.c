/* RMSNorm's gradients against float64 finite differences: x = xin w0 -> rmsnorm(weight) ->
 * logits = (.) wo -> cross-entropy, through the reference interpreter, for 1 and 2 stages
 * (the cut after the norm). w0's gradient is x's (dx) carried back through the product,
 * weight's is dweight, accumulated over two microbatches. The float64 forward is written
 * here, with Llama's eps 1e-5. */
#include <math.h>
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"
#include "tests/check.h"
#include "tests/graph/grad64.h"

enum { B = 3, T = 5, D = 7, C = 19, K = 6, MB = 2 }; /* C: not a multiple of 8 */

static float xin[MB][B * T * D];
static int32_t tgt[MB][B * T];

static sp_graph *rms_graph(int stages)
{
    sp_graph *g = sp_graph_create();
    sp_tensor x = sp_input_f32(g, "x", 3, (int64_t[]){ B, T, D });
    sp_tensor y = sp_input_i32(g, "y", 2, (int64_t[]){ B, T });
    sp_tensor w0 = sp_param(g, "w0", 2, (int64_t[]){ D, C }, SP_INIT_NORMAL, 0.5f);
    sp_tensor w = sp_param(g, "norm.w", 1, (int64_t[]){ C }, SP_INIT_NORMAL, 0.8f);
    sp_tensor wo = sp_param(g, "wo", 2, (int64_t[]){ C, K }, SP_INIT_NORMAL, 0.5f);
    sp_tensor h = sp_rmsnorm(g, sp_matmul(g, x, w0, 0, 0), w);
    if (stages > 1) h = sp_pipeline_yield(g, h);
    REQUIRE(sp_graph_set_loss(g, sp_cross_entropy(g, sp_matmul(g, h, wo, 0, 0), y)) == SP_OK,
            "rmsnorm graph: %s", sp_last_error());
    return g;
}

/* the mean loss over the microbatches, in float64 */
static double loss64(const double *w0, const double *w, const double *wo)
{
    double total = 0;
    for (int mb = 0; mb < MB; mb++)
        for (int i = 0; i < B * T; i++) {
            double x[C], ss = 0, lg[K], mx = -INFINITY, z = 0;
            for (int c = 0; c < C; c++) {
                x[c] = 0;
                for (int d = 0; d < D; d++) x[c] += xin[mb][i * D + d] * w0[d * C + c];
                ss += x[c] * x[c];
            }
            double rs = 1.0 / sqrt(ss / C + 1e-5);
            for (int k = 0; k < K; k++) {
                lg[k] = 0;
                for (int c = 0; c < C; c++) lg[k] += x[c] * rs * w[c] * wo[c * K + k];
                mx = fmax(mx, lg[k]);
            }
            for (int k = 0; k < K; k++) z += exp(lg[k] - mx);
            total += -(lg[tgt[mb][i]] - mx - log(z));
        }
    return total / (MB * B * T);
}

static double loss_of(void *P)
{
    return loss64(PP(P, "w0", 0), PP(P, "norm.w", 0), PP(P, "wo", 0));
}

static void run_case(int stages)
{
    sp_status st;
    sp_graph *g = rms_graph(stages);
    sp_program *p = sp_program_build(g, &st);
    REQUIRE(p, "rmsnorm/%d stages: %s", stages, sp_last_error());
    sp_reference *r = sp_reference_create(p, MB, NULL, 7, &st);
    REQUIRE(r, "rmsnorm/%d stages: %s", stages, sp_last_error());
    const void *in[2 * MB];
    for (int i = 0; i < MB; i++) in[2 * i] = xin[i], in[2 * i + 1] = tgt[i];
    float loss32;
    REQUIRE(sp_reference_forward_backward(r, in, &loss32) == SP_OK, "%s", sp_last_error());
    params64 P = copy_params(g, r);
    double l64 = loss_of(&P);
    CHECK(fabs(loss32 - l64) <= 1e-5 * fmax(1.0, fabs(l64)),
          "rmsnorm/%d stages: loss float32 %.9g vs float64 %.9g", stages, loss32, l64);
    const char *names[3] = { "w0", "norm.w", "wo" };
    for (int q = 0; q < 3; q++) { /* every entry */
        sp_tensor t = sp_graph_find(g, names[q]);
        char what[96];
        snprintf(what, sizeof what, "rmsnorm/%d stages: gradient of '%s'", stages, names[q]);
        fd_check(what, PP(&P, names[q], 0), NULL, sp_tensor_numel(g, t), sp_reference_grad(r, t),
                 loss_of, &P);
    }
    free_params(&P);
    sp_reference_free(r);
    sp_program_free(p);
    sp_graph_free(g);
}

int main(void)
{
    for (int i = 0; i < MB; i++) {
        for (int j = 0; j < B * T * D; j++)
            xin[i][j] = (float)((double)(sp_mix64(300 + i * 1000 + j) % 2001) / 1000.0 - 1.0);
        for (int j = 0; j < B * T; j++) tgt[i][j] = (int32_t)(sp_mix64(700 + i * 100 + j) % K);
    }
    for (int stages = 1; stages <= 2; stages++) run_case(stages);
    return check_summary("test_rmsnorm");
}
