/* What the programs fuse and alias, and that it changes no bits.
 * - A product whose one reader is a bias add of its stage (a linear layer) is one
 *   matmul_bias instruction in F, with no buffer of its own; a named product (readable
 *   after a forward), a product with another reader, and one whose bias add is in the
 *   next stage stay a matmul and a bias_add.
 * - An add's term read by nothing else has the sum's gradient as its own: no copy in BW.
 * - The same graph with its products named (so unfused) gives the same bits: loss,
 *   every parameter gradient, and the parameters after two AdamW steps, fp32 and bf16.
 * - starpipe-gpt's GPT: every block's four products fused, no bias_add left in F. */
#include <string.h>

#include "starpipe/models.h"
#include "tests/check.h"
#include "tests/graph/program_util.h"

enum { N = 6, D = 5, C = 7, K = 3 };

static int count(const sp_program *p, int s, sp_task_kind kind, const char *kernel)
{
    int n = 0;
    sp_op_desc d;
    for (int j = 0; sp_program_op(p, s, kind, j, &d) == 0; j++) n += !strcmp(d.kernel, kernel);
    return n;
}

static sp_tensor named(sp_graph *g, sp_tensor t, const char *name, int on)
{
    if (on) REQUIRE(sp_graph_name(g, t, name) == SP_OK, "%s", sp_last_error());
    return t;
}

/* z = (relu(x w0 + b0) w1 + b1) + relu(x w2), logits = relu(z) wo: two linear layers and
 * a sum whose terms have no other reader. name_products: the three products named.
 * cut: a stage boundary between the first product and its bias add. */
static sp_graph *mlp(int name_products, int cut)
{
    sp_graph *g = sp_graph_create();
    sp_tensor x = sp_input_f32(g, "x", 2, (int64_t[]){ N, D });
    sp_tensor y = sp_input_i32(g, "y", 1, (int64_t[]){ N });
    sp_tensor w0 = sp_param(g, "w0", 2, (int64_t[]){ D, C }, SP_INIT_NORMAL, 0.3f);
    sp_tensor b0 = sp_param(g, "b0", 1, (int64_t[]){ C }, SP_INIT_NORMAL, 0.3f);
    sp_tensor w1 = sp_param(g, "w1", 2, (int64_t[]){ C, C }, SP_INIT_NORMAL, 0.3f);
    sp_tensor b1 = sp_param(g, "b1", 1, (int64_t[]){ C }, SP_INIT_NORMAL, 0.3f);
    sp_tensor w2 = sp_param(g, "w2", 2, (int64_t[]){ D, C }, SP_INIT_NORMAL, 0.3f);
    sp_tensor wo = sp_param(g, "wo", 2, (int64_t[]){ C, K }, SP_INIT_NORMAL, 0.3f);
    sp_tensor h = named(g, sp_matmul(g, x, w0, 0, 0), "p0", name_products);
    if (cut) h = sp_pipeline_yield(g, h);
    sp_tensor r = sp_relu(g, sp_bias_add(g, h, b0));
    sp_tensor h2 = sp_bias_add(g, named(g, sp_matmul(g, r, w1, 0, 0), "p1", name_products), b1);
    sp_tensor r2 = sp_relu(g, named(g, sp_matmul(g, x, w2, 0, 0), "p2", name_products));
    sp_tensor z = sp_add(g, h2, r2);
    sp_tensor lg = sp_matmul(g, sp_relu(g, z), wo, 0, 0);
    REQUIRE(sp_graph_set_loss(g, sp_cross_entropy(g, lg, y)) == SP_OK, "%s", sp_last_error());
    return g;
}

static void fused_ops(void)
{
    sp_graph *g = mlp(0, 0), *u = mlp(1, 0), *c = mlp(0, 1);
    sp_program *p = test_program(g, SP_PRECISION_FP32, 0);
    sp_program *q = test_program(u, SP_PRECISION_FP32, 0);
    sp_program *r = test_program(c, SP_PRECISION_FP32, 0);
    CHECK(count(p, 0, SP_TASK_F, "matmul_bias") == 2 && count(p, 0, SP_TASK_F, "bias_add") == 0 &&
              count(p, 0, SP_TASK_F, "matmul") == 2,
          "two linear layers: %d matmul_bias, %d bias_add, %d matmul (want 2, 0, 2)",
          count(p, 0, SP_TASK_F, "matmul_bias"), count(p, 0, SP_TASK_F, "bias_add"),
          count(p, 0, SP_TASK_F, "matmul"));
    CHECK(count(q, 0, SP_TASK_F, "matmul_bias") == 0 && count(q, 0, SP_TASK_F, "bias_add") == 2,
          "named products: %d matmul_bias, %d bias_add (want 0, 2)",
          count(q, 0, SP_TASK_F, "matmul_bias"), count(q, 0, SP_TASK_F, "bias_add"));
    CHECK(count(r, 0, SP_TASK_F, "matmul") == 1 && count(r, 1, SP_TASK_F, "bias_add") == 1 &&
              count(r, 1, SP_TASK_F, "matmul_bias") == 1,
          "a stage boundary after the first product: stage 0 %d matmul, stage 1 %d bias_add "
          "and %d matmul_bias (want 1, 1, 1)", count(r, 0, SP_TASK_F, "matmul"),
          count(r, 1, SP_TASK_F, "bias_add"), count(r, 1, SP_TASK_F, "matmul_bias"));
    /* the fused product has no buffer: F's SCRATCH is smaller by at least its N C floats
     * than the unfused program's, whose products live there */
    size_t fs = sp_program_buf_bytes(p, SP_BUF_SCRATCH, 0);
    size_t us = sp_program_buf_bytes(q, SP_BUF_SCRATCH, 0);
    size_t fa = sp_program_buf_bytes(p, SP_BUF_ACT, 0), ua = sp_program_buf_bytes(q, SP_BUF_ACT, 0);
    CHECK(fs + fa + sizeof(float) * N * C <= us + ua,
          "fused: SCRATCH %zu + ACT %zu bytes, unfused %zu + %zu: want N C floats fewer", fs,
          fa, us, ua);
    /* z = h2 + r2, neither read elsewhere: both share dz, so BW copies nothing (the bias
     * adds' inputs share their outputs' too) */
    CHECK(count(p, 0, SP_TASK_BW, "scale") == 0, "BW copies %d gradients (want 0)",
          count(p, 0, SP_TASK_BW, "scale"));
    sp_program_free(p), sp_program_free(q), sp_program_free(r);
    sp_graph_free(g), sp_graph_free(u), sp_graph_free(c);
}

/* two steps of the fused and the unfused graph, from the same parameters and data */
static void same_bits(sp_precision prec, int act16)
{
    sp_graph *g[2] = { mlp(0, 0), mlp(1, 0) };
    sp_reference *r[2];
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    opt.lr = 0.05f;
    float x[N * D];
    int32_t y[N];
    for (int i = 0; i < N * D; i++) x[i] = (float)((i * 37) % 23 - 11) / 7.0f;
    for (int i = 0; i < N; i++) y[i] = (i * 5) % K;
    const void *in[2] = { x, y };
    float loss[2][2];
    for (int v = 0; v < 2; v++) {
        sp_status st;
        sp_program *p = test_program(g[v], prec, act16);
        r[v] = sp_reference_create(p, 1, &opt, 7, &st);
        REQUIRE(r[v], "%s", sp_last_error());
        for (int step = 0; step < 2; step++)
            REQUIRE(sp_reference_step(r[v], in, &loss[v][step]) == SP_OK, "%s", sp_last_error());
    }
    const char *how = prec == SP_PRECISION_BF16 ? act16 ? "bf16, bf16 storage" : "bf16" : "fp32";
    CHECK(!memcmp(loss[0], loss[1], sizeof loss[0]), "%s: losses %.9g %.9g fused, %.9g %.9g "
          "unfused", how, loss[0][0], loss[0][1], loss[1][0], loss[1][1]);
    for (int i = 0; i < sp_graph_num_params(g[0]); i++) {
        sp_tensor t = sp_graph_param(g[0], i);
        size_t bytes = sizeof(float) * (size_t)sp_tensor_numel(g[0], t);
        CHECK(!memcmp(sp_reference_grad(r[0], t), sp_reference_grad(r[1], t), bytes) &&
                  !memcmp(sp_reference_param(r[0], t), sp_reference_param(r[1], t), bytes),
              "%s: %s's gradient or value differs fused and unfused", how,
              sp_tensor_name(g[0], t));
    }
    for (int v = 0; v < 2; v++) {
        const sp_program *p = sp_reference_program(r[v]);
        sp_reference_free(r[v]);
        sp_program_free((sp_program *)p);
        sp_graph_free(g[v]);
    }
}

static void gpt(void)
{
    sp_gpt_config d = { .vocab = 256, .context = 64, .layers = 4, .heads = 4, .channels = 64,
                        .batch = 4, .stages = 2 };
    sp_status st;
    sp_graph *g = sp_model_gpt(&d, &st);
    REQUIRE(g, "%s", sp_last_error());
    sp_program *p = test_program(g, SP_PRECISION_FP32, 0);
    for (int s = 0; s < 2; s++)
        CHECK(count(p, s, SP_TASK_F, "matmul_bias") == 8 && count(p, s, SP_TASK_F, "bias_add") == 0,
              "gpt stage %d: %d matmul_bias, %d bias_add (want 8, 0: two blocks of four "
              "linear layers)", s, count(p, s, SP_TASK_F, "matmul_bias"),
              count(p, s, SP_TASK_F, "bias_add"));
    sp_program_free(p);
    sp_graph_free(g);
}

int main(void)
{
    fused_ops();
    same_bits(SP_PRECISION_FP32, 0);
    same_bits(SP_PRECISION_BF16, 0);
    same_bits(SP_PRECISION_BF16, 1);
    gpt();
    return check_summary("test_fusion");
}
