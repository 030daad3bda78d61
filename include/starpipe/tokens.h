/* Token shards: the binary layout llm.c's data scripts write, so their shards (and ours)
 * train here as they are. A shard is a 1024-byte header of 256 little-endian int32 —
 * [0] the magic 20240520, [1] the version 1, [2] the token count, the rest 0 — then that
 * many uint16 tokens, little-endian, and nothing after; or, for vocabularies past 65536
 * (llm.c's Llama 3 layout), magic 20240801, version 7 and uint32 tokens. Several shards read as one
 * stream, in the order given. Readers take only the windows a microbatch needs (pread):
 * no rank loads the data set. scripts/make-shards writes shards from a text file. */
#ifndef STARPIPE_TOKENS_H
#define STARPIPE_TOKENS_H

#include <stdint.h>

#include "starpipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SP_TOKENS_MAGIC 20240520
#define SP_TOKENS_VERSION 1
#define SP_TOKENS_MAGIC32 20240801 /* uint32 tokens */
#define SP_TOKENS_VERSION32 7
#define SP_TOKENS_HEADER_BYTES 1024
#define SP_TOKENS_MAX_SHARDS 4096

typedef struct sp_tokens sp_tokens;

/* 1 when the file at path begins with a shard header (magic and version), else 0. */
int sp_tokens_is_shard(const char *path);

/* Opens n shards as one stream. Every header is checked (magic, version, a token count
 * that the file size matches exactly, no trailing bytes): a bad shard fails with
 * SP_ERR_FORMAT naming the file and what is wrong. */
sp_status sp_tokens_open(const char *const *paths, int n, sp_tokens **out);
/* The same for a pattern: a comma-separated list of paths, each may be a glob (sorted).
 * An empty entry ("a.bin,,", ",a.bin") is refused (SP_ERR_ARG, naming the entry). */
sp_status sp_tokens_open_pattern(const char *pattern, sp_tokens **out);
void sp_tokens_close(sp_tokens *s);
int64_t sp_tokens_count(const sp_tokens *s);
int sp_tokens_shards(const sp_tokens *s);
/* Tokens [pos, pos + n) of the stream (across shard boundaries) into out. */
sp_status sp_tokens_read(sp_tokens *s, int64_t pos, int64_t n, int32_t *out);
/* The largest token in the stream (scans it once, in blocks: for a vocabulary check). */
sp_status sp_tokens_max(sp_tokens *s, int32_t *max);
/* Every token of every shard below vocab (one sequential pass at disk speed): else
 * SP_ERR_FORMAT naming the shard, the token, its position and its byte offset. */
sp_status sp_tokens_check_vocab(sp_tokens *s, int32_t vocab);

/* Writes a shard atomically (a temporary renamed over path): uint16 tokens, or uint32. */
sp_status sp_tokens_write(const char *path, const uint16_t *tokens, int64_t n);
sp_status sp_tokens_write32(const char *path, const uint32_t *tokens, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
