/* The models at tensor parallelism T (starpipe/models.h): the GPT (heads 4 at T = 2, 4;
 * heads 6 at T = 2, 3; vocabulary 256 at T = 2, 4; wte and the tied head split by the
 * vocabulary, the vocab-parallel cross-entropy), the Llama (4 heads sharing 2 KV heads at
 * T = 2; 6 heads, 6 KV heads at T = 2, 3: qkv split by KV groups, gate and up by columns,
 * the untied head by the vocabulary) and the MLP (even depth, and an odd one
 * whose first pair straddles the stage boundary, at T = 2, 3), each on 1 and 2 stages,
 * run as a group of T references in threads (tp_group.h) against the same model at T = 1:
 *   - the loss and every gradient (split ones assembled with sp_param_part_to_whole)
 *     within float32 rounding of T = 1's;
 *   - every member's loss the same bits; a whole parameter's gradient the same bits on
 *     every member; the same bits on a second run;
 *   - after 3 AdamW steps with clipping active, the parameters of T = 1 within tolerance;
 *   - each edge buffer sp_program_edge_replicated says every member holds alike (what
 *     scatter-gather sends 1/T of) has the same bytes on every member, and the MLP cut
 *     inside a pair is said not to (its members' values there differ);
 *   - the GPT's logits named "logits" (B,T,V) at T = 1, "logits.slice" (B,T,V/T) above;
 *   - a T not dividing the heads, the vocabulary or the width, or a rank outside the
 *     group, refused with one message naming the model, the size and T. */
#include <math.h>
#include <string.h>

#include "starpipe/models.h"
#include "tests/graph/tp_group.h"

enum { M = 2 };

typedef struct {
    const char *what;
    int gpt; /* 1: the GPT, 2: the Llama, 0: the MLP */
    sp_gpt_config g;
    sp_llama_config l;
    sp_mlp_config m;
    void *bufs[2 * M];
    const void *inputs[2 * M];
} model;

static sp_graph *build(int T, int rank, const void *ctx)
{
    const model *md = ctx;
    sp_status st;
    sp_graph *g;
    if (md->gpt == 2) {
        sp_llama_config c = md->l;
        c.stages = md->g.stages;
        c.tensor = T, c.tensor_rank = rank;
        g = sp_model_llama(&c, &st);
    } else if (md->gpt) {
        sp_gpt_config c = md->g;
        c.tensor = T, c.tensor_rank = rank;
        g = sp_model_gpt(&c, &st);
    } else {
        sp_mlp_config c = md->m;
        c.tensor = T, c.tensor_rank = rank;
        g = sp_model_mlp(&c, &st);
    }
    REQUIRE(g, "%s T=%d rank %d: %s", md->what, T, rank, sp_last_error());
    int S = md->gpt ? md->g.stages : md->m.stages;
    REQUIRE(sp_graph_num_stages(g) == S, "%s: %d stages", md->what, sp_graph_num_stages(g));
    return g;
}

/* Microbatch i's inputs: tokens and targets, or x and y. */
static void make_inputs(model *md)
{
    for (int i = 0; i < M; i++) {
        if (md->gpt) {
            const int vocab = md->gpt == 2 ? md->l.vocab : md->g.vocab;
            int n = md->gpt == 2 ? md->l.batch * md->l.context : md->g.batch * md->g.context;
            int32_t *tok = malloc(4 * (size_t)n), *tgt = malloc(4 * (size_t)n);
            REQUIRE(tok && tgt, "out of memory");
            for (int k = 0; k < n; k++) {
                tok[k] = (int32_t)((7 * k + 3 * i + 1) % vocab);
                tgt[k] = (int32_t)((5 * k + 11 * i + 2) % vocab);
            }
            md->bufs[2 * i] = tok, md->bufs[2 * i + 1] = tgt;
        } else {
            int n = md->m.batch * md->m.in_dim;
            float *x = malloc(4 * (size_t)n);
            int32_t *y = malloc(4 * (size_t)md->m.batch);
            REQUIRE(x && y, "out of memory");
            for (int k = 0; k < n; k++) x[k] = (float)sin(0.7 * (i * n + k) + 0.3);
            for (int b = 0; b < md->m.batch; b++) y[b] = (i * 3 + b * 2) % md->m.classes;
            md->bufs[2 * i] = x, md->bufs[2 * i + 1] = y;
        }
        md->inputs[2 * i] = md->bufs[2 * i], md->inputs[2 * i + 1] = md->bufs[2 * i + 1];
    }
}

static tp_run run_of(const model *md, int steps)
{
    tp_run run = { .microbatches = M, .steps = steps, .inputs = md->inputs, .seed = 5 };
    sp_adamw_defaults(&run.opt);
    run.opt.lr = 1e-2f;
    run.opt.grad_clip = 0.1f; /* below the norms here: every step clips */
    return run;
}

/* Largest |a - b| over the tensor, against b's largest magnitude. */
static double rel_err(const float *a, const float *b, int64_t n)
{
    double d = 0, mag = 0;
    for (int64_t j = 0; j < n; j++) {
        double e = fabs((double)a[j] - b[j]);
        if (!(e <= d)) d = e; /* NaN counts */
        if (fabs(b[j]) > mag) mag = fabs(b[j]);
    }
    return d / (mag > 0 ? mag : 1);
}

/* What the edges' replication bits (sp_program_edge_replicated) met: buffers said alike
 * and found so, and, of those said not alike, how many differed between members. */
static int edges_alike, edges_split, edges_split_differ, models_all_alike;

/* Each edge buffer sp_program_edge_replicated says every member holds alike (values: bit
 * 0, gradients: bit 1) has the same bytes on every member after a forward-backward: the
 * rule scatter-gather sends 1/T of it by. */
static void check_edges(const tp_group *G, const char *what)
{
    const sp_program *p0 = G->m[0].p;
    int all = 1;
    for (int e = 0; e < sp_program_stage_model(p0)->nedges; e++) {
        int bits = sp_program_edge_replicated(p0, e);
        REQUIRE(bits >= 0, "%s: edge %d: %s", what, e, sp_last_error());
        for (int r = 1; r < G->T; r++)
            CHECK(sp_program_edge_replicated(G->m[r].p, e) == bits, "%s: edge %d's bits differ "
                  "between members 0 and %d", what, e, r);
        all &= bits == 3;
        for (int k = 0; k < 2; k++) {
            sp_buf_class c = k ? SP_BUF_EDGE_GRAD : SP_BUF_EDGE_FWD;
            size_t n = sp_program_buf_bytes(p0, c, e);
            int same = 1;
            for (int r = 1; r < G->T; r++)
                same &= !memcmp(sp_reference_slab(G->m[r].r, c, e),
                                sp_reference_slab(G->m[0].r, c, e), n);
            if (bits >> k & 1) {
                CHECK(same, "%s: edge %d's %s said alike on every member, but they differ",
                      what, e, k ? "gradients" : "values");
                edges_alike++;
            } else {
                edges_split++;
                edges_split_differ += !same;
            }
        }
    }
    models_all_alike += all;
}

static double worst_grad, worst_param; /* reported: the margins of the tolerances below */
static char worst_at[64];

static void check_model(model *md, int T)
{
    char what[96];
    snprintf(what, sizeof what, "%s T=%d", md->what, T);
    tp_group one, G, again;
    tp_run fb = run_of(md, 0);
    tp_run_group(&one, 1, build, md, &fb);
    tp_run_group(&G, T, build, md, &fb);
    tp_run_group(&again, T, build, md, &fb);

    check_edges(&G, what);
    float l1 = one.m[0].loss, l = G.m[0].loss;
    CHECK(fabs(l - l1) <= 1e-5 * (1 + fabs(l1)), "%s: loss %.9g, T=1 %.9g", what, l, l1);
    for (int r = 0; r < T; r++) {
        CHECK(!memcmp(&G.m[r].loss, &G.m[0].loss, 4), "%s: member %d's loss %.9g, member 0's "
              "%.9g", what, r, G.m[r].loss, G.m[0].loss);
        CHECK(!memcmp(&again.m[r].loss, &G.m[r].loss, 4), "%s: member %d's loss %.9g, then "
              "%.9g", what, r, G.m[r].loss, again.m[r].loss);
    }
    const sp_graph *g1 = one.m[0].g; /* parameter names, in T = 1's order */
    int nsplit = 0;
    for (int i = 0; i < sp_graph_num_params(g1); i++) {
        const char *name = sp_tensor_name(g1, sp_graph_param(g1, i));
        int64_t n = tp_whole_numel(&G, name);
        CHECK(n == tp_whole_numel(&one, name), "%s: %s's whole size", what, name);
        float *g = tp_whole(&G, name, 1), *ref = tp_whole(&one, name, 1);
        double e = rel_err(g, ref, n);
        if (e > worst_grad) worst_grad = e;
        CHECK(e <= 2e-5, "%s: d%s off T=1's by %.3g of its largest element", what, name, e);
        free(g), free(ref);
        for (int r = 0; r < T; r++) { /* the same bits every run; whole ones on every member */
            sp_tensor t = sp_graph_find(G.m[r].g, name);
            size_t bytes = 4 * (size_t)sp_tensor_numel(G.m[r].g, t);
            int split = sp_param_split_dim(G.m[r].g, t) >= 0;
            nsplit += split && r == 0;
            CHECK(!memcmp(sp_reference_grad(G.m[r].r, t),
                          sp_reference_grad(again.m[r].r, sp_graph_find(again.m[r].g, name)),
                          bytes), "%s: member %d's d%s differs between two runs", what, r, name);
            if (!split)
                CHECK(!memcmp(sp_reference_grad(G.m[r].r, t),
                              sp_reference_grad(G.m[0].r, sp_graph_find(G.m[0].g, name)), bytes),
                      "%s: d%s (whole) differs between members 0 and %d", what, name, r);
        }
    }
    CHECK(nsplit > 0, "%s: no parameter is split", what);
    tp_free_group(&one), tp_free_group(&G), tp_free_group(&again);

    /* optimizer steps with clipping */
    tp_run steps = run_of(md, 3);
    tp_run_group(&one, 1, build, md, &steps);
    tp_run_group(&G, T, build, md, &steps);
    double n1 = sp_reference_grad_norm(one.m[0].r), nT = sp_reference_grad_norm(G.m[0].r);
    CHECK(n1 > steps.opt.grad_clip, "%s: norm %.3g does not clip at %.3g", what, n1,
          steps.opt.grad_clip);
    CHECK(fabs(nT - n1) <= 1e-5 * n1, "%s: gradient norm %.9g, T=1 %.9g", what, nT, n1);
    for (int r = 1; r < T; r++)
        CHECK(sp_reference_grad_norm(G.m[r].r) == nT, "%s: member %d's norm %.9g, member 0's "
              "%.9g", what, r, sp_reference_grad_norm(G.m[r].r), nT);
    g1 = one.m[0].g;
    for (int i = 0; i < sp_graph_num_params(g1); i++) {
        const char *name = sp_tensor_name(g1, sp_graph_param(g1, i));
        int64_t n = tp_whole_numel(&G, name);
        float *p = tp_whole(&G, name, 0), *ref = tp_whole(&one, name, 0);
        double e = 0;
        for (int64_t j = 0; j < n; j++) {
            double d = fabs((double)p[j] - ref[j]) / (1 + fabs(ref[j]));
            if (!(d <= e)) e = d;
        }
        if (e > worst_param) worst_param = e, snprintf(worst_at, sizeof worst_at, "%s", name);
        CHECK(e <= 2e-5, "%s: %s after 3 steps off T=1's by %.3g", what, name, e);
        free(p), free(ref);
        for (int r = 1; r < T; r++) {
            sp_tensor t = sp_graph_find(G.m[r].g, name), t0 = sp_graph_find(G.m[0].g, name);
            if (sp_param_split_dim(G.m[r].g, t) < 0)
                CHECK(!memcmp(sp_reference_param(G.m[r].r, t), sp_reference_param(G.m[0].r, t0),
                              4 * (size_t)sp_tensor_numel(G.m[r].g, t)),
                      "%s: %s (whole) differs between members 0 and %d after 3 steps", what,
                      name, r);
        }
    }
    tp_free_group(&one), tp_free_group(&G);
}

static void refused(const char *what, sp_graph *g, const sp_status *status, const char *msg)
{
    sp_status st = *status; /* read after the build, which is an argument */
    CHECK(!g && st == SP_ERR_ARG && strstr(sp_last_error(), msg), "%s: %s (status %d, wanted "
          "'%s')", what, g ? "built" : sp_last_error(), st, msg);
    sp_graph_free(g);
}

int main(void)
{
    static const int straddle[2] = { 1, 2 }; /* the MLP's pair (0, 1) across the boundary */
    model models[] = {
        { .what = "gpt heads 4", .gpt = 1, .g = { .vocab = 36, .context = 7, .layers = 2,
                                                  .heads = 4, .channels = 20, .batch = 2 } },
        { .what = "gpt heads 6", .gpt = 1, .g = { .vocab = 30, .context = 5, .layers = 3,
                                                  .heads = 6, .channels = 18, .batch = 2 } },
        { .what = "gpt vocab 256", .gpt = 1, .g = { .vocab = 256, .context = 6, .layers = 2,
                                                    .heads = 4, .channels = 16, .batch = 2 } },
        { .what = "llama heads 4, 2 KV", .gpt = 2,
          .l = { .vocab = 34, .context = 7, .layers = 2, .heads = 4, .kv_heads = 2,
                 .channels = 16, .hidden = 12, .batch = 2 } },
        { .what = "llama heads 6, 6 KV", .gpt = 2,
          .l = { .vocab = 30, .context = 5, .layers = 3, .heads = 6, .kv_heads = 6,
                 .channels = 24, .hidden = 18, .batch = 2, .rope_theta = 500.0f } },
        { .what = "mlp depth 4", .m = { .in_dim = 10, .width = 12, .depth = 4, .classes = 5,
                                        .batch = 6 } },
        { .what = "mlp depth 3", .m = { .in_dim = 9, .width = 12, .depth = 3, .classes = 4,
                                        .batch = 5 } },
    };
    static const int Ts[][2] = { { 2, 4 }, { 2, 3 }, { 2, 4 }, { 2, 2 }, { 2, 3 }, { 2, 3 },
                                 { 2, 3 } };
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        model *md = &models[k];
        make_inputs(md);
        const char *base = md->what;
        for (int S = 1; S <= 2; S++) {
            char what[64];
            snprintf(what, sizeof what, "%s, %d stage%s", base, S, S > 1 ? "s" : "");
            md->what = what;
            md->g.stages = md->m.stages = S;
            md->m.stage_layers = S == 2 && md->m.depth == 3 ? straddle : NULL;
            for (int i = 0; i < 2; i++) check_model(md, Ts[k][i]);
        }
        md->what = base;
        for (int i = 0; i < 2 * M; i++) free(md->bufs[i]);
    }
    /* every edge alike in 26 of the 28 groups: the 14 of one stage (no edge), the GPT's
     * and the Llama's (5 models x 2 T) and the even MLP's (2 T) at 2 stages; not in the
     * MLP cut inside a pair, whose members' values there differ */
    printf("edges: %d buffers alike on every member as said; %d said not alike, of which %d "
           "differed\n", edges_alike, edges_split, edges_split_differ);
    CHECK(edges_alike > 0 && edges_split > 0 && edges_split_differ > 0,
          "the replication rule was not exercised both ways");
    CHECK(models_all_alike == 26, "%d groups had every edge alike, not 26", models_all_alike);
    printf("largest gradient error %.3g (of the tensor's largest element), parameter error "
           "%.3g (%s)\n", worst_grad, worst_param, worst_at);

    /* refusals: one message naming the model, the size and T */
    sp_status st;
    sp_gpt_config gc = models[0].g;
    gc.stages = 1, gc.tensor = 3;
    refused("gpt T=3 of 4 heads", sp_model_gpt(&gc, &st), &st,
            "sp_model_gpt: tensor parallelism of 3 does not divide the 4 heads");
    gc.tensor = 2, gc.tensor_rank = 2;
    refused("gpt rank 2 of 2", sp_model_gpt(&gc, &st), &st, "sp_model_gpt: tensor rank 2 of a "
            "tensor parallelism of 2");
    gc.tensor = -1, gc.tensor_rank = 0;
    refused("gpt T=-1", sp_model_gpt(&gc, &st), &st, "sp_model_gpt: tensor rank 0 of a tensor "
            "parallelism of -1");
    for (int T = 1; T <= 2; T++) { /* the logits' names: the whole rows, or the slice */
        gc = models[2].g;
        gc.stages = 1, gc.tensor = T, gc.tensor_rank = T - 1;
        sp_graph *g = sp_model_gpt(&gc, &st);
        REQUIRE(g, "%s", sp_last_error());
        sp_tensor whole = sp_graph_find(g, "logits"), slice = sp_graph_find(g, "logits.slice");
        sp_tensor t = T == 1 ? whole : slice;
        CHECK(t >= 0 && (T == 1 ? slice : whole) < 0 && sp_tensor_ndim(g, t) == 3 &&
                  sp_tensor_shape(g, t)[2] == gc.vocab / T,
              "T=%d: the logits are named '%s' with %lld columns", T,
              T == 1 ? "logits" : "logits.slice",
              t >= 0 ? (long long)sp_tensor_shape(g, t)[2] : -1LL);
        sp_graph_free(g);
    }
    gc = models[2].g; /* vocab 256 */
    gc.stages = 1, gc.tensor = 3, gc.heads = 6, gc.channels = 18;
    refused("gpt T=3 of vocab 256", sp_model_gpt(&gc, &st), &st,
            "sp_model_gpt: tensor parallelism of 3 does not divide the vocabulary of 256");
    sp_mlp_config mc = models[5].m;
    mc.stages = 1, mc.stage_layers = NULL, mc.tensor = 5;
    refused("mlp T=5 of width 12", sp_model_mlp(&mc, &st), &st,
            "sp_model_mlp: tensor parallelism of 5 does not divide the width 12");
    sp_llama_config lc = models[3].l;
    lc.stages = 1, lc.tensor = 4;
    refused("llama T=4 of 2 KV heads", sp_model_llama(&lc, &st), &st,
            "sp_model_llama: tensor parallelism of 4 does not divide the 2 KV heads");
    lc.tensor = 1, lc.kv_heads = 3;
    refused("llama 3 KV of 4 heads", sp_model_llama(&lc, &st), &st,
            "sp_model_llama: 3 KV heads do not divide 4 heads");
    lc.kv_heads = 2, lc.channels = 12; /* head size 3 */
    refused("llama head size 3", sp_model_llama(&lc, &st), &st,
            "sp_model_llama: the head size 3 (12 channels / 4 heads) must be even");
    lc.channels = 16, lc.tensor = 2, lc.hidden = 13;
    refused("llama T=2 of hidden 13", sp_model_llama(&lc, &st), &st,
            "sp_model_llama: tensor parallelism of 2 does not divide the hidden size 13");
    lc.hidden = 12, lc.vocab = 33;
    refused("llama T=2 of vocab 33", sp_model_llama(&lc, &st), &st,
            "sp_model_llama: tensor parallelism of 2 does not divide the vocabulary of 33");
    mc.tensor = 3, mc.tensor_rank = 3;
    refused("mlp rank 3 of 3", sp_model_mlp(&mc, &st), &st, "sp_model_mlp: tensor rank 3 of a "
            "tensor parallelism of 3");
    return check_summary("test_tp_models");
}
