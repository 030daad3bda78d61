/* bf16 activation storage (sp_program_set_bf16_activations). Memory: under bf16 each
 * stage's ACT slab shrinks by exactly 2 bytes per element of the values only matrix
 * products read, counted here from the models' shapes (per GPT block the two LayerNorm
 * outputs, N x C each, and the GELU output, N x 4C, plus the final LayerNorm's N x C in the
 * last stage; per MLP layer the ReLU output that no stage boundary takes), not by the
 * library's rule, less the documented alignment: the fp32 part and each bf16 value start
 * on 16 bytes (at most 12 bytes, 0 where the counts are multiples of 8); the planner's
 * stage model sees the same bytes; under fp32, or bf16 without the setting, every program
 * is what the plain build emits. Bits: three AdamW
 * steps of the reference interpreter on bf16 storage give bitwise the losses, parameters,
 * gradients and moments of the reference on fp32 storage, for several cuts of the GPT
 * (awkward sizes among them, where the bf16 values need padding) and for the MLP. */
#include <string.h>

#include "starpipe/data.h"
#include "starpipe/models.h"
#include "starpipe/reference.h"
#include "tests/check.h"
#include "tests/graph/program_util.h"

typedef struct {
    const char *name;
    int gpt;
    sp_gpt_config c;
    sp_mlp_config mc;
    int nq[8];           /* per stage: the values that only products read */
    int64_t numel[8][32]; /* their element counts */
} model_case;

static int64_t up16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

static sp_graph *build(const model_case *mc)
{
    sp_status st;
    sp_graph *g = mc->gpt ? sp_model_gpt(&mc->c, &st) : sp_model_mlp(&mc->mc, &st);
    REQUIRE(g, "%s: %s", mc->name, sp_last_error());
    return g;
}

/* The same buffers, sizes and op counts in every program of every stage. */
static int same_programs(const sp_program *a, const sp_program *b)
{
    for (int s = 0; s < sp_program_num_stages(a); s++)
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++) {
            if (sp_program_num_bufs(a, s, k) != sp_program_num_bufs(b, s, k) ||
                sp_program_num_ops(a, s, k) != sp_program_num_ops(b, s, k) ||
                sp_program_flops(a, s, k) != sp_program_flops(b, s, k))
                return 0;
            for (int j = 0; j < sp_program_num_bufs(a, s, k); j++) {
                sp_slab_ref x = sp_program_buf(a, s, k, j), y = sp_program_buf(b, s, k, j);
                if (x.cls != y.cls || x.index != y.index || x.bytes != y.bytes || x.mode != y.mode)
                    return 0;
            }
        }
    return 1;
}

static void memory(const model_case *mc)
{
    sp_graph *g = build(mc);
    sp_program *plain = test_program(g, SP_PRECISION_FP32, 0);
    sp_program *fp32 = test_program(g, SP_PRECISION_FP32, 1);
    sp_program *bf16 = test_program(g, SP_PRECISION_BF16, 0);
    sp_program *half = test_program(g, SP_PRECISION_BF16, 1);
    CHECK(same_programs(plain, fp32), "%s: fp32 programs changed by the bf16 storage setting",
          mc->name);
    CHECK(same_programs(plain, bf16), "%s: bf16 programs without bf16 storage differ from fp32's",
          mc->name);
    /* the setting undone: the plain programs again */
    REQUIRE(!sp_program_set_bf16_activations(fp32, 0), "%s", sp_last_error());
    CHECK(same_programs(plain, fp32), "%s: bf16 storage off again is not the plain layout",
          mc->name);
    const sp_stage_model *model = sp_program_stage_model(half);
    for (int s = 0; s < sp_program_num_stages(half); s++) {
        size_t full = sp_program_buf_bytes(plain, SP_BUF_ACT, s);
        size_t got = sp_program_buf_bytes(half, SP_BUF_ACT, s);
        int64_t elems = 0, want = 0;
        for (int j = 0; j < mc->nq[s]; j++) {
            elems += mc->numel[s][j];
            want += up16(2 * mc->numel[s][j]);
        }
        if (mc->nq[s]) want += up16((int64_t)full - 4 * elems);
        else want = (int64_t)full;
        printf("%s stage %d: ACT %zu bytes in fp32, %zu with bf16 storage: %lld fewer, "
               "2 x %lld elements less %lld of alignment\n", mc->name, s, full, got,
               (long long)full - (long long)got, (long long)elems,
               (long long)(2 * elems - ((int64_t)full - (int64_t)got)));
        CHECK((int64_t)got == want, "%s stage %d: ACT of %zu bytes with bf16 storage, expected "
              "%lld", mc->name, s, got, (long long)want);
        CHECK(model->stage[s].act_bytes == got, "%s stage %d: the planner sees %zu bytes of "
              "activations, the slab has %zu", mc->name, s, model->stage[s].act_bytes, got);
        CHECK(sp_program_stage_model(plain)->stage[s].act_bytes == full,
              "%s stage %d: fp32's planner bytes", mc->name, s);
    }
    sp_program_free(plain), sp_program_free(fp32), sp_program_free(bf16), sp_program_free(half);
    sp_graph_free(g);
}

typedef struct {
    float loss[3];
    float *slab[4][8]; /* params, grads, moment m, moment v of each stage */
} run_result;

static run_result train(const model_case *mc, const sp_program *p, int m)
{
    sp_status st;
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    opt.lr = 1e-2f;
    opt.grad_clip = 1.0f;
    sp_reference *r = sp_reference_create(p, m, &opt, 7, &st);
    REQUIRE(r, "%s", sp_last_error());
    int B = mc->gpt ? mc->c.batch : mc->mc.batch, T = mc->c.context, D = mc->mc.in_dim;
    void *in[16];
    for (int i = 0; i < m; i++) {
        in[2 * i] = malloc((size_t)B * (mc->gpt ? T : D) * 4);
        in[2 * i + 1] = malloc((size_t)B * (mc->gpt ? T : 1) * 4);
    }
    run_result res;
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < m; i++) {
            if (!mc->gpt) {
                sp_mlp_batch(7, step, i, B, D, mc->mc.classes, in[2 * i], in[2 * i + 1]);
                continue;
            }
            for (int k = 0; k < B * T; k++) {
                uint64_t V = (uint64_t)mc->c.vocab;
                ((int32_t *)in[2 * i])[k] = (int32_t)(sp_mix64(1000u * step + 100u * i + k) % V);
                ((int32_t *)in[2 * i + 1])[k] = (int32_t)(sp_mix64(7u * step + 100u * i + k) % V);
            }
        }
        REQUIRE(sp_reference_step(r, (const void *const *)in, &res.loss[step]) == SP_OK, "%s",
                sp_last_error());
    }
    for (int s = 0; s < sp_program_num_stages(p); s++) {
        size_t pb = sp_program_buf_bytes(p, SP_BUF_PARAMS, s);
        size_t gb = sp_program_buf_bytes(p, SP_BUF_GRADS, s);
        const float *src[4] = { sp_reference_slab(r, SP_BUF_PARAMS, s),
                                sp_reference_slab(r, SP_BUF_GRADS, s),
                                sp_reference_moment(r, 0, s), sp_reference_moment(r, 1, s) };
        for (int k = 0; k < 4; k++) {
            size_t n = k == 1 ? gb : pb;
            res.slab[k][s] = malloc(n ? n : 1);
            memcpy(res.slab[k][s], src[k], n);
        }
    }
    for (int i = 0; i < 2 * m; i++) free(in[i]);
    sp_reference_free(r);
    return res;
}

static void bits(const model_case *mc)
{
    sp_graph *g = build(mc);
    sp_program *full = test_program(g, SP_PRECISION_BF16, 0);
    sp_program *half = test_program(g, SP_PRECISION_BF16, 1);
    run_result a = train(mc, full, 2), b = train(mc, half, 2);
    CHECK(!memcmp(a.loss, b.loss, sizeof a.loss), "%s: losses %.9g %.9g %.9g on fp32 storage, "
          "%.9g %.9g %.9g on bf16", mc->name, a.loss[0], a.loss[1], a.loss[2], b.loss[0],
          b.loss[1], b.loss[2]);
    const char *what[4] = { "parameters", "gradients", "AdamW m", "AdamW v" };
    for (int s = 0; s < sp_program_num_stages(full); s++)
        for (int k = 0; k < 4; k++) {
            size_t n = sp_program_buf_bytes(full, k == 1 ? SP_BUF_GRADS : SP_BUF_PARAMS, s);
            CHECK(!memcmp(a.slab[k][s], b.slab[k][s], n), "%s stage %d: %s differ between fp32 "
                  "and bf16 activation storage", mc->name, s, what[k]);
            free(a.slab[k][s]), free(b.slab[k][s]);
        }
    printf("%s: 3 steps, loss %.7f -> %.7f, the same bits on both storages\n", mc->name,
           a.loss[0], a.loss[2]);
    sp_program_free(full), sp_program_free(half);
    sp_graph_free(g);
}

/* The values of a GPT cut as `layers` says (blocks per stage) that only products read:
 * ln1 (N C), ln2 (N C) and gelu (N 4C) of each block, lnf (N C) in the last stage. */
static void gpt_values(model_case *mc, const int *layers)
{
    int64_t N = (int64_t)mc->c.batch * mc->c.context, C = mc->c.channels;
    for (int s = 0; s < mc->c.stages; s++) {
        mc->nq[s] = 0;
        for (int l = 0; l < layers[s]; l++) {
            mc->numel[s][mc->nq[s]++] = N * C;
            mc->numel[s][mc->nq[s]++] = N * C;
            mc->numel[s][mc->nq[s]++] = N * 4 * C;
        }
        if (s == mc->c.stages - 1) mc->numel[s][mc->nq[s]++] = N * C;
    }
}

int main(void)
{
    /* starpipe-gpt's defaults on 2 stages, and other cuts */
    model_case gpt = { .name = "gpt (starpipe-gpt defaults, 2 stages)", .gpt = 1,
                       .c = { .vocab = 256, .context = 64, .layers = 4, .heads = 4,
                              .channels = 64, .batch = 4, .stages = 2 } };
    gpt_values(&gpt, (int[]){ 2, 2 });
    memory(&gpt);
    bits(&gpt);
    model_case one = gpt;
    one.name = "gpt 1 stage";
    one.c.stages = 1;
    gpt_values(&one, (int[]){ 4 });
    memory(&one);
    bits(&one);
    /* the embedding alone, then the blocks, then the head alone */
    static const int cut[] = { 0, 3, 1 };
    model_case uneven = gpt;
    uneven.name = "gpt cut 0,3,1";
    uneven.c.stages = 3;
    uneven.c.stage_layers = cut;
    gpt_values(&uneven, cut);
    memory(&uneven);
    bits(&uneven);
    /* awkward sizes: odd element counts, so the fp32 part and each bf16 value are padded */
    model_case odd = { .name = "gpt awkward sizes", .gpt = 1,
                       .c = { .vocab = 37, .context = 7, .layers = 3, .heads = 3, .channels = 15,
                              .batch = 3, .stages = 2 } };
    gpt_values(&odd, (int[]){ 2, 1 });
    memory(&odd);
    bits(&odd);
    /* MLP: stage 0's ReLU output crosses to stage 1 (the boundary copy reads it: fp32);
     * stage 1's feeds only the head's product */
    model_case mlp = { .name = "mlp 2 stages",
                       .mc = { .in_dim = 24, .width = 48, .depth = 2, .classes = 10,
                               .batch = 16, .stages = 2 } };
    mlp.nq[1] = 1;
    mlp.numel[1][0] = 16 * 48;
    memory(&mlp);
    bits(&mlp);
    return check_summary("test_bf16_act");
}
