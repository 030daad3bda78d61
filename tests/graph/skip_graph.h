/* A graph with a skip edge over a stage, a dead consumer, scale/reshape/sum/mean, cut into
 * 1-3 stages: shared by test_model_grad.c (its float64 twin checks the gradients) and
 * test_bw_split.c. Inputs: x (SK_B, SK_D) floats, y (SK_B) classes below SK_K. REQUIRE is
 * tests/check.h's. */
#ifndef SP_TESTS_GRAPH_SKIP_GRAPH_H
#define SP_TESTS_GRAPH_SKIP_GRAPH_H

#include "starpipe/graph.h"
#include "tests/check.h"

enum { SK_B = 3, SK_D = 7, SK_H = 13, SK_K = 4 };

static inline sp_graph *skip_graph(int stages)
{
    sp_graph *g = sp_graph_create();
    sp_tensor x = sp_input_f32(g, "x", 2, (int64_t[]){ SK_B, SK_D });
    sp_tensor y = sp_input_i32(g, "y", 1, (int64_t[]){ SK_B });
    sp_tensor w0 = sp_param(g, "w0", 2, (int64_t[]){ SK_D, SK_H }, SP_INIT_NORMAL, 0.4f);
    sp_tensor b0 = sp_param(g, "b0", 1, (int64_t[]){ SK_H }, SP_INIT_NORMAL, 0.1f);
    sp_tensor w1 = sp_param(g, "w1", 2, (int64_t[]){ SK_H, SK_H }, SP_INIT_NORMAL, 0.3f);
    sp_tensor wo = sp_param(g, "wo", 2, (int64_t[]){ SK_H, SK_K }, SP_INIT_NORMAL, 0.3f);
    sp_tensor a = sp_relu(g, sp_bias_add(g, sp_matmul(g, x, w0, 0, 0), b0));
    sp_tensor q = sp_scale(g, a, 2.0f);
    if (stages > 1) a = sp_pipeline_yield(g, a);
    sp_tensor c = sp_gelu(g, sp_matmul(g, sp_add(g, a, q), w1, 0, 0));
    if (stages > 2) c = sp_pipeline_yield(g, c);
    sp_tensor dead = sp_relu(g, q); /* reads q from stage 0; the loss does not depend on it */
    (void)dead;
    sp_tensor d = sp_add(g, c, sp_scale(g, a, 0.5f)); /* skip connection 0 -> 2 */
    sp_tensor e = sp_reshape(g, d, 1, (int64_t[]){ SK_B * SK_H });
    sp_tensor logits = sp_matmul(g, sp_reshape(g, e, 2, (int64_t[]){ SK_B, SK_H }), wo, 0, 0);
    sp_tensor loss = sp_add(g, sp_cross_entropy(g, logits, y), sp_scale(g, sp_mean(g, e), 0.3f));
    loss = sp_add(g, loss, sp_scale(g, sp_sum(g, e), 0.01f));
    REQUIRE(sp_graph_set_loss(g, loss) == SP_OK, "skip graph: %s", sp_last_error());
    return g;
}

#endif
