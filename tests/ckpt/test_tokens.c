/* Token shards (include/starpipe/tokens.h): written and read back as one stream across
 * shard boundaries, opened by list and by glob, the largest token; uint32 shards (llm.c's
 * wide layout) beside uint16 ones in one stream, a wide token past the vocabulary named;
 * and refused, naming the file, when the magic, the version or the size is wrong. With arguments TEXT SHARD...,
 * checks that shards from scripts/make-shards hold TEXT's bytes in order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "starpipe/tokens.h"
#include "tests/check.h"

static void from_text(const char *text, int n, char **paths)
{
    FILE *f = fopen(text, "rb");
    REQUIRE(f, "cannot open %s", text);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    unsigned char *bytes = malloc((size_t)size);
    REQUIRE(bytes && fread(bytes, 1, (size_t)size, f) == (size_t)size, "cannot read %s", text);
    fclose(f);
    sp_tokens *s;
    REQUIRE(sp_tokens_open((const char *const *)paths, n, &s) == SP_OK, "%s", sp_last_error());
    CHECK(sp_tokens_count(s) == size, "%lld tokens, the text has %ld bytes",
          (long long)sp_tokens_count(s), size);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)size);
    REQUIRE(t && sp_tokens_read(s, 0, size, t) == SP_OK, "%s", sp_last_error());
    long bad = 0;
    for (long i = 0; i < size; i++) bad += t[i] != bytes[i];
    CHECK(bad == 0, "%ld tokens differ from the text's bytes", bad);
    sp_tokens_close(s);
    free(t), free(bytes);
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(p, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

int main(int argc, char **argv)
{
    if (argc > 2) {
        from_text(argv[1], argc - 2, argv + 2);
        return check_summary("test_tokens (make-shards)");
    }
    char dir[] = "/tmp/sp-tokens-XXXXXX";
    REQUIRE(mkdtemp(dir), "mkdtemp");
    enum { A = 1000, B = 1, C = 4097 };
    const int sizes[3] = { A, B, C };
    uint16_t *all = malloc(sizeof(uint16_t) * (A + B + C));
    for (int i = 0; i < A + B + C; i++) all[i] = (uint16_t)((i * 2654435761u) >> 16);
    char paths[3][64];
    for (int k = 0, at = 0; k < 3; at += sizes[k++]) {
        snprintf(paths[k], sizeof paths[k], "%s/d_%06d.bin", dir, k);
        REQUIRE(sp_tokens_write(paths[k], all + at, sizes[k]) == SP_OK, "%s", sp_last_error());
        CHECK(sp_tokens_is_shard(paths[k]), "%s not seen as a shard", paths[k]);
    }
    char pattern[128];
    snprintf(pattern, sizeof pattern, "%s/d_*.bin", dir);
    sp_tokens *s;
    REQUIRE(sp_tokens_open_pattern(pattern, &s) == SP_OK, "%s", sp_last_error());
    CHECK(sp_tokens_shards(s) == 3 && sp_tokens_count(s) == A + B + C, "%d shards, %lld tokens",
          sp_tokens_shards(s), (long long)sp_tokens_count(s));
    int32_t *got = malloc(sizeof(int32_t) * (A + B + C));
    /* windows across each boundary, and the whole stream */
    const int64_t win[][2] = { { 0, A + B + C }, { A - 3, 5 }, { A, 1 }, { A - 1, 3 },
                               { A + B + C - 7, 7 }, { 17, 0 } };
    for (size_t w = 0; w < sizeof win / sizeof *win; w++) {
        REQUIRE(sp_tokens_read(s, win[w][0], win[w][1], got) == SP_OK, "%s", sp_last_error());
        int bad = 0;
        for (int64_t i = 0; i < win[w][1]; i++) bad += got[i] != all[win[w][0] + i];
        CHECK(!bad, "window [%lld, +%lld): %d tokens differ", (long long)win[w][0],
              (long long)win[w][1], bad);
    }
    CHECK(sp_tokens_read(s, A + B + C - 1, 2, got) == SP_ERR_ARG, "a read past the end accepted");
    int32_t mx, want = 0;
    for (int i = 0; i < A + B + C; i++) want = all[i] > want ? all[i] : want;
    CHECK(sp_tokens_max(s, &mx) == SP_OK && mx == want, "max %d, want %d", mx, want);
    sp_tokens_close(s);
    /* a list, in the order given */
    char list[256];
    snprintf(list, sizeof list, "%s,%s", paths[2], paths[0]);
    REQUIRE(sp_tokens_open_pattern(list, &s) == SP_OK, "%s", sp_last_error());
    REQUIRE(sp_tokens_read(s, C, 1, got) == SP_OK, "%s", sp_last_error());
    CHECK(got[0] == all[0], "a list is read in its order");
    sp_tokens_close(s);
    /* a uint32 shard between two uint16 ones: tokens past 65535, read across both kinds */
    enum { W = 3000 };
    uint32_t *wide = malloc(sizeof(uint32_t) * W);
    for (int i = 0; i < W; i++) wide[i] = (uint32_t)(i * 2654435761u) % 128256u; /* Llama 3's */
    char wpath[96];
    snprintf(wpath, sizeof wpath, "%s/wide.bin", dir);
    REQUIRE(sp_tokens_write32(wpath, wide, W) == SP_OK, "%s", sp_last_error());
    CHECK(sp_tokens_is_shard(wpath), "a uint32 shard not seen as a shard");
    snprintf(list, sizeof list, "%s,%s,%s", paths[1], wpath, paths[0]);
    REQUIRE(sp_tokens_open_pattern(list, &s) == SP_OK, "%s", sp_last_error());
    CHECK(sp_tokens_count(s) == B + W + A, "%lld tokens", (long long)sp_tokens_count(s));
    int32_t *mixed = malloc(sizeof(int32_t) * (B + W + A));
    REQUIRE(sp_tokens_read(s, 0, B + W + A, mixed) == SP_OK, "%s", sp_last_error());
    int wbad = mixed[0] != all[A];
    for (int i = 0; i < W; i++) wbad += mixed[B + i] != (int32_t)wide[i];
    for (int i = 0; i < A; i++) wbad += mixed[B + W + i] != all[i];
    CHECK(!wbad, "%d tokens of the mixed stream differ", wbad);
    int32_t wmax = 0;
    for (int i = 0; i < W; i++) wmax = (int32_t)wide[i] > wmax ? (int32_t)wide[i] : wmax;
    CHECK(sp_tokens_max(s, &mx) == SP_OK && mx == wmax && wmax > 65535, "max %d, want %d", mx,
          wmax);
    CHECK(sp_tokens_check_vocab(s, 128256) == SP_OK, "%s", sp_last_error());
    int first = -1;
    for (int i = 0; i < W && first < 0; i++) first = wide[i] >= 100000 ? i : -1;
    char named[160];
    snprintf(named, sizeof named, "token %u at position %d (byte offset %d)", wide[first], first,
             1024 + 4 * first);
    CHECK(sp_tokens_check_vocab(s, 100000) == SP_ERR_FORMAT && strstr(sp_last_error(), named) &&
              strstr(sp_last_error(), wpath), "vocabulary 100000: '%s', want '%s'",
          sp_last_error(), named);
    sp_tokens_close(s);
    unlink(wpath);
    free(wide), free(mixed);
    /* refusals, each naming the file */
    unsigned char h[1024 + 4] = { 0 };
    const struct { unsigned magic, version, count; size_t bytes; const char *msg; } bad[] = {
        { 1234, 1, 2, 1028, "magic 1234" },
        { 20240520, 2, 2, 1028, "version 2" },
        { 20240801, 1, 1, 1028, "magic 20240801 with version 1" }, /* wide magic, narrow version */
        { 20240801, 7, 2, 1028, "counts 2 tokens" },               /* 2 uint32 need 8 bytes */
        { 20240520, 1, 3, 1028, "counts 3 tokens" },   /* truncated */
        { 20240520, 1, 1, 1028, "counts 1 tokens" },   /* a trailing token */
        { 20240520, 1, 0, 100, "shorter than the" },
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        unsigned f[3] = { bad[k].magic, bad[k].version, bad[k].count };
        for (int i = 0; i < 3; i++)
            for (int b = 0; b < 4; b++) h[4 * i + b] = (unsigned char)(f[i] >> (8 * b));
        char p[96];
        snprintf(p, sizeof p, "%s/bad%zu.bin", dir, k);
        write_bytes(p, h, bad[k].bytes);
        const char *one[1] = { p };
        sp_status st = sp_tokens_open(one, 1, &s);
        CHECK(st == SP_ERR_FORMAT && strstr(sp_last_error(), bad[k].msg) &&
                  strstr(sp_last_error(), p), "bad shard %zu: status %d, '%s'", k, st,
              sp_last_error());
        unlink(p);
    }
    snprintf(pattern, sizeof pattern, "%s/none_*.bin", dir);
    CHECK(sp_tokens_open_pattern(pattern, &s) != SP_OK, "a pattern with no file accepted");
    /* a list with an empty entry (a stray comma) is refused, naming the entry */
    const char *const holes[][2] = { { "%s,,", "entry 2 is empty" }, { ",%s", "entry 1 is empty" },
                                     { "%s,", "entry 2 is empty" }, { ",", "entry 1 is empty" } };
    for (size_t k = 0; k < sizeof holes / sizeof *holes; k++) {
        snprintf(list, sizeof list, holes[k][0], paths[0]);
        s = NULL;
        sp_status st = sp_tokens_open_pattern(list, &s);
        CHECK(st == SP_ERR_ARG && !s && strstr(sp_last_error(), holes[k][1]) &&
                  strstr(sp_last_error(), list), "list '%s': status %d, '%s'", list, st,
              st ? sp_last_error() : "");
        sp_tokens_close(s);
    }
    for (int k = 0; k < 3; k++) unlink(paths[k]);
    rmdir(dir);
    free(all), free(got);
    return check_summary("test_tokens");
}
