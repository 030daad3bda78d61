/* A subword tokenizer's decoding side, from a Hugging Face tokenizer.json: token ids to
 * the bytes they stand for, so that a model trained on subword shards prints its samples
 * as text. Two kinds are read, the two the families here use: byte-level BPE (GPT-2's:
 * decoder "ByteLevel", each byte a printable code point of GPT-2's bytes_to_unicode
 * table) and SentencePiece-style BPE with byte fallback (Llama 2's: "\u2581" for a space,
 * "<0xNN>" for a raw byte). Added tokens (<|endoftext|>, <s>) decode to their content.
 * Encoding is scripts/make-shards' (Hugging Face's tokenizers). */
#ifndef STARPIPE_TOKENIZER_H
#define STARPIPE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "starpipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sp_tokenizer sp_tokenizer;

/* Reads and checks the whole file: a model of type BPE with a vocabulary of distinct ids
 * >= 0, a decoder of one of the two kinds, every token decodable; else SP_ERR_FORMAT (or
 * SP_ERR_IO) naming the file and what is wrong. */
sp_status sp_tokenizer_load(const char *path, sp_tokenizer **out);
void sp_tokenizer_free(sp_tokenizer *t);
/* The largest id plus one: a model's vocabulary must be at least this. */
int32_t sp_tokenizer_size(const sp_tokenizer *t);
/* The bytes of token id (*len of them), or NULL where the id has no token. */
const unsigned char *sp_tokenizer_bytes(const sp_tokenizer *t, int32_t id, size_t *len);
/* The id of the added token whose content is s (e.g. "<|endoftext|>"), else -1. */
int32_t sp_tokenizer_added(const sp_tokenizer *t, const char *s);
/* Whether the decoder drops one leading space of the text (SentencePiece's "Strip"). */
int sp_tokenizer_strips_space(const sp_tokenizer *t);

#ifdef __cplusplus
}
#endif
#endif
