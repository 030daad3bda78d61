/* starpipe-gpt: trains a small GPT-2 on a text file (bytes) or token shards, pipelined
 * over MPI ranks (mpirun -np P), or with --reference in one process. The training loop, flags and
 * checks are in driver.c; this file is the model and its data. */
#include <stdio.h>
#include <string.h>

#include "apps/driver.h"
#include "apps/parse.h"
#include "starpipe/data.h"
#include "starpipe/models.h"

typedef struct {
    const char *data;
    sp_gpt_config model;
    int stage_layers[1024], nstage_layers; /* --stage-layers, one count per stage */
    sp_text *text;
} gpt_app;

static int gpt_flag(void *cfg, const char *a, const char *v)
{
    gpt_app *c = cfg;
    if (!strcmp(a, "--data")) {
        c->data = v;
        return 1;
    }
    if (!strcmp(a, "--stage-layers"))
        return app_parse_int_list(a, v, 0, 1024, c->stage_layers, 1024, &c->nstage_layers) ? 1
                                                                                          : -1;
    const struct { const char *flag; int *dst; long hi; } ints[] = {
        { "--layers", &c->model.layers, 1024 },    { "--heads", &c->model.heads, 1024 },
        { "--channels", &c->model.channels, 65536 }, { "--context", &c->model.context, 65536 },
        { "--batch", &c->model.batch, 65536 },     { "--vocab", &c->model.vocab, 65536 },
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (!strcmp(a, ints[i].flag)) return app_parse_int(a, v, 1, ints[i].hi, ints[i].dst) ? 1 : -1;
    return -1;
}

static int gpt_prepare(void *cfg, double *samples, char *msg, size_t len)
{
    gpt_app *c = cfg;
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

static sp_graph *gpt_build(void *cfg, int stages, int tensor, int tensor_rank, sp_status *st)
{
    gpt_app *c = cfg;
    c->model.stages = stages;
    c->model.tensor = tensor;
    c->model.tensor_rank = tensor_rank;
    if (app_check_stage_layers(c->nstage_layers, stages, st)) return NULL;
    c->model.stage_layers = c->nstage_layers ? c->stage_layers : NULL;
    return sp_model_gpt(&c->model, st);
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
static sp_graph *gpt_build_sampler(void *cfg, sp_status *st)
{
    sp_gpt_config one = ((gpt_app *)cfg)->model;
    if (one.vocab != 256) { /* the sample is printed as bytes */
        *st = sp_set_error(SP_ERR_ARG, "the sample is printed as bytes: it needs a byte-level "
                           "model (--vocab 256), not %d tokens", one.vocab);
        return NULL;
    }
    one.batch = 1;
    one.stages = 1;
    one.stage_layers = NULL;
    return sp_model_gpt(&one, st);
}

static void gpt_describe(void *cfg, FILE *f)
{
    gpt_app *c = cfg;
    sp_status st;
    sp_graph *g = sp_model_gpt(&c->model, &st);
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
    fprintf(f, "GPT: %lld parameters, %d layers, %d heads, %d channels, context %d, batch %d "
            "per microbatch; data %s (%s%s)\n",
            g ? (long long)sp_graph_param_count(g) : 0LL, c->model.layers, c->model.heads,
            c->model.channels, c->model.context, c->model.batch, c->data, what, split);
    sp_graph_free(g);
}

static void gpt_signature(void *cfg, char *buf, size_t len)
{
    const sp_gpt_config *c = &((gpt_app *)cfg)->model;
    snprintf(buf, len, "gpt vocab=%d context=%d layers=%d heads=%d channels=%d", c->vocab,
             c->context, c->layers, c->heads, c->channels);
}

/* What a resume needs besides the signature: the batch and the data. */
static void gpt_settings(void *cfg, char *buf, size_t len)
{
    const gpt_app *c = cfg;
    int k = snprintf(buf, len, "--layers %d\n--heads %d\n--channels %d\n--context %d\n"
                     "--batch %d\n", c->model.layers, c->model.heads, c->model.channels,
                     c->model.context, c->model.batch);
    if (k > 0 && (size_t)k < len && !strchr(c->data, '\n')) /* one line per setting */
        snprintf(buf + k, len - (size_t)k, "--data %s\n", c->data);
}

/* The defaults and the flags this model takes (also used by fuzz/fuzz_app_args.c). */
#define GPT_APP_DEFAULTS                                                                   \
    { .data = SP_DEFAULT_CORPUS, .model = { .vocab = 256, .context = 64, .layers = 4,       \
                                            .heads = 4, .channels = 64, .batch = 4,         \
                                            .stages = 1 } }
static const char *const gpt_flags[] = { "--data", "--layers", "--heads", "--channels",
                                         "--context", "--batch", "--stage-layers", "--vocab",
                                         NULL };

int main(int argc, char **argv)
{
    gpt_app cfg = GPT_APP_DEFAULTS;
    static char defaults[1024];
    snprintf(defaults, sizeof defaults,
             "model:\n"
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
             "                      and last may be 0: embedding or head alone\n",
             SP_DEFAULT_CORPUS);
    sp_app_model m = { .name = "starpipe-gpt", .flags = gpt_flags, .defaults = defaults, .cfg = &cfg,
                       .flag = gpt_flag, .prepare = gpt_prepare, .build = gpt_build,
                       .batch = gpt_batch, .describe = gpt_describe, .sample_unit = "tok",
                       .signature = gpt_signature, .settings = gpt_settings,
                       .param_flags = "--channels or --layers",
                       .act_flags = "--batch, --context or --channels",
                       .hold_out = gpt_hold_out, .eval_batch = gpt_eval_batch,
                       .build_sampler = gpt_build_sampler };
    int rc = sp_app_main(argc, argv, &m);
    sp_text_free(cfg.text);
    return rc;
}
