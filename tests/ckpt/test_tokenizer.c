/* Decoding with a tokenizer.json (include/starpipe/tokenizer.h), against files written
 * here: GPT-2's byte-level alphabet built the way its own code builds it (bytes_to_unicode,
 * forward) and every one of the 256 bytes read back; a few merged tokens and an added
 * one; Llama's byte fallback ("<0x0A>", U+2581 for a space, the Strip of a leading space);
 * and the refusals, each naming the file and what is wrong. With arguments TOKENIZER TEXT
 * SHARD...: the shards' tokens (Hugging Face's encoding, scripts/make-shards --bpe)
 * decode to exactly TEXT's bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "starpipe/tokenizer.h"
#include "starpipe/tokens.h"
#include "tests/check.h"

static char dir[] = "/tmp/sp-tokenizer-XXXXXX";

static const char *write_json(const char *name, const char *text)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    REQUIRE(f && fputs(text, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
    return path;
}

static int bytes_are(const sp_tokenizer *t, int32_t id, const char *want, size_t n)
{
    size_t len;
    const unsigned char *b = sp_tokenizer_bytes(t, id, &len);
    return b && len == n && !memcmp(b, want, n);
}

/* A code point as a JSON \u escape (all of GPT-2's alphabet is below U+0200). */
static void escape(char *out, unsigned cp) { sprintf(out, "\\u%04X", cp); }

static void byte_level(void)
{
    /* GPT-2's bytes_to_unicode as it is written: the printable bytes stand for themselves,
     * the others, in order, for 256, 257, ... */
    unsigned cs[256];
    int is[256] = { 0 }, n = 0;
    for (int b = 33; b <= 126; b++) is[b] = 1;
    for (int b = 161; b <= 172; b++) is[b] = 1;
    for (int b = 174; b <= 255; b++) is[b] = 1;
    for (int b = 0; b < 256; b++) cs[b] = is[b] ? (unsigned)b : 256u + (unsigned)n++;
    char *json = malloc(65536), *p = json;
    p += sprintf(p, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (int b = 0; b < 256; b++) {
        char e[8];
        escape(e, cs[b]);
        p += sprintf(p, "\"%s\": %d, ", e, b + 1); /* id b + 1, as make-shards' training */
    }
    /* merged tokens: " the" (U+0120 for the space), "\n\n", "é" as its two UTF-8 bytes */
    p += sprintf(p, "\"\\u0120the\": 300, \"\\u010A\\u010A\": 301, \"\\u00C3\\u00A9\": 302}},"
                    " \"added_tokens\": [{\"id\": 0, \"content\": \"<|endoftext|>\"}],"
                    " \"decoder\": {\"type\": \"ByteLevel\"}}");
    sp_tokenizer *t;
    REQUIRE(sp_tokenizer_load(write_json("gpt2.json", json), &t) == SP_OK, "%s", sp_last_error());
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        const char c = (char)b;
        bad += !bytes_are(t, b + 1, &c, 1);
    }
    CHECK(!bad, "%d of the 256 byte tokens decode to another byte", bad);
    CHECK(sp_tokenizer_size(t) == 303, "size %d", sp_tokenizer_size(t));
    CHECK(bytes_are(t, 300, " the", 4) && bytes_are(t, 301, "\n\n", 2) &&
              bytes_are(t, 302, "\xc3\xa9", 2), "merged tokens");
    CHECK(bytes_are(t, 0, "<|endoftext|>", 13) && sp_tokenizer_added(t, "<|endoftext|>") == 0 &&
              sp_tokenizer_added(t, "<s>") == -1, "the added token");
    size_t len;
    CHECK(!sp_tokenizer_bytes(t, 257, &len) && !sp_tokenizer_bytes(t, 303, &len) &&
              !sp_tokenizer_bytes(t, -1, &len), "ids without a token");
    CHECK(!sp_tokenizer_strips_space(t), "GPT-2's decoder strips nothing");
    sp_tokenizer_free(t);
    free(json);
}

static void byte_fallback(void)
{
    const char *json =
        "{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {\"<unk>\": 0, "
        "\"<s>\": 1, \"</s>\": 2, \"<0x0A>\": 13, \"<0xE2>\": 229, \"\\u2581the\": 278, "
        "\"\\u2581\": 29871, \"\\u00e9t\\u00e9\": 30000}}, \"added_tokens\": [{\"id\": 1, "
        "\"content\": \"<s>\"}], \"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
        "{\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u2581\"}, \"content\": \" \"}, "
        "{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", "
        "\"content\": \" \", \"start\": 1, \"stop\": 0}]}}";
    sp_tokenizer *t;
    REQUIRE(sp_tokenizer_load(write_json("llama.json", json), &t) == SP_OK, "%s",
            sp_last_error());
    CHECK(bytes_are(t, 13, "\n", 1) && bytes_are(t, 229, "\xe2", 1) &&
              bytes_are(t, 278, " the", 4) && bytes_are(t, 29871, " ", 1) &&
              bytes_are(t, 30000, "\xc3\xa9t\xc3\xa9", 5) && bytes_are(t, 1, "<s>", 3),
          "Llama's tokens");
    CHECK(sp_tokenizer_strips_space(t) && sp_tokenizer_size(t) == 30001, "strip %d, size %d",
          sp_tokenizer_strips_space(t), sp_tokenizer_size(t));
    sp_tokenizer_free(t);
}

static void refusals(void)
{
    const struct { const char *json, *msg; } bad[] = {
        { "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}, \"decoder\": {\"type\": "
          "\"ByteLevel\"}}", "model of type Unigram" },
        { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"decoder\": {\"type\": "
          "\"WordPiece\"}}", "neither ByteLevel" },
        { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}}, \"decoder\": "
          "{\"type\": \"ByteLevel\"}}", "id 0 is given to two tokens" },
        { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\\u4e2d\": 0}}, \"decoder\": "
          "{\"type\": \"ByteLevel\"}}", "U+4E2D" },
        { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}}, \"decoder\": "
          "{\"type\": \"ByteLevel\"}}", "has id out of range" },
        { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"decoder\": "
          "{\"type\": \"ByteLevel\"}", "line" }, /* truncated JSON */
        { "{\"model\": {\"type\": \"BPE\", \"vocab\": {}}, \"decoder\": "
          "{\"type\": \"ByteLevel\"}}", "no tokens" },
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        char name[32];
        snprintf(name, sizeof name, "bad%zu.json", k);
        const char *path = write_json(name, bad[k].json);
        sp_tokenizer *t = NULL;
        sp_status st = sp_tokenizer_load(path, &t);
        CHECK(st == SP_ERR_FORMAT && !t && strstr(sp_last_error(), bad[k].msg) &&
                  strstr(sp_last_error(), path), "case %zu: status %d, '%s' (want '%s')", k, st,
              st ? sp_last_error() : "", bad[k].msg);
        unlink(path);
    }
}

/* TOKENIZER TEXT SHARD...: the shards decode to TEXT's bytes. */
static void round_trip(const char *tok, const char *text, int n, char **shards)
{
    sp_tokenizer *t;
    REQUIRE(sp_tokenizer_load(tok, &t) == SP_OK, "%s", sp_last_error());
    FILE *f = fopen(text, "rb");
    REQUIRE(f, "cannot open %s", text);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    rewind(f);
    char *want = malloc((size_t)size), *got = malloc((size_t)size + 64);
    REQUIRE(want && got && fread(want, 1, (size_t)size, f) == (size_t)size, "read %s", text);
    fclose(f);
    sp_tokens *s;
    REQUIRE(sp_tokens_open((const char *const *)shards, n, &s) == SP_OK, "%s", sp_last_error());
    const int64_t nt = sp_tokens_count(s);
    int32_t *ids = malloc(sizeof *ids * (size_t)nt);
    REQUIRE(ids && sp_tokens_read(s, 0, nt, ids) == SP_OK, "%s", sp_last_error());
    size_t at = 0, missing = 0;
    for (int64_t i = 0; i < nt && at <= (size_t)size; i++) {
        size_t len;
        const unsigned char *b = sp_tokenizer_bytes(t, ids[i], &len);
        missing += !b;
        if (b && at + len <= (size_t)size + 64) memcpy(got + at, b, len);
        at += len;
    }
    CHECK(!missing && at == (size_t)size && !memcmp(got, want, (size_t)size),
          "%lld tokens decode to %zu bytes (%zu ids without a token), the text has %ld%s",
          (long long)nt, at, missing, size,
          at == (size_t)size && memcmp(got, want, (size_t)size) ? ", other bytes" : "");
    printf("%lld tokens of a %d-token vocabulary decode to the %ld bytes of %s\n", (long long)nt,
           sp_tokenizer_size(t), size, text);
    sp_tokens_close(s);
    sp_tokenizer_free(t);
    free(want), free(got), free(ids);
}

int main(int argc, char **argv)
{
    if (argc > 3) {
        round_trip(argv[1], argv[2], argc - 3, argv + 3);
        return check_summary("test_tokenizer (make-shards --bpe)");
    }
    REQUIRE(mkdtemp(dir), "mkdtemp");
    byte_level();
    byte_fallback();
    refusals();
    unlink(write_json("gpt2.json", "")), unlink(write_json("llama.json", ""));
    rmdir(dir);
    return check_summary("test_tokenizer");
}
