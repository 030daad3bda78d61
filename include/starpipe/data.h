/* Training data: a byte-level text corpus for the GPT and a synthetic teacher task for
 * the MLP. Batches are a pure function of (seed, step, microbatch), so every rank builds
 * the same microbatch without communicating, and a resumed run sees the same data. */
#ifndef STARPIPE_DATA_H
#define STARPIPE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "starpipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The corpus used when --data is not given: the GNU GPL v3 text every Debian machine
 * ships (package base-files). */
#define SP_DEFAULT_CORPUS "/usr/share/common-licenses/GPL-3"

typedef struct sp_text sp_text;

/* The largest text file read, in bytes: it is held in memory whole on every rank. */
#define SP_TEXT_MAX_BYTES ((size_t)1 << 30)

/* The training data. A text file is read as bytes (UTF-8 byte by byte: vocabulary 256),
 * a regular file of at most SP_TEXT_MAX_BYTES bytes, held in memory. Token shards
 * (starpipe/tokens.h; a path whose file starts with the shard magic, or a pattern: a
 * comma-separated list of paths or globs) are read as one stream, each window with
 * pread when a batch needs it: no rank loads the data set, whatever its size. Either must
 * hold at least context + 2 tokens. */
sp_text *sp_text_load(const char *path, int context, sp_status *status);
void sp_text_free(sp_text *t);
/* Tokens in all (bytes of a text file). */
size_t sp_text_size(const sp_text *t);
/* The bytes of a text file; NULL for token shards. */
const uint8_t *sp_text_bytes(const sp_text *t);
/* The shards' file count, 0 for a text file. */
int sp_text_shards(const sp_text *t);
/* Every token within [0, vocab): shards are read once, in order (sp_tokens_check_vocab);
 * SP_ERR_FORMAT naming the shard and the token's offset. */
sp_status sp_text_check_vocab(const sp_text *t, int vocab);

/* Microbatch `mb` of step `step`: B windows of T+1 tokens at pseudo-random offsets of the
 * training part (all of the data unless some is held out); tokens (B,T) and targets (B,T)
 * = tokens shifted by one. The offsets are a function of (seed, step, mb, row) only, so a
 * resumed run reads what the uninterrupted run would have, and with replicas (global
 * microbatch numbers) each replica reads its own windows. A shard read that fails leaves
 * -1 tokens, which the program's input check refuses with a message. */
void sp_text_batch(const sp_text *t, uint64_t seed, int step, int mb, int B, int T,
                   int32_t *tokens, int32_t *targets);

/* Evaluation data: holds out the last `percent` percent of the bytes (floor), which
 * sp_text_batch then never reads; each part must hold a window of T+1 bytes (else
 * SP_ERR_ARG with a message). Nothing is held out unless this is called, so runs without
 * evaluation train on the whole file, as before. */
sp_status sp_text_hold_out(sp_text *t, int percent, int context);
/* Bytes trained on: [0, size) of the file (all of it when nothing is held out). */
size_t sp_text_train_size(const sp_text *t);
/* Held-out microbatch k of K: B windows of T+1 bytes at offsets spread evenly over the
 * held-out tail (window k B + b of the K B), the same whatever the seed, so evaluations
 * of different runs compare. */
void sp_text_eval_batch(const sp_text *t, int k, int K, int B, int T, int32_t *tokens,
                        int32_t *targets);

/* The MLP task: x (B,in) ~ N(0,1), y = argmax of x W* (a fixed random teacher W* of
 * (in, classes) drawn from seed). */
void sp_mlp_batch(uint64_t seed, int step, int mb, int B, int in_dim, int classes, float *x,
                  int32_t *y);
/* Held-out microbatch k of the same task: rows from a stream of the generator that no
 * training step draws from. */
void sp_mlp_eval_batch(uint64_t seed, int k, int B, int in_dim, int classes, float *x,
                       int32_t *y);

/* splitmix64 mix of a 64-bit key: the counter-based generator behind both. */
uint64_t sp_mix64(uint64_t x);

#ifdef __cplusplus
}
#endif
#endif
