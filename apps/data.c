/* The model's data as a run takes it (data.h): its file checked and scanned before step 1,
 * the held-out part, the inputs of steps and evaluations, and the outputs' check. */
#include "apps/data.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "apps/outputs.h"
#include "apps/settings.h"
#include "base/files.h"
#include "starpipe/data.h"
#include "starpipe/tokenizer.h"
#include "starpipe/tokens.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

sp_status app_check_run_outputs(const sp_app_model *m, const sp_app_opts *o, const char *trace)
{
    char data[PATH_MAX];
    app_data_path(m, data, sizeof data);
    return app_check_outputs(o, trace, data[0] ? data : NULL);
}

/* The offset of the first byte that is not UTF-8 text (a NUL, or an invalid sequence), n
 * when there is none; *what says which. */
static size_t first_non_text(const unsigned char *b, size_t n, const char **what)
{
    for (size_t i = 0; i < n;) {
        size_t k = b[i] ? sp_utf8_seq(b + i, n - i) : 0;
        if (!k) {
            *what = b[i] ? "invalid UTF-8" : "a NUL byte";
            return i;
        }
        i += k;
    }
    return n;
}

sp_status app_check_data(const sp_app_model *m, const sp_app_opts *o)
{
    char path[PATH_MAX];
    app_data_path(m, path, sizeof path);
    if (!path[0]) return SP_OK; /* a model without a file */
    int fmt = o->data_format;
    const char *name = sp_app_data_format_name(fmt);
    int pattern = strpbrk(path, "*?,") != NULL, shard = !pattern && sp_tokens_is_shard(path);
    if (pattern || shard) {
        if (fmt != SP_APP_DATA_TEXT && fmt != SP_APP_DATA_RAW) return SP_OK; /* the shards' own checks */
        return sp_set_error(SP_ERR_FORMAT, "--data-format %s: '%s' is %s, read as tokens: use "
                            "--data-format shard or auto", name, path,
                            pattern ? "a list or glob of token shards" : "a token shard");
    }
    if (fmt == SP_APP_DATA_SHARD) { /* the shard reader's own words on what is wrong */
        sp_tokens *t = NULL;
        sp_status st = sp_tokens_open_pattern(path, &t);
        sp_tokens_close(t);
        return st ? sp_error_context(SP_ERR_FORMAT, "--data-format shard")
                  : sp_set_error(SP_ERR_FORMAT, "--data-format shard: not a token shard");
    }
    if (fmt == SP_APP_DATA_RAW) return SP_OK;
    char *bytes = NULL;
    size_t n = 0;
    if (sp_file_read(path, "data file", SP_TEXT_MAX_BYTES, &bytes, &n) != SP_OK) return SP_OK;
    const unsigned char *b = (const unsigned char *)bytes;
    const char *what = "";
    size_t at = first_non_text(b, n, &what);
    sp_status st = SP_OK;
    if (at < n && fmt == SP_APP_DATA_TEXT)
        st = sp_set_error(SP_ERR_FORMAT, "--data-format text: data file '%s' is not UTF-8 text "
                          "(byte %zu: %s)", path, at, what);
    else if (at < n) {
        char head[128] = "";
        if (n >= 4)
            snprintf(head, sizeof head, "; a token shard begins with the magic %d (or %d), "
                     "this file with %u", SP_TOKENS_MAGIC, SP_TOKENS_MAGIC32,
                     (unsigned)b[0] | (unsigned)b[1] << 8 | (unsigned)b[2] << 16 |
                         (unsigned)b[3] << 24);
        st = sp_set_error(SP_ERR_FORMAT, "data file '%s' is neither UTF-8 text nor a token "
                          "shard (byte %zu: %s%s): --data-format raw trains on its bytes",
                          path, at, what, head);
    }
    free(bytes);
    return st;
}

int app_scan_data(const sp_app_model *m, int verbose, char *msg, size_t len)
{
    if (!m->scan_data) return 0;
    double t0 = now(), bytes = 0;
    int bad = m->scan_data(m->cfg, &bytes, msg, len);
    double dt = now() - t0;
    if (!bad && verbose >= 1 && bytes > 0)
        printf("data: %.0f bytes of tokens checked against the vocabulary in %.2f s (%.0f MB/s)\n",
               bytes, dt, dt > 0 ? bytes / dt / 1e6 : 0.0);
    return bad;
}

int app_hold_out(sp_app_model *m, const sp_app_opts *o, char *msg, size_t len)
{
    return o->eval_every && m->hold_out ? m->hold_out(m->cfg, msg, len) : 0;
}

int app_check_sample(sp_app_model *m, const sp_app_opts *o, char *msg, size_t len)
{
    if (!o->sample || !m->build_sampler) return 0;
    sp_status st;
    sp_graph *g = m->build_sampler(m->cfg, o->tok ? sp_tokenizer_size(o->tok) : 0, &st);
    if (!g) snprintf(msg, len, "%s", sp_last_error());
    sp_graph_free(g);
    return !g;
}

/* ---- inputs ---- */

void **app_inputs_alloc(const sp_program *p, int n)
{
    int nin = sp_program_num_inputs(p);
    void **in = calloc((size_t)n * nin, sizeof *in);
    for (int i = 0; in && i < n * nin; i++)
        if (!(in[i] = malloc(sp_program_buf_bytes(p, SP_BUF_INPUT, i % nin) + 4))) return NULL;
    return in;
}

void app_inputs_free(void **in, int n, const sp_program *p)
{
    for (int i = 0; in && i < n * sp_program_num_inputs(p); i++) free(in[i]);
    free(in);
}

void app_inputs_fill(sp_app_model *m, const sp_app_opts *o, const sp_program *p, int nmb,
                     int step, const sp_fault *fault, void **in)
{
    int nin = sp_program_num_inputs(p);
    for (int i = 0; i < nmb; i++) m->batch(m->cfg, (uint64_t)o->seed, step, i, in + (size_t)i * nin);
    /* STARPIPE_FAULT=nan@STEP: a NaN in microbatch 0's first float input */
    if (fault->kind == SP_FAULT_NAN && fault->step == step)
        for (int k = 0; k < nin; k++)
            if (sp_tensor_dtype(sp_program_graph(p), sp_program_input(p, k)) == SP_F32) {
                ((float *)in[k])[0] = NAN;
                break;
            }
}

void **app_eval_inputs(sp_app_model *m, const sp_app_opts *o, const sp_program *p, int K)
{
    void **in = app_inputs_alloc(p, K);
    int nin = sp_program_num_inputs(p);
    for (int k = 0; in && k < K; k++)
        m->eval_batch(m->cfg, (uint64_t)o->seed, k, K, in + (size_t)k * nin);
    return in;
}
