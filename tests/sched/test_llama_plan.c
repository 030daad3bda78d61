/* The Llama stage model (sp_stage_model_llama): per-stage FLOPs, parameters, activations
 * and the tensor group's all-reduces at T = 1, 2, 4, 8, counted here tensor by tensor
 * (not with stages.h's factored formulas); Llama 2 7B's and 70B's parameter counts
 * against the published 6.74e9 and 68.98e9; 70B's stages at T = 8 written out; a
 * multi-head Llama whose MLP has the GPT's 8 C^2 weights costs what the GPT does; bad
 * shapes refused with one message each; the 70B planned and simulated at T = 8. */
#include <math.h>
#include <string.h>

#include "test_util.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-12 * (fabs(a) + fabs(b)) + 1e-15; }

/* A Llama block's tensors, whole, for a shape */
typedef struct {
    double q, k, v, o, gate, up, down, norms; /* parameter counts */
} block_weights;

static block_weights weights_of(const sp_llama_shape *l)
{
    double C = l->channels, hs = (double)l->channels / l->heads, I = l->hidden;
    return (block_weights){ .q = C * (l->heads * hs), .k = C * (l->kv_heads * hs),
                            .v = C * (l->kv_heads * hs), .o = (l->heads * hs) * C,
                            .gate = C * I, .up = C * I, .down = I * C, .norms = C + C };
}

static double split_weights(const block_weights *w)
{
    return w->q + w->k + w->v + w->o + w->gate + w->up + w->down;
}

/* Every stage of l cut into S against a count made here, at l->tensor */
static void check_stages(const sp_llama_shape *l, int S)
{
    int T = l->tensor > 1 ? l->tensor : 1;
    sp_stage_model *m = sp_stage_model_llama(l, S);
    CHECK(m != NULL, "T %d: %s", T, sp_last_error());
    if (!m) return;
    CHECK(m->nstages == S && m->nedges == S - 1 && m->nshared == 0, "T %d: %d stages", T,
          m->nstages);
    block_weights w = weights_of(l);
    /* the vocabulary as the apps run it: padded to a multiple of 128 T */
    double N = (double)l->batch * l->context, C = l->channels, ctx = l->context;
    double V = (double)sp_padded_vocab(l->vocab, SP_VOCAB_PAD, T);
    double hs = C / l->heads, kvw = l->kv_heads * hs, I = l->hidden, eb = 2;
    /* one token's activations a block keeps: RMSNorm inputs x and h, their outputs (the
     * inputs of q/k/v and gate/up), whole; q, k, v after the rotation, attention's output,
     * gate, up and silu(gate) up (down's input), split by heads or columns */
    double whole_acts = C + C + C + C;
    double split_acts = C + kvw + kvw + C + I + I + I;
    /* one block's FLOPs, 2 per multiply-add: each weight once per token, and attention's
     * two products (scores, scores x values) over the query heads' width: F once, B twice
     * (attention has no weights: all its backward is B) */
    double products = 2 * N * split_weights(&w), attention = 2 * (2 * N * ctx * C);
    double head = 2 * N * C * V;
    int rest = l->layers % S;
    for (int s = 0; s < S; s++) {
        const sp_stage_info *st = &m->stage[s];
        int nl = l->layers / S + (s < rest), first = s == 0, last = s == S - 1;
        double params = nl * (split_weights(&w) / T + w.norms) + first * V * C / T +
                        last * (C * V / T + C);
        CHECK(st->param_bytes == (size_t)(4 * params), "T %d stage %d params %zu, want %.0f",
              T, s, st->param_bytes, 4 * params);
        CHECK(st->opt_bytes == 2 * st->param_bytes, "T %d stage %d AdamW", T, s);
        double acts = nl * N * eb * (whole_acts + split_acts / T);
        CHECK(st->act_bytes == (size_t)acts, "T %d stage %d acts %zu, want %.0f", T, s,
              st->act_bytes, acts);
        double f = (nl * (products + attention) + last * head) / T;
        double b = (nl * (products + 2 * attention) + last * head) / T;
        double wg = (nl * products + last * head) / T;
        double want[SP_NUM_TASK_KINDS] = { f, b, wg, b + wg };
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++)
            CHECK(near(st->cost[k] * l->device_flops, want[k]), "T %d stage %d %s: %.17g "
                  "FLOPs, want %.17g", T, s, sp_task_kind_name((sp_task_kind)k),
                  st->cost[k] * l->device_flops, want[k]);
        CHECK(st->bgrad_bytes == 0 && !st->recompute, "T %d stage %d extras", T, s);
        /* o and down in F, the inputs of q/k/v and gate/up in B: (N, C) each; the
         * embedding +1 in F, the head +1 in B, the cross-entropy 3 of N floats in F */
        int nf = T > 1 ? 2 * nl + first + 3 * last : 0, nb = T > 1 ? 2 * nl + last : 0;
        double bf = T > 1 ? (2 * nl + first) * N * C * eb + last * 3 * N * 4 : 0;
        double bb = T > 1 ? (2 * nl + last) * N * C * eb : 0;
        CHECK(st->tp_allreduces[SP_TASK_F] == nf && near(st->tp_bytes[SP_TASK_F], bf),
              "T %d stage %d F: %d all-reduces of %g bytes, want %d of %g", T, s,
              st->tp_allreduces[SP_TASK_F], st->tp_bytes[SP_TASK_F], nf, bf);
        CHECK(st->tp_allreduces[SP_TASK_B] == nb && near(st->tp_bytes[SP_TASK_B], bb) &&
                  st->tp_allreduces[SP_TASK_BW] == nb && near(st->tp_bytes[SP_TASK_BW], bb),
              "T %d stage %d B/BW: %d of %g, want %d of %g", T, s, st->tp_allreduces[SP_TASK_B],
              st->tp_bytes[SP_TASK_B], nb, bb);
        CHECK(st->tp_allreduces[SP_TASK_W] == 0 && st->tp_bytes[SP_TASK_W] == 0,
              "T %d stage %d: W has no all-reduce", T, s);
    }
    for (int e = 0; e < m->nedges; e++)
        CHECK(m->edge[e].src_stage == e && m->edge[e].dst_stage == e + 1 &&
                  m->edge[e].needs_grad && m->edge[e].bytes == (size_t)(N * C * eb),
              "T %d edge %d: the residual stream, whole", T, e);
    sp_stage_model_free(m);
}

/* Awkward sizes: 7 blocks on 3 stages (3, 2, 2), grouped-query attention (16 heads of 8
 * in 8 KV groups), I = 344 (= 8 x 43), a vocabulary of 200 */
static void small_model(void)
{
    sp_llama_shape l = { .layers = 7, .channels = 128, .heads = 16, .kv_heads = 8,
                         .hidden = 344, .context = 24, .vocab = 200, .batch = 3,
                         .device_flops = 1e12, .elem_bytes = 2 };
    for (int T = 1; T <= 8; T *= 2) {
        l.tensor = T;
        check_stages(&l, 3);
        check_stages(&l, 1);
        check_stages(&l, 7);
    }
    /* multi-head attention, a wider batch, bf16 left as the default (elem_bytes 0) */
    sp_llama_shape mha = { .layers = 5, .channels = 96, .heads = 6, .kv_heads = 6,
                           .hidden = 258, .context = 40, .vocab = 102, .batch = 2,
                           .device_flops = 3e11, .tensor = 2 };
    check_stages(&mha, 2);
    mha.tensor = 1;
    check_stages(&mha, 4);
}

/* A multi-head Llama with I = 8 C / 3 has the GPT's 24 C^2 FLOPs per token and block, and
 * the same attention: the two models' costs agree for every kind and stage. */
static void gpt_costs(void)
{
    sp_llama_shape l = { .layers = 6, .channels = 48, .heads = 4, .kv_heads = 4, .hidden = 128,
                         .context = 32, .vocab = 96, .batch = 2, .device_flops = 1e12,
                         .elem_bytes = 2, .tensor = 2 };
    sp_gpt_shape g = { .layers = 6, .channels = 48, .context = 32, .vocab = 96, .batch = 2,
                       .device_flops = 1e12, .elem_bytes = 2, .tensor = 2 };
    sp_stage_model *a = sp_stage_model_llama(&l, 4), *b = sp_stage_model_gpt(&g, 4);
    CHECK(a && b, "models");
    for (int s = 0; a && b && s < 4; s++) {
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++)
            CHECK(near(a->stage[s].cost[k], b->stage[s].cost[k]), "stage %d %s: Llama %g, GPT %g",
                  s, sp_task_kind_name((sp_task_kind)k), a->stage[s].cost[k], b->stage[s].cost[k]);
        for (int k = 0; k < SP_NUM_TASK_KINDS; k++)
            CHECK(a->stage[s].tp_allreduces[k] == b->stage[s].tp_allreduces[k] &&
                      a->stage[s].tp_bytes[k] == b->stage[s].tp_bytes[k],
                  "stage %d %s: the group's all-reduces differ", s,
                  sp_task_kind_name((sp_task_kind)k));
    }
    sp_stage_model_free(a);
    sp_stage_model_free(b);
}

static double total_params(const sp_llama_shape *l, int S)
{
    sp_stage_model *m = sp_stage_model_llama(l, S);
    CHECK(m != NULL, "%s", sp_last_error());
    double n = 0;
    for (int s = 0; m && s < S; s++) n += m->stage[s].param_bytes / 4.0;
    sp_stage_model_free(m);
    return n;
}

static const sp_llama_shape llama2_7b = { .layers = 32, .channels = 4096, .heads = 32,
                                          .kv_heads = 32, .hidden = 11008, .context = 4096,
                                          .vocab = 32000, .batch = 1, .device_flops = 1e15,
                                          .elem_bytes = 2 };
static const sp_llama_shape llama2_70b = { .layers = 80, .channels = 8192, .heads = 64,
                                           .kv_heads = 8, .hidden = 28672, .context = 4096,
                                           .vocab = 32000, .batch = 1, .device_flops = 1e15,
                                           .elem_bytes = 2 };

static void published(void)
{
    /* Meta's model cards: 6.74e9 and 68.98e9 parameters (transformers counts 6738415616 and
     * 68976648192 for LlamaForCausalLM with these configs) */
    double n7 = total_params(&llama2_7b, 4), n70 = total_params(&llama2_70b, 8);
    CHECK(fabs(n7 / 6.74e9 - 1) < 1e-3, "Llama 2 7B: %.0f parameters, published 6.74e9", n7);
    CHECK(fabs(n70 / 68.98e9 - 1) < 1e-3, "Llama 2 70B: %.0f parameters, published 68.98e9", n70);
    CHECK(n7 == 6738415616.0, "Llama 2 7B: %.0f parameters, transformers 6738415616", n7);
    CHECK(n70 == 68976648192.0, "Llama 2 70B: %.0f parameters, transformers 68976648192", n70);
    /* at T, the ranks of a group together hold every split parameter once, the RMSNorm
     * weights (2 C per block and the final C) T times, and the embedding's and the head's
     * padding rows (32000 padded to a multiple of 128 T: 32256 at T 4, 32768 at T 8) */
    for (int T = 2; T <= 8; T *= 2) {
        sp_llama_shape l = llama2_70b;
        l.tensor = T;
        double rank = total_params(&l, 10), norms = 2.0 * 8192 * 80 + 8192;
        double pad = 2.0 * 8192 * (double)(sp_padded_vocab(32000, SP_VOCAB_PAD, T) - 32000);
        CHECK(rank * T == n70 + (T - 1) * norms + pad, "70B at T %d: %.0f per rank", T, rank);
    }

    /* 70B, 8 stages of 10 blocks, T = 8, one sequence of 4096: numbers written out.
     * A rank's block: (2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 28672) / 8 + 2 x 8192
     * = 106971136 parameters; activations 4096 x 2 x (4 x 8192 + (2 x 8192 + 2 x 1024 +
     * 3 x 28672) / 8) = 375390208 bytes; F 2 x 4096 x 855638016 + 4 x 4096 x 4096 x 8192
     * = 7559142440960 FLOPs, / 8. */
    sp_llama_shape l = llama2_70b;
    l.tensor = 8;
    sp_stage_model *m = sp_stage_model_llama(&l, 8);
    CHECK(m != NULL, "70B at T 8: %s", sp_last_error());
    if (m) {
        const sp_stage_info *s0 = &m->stage[0], *s1 = &m->stage[1], *s7 = &m->stage[7];
        CHECK(s1->param_bytes == 4278845440u, "70B stage 1 params %zu", s1->param_bytes);
        /* the embedding and the head: 32768 rows (32000 padded), 4096 per rank */
        CHECK(s0->param_bytes == 4413063168u, "70B stage 0 params %zu", s0->param_bytes);
        CHECK(s7->param_bytes == 4413095936u, "70B stage 7 params %zu", s7->param_bytes);
        CHECK(s1->act_bytes == 3753902080u, "70B stage 1 activations %zu", s1->act_bytes);
        CHECK(near(s1->cost[SP_TASK_F], 9448928051200.0 / 1e15), "70B stage 1 F %.17g s",
              s1->cost[SP_TASK_F]);
        CHECK(s1->tp_allreduces[SP_TASK_F] == 20 && s1->tp_bytes[SP_TASK_F] == 1342177280.0,
              "70B stage 1 F: %d all-reduces, %.0f bytes", s1->tp_allreduces[SP_TASK_F],
              s1->tp_bytes[SP_TASK_F]);
        CHECK(s7->tp_allreduces[SP_TASK_F] == 23 && s7->tp_bytes[SP_TASK_F] == 1342226432.0 &&
                  s7->tp_allreduces[SP_TASK_B] == 21,
              "70B stage 7: F %d all-reduces, %.0f bytes, B %d", s7->tp_allreduces[SP_TASK_F],
              s7->tp_bytes[SP_TASK_F], s7->tp_allreduces[SP_TASK_B]);
        CHECK(m->edge[0].bytes == 67108864u, "70B boundary %zu", m->edge[0].bytes);
        sp_stage_model_free(m);
    }
}

/* NULL and a message naming what is wrong, for each bad shape */
static void refused(void)
{
    struct {
        const char *what, *msg;
        sp_llama_shape l;
        int S;
    } bad[] = {
        { "an empty middle stage", "stage 1 of 3 would have 0 layers",
          { 4, 64, 8, 8, 128, 16, 100, 1, 1e12, 2, 1, (const int[]){ 2, 0, 2 } }, 3 },
        { "a cut of other layers", "add up to 2, not the model's 4 layers",
          { 4, 64, 8, 8, 128, 16, 100, 1, 1e12, 2, 1, (const int[]){ 1, 1 } }, 2 },
        { "KV heads not dividing heads", "3 KV heads do not divide 8 heads",
          { 4, 64, 8, 3, 128, 16, 100, 1, 1e12, 2, 1, NULL }, 2 },
        { "C not a multiple of H", "100 channels are not a multiple of 8 heads",
          { 4, 100, 8, 8, 128, 16, 100, 1, 1e12, 2, 1, NULL }, 2 },
        { "an odd head size", "head size 9 (72 channels / 8 heads) is odd",
          { 4, 72, 8, 8, 128, 16, 100, 1, 1e12, 2, 1, NULL }, 2 },
        { "T not dividing Hkv", "tensor 4 must divide the 2 KV heads",
          { 4, 64, 8, 2, 128, 16, 100, 1, 1e12, 2, 4, NULL }, 2 },
        { "T not dividing I", "tensor 4 must divide the 8 KV heads and the 130 hidden",
          { 4, 64, 8, 8, 130, 16, 100, 1, 1e12, 2, 4, NULL }, 2 },
        { "fewer layers than stages", "4 layers cannot be cut into 5 stages",
          { 4, 64, 8, 8, 128, 16, 100, 1, 1e12, 2, 1, NULL }, 5 },
        { "no stages", "cannot be cut into 0 stages",
          { 4, 64, 8, 8, 128, 16, 100, 1, 1e12, 2, 1, NULL }, 0 },
        { "no KV heads", "must be at least 1",
          { 4, 64, 8, 0, 128, 16, 100, 1, 1e12, 2, 1, NULL }, 2 },
        { "no batch", "must be at least 1", { 4, 64, 8, 8, 128, 16, 100, 0, 1e12, 2, 1, NULL }, 2 },
        { "no FLOP rate", "device_flops", { 4, 64, 8, 8, 128, 16, 100, 1, 0, 2, 1, NULL }, 2 },
        { "past a size_t", "past 1e18 bytes",
          { 1 << 20, 1 << 20, 8, 8, 1 << 22, 1 << 20, 100, 1 << 20, 1e12, 2, 1, NULL }, 2 },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sp_clear_error();
        sp_stage_model *m = sp_stage_model_llama(&bad[i].l, bad[i].S);
        CHECK(m == NULL, "%s accepted", bad[i].what);
        sp_stage_model_free(m);
        CHECK(strstr(sp_last_error(), bad[i].msg) && !strncmp(sp_last_error(), "Llama shape: ", 13),
              "%s: message '%s', want '%s'", bad[i].what, sp_last_error(), bad[i].msg);
    }
    CHECK(sp_stage_model_llama(NULL, 2) == NULL, "NULL shape accepted");
    /* a vocabulary T does not divide is padded (102 at T 4: 512 rows, 128 per rank) */
    sp_llama_shape odd = { 4, 64, 8, 8, 128, 16, 102, 1, 1e12, 2, 4, NULL };
    sp_stage_model *mo = sp_stage_model_llama(&odd, 2);
    CHECK(mo && sp_padded_vocab(102, SP_VOCAB_PAD, 4) == 512, "vocabulary 102 at T 4: %s",
          mo ? "" : sp_last_error());
    sp_stage_model_free(mo);
    /* the same shapes fixed are taken */
    sp_llama_shape ok = { 4, 64, 8, 2, 130, 16, 102, 1, 1e12, 2, 2, NULL };
    sp_stage_model *m = sp_stage_model_llama(&ok, 4);
    CHECK(m != NULL, "a good shape refused: %s", sp_last_error());
    sp_stage_model_free(m);
}

/* 70B at T = 8 on JaxPP's layout (docs/scaling.md): plans, checks and simulates; the step
 * is at least the busiest actor's compute and its group's all-reduces. */
static void planned(void)
{
    sp_llama_shape l = llama2_70b;
    l.tensor = 8, l.batch = 2, l.device_flops = 989e12;
    sp_schedule *sch;
    sp_plan *plan;
    sp_sim_result *r;
    MUST(sp_schedule_builtin("interleaved-1f1b", 8, 16, 5, &sch));
    sp_stage_model *m = sp_stage_model_llama(&l, sch->nstages);
    CHECK(m != NULL, "%s", sp_last_error());
    if (!m) return;
    MUST(sp_plan_build(m, sch, &plan));
    MUST(sp_plan_check(plan));
    sp_tensor_link link = { .tensor = 8, .alpha = 1e-6, .bw = 450e9 };
    MUST(sp_simulate(plan, m, &(sp_sim_config){ .tensor = &link }, &r));
    double busy = 0;
    for (int s = 0; s < sch->nstages; s += 8) /* actor 0's stages */
        busy += 16 * (m->stage[s].cost[SP_TASK_F] + m->stage[s].cost[SP_TASK_BW]);
    CHECK(r->step_time >= busy + r->tp_busy[0] && r->tp_busy[0] > 0,
          "step %g, actor 0 computes %g and all-reduces %g", r->step_time, busy, r->tp_busy[0]);
    sp_sim_result_free(r);
    sp_plan_free(plan);
    sp_stage_model_free(m);
    sp_schedule_free(sch);
}

int main(void)
{
    small_model();
    gpt_costs();
    published();
    refused();
    planned();
    return test_done("test_llama_plan");
}
