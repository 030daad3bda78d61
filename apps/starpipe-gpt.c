/* starpipe-gpt: trains a small byte-level GPT on a text file.
 * --reference runs the single-process reference interpreter (the ground truth). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "apps/gpt_common.h"
#include "starpipe/data.h"
#include "starpipe/models.h"
#include "starpipe/program.h"
#include "starpipe/reference.h"

typedef struct {
    const char *data;
    sp_gpt_config model;
    int microbatches;
    int steps;
    float lr;
    int seed;
    int reference;
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: starpipe-gpt [options]\n"
            "  --data FILE         UTF-8 text, read as bytes (default %s)\n"
            "  --layers N          transformer blocks (4)\n"
            "  --heads N           attention heads (4)\n"
            "  --channels N        model width, divisible by heads (64)\n"
            "  --context N         sequence length T (64)\n"
            "  --batch N           sequences per microbatch (4)\n"
            "  --microbatches N    microbatches per step, m (4)\n"
            "  --steps N           optimizer steps (50)\n"
            "  --lr X              AdamW learning rate (1e-3)\n"
            "  --seed N            initialisation and data seed (1337)\n"
            "  --reference         run the single-process reference interpreter\n"
            "  --help              this text\n",
            SP_DEFAULT_CORPUS);
}

/* Returns 1 to run, 0 to exit successfully (help), -1 on a bad command line. */
static int parse(int argc, char **argv, options *o)
{
    *o = (options){ .data = SP_DEFAULT_CORPUS,
                    .model = { .vocab = 256, .context = 64, .layers = 4, .heads = 4,
                               .channels = 64, .batch = 4, .stages = 1 },
                    .microbatches = 4, .steps = 50, .lr = 1e-3f, .seed = 1337, .reference = 1 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1, takes = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--reference")) {
            o->reference = 1;
            takes = 0;
        } else if (!v && !strncmp(a, "--", 2)) {
            fprintf(stderr, "error: %s needs a value (see --help)\n", a);
            return -1;
        } else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--layers")) ok = app_parse_int(a, v, 1, 1024, &o->model.layers);
        else if (!strcmp(a, "--heads")) ok = app_parse_int(a, v, 1, 1024, &o->model.heads);
        else if (!strcmp(a, "--channels")) ok = app_parse_int(a, v, 1, 65536, &o->model.channels);
        else if (!strcmp(a, "--context")) ok = app_parse_int(a, v, 1, 65536, &o->model.context);
        else if (!strcmp(a, "--batch")) ok = app_parse_int(a, v, 1, 65536, &o->model.batch);
        else if (!strcmp(a, "--microbatches"))
            ok = app_parse_int(a, v, 1, 1 << 20, &o->microbatches);
        else if (!strcmp(a, "--steps")) ok = app_parse_int(a, v, 0, 1 << 30, &o->steps);
        else if (!strcmp(a, "--lr")) ok = app_parse_float(a, v, 0.0, 10.0, &o->lr);
        else if (!strcmp(a, "--seed")) ok = app_parse_int(a, v, 0, INT_MAX, &o->seed);
        else {
            fprintf(stderr, "error: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        if (!ok) return -1;
        i += takes;
    }
    if (o->model.channels % o->model.heads) {
        fprintf(stderr, "error: --heads %d does not divide --channels %d\n", o->model.heads,
                o->model.channels);
        return -1;
    }
    return 1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char **argv)
{
    options o;
    int r = parse(argc, argv, &o);
    if (r <= 0) return r == 0 ? 0 : 2;

    sp_status st;
    sp_text *text = sp_text_load(o.data, o.model.context, &st);
    if (!text) {
        fprintf(stderr, "error: %s\n", sp_last_error());
        return 1;
    }
    sp_graph *g = sp_model_gpt(&o.model, &st);
    sp_program *prog = g ? sp_program_build(g, &st) : NULL;
    sp_adamw_config opt;
    sp_adamw_defaults(&opt);
    opt.lr = o.lr;
    sp_reference *ref = prog ? sp_reference_create(prog, o.microbatches, &opt, (uint64_t)o.seed,
                                                   &st)
                             : NULL;
    if (!ref) {
        fprintf(stderr, "error: %s\n", sp_last_error());
        return 1;
    }

    const int B = o.model.batch, T = o.model.context, m = o.microbatches;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)m * B * T * 2);
    const void **inputs = malloc(sizeof(void *) * (size_t)m * 2);
    if (!tok || !inputs) {
        fprintf(stderr, "error: out of memory\n");
        return 1;
    }
    printf("starpipe-gpt: reference interpreter, %lld parameters, %d layers, %d heads, "
           "%d channels, context %d, batch %d x %d microbatches, data %s (%zu bytes)\n",
           (long long)sp_graph_param_count(g), o.model.layers, o.model.heads, o.model.channels,
           T, B, m, o.data, sp_text_size(text));
    fflush(stdout);
    double t_start = now(), first = 0, last = 0;
    for (int step = 1; step <= o.steps; step++) {
        for (int i = 0; i < m; i++) {
            int32_t *x = tok + (size_t)i * 2 * B * T, *y = x + (size_t)B * T;
            sp_text_batch(text, (uint64_t)o.seed, step, i, B, T, x, y);
            inputs[2 * i] = x;
            inputs[2 * i + 1] = y;
        }
        double t0 = now();
        float loss;
        if (sp_reference_step(ref, inputs, &loss) != SP_OK) {
            fprintf(stderr, "error: step %d: %s\n", step, sp_last_error());
            return 1;
        }
        double dt = now() - t0;
        if (step == 1) first = loss;
        last = loss;
        printf("step %d loss %.6f  %.0f tok/s  %.1f ms\n", step, loss, (double)B * T * m / dt,
               1e3 * dt);
        fflush(stdout);
    }
    printf("done: %d steps in %.1f s, loss %.6f -> %.6f\n", o.steps, now() - t_start, first,
           last);
    free(tok);
    free(inputs);
    sp_reference_free(ref);
    sp_program_free(prog);
    sp_graph_free(g);
    sp_text_free(text);
    return 0;
}
