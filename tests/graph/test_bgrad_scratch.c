/* BGRAD keeps only what W reads: the activation gradients a stage keeps from B to W of a
 * microbatch are those B computes (or takes in) and W reads; every other one lives in the
 * stage's SCRATCH, inside the one program that uses it. Each stage's BGRAD bytes are
 * counted here from the models' shapes, by hand, not by the library's rule.
 *
 * What W reads, per op: a matrix product's weight gradient reads the gradient of its output,
 * a bias's that of the bias add's output, a LayerNorm's parameters that of its output, the
 * embedding's that of its output. A bias add's input gradient is a copy of its output's
 * when the input is read by nothing else in or outside its stage: then the two are one
 * buffer. Per GPT block (N tokens, C channels): the four products' outputs (N 3C, N C,
 * N 4C, N C), each read only by its bias add, so each one with the bias output's, and the
 * two LayerNorm outputs (N C each): 11 N C (20 N C when the pairs were kept apart). The
 * last stage adds the final LayerNorm's output (N C) and the logits (N V: the tied head's
 * product, no bias). Per MLP layer (width W): the product's output, one with the bias's
 * (N W); the head's (N K). Where B computes them: in every stage but
 * the first, whose inputs need no gradient. Stage 0's B only takes in the gradient of its
 * last value from stage 1, which W reads (N C, N W); the rest of its backward runs in W,
 * inside it. A one-stage model's B is the loss seed alone (1 float, read by W).
 *
 * The count of every gradient (the BGRAD of the build before this change, also measured
 * there for starpipe-gpt's defaults and the large GPT) is checked too, and the planner's
 * stage model must see the same bytes, W never writes BGRAD, and bf16 (whose attention
 * takes more SCRATCH) keeps the same BGRAD (test_bf16_act: the same buffers as fp32's
 * without bf16 storage). The bits: test_bw_split runs B, then W on a
 * SCRATCH overwritten in between, against BW; the apps' tests against the reference. */
#include <string.h>

#include "starpipe/models.h"
#include "tests/check.h"
#include "tests/graph/program_util.h"

typedef struct {
    int64_t all;  /* floats of every activation gradient (the old BGRAD) */
    int64_t kept; /* floats of those B hands W */
} count;

static void check_model(const char *name, const sp_graph *g, const count *c, int S,
                        const int64_t *old)
{
    sp_program *fp32 = test_program(g, SP_PRECISION_FP32, 0);
    sp_program *half = test_program(g, SP_PRECISION_BF16, 1);
    REQUIRE(sp_program_num_stages(fp32) == S, "%s: %d stages", name, sp_program_num_stages(fp32));
    for (int s = 0; s < S; s++) {
        for (int h = 0; h < 2; h++) {
            const sp_program *p = h ? half : fp32;
            size_t got = sp_program_buf_bytes(p, SP_BUF_BGRAD, s);
            printf("%s stage %d %s: BGRAD %lld -> %zu bytes per microbatch (%lld fewer), "
                   "SCRATCH %zu bytes\n", name, s, h ? "bf16" : "fp32", (long long)(4 * c[s].all),
                   got, (long long)(4 * c[s].all - (int64_t)got),
                   sp_program_buf_bytes(p, SP_BUF_SCRATCH, s));
            CHECK((int64_t)got == 4 * c[s].kept, "%s stage %d %s: BGRAD of %zu bytes, expected "
                  "%lld (what W reads)", name, s, h ? "bf16" : "fp32", got,
                  (long long)(4 * c[s].kept));
            if (old)
                CHECK(old[s] == 4 * c[s].all, "%s stage %d: the count of every gradient, %lld "
                      "bytes, is not the %lld measured before the change", name, s,
                      (long long)(4 * c[s].all), (long long)old[s]);
            CHECK(sp_program_stage_model(p)->stage[s].bgrad_bytes == got, "%s stage %d: the "
                  "planner sees %zu bytes of BGRAD, the slab has %zu", name, s,
                  sp_program_stage_model(p)->stage[s].bgrad_bytes, got);
            for (int j = 0; j < sp_program_num_bufs(p, s, SP_TASK_W); j++) {
                sp_slab_ref r = sp_program_buf(p, s, SP_TASK_W, j);
                CHECK(r.cls != SP_BUF_BGRAD || r.mode == SP_ACCESS_R, "%s stage %d: W writes "
                      "BGRAD (what only W uses belongs in SCRATCH)", name, s);
            }
        }
    }
    sp_program_free(fp32), sp_program_free(half);
}

/* A GPT cut into stages of layers[s] blocks. */
static void gpt(const char *name, const sp_gpt_config *cfg, const int *layers,
                const int64_t *old)
{
    sp_status st;
    sp_graph *g = sp_model_gpt(cfg, &st);
    REQUIRE(g, "%s", sp_last_error());
    int S = cfg->stages;
    int64_t N = (int64_t)cfg->batch * cfg->context, C = cfg->channels, V = cfg->vocab;
    count c[8];
    memset(c, 0, sizeof c);
    for (int s = 0; s < S; s++) {
        count *k = &c[s];
        if (s == 0) k->all += N * C; /* the embedding */
        /* ln1, qkv product, + bias, attention, proj product, + bias, residual, ln2, fc
         * product, + bias, gelu, fcproj product, + bias, residual */
        k->all += 27 * N * C * layers[s];
        if (s == S - 1) k->all += N * C + N * V + 1; /* lnf, logits, loss */
        if (S == 1) {
            k->kept = 1; /* the loss seed */
        } else if (s == 0) {
            k->kept = N * C; /* the last value's gradient, from stage 1 */
        } else {
            k->kept = 11 * N * C * layers[s];
            if (s == S - 1) k->kept += N * C + N * V;
        }
    }
    check_model(name, g, c, S, old);
    sp_graph_free(g);
}

/* An MLP: batch N, width W, K classes, layers[s] hidden layers (matmul, bias, relu). */
static void mlp(const char *name, const sp_mlp_config *cfg, const int *layers)
{
    sp_status st;
    sp_graph *g = sp_model_mlp(cfg, &st);
    REQUIRE(g, "%s", sp_last_error());
    int S = cfg->stages;
    int64_t N = cfg->batch, W = cfg->width, K = cfg->classes;
    count c[8];
    memset(c, 0, sizeof c);
    for (int s = 0; s < S; s++) {
        count *k = &c[s];
        k->all += 3 * N * W * layers[s];
        if (s == S - 1) k->all += 2 * N * K + 1; /* head product, logits, loss */
        if (S == 1) {
            k->kept = 1;
        } else if (s == 0) {
            k->kept = N * W; /* the last ReLU's gradient, from stage 1 */
        } else {
            k->kept = N * W * layers[s];
            if (s == S - 1) k->kept += N * K;
        }
    }
    check_model(name, g, c, S, NULL);
    sp_graph_free(g);
}

/* A product h read by a bias add in stage 1 of two, and, when `twice`, by a residual add
 * too: z = (h + b) + h. Then dh = dy + dz is not dy, so the two gradients stay apart.
 * Stage 1's B computes them all (stage 0's value a needs its gradient); W reads dh (the
 * weight's) and dy (the bias'): N C when they are one, 2 N C when twice. Stage 0 keeps a's
 * gradient (N C), received from stage 1. */
static void read_twice(int twice)
{
    enum { N = 6, D = 5, C = 7, K = 3 };
    sp_graph *g = sp_graph_create();
    sp_tensor x = sp_input_f32(g, "x", 2, (int64_t[]){ N, D });
    sp_tensor y = sp_input_i32(g, "y", 1, (int64_t[]){ N });
    sp_tensor w0 = sp_param(g, "w0", 2, (int64_t[]){ D, C }, SP_INIT_NORMAL, 0.3f);
    sp_tensor w1 = sp_param(g, "w1", 2, (int64_t[]){ C, C }, SP_INIT_NORMAL, 0.3f);
    sp_tensor b1 = sp_param(g, "b1", 1, (int64_t[]){ C }, SP_INIT_NORMAL, 0.3f);
    sp_tensor wo = sp_param(g, "wo", 2, (int64_t[]){ C, K }, SP_INIT_NORMAL, 0.3f);
    sp_tensor a = sp_pipeline_yield(g, sp_relu(g, sp_matmul(g, x, w0, 0, 0)));
    sp_tensor h = sp_matmul(g, a, w1, 0, 0);
    sp_tensor z = sp_bias_add(g, h, b1);
    if (twice) z = sp_add(g, z, h);
    /* the head's product: its gradient is CE's, read by W (N K) */
    sp_tensor lg = sp_matmul(g, sp_relu(g, z), wo, 0, 0);
    REQUIRE(sp_graph_set_loss(g, sp_cross_entropy(g, lg, y)) == SP_OK, "%s", sp_last_error());
    count c[2] = { { .all = 2 * N * C, .kept = N * C },
                   { .all = (twice ? 4 : 3) * N * C + N * K + 1,
                     .kept = (twice ? 2 : 1) * N * C + N * K } };
    check_model(twice ? "product read by a bias add and an add" : "product read by a bias add",
                g, c, 2, NULL);
    sp_graph_free(g);
}

int main(void)
{
    /* starpipe-gpt's defaults on 2 ranks; BGRAD measured before this change
     * (STARPIPE_VERBOSE=1 mpirun -np 2 starpipe-gpt --steps 1 --schedule zb-h1
     * [--layers 8 --channels 256 --context 128]) */
    sp_gpt_config d = { .vocab = 256, .context = 64, .layers = 4, .heads = 4, .channels = 64,
                        .batch = 4, .stages = 2 };
    gpt("gpt defaults", &d, (int[]){ 2, 2 }, (int64_t[]){ 3604480, 3866628 });
    sp_gpt_config big = d;
    big.layers = 8, big.channels = 256, big.context = 128;
    gpt("gpt 8 layers, 256 channels, context 128", &big, (int[]){ 4, 4 },
        (int64_t[]){ 57147392, 57671684 });
    sp_gpt_config v4 = d; /* zb-v and dualpipe-v's 4 stages on 2 ranks */
    v4.stages = 4;
    gpt("gpt defaults, 4 stages", &v4, (int[]){ 1, 1, 1, 1 },
        (int64_t[]){ 1835008, 1769472, 1769472, 2097156 });
    sp_gpt_config one = d;
    one.stages = 1;
    gpt("gpt 1 stage", &one, (int[]){ 4 }, NULL);
    /* the embedding alone, the head alone, awkward sizes */
    static const int cut[] = { 0, 2, 1 }, head[] = { 2, 1, 0 };
    sp_gpt_config odd = { .vocab = 37, .context = 7, .layers = 3, .heads = 3, .channels = 15,
                          .batch = 3, .stages = 3, .stage_layers = cut };
    gpt("gpt awkward, cut 0,2,1", &odd, cut, NULL);
    odd.stage_layers = head;
    gpt("gpt awkward, cut 2,1,0", &odd, head, NULL);
    sp_mlp_config m = { .in_dim = 24, .width = 48, .depth = 2, .classes = 10, .batch = 16,
                        .stages = 2 };
    mlp("mlp 2 stages", &m, (int[]){ 1, 1 });
    sp_mlp_config m4 = { .in_dim = 20, .width = 36, .depth = 5, .classes = 7, .batch = 9,
                         .stages = 3 };
    mlp("mlp depth 5, 3 stages", &m4, (int[]){ 2, 2, 1 });
    m4.stages = 1;
    mlp("mlp depth 5, 1 stage", &m4, (int[]){ 5 });
    read_twice(0);
    read_twice(1);
    return check_summary("test_bgrad_scratch");
}
