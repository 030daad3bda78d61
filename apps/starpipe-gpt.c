/* starpipe-gpt and starpipe-llama: train a small GPT-2 or Llama (--arch) on a text file
 * (bytes) or token shards, pipelined over MPI ranks (mpirun -np P), or with --reference
 * in one process. The training loop, flags and checks are in the driver (driver.h); this
 * file is the two models and their data. Built twice: starpipe-llama is this file with
 * STARPIPE_APP_LLAMA, Llama its default architecture. */
#include <stdio.h>
#include <string.h>

#include "apps/driver.h"
#include "apps/parse.h"
#include "starpipe/data.h"
#include "starpipe/models.h"
#include "starpipe/stages.h"

typedef struct {
    const char *data;
    int llama;           /* --arch llama: sp_model_llama, else sp_model_gpt */
    int kv_heads, hidden; /* the Llama's (0: heads, and Llama's 8C/3 rule) */
    float rope_theta;
    sp_gpt_config model; /* the sizes both share */
    int stage_layers[1024], nstage_layers; /* --stage-layers, one count per stage */
    int cut[1026], ncut; /* the driver's balanced cut (apps/cut.c), for ncut stages */
    sp_text *text;
    unsigned given; /* the shape flags given so far (GIVEN_*): a --model leaves them */
} gpt_app;

enum { GIVEN_ARCH = 1, GIVEN_LAYERS = 2, GIVEN_HEADS = 4, GIVEN_CHANNELS = 8, GIVEN_CONTEXT = 16,
       GIVEN_VOCAB = 32, GIVEN_KV_HEADS = 64, GIVEN_HIDDEN = 128, GIVEN_ROPE = 256 };

/* --model NAME: a preset's shape (starpipe/models.h), for every size no flag gave, before
 * or after it: flags override a preset's entries whatever their order. */
static int apply_preset(gpt_app *c, const char *name)
{
    const sp_model_preset *p = sp_model_preset_find(name);
    if (!p) {
        char names[256];
        fprintf(stderr, "error: --model %s: not a model this knows (%s)\n", name,
                sp_model_preset_names(names, sizeof names));
        return -1;
    }
    if ((c->given & GIVEN_ARCH) && c->llama != p->llama) {
        fprintf(stderr, "error: --model %s is a %s, but --arch says %s\n", name,
                p->llama ? "llama" : "gpt", c->llama ? "llama" : "gpt");
        return -1;
    }
    c->llama = p->llama;
    const struct { unsigned bit; int *dst; int v; } f[] = {
        { GIVEN_LAYERS, &c->model.layers, p->layers }, { GIVEN_HEADS, &c->model.heads, p->heads },
        { GIVEN_CHANNELS, &c->model.channels, p->channels },
        { GIVEN_CONTEXT, &c->model.context, p->context }, { GIVEN_VOCAB, &c->model.vocab, p->vocab },
        { GIVEN_KV_HEADS, &c->kv_heads, p->llama ? p->kv_heads : 0 },
        { GIVEN_HIDDEN, &c->hidden, p->llama ? p->hidden : 0 } };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!(c->given & f[i].bit)) *f[i].dst = f[i].v;
    if (!(c->given & GIVEN_ROPE)) c->rope_theta = p->llama ? p->rope_theta : 0;
    return 1;
}

static int gpt_flag(void *cfg, const char *a, const char *v)
{
    gpt_app *c = cfg;
    if (!strcmp(a, "--data")) {
        c->data = v;
        return 1;
    }
    if (!strcmp(a, "--model")) return apply_preset(c, v);
    if (!strcmp(a, "--arch")) {
        if (strcmp(v, "gpt") && strcmp(v, "llama")) {
            fprintf(stderr, "error: --arch expects gpt or llama, got '%s'\n", v);
            return -1;
        }
        c->llama = !strcmp(v, "llama");
        c->given |= GIVEN_ARCH;
        return 1;
    }
    if (!strcmp(a, "--rope-theta")) {
        c->given |= GIVEN_ROPE;
        return app_parse_float(a, v, 1.0001, 1e30, &c->rope_theta) ? 1 : -1;
    }
    if (!strcmp(a, "--stage-layers"))
        return app_parse_int_list(a, v, 0, 1024, c->stage_layers, 1024, &c->nstage_layers) ? 1
                                                                                          : -1;
    const struct { const char *flag; int *dst; long hi; unsigned bit; } ints[] = {
        { "--layers", &c->model.layers, 1024, GIVEN_LAYERS },
        { "--heads", &c->model.heads, 1024, GIVEN_HEADS },
        { "--channels", &c->model.channels, 65536, GIVEN_CHANNELS },
        { "--context", &c->model.context, 65536, GIVEN_CONTEXT },
        { "--batch", &c->model.batch, 65536, 0 },
        { "--vocab", &c->model.vocab, 65536, GIVEN_VOCAB },
        { "--kv-heads", &c->kv_heads, 1024, GIVEN_KV_HEADS },
        { "--hidden", &c->hidden, 1 << 20, GIVEN_HIDDEN },
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (!strcmp(a, ints[i].flag)) {
            c->given |= ints[i].bit;
            return app_parse_int(a, v, 1, ints[i].hi, ints[i].dst) ? 1 : -1;
        }
    return -1;
}

/* The Llama of the flags and the sizes m: Llama's MLP width rule (8C/3, to a multiple of
 * 32) and multi-head attention unless --hidden and --kv-heads say otherwise. */
static sp_llama_config llama_of(const gpt_app *c, const sp_gpt_config *m)
{
    int hidden = c->hidden ? c->hidden : (8 * m->channels / 3 + 31) / 32 * 32;
    return (sp_llama_config){ .vocab = m->vocab, .context = m->context, .layers = m->layers,
                              .heads = m->heads, .kv_heads = c->kv_heads ? c->kv_heads
                                                                         : m->heads,
                              .channels = m->channels, .hidden = hidden,
                              .rope_theta = c->rope_theta, .batch = m->batch,
                              .stages = m->stages, .stage_layers = m->stage_layers,
                              .tensor = m->tensor, .tensor_rank = m->tensor_rank,
                              .vocab_pad = m->vocab_pad };
}

static sp_graph *build_model(const gpt_app *c, const sp_gpt_config *m, sp_status *st)
{
    if (!c->llama) return sp_model_gpt(m, st);
    sp_llama_config l = llama_of(c, m);
    return sp_model_llama(&l, st);
}

static int gpt_prepare(void *cfg, double *samples, char *msg, size_t len)
{
    gpt_app *c = cfg;
    if (!c->llama && (c->kv_heads || c->hidden || c->rope_theta)) {
        snprintf(msg, len, "--kv-heads, --hidden and --rope-theta are the Llama's (--arch "
                 "llama)");
        return 1;
    }
    if (c->llama) { /* the model's own checks, with its message */
        sp_status st;
        sp_graph *g = build_model(c, &c->model, &st);
        sp_graph_free(g);
        if (!g) {
            snprintf(msg, len, "%s", sp_last_error());
            return 1;
        }
    }
    if (c->model.channels % c->model.heads) {
        snprintf(msg, len, "--heads %d does not divide --channels %d", c->model.heads,
                 c->model.channels);
        return 1;
    }
    sp_status st;
    if (!c->text && !(c->text = sp_text_load(c->data, c->model.context, &st))) {
        snprintf(msg, len, "%s", sp_last_error());
        return 1;
    }
    if (!sp_text_shards(c->text) && c->model.vocab < 256) {
        snprintf(msg, len, "--vocab %d: a text file is read as bytes, which needs 256",
                 c->model.vocab);
        return 1;
    }
    *samples = (double)c->model.batch * c->model.context;
    return 0;
}

static int gpt_scan_data(void *cfg, double *bytes, char *msg, size_t len)
{
    gpt_app *c = cfg;
    *bytes = sp_text_shards(c->text) ? 2.0 * sp_text_size(c->text) : 0;
    if (sp_text_check_vocab(c->text, c->model.vocab) == SP_OK) return 0;
    snprintf(msg, len, "%s (--vocab %d)", sp_last_error(), c->model.vocab);
    return 1;
}

static sp_graph *gpt_build(void *cfg, int stages, int tensor, int tensor_rank, sp_status *st)
{
    gpt_app *c = cfg;
    c->model.stages = stages;
    c->model.tensor = tensor;
    c->model.tensor_rank = tensor_rank;
    if (app_check_stage_layers(c->nstage_layers, stages, st)) return NULL;
    c->model.stage_layers = c->nstage_layers ? c->stage_layers
                          : c->ncut == stages ? c->cut : NULL;
    return build_model(c, &c->model, st);
}

static int gpt_cut_layers(void *cfg)
{
    const gpt_app *c = cfg;
    return c->nstage_layers ? 0 : c->model.layers;
}

static void gpt_set_cut(void *cfg, const int *stage_layers, int stages)
{
    gpt_app *c = cfg;
    c->ncut = 0;
    if (!stage_layers || stages < 1 || stages > (int)(sizeof c->cut / sizeof *c->cut)) return;
    memcpy(c->cut, stage_layers, (size_t)stages * sizeof *c->cut);
    c->ncut = stages;
}

static void gpt_batch(void *cfg, uint64_t seed, int step, int mb, void *const *in)
{
    gpt_app *c = cfg;
    sp_text_batch(c->text, seed, step, mb, c->model.batch, c->model.context,
                  in[0], in[1]);
}

/* Evaluation reads the last SP_EVAL_PERCENT of the file, which training then never
 * reads. Held out only when evaluation is asked for: runs without it train on the whole
 * file, with the batches they always had. */
#define SP_EVAL_PERCENT 10

static int gpt_hold_out(void *cfg, char *msg, size_t len)
{
    gpt_app *c = cfg;
    if (sp_text_hold_out(c->text, SP_EVAL_PERCENT, c->model.context) == SP_OK) return 0;
    snprintf(msg, len, "--eval-every: %s", sp_last_error());
    return 1;
}

static void gpt_eval_batch(void *cfg, uint64_t seed, int k, int K, void *const *in)
{
    (void)seed; /* the same held-out windows whatever the seed: evaluations compare */
    gpt_app *c = cfg;
    sp_text_eval_batch(c->text, k, K, c->model.batch, c->model.context, in[0], in[1]);
}

/* One sequence, one stage: the model sp_generate runs token by token. */
static sp_graph *gpt_build_sampler(void *cfg, int ntokens, sp_status *st)
{
    sp_gpt_config one = ((gpt_app *)cfg)->model;
    if (!ntokens && one.vocab != 256) { /* the sample is printed as bytes */
        *st = sp_set_error(SP_ERR_ARG, "--sample: without --tokenizer the sample is printed "
                           "as bytes, which needs a byte-level model (--vocab 256), not %d "
                           "tokens", one.vocab);
        return NULL;
    }
    if (ntokens > one.vocab) {
        *st = sp_set_error(SP_ERR_ARG, "--tokenizer: its %d tokens do not fit the model's "
                           "vocabulary of %d (--vocab)", ntokens, one.vocab);
        return NULL;
    }
    one.batch = 1;
    one.stages = 1;
    one.stage_layers = NULL;
    one.tensor = 1, one.tensor_rank = 0;
    return build_model(cfg, &one, st);
}

static int gpt_vocab(void *cfg) { return ((gpt_app *)cfg)->model.vocab; }

static void gpt_describe(void *cfg, FILE *f)
{
    gpt_app *c = cfg;
    sp_status st;
    sp_graph *g = build_model(c, &c->model, &st);
    size_t n = sp_text_size(c->text), held = n - sp_text_train_size(c->text);
    char split[96] = "";
    if (held)
        snprintf(split, sizeof split, "; the last %zu held out for evaluation", held);
    char what[64];
    int shards = sp_text_shards(c->text);
    if (shards)
        snprintf(what, sizeof what, "%zu tokens in %d shard%s, vocabulary %d", n, shards,
                 shards > 1 ? "s" : "", c->model.vocab);
    else
        snprintf(what, sizeof what, "%zu bytes", n);
    char heads[96];
    if (c->llama) {
        sp_llama_config l = llama_of(c, &c->model);
        snprintf(heads, sizeof heads, "%d heads (%d KV), %d channels, MLP %d", l.heads,
                 l.kv_heads, l.channels, l.hidden);
    } else {
        snprintf(heads, sizeof heads, "%d heads, %d channels", c->model.heads,
                 c->model.channels);
    }
    /* a padded vocabulary (models.h vocab_pad): its rows count, and are said */
    char pad[64] = "";
    const sp_tensor emb = g ? sp_graph_find(g, c->llama ? "model.embed_tokens.weight" : "wte") : -1;
    if (emb >= 0 && sp_param_valid_rows(g, emb) < sp_param_full_shape(g, emb)[0])
        snprintf(pad, sizeof pad, " (vocabulary %d padded to %lld)", c->model.vocab,
                 (long long)sp_param_full_shape(g, emb)[0]);
    fprintf(f, "%s: %lld parameters%s, %d layers, %s, context %d, batch %d per microbatch; "
            "data %s (%s%s)\n", c->llama ? "Llama" : "GPT",
            g ? (long long)sp_graph_param_count(g) : 0LL, pad, c->model.layers, heads,
            c->model.context, c->model.batch, c->data, what, split);
    sp_graph_free(g);
}

static void gpt_signature(void *cfg, char *buf, size_t len)
{
    const gpt_app *a = cfg;
    const sp_gpt_config *c = &a->model;
    if (a->llama) {
        sp_llama_config l = llama_of(a, &a->model);
        snprintf(buf, len, "llama vocab=%d context=%d layers=%d heads=%d kv_heads=%d "
                 "channels=%d hidden=%d rope_theta=%.9g", l.vocab, l.context, l.layers, l.heads,
                 l.kv_heads, l.channels, l.hidden, l.rope_theta ? l.rope_theta : 10000.0);
        return;
    }
    snprintf(buf, len, "gpt vocab=%d context=%d layers=%d heads=%d channels=%d", c->vocab,
             c->context, c->layers, c->heads, c->channels);
}

/* What a resume needs besides the signature: the model (--arch, so that either app
 * resumes either model's files), the batch and the data. */
static void gpt_settings(void *cfg, char *buf, size_t len)
{
    const gpt_app *c = cfg;
    int k = snprintf(buf, len, "--arch %s\n--layers %d\n--heads %d\n--channels %d\n"
                     "--context %d\n--batch %d\n", c->llama ? "llama" : "gpt",
                     c->model.layers, c->model.heads, c->model.channels, c->model.context,
                     c->model.batch);
    if (c->llama && k > 0 && (size_t)k < len) {
        sp_llama_config l = llama_of(c, &c->model);
        k += snprintf(buf + k, len - (size_t)k, "--kv-heads %d\n--hidden %d\n"
                      "--rope-theta %.9g\n", l.kv_heads, l.hidden,
                      l.rope_theta ? l.rope_theta : 10000.0);
    }
    if (k > 0 && (size_t)k < len && !strchr(c->data, '\n')) /* one line per setting */
        snprintf(buf + k, len - (size_t)k, "--data %s\n", c->data);
}

/* Checkpoints in Hugging Face's names: LlamaForCausalLM's, or GPT2LMHeadModel's. */
static int hf_layout(const void *cfg, const sp_graph *g, sp_tensor p, ckpt_piece *pc)
{
    const gpt_app *c = cfg;
    if (!c->llama) return ckpt_gpt_layout(g, p, pc);
    const sp_llama_config l = llama_of(c, &c->model);
    return ckpt_llama_layout(&l, g, p, pc);
}

/* The defaults and the flags this model takes (also used by fuzz/fuzz_app_args.c). */
#ifdef STARPIPE_APP_LLAMA
#define GPT_APP_LLAMA 1
#define GPT_APP_NAME "starpipe-llama"
#else
#define GPT_APP_LLAMA 0
#define GPT_APP_NAME "starpipe-gpt"
#endif
#define GPT_APP_DEFAULTS                                                                   \
    { .data = SP_DEFAULT_CORPUS, .llama = GPT_APP_LLAMA,                                   \
      .model = { .vocab = 256, .context = 64, .layers = 4, .heads = 4, .channels = 64,      \
                 .batch = 4, .stages = 1, .vocab_pad = SP_VOCAB_PAD } }
static const char *const gpt_flags[] = { "--data", "--model", "--layers", "--heads", "--channels",
                                         "--context", "--batch", "--stage-layers", "--vocab",
                                         "--arch", "--kv-heads", "--hidden", "--rope-theta",
                                         NULL };
/* what gpt_settings stores (the --arch of files written before it stored one: gpt) */
static const char *const gpt_settings_flags[] = { "--arch", "--layers", "--heads", "--channels",
                                                  "--context", "--batch", "--kv-heads",
                                                  "--hidden", "--rope-theta", "--data", NULL };

int main(int argc, char **argv)
{
    gpt_app cfg = GPT_APP_DEFAULTS;
    static char defaults[2048];
    snprintf(defaults, sizeof defaults,
             "model:\n"
             "  --arch A            gpt (GPT-2: LayerNorm, GELU, learned positions, tied\n"
             "                      head; checkpoints in Hugging Face's GPT2LMHeadModel\n"
             "                      names) or llama (RMSNorm, rotary embeddings, SwiGLU,\n"
             "                      grouped-query attention, untied head; checkpoints in\n"
             "                      Hugging Face's LlamaForCausalLM names) (%s)\n"
             "  --model NAME        a known shape: gpt-small, gpt2, gpt2-medium, gpt2-large,\n"
             "                      gpt2-xl, gpt3-175b, llama-small, llama2-7b, llama2-13b,\n"
             "                      llama2-70b (its architecture, sizes and vocabulary;\n"
             "                      the flags below override its entries)\n"
             "  --data FILE         UTF-8 text, read as bytes (%s); or token shards\n"
             "                      (llm.c's layout, scripts/make-shards): a shard, or a\n"
             "                      comma-separated list of paths or quoted globs\n"
             "  --vocab V           vocabulary size (256: bytes; 50257 for GPT-2 tokens)\n"
             "  --layers N          transformer blocks (4)\n"
             "  --heads N           attention heads (4)\n"
             "  --channels N        model width, divisible by heads (64)\n"
             "  --context N         sequence length T (64)\n"
             "  --batch N           sequences per microbatch (4)\n"
             "  --stage-layers L    blocks per stage, e.g. 0,3,3,2 (even split); the first\n"
             "                      and last may be 0: embedding or head alone\n"
             "  --kv-heads N        llama: KV heads, dividing --heads (as many as heads)\n"
             "  --hidden N          llama: the MLP's width (8 channels / 3, to a multiple of\n"
             "                      32)\n"
             "  --rope-theta X      llama: the rotary embeddings' base (10000)\n",
             GPT_APP_LLAMA ? "llama" : "gpt", SP_DEFAULT_CORPUS);
    sp_app_model m = { .name = GPT_APP_NAME, .flags = gpt_flags, .defaults = defaults, .cfg = &cfg,
                       .flag = gpt_flag, .prepare = gpt_prepare, .scan_data = gpt_scan_data, .build = gpt_build,
                       .cut_layers = gpt_cut_layers, .set_cut = gpt_set_cut,
                       .batch = gpt_batch, .describe = gpt_describe, .sample_unit = "tok",
                       .signature = gpt_signature, .settings = gpt_settings,
                       .settings_flags = gpt_settings_flags, .kind_flag = "--arch",
                       .kind_unstored = "gpt",
                       .param_flags = "--channels or --layers",
                       .act_flags = "--batch, --context or --channels",
                       .hold_out = gpt_hold_out, .eval_batch = gpt_eval_batch,
                       .build_sampler = gpt_build_sampler, .vocab = gpt_vocab, .ckpt_layout = hf_layout };
    int rc = sp_app_main(argc, argv, &m);
    sp_text_free(cfg.text);
    return rc;
}
