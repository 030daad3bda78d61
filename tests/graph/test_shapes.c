/* Shape and graph errors: the documented status, a message naming the op and both
 * shapes, error propagation through chains, and stage bookkeeping of sp_pipeline_yield. */
#include <string.h>

#include "starpipe/graph.h"
#include "starpipe/models.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"
#include "tests/check.h"
#include "tests/graph/arena.h"

#define HAS(msg, part) (strstr((msg), (part)) != NULL)

static void expect_error(sp_tensor t, sp_status code, const char *a, const char *b,
                         const char *c, int line)
{
    const char *msg = sp_last_error();
    CHECK(t == -(int)code, "line %d: expected id %d (-%s), got %d", line, -(int)code,
          sp_status_name(code), t);
    CHECK(HAS(msg, a), "line %d: message '%s' lacks '%s'", line, msg, a);
    if (b) CHECK(HAS(msg, b), "line %d: message '%s' lacks '%s'", line, msg, b);
    if (c) CHECK(HAS(msg, c), "line %d: message '%s' lacks '%s'", line, msg, c);
}
#define EXPECT(t, code, a, b, c) expect_error((t), (code), (a), (b), (c), __LINE__)

int main(void)
{
    sp_graph *g = sp_graph_create();
    REQUIRE(g, "sp_graph_create");
    sp_tensor x = sp_input_f32(g, "x", 2, (int64_t[]){ 7, 13 });
    sp_tensor ids = sp_input_i32(g, "ids", 2, (int64_t[]){ 7, 13 });
    sp_tensor w = sp_param(g, "w", 2, (int64_t[]){ 12, 5 }, SP_INIT_NORMAL, 0.1f);
    sp_tensor w2 = sp_param(g, "w2", 2, (int64_t[]){ 13, 5 }, SP_INIT_NORMAL, 0.1f);
    sp_tensor b4 = sp_param(g, "b4", 1, (int64_t[]){ 4 }, SP_INIT_ZEROS, 0);
    REQUIRE(x >= 0 && ids >= 0 && w >= 0 && w2 >= 0 && b4 >= 0, "leaves: %s", sp_last_error());

    EXPECT(sp_matmul(g, x, w, 0, 0), SP_ERR_SHAPE, "sp_matmul", "(7,13)", "(12,5)");
    EXPECT(sp_matmul(g, x, w2, 0, 1), SP_ERR_SHAPE, "sp_matmul", "(7,13)", "(13,5)^T");
    sp_tensor y = sp_matmul(g, x, w2, 0, 0);
    CHECK(y >= 0 && sp_tensor_shape(g, y)[0] == 7 && sp_tensor_shape(g, y)[1] == 5,
          "matmul (7,13)x(13,5) -> (7,5)");
    sp_tensor yt = sp_matmul(g, x, w2, 1, 1); /* x^T (13,7) @ w2^T (5,13)? inner 7 vs 13 */
    EXPECT(yt, SP_ERR_SHAPE, "sp_matmul", "(7,13)^T", "(13,5)^T");
    EXPECT(sp_add(g, y, x), SP_ERR_SHAPE, "sp_add", "(7,5)", "(7,13)");
    EXPECT(sp_bias_add(g, y, b4), SP_ERR_SHAPE, "sp_bias_add", "(4)", "(7,5)");
    EXPECT(sp_matmul(g, ids, w2, 0, 0), SP_ERR_SHAPE, "sp_matmul", "f32", NULL);
    EXPECT(sp_layernorm(g, y, y, y), SP_ERR_GRAPH, "sp_layernorm", "parameter", NULL);
    EXPECT(sp_reshape(g, y, 2, (int64_t[]){ 6, 6 }), SP_ERR_SHAPE, "sp_reshape", "(7,5)", "36");
    EXPECT(sp_cross_entropy(g, y, x), SP_ERR_SHAPE, "sp_cross_entropy", "(7,13)", "(7,5)");
    EXPECT(sp_embed(g, x, w, w), SP_ERR_SHAPE, "sp_embed", "tokens(7,13)", NULL);
    sp_tensor qkv = sp_input_f32(g, "qkv", 3, (int64_t[]){ 2, 5, 36 });
    EXPECT(sp_attention(g, qkv, 5), SP_ERR_SHAPE, "sp_attention", "5 heads", "C=12");
    CHECK(sp_attention(g, qkv, 3) >= 0, "attention with 3 heads of C=12: %s", sp_last_error());
    EXPECT(sp_input_f32(g, "x", 1, (int64_t[]){ 3 }), SP_ERR_ARG, "already used", "'x'", NULL);
    EXPECT(sp_input_f32(g, "z", 1, (int64_t[]){ 0 }), SP_ERR_SHAPE, "sp_input", "'z'", NULL);

    /* errors propagate: a chain is checked once at its end */
    sp_tensor bad = sp_matmul(g, x, w, 0, 0);
    sp_tensor chain = sp_relu(g, sp_gelu(g, sp_scale(g, bad, 2.0f)));
    CHECK(chain == bad && chain == -SP_ERR_SHAPE, "chain keeps the first error: %d", chain);
    CHECK(HAS(sp_last_error(), "sp_matmul"), "first message kept: %s", sp_last_error());
    sp_status st = sp_graph_set_loss(g, chain);
    CHECK(st == SP_ERR_GRAPH && HAS(sp_last_error(), "sp_matmul"),
          "set_loss on a failed chain: %s", sp_last_error());
    sp_graph_free(g);

    /* pipeline_yield: stages, rules */
    g = sp_graph_create();
    x = sp_input_f32(g, "x", 2, (int64_t[]){ 3, 4 });
    sp_tensor lab = sp_input_i32(g, "y", 1, (int64_t[]){ 3 });
    w = sp_param(g, "w", 2, (int64_t[]){ 4, 4 }, SP_INIT_NORMAL, 0.5f);
    EXPECT(sp_pipeline_yield(g, w), SP_ERR_GRAPH, "sp_pipeline_yield", "'w'", NULL);
    sp_tensor h0 = sp_relu(g, sp_matmul(g, x, w, 0, 0));
    CHECK(sp_tensor_stage(g, h0) == 0, "stage 0");
    sp_tensor h1 = sp_pipeline_yield(g, h0);
    CHECK(sp_tensor_stage(g, sp_relu(g, h1)) == 1, "ops after a yield are in stage 1");
    EXPECT(sp_pipeline_yield(g, h0), SP_ERR_GRAPH, "stage 0", "stage 1", NULL);
    sp_tensor early = sp_cross_entropy(g, h0, lab); /* computed in stage 1 from a stage-0 tensor */
    CHECK(early >= 0, "cross-stage use is allowed: %s", sp_last_error());
    sp_tensor h2 = sp_pipeline_yield(g, sp_relu(g, h1));
    CHECK(sp_graph_num_stages(g) == 3, "3 stages, got %d", sp_graph_num_stages(g));
    st = sp_graph_set_loss(g, early);
    CHECK(st == SP_ERR_GRAPH && HAS(sp_last_error(), "last stage"), "loss not in last stage: %s",
          sp_last_error());
    (void)h2;
    sp_program *p = sp_program_build(g, &st);
    CHECK(!p && st == SP_ERR_GRAPH && HAS(sp_last_error(), "no loss"), "build without loss: %s",
          sp_last_error());
    sp_graph_free(g);

    /* two yields in a row would leave an empty stage: the second is refused */
    g = sp_graph_create();
    x = sp_input_f32(g, "x", 2, (int64_t[]){ 3, 4 });
    w = sp_param(g, "w", 2, (int64_t[]){ 4, 4 }, SP_INIT_NORMAL, 0.5f);
    h0 = sp_pipeline_yield(g, sp_matmul(g, x, w, 0, 0));
    EXPECT(sp_pipeline_yield(g, h0), SP_ERR_GRAPH, "sp_pipeline_yield", "stage 0", "stage 1");
    sp_graph_free(g);
    /* a token outside the vocabulary is refused before any kernel runs */
    sp_gpt_config gc = { .vocab = 256, .context = 4, .layers = 1, .heads = 1, .channels = 4,
                         .batch = 1, .stages = 1 };
    g = sp_model_gpt(&gc, &st);
    p = g ? sp_program_build(g, &st) : NULL;
    sp_reference *r = p ? sp_reference_create(p, 2, NULL, 1, &st) : NULL;
    REQUIRE(r, "gpt: %s", sp_last_error());
    int32_t tok[2][4] = { { 1, 2, 3, 4 }, { 5, 300, 7, 8 } }, tgt[2][4] = { { 0 }, { 0 } };
    const void *in[4] = { tok[0], tgt[0], tok[1], tgt[1] };
    float loss;
    st = sp_reference_step(r, in, &loss);
    CHECK(st == SP_ERR_ARG && HAS(sp_last_error(), "input 'tokens' of microbatch 1: value 300 "
                                  "at position 1 is outside [0,256)"), "bad token: %s",
          sp_last_error());
    tok[1][1] = 6;
    tgt[0][3] = -1;
    st = sp_reference_step(r, in, &loss);
    CHECK(st == SP_ERR_ARG && HAS(sp_last_error(), "input 'targets' of microbatch 0: value -1"),
          "bad target: %s", sp_last_error());
    /* a program run directly (no input check first): the CPU kernels refuse them too */
    arena a = { .p = p };
    int32_t *atok = arena_get(&a, SP_BUF_INPUT, 0), *atgt = arena_get(&a, SP_BUF_INPUT, 1);
    atok[2] = 256;
    st = arena_run(&a, 0, SP_TASK_F, 1.0f);
    CHECK(st == SP_ERR_ARG && HAS(sp_last_error(), "(embed, node") &&
              HAS(sp_last_error(), "failed on cpu: an index outside its range"),
          "bad token, run directly: %s", sp_last_error());
    atok[2] = 0, atgt[3] = 256;
    st = arena_run(&a, 0, SP_TASK_F, 1.0f);
    CHECK(st == SP_ERR_ARG && HAS(sp_last_error(), "(ce, node"), "bad target, run directly: %s",
          sp_last_error());
    atgt[3] = 0;
    CHECK(arena_run(&a, 0, SP_TASK_F, 1.0f) == SP_OK, "good inputs, run directly: %s",
          sp_last_error());
    arena_free(&a);
    sp_reference_free(r);
    sp_program_free(p);
    sp_graph_free(g);
    return check_summary("test_shapes");
}
