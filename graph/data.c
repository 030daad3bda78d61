/* Data sources: byte-level text windows and the MLP's synthetic teacher task. Both draw
 * from a counter-based generator keyed by (seed, step, microbatch, row). */
#include "starpipe/data.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/files.h"
#include "starpipe/tokens.h"

struct sp_text {
    uint8_t *bytes;     /* a text file, held whole; NULL for shards */
    sp_tokens *shards;  /* token shards, read window by window */
    size_t n;
    size_t train; /* tokens [0, train) are trained on; [train, n) are held out */
};

uint64_t sp_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t key4(uint64_t seed, uint64_t a, uint64_t b, uint64_t c)
{
    return sp_mix64(sp_mix64(sp_mix64(sp_mix64(seed) ^ a) ^ b) ^ c);
}

sp_text *sp_text_load(const char *path, int context, sp_status *status)
{
    sp_status st = SP_OK;
    sp_text *t = calloc(1, sizeof *t);
    char *bytes = NULL;
    size_t n = 0;
    if (!t) {
        st = sp_set_error(SP_ERR_NOMEM, "out of memory reading '%s'", path ? path : "(null)");
        goto out;
    }
    if (path && (strpbrk(path, "*?,") || sp_tokens_is_shard(path))) {
        /* token shards: headers checked now, windows read when a batch needs them */
        if ((st = sp_tokens_open_pattern(path, &t->shards))) goto out;
        n = (size_t)sp_tokens_count(t->shards);
    } else {
        /* a regular file, read whole, never more than the limit: a FIFO or /dev/zero is
         * refused at once rather than waited on or read forever */
        if ((st = sp_file_read(path, "data file", SP_TEXT_MAX_BYTES, &bytes, &n))) goto out;
        t->bytes = (uint8_t *)bytes;
    }
    t->n = t->train = n;
    if (context < 1 || t->n < (size_t)context + 2)
        st = sp_set_error(SP_ERR_IO, "data '%s' has %zu %s; a context of %d needs at least %d",
                          path, t->n, t->shards ? "tokens" : "bytes", context, context + 2);
out:
    if (st != SP_OK) {
        sp_text_free(t);
        t = NULL;
    }
    if (status) *status = st;
    return t;
}

void sp_text_free(sp_text *t)
{
    if (!t) return;
    free(t->bytes);
    sp_tokens_close(t->shards);
    free(t);
}

size_t sp_text_size(const sp_text *t) { return t ? t->n : 0; }
const uint8_t *sp_text_bytes(const sp_text *t) { return t ? t->bytes : NULL; }
int sp_text_shards(const sp_text *t) { return t ? sp_tokens_shards(t->shards) : 0; }

sp_status sp_text_check_vocab(const sp_text *t, int vocab)
{
    if (!t->shards) /* bytes */
        return vocab >= 256 ? SP_OK : sp_set_error(SP_ERR_FORMAT, "text is read as bytes, "
                                                   "which needs a vocabulary of 256, not %d", vocab);
    return sp_tokens_check_vocab(t->shards, vocab);
}

size_t sp_text_train_size(const sp_text *t) { return t ? t->train : 0; }

sp_status sp_text_hold_out(sp_text *t, int percent, int context)
{
    if (!t || percent < 1 || percent > 99 || context < 1)
        return sp_set_error(SP_ERR_ARG, "sp_text_hold_out: bad argument");
    size_t held = (size_t)((double)t->n * percent / 100.0);
    /* each part needs one window of context + 1 bytes */
    if (held < (size_t)context + 1 || t->n - held < (size_t)context + 1)
        return sp_set_error(SP_ERR_ARG, "evaluation holds out the last %d%% of the data "
                            "(%zu of %zu bytes), but with a context of %d each part needs at "
                            "least %d bytes: use a larger data file or a smaller --context",
                            percent, held, t->n, context, context + 1);
    t->train = t->n - held;
    return SP_OK;
}

/* The T+1 tokens at off: tokens and, shifted by one, targets. */
static void window(const sp_text *t, size_t off, int T, int32_t *tokens, int32_t *targets)
{
    if (t->shards) { /* two reads of T: no buffer of T + 1 needed */
        if (sp_tokens_read(t->shards, (int64_t)off, T, tokens) ||
            sp_tokens_read(t->shards, (int64_t)off + 1, T, targets)) {
            fprintf(stderr, "starpipe: %s\n", sp_last_error());
            for (int j = 0; j < T; j++) tokens[j] = targets[j] = -1;
        }
        return;
    }
    for (int j = 0; j < T; j++) {
        tokens[j] = t->bytes[off + j];
        targets[j] = t->bytes[off + j + 1];
    }
}

void sp_text_batch(const sp_text *t, uint64_t seed, int step, int mb, int B, int T,
                   int32_t *tokens, int32_t *targets)
{
    size_t windows = t->train - (size_t)T; /* start offsets whose T+1 bytes fit */
    for (int b = 0; b < B; b++) {
        size_t off = (size_t)(key4(seed, (uint64_t)step, (uint64_t)mb, (uint64_t)b) % windows);
        window(t, off, T, tokens + (size_t)b * T, targets + (size_t)b * T);
    }
}

void sp_text_eval_batch(const sp_text *t, int k, int K, int B, int T, int32_t *tokens,
                        int32_t *targets)
{
    /* the K x B windows spread evenly over the held-out tail's start offsets */
    size_t windows = t->n - t->train - (size_t)T, total = (size_t)K * (size_t)B;
    for (int b = 0; b < B; b++) {
        size_t w = (size_t)k * (size_t)B + (size_t)b;
        size_t off = t->train + (size_t)((double)w * (double)windows / (double)total);
        window(t, off, T, tokens + (size_t)b * T, targets + (size_t)b * T);
    }
}

static double normal01(uint64_t k)
{
    uint64_t r1 = sp_mix64(k), r2 = sp_mix64(k ^ 0x5bd1e995ULL);
    double u1 = ((r1 >> 11) + 1.0) * 0x1.0p-53, u2 = (r2 >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Rows keyed by (seed, stream, mb, b): training uses stream = step (an int >= 0), the
 * held-out rows a stream no step reaches. */
#define SP_MLP_EVAL_STREAM 0xe7a1000000000000ULL

static void mlp_rows(uint64_t seed, uint64_t stream, int mb, int B, int in_dim, int classes,
                     float *x, int32_t *y)
{
    for (int b = 0; b < B; b++) {
        uint64_t row = key4(seed, stream, (uint64_t)mb, (uint64_t)b);
        for (int j = 0; j < in_dim; j++) x[b * in_dim + j] = (float)normal01(row + (uint64_t)j);
        int best = 0;
        double best_v = -INFINITY;
        for (int c = 0; c < classes; c++) {
            double v = 0.0;
            for (int j = 0; j < in_dim; j++)
                v += x[b * in_dim + j] *
                     normal01(key4(seed, 0xfeedULL, (uint64_t)j, (uint64_t)c));
            if (v > best_v) {
                best_v = v;
                best = c;
            }
        }
        y[b] = best;
    }
}

void sp_mlp_batch(uint64_t seed, int step, int mb, int B, int in_dim, int classes, float *x,
                  int32_t *y)
{
    mlp_rows(seed, (uint64_t)step, mb, B, in_dim, classes, x, y);
}

void sp_mlp_eval_batch(uint64_t seed, int k, int B, int in_dim, int classes, float *x,
                       int32_t *y)
{
    mlp_rows(seed, SP_MLP_EVAL_STREAM, k, B, in_dim, classes, x, y);
}
