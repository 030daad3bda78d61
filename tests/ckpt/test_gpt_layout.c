/* The GPT's checkpoints in Hugging Face's GPT2LMHeadModel names (ckpt_gpt_layout), on a
 * small sp_model_gpt whose parameters live in a store: a checkpoint holds every parameter
 * under its transformers name (transformer.h.0.attn.c_attn.weight, ...) and the head,
 * tied to wte, again as lm_head.weight, and loads back to the same values; a checkpoint of
 * starpipe's own names (files written before the layout) still loads, as do --init files
 * without "transformer." (transformers' older files); a file whose lm_head.weight is not
 * its wte is refused naming both, and nothing is set. check_gpt2_hf.py compares logits
 * with transformers itself where torch is installed. */
#include "apps/checkpoint.h"
#include "ck.h"
#include "param_store.h"
#include "starpipe/models.h"

static sp_gpt_config cfg = { .vocab = 16, .context = 4, .layers = 2, .heads = 2,
                             .channels = 8, .batch = 1, .stages = 1 };
static int layout(const void *ctx, const sp_graph *gr, sp_tensor p, ckpt_piece *pc)
{
    (void)ctx;
    return ckpt_gpt_layout(gr, p, pc);
}
static ckpt_io io = { .get = get, .set = set, .writer = 1, .layout = layout };

/* value k of what w of parameter i: distinct everywhere, or a marker */
static float value(int i, int w, int64_t k) { return (float)(1000 * i + 100 * w) + 0.25f * (float)k; }
static void fill(int marker)
{
    for (int i = 0; i < sp_graph_num_params(g); i++)
        for (int w = 0; w < 4; w++)
            for (int64_t k = 0; k < sp_param_whole_numel(g, sp_graph_param(g, i)); k++)
                store[i][w][k] = marker ? -7.0f : value(i, w, k);
    nsets = 0;
}
/* how many values (kinds whats[0..n)) differ from fill(0)'s */
static int64_t wrong(const int *whats, int n)
{
    int64_t bad = 0;
    for (int i = 0; i < sp_graph_num_params(g); i++)
        for (int w = 0; w < n; w++)
            for (int64_t k = 0; k < sp_param_whole_numel(g, sp_graph_param(g, i)); k++)
                bad += store[i][whats[w]][k] != value(i, whats[w], k);
    return bad;
}

/* A values-only file of the GPT under names prefix + its transformers name (or its graph
 * name when prefix is NULL), with lm_head.weight = wte + lm_shift when lm_shift >= 0. */
static void write_values(const char *path, const char *prefix, float lm_shift)
{
    const int np = sp_graph_num_params(g);
    sp_st_tensor t[64];
    char names[64][96];
    float *lm = NULL;
    int n = 0;
    for (int i = 0; i < np; i++, n++) {
        sp_tensor p = sp_graph_param(g, i);
        ckpt_piece pc;
        REQUIRE(ckpt_gpt_layout(g, p, &pc) == 1, "no layout for '%s'", sp_tensor_name(g, p));
        snprintf(names[n], sizeof names[n], "%s%s", prefix ? prefix : "",
                 prefix ? pc.alt[0] : sp_tensor_name(g, p));
        t[n] = (sp_st_tensor){ .name = names[n], .dtype = SP_ST_F32, .ndim = pc.ndim,
                               .shape = sp_param_full_shape(g, p), .data = store[i][0] };
        if (lm_shift >= 0 && !strcmp(sp_tensor_name(g, p), "wte")) {
            const int64_t m = sp_param_whole_numel(g, p);
            lm = malloc(4 * (size_t)m);
            for (int64_t k = 0; k < m; k++) lm[k] = store[i][0][k] + (k == m - 1 ? lm_shift : 0);
            t[np] = t[n];
            t[np].name = "lm_head.weight", t[np].data = lm;
        }
    }
    REQUIRE(sp_safetensors_write(path, t, n + (lm != NULL), NULL, 0, 0) == SP_OK, "%s",
            sp_last_error());
    free(lm);
}

int main(void)
{
    sp_status st;
    g = sp_model_gpt(&cfg, &st);
    REQUIRE(g, "%s", sp_last_error());
    REQUIRE(sp_graph_num_params(g) <= 64, "too many parameters");
    for (int i = 0; i < sp_graph_num_params(g); i++)
        for (int w = 0; w < 4; w++)
            REQUIRE((store[i][w] = malloc(4 * (size_t)sp_param_whole_numel(g, sp_graph_param(g, i)))),
                    "out of memory");
    ck_tmpdir("gpt_layout");
    static const int all[3] = { 0, 2, 3 }, vals[1] = { 0 };

    /* 1. the layout's names, lm_head.weight beside wte, and back */
    fill(0);
    REQUIRE(ckpt_save(ck_at("hf.st"), g, "gpt sig", NULL, 5, &io) == SP_OK, "%s", sp_last_error());
    sp_safetensors *f = sp_safetensors_open(ck_at("hf.st"), 0, &st);
    REQUIRE(f, "%s", sp_last_error());
    const char *want[] = { "transformer.wte.weight", "transformer.wpe.weight",
                           "transformer.h.1.ln_1.weight", "transformer.h.0.attn.c_attn.weight",
                           "transformer.h.0.attn.c_attn.bias", "transformer.h.1.attn.c_proj.weight",
                           "transformer.h.0.ln_2.bias", "transformer.h.1.mlp.c_fc.weight",
                           "transformer.h.0.mlp.c_proj.bias", "transformer.ln_f.weight",
                           "transformer.h.1.mlp.c_fc.weight.adam_m", "lm_head.weight" };
    for (size_t k = 0; k < sizeof want / sizeof *want; k++)
        CHECK(sp_safetensors_find(f, want[k]), "no tensor '%s' in the checkpoint", want[k]);
    const sp_st_tensor *ca = sp_safetensors_find(f, "transformer.h.0.attn.c_attn.weight");
    CHECK(ca && ca->ndim == 2 && ca->shape[0] == 8 && ca->shape[1] == 24,
          "c_attn.weight is Conv1D's (in, out) = (8, 24)");
    const sp_st_tensor *lm = sp_safetensors_find(f, "lm_head.weight"),
                       *wte = sp_safetensors_find(f, "transformer.wte.weight");
    CHECK(lm && wte && !memcmp(lm->data, wte->data, 4 * 16 * 8), "lm_head.weight is wte");
    CHECK(!sp_safetensors_find(f, "lm_head.weight.adam_m") && !sp_safetensors_find(f, "h0.attn.w"),
          "only the values under the tied name, nothing under the graph's names");
    CHECK(sp_safetensors_count(f) == 3 * sp_graph_num_params(g) + 1, "%d tensors",
          sp_safetensors_count(f));
    sp_safetensors_close(f);
    fill(1);
    int step = 0;
    CHECK(ckpt_load(ck_at("hf.st"), g, "gpt sig", &step, &io) == SP_OK && step == 5 &&
              wrong(all, 3) == 0, "the layout's checkpoint loads back: %s",
          sp_last_error());

    /* 2. a checkpoint of the graph's names (before the layout) loads */
    fill(0);
    ckpt_io plain = io;
    plain.layout = NULL;
    REQUIRE(ckpt_save(ck_at("old.st"), g, "gpt sig", NULL, 3, &plain) == SP_OK, "%s", sp_last_error());
    fill(1);
    CHECK(ckpt_load(ck_at("old.st"), g, "gpt sig", &step, &io) == SP_OK && wrong(all, 3) == 0,
          "a checkpoint of starpipe's own names loads: %s", sp_last_error());

    /* 3. --init: transformers' names without the prefix, with and without the tied name */
    fill(0);
    write_values(ck_at("hub.st"), "", -1);
    write_values(ck_at("hub_lm.st"), "", 0.0f);
    write_values(ck_at("full_lm.st"), "transformer.", 0.0f);
    const char *good[] = { "hub.st", "hub_lm.st", "full_lm.st" };
    for (int k = 0; k < 3; k++) {
        fill(0); /* the values the file holds, then the marker over them */
        for (int i = 0; i < sp_graph_num_params(g); i++)
            for (int64_t e = 0; e < sp_param_whole_numel(g, sp_graph_param(g, i)); e++)
                store[i][0][e] = -7.0f;
        CHECK(ckpt_load_values(ck_at(good[k]), g, &io) == SP_OK && wrong(vals, 1) == 0,
              "--init %s: %s", good[k], sp_last_error());
    }

    /* 4. lm_head.weight that is not wte: refused, naming both, nothing set */
    fill(0);
    write_values(ck_at("untied.st"), "transformer.", 0.5f);
    fill(1);
    st = ckpt_load_values(ck_at("untied.st"), g, &io);
    CHECK(st == SP_ERR_FORMAT && strstr(sp_last_error(), "'lm_head.weight' is not "
                                                         "'transformer.wte.weight'") && !nsets,
          "an untied head: status %d, '%s', %d parameters set", st, sp_last_error(), nsets);

    for (int i = 0; i < sp_graph_num_params(g); i++)
        for (int w = 0; w < 4; w++) free(store[i][w]);
    sp_graph_free(g);
    return ck_summary("test_gpt_layout");
}
