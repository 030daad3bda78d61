/* hf_logits llama FILE TOKENS OUT V T L H KV C I THETA
 * hf_logits gpt FILE TOKENS OUT V T L H C
 * loads FILE (any safetensors file in Hugging Face's LlamaForCausalLM or GPT2LMHeadModel
 * layout: one transformers saved, or a starpipe checkpoint) into sp_model_llama or
 * sp_model_gpt of that config through ckpt_load_values, runs the reference interpreter's
 * forward on the B x T int32 tokens of TOKENS (raw, B = its size / 4T) and writes the
 * logits (B, T, V) as raw float32 to OUT. check_llama_hf.py and check_gpt2_hf.py drive it
 * against transformers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/checkpoint.h"
#include "starpipe/models.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"

static sp_reference *ref;

static sp_status get(void *ctx, sp_tensor p, int what, float *dst)
{
    (void)ctx, (void)what;
    const sp_graph *g = sp_program_graph(sp_reference_program(ref));
    memcpy(dst, sp_reference_param(ref, p), 4 * (size_t)sp_tensor_numel(g, p));
    return SP_OK;
}

static sp_status set(void *ctx, sp_tensor p, int what, const float *src)
{
    (void)ctx;
    return what == 0 ? sp_reference_set_param(ref, p, src) : SP_OK;
}

static int layout(const void *ctx, const sp_graph *g, sp_tensor p, ckpt_piece *pc)
{
    return ctx ? ckpt_llama_layout(ctx, g, p, pc) : ckpt_gpt_layout(g, p, pc);
}

int main(int argc, char **argv)
{
    const int llama = argc == 13 && !strcmp(argv[1], "llama");
    if (!llama && !(argc == 10 && !strcmp(argv[1], "gpt"))) {
        fprintf(stderr, "usage: hf_logits llama FILE TOKENS OUT V T L H KV C I THETA\n"
                        "       hf_logits gpt FILE TOKENS OUT V T L H C\n");
        return 2;
    }
    argv++;
    sp_llama_config c = { .vocab = atoi(argv[4]), .context = atoi(argv[5]),
                          .layers = atoi(argv[6]), .heads = atoi(argv[7]), .stages = 1 };
    if (llama)
        c.kv_heads = atoi(argv[8]), c.channels = atoi(argv[9]), c.hidden = atoi(argv[10]),
        c.rope_theta = (float)atof(argv[11]);
    else
        c.channels = atoi(argv[8]);
    FILE *f = fopen(argv[2], "rb");
    if (!f) return perror(argv[2]), 1;
    int32_t *tok = malloc(1 << 20);
    size_t n = fread(tok, 4, (1 << 20) / 4, f);
    fclose(f);
    c.batch = (int)(n / (size_t)c.context);
    if (c.batch < 1 || n % (size_t)c.context) {
        fprintf(stderr, "hf_logits: %zu tokens are not rows of %d\n", n, c.context);
        return 1;
    }
    sp_status st;
    const sp_gpt_config gc = { .vocab = c.vocab, .context = c.context, .layers = c.layers,
                               .heads = c.heads, .channels = c.channels, .batch = c.batch,
                               .stages = 1 };
    sp_graph *g = llama ? sp_model_llama(&c, &st) : sp_model_gpt(&gc, &st);
    sp_program *p = g ? sp_program_build(g, &st) : NULL;
    ref = p ? sp_reference_create(p, 1, NULL, 1, &st) : NULL;
    if (!ref) {
        fprintf(stderr, "hf_logits: %s\n", sp_last_error());
        return 1;
    }
    ckpt_io io = { .get = get, .set = set, .writer = 1, .layout = layout,
                   .layout_ctx = llama ? &c : NULL };
    if (ckpt_load_values(argv[1], g, &io) != SP_OK) {
        fprintf(stderr, "hf_logits: %s\n", sp_last_error());
        return 1;
    }
    int32_t *zeros = calloc(n, 4);
    const void *in[2] = { tok, zeros };
    if (sp_reference_eval(ref, 1, in, NULL) != SP_OK) {
        fprintf(stderr, "hf_logits: %s\n", sp_last_error());
        return 1;
    }
    const float *logits = sp_reference_value(ref, sp_graph_find(g, "logits"));
    FILE *o = fopen(argv[3], "wb");
    if (!o || fwrite(logits, 4, n * (size_t)c.vocab, o) != n * (size_t)c.vocab || fclose(o)) {
        perror(argv[3]);
        return 1;
    }
    free(tok), free(zeros);
    sp_reference_free(ref);
    sp_program_free(p);
    sp_graph_free(g);
    return 0;
}
