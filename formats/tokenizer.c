/* Decoding with a Hugging Face tokenizer.json (include/starpipe/tokenizer.h): each id's
 * bytes worked out once at load, so a sample decodes by table lookups. */
#include "starpipe/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KIND_BYTE_LEVEL = 1, KIND_BYTE_FALLBACK };
#define MAX_IDS (1 << 26) /* 64M ids: far past any vocabulary, short of a runaway table */

struct sp_tokenizer {
    int32_t n;          /* ids 0 .. n-1 */
    int64_t *off;       /* where id's bytes start in pool, -1 none */
    uint32_t *len;
    unsigned char *pool;
    size_t used, cap;
    json_t *added;      /* the added tokens array (for sp_tokenizer_added), or NULL */
    json_t *root;
    int strip;
};

/* GPT-2's bytes_to_unicode, inverted: code point -> byte, -1 for one that stands for none.
 * Bytes 33-126, 161-172 and 174-255 stand for themselves; the other 68, in order, for
 * 256, 257, ... */
static int byte_of_codepoint(uint32_t cp)
{
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) continue;
        if (n++ == (int)(cp - 256)) return b;
    }
    return -1;
}

/* The next code point of a NUL-terminated UTF-8 string (jansson has checked it), and
 * its length in *k. */
static uint32_t next_codepoint(const unsigned char *s, int *k)
{
    if (s[0] < 0x80) return *k = 1, s[0];
    if ((s[0] & 0xe0) == 0xc0) return *k = 2, (uint32_t)(s[0] & 0x1f) << 6 | (s[1] & 0x3f);
    if ((s[0] & 0xf0) == 0xe0)
        return *k = 3, (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    return *k = 4, (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 |
                       (uint32_t)(s[2] & 0x3f) << 6 | (s[3] & 0x3f);
}

static int put(sp_tokenizer *t, const unsigned char *b, size_t n)
{
    if (t->used + n > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1 << 16;
        while (cap < t->used + n) cap *= 2;
        unsigned char *p = realloc(t->pool, cap);
        if (!p) return -1;
        t->pool = p, t->cap = cap;
    }
    memcpy(t->pool + t->used, b, n);
    t->used += n;
    return 0;
}

/* The bytes a vocabulary entry stands for, appended to the pool; 0, or -1 out of memory,
 * or the code point (+1) a byte-level token may not hold. */
static long decode_entry(sp_tokenizer *t, int kind, const char *key)
{
    const unsigned char *s = (const unsigned char *)key;
    if (kind == KIND_BYTE_FALLBACK) {
        unsigned hi;
        char tail;
        if (strlen(key) == 6 && sscanf(key, "<0x%2X%c", &hi, &tail) == 2 && tail == '>') {
            unsigned char b = (unsigned char)hi;
            return put(t, &b, 1);
        }
        for (size_t i = 0; s[i];) {
            if (s[i] == 0xe2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) { /* U+2581 */
                if (put(t, (const unsigned char *)" ", 1)) return -1;
                i += 3;
            } else {
                if (put(t, s + i, 1)) return -1;
                i++;
            }
        }
        return 0;
    }
    for (int k; *s; s += k) {
        uint32_t cp = next_codepoint(s, &k);
        int b = byte_of_codepoint(cp);
        if (b < 0) return (long)cp + 1;
        unsigned char c = (unsigned char)b;
        if (put(t, &c, 1)) return -1;
    }
    return 0;
}

/* The decoder's kind, and whether it strips a leading space; 0 for one not read. */
static int decoder_kind(json_t *d, int *strip)
{
    const char *type = json_string_value(json_object_get(d, "type"));
    if (!type) return 0;
    if (!strcmp(type, "ByteLevel")) return KIND_BYTE_LEVEL;
    if (strcmp(type, "Sequence")) return 0;
    int kind = 0;
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(d, "decoders"), i, v) {
        const char *ty = json_string_value(json_object_get(v, "type"));
        if (!ty) continue;
        if (!strcmp(ty, "ByteLevel")) kind = KIND_BYTE_LEVEL;
        if (!strcmp(ty, "ByteFallback")) kind = KIND_BYTE_FALLBACK;
        if (!strcmp(ty, "Strip") && json_integer_value(json_object_get(v, "start")) == 1)
            *strip = 1;
    }
    return kind;
}

static sp_status fail(sp_tokenizer *t, sp_status st)
{
    sp_tokenizer_free(t);
    return st;
}

sp_status sp_tokenizer_load(const char *path, sp_tokenizer **out)
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return sp_set_error(SP_ERR_FORMAT, "tokenizer '%s': %s (line %d)", path, je.text,
                            je.line);
    sp_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return sp_set_error(SP_ERR_NOMEM, "out of memory");
    }
    t->root = root;
    if (!(t->pool = malloc(t->cap = 1 << 16))) return fail(t, sp_set_error(SP_ERR_NOMEM, "out of memory"));
    json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    json_t *vocab = json_object_get(model, "vocab");
    if (!mtype || strcmp(mtype, "BPE") || !json_is_object(vocab))
        return fail(t, sp_set_error(SP_ERR_FORMAT, "tokenizer '%s': model of type %s; only BPE "
                                    "(with a vocabulary object) is read", path,
                                    mtype ? mtype : "(none)"));
    const int kind = decoder_kind(json_object_get(root, "decoder"), &t->strip);
    if (!kind)
        return fail(t, sp_set_error(SP_ERR_FORMAT, "tokenizer '%s': its decoder is neither "
                                    "ByteLevel (GPT-2's) nor a sequence with ByteFallback "
                                    "(Llama's), the two read here", path));
    /* the ids' range first: the vocabulary and the added tokens */
    t->added = json_object_get(root, "added_tokens");
    int64_t top = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_IDS)
            return fail(t, sp_set_error(SP_ERR_FORMAT, "tokenizer '%s': token '%s' has id %s; "
                                        "ids are integers in [0, %d)", path, key,
                                        json_is_integer(v) ? "out of range" : "not an integer",
                                        MAX_IDS));
        if (json_integer_value(v) > top) top = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(t->added, i, v) {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_IDS ||
            !json_is_string(json_object_get(v, "content")))
            return fail(t, sp_set_error(SP_ERR_FORMAT, "tokenizer '%s': added token %zu has no "
                                        "id in [0, %d) or no content", path, i, MAX_IDS));
        if (json_integer_value(id) > top) top = json_integer_value(id);
    }
    if (top < 0)
        return fail(t, sp_set_error(SP_ERR_FORMAT, "tokenizer '%s': no tokens", path));
    t->n = (int32_t)(top + 1);
    t->off = malloc(sizeof *t->off * (size_t)t->n);
    t->len = calloc((size_t)t->n, sizeof *t->len);
    if (!t->off || !t->len) return fail(t, sp_set_error(SP_ERR_NOMEM, "out of memory"));
    for (int32_t k = 0; k < t->n; k++) t->off[k] = -1;
    json_object_foreach(vocab, key, v) {
        const int32_t id = (int32_t)json_integer_value(v);
        if (t->off[id] >= 0)
            return fail(t, sp_set_error(SP_ERR_FORMAT, "tokenizer '%s': id %d is given to two "
                                        "tokens", path, id));
        const size_t at = t->used;
        const long r = decode_entry(t, kind, key);
        if (r < 0) return fail(t, sp_set_error(SP_ERR_NOMEM, "out of memory"));
        if (r > 0)
            return fail(t, sp_set_error(SP_ERR_FORMAT, "tokenizer '%s': token '%s' (id %d) holds "
                                        "U+%04lX, not one of the byte-level characters", path,
                                        key, id, (unsigned long)(r - 1)));
        t->off[id] = (int64_t)at, t->len[id] = (uint32_t)(t->used - at);
    }
    json_array_foreach(t->added, i, v) { /* their content as it is, over a vocabulary entry */
        const int32_t id = (int32_t)json_integer_value(json_object_get(v, "id"));
        const char *s = json_string_value(json_object_get(v, "content"));
        const size_t at = t->used;
        if (put(t, (const unsigned char *)s, strlen(s)))
            return fail(t, sp_set_error(SP_ERR_NOMEM, "out of memory"));
        t->off[id] = (int64_t)at, t->len[id] = (uint32_t)strlen(s);
    }
    *out = t;
    return SP_OK;
}

void sp_tokenizer_free(sp_tokenizer *t)
{
    if (!t) return;
    json_decref(t->root);
    free(t->off), free(t->len), free(t->pool), free(t);
}

int32_t sp_tokenizer_size(const sp_tokenizer *t) { return t ? t->n : 0; }
int sp_tokenizer_strips_space(const sp_tokenizer *t) { return t && t->strip; }

const unsigned char *sp_tokenizer_bytes(const sp_tokenizer *t, int32_t id, size_t *len)
{
    *len = 0;
    if (!t || id < 0 || id >= t->n || t->off[id] < 0) return NULL;
    *len = t->len[id];
    return t->pool + t->off[id];
}

int32_t sp_tokenizer_added(const sp_tokenizer *t, const char *s)
{
    size_t i;
    json_t *v;
    json_array_foreach(t ? t->added : NULL, i, v)
        if (!strcmp(json_string_value(json_object_get(v, "content")), s))
            return (int32_t)json_integer_value(json_object_get(v, "id"));
    return -1;
}
