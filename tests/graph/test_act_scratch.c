/* F-only values in SCRATCH: what no backward program (B, W, BW) reads lives in the stage's
 * SCRATCH slab, not in ACT. Each stage's ACT bytes are counted here from the models'
 * shapes, not by the library's rule: every value and auxiliary float the stage computes
 * (the ACT of the build before this change; for starpipe-gpt's defaults also its measured
 * bytes), less the values only F reads. Per GPT block those are the four matrix products'
 * outputs before their bias (N 3C, N C, N 4C, N C), the two bias outputs that only feed a
 * residual add (N C each), and, in a stage a later one follows, its last residual sum
 * (N C: only F's boundary copy reads it); per MLP layer the product before its bias
 * (N W), and a stage's last ReLU output when a later stage takes it. The loss and the
 * named logits stay. Under bf16 storage the same, with the values only products read as
 * bf16 (test_bf16_act's count). The planner's stage model sees the same bytes, the named
 * logits are still readable after a forward, and SCRATCH holds at least the largest moved
 * value (N 4C in a GPT block). The bits of runs on this layout are checked by the apps'
 * tests against the reference and against files of the build before it. */
#include <string.h>

#include "starpipe/models.h"
#include "starpipe/reference.h"
#include "tests/check.h"
#include "tests/graph/program_util.h"

static int64_t up16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

typedef struct {
    int64_t all;      /* floats of every value and aux float (the old ACT) */
    int64_t moved;    /* floats of the values only F reads */
    int64_t largest;  /* the largest of them */
    int64_t nhalf;    /* values kept as bf16 under bf16 storage */
    int64_t half[64]; /* their element counts */
} count;

/* ACT bytes of a stage counted c: fp32, or with bf16 storage (fp32 part and each bf16
 * value on 16 bytes, as test_bf16_act documents) */
static int64_t act_bytes(const count *c, int bf16)
{
    int64_t f32 = c->all - c->moved;
    if (!bf16 || !c->nhalf) return 4 * f32;
    int64_t b = 0;
    for (int j = 0; j < c->nhalf; j++) {
        f32 -= c->half[j];
        b += up16(2 * c->half[j]);
    }
    return up16(4 * f32) + b;
}

static void check_model(const char *name, const sp_graph *g, const count *c, int S,
                        const int64_t *old_fp32, const int64_t *old_bf16)
{
    sp_program *fp32 = test_program(g, SP_PRECISION_FP32, 0);
    sp_program *half = test_program(g, SP_PRECISION_BF16, 1);
    REQUIRE(sp_program_num_stages(fp32) == S, "%s: %d stages", name, sp_program_num_stages(fp32));
    for (int s = 0; s < S; s++) {
        for (int h = 0; h < 2; h++) {
            const sp_program *p = h ? half : fp32;
            size_t got = sp_program_buf_bytes(p, SP_BUF_ACT, s);
            int64_t want = act_bytes(&c[s], h), before = 4 * c[s].all;
            if (h) { /* the old bf16 layout: every value in ACT */
                count o = c[s];
                o.moved = 0;
                before = act_bytes(&o, 1);
            }
            printf("%s stage %d %s: ACT %lld -> %zu bytes (%lld fewer: %lld floats only F "
                   "reads), SCRATCH %zu bytes\n", name, s, h ? "bf16" : "fp32",
                   (long long)before, got, (long long)(before - (int64_t)got),
                   (long long)c[s].moved, sp_program_buf_bytes(p, SP_BUF_SCRATCH, s));
            CHECK((int64_t)got == want, "%s stage %d %s: ACT of %zu bytes, expected %lld", name,
                  s, h ? "bf16" : "fp32", got, (long long)want);
            const int64_t *old = h ? old_bf16 : old_fp32;
            if (old)
                CHECK(old[s] == before, "%s stage %d %s: the count of every value, %lld bytes, "
                      "is not the %lld measured before the change", name, s,
                      h ? "bf16" : "fp32", (long long)before, (long long)old[s]);
            CHECK(sp_program_stage_model(p)->stage[s].act_bytes == got, "%s stage %d: the "
                  "planner sees %zu bytes of activations, the slab has %zu", name, s,
                  sp_program_stage_model(p)->stage[s].act_bytes, got);
            CHECK((int64_t)sp_program_buf_bytes(p, SP_BUF_SCRATCH, s) >= 4 * c[s].largest,
                  "%s stage %d: SCRATCH of %zu bytes cannot hold a moved value of %lld floats",
                  name, s, sp_program_buf_bytes(p, SP_BUF_SCRATCH, s), (long long)c[s].largest);
        }
    }
    /* the named logits: kept, readable after a forward */
    sp_status st;
    sp_reference *r = sp_reference_create(fp32, 1, NULL, 1, &st);
    REQUIRE(r, "%s", sp_last_error());
    CHECK(sp_reference_value(r, sp_graph_find(g, "logits")) != NULL, "%s: the logits are no "
          "longer readable", name);
    sp_reference_free(r);
    sp_program_free(fp32), sp_program_free(half);
}

/* A GPT cut into stages of layers[s] blocks: N tokens, C channels, NH heads, V vocab. */
static void gpt(const char *name, const sp_gpt_config *cfg, const int *layers,
                const int64_t *old_fp32, const int64_t *old_bf16)
{
    sp_status st;
    sp_graph *g = sp_model_gpt(cfg, &st);
    REQUIRE(g, "%s", sp_last_error());
    int S = cfg->stages;
    int64_t N = (int64_t)cfg->batch * cfg->context, C = cfg->channels, V = cfg->vocab;
    int64_t NH = cfg->heads;
    count c[8];
    memset(c, 0, sizeof c);
    for (int s = 0; s < S; s++) {
        count *k = &c[s];
        if (s == 0) k->all += N * C; /* token + position embedding */
        for (int l = 0; l < layers[s]; l++) {
            /* ln1 (+ mean, rstd), qkv product, + bias, attention (+ lse), proj product,
             * + bias, residual, ln2 (+ mean, rstd), fc product, + bias, gelu, fcproj
             * product, + bias, residual */
            k->all += N * C + 2 * N + 3 * N * C + 3 * N * C + N * C + N * NH + N * C + N * C +
                      N * C + N * C + 2 * N + 4 * N * C + 4 * N * C + 4 * N * C + N * C +
                      N * C + N * C;
            k->moved += 3 * N * C + N * C + N * C + 4 * N * C + N * C + N * C;
            k->half[k->nhalf++] = N * C;     /* ln1 */
            k->half[k->nhalf++] = N * C;     /* ln2 */
            k->half[k->nhalf++] = 4 * N * C; /* gelu */
        }
        /* a stage followed by another: its last residual sum (or the embedding alone) */
        if (s < S - 1) k->moved += N * C;
        k->largest = layers[s] ? 4 * N * C : N * C;
        if (s == S - 1) {
            /* lnf (+ mean, rstd), logits, loss (+ probabilities) */
            k->all += N * C + 2 * N + N * V + 1 + N * V;
            k->half[k->nhalf++] = N * C;
        }
    }
    check_model(name, g, c, S, old_fp32, old_bf16);
    sp_graph_free(g);
}

/* An MLP: batch N, width W, K classes, layers[s] hidden layers (matmul, bias, relu) per stage. */
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
        k->moved += N * W * layers[s]; /* the products before their bias */
        if (s < S - 1) k->moved += N * W; /* the ReLU output the next stage takes */
        else if (layers[s] > 0) k->half[k->nhalf++] = N * W; /* only the head's product reads */
        for (int l = 0; l + 1 < layers[s]; l++) k->half[k->nhalf++] = N * W;
        k->largest = N * W;
        if (s == S - 1) {
            k->all += N * K + N * K + 1 + N * K; /* head product, logits, loss + probs */
            k->moved += N * K;
            if (N * K > k->largest || !layers[s]) k->largest = N * K;
        }
    }
    check_model(name, g, c, S, NULL, NULL);
    sp_graph_free(g);
}

int main(void)
{
    /* starpipe-gpt's defaults on 2 ranks; ACT measured before this change
     * (STARPIPE_VERBOSE=1 mpirun -np 2 starpipe-gpt --steps 1 [--precision bf16]) */
    sp_gpt_config d = { .vocab = 256, .context = 64, .layers = 4, .heads = 4, .channels = 64,
                        .batch = 4, .stages = 2 };
    gpt("gpt defaults", &d, (int[]){ 2, 2 }, (int64_t[]){ 3620864, 4147204 },
        (int64_t[]){ 3227648, 3721232 });
    sp_gpt_config big = d;
    big.layers = 8, big.channels = 256, big.context = 128;
    gpt("gpt 8 layers, 256 channels, context 128", &big, (int[]){ 4, 4 },
        (int64_t[]){ 57212928, 58265604 }, (int64_t[]){ 50921472, 51712016 });
    /* the embedding alone, awkward sizes */
    static const int cut[] = { 0, 2, 1 };
    sp_gpt_config odd = { .vocab = 37, .context = 7, .layers = 3, .heads = 3, .channels = 15,
                          .batch = 3, .stages = 3, .stage_layers = cut };
    gpt("gpt awkward, cut 0,2,1", &odd, cut, NULL, NULL);
    sp_mlp_config m = { .in_dim = 24, .width = 48, .depth = 2, .classes = 10, .batch = 16,
                        .stages = 2 };
    mlp("mlp 2 stages", &m, (int[]){ 1, 1 });
    sp_mlp_config m4 = { .in_dim = 20, .width = 36, .depth = 5, .classes = 7, .batch = 9,
                         .stages = 3 };
    mlp("mlp depth 5, 3 stages", &m4, (int[]){ 2, 2, 1 });
    return check_summary("test_act_scratch");
}
